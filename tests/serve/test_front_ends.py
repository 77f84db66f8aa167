"""One reward, the same values through every front end: in process, the server's two endpoints and its client, TRL,
verl (batch form), ms-swift (ORM and AsyncORM) and OpenRLHF (``reward_func``), each over the reward in process and
over the server. First on a mixture small enough to compute by hand (SR + CIDEr-D with weights), then bit for bit on
the 1,000 captions of the served world (the NDLB mixture: self-retrieval with a tiny CLIP + 0.5 CIDEr-D), and
CIDEr-D alone through the per-sample forms (verl's ``compute_score``)."""

from __future__ import annotations

import asyncio

import pytest

from finecap.integrations.verl import VerlReward, compute_score, compute_score_async, compute_score_batch
from finecap.rewards import call_batch
from finecap.rewards.cider import CiderReward
from finecap.serve.service import ImageTable, RewardService
from helpers.served import CAPTIONS, EXPECTED, IDS, every_front_end, serving, small_mixture


def test_a_hand_computed_mixture_through_every_front_end():
    reward = small_mixture()
    with serving(RewardService(reward, ImageTable(["a", "b"]), log_every=0)) as url:
        got = every_front_end(reward, url, CAPTIONS, IDS)
    for front_end, values in got.items():
        assert values == pytest.approx(EXPECTED, abs=1e-5), front_end
        assert values == got["in process"], front_end  # and bit for bit the in-process values


def test_the_per_sample_form_is_refused_for_a_reward_comparing_the_calls_images():
    with pytest.raises(ValueError, match="a per-sample call holds one: use compute_score_batch"):
        VerlReward(small_mixture())("finecap", "1 0", "", {"image_id": "a"})
    cider = VerlReward(CiderReward({"a": ["1 0"], "b": ["0 1"]}))
    assert cider("finecap", "1 0", "", {"image_id": "a"}) == {"score": pytest.approx(2.5), "cider": pytest.approx(2.5)}
    with pytest.raises(KeyError, match="sample 0's extra_info has no 'image_id' \\(keys: \\['img'\\]\\)"):
        cider("finecap", "1 0", "", {"img": "a"})
    with pytest.raises(ValueError, match="reward_kwargs.url"):
        compute_score("finecap", "1 0", "", {"image_id": "a"})


def test_verls_server_functions_take_the_token_and_timeout_of_reward_kwargs(monkeypatch):
    """``token`` and ``timeout`` in verl's ``reward_kwargs`` reach the client (they were swallowed: a server with a
    token answered 401, a timeout was 180 s whatever was given), and the cached client is one per (url, token,
    timeout), never another's."""
    import time

    import torch

    from finecap.rewards import RewardOutput
    from finecap.serve.client import TOKEN_ENV, RewardServerError

    def words(captions, batch):  # a caption "slow" takes 1 s
        if "slow" in captions:
            time.sleep(1.0)
        total = torch.tensor([float(len(c.split())) for c in captions])
        return RewardOutput(total, {"words": total})

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    token = "s3cret-token-0123456789"
    info = {"image_id": 1}
    with serving(RewardService(words, ImageTable([1]), log_every=0), token=token) as url:
        assert compute_score("d", "a red circle", "", info, url=url, token=token) == {"score": 3.0, "words": 3.0}
        assert asyncio.run(compute_score_async("d", "a b", "", info, url=url, token=token))["score"] == 2.0
        assert compute_score_batch(["d"], ["a"], [""], [info], url=url, token=token)[0]["score"] == 1.0
        with pytest.raises(RewardServerError, match=r"needs its token.*\[HTTP 401\]"):
            compute_score("d", "a red circle", "", info, url=url, token="wrong-token-0123456789")
        with pytest.raises(RewardServerError, match="ReadTimeout|timed out"):
            compute_score("d", "slow", "", info, url=url, token=token, timeout=0.2)
        assert compute_score("d", "slow", "", info, url=url, token=token)["score"] == 1.0  # the default: 180 s


def test_a_server_adapter_pickles_into_another_process_and_asks_the_same_server():
    """verl's ``remote`` reward manager pickles ``compute_score`` to Ray workers: a ``VerlReward(url=...)`` that has
    asked once (its client's pool and lock open) could not be pickled; its copy opens a pool of its own and gets the
    same values (tests/integrations/test_verl.py runs it through verl's own loader)."""
    import pickle

    reward = small_mixture()
    with serving(RewardService(reward, ImageTable(["a", "b"]), log_every=0)) as url:
        served = VerlReward(url=url)
        infos = [{"image_id": i} for i in IDS]
        first = served.batch(["d"] * 4, CAPTIONS, [""] * 4, infos)
        copy = pickle.loads(pickle.dumps(served))
        assert copy.batch(["d"] * 4, CAPTIONS, [""] * 4, infos) == first
        assert asyncio.run(copy.scorer.ascore(CAPTIONS, IDS)).total.tolist() == [r["score"] for r in first]
        copy.close()
        assert served.batch(["d"] * 4, CAPTIONS, [""] * 4, infos) == first  # the original's pool is its own
    assert [r["score"] for r in first] == reward(CAPTIONS, call_batch(IDS)).total.tolist()


@pytest.mark.parametrize("n_groups", [1, pytest.param(10, marks=pytest.mark.slow)])
def test_the_fixtures_captions_are_bit_identical_through_every_front_end(served, n_groups):
    """The 1,000 captions (10 requests of 100; the fast suite takes the first 100), NDLB's mixture."""
    service = served["mix"]
    with serving(service) as url:
        for captions, ids in served["groups"][:n_groups]:
            got = every_front_end(service.reward, url, captions, ids)
            assert len(set(got["in process"])) > 50  # values that tell the captions apart: nothing vacuous
            for front_end, values in got.items():
                assert values == got["in process"], front_end


@pytest.mark.slow
def test_per_sample_calls_of_a_per_caption_reward_equal_its_batch_values(served):
    """CIDEr-D scores each caption alone: verl's per-sample form (in process and through the server, which merges
    the concurrent requests it gets) gives each caption its value in the batch."""
    service = served["cider"]
    captions, ids = served["groups"][3]
    batch = service.reward(captions, {"image_ids": ids}).total.tolist()
    local = VerlReward(service.reward)
    assert [local("finecap", c, "", {"image_id": i})["score"] for c, i in zip(captions, ids, strict=True)] == batch
    with serving(service) as url:
        remote = [
            compute_score("finecap", c, "", {"image_id": i}, url=url)["score"]
            for c, i in zip(captions, ids, strict=True)
        ]

        async def concurrently():  # as verl's reward loop awaits its samples: the server merges them
            return await asyncio.gather(*(compute_score_async("finecap", c, "", {"image_id": i}, url=url)
                                          for c, i in zip(captions, ids, strict=True)))  # fmt: skip

        awaited = [r["score"] for r in asyncio.run(concurrently())]
    assert remote == batch and awaited == batch
