"""Every registered reward's settings (:meth:`finecap.rewards.RewardBase.configure`, an adapter's options): a bad value
is a ValueError naming the reward and the setting when it is given, never a bare error at the first call; a setting
given after ``setup`` applies wholly or is refused."""

from __future__ import annotations

import pytest

from finecap.judges.world import WorldJudge
from finecap.rewards import RewardInputs, call_batch, reward_of
from finecap.rewards.base import flag_setting, number_setting
from finecap.rewards.claims import ClaimsReward
from finecap.rewards.length import LengthMask, PiecewiseLength, SoftOverlong
from finecap.rewards.qa_utility import QAUtilityReward
from finecap.world.scene import Obj, Scene

SCENES = {0: Scene(0, "grass", [Obj("circle", "red", "large", 0, 0)])}
REFS = {1: ["a red circle", "a small red circle"], 2: ["a blue square"]}
OBJECTS = {1: frozenset({"dog"})}


def test_number_and_flag_settings():
    assert number_setting("r", "w", 2) == 2.0 and number_setting("r", "w", float("inf"), infinite=True) == float("inf")
    for value, match in [(True, "must be a number"), ("1", "must be a number"), (None, "must be a number"),
                         (float("nan"), "finite"), (float("-inf"), "finite"), (float("inf"), "finite")]:  # fmt: skip
        with pytest.raises(ValueError, match=f"^r: w=.* {match}"):
            number_setting("r", "w", value)
    with pytest.raises(ValueError, match="must be above 0"):
        number_setting("r", "w", 0, positive=True)
    with pytest.raises(ValueError, match="must be at least 0"):
        number_setting("r", "w", -1, minimum=0)
    assert flag_setting("r", "f", False) is False
    with pytest.raises(ValueError, match="^r: f='false' must be True or False"):
        flag_setting("r", "f", "false")  # a truthy string: it read as True


BAD = [
    # the old code took each of these and failed at the first call (a TypeError of '**' or '<=', a ZeroDivisionError,
    # an IndexError-like TypeError of a tensor, a NonFiniteReward) or not at all ('no' read as True)
    ("cider", {"references": REFS, "sigma": "6"}, "cider: sigma='6' must be a number"),
    ("cider", {"references": REFS, "sigma": 0}, "cider: sigma=0 must be above 0"),
    ("cider", {"references": REFS, "tokenize_text": "no"}, "cider: tokenize_text='no' must be True or False"),
    ("chair", {"objects": OBJECTS, "recall_weight": "0.5"}, "chair: recall_weight='0.5' must be a number"),
    ("chair", {"objects": OBJECTS, "recall_weight": float("nan")}, "chair: recall_weight=nan must be a finite"),
    ("claims", {"scenes": SCENES, "score": "bogus"}, "claims: score='bogus'; valid: f1, precision, recall"),
    ("length", {"reward": "cider", "references": REFS, "kind": "piecewise"}, "length: kind=piecewise needs l1=, l2="),
    ("length", {"reward": "cider", "references": REFS, "kind": "piecewise", "l1": "3", "l2": 5},
     "length: l1='3' must be a number"),
    ("length", {"reward": "cider", "references": REFS, "kind": "piecewise", "l1": 3, "l2": 5, "weight": float("nan")},
     "length: weight=nan must be a finite number"),
    ("length", {"reward": "cider", "references": REFS, "kind": "soft_overlong", "max_length": "5", "cache": 2},
     "length: max_length='5' must be a number"),
    ("length", {"reward": "cider", "references": REFS, "kind": "mask", "min_length": 5, "max_length": 2},
     "length: max_length=2 is below min_length=5"),  # every caption masked: the old code paid 0 to all
]  # fmt: skip


@pytest.mark.parametrize(("name", "options", "match"), BAD, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(BAD)])
def test_a_bad_setting_is_refused_when_given_naming_the_reward_and_the_setting(name, options, match):
    with pytest.raises(ValueError, match=f"^{match}"):
        reward_of(name, **options)


def test_the_length_transforms_check_their_parameters_when_built_directly():
    inner = reward_of("cider", references=REFS)
    with pytest.raises(ValueError, match="^length: l2=-1 must be at least 0"):
        PiecewiseLength(inner, l1=0, l2=-1)
    with pytest.raises(ValueError, match="^length: cache=inf must be a finite number"):
        SoftOverlong(inner, max_length=10, cache=float("inf"))
    assert LengthMask(inner, min_length=2).max_length == float("inf")  # no upper bound: the default


def test_claims_settings_given_after_setup_apply():
    caption, batch = ["a blue circle"], call_batch([0])
    reward = ClaimsReward()
    reward.setup(RewardInputs(scenes=SCENES))
    # a judge name given after setup was kept as a string: every call then failed ("no judge or evidence")
    reward.configure(judge="world", score="precision")
    assert isinstance(reward.judge, WorldJudge)
    assert reward(caption, batch).total.tolist() == [0.5]  # object true, colour false: 1 of 2 claims
    # an unknown score after setup was a bare KeyError('bogus') at the next call; it is refused, the score kept
    with pytest.raises(ValueError, match="^claims: score='bogus'"):
        reward.configure(score="bogus")
    assert reward.score == "precision" and reward(caption, batch).total.tolist() == [0.5]
    # a judge of no kind after setup was taken, and every call failed; refused as set-up refuses it
    with pytest.raises(TypeError, match="^claims: judge= must be a finecap.judges.base.Judge or a judge name"):
        reward.configure(judge=42)
    assert isinstance(reward.judge, WorldJudge)


class ClosingJudge(WorldJudge):
    closed = 0

    def close(self) -> None:
        ClosingJudge.closed += 1


def closing_judge(cfg, **options):
    return ClosingJudge()


def test_a_judge_the_reward_built_is_closed_when_configure_replaces_it():
    ClosingJudge.closed = 0
    reward = ClaimsReward(f"{__name__}:closing_judge", scenes=SCENES)  # built from the name: the reward's to close
    given = ClosingJudge()
    reward.configure(judge=given)
    assert reward.judge is given and ClosingJudge.closed == 1
    reward.close()
    assert ClosingJudge.closed == 1  # the judge given stays its giver's


def test_qa_utility_refuses_a_judge_after_its_questions_were_filtered_by_another():
    reward = QAUtilityReward(shuffles=1)
    reward.setup(RewardInputs(scenes=SCENES))
    # the old code kept the name unresolved (every call a RuntimeError), or would have kept the blind filter of the
    # judge it replaced
    with pytest.raises(ValueError, match=r"^qa_utility: configure\(judge=...\) after the questions were prepared"):
        reward.configure(judge="world")
    assert isinstance(reward.judge, WorldJudge) and reward(
        ["a red circle"], call_batch([0])
    ).total.tolist() == pytest.approx([0.2])  # 1 of 5
