"""A judged reward's work (its judge's calls, cache hits, unparsable answers, failed calls and HTTP 429s:
``RewardBase.tallies()``) in the trainers' logs through each adapter, each call's increase in the trainer's own
channel: TRL's ``log_metric`` (``rewards/<name>/judge/calls``, ...), OpenRLHF's ``extra_logs`` and verl's extra keys
(shared among the call's samples), in process and through a reward server (its ``/health`` tallies). Until
2026-11-29 none of them was logged: a judge failing call after call said nothing in a TRL, verl or OpenRLHF run.

The judge is an OpenAI-compatible chat server on 127.0.0.1 (tests/helpers/chat_server.py) that answers the claims
prompts, never parses the caption "nonsense" (asked twice: ``judge.retries=1``, then failed) and answers its first
request with an HTTP 429 (retried). The counts of a call, by hand, for ``ClaimsReward`` with one reference an image:

- ``["a red circle", "nonsense"]`` of images 0, 1: 2 reference-claims calls, 2 caption splits ("nonsense":
  unparsable twice, then failed), 2 checks of "a red circle"'s claims (precision and recall): 6 calls, 2 unparsable,
  1 failed, and the first request's 429;
- ``["a red circle", "a blue square"]`` of images 0, 1: 2 + 2 + 4 = 8 calls;
- ``["a blue square"]`` of image 1: 1 + 1 + 2 = 4 calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import defaultdict
from collections.abc import Iterator

import torch

from finecap.integrations import openrlhf, trl, verl
from finecap.integrations.scoring import Scorer
from finecap.rewards import RewardOutput
from finecap.serve.client import RewardServerError
from finecap.serve.service import ImageTable, RewardService
from helpers.chat_server import ChatServer, judging
from helpers.served import serving

REFERENCES = {0: ["a red circle"], 1: ["a blue square"]}
TALLIES = ("calls", "cache_hits", "unparsable", "failed", "rate_limited")


def counts(calls=0.0, unparsable=0.0, failed=0.0, rate_limited=0.0) -> dict[str, float]:
    """A call's increase of a judged reward's tallies, every key (``cache_hits`` 0: the judge keeps no cache)."""
    given = dict(calls=calls, cache_hits=0.0, unparsable=unparsable, failed=failed, rate_limited=rate_limited)
    return {f"judge/{k}": float(given[k]) for k in TALLIES}


FIRST = counts(calls=6, unparsable=2, failed=1, rate_limited=1)  # ["a red circle", "nonsense"] (module docstring)
ONE = counts(calls=4)  # ["a blue square"]


@contextlib.contextmanager
def judged() -> Iterator:
    """A ``ClaimsReward`` over a fresh judge server (module docstring), its judge closed after the block."""
    from finecap.judges.openai import OpenAIJudge
    from finecap.rewards.claims import ClaimsReward

    claims, asked = judging("nonsense"), []

    def answer(payload, n):
        asked.append(1)
        return (429, {"error": {"message": "slow down"}}) if len(asked) == 1 else claims(payload, n)

    with ChatServer(answer) as server:
        judge = OpenAIJudge([server.url], "test-model", api_key="k", retries=1, sleep=lambda s: None)
        try:
            yield ClaimsReward(judge, references=REFERENCES)
        finally:
            judge.close()


@contextlib.contextmanager
def routes() -> Iterator[dict]:
    """The same judged reward twice, each over a judge of its own: in this process and behind a reward server."""
    with judged() as here, judged() as there, serving(RewardService(there, ImageTable(range(2)), log_every=0)) as url:
        yield {"in process": {"reward": here}, "server": {"url": url}}


def test_trl_logs_each_calls_judge_work_through_log_metric():
    logged = defaultdict(list)
    with routes() as entries:
        for route, entry in entries.items():
            fn = trl.reward_function(entry.get("reward"), url=entry.get("url"), name="claims")
            log_metric = lambda key, value, route=route: logged[(route, key)].append(value)  # noqa: E731
            got = fn(["", ""], ["a red circle", "nonsense"], image_id=[0, 1], log_metric=log_metric)
            assert got == [1.0, None]  # "nonsense" failed: None, as before
            fn([""], ["a blue square"], image_id=[1], log_metric=log_metric)
            fn.close()
    for route in ("in process", "server"):
        for key in (f"judge/{k}" for k in TALLIES):  # each call's increase, not the running totals
            assert logged[(route, f"rewards/claims/{key}")] == [FIRST[key], ONE[key]], (route, key)
    # the judge_failed part (1 at "nonsense") averaged where it has a value: in process, the share failed (it was
    # averaged over the scored completions only, so it never showed a failure); a reward server answers every part
    # null at a failed caption (docs/integrations.md), so through one it is over the scored ones: the tally
    # judge/failed says the failure there
    assert logged[("in process", "rewards/claims/judge_failed/mean")] == [0.5, 0.0]
    assert logged[("server", "rewards/claims/judge_failed/mean")] == [0.0, 0.0]


def test_trl_logs_a_judged_rewards_parts_as_the_training_log_does():
    # 4 completions, the judge failing on "nonsense": judge_failed is 1 there, 0 at the others, so its mean is the
    # share failed, 1/4 (finecap's training log's reward/claims/judge_failed: scored_mean); the other parts are NaN at
    # the failed completion and averaged over the 3 scored ones, each of which states its image's one reference
    logged = {}
    with judged() as reward:
        fn = trl.reward_function(reward, name="claims")
        got = fn([""] * 4, ["a red circle", "nonsense", "a blue square", "a red circle"], image_id=[0, 1, 1, 0],
                 log_metric=logged.__setitem__)  # fmt: skip
        fn.close()
    assert got == [1.0, None, 1.0, 1.0]
    judge = {f"rewards/claims/judge/{k}" for k in TALLIES}
    parts = {k: v for k, v in logged.items() if k not in judge}
    assert parts == {"rewards/claims/judge_failed/mean": 0.25, "rewards/claims/precision/mean": 1.0,
                     "rewards/claims/recall/mean": 1.0, "rewards/claims/f1/mean": 1.0}  # fmt: skip


def test_openrlhfs_reward_func_returns_each_calls_judge_work_in_extra_logs_shared_among_its_samples():
    with routes() as entries:
        for route, entry in entries.items():
            fn = openrlhf.reward_function(entry.get("reward"), url=entry.get("url"))
            two = fn(["Q: a red circle</s>", "Q: a blue square</s>"], ["Q:", "Q:"], [0, 1])  # an older micro-batch
            one = fn(["Q: a blue square</s>"], ["Q:"], [1])  # OpenRLHF >= 0.9: one sample a call
            fn.close()
            first = counts(calls=8, rate_limited=1)  # GOOD's calls, and the judge's first request's 429
            for key in (f"judge/{k}" for k in TALLIES):
                assert two["extra_logs"][key].tolist() == [first[key] / 2] * 2, (route, key)  # shared by its samples
                assert one["extra_logs"][key].tolist() == [ONE[key]], (route, key)
            assert two["rewards"].tolist() == [1.0, 1.0] and "claims" not in two["extra_logs"]  # the parts as before
            assert two["extra_logs"]["judge_failed"].tolist() == [0.0, 0.0]


def test_verl_returns_each_calls_judge_work_in_every_samples_dict():
    with routes() as entries:
        for route, entry in entries.items():
            fn = verl.VerlReward(entry.get("reward"), url=entry.get("url"))
            batch = fn.batch(["coco"] * 2, ["a red circle", "nonsense"], ["", ""], [{"image_id": 0}, {"image_id": 1}])
            single = asyncio.run(fn.ascore("coco", "a blue square", "", {"image_id": 1}))  # the reward loop's form
            again = fn("coco", "a blue square", "", {"image_id": 1})  # in a thread of it
            fn.close()
            assert batch[0]["score"] == 1.0 and math.isnan(batch[1]["score"])  # "nonsense" failed: NaN, as before
            assert [set(sample) for sample in batch] == [set(single)] * 2  # verl reads the keys of the first sample
            for key in (f"judge/{k}" for k in TALLIES):
                assert [sample[key] for sample in batch] == [FIRST[key] / 2] * 2, (route, key)
                assert single[key] == ONE[key] and again[key] == ONE[key], (route, key)


class Counting:
    """A reward server's client whose ``/health`` tallies are read from ``reads`` in turn (an exception raised)."""

    def __init__(self, *reads):
        self.reads = list(reads)

    def score(self, captions, image_ids, references=None, fields=None):
        return RewardOutput(total=torch.zeros(len(captions)))

    def tallies(self):
        read = self.reads.pop(0)
        if isinstance(read, Exception):
            raise read
        return {"judge/calls": float(read)}


def served_scorer(client) -> Scorer:
    scorer = Scorer(url="http://127.0.0.1:9")  # nothing is asked of it: its client is replaced
    scorer.client.close()
    scorer.client = client
    return scorer


def test_a_servers_tallies_that_cannot_be_read_a_moment_count_0_then_the_next_read_holds_them(caplog):
    lost = RewardServerError(None, None, "could not reach it")
    scorer = served_scorer(Counting(10, 16, lost, lost, 30, 2))  # before the first call, then after each call
    with caplog.at_level(logging.WARNING, logger="finecap.integrations.scoring"):
        increases = [scorer.counted(["a"], [0])[1] for _ in range(5)]
    # 10 -> 16: 6; two reads lost: 0 each (same keys), the next holds their work (30 - 16); a restarted server
    # (2 < 30) counts from 0
    assert increases == [{"judge/calls": v} for v in (6.0, 0.0, 0.0, 14.0, 2.0)]
    said = [r.getMessage() for r in caplog.records if "tallies" in r.getMessage()]
    assert len(said) == 1 and "could not reach it" in said[0]  # said once


def test_a_server_whose_first_tallies_read_fails_counts_nothing_at_every_call():
    scorer = served_scorer(Counting(RewardServerError(404, None, "no tallies in its answer"), 5, 9))
    assert [scorer.counted(["a"], [0])[1] for _ in range(3)] == [{}, {}, {}]  # never some keys, then others
    assert scorer.client.reads == [5, 9]  # and never asked again


def test_a_reward_that_counts_nothing_adds_no_key_to_any_adapter():
    from finecap.rewards.cider import CiderReward

    fn = verl.VerlReward(CiderReward({0: ["a red circle"], 1: ["a blue square"]}))
    assert set(fn("coco", "a red circle", "", {"image_id": 0})) == {"score", "cider"}
    logged = {}
    cider = trl.reward_function(CiderReward(REFERENCES), name="cider")
    cider([""] * 2, ["a red circle", "a square"], image_id=[0, 1], log_metric=logged.__setitem__)
    assert logged == {}  # the one part named like the reward is TRL's own rewards/cider/mean


def test_in_process_each_threads_call_gets_its_own_increase():
    # the increase is read inside the call's lock (verl's thread pool, OpenRLHF's asyncio.to_thread): a call of
    # another thread is counted in neither call
    from concurrent.futures import ThreadPoolExecutor

    with judged() as reward:
        scorer = Scorer(reward)
        scorer.counted(["a red circle", "nonsense"], [0, 1])  # the 429 and the failure out of the way
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda _: scorer.counted(["a blue square"], [1])[1], range(8)))
    assert got == [ONE] * 8
