"""The adapters close what they opened (:meth:`finecap.integrations.scoring.Scorer.close`): a reward built from a
name or dotted path is closed once, however often close is called, and a reward the caller built is never closed; a
reward server's connection pools are closed. Each adapter's close reaches its scorer."""

from __future__ import annotations

import threading

import pytest

from finecap.integrations.openrlhf import reward_function as openrlhf_function
from finecap.integrations.scoring import Scorer
from finecap.integrations.swift import orm
from finecap.integrations.trl import reward_function as trl_function
from finecap.integrations.verl import VerlReward
from finecap.rewards.cider import CiderReward
from finecap.serve.client import RewardClient

REFERENCES = {1: ["a red circle", "a small red circle"], 2: ["a blue square"]}
CLOSED: list[CiderReward] = []


class ClosingCider(CiderReward):
    """CIDEr-D that records each close."""

    def close(self) -> None:
        CLOSED.append(self)


def closing_cider(cfg):
    """The factory of :class:`ClosingCider` (the reward's dotted path: ``tests...:closing_cider``)."""
    return ClosingCider()


PATH = f"{__name__}:closing_cider"


@pytest.fixture(autouse=True)
def none_closed():
    CLOSED.clear()


def test_a_scorer_closes_the_reward_it_built_once_and_never_a_reward_it_was_given():
    scorer = Scorer.of(PATH, references=REFERENCES)
    assert scorer.score(["a red circle"], [1]).total.shape == (1,)
    scorer.close()
    scorer.close()
    assert [scorer.reward] == CLOSED
    given = ClosingCider(REFERENCES)
    with Scorer.of(given) as scorer:
        scorer.score(["a red circle"], [1])
    assert [CLOSED[0]] == CLOSED and given not in CLOSED


@pytest.mark.parametrize("adapter", ["trl", "verl", "openrlhf", "swift"])
def test_each_adapters_close_reaches_its_scorer(adapter):
    if adapter == "trl":
        fn = trl_function(PATH, references=REFERENCES)
        fn.close()
    elif adapter == "verl":
        fn = VerlReward(PATH, references=REFERENCES)
        fn.close()
    elif adapter == "openrlhf":
        fn = openrlhf_function(PATH, references=REFERENCES)
        fn.close()
    else:
        cls = orm(PATH, references=REFERENCES)
        cls.scorer.close()
    assert len(CLOSED) == 1 and isinstance(CLOSED[0], ClosingCider)


def test_a_server_clients_close_closes_the_pool_its_threads_share():
    # one pool for every thread: a pool per thread, kept for close(), grew by one a thread for ever
    client = RewardClient("http://127.0.0.1:9/reward")  # nothing is sent: the pool opens lazily
    pools = [client._client()]
    thread = threading.Thread(target=lambda: pools.append(client._client()))
    thread.start()
    thread.join()
    assert pools[0] is pools[1] and not pools[0].is_closed
    client.close()
    assert pools[0].is_closed and not client._client().is_closed  # a later call opens a new one
    assert not client._client().is_closed  # a later call opens a new pool
    client.close()
