"""The GRPO family over 2 CPU processes (DDP, gloo) equals 1 process with the same global batch: the rewards, the
loss (batch statistics of the global batch: grpo.scale_rewards=batch; the token mean over both processes' tokens) and
the gradient norm of one step, and the weights after it (the tolerance of tests/train/test_equivalence.py, whose
worker script trains the configurations)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from finecap.config import load
from finecap.models.clipcap import ClipCap
from finecap.runs import checkpoint_dir, model_dir
from finecap.train.run import train

LR = 1e-3


def overrides(run_dir: Path, world: list[str], clip: Path, cache: Path, batch: int) -> list[str]:
    return [
        *world, f"model.encoder={clip}", f"run.cache_dir={cache}", "clipcap.tiny_layers=1", "clipcap.tiny_hidden=32",
        "clipcap.tiny_heads=2", "clipcap.prefix_length=2", "clipcap.tiny_dropout=0", "decode.max_length=8",
        "train.max_steps=1", "train.warmup_steps=0", "train.schedule=constant", f"train.lr={LR}", "train.eval_every=1",
        "train.eval_samples=4", "train.log_captions=0", f"train.batch_size={batch}", f"run.dir={run_dir}",
        "train.objective=reinforce", "rl.rewards={cider: 1.0}", "rl.samples=3", "grpo.advantage=group",
        "grpo.scale_rewards=batch", "grpo.policy_loss=clipped", "grpo.loss_aggregation=token", "grpo.kl_coef=0.1",
    ]  # fmt: skip


def first_train_values(run_dir: Path) -> dict:
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return next(e["values"] for e in events if e["split"] == "train")


@pytest.mark.slow
@pytest.mark.skipif(torch.accelerator.is_available(), reason="the test launches CPU processes on a CPU-only machine")
def test_two_processes_equal_one_with_the_same_global_batch(world_args, clip_dir, tmp_path, launch_two):
    args = dict(world=world_args, clip=clip_dir, cache=tmp_path / "cache")
    two = overrides(tmp_path / "two", batch=8, **args)
    worker = Path(__file__).with_name("equivalence_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([*launch_two, str(worker), json.dumps([two])], capture_output=True, text=True,
                          timeout=300, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = train(load(None, overrides(tmp_path / "one", batch=16, **args)))

    a, b = first_train_values(one), first_train_values(tmp_path / "two")
    # the logged values of 2 processes are the mean of each process's; the reward mean is the same either way
    assert a["reward"] == pytest.approx(b["reward"], rel=1e-6)
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5) and a["grad_norm"] > 0
    for key in ("advantage/min", "advantage/max", "ratio/min", "ratio/max"):  # the extremes over both processes
        assert a[key] == pytest.approx(b[key], rel=1e-6), key
    mine = ClipCap.from_checkpoint(model_dir(checkpoint_dir(one, "last")), load_encoder=False).state_dict()
    theirs = ClipCap.from_checkpoint(model_dir(checkpoint_dir(tmp_path / "two", "last")), load_encoder=False)
    diffs = torch.cat([(mine[k].float() - v.float()).abs().flatten() for k, v in theirs.state_dict().items()])
    assert (diffs > 1e-6).float().mean().item() <= 1e-3 and diffs.max().item() <= 0.05 * LR
