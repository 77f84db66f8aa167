"""Sharded training (``train.strategy=fsdp``, torch's FSDP2 applied by finecap) in 2 CPU processes over gloo.

The same proof as tests/train/test_equivalence.py: one optimizer step of 2 sharded processes x batch 8 gives the
parameters of 1 process x batch 16, for MLE, SMILE, SCST (seeded sampled rollouts, decoded with full parameters while
each process decodes its own batch) and self-retrieval, within that test's bounds (justified there). Then: a run
stopped after its first step and resumed sharded continues exactly as the uninterrupted sharded run (equal bit for
bit); the same checkpoint resumes in one process (the optimizer state is stored full, keyed by parameter names) to
within the equivalence bounds, and a checkpoint of one process resumes sharded; gradient accumulation and clipping
act on sharded gradients; gradient checkpointing composes with sharding; the sharded run's checkpoint is a plain
transformers folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from finecap.app.cli import main
from finecap.config import load
from finecap.runs import INFO_FILE, checkpoint_dir, model_dir
from finecap.train.run import train
from helpers.equivalence import OBJECTIVES, compare, overrides, weights
from helpers.launch import launch_bounded

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(torch.accelerator.is_available(), reason="the test launches CPU processes on a CPU machine"),
]
FSDP = ["train.strategy=fsdp"]


def launch(launch_two: list[str], runs: list[tuple[list[str], bool]], log: Path) -> str:
    """The ``runs`` (overrides, resume) trained one after another in one launch of 2 processes; what it printed."""
    return launch_bounded([*launch_two, str(Path(__file__).with_name("fsdp_worker.py")), json.dumps(runs)], log,
                          timeout=600)  # fmt: skip


def test_two_sharded_processes_equal_one_big_batch(world_args, clip_dir, tmp_path, launch_two):
    args = dict(world=world_args, clip=clip_dir, cache=tmp_path / "cache")
    err = launch(launch_two, [([*overrides(n, tmp_path / f"{n}-fsdp", batch=8, accum=1, **args), *FSDP], False)
                              for n in OBJECTIVES], tmp_path / "launch.log")  # fmt: skip
    assert "returned a view tensor" not in err  # FSDP2's warning: an in-place op on the logits would skip a gather
    for name in OBJECTIVES:
        info = json.loads((checkpoint_dir(tmp_path / f"{name}-fsdp", "last") / INFO_FILE).read_text())
        assert info["sharded"] is True and info["num_processes"] == 2
        big = train(load(None, overrides(name, tmp_path / f"{name}-big", batch=16, accum=1, **args)))
        compare(weights(big), weights(tmp_path / f"{name}-fsdp"), f"{name}: 2 sharded processes x 8 vs 1 x 16")
    # the sharded checkpoint is a plain transformers folder (the language model of ClipCap) with the trained weights
    lm = AutoModelForCausalLM.from_pretrained(model_dir(checkpoint_dir(tmp_path / "mle-fsdp", "last")) / "lm")
    trained = weights(tmp_path / "mle-fsdp")
    assert all(torch.equal(v, trained[f"lm.{k}"]) for k, v in lm.state_dict().items() if f"lm.{k}" in trained)
    # and a one-process `finecap caption` decodes it
    out = tmp_path / "captions.json"
    assert main(["caption", "--checkpoint", str(tmp_path / "mle-fsdp"), "--out", str(out)]) == 0
    assert len(json.loads(out.read_text())) == 8  # world.n_test


def test_resume_sharded_is_exact_and_in_one_process_is_close(world_args, clip_dir, tmp_path, launch_two):
    """2 steps with accumulation (2 micro-batches of 4 per process) and clipping: uninterrupted, and stopped after
    step 1 then resumed, sharded; the resumed sharded run equals the uninterrupted one bit for bit."""
    args = dict(world=world_args, clip=clip_dir, cache=tmp_path / "cache")

    def run(name: str, steps: int, *extra: str) -> list[str]:
        base = overrides("mle", tmp_path / name, batch=4, accum=2, **args)
        return [*base, *FSDP, f"train.max_steps={steps}", "train.grad_clip=0.05", "train.save_every=1", *extra]

    # a run started in one process (its step 1, here; step 2 resumed sharded in the launch below)
    alone = [o for o in run("one", 1) if not o.startswith(("train.batch_size", "train.grad_accum_steps"))]
    train(load(None, [*alone, "train.batch_size=8", "train.grad_accum_steps=2"]))
    # every sharded run in one launch of 2 processes (each run is trained on its own, one after another)
    launch(launch_two, [(run("whole", 2), False), (run("cut", 1), False), (run("cut", 2), True),
                        (run("ckpt", 2, "train.gradient_checkpointing=true"), False), (run("cut1", 1), False),
                        (run("one", 2), True)], tmp_path / "launch.log")  # fmt: skip
    whole, cut = weights(tmp_path / "whole"), weights(tmp_path / "cut")
    assert all(torch.equal(whole[k], cut[k]) for k in whole), "resumed sharded run differs from the uninterrupted one"
    compare(whole, weights(tmp_path / "ckpt"), "sharded with gradient checkpointing vs without")
    events = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    norms = [e["values"]["grad_norm"] for e in events if e["split"] == "train"]
    assert norms and all(n > 0.05 for n in norms)  # clipping was active (norm logged before clipping)
    # a sharded checkpoint of step 1 resumes in one process (1 x 8 x 2 accumulation steps: the same global batch)
    single = [o for o in run("cut1", 2) if not o.startswith(("train.batch_size", "train.grad_accum_steps"))]
    train(load(None, [*single, "train.batch_size=8", "train.grad_accum_steps=2"]), resume=True)
    compare(whole, weights(tmp_path / "cut1"), "sharded step 1, then step 2 resumed in one process")
    # and the other way: the run started in one process (nothing to shard: torch's position-keyed optimizer state)
    # resumed sharded over 2 (refused before, as 'trained with train.strategy=ddp'; a run could never scale out)
    info = json.loads((checkpoint_dir(tmp_path / "one", "last") / INFO_FILE).read_text())
    assert (info["step"], info["sharded"], info["num_processes"]) == (2, True, 2)
    compare(whole, weights(tmp_path / "one"), "step 1 in one process, then step 2 resumed sharded over 2")
