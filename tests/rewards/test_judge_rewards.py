"""The judge-backed rewards, computed by hand on 2 images x 3 captions: QA utility (CapRL's) and claim precision,
recall and F1 on the world judge; a judge failure marks its caption, never pays it a value."""

from __future__ import annotations

import math

import pytest
import torch

from finecap.config.sections.judge import JudgeConfig
from finecap.judges.base import JudgeFailed, Question
from finecap.judges.world import WorldJudge
from finecap.rewards import RewardInputs, RewardOutput, WeightedSum, call_batch, reward_of
from finecap.rewards.claims import ClaimsReward
from finecap.rewards.qa_utility import QAUtilityReward
from finecap.world.facts import faithfulness
from finecap.world.scene import Obj, Scene

A = Scene(0, "grass", [Obj("circle", "red", "large", 0, 0)])
B = Scene(1, "sand", [Obj("star", "green", "small", 1, 1, "dotted")])
SCENES = {0: A, 1: B}
QUESTIONS = {
    0: [Question("A/color", "What colour is the circle?", ("red", "blue", "green"), "red", ("color", "circle")),
        Question("A/bg", "What is the background?", ("grass", "sand"), "grass", ("background", None)),
        Question("A/count", "How many shapes?", ("1", "2", "3"), "1", ("count", None))],
    1: [Question("B/color", "What colour is the star?", ("green", "red"), "green", ("color", "star")),
        Question("B/pos", "Where is the star?", ("middle", "top left", "bottom"), "middle", ("position", "star"))],
}  # fmt: skip
CAPTIONS = ["a red circle on grass", "a blue circle on sand", "two circles",
            "a green star in the middle", "a red star at the top left", "a star"]  # fmt: skip
BATCH = {"image_ids": [0, 1], "image_index": torch.tensor([0, 0, 0, 1, 1, 1])}


def values(t: torch.Tensor) -> list[float]:
    return [round(v, 6) for v in t.tolist()]


def test_qa_utility_by_hand():
    reward = QAUtilityReward(WorldJudge(), questions=QUESTIONS, shuffles=2)
    out = reward(CAPTIONS, BATCH)
    # image 0 (3 questions): right colour + background; wrong colour + background; wrong count (2), nothing else
    # image 1 (2 questions): both right; both wrong; neither stated
    assert values(out.total) == values(torch.tensor([2 / 3, 0, 0, 1, 0, 0]))
    assert values(out.parts["answered"]) == values(out.total)
    assert values(out.parts["wrong"]) == values(torch.tensor([0, 2 / 3, 1 / 3, 0, 1, 0]))
    assert values(out.parts["cannot_answer"]) == values(torch.tensor([1 / 3, 1 / 3, 2 / 3, 0, 0, 1]))
    assert out.parts["judge_cannot_answer"].tolist() == [2, 2, 4, 0, 0, 4]  # asks: questions x 2 shuffles
    assert out.parts["judge_failed"].tolist() == [0] * 6
    assert reward.blind == {"questions": 5, "dropped": 0, "share": 0.0, "failed": 0}


def test_qa_utility_from_the_scene_graphs_through_the_registry():
    reward = reward_of("qa_utility", scenes=SCENES, judge=JudgeConfig(shuffles=1))
    # A: colour, size, position, background, count (5); B: the same and the pattern (6)
    out = reward(CAPTIONS, BATCH)
    assert values(out.total) == values(torch.tensor([2 / 5, 0, 0, 2 / 6, 0, 0]))  # colour + background; colour + cell


class BlindGuesser(WorldJudge):
    """Answers the background question right without the caption (a blind judge that knows the world's grass)."""

    def answer(self, asks):
        return [a.question.answer if a.caption is None and a.question.id == "A/bg" else x
                for a, x in zip(asks, super().answer(asks), strict=True)]  # fmt: skip


def test_blind_answerable_questions_are_dropped_and_their_share_reported():
    reward = QAUtilityReward(BlindGuesser(), questions=QUESTIONS, shuffles=2)
    assert reward.blind == {"questions": 5, "dropped": 1, "share": 0.2, "failed": 0}
    out = reward(CAPTIONS[:3], call_batch([0, 0, 0]))
    assert values(out.total) == values(torch.tensor([1 / 2, 0, 0]))  # colour and count only


class FailsOn(WorldJudge):
    """Fails every ask about one caption."""

    def __init__(self, caption):
        super().__init__()
        self.bad = caption

    def answer(self, asks):
        return [
            JudgeFailed("down") if a.caption == self.bad else x
            for a, x in zip(asks, super().answer(asks), strict=True)
        ]

    def claims(self, texts):
        return [JudgeFailed("down") if t == self.bad else x for t, x in zip(texts, super().claims(texts), strict=True)]


@pytest.mark.parametrize("name", ["qa_utility", "claims"])
def test_a_judge_failure_marks_its_caption_and_changes_no_other(name):
    judge = FailsOn(CAPTIONS[0])
    options = {"questions": QUESTIONS} if name == "qa_utility" else {"scenes": SCENES}
    out = reward_of(name, judge=judge, **options)(CAPTIONS, BATCH)
    clean = reward_of(name, judge=WorldJudge(), **options)(CAPTIONS, BATCH)
    assert out.parts["judge_failed"].tolist() == [1, 0, 0, 0, 0, 0]
    assert out.failed.tolist() == [True, False, False, False, False, False]
    assert math.isnan(out.total[0]) and out.total[1:].tolist() == clean.total[1:].tolist()
    assert all(math.isnan(p[0]) for k, p in out.parts.items() if k != "judge_failed")  # never a made-up value
    summed = WeightedSum({name: (1.0, reward_of(name, judge=judge, **options))})(CAPTIONS, BATCH)
    assert summed.parts[f"{name}/judge_failed"].tolist() == [1, 0, 0, 0, 0, 0]
    assert summed.failed.tolist() == out.failed.tolist() and math.isnan(summed.total[0])


def test_claims_by_hand_and_equal_to_the_faithfulness_metric():
    out = ClaimsReward(WorldJudge(), scenes=SCENES)(CAPTIONS, BATCH)
    # A's facts: object, colour, size, position, background, count (6); B's also its pattern (7)
    p = [1, 1 / 3, 1 / 2, 1, 1 / 3, 1]
    r = [3 / 6, 1 / 6, 1 / 6, 3 / 7, 1 / 7, 1 / 7]
    f1 = [2 / 3, 2 / 9, 1 / 4, 3 / 5, 1 / 5, 1 / 4]
    assert values(out.parts["precision"]) == values(torch.tensor(p))
    assert values(out.parts["recall"]) == values(torch.tensor(r))
    assert values(out.parts["f1"]) == values(out.total) == values(torch.tensor(f1))
    for n, caption in enumerate(CAPTIONS):
        want = faithfulness(caption, SCENES[BATCH["image_index"][n].item()])
        got = torch.stack([out.parts["precision"][n], out.parts["recall"][n]])
        assert torch.equal(got, torch.tensor([want.precision, want.recall], dtype=got.dtype))  # exactly, in its dtype
    recall = ClaimsReward(WorldJudge(), scenes=SCENES, score="recall")(CAPTIONS, BATCH)
    assert values(recall.total) == values(torch.tensor(r))


def test_a_caption_that_claims_nothing_earns_no_precision():
    # 0 of 0 claims was paid precision 1, the most a precision reward pays: score="precision" (BalCapRL's precision
    # half) rewarded an empty caption as highly as a wholly true one, and a policy learnt to say nothing
    captions = ["", "a big big big", "a red circle"]  # no fact, no fact (a size of no shape), two true facts of six
    batch = {"image_ids": [0], "image_index": torch.tensor([0, 0, 0])}
    out = ClaimsReward(WorldJudge(), scenes=SCENES, score="precision")(captions, batch)
    assert values(out.total) == values(out.parts["precision"]) == [0.0, 0.0, 1.0]
    assert values(out.parts["recall"]) == values(torch.tensor([0.0, 0.0, 2 / 6]))
    assert values(out.parts["f1"]) == values(torch.tensor([0.0, 0.0, 2 * (1 / 3) / (1 + 1 / 3)]))  # 2PR / (P + R)
    assert not out.failed.any()  # scored, not failed: 0 is its value
    for caption in captions[:2]:  # the metric keeps the faithfulness metric's reading: nothing claimed, nothing false
        assert faithfulness(caption, A).precision == 1.0


def test_claims_against_a_calls_own_references():
    batch = call_batch([0, 0], [["a red circle on grass"]] * 2)
    out = reward_of("claims", references={0: ["unused"]})(["a red circle", "a blue square"], batch)
    # reference facts: object(circle), color(circle)=red, background=grass
    assert values(out.parts["precision"]) == [1.0, 0.0]
    assert values(out.parts["recall"]) == values(torch.tensor([2 / 3, 0.0]))


def test_the_rewards_refuse_to_build_without_their_data():
    with pytest.raises(ValueError, match="questions="):
        reward_of("qa_utility")
    with pytest.raises(ValueError, match="references="):
        reward_of("claims")
    with pytest.raises(ValueError, match="score='f2'; valid: f1, precision, recall"):
        reward_of("claims", scenes=SCENES, score="f2")
    with pytest.raises(TypeError, match="judge= must be a finecap.judges.base.Judge or a judge name"):
        reward_of("claims", scenes=SCENES, judge=3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'shuffles'"):  # a key of the judge section
        reward_of("qa_utility", scenes=SCENES, shuffles=1)
    assert isinstance(QAUtilityReward(WorldJudge(), questions=QUESTIONS)(["a"], {"image_ids": [0]}), RewardOutput)
    with pytest.raises(ValueError, match="image 5 has no questions"):
        QAUtilityReward(WorldJudge(), questions=QUESTIONS)(["a"], {"image_ids": [5]})


def test_the_trl_adapter_pays_what_the_reward_pays_in_process():
    from finecap.integrations.trl import reward_function

    for name, options in (("qa_utility", {"questions": QUESTIONS}), ("claims", {"scenes": SCENES})):
        fn = reward_function(name, **options)
        ids = BATCH["image_index"].tolist()
        in_process = reward_of(name, **options)(CAPTIONS, call_batch(ids))
        assert fn(prompts=["p"] * 6, completions=CAPTIONS, image_id=ids) == in_process.total.tolist()


def test_served_as_serve_reward_sets_it_up_the_values_are_the_in_process_ones(tmp_path):
    """``finecap serve-reward``'s set-up (the training loop's: the run's judge, the world's scenes) pays what the
    rewards built in process on the same scenes pay."""
    from finecap.app.serve_reward import load_reward
    from finecap.config import load
    from finecap.world.make import load_scenes
    from helpers.tiny_world import make_tiny_world, world_items

    world = make_tiny_world(tmp_path / "world")
    cfg = load(None, [*world_items(world), "rl.rewards={qa_utility: 1.0, claims: 0.5}", "judge.noise=0.2"])
    served, records = load_reward(cfg)
    ids = [r.image_id for r in records[:4] for _ in range(2)]
    captions = [c for r in records[:4] for c in (r.captions[0], "a red circle on grass")]
    out = served(captions, call_batch(ids))
    scenes = load_scenes(world)
    judge = WorldJudge(noise=0.2)
    qa = reward_of("qa_utility", judge=judge, scenes=scenes)(captions, call_batch(ids))
    claims = reward_of("claims", judge=judge, scenes=scenes)(captions, call_batch(ids))
    assert out.parts["qa_utility"].tolist() == qa.total.tolist()
    assert out.parts["claims"].tolist() == claims.total.tolist()
    assert out.total.tolist() == pytest.approx((qa.total + 0.5 * claims.total).tolist())


CLOSED: list[object] = []


class ClosingWorldJudge(WorldJudge):
    """The world judge, recording its close into :data:`CLOSED`."""

    def close(self) -> None:
        CLOSED.append(self)


def closing_world_judge(cfg, **options):
    return ClosingWorldJudge()


class FailingWorldJudge(ClosingWorldJudge):
    """A judge whose close fails (its server went away) after recording it."""

    def close(self) -> None:
        super().close()
        raise OSError("the judge's server went away")


def failing_world_judge(cfg, **options):
    return FailingWorldJudge()


def test_a_reward_closes_the_judge_it_built_once_and_never_a_judge_it_was_given():
    # through the weighted sum and a length transform, as rl.rewards holds them; after use, closed twice over
    from finecap.rewards.length import PiecewiseLength

    CLOSED.clear()
    path, given = f"{__name__}:closing_world_judge", ClosingWorldJudge()
    qa = QAUtilityReward(path, questions=QUESTIONS)
    claims = ClaimsReward(path, scenes=SCENES)
    total = WeightedSum({"qa": (1.0, PiecewiseLength(qa, l1=2, l2=6, weight=0.5)), "claims": (1.0, claims),
                         "given": (1.0, ClaimsReward(given, scenes=SCENES))})  # fmt: skip
    assert total(CAPTIONS, BATCH).total.shape == (6,)
    total.close()
    total.close()
    assert len(CLOSED) == 2 and CLOSED[0] is qa.judge and CLOSED[1] is claims.judge and given not in CLOSED


def test_a_weighted_sum_closes_every_component_when_one_fails_to_close():
    CLOSED.clear()
    first = ClaimsReward(f"{__name__}:failing_world_judge", scenes=SCENES)
    second = QAUtilityReward(f"{__name__}:closing_world_judge", questions=QUESTIONS)
    total = WeightedSum({"first": (1.0, first), "second": (1.0, second)})
    assert total(CAPTIONS, BATCH).total.shape == (6,)
    with pytest.raises(OSError, match="went away"):
        total.close()
    assert len(CLOSED) == 2 and CLOSED[0] is first.judge and CLOSED[1] is second.judge


class KnowsEverythingBlind(WorldJudge):
    """Answers every question about image 1 right without the caption."""

    def answer(self, asks):
        return [a.question.answer if a.caption is None and a.question.id.startswith("B/") else x
                for a, x in zip(asks, super().answer(asks), strict=True)]  # fmt: skip


def test_a_run_whose_training_images_lack_questions_is_refused_at_set_up():
    # a run's training image without questions once crashed the run at the first batch holding it
    from types import SimpleNamespace

    records = [SimpleNamespace(image_id=i) for i in (0, 1, 2)]
    reward = QAUtilityReward(WorldJudge())
    reward.setup(RewardInputs(questions=QUESTIONS, records=records[:2]))  # every training image has questions
    assert sorted(reward.known_images()) == [0, 1]
    with pytest.raises(ValueError, match=r"1 of 3 training images have no questions; given none: 1 \(2\)\."):
        QAUtilityReward(WorldJudge()).setup(RewardInputs(questions=QUESTIONS, records=records))
    blind = r"2 of 3 .*; given none: 1 \(2\); all answered right by a blind judge: 1 \(1\)"
    with pytest.raises(ValueError, match=blind):
        QAUtilityReward(KnowsEverythingBlind(), shuffles=1).setup(RewardInputs(questions=QUESTIONS, records=records))
    QAUtilityReward(WorldJudge()).setup(RewardInputs(questions={"0": QUESTIONS[0], 1: QUESTIONS[1]},
                                                     records=records[:2]))  # ids as ints or strings  # fmt: skip


def test_the_claims_rewards_images_are_one_each_however_a_side_keys_them():
    # references keyed by integral floats (a pandas-written file) beside scenes keyed by the ids' strings: each image
    # was listed twice (str(1.0) is "1.0"), where every other reward reads both as one (records.id_text)
    scenes = {str(i): scene for i, scene in SCENES.items()}
    references = {float(i): ["a caption"] for i in SCENES}
    known = ClaimsReward(WorldJudge(), references=references, scenes=scenes).known_images()
    assert sorted(known) == sorted(float(i) for i in SCENES)


KEYED_TWICE = r"^{}: 1 image\(s\) keyed twice, e\.g\. 0 and '0' \(an int id and its string are one id"


@pytest.mark.parametrize(
    ("name", "table", "given"),
    [
        ("claims", "references", {0: ["a red circle on grass"], "0": ["a green star"], 1: ["a green star"]}),
        ("claims", "scenes", {0: A, "0": B, 1: B}),
        ("qa_utility", "questions", {0: QUESTIONS[0], "0": QUESTIONS[1], 1: QUESTIONS[1]}),
        ("qa_utility", "scenes", {0: A, "0": B, 1: B}),
    ],
)
def test_evidence_keyed_by_an_int_and_its_string_is_refused(name, table, given):
    """Image 0 keyed 0 and "0" with two different entries: a caption of it met the entry its call's spelling found
    first (the exact key), without a word. Before, "a red circle on grass" called as 0 and as "0" was paid: claims
    1.0 and 0.0 (references), 2/3 and 0.0 (scenes); qa_utility 2/3 and 0.0 (questions), 0.4 and 0.0 (scenes).
    Refused wherever the table enters the reward: the constructor and set-up (reward_of, an adapter's options)."""
    build = {"claims": ClaimsReward, "qa_utility": QAUtilityReward}[name]
    said = KEYED_TWICE.format(f"{name} {table}")
    with pytest.raises(ValueError, match=said):
        build(WorldJudge(), **{table: given})
    with pytest.raises(ValueError, match=said):
        reward_of(name, judge=WorldJudge(), **{table: given})
    with pytest.raises(ValueError, match=said):  # a world= folder's or a run's inputs land in set-up alike
        build(WorldJudge()).setup(RewardInputs(**{table: given}))
    one = {i: v for i, v in given.items() if i != "0"}  # keyed once, the same table is read either way
    caption = ["a red circle on grass"]
    reward = reward_of(name, judge=WorldJudge(), **{table: one})
    assert reward(caption, call_batch([0])).total.tolist() == reward(caption, call_batch(["0"])).total.tolist()
