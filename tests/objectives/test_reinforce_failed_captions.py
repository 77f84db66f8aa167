"""REINFORCE's baselines and advantages with captions a reward could not score (``RewardOutput.failed``: a judge
that failed; issue 66): a failed caption takes no gradient (advantage 0), is left out of the other captions'
baselines and of the logged means, and is never paid as a zero reward. Hand-computed on 2 images x 3 captions."""

from __future__ import annotations

import math

import pytest
import torch

from finecap.config import RLConfig
from finecap.objectives.baselines import GreedyBaseline, LeaveOneOut, MeanBaseline
from finecap.objectives.reinforce import Rollout
from finecap.rewards import RewardOutput
from finecap.rewards.base import scored_mean

NAN = float("nan")
IMAGES = torch.tensor([0, 0, 0, 1, 1, 1])
# caption 1 (image 0) and caption 5 (image 1) failed: their totals are NaN, as the weighted sum gives them
TOTAL = torch.tensor([1.0, NAN, 3.0, 2.0, 4.0, NAN])
FAILED = torch.tensor([False, True, False, False, False, True])


def rollout(baseline: torch.Tensor) -> Rollout:
    return Rollout(samples=None, rewards=RewardOutput(TOTAL, {}, failed=FAILED), baseline=baseline)


def test_leave_one_out_averages_the_other_scored_captions():
    b = LeaveOneOut()(TOTAL, IMAGES, None)
    # image 0: caption 0 -> mean(3) = 3; caption 2 -> mean(1) = 1; image 1: caption 3 -> 4, caption 4 -> 2
    assert b[[0, 2, 3, 4]].tolist() == [3.0, 1.0, 4.0, 2.0]
    adv = rollout(b).advantage
    assert adv.tolist() == [-2.0, 0.0, 2.0, -2.0, 2.0, 0.0]


def test_leave_one_out_without_failures_is_unchanged():
    total = torch.tensor([1.0, 2.0, 3.0, 2.0, 4.0, 6.0])
    assert LeaveOneOut()(total, IMAGES, None).tolist() == [2.5, 2.0, 1.5, 5.0, 4.0, 3.0]


def test_a_caption_whose_other_samples_all_failed_takes_no_gradient():
    total = torch.tensor([5.0, NAN, NAN, 2.0, 4.0, 6.0])
    failed = torch.isnan(total)
    b = LeaveOneOut()(total, IMAGES, None)
    adv = Rollout(None, RewardOutput(total, {}, failed=failed), b).advantage
    assert adv.tolist() == [0.0, 0.0, 0.0, -3.0, 0.0, 3.0]  # caption 0: no scored caption to compare it with


def test_the_running_mean_counts_only_scored_captions():
    baseline = MeanBaseline(RLConfig())
    assert baseline(TOTAL, IMAGES, None).tolist() == [0.0] * 6  # the mean of past steps: none yet
    baseline.end_step()
    assert baseline.mean == pytest.approx((1 + 3 + 2 + 4) / 4)


def test_a_failed_greedy_caption_gives_its_images_samples_the_mean_of_the_others_as_baseline():
    total = torch.tensor([1.0, 2.0, 3.0, 2.0, 4.0, 6.0])
    greedy = torch.tensor([2.0, NAN])  # image 1's greedy caption failed
    b = GreedyBaseline()(total, IMAGES, greedy)
    # image 0: its greedy reward 2; image 1: the mean of its other samples, (4+6)/2 = 5, (2+6)/2 = 4, (2+4)/2 = 3
    assert b.tolist() == [2.0, 2.0, 2.0, 5.0, 4.0, 3.0]
    adv = Rollout(None, RewardOutput(total, {}), b).advantage  # the samples' rewards all scored
    assert adv.tolist() == [-1.0, 0.0, 1.0, -3.0, 0.0, 3.0]  # until 2026-11-29 image 1's were 0, 0, 0: no gradient


def test_a_failed_greedy_captions_fallback_leaves_out_its_images_failed_samples():
    total = torch.tensor([1.0, 2.0, 3.0, 2.0, NAN, 6.0])
    failed = torch.tensor([False, False, False, False, True, False])
    b = GreedyBaseline()(total, IMAGES, torch.tensor([2.0, NAN]))
    # image 1: caption 3's other scored sample is caption 5 (6), caption 5's is caption 3 (2); caption 4 failed
    assert b[[0, 1, 2, 3, 5]].tolist() == [2.0, 2.0, 2.0, 6.0, 2.0]
    adv = Rollout(None, RewardOutput(total, {}, failed=failed), b).advantage
    assert adv.tolist() == [-1.0, 0.0, 1.0, -4.0, 0.0, 4.0]


def test_a_failed_greedy_caption_with_one_sample_per_image_leaves_it_without_gradient():
    total = torch.tensor([1.0, 3.0])  # rl.samples=1: no other sample to fall back on
    b = GreedyBaseline()(total, torch.tensor([0, 1]), torch.tensor([0.5, NAN]))
    assert b[0] == 0.5 and math.isnan(b[1])
    assert Rollout(None, RewardOutput(total, {}), b).advantage.tolist() == [0.5, 0.0]


def test_logged_means_skip_failed_captions():
    assert scored_mean(TOTAL) == pytest.approx(2.5)
    assert math.isnan(scored_mean(torch.tensor([NAN, NAN])))


def test_the_logged_baseline_and_advantage_spread_leave_out_captions_without_an_advantage():
    # image 1's greedy caption failed and so did two of its samples: caption 3 has no baseline (NaN: no other scored
    # sample to fall back on) and advantage 0 (no gradient). The logged baseline was the mean over every caption,
    # NaN, and the micro-batch's baseline went unlogged; the logged spread counted the three placeholder zeros as
    # advantages (0.63 for the scored captions' 1.0)
    from types import SimpleNamespace

    from finecap.objectives.reinforce import Reinforce

    total = torch.tensor([1.0, 2.0, 3.0, 2.0, NAN, NAN])
    failed = torch.tensor([False, False, False, False, True, True])
    greedy = RewardOutput(torch.tensor([2.0, NAN]), {}, failed=torch.tensor([False, True]))
    samples = SimpleNamespace(texts=["a b", "a", "a b c", "b", "c", "d"])
    b = GreedyBaseline()(total, IMAGES, greedy.total)
    r = Rollout(samples, RewardOutput(total, {}, failed=failed), b, None, greedy)
    assert r.advantage.tolist() == [-1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    values = Reinforce(lambda c, b: None, GreedyBaseline(), rl=RLConfig()).metrics(r, torch.zeros(6))
    assert values["baseline"] == 2.0  # image 0's captions, the only ones with a baseline
    assert values["advantage_std"] == pytest.approx(1.0)  # of (-1, 0, 1): image 0's captions
    assert values["reward"] == pytest.approx(2.0) and values["reward_greedy"] == 2.0  # (1 + 2 + 3 + 2) / 4
    assert values["reward_greedy/failed"] == 0.5  # one of the two greedy captions


def test_the_share_of_failed_greedy_captions_is_logged_as_0_when_none_failed():
    from types import SimpleNamespace

    from finecap.objectives.reinforce import Reinforce

    total = torch.tensor([1.0, 2.0, 3.0, 2.0, 4.0, 6.0])
    greedy = RewardOutput(torch.tensor([2.0, 3.0]), {})  # failed=None: every greedy caption scored
    b = GreedyBaseline()(total, IMAGES, greedy.total)
    r = Rollout(SimpleNamespace(texts=["a"] * 6), RewardOutput(total, {}), b, None, greedy)
    values = Reinforce(lambda c, b: None, GreedyBaseline(), rl=RLConfig()).metrics(r, torch.zeros(6))
    assert values["reward_greedy/failed"] == 0.0


def test_the_logged_advantage_spread_of_a_micro_batch_without_an_advantage_is_undefined():
    from types import SimpleNamespace

    from finecap.objectives.reinforce import Reinforce

    total = torch.tensor([NAN, NAN])
    r = Rollout(SimpleNamespace(texts=["a", "b"]), RewardOutput(total, {}, failed=torch.tensor([True, True])),
                torch.zeros(2))  # fmt: skip
    values = Reinforce(lambda c, b: None, GreedyBaseline(), rl=RLConfig()).metrics(r, torch.zeros(2))
    assert math.isnan(values["advantage_std"]) and math.isnan(values["reward"])  # left out of the logged means
