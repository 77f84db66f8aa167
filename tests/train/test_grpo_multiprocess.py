"""The GRPO family over 2 CPU processes (DDP, gloo) equals 1 process with the same global batch: the rewards, the
loss (batch statistics of the global batch: grpo.scale_rewards=batch; the token mean over both processes' tokens),
the logged step means and extremes and the gradient norm of one step, and the weights after it (the tolerance of
tests/train/test_equivalence.py; the 2 processes train in the launch that tests/train shares,
helpers.shared_launch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from finecap.config import load
from finecap.models.clipcap import ClipCap
from finecap.runs import checkpoint_dir, model_dir
from finecap.train.run import train
from helpers.equivalence import LR
from helpers.shared_launch import grpo_run


def first_train_values(run_dir: Path) -> dict:
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return next(e["values"] for e in events if e["split"] == "train")


@pytest.mark.slow
@pytest.mark.skipif(torch.accelerator.is_available(), reason="the test launches CPU processes on a CPU-only machine")
def test_two_processes_equal_one_with_the_same_global_batch(world_args, clip_dir, tmp_path, shared_launch):
    """2 processes x batch 8 in the shared launch (:func:`helpers.shared_launch.grpo_runs`) and 1 process x 16 here,
    on the same feature cache."""
    folder = shared_launch / "grpo"
    one = train(load(None, grpo_run(tmp_path / "one", world_args, clip_dir, folder / "cache", 16)))

    a, b = first_train_values(one), first_train_values(folder / "two")
    # the step's values over every token, caption and group of both processes (finecap.objectives.token_means),
    # equal by construction (sampling is seeded per image, not drawn in process order): token means, means over
    # captions (reward, logprob, sample_words) and images (distinct_samples), the std of the advantages, the share of
    # groups of equal rewards. Every value is logged as the mean of the processes' values
    # (finecap.train.logging.mean_over_processes): entropy (the processes hold different numbers of tokens:
    # helpers.shared_launch.grpo_run) and advantage_std (a std) are the ones that tell the step's values from the
    # mean of the processes' own (TokenMeans not all-reduced); a mean over captions or images does not here (each
    # process holds 8 images, all scored), but tells a caption drawn or scored unlike the one process's. At a first
    # step the ratio is 1 and the policy the reference: kl, clip_ratio/*, clip_fraction and ratio/* are constants (0
    # or 1), the baseline is 0 (the group mean is no baseline of rl.baseline) and every image's 3 samples differ
    # (distinct_samples 1): their comparisons see only that both runs log them
    for key in ("reward", "logprob", "baseline", "sample_words", "distinct_samples", "advantage_std",
                "zero_std_groups", "entropy", "kl", "clip_ratio/low_mean", "clip_ratio/high_mean",
                "clip_ratio/region_mean", "clip_fraction", "ratio/mean"):  # fmt: skip
        assert a[key] == pytest.approx(b[key], rel=1e-6), key
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5) and a["grad_norm"] > 0
    for key in ("advantage/min", "advantage/max", "ratio/min", "ratio/max", "clip_ratio/low_min",
                "clip_ratio/high_max"):  # fmt: skip
        assert a[key] == pytest.approx(b[key], rel=1e-6), key  # the extremes over both processes
    mine = ClipCap.from_checkpoint(model_dir(checkpoint_dir(one, "last")), load_encoder=False).state_dict()
    theirs = ClipCap.from_checkpoint(model_dir(checkpoint_dir(folder / "two", "last")), load_encoder=False)
    diffs = torch.cat([(mine[k].float() - v.float()).abs().flatten() for k, v in theirs.state_dict().items()])
    assert (diffs > 1e-6).float().mean().item() <= 1e-3 and diffs.max().item() <= 0.05 * LR
