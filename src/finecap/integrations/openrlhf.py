"""finecap's caption rewards in OpenRLHF (and in scripts written for CapRL's reward server).

OpenRLHF asks a remote reward model over HTTP: it POSTs ``{"query": [...], "prompts": [...], "labels": [...]}`` to
the URL it is given and reads ``rewards`` from the JSON answer (and logs ``extra_logs``). ``finecap serve-reward``
answers that request at ``/get_reward``, so OpenRLHF points at it unchanged::

    finecap serve-reward demo/sr_bagcurri --port 8000
    python -m openrlhf.cli.train_ppo_ray ... --label_key image_id \\
        --remote_rm_url http://127.0.0.1:8000/get_reward          # OpenRLHF >= 0.9: --reward.remote_url

``query[i]`` is the prompt and the response as OpenRLHF decodes them (special tokens included): the caption is what
follows ``prompts[i]``, without the end-of-turn tokens (:func:`finecap.serve.protocol.caption_of_query`).
``labels[i]`` is the ``--label_key`` column of the prompt data set, which carries the image: its id, or a JSON
object ``{"image_id": 17, "references": [...]}`` (references optional).

OpenRLHF 0.9 and later send one sample per request; older versions a micro-batch. A reward that ranks each
caption's image among the request's images (self-retrieval with ``sr.distractors=batch``, the listener) needs
several images per request, so with one-sample requests serve ``sr.distractors=hard`` (mined distractors); the
server refuses a one-image request of such a reward rather than answer a constant.

A request holding a caption the reward could not score (a judge that failed on it) is answered 502, never a
``null`` or a NaN reward, which OpenRLHF cannot read (:func:`finecap.serve.protocol.openrlhf_reply`); the
``reward_func`` below raises the same error (:class:`~finecap.serve.protocol.FailedCaptions`, a ``ValueError``).

OpenRLHF also loads a reward function from a Python file (``--remote_rm_url my_reward.py``, which defines
``reward_func(queries, prompts, labels, **kwargs)``); :func:`reward_function` makes one over a finecap reward in
OpenRLHF's process or over a server, reading queries and labels exactly as the server does::

    # finecap_reward.py
    from finecap.integrations.openrlhf import reward_function
    reward_func = reward_function(url="http://127.0.0.1:8000")

Example::

    >>> from finecap.rewards.cider import CiderReward
    >>> fn = reward_function(CiderReward({1: ["a red circle", "a small red circle"], 2: ["a blue square"]}))
    >>> out = fn(["Q: a red circle</s>", "Q: a square</s>"], ["Q:", "Q:"], [1, '{"image_id": 2}'])
    >>> [round(r, 3) for r in out["rewards"].tolist()]
    [5.26, 1.743]
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from finecap.integrations.scoring import IN_PROCESS, Scorer, per_sample
from finecap.serve.protocol import (
    FailedCaptions,
    Limits,
    RequestError,
    openrlhf_reply,
    parse_get_reward,
)

__all__ = ["reward_function"]

log = logging.getLogger(__name__)


def reward_function(name_or_reward: Any = None, *, url: str | None = None, limits: Limits | None = None,
                    **options: Any) -> Callable[..., dict[str, Any]]:  # fmt: skip
    """OpenRLHF's ``reward_func(queries, prompts, labels, **kwargs)`` over a finecap reward (``name_or_reward`` with
    its ``options``, or a built one) or the reward server at ``url`` (:meth:`finecap.integrations.scoring.Scorer.of`):
    ``{"rewards": tensor (N,), "extra_logs": {part: tensor (N,), tally: tensor (N,)}}``, the tallies the increase of
    the reward's (a judge's ``judge/calls``, ``judge/failed``, ...) over the call, shared evenly among its samples
    (:meth:`~finecap.integrations.scoring.Scorer.counted`, :func:`~finecap.integrations.scoring.per_sample`). A call
    holding a caption the reward could not score (a judge that failed on it) raises
    :class:`~finecap.serve.protocol.FailedCaptions` naming it, as the server's ``/get_reward`` answers 502: OpenRLHF
    has no NaN handling (a NaN would reach every sample of the group through its statistics). Labels name images by id
    (paths only through a server, which knows the data set's files)."""
    scorer = Scorer.of(name_or_reward, url=url, **options)
    limits = limits or IN_PROCESS  # the server's limits are the server's to apply; in process there are none

    def reward_func(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any],
                    **kwargs: Any) -> dict[str, Any]:  # fmt: skip
        try:
            return _rewards(queries, prompts, labels)
        except Exception as e:
            # OpenRLHF (0.11) catches a reward function's error and logs it at INFO only, then stops on a later,
            # unrelated error (a sample without a reward): the cause is logged here where it is seen.
            log.error("%s", e)
            raise

    def _rewards(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any]) -> dict[str, Any]:
        import torch

        try:
            request = parse_get_reward({"query": list(queries), "prompts": list(prompts), "labels": list(labels)},
                                       limits)  # fmt: skip
        except RequestError as e:
            raise ValueError(f"finecap OpenRLHF reward: {e}") from None
        if request.by_path and scorer.client is None:
            raise ValueError("finecap OpenRLHF reward: labels name images by path, which only a reward server (url=) "
                             "resolves; name them by id")  # fmt: skip
        # a refusal names the fields OpenRLHF sent, as /get_reward's do (labels[i] for a caption's image or its
        # references, query[i] for the caption), in process and from a server's /reward
        client = scorer.client
        if client is not None and request.by_path:
            out, increase = scorer.counted_on_server(lambda: client.score(request.captions, images=request.image_ids,
                                                                          references=request.references,
                                                                          fields=request.fields))  # fmt: skip
        else:
            out, increase = scorer.counted(request.captions, request.image_ids, request.references,
                                           fields=request.fields)  # fmt: skip
        try:
            reply = openrlhf_reply(request, out)
        except FailedCaptions as e:
            raise FailedCaptions(f"finecap OpenRLHF reward: the reward {e}") from None
        n = len(reply["rewards"])
        # the judge's work of the call, shared among its samples (one a call in OpenRLHF >= 0.9), beside the parts
        tallies = {k: torch.full((n,), v) for k, v in per_sample(increase, n).items()}
        return {"rewards": torch.tensor(reply["rewards"]),
                "extra_logs": {**{k: torch.tensor(v) for k, v in reply["extra_logs"].items()}, **tallies}}  # fmt: skip

    reward_func.close = scorer.close  # type: ignore[attr-defined]  # what the scorer opened (Scorer.close)
    return reward_func
