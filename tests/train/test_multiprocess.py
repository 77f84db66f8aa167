"""``finecap train`` under ``accelerate launch`` with 2 CPU processes: data sharded, metrics gathered, one writer.

accelerate 1.15's ``accelerate launch --cpu --num_processes 2`` starts a single process (its simple launcher needs
an MPI hostfile for several CPU processes), so the test launches through torchrun (``--multi_gpu``); on a machine
without an accelerator device the loop then sets accelerate up for multi-CPU (gloo).
"""

import json
import re

import pytest
import torch

from finecap.runs import checkpoint_dir
from finecap.train.state import load_tree
from helpers.launch import launch_bounded


@pytest.mark.slow
@pytest.mark.skipif(torch.accelerator.is_available(), reason="the test launches CPU processes on a CPU-only machine")
def test_two_cpu_processes(make_cfg, world_args, tiny_encoder, tmp_path, launch_two):
    run_dir = tmp_path / "mp"
    overrides = [
        *world_args,
        f"model.encoder={tiny_encoder}",
        "clipcap.tiny_layers=1",
        "clipcap.tiny_hidden=32",
        "clipcap.tiny_heads=2",
        "clipcap.prefix_length=2",
        f"run.dir={run_dir}",
        f"run.cache_dir={tmp_path / 'cache'}",
        "train.batch_size=8",
        "train.max_steps=12",
        "train.lr=3e-3",
        "train.warmup_steps=2",
        "train.log_every=2",
        "train.eval_every=6",
        "train.validators=[captions]",
        "decode.max_length=10",
    ]
    cmd = [*launch_two, "-m", "finecap.app.cli", "train", *overrides]  # fmt: skip
    printed = launch_bounded(cmd, tmp_path / "launch.log", timeout=180)
    assert len(re.findall(r"^train: 12 steps; best ", printed, re.M)) == 1  # logged by the main process only

    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keys = [(e["step"], e["split"]) for e in events]
    assert len(keys) == len(set(keys)) == 6 + 2  # written once: train events at 2,4,..,12, val at 6 and 12
    # 200 examples, global batch 2 x 8 = 16 -> 13 steps per epoch (one process alone would need 25)
    assert events[0]["step"] == 2 and events[0]["epoch"] == pytest.approx(round(2 / 13, 4))
    train_loss = [e["values"]["loss"] for e in events if e["split"] == "train"]
    assert train_loss[-1] < train_loss[0] - 0.1
    val = [e["values"] for e in events if e["split"] == "val"]
    assert val[1]["loss"] < val[0]["loss"] and "length" in val[0]

    info = json.loads((checkpoint_dir(run_dir, "last") / "trainer_state.json").read_text())
    assert info["num_processes"] == 2 and info["step"] == 12
    state = checkpoint_dir(run_dir, "last") / "state"  # one pickle-free state per process, plus the main one
    rng = [load_tree(state, f"process_{r}")["rng"] for r in range(2)]
    assert not torch.equal(rng[0]["torch"], rng[1]["torch"])
    assert load_tree(state, "main")["optimizer"]["state"]  # AdamW moments of every trained parameter
    assert not list(checkpoint_dir(run_dir, "last").rglob("*.pkl")) and not list(run_dir.rglob("*.bin"))
    assert (checkpoint_dir(run_dir, "best") / "model").is_dir()
    # the frozen-feature cache, built by both processes (each its half, gathered: data.features.cached_features)
    for split in ("train", "val"):
        assert len(list((tmp_path / "cache" / "features").glob(f"{split}-*.safetensors"))) == 1
