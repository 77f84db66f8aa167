"""Every adapter's first request to a reward server comes after one read of the server's ``GET /health``
(:meth:`finecap.integrations.scoring.Scorer.score` and ``counted``: one rule, in the scorer). A client asks a
request that got no answer (its connection refused or closed unanswered: a server over its ``--max-connections``, or
restarting) again only once the server has answered it (:meth:`finecap.serve.client.RewardClient.retry_wait`);
ms-swift's ``orm`` and ``async_orm`` asked without reading ``/health`` first, so that a swift run's first request
meeting a busy server failed at once ("it has never answered this client") where the TRL, verl and OpenRLHF
adapters' was asked again. The server is a stand-in on 127.0.0.1 (:func:`helpers.served.standing_in`) that closes
the first ``/reward`` request unanswered; ms-swift itself is not needed (the classes derive from ``object`` without
it)."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from finecap.integrations import openrlhf, swift, trl, verl
from helpers.served import PROMPT, standing_in


def adapters(url: str) -> dict:
    """Each adapter over the server at ``url``, as a call of one caption ("a red circle" of image 1) giving its
    total, as the trainer calls it (an awaited one in an event loop of its own, as a trainer's step)."""
    swift_orm, swift_async = swift.orm(url=url)(), swift.async_orm(url=url)()
    trl_fn, verl_fn = trl.reward_function(url=url), verl.VerlReward(url=url)
    openrlhf_fn = openrlhf.reward_function(url=url)
    return {
        "ms-swift ORM": lambda: swift_orm(["a red circle"], image_id=[1], trainer_state=None)[0],
        "ms-swift AsyncORM": lambda: asyncio.run(swift_async(["a red circle"], image_id=[1], trainer_state=None))[0],
        "TRL": lambda: trl_fn(prompts=[PROMPT], completions=["a red circle"], image_id=[1])[0],
        "verl": lambda: verl_fn("d", "a red circle", "", {"image_id": 1})["score"],
        "verl, awaited": lambda: asyncio.run(verl_fn.ascore("d", "a red circle", "", {"image_id": 1}))["score"],
        "OpenRLHF": lambda: openrlhf_fn([PROMPT + "a red circle<|im_end|>"], [PROMPT],
                                        [json.dumps({"image_id": 1})])["rewards"].tolist()[0],
    }  # fmt: skip


ADAPTERS = list(adapters("http://127.0.0.1:9"))  # nothing is asked while they are made


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_an_adapters_first_request_closed_unanswered_is_asked_again_once_the_server_answered_health(adapter, caplog):
    caplog.set_level(logging.WARNING, logger="finecap.serve.client")
    with standing_in(["close"]) as (url, asked):
        call = adapters(url)[adapter]
        assert call() == 3.0  # the stand-in's total, once asked again
        assert call() == 3.0
    assert asked.health == 1  # read once, before the first request (a reward that counts nothing: never after)
    assert len(asked) == 3 and asked[0] == asked[1]  # the first request, asked again; the second call's
    retried = [r.getMessage() for r in caplog.records]
    assert len(retried) == 1, retried
    assert "closed the connection without answering (RemoteProtocolError" in retried[0], retried
    assert "asking again in 1 s (retry 1 of 5)" in retried[0], retried
