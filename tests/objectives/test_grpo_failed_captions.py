"""Captions a reward could not score (``RewardOutput.failed``) in the GRPO family's advantages
(finecap.objectives.grpo), hand-computed on 2 images x 3 samples with one failure for group, batch and GDPO
normalisation: every statistic skips the failed caption and its advantage is 0; a group whose captions all failed is
all 0; without failures the masked call is the unmasked one bit for bit."""

import math

import pytest
import torch

from finecap.objectives.grpo import EPS, group_advantages, normalize_then_sum, zero_std_share

# Image 0 samples (1, x, 6), caption 1 failed (its value, NaN here, must not matter); image 1 (3, 4, 8).
#   image 0 over its scored (1, 6): mean 3.5, deviations (-2.5, 2.5), Bessel variance 12.5 / 1, std sqrt(12.5)
#   image 1: mean 5, deviations (-2, -1, 3), variance (4 + 1 + 9) / 2 = 7, std sqrt(7)
REWARDS = torch.tensor([1.0, float("nan"), 6.0, 3.0, 4.0, 8.0])
FAILED = torch.tensor([False, True, False, False, False, False])
CENTRED = [-2.5, 0.0, 2.5, -2.0, -1.0, 3.0]


def test_group_scaling_skips_the_failed_caption():
    s0, s1 = math.sqrt(12.5) + EPS, math.sqrt(7.0) + EPS
    got = group_advantages(REWARDS, 3, "group", failed=FAILED)
    assert got.tolist() == pytest.approx([-2.5 / s0, 0.0, 2.5 / s0, -2 / s1, -1 / s1, 3 / s1], rel=1e-6)
    assert got[1].item() == 0.0


def test_no_scaling_centres_on_the_scored_captions_mean():
    assert group_advantages(REWARDS, 3, "none", failed=FAILED).tolist() == CENTRED


def test_batch_scaling_takes_the_std_of_the_scored_captions_only():
    # the five scored rewards (1, 6, 3, 4, 8): mean 22 / 5 = 4.4; deviations (-3.4, 1.6, -1.4, -0.4, 3.6); squares
    # 11.56 + 2.56 + 1.96 + 0.16 + 12.96 = 29.2; Bessel variance 29.2 / 4 = 7.3
    std = math.sqrt(7.3) + EPS
    got = group_advantages(REWARDS, 3, "batch", failed=FAILED)
    assert got.tolist() == pytest.approx([c / std for c in CENTRED], rel=1e-6)


def test_gdpo_skips_the_failed_caption_in_each_reward_and_in_the_batch():
    retrieval = torch.tensor([0.0, 5.0, 3.0, 1.0, 2.0, 3.0])  # caption 1 failed: its 5 must not count
    # cider (REWARDS) per group: (-2.5, 0, 2.5) / sqrt(12.5), (-2, -1, 3) / sqrt(7)
    # retrieval, image 0 over (0, 3): mean 1.5, deviations (-1.5, 1.5), variance 4.5 -> (-1.5, 0, 1.5) / sqrt(4.5)
    #            image 1 (1, 2, 3): mean 2, deviations (-1, 0, 1), variance 1 -> (-1, 0, 1) / 1
    s0, s1, r0 = math.sqrt(12.5) + EPS, math.sqrt(7.0) + EPS, math.sqrt(4.5) + EPS
    c = [-2.5 / s0, 0.0, 2.5 / s0, -2 / s1, -1 / s1, 3 / s1]
    r = [-1.5 / r0, 0.0, 1.5 / r0, -1 / (1 + EPS), 0.0, 1 / (1 + EPS)]
    summed = [a + 0.5 * b for a, b in zip(c, r, strict=True)]  # weights cider 1, retrieval 0.5
    scored = [x for x, f in zip(summed, FAILED.tolist(), strict=True) if not f]
    mean = sum(scored) / 5
    std = math.sqrt(sum((x - mean) ** 2 for x in scored) / 4)  # Bessel over the five scored captions
    want = [0.0 if f else (x - mean) / (std + EPS) for x, f in zip(summed, FAILED.tolist(), strict=True)]
    got = normalize_then_sum([REWARDS, retrieval], [1.0, 0.5], 3, failed=FAILED)
    assert got.tolist() == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert got[1].item() == 0.0


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_a_group_whose_captions_all_failed_gets_zero(scale):
    rewards = torch.tensor([float("nan"), 2.0, 3.0, 4.0, 5.0, 6.0])
    failed = torch.tensor([True, True, True, False, False, False])
    got = group_advantages(rewards, 3, scale, failed=failed)
    one = 1.0 if scale == "none" else 1 + EPS  # image 1: (-1, 0, 1), std 1 in its group and over the batch
    assert got.tolist() == pytest.approx([0.0, 0.0, 0.0, -1 / one, 0.0, 1 / one], rel=1e-6)
    gdpo = normalize_then_sum([rewards, rewards], [1.0, 1.0], 3, failed=failed)
    assert torch.isfinite(gdpo).all() and gdpo[:3].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_no_failure_is_the_unmasked_computation_bit_for_bit(scale):
    rewards = torch.tensor([1.0, 2.0, 6.0, 4.0, 4.0, 4.0])
    none = torch.zeros(6, dtype=torch.bool)
    assert torch.equal(group_advantages(rewards, 3, scale, failed=none), group_advantages(rewards, 3, scale))
    assert torch.equal(normalize_then_sum([rewards, rewards.flip(0)], [1.0, 0.5], 3, failed=none),
                       normalize_then_sum([rewards, rewards.flip(0)], [1.0, 0.5], 3))  # fmt: skip


def test_a_lone_scored_caption_of_the_batch_gets_zero_not_nan():
    # every caption of the global batch but one failed: the batch std of one value is undefined (NaN, TRL's nanstd);
    # TRL's nan_to_num makes the advantage 0. finecap divided 0 by NaN and handed the loss a NaN advantage.
    rewards = torch.tensor([2.0, float("nan"), float("nan"), float("nan")])
    failed = torch.tensor([False, True, True, True])
    assert group_advantages(rewards, 2, "batch", failed=failed).tolist() == [0.0, 0.0, 0.0, 0.0]
    assert normalize_then_sum([rewards], [1.0], 2, failed=failed).tolist() == [0.0, 0.0, 0.0, 0.0]


def test_zero_std_groups_reads_the_scored_captions_only():
    # image 0: scored (5, 5), one failed: no signal, a zero-std group (TRL's nanstd skips the NaN); finecap's plain
    # std of the NaN-holding group was NaN, so the group was not counted. image 1 (3, 4, 8): a signal.
    rewards = torch.tensor([5.0, float("nan"), 5.0, 3.0, 4.0, 8.0])
    assert zero_std_share(rewards, 3) == 0.5
    lone = torch.tensor([5.0, float("nan"), float("nan"), 1.0, 1.0, 1.0])  # image 0: one scored caption, no std
    assert zero_std_share(lone, 3) == 0.5
    none = torch.tensor([float("nan")] * 3 + [1.0, 1.0, 1.0])  # image 0: every caption failed, no std either
    assert zero_std_share(none, 3) == 0.5
