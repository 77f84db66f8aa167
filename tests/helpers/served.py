"""A tiny world served by the reward server, for tests/serve and the adapters' tests: the ``served`` fixture of
tests/conftest.py builds it once per session.

:func:`make_served` makes a world of :data:`N_TRAIN` training scenes and a tiny random CLIP (the retriever), and
builds two services as ``finecap serve-reward`` builds them (:func:`finecap.app.serve_reward.build_service`: the
training loop's reward, set up with its context): the NDLB mixture ``retrieval 1.0 + cider 0.5`` and CIDEr-D alone.
:func:`fixture_captions` gives the 1,000 captions of the identity tests, cut into :data:`GROUP` requests of 100;
:func:`serving` runs a service on 127.0.0.1 (a free port) in a thread; :func:`standing_in` a stand-in server that
closes, resets or garbles requests by script (the client's retries); :func:`every_front_end` asks one reward
through every front end. :func:`small_mixture` is a mixture small enough to compute by hand (``EXPECTED`` for
``CAPTIONS`` of the images ``IDS``), for the tests that need no world (the frameworks' own loaders)."""

from __future__ import annotations

import contextlib
import math
import random
import socket
import struct
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from helpers.waiting import until

N_TRAIN = 100
N_CAPTIONS = 1000
GROUP = 100  # captions per request: 10 requests of 100, each over ~60 distinct images


def make_served(root: Path) -> dict:
    """``{"cfg", "mix", "cider", "records", "captions", "image_ids", "groups", "clip"}`` (module docstring)."""
    from finecap.app.serve_reward import build_service
    from finecap.config import load
    from finecap.data.datasets import load_records
    from helpers.tiny_run import tiny_world_and_clip

    overrides, clip = tiny_world_and_clip(root, N_TRAIN, 8, 8)
    base = [*overrides, f"retriever.checkpoint={clip}", f"run.dir={root / 'run'}"]
    cfg = load(None, [*base, "rl.rewards={retrieval: 1.0, cider: 0.5}"])
    mix = build_service(cfg, log_every=0)
    cider = build_service(load(None, [*base, "rl.rewards={cider: 1.0}"]), log_every=0)
    records = load_records(cfg, "train")
    captions, ids = fixture_captions(records)
    groups = [(captions[i : i + GROUP], ids[i : i + GROUP]) for i in range(0, len(captions), GROUP)]
    return {"cfg": cfg, "base": base, "mix": mix, "cider": cider, "records": records, "captions": captions,
            "image_ids": ids, "groups": groups, "clip": clip}  # fmt: skip


def fixture_captions(records: list, n: int = N_CAPTIONS, seed: int = 0) -> tuple[list[str], list]:
    """``n`` captions with the image each describes: a reference of its own image, a reference of another image,
    or the first words of its own reference, in a fixed random order (seeded)."""
    rng = random.Random(seed)
    captions, ids = [], []
    for k in range(n):
        record = records[rng.randrange(len(records))]
        kind = k % 3
        if kind == 0:
            text = rng.choice(record.captions)
        elif kind == 1:
            text = rng.choice(records[rng.randrange(len(records))].captions)
        else:
            words = rng.choice(record.captions).split()
            text = " ".join(words[: max(2, len(words) // 2)])
        captions.append(text)
        ids.append(record.image_id)
    return captions, ids


@contextlib.contextmanager
def serving(service, **options) -> Iterator[str]:
    """``service`` on 127.0.0.1 at a free port, in a thread, for the block: its base URL (``options``: those of
    :func:`finecap.serve.app.make_server`, ``token=`` and ``connections=``)."""
    with serving_server(service, **options) as (url, _):
        yield url


def open_connections(server) -> int:
    """How many connections the running uvicorn ``server`` holds open now (its own count)."""
    return len(server.server_state.connections)


def accepted_connections(server) -> int:
    """How many connections the uvicorn ``server`` of :func:`serving_server` has accepted since it started."""
    return server.accepted


def count_accepted(server) -> None:
    """Make the (not yet started) uvicorn ``server`` count the connections it accepts (:func:`accepted_connections`):
    its protocol class, one instance a connection, counts them as they are made, on the server's event loop."""
    server.accepted = 0

    class Counted(server.config.http):
        def connection_made(self, transport) -> None:
            server.accepted += 1
            super().connection_made(transport)

    server.config.http = Counted


@contextlib.contextmanager
def serving_server(service, **options) -> Iterator[tuple[str, Any]]:
    """:func:`serving`, yielding ``(base URL, the uvicorn server)``: a test can wait on the server's state
    (:func:`open_connections`, :func:`accepted_connections`)."""
    from finecap.serve.app import make_server

    server, sock = make_server(service, **options)
    count_accepted(server)
    port = sock.getsockname()[1]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    until(lambda: server.started or not thread.is_alive(), "the reward server did not start", every=0.01)
    assert server.started, "the reward server did not start (its thread ended)"
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(30)


class Asked(list):
    """The bodies of the requests a stand-in server (:func:`standing_in`) read, in order, and :attr:`health`: how many
    ``GET /health`` it answered."""

    def __init__(self) -> None:
        super().__init__()
        self.health = 0


@contextlib.contextmanager
def standing_in(script: Sequence[str]) -> Iterator[tuple[str, Asked]]:
    """A stand-in reward server on 127.0.0.1, one request a connection: it reads each request whole and does what
    ``script`` says for it, in order: ``"answer"`` 200 ``{"total": [3.0]}``; ``"close"`` the connection unanswered (a
    server restarting, or one whose connections are all open); ``"reset"`` it midway through the answer (an RST:
    httpx's ``ReadError``); ``"garbage"``: answer what is no HTTP (a wrong port's other service) and close. Requests
    past the script are answered. A ``GET /health`` is answered ``{"status": "ok", "tallies": {}}`` (a reward that
    counts nothing, as finecap's server answers it even with all its connections open) and is no step of the script.
    Yields its URL and what it was asked (:class:`Asked`: the script's requests' bodies, the ``/health`` reads)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)  # accept() wakes up to see the test end (closing the listener would not wake it)
    asked = Asked()
    over = threading.Event()

    def reply(body: bytes) -> bytes:
        return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip

    answer, healthy = reply(b'{"total": [3.0]}'), reply(b'{"status": "ok", "tallies": {}}')

    def serve() -> None:
        while not over.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                if head.startswith(b"GET /health "):
                    asked.health += 1
                    conn.sendall(healthy)
                    continue
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
                while len(body) < length:
                    body += conn.recv(65536)
                asked.append(body)
                act = script[len(asked) - 1] if len(asked) <= len(script) else "answer"
                if act == "answer":
                    conn.sendall(answer)
                elif act == "reset":
                    conn.sendall(answer[: answer.index(b"\r\n\r\n") + 5])  # the head and a byte of the body
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # closed: an RST
                elif act == "garbage":
                    conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
                else:
                    assert act == "close", act  # closed unanswered

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", asked
    finally:
        over.set()
        thread.join(30)
        listener.close()


PROMPT = "<|im_start|>user\n<image>Describe the image in detail.<|im_end|>\n<|im_start|>assistant\n"


def every_front_end(reward, url: str, captions: list[str], ids: list) -> dict[str, list[float]]:
    """The totals of one call (``captions`` of the images ``ids``) through every front end: in process, the server's
    two endpoints and its client, and each adapter over the reward in process and over the server at ``url``."""
    import asyncio
    import json

    import httpx

    from finecap.integrations.openrlhf import reward_function
    from finecap.integrations.swift import async_orm, orm
    from finecap.integrations.trl import TrlReward
    from finecap.integrations.verl import VerlReward, compute_score_batch
    from finecap.rewards import call_batch
    from finecap.serve.client import RewardClient

    n = len(captions)
    infos = [{"image_id": i} for i in ids]
    queries = [PROMPT + c + "<|im_end|>" for c in captions]
    labels = [json.dumps({"image_id": i}) for i in ids]
    conversational = [[{"role": "assistant", "content": [{"type": "text", "text": c}]}] for c in captions]
    return {
        "in process": reward(captions, call_batch(ids)).total.tolist(),
        "server /reward": httpx.post(f"{url}/reward", json={"captions": captions, "image_ids": ids}).json()["total"],
        "server /get_reward": httpx.post(f"{url}/get_reward", json={"query": queries, "prompts": [PROMPT] * n,
                                                                     "labels": labels}).json()["rewards"],
        "client": RewardClient(url).score(captions, ids).total.tolist(),
        "TRL": TrlReward("r", reward)(prompts=[PROMPT] * n, completions=conversational, image_id=ids),
        "verl batch": [r["score"] for r in VerlReward(reward).batch(["finecap"] * n, captions, [""] * n, infos)],
        "verl batch, server": [r["score"] for r in compute_score_batch(["finecap"] * n, captions, [""] * n, infos,
                                                                        url=url)],
        "ms-swift ORM": orm(reward)()(captions, image_id=ids, trainer_state=None),
        "ms-swift ORM, server": orm(url=url)()(captions, image_id=ids, trainer_state=None),
        "ms-swift AsyncORM, server": asyncio.run(async_orm(url=url)()(captions, image_id=ids, trainer_state=None)),
        "OpenRLHF reward_func": reward_function(reward)(queries, [PROMPT] * n, labels)["rewards"].tolist(),
        "OpenRLHF reward_func, server": reward_function(url=url)(queries, [PROMPT] * n, labels)["rewards"].tolist(),
    }  # fmt: skip


# ------------------------------------------------------------------------------------------------------------------
# A mixture small enough to compute by hand
# ------------------------------------------------------------------------------------------------------------------


class VectorRetriever:
    """Stand-in retriever (as tests/rewards/test_retrieval_reward.py's): a caption "x y" embeds as (x, y) normalised;
    logit scale 2."""

    logit_scale = 2.0

    def embed_texts(self, texts):
        return torch.nn.functional.normalize(torch.tensor([[float(v) for v in t.split()[:2]] for t in texts]), dim=-1)


# Images a = (1, 0) and b = (0, 1); references a: "1 0", b: "0 1".
# SR (log_prob, the candidates are the call's images a and b, scale 2): a caption "1 0" has logits (2, 0):
#   for a: 2 - log(e^2 + e^0) = -0.126928; for b: 0 - log(e^2 + 1) = -2.126928; "0 1" the other way round.
#   With sr.distractors=hard the one other image is mined whatever the call holds: the same values, one caption a call.
# CIDEr-D (N = 2 images): the unigrams "1" and "0" are in both references (df 2: idf log 2 - log 2 = 0, so the
#   unigram vectors are zero and score 0); the bigram "1 0" is in a's only (idf log 2). "1 0" for a: bigram cosine 1,
#   3- and 4-grams none, same length (penalty 1): 10 * (0 + 1 + 0 + 0) / 4 = 2.5; "0 1" for a: no shared bigram: 0.
# R = 0.5 * SR + 2 * CIDEr-D:
SR_HIT, SR_MISS = 2 - math.log(math.e**2 + 1), -math.log(math.e**2 + 1)
CAPTIONS = ["1 0", "0 1", "0 1", "1 0"]
IDS = ["a", "a", "b", "b"]
EXPECTED = [0.5 * SR_HIT + 2 * 2.5, 0.5 * SR_MISS, 0.5 * SR_HIT + 2 * 2.5, 0.5 * SR_MISS]  # 4.936536, -1.063464


def small_mixture(sr_config=None):
    """0.5 * SR + 2 * CIDEr-D over the images a and b (``sr_config``: the ``sr`` section, default its defaults)."""
    from finecap.config import SRConfig
    from finecap.rewards import WeightedSum
    from finecap.rewards.cider import CiderReward
    from finecap.rewards.retrieval import RetrievalReward

    sr = RetrievalReward(VectorRetriever(), sr_config or SRConfig(), image_ids=["a", "b"],
                         embeddings=torch.tensor([[1.0, 0.0], [0.0, 1.0]]))  # fmt: skip
    return WeightedSum({"retrieval": (0.5, sr), "cider": (2.0, CiderReward({"a": ["1 0"], "b": ["0 1"]}))})


class Command:
    """``finecap serve-reward`` in a process of its own (:func:`serve_command`): its URL, and after the block its exit
    code and what it printed."""

    url = ""
    code: int | None = None
    out = err = ""


@contextlib.contextmanager
def serve_command(args: list[str], cwd: Path, stop: int | None = None) -> Iterator[Command]:
    """``finecap serve-reward ARGS --port 0`` run from ``cwd`` (this checkout's source first on the path) until the
    block ends, then stopped with the signal ``stop`` (default SIGTERM); the printed address is checked (the first
    line of its output)."""
    import os
    import signal
    import subprocess
    import sys

    src = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    argv = [sys.executable, "-m", "finecap.app.cli", "serve-reward", *args, "--port", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    command = Command()
    try:
        line = proc.stdout.readline()
        if " on http://127.0.0.1:" not in line:
            proc.kill()
            raise AssertionError(f"finecap serve-reward did not start: {line!r} {proc.communicate()[1][-2000:]}")
        command.url = line.split(" on ")[1].split()[0]
        command.out = line
        yield command
        proc.send_signal(signal.SIGTERM if stop is None else stop)
        out, command.err = proc.communicate(timeout=120)
        command.out += out
        command.code = proc.returncode
    finally:
        if proc.poll() is None:
            proc.kill()
