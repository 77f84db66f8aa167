"""``finecap serve-reward RECIPE [key=value ...]``: a recipe's rewards over HTTP, for RL trainers that run elsewhere
(OpenRLHF, CapRL's scripts, verl and ms-swift through :mod:`finecap.integrations`; docs/integrations.md).

The reward is the one ``finecap train RECIPE`` would train with, built by the same code: the mixture of
``rl.rewards`` with its weights (:func:`finecap.rewards.build_reward`), what it needs prepared as training prepares
it (:func:`finecap.train.prepare.prepare_needs`: on the embedded world, the world and the world encoder are made or
trained into the finecap home when missing, and found there afterwards), the training split's records
(:func:`finecap.data.datasets.load_records`), and the reward's ``setup`` with the inputs of those records
(:meth:`finecap.rewards.RewardInputs.of_run`: no accelerator, no training context; on the device training would
use): CIDEr-D's document frequencies from the training references, the retriever (``retriever.*``, the world encoder
by default) and the training images' embeddings, the world's scenes for the listener. It is set up once; the server
then answers requests until SIGINT or SIGTERM (exit code 0) (:mod:`finecap.serve`); the reward is closed as it
stops, within :data:`~finecap.serve.service.CLOSE_WAIT` seconds: a close that hangs is abandoned, logged, and the
command exits 1 naming the reward.

Beyond loopback, ``--token-file`` makes every request carry a bearer token (read by
:func:`finecap.utils.token_file.read_token`, as ``finecap bags review --token-file`` is); without one the server warns
that anyone who reaches the port can query it. On loopback every user of the machine reaches it too (no warning): on a
shared machine give ``--token-file`` there as well (docs/integrations.md). A reward that raises ``SystemExit`` (or
the worker's crash) stops the server: the command exits with code 1, naming it.

What cannot be served says so at start: ``sr.distractors=bag`` reads the bag numbers of training batches, which a
request does not have (serve ``batch``, the request's other images, or ``hard``, mined neighbours).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from finecap.config import Config, ConfigError
from finecap.data.datasets import load_records
from finecap.rewards import RewardInputs, WeightedSum, build_reward
from finecap.serve.protocol import Limits
from finecap.serve.service import (
    CLOSE_WAIT,
    MAX_QUEUED_BYTES,
    SCORE_TIMEOUT,
    ImageTable,
    RewardService,
    close_within,
)
from finecap.train.engine import process_state
from finecap.train.prepare import prepare_needs
from finecap.utils.system import PROGRESS_ENV, environment_defaults, is_loopback

if TYPE_CHECKING:
    from finecap.serve.app import ConnectionLimits

log = logging.getLogger(__name__)


def describe(cfg: Config) -> str:
    """The served mixture as ``rl.rewards`` reads: ``1*retrieval + 0.5*cider``."""
    return " + ".join(f"{w:g}*{name}" for name, w in cfg.rl.rewards.items())


def load_reward(cfg: Config) -> tuple[WeightedSum, list]:
    """The reward of ``rl.rewards``, set up as the training loop sets it up (the same records, retriever and device,
    without a training accelerator: one process), and the training records it knows."""
    reward = build_reward(cfg)
    if "retrieval" in reward.rewards and cfg.sr.distractors == "bag":
        raise ConfigError("sr.distractors=bag: a served reward has no training batches, whose bag numbers this mode "
                          "reads; serve sr.distractors=batch (each request's other images) or hard (mined "
                          "neighbours)", "sr.distractors")  # fmt: skip
    processes = process_state(cfg.train)  # the device training would use (train.cpu), no training state
    prepare_needs(cfg, reward.needs, processes)
    records = load_records(cfg, "train")
    reward.setup(RewardInputs.of_run(cfg, records, reward.needs, device=processes.device))
    return reward, records


def build_service(cfg: Config, *, limits: Limits | None = None, batch_size: int = 1024, batch_wait: float = 0.0,
                  log_every: float = 60.0, score_timeout: float = SCORE_TIMEOUT,
                  max_queued_bytes: int = MAX_QUEUED_BYTES) -> RewardService:  # fmt: skip
    """The reward service of ``cfg`` (:func:`load_reward`), over the training images (``score_timeout``,
    ``max_queued_bytes``: :class:`~finecap.serve.service.RewardService`'s, checked before the reward loads)."""
    RewardService.check_options(batch_size, batch_wait, log_every, score_timeout, max_queued_bytes, limits)
    reward, records = load_reward(cfg)
    source = f"the {len(records)} training images of {cfg.data.path or 'the world (world.*)'}"
    return RewardService(reward, ImageTable.of_records(records, source), limits=limits, batch_size=batch_size,
                         batch_wait=batch_wait, log_every=log_every, name=describe(cfg),
                         score_timeout=score_timeout, max_queued_bytes=max_queued_bytes)  # fmt: skip


TOKEN_ENV = "FINECAP_REWARD_TOKEN"
"""The environment variable the clients (:class:`finecap.serve.client.RewardClient`, every adapter's ``url=``) read
the server's bearer token from."""


@contextlib.contextmanager
def quiet_progress() -> Iterator[None]:
    """Progress bars off for the block (:data:`~finecap.utils.system.PROGRESS_ENV` set, then given back), unless the
    user set that variable (empty counts as unset, as :func:`~finecap.utils.system.progress_enabled` reads it): a
    served request's reward call is no task of the user's to watch, and its bars (the retriever's "text features" for
    a request of over 4 x ``retriever.batch_size`` captions) went to the log of a server left running for days, one a
    request."""
    with environment_defaults({PROGRESS_ENV: "1"}, empty_is_unset=True):
        yield


def main(cfg: Config, *, host: str = "127.0.0.1", port: int = 8000, limits: Limits | None = None,
         batch_size: int = 1024, batch_wait_ms: float = 0.0, log_every: float = 60.0, token: str | None = None,
         connections: ConnectionLimits | None = None, allowed_hosts: Sequence[str] = (),
         score_timeout: float = SCORE_TIMEOUT, max_queued_bytes: int = MAX_QUEUED_BYTES) -> None:  # fmt: skip
    """Serve ``cfg``'s rewards on ``host:port`` until SIGINT or SIGTERM (the address is taken first: a port in use
    stops the command before the reward is loaded); ``SystemExit(1)`` when the reward stopped the server. Requests
    whose ``Host`` names this address, a loopback name or one of ``allowed_hosts`` are answered
    (:mod:`finecap.serve.hosts`)."""
    from finecap.serve.app import bind, make_server  # Starlette and uvicorn: the serve extra

    local = is_loopback(host)
    sock = bind(host, port)
    try:
        service = build_service(cfg, limits=limits, batch_size=batch_size, batch_wait=batch_wait_ms / 1000,
                                log_every=log_every, score_timeout=score_timeout,
                                max_queued_bytes=max_queued_bytes)  # fmt: skip
        server, sock = make_server(service, host, port, sock=sock, token=token, connections=connections,
                                   allowed_hosts=allowed_hosts)  # fmt: skip
    except BaseException:
        sock.close()  # the address is free again when setting the reward up failed (main called by a program)
        raise
    bound = sock.getsockname()[1]
    if not local and token is None:
        log.warning("--host %s is beyond loopback: any machine that reaches this one on port %d can query the reward "
                    "server (plain HTTP, no token: give --token-file)", host, bound)  # fmt: skip
    shown = f"[{host}]" if ":" in host else host
    print(f"finecap serve-reward: {service.name} over {len(service.images)} training images on "
          f"http://{shown}:{bound} (POST /reward, POST /get_reward, GET /health); Ctrl-C or SIGTERM stops it",
          flush=True)  # fmt: skip
    closed = True
    try:
        with quiet_progress():  # setting the reward up showed its bars; serving shows none
            server.run(sockets=[sock])
    finally:
        if not service.abandoned:  # else a call still runs in it (logged): the process's end releases the reward
            # a judge the reward built: its connections, its in-process engine; a close that hangs is abandoned
            closed = close_within(service.reward, service.name, CLOSE_WAIT)
    meter = service.meter
    print(f"finecap serve-reward: stopped after {meter.total_scored} requests scored ({meter.total_captions} "
          f"captions), {meter.failed} failed, {meter.timed_out} timed out, {meter.left} left by their client, "
          f"{meter.refused} refused (503: stuck, or the queue full)", flush=True)  # fmt: skip
    if service.fatal is not None:
        raise SystemExit(
            f"finecap serve-reward: error: the reward {service.name} raised "
            f"{type(service.fatal).__name__}, which stops the server (its log has the details)"
        )
    if not closed:
        raise SystemExit(f"finecap serve-reward: error: the reward {service.name} did not close within "
                         f"{CLOSE_WAIT:g} s: abandoned (the process's end releases what it holds)")  # fmt: skip
