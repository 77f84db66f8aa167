"""Length shaping wrapped around a reward, computed by hand on 2 images x 3 captions: CapRL's piecewise length
reward, DAPO's soft overlong punishment, BalCapRL's length-conditional mask; a wrapped failure is passed on."""

from __future__ import annotations

import pytest
import torch

from finecap.rewards import RewardOutput, reward_of
from finecap.rewards.length import LengthMask, PiecewiseLength, SoftOverlong, piecewise_length, soft_overlong

BATCH = {"image_ids": [0, 1], "image_index": torch.tensor([0, 0, 0, 1, 1, 1])}


def words(*lengths: int) -> list[str]:
    return [" ".join(["w"] * n) for n in lengths]


class Fixed:
    """A reward paying the given values, with a part and a failure mask of its own."""

    per_caption = True

    def __init__(self, values, failed=None):
        self.values, self.failed = torch.tensor(values), failed

    def __call__(self, captions, batch):
        failed = None if self.failed is None else torch.tensor(self.failed)
        return RewardOutput(self.values.clone(), {"inner": self.values.clone()}, failed)


INNER = [0.2, 0.4, 0.6, 0.8, 1.0, 0.0]


def test_caprl_piecewise_length():
    # l1 = 3, l2 = 5: R_l = 1 up to 3 words, 1 - (L - 3) / 2 up to 5, then 0
    out = PiecewiseLength(Fixed(INNER), l1=3, l2=5, weight=0.5)(words(2, 3, 4, 5, 6, 1), BATCH)
    r = [1, 1, 0.5, 0, 0, 1]
    assert out.parts["length_reward"].tolist() == r
    assert out.total.tolist() == pytest.approx([v + 0.5 * x for v, x in zip(INNER, r, strict=True)])
    assert out.parts["inner"].tolist() == pytest.approx(INNER)
    assert piecewise_length(torch.tensor([2.0, 3.0, 4.0]), 3, 3).tolist() == [1, 1, 0]  # l2 <= l1: a step


def test_dapo_soft_overlong():
    # L_max = 6, L_cache = 2: 0 up to 4 words, (4 - L) / 2 up to 6, -1 beyond
    out = SoftOverlong(Fixed(INNER), max_length=6, cache=2)(words(2, 4, 5, 6, 7, 3), BATCH)
    r = [0, 0, -0.5, -1, -1, 0]
    assert out.parts["overlong"].tolist() == r
    assert out.total.tolist() == pytest.approx([v + x for v, x in zip(INNER, r, strict=True)])
    assert soft_overlong(torch.tensor([100.0]), 6, 2).tolist() == [-1]
    with pytest.raises(ValueError, match="cache"):
        SoftOverlong(Fixed(INNER), max_length=6, cache=0)


def test_balcaprl_length_mask():
    out = LengthMask(Fixed(INNER), min_length=2, max_length=4)(words(1, 2, 4, 5, 3, 0), BATCH)
    assert out.parts["length_mask"].tolist() == [0, 1, 1, 0, 1, 0]
    assert out.total.tolist() == pytest.approx([0, 0.4, 0.6, 0, 1.0, 0])


def test_a_transform_passes_the_wrapped_failures_and_hooks_on():
    failed = [False, True, False, False, False, False]
    out = PiecewiseLength(Fixed(INNER, failed), l1=3, l2=5)(words(1, 1, 1, 1, 1, 1), BATCH)
    assert out.failed.tolist() == failed
    judged = [float("nan") if f else v for v, f in zip(INNER, failed, strict=True)]  # a judged reward's failure
    for shaped in (PiecewiseLength(Fixed(judged, failed), l1=3, l2=5), SoftOverlong(Fixed(judged, failed),
                   max_length=6, cache=2), LengthMask(Fixed(judged, failed), min_length=0, max_length=4)):  # fmt: skip
        total = shaped(words(1, 1, 1, 1, 1, 1), BATCH).total
        assert total.isnan().tolist() == failed, type(shaped).__name__  # never paid a value
    shaped = reward_of("length", reward=Fixed(INNER), kind="mask", max_length=2)
    assert shaped.per_caption and shaped(words(1, 3, 1, 1, 1, 1), BATCH).total.tolist()[:2] == pytest.approx([0.2, 0])
    with pytest.raises(ValueError, match="reward="):
        reward_of("length")
    with pytest.raises(ValueError, match="unknown kind 'x'"):
        reward_of("length", reward=Fixed(INNER), kind="x")
    with pytest.raises(TypeError, match="l1= is not a parameter of kind=mask"):
        reward_of("length", reward=Fixed(INNER), kind="mask", l1=3)


def test_the_registrys_length_wraps_a_named_reward_and_passes_its_settings_and_data_on():
    from finecap.judges.world import WorldJudge
    from finecap.world.scene import Obj, Scene

    scenes = {0: Scene(0, "grass", [Obj("circle", "red", "large", 0, 0)])}
    batch = {"image_ids": [0], "image_index": torch.tensor([0, 0])}
    captions = ["a red circle", "a red circle on grass " + " ".join(["w"] * 10)]
    shaped = reward_of("length", reward="claims", kind="soft_overlong", max_length=8, cache=4, score="precision",
                       judge=WorldJudge(), scenes=scenes)  # fmt: skip
    claims = reward_of("claims", score="precision", judge=WorldJudge(), scenes=scenes)
    inner = claims(captions, batch)
    out = shaped(captions, batch)
    assert shaped.per_caption and shaped.known_images() == [0]  # the inner reward's: the images with a scene
    assert out.parts["overlong"].tolist() == [0, -1] and out.parts["precision"].tolist() == inner.total.tolist()
    assert out.total.tolist() == pytest.approx((inner.total + torch.tensor([0.0, -1.0])).tolist())
    # its judge's work, which training logs per step (RewardBase.tallies), is the wrapped reward's
    assert shaped.tallies() == claims.tallies() and shaped.tallies()["judge/calls"] > 0
    from finecap.config import load
    from finecap.rewards import get_reward

    assert get_reward("length", load()).tallies() == {}  # wrapping nothing yet: nothing counted, no error


def test_settings_of_the_wrapped_reward_come_with_its_name_never_with_a_built_reward():
    from finecap.rewards import call_batch
    from finecap.rewards.cider import CiderReward

    refs = {1: ["a red circle", "a small red circle"]}
    caption, batch = ["a red circle on the big green grass"], call_batch([1])
    by_name = reward_of("length", reward="cider", references=refs, kind="piecewise", l1=99, l2=100, sigma=1.0)
    # R_l = 1 (8 words <= l1); CIDEr-D with sigma 1: the length penalty exp(-d^2 / 2) of d = 5 and 4 more bigrams
    # than the references shrinks it to ~0.0003
    assert by_name(caption, batch).total.item() == pytest.approx(1 + reward_of("cider", references=refs, sigma=1.0)(
        caption, batch).total.item()) and by_name(caption, batch).total.item() < 1.001  # fmt: skip
    # a built CiderReward has its statistics (and sigma 6) already: sigma=1 given to it was taken by the reward but
    # not by its scorer, so the caption scored 1.96 against the image's references and 0.0003 against the same
    # references given with the call (caption_references); a setting is given when a reward is built, as reward_of
    with pytest.raises(TypeError, match=r"settings \['sigma'\] are given with a built reward"):
        reward_of("length", reward=CiderReward(refs), kind="piecewise", l1=99, l2=100, sigma=1.0)


def test_length_in_rl_rewards_is_refused_before_the_run_naming_the_dotted_path_route():
    from finecap.config import load
    from finecap.rewards import RewardInputs, build_reward

    reward = build_reward(load(None, ["rl.rewards={length: 1.0}"]))
    with pytest.raises(ValueError, match="rl.rewards gives a reward no settings: name a factory of your own"):
        reward.setup(RewardInputs())
