"""A judge reward answers the same bits in every front end (in process, ``finecap serve-reward`` over HTTP on
127.0.0.1, TRL's adapter, in process and over the server's URL), and a judge failing a third of its calls fails those
captions: marked ``failed``, counted in ``judge_failed``, a NaN total in the weighted sum (never the other rewards'
value, as if the judge's were 0), ``null`` from the server."""

from __future__ import annotations

import math

import httpx
import pytest

from finecap.judges.base import JudgeFailed
from finecap.judges.world import WorldJudge
from finecap.rewards import WeightedSum, call_batch, reward_of
from finecap.serve.service import ImageTable, RewardService
from finecap.world.scene import Obj, Scene
from helpers.served import serving


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from helpers.tiny_world import make_tiny_world

    return make_tiny_world(tmp_path_factory.mktemp("judged") / "world")


def test_a_judge_reward_is_bit_identical_in_process_served_and_through_trl(world):
    from finecap.app.serve_reward import build_service
    from finecap.config import load
    from finecap.integrations.trl import reward_function
    from finecap.world.make import load_scenes
    from helpers.tiny_world import world_items

    cfg = load(None, [*world_items(world), "rl.rewards={qa_utility: 1.0, claims: 0.5}", "judge.noise=0.2"])
    service = build_service(cfg, log_every=0)  # as `finecap serve-reward` builds it
    images = sorted(service.reward.known_images())[:5]  # training images with questions
    ids = [i for i in images for _ in range(3)]
    scenes = load_scenes(world)
    captions = [c for i in images for c in (f"a {scenes[i].objects[0].color} {scenes[i].objects[0].shape}",
                                             "a red circle on grass", "two small blue squares")]  # fmt: skip
    judge = WorldJudge(noise=0.2)  # judge.noise=0.2, judge.seed=0
    qa = reward_of("qa_utility", judge=judge, scenes=scenes)
    claims = reward_of("claims", judge=judge, scenes=scenes)
    mix = WeightedSum({"qa_utility": (1.0, qa), "claims": (0.5, claims)})(captions, call_batch(ids))
    assert len(set(mix.parts["qa_utility"].tolist())) > 2  # the values differ: the test can tell them apart
    with serving(service) as url:
        got = httpx.post(f"{url}/reward", json={"captions": captions, "image_ids": ids}).json()
        assert got["total"] == mix.total.tolist()
        assert got["parts"] == {k: v.tolist() for k, v in mix.parts.items()}
        trl_url = reward_function(url=url, name="mix")
        assert trl_url(prompts=["p"] * len(ids), completions=captions, image_id=ids) == mix.total.tolist()
    for name, reward in (("qa_utility", qa), ("claims", claims)):
        trl = reward_function(name, judge=WorldJudge(noise=0.2), world=str(world))
        assert trl(prompts=["p"] * len(ids), completions=captions, image_id=ids) == mix.parts[name].tolist()
        assert reward(captions, call_batch(ids)).total.tolist() == mix.parts[name].tolist()


class FailsAThird(WorldJudge):
    """The world judge, failing every ask about every third caption it sees (in order of first sight): a third of
    its calls about captions; blind asks (no caption) never fail."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, int] = {}

    def answer(self, asks):
        out = super().answer(asks)
        for n, ask in enumerate(asks):
            if ask.caption is not None and self.seen.setdefault(ask.caption, len(self.seen)) % 3 == 2:
                out[n] = JudgeFailed("HTTP 500")
        return out


SCENES = {i: Scene(i, "grass", [Obj(shape, color, "large", 1, 1)])
          for i, (shape, color) in enumerate((("circle", "red"), ("square", "blue")))}  # fmt: skip
CAPTIONS = ["a red circle", "a blue circle", "a large red circle on grass",
            "a blue square", "a red square", "a small blue square"]  # fmt: skip
IDS = [0, 0, 0, 1, 1, 1]


def test_failed_judge_calls_give_failed_captions_counted_never_paid_and_answered_null():
    qa = reward_of("qa_utility", judge=FailsAThird(), scenes=SCENES)
    mix = WeightedSum({"qa_utility": (1.0, qa), "claims": (0.5, reward_of("claims", scenes=SCENES))})
    out = mix(CAPTIONS, call_batch(IDS))
    failed = [n % 3 == 2 for n in range(6)]  # the third caption of each image is the third, sixth seen
    assert out.failed.tolist() == failed
    assert out.parts["qa_utility/judge_failed"].tolist() == [float(f) for f in failed]  # counted: 2 of 6
    clean = WeightedSum({"qa_utility": (1.0, reward_of("qa_utility", scenes=SCENES)),
                         "claims": (0.5, reward_of("claims", scenes=SCENES))})(CAPTIONS, call_batch(IDS))  # fmt: skip
    for n in range(6):
        if failed[n]:  # never paid: not 0.5 * claims, as a judge value of 0 would pay
            assert math.isnan(out.total[n]) and math.isnan(out.parts["qa_utility"][n])
            assert out.parts["claims"][n] == clean.parts["claims"][n] > 0  # the other reward's value is there
        else:
            assert out.total[n] == clean.total[n] and math.isfinite(out.total[n])
    with serving(RewardService(mix, ImageTable(SCENES), log_every=0)) as url:
        got = httpx.post(f"{url}/reward", json={"captions": CAPTIONS, "image_ids": IDS}).json()
    assert got["failed"] == 2
    assert [v is None for v in got["total"]] == failed
    assert got["total"] == [None if f else v for f, v in zip(failed, clean.total.tolist(), strict=True)]
    assert all(v is None for name in ("qa_utility", "claims", "qa_utility/judge_failed")
               for v, f in zip(got["parts"][name], failed, strict=True) if f)  # fmt: skip
    from finecap.integrations.trl import reward_function

    trl = reward_function(mix, name="mix")(prompts=["p"] * 6, completions=CAPTIONS, image_id=IDS)
    assert trl == got["total"]  # None: TRL leaves it out
    from finecap.integrations.openrlhf import reward_function as openrlhf_function
    from finecap.serve.protocol import FailedCaptions

    # OpenRLHF has no NaN handling (a NaN reaches its group's statistics): in process, the server's 502 as an error
    with pytest.raises(FailedCaptions, match=r"could not score 2 of 6 captions \(query\[2\], query\[5\]\)"):
        openrlhf_function(mix)(CAPTIONS, [""] * 6, IDS)
    from finecap.integrations.swift import orm
    from finecap.integrations.verl import VerlReward

    # verl: NaN; ms-swift sums a NaN as 0 (nansum): the server's error, naming the completions
    verl = VerlReward(mix).batch(["d"] * 6, CAPTIONS, [""] * 6, [{"image_id": i} for i in IDS])
    assert [math.isnan(r["score"]) for r in verl] == failed
    assert [r["score"] for r in verl if not math.isnan(r["score"])] == [v for v in got["total"] if v is not None]
    with pytest.raises(
        FailedCaptions, match=r"could not score 2 of 6 captions \(completions\[2\], completions\[5\]\)"
    ):
        orm(mix)()(CAPTIONS, image_id=IDS, trainer_state=None)


def test_a_shaped_judge_reward_in_rl_rewards_by_dotted_path_is_set_up_as_the_run_sets_it_up(world):
    from finecap.app.serve_reward import load_reward
    from finecap.config import load
    from finecap.rewards.length import PiecewiseLength
    from finecap.world.make import load_scenes
    from helpers.tiny_world import world_items

    rewards = "rl.rewards={'helpers.shaped_rewards:qa_shaped': 1.0, 'helpers.shaped_rewards:claims_precision': 1.0}"
    served, _ = load_reward(load(None, [*world_items(world), rewards]))
    scenes = load_scenes(world)
    images = sorted(served.known_images())[:3]
    ids = [i for i in images for _ in range(2)]
    captions = [c for i in images for c in (f"a {scenes[i].objects[0].color} {scenes[i].objects[0].shape}",
                                            "a red circle on grass in the middle of the image")]  # fmt: skip
    out = served(captions, call_batch(ids))
    qa = PiecewiseLength(reward_of("qa_utility", scenes=scenes), l1=2, l2=6, weight=0.5)(captions, call_batch(ids))
    precision = reward_of("claims", scenes=scenes, score="precision")(captions, call_batch(ids))
    assert out.parts["helpers.shaped_rewards:qa_shaped"].tolist() == qa.total.tolist()
    assert qa.parts["length_reward"].tolist() == [0.75, 0.0] * 3  # 3 words: 1 - (3 - 2) / 4; 10 words: past l2
    assert out.parts["helpers.shaped_rewards:claims_precision"].tolist() == precision.parts["precision"].tolist()


def test_claims_reads_an_image_id_as_an_int_or_its_string_and_refuses_an_image_without_evidence():
    # through an adapter's scorer: "7" is image 7 (it was scored against no evidence: 0), an unknown image is refused
    # before the judge (it was scored 0, an empty caption's precision 1), in process too
    from finecap.integrations.scoring import Scorer

    caption = ["a red circle on grass"]
    with Scorer.of("claims", judge=WorldJudge(), references={7: ["a red circle on grass"]}) as scorer:
        assert scorer.score(caption, [7]).total.tolist() == [1.0]
        assert scorer.score(caption, ["7"]).total.tolist() == [1.0]
        with pytest.raises(ValueError, match="unknown image id 8"):
            scorer.score(caption, [8])
    claims = reward_of("claims", judge=WorldJudge(), references={"7": ["a red circle on grass"]})
    assert claims(caption, call_batch([7])).total.tolist() == [1.0]
    with pytest.raises(ValueError, match="image 8 has no references and no scene"):
        claims(caption, call_batch([8]))
