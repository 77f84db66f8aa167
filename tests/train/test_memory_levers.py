"""The memory levers through ``finecap train`` (the recipe around the engine): a REINFORCE run of a tiny ClipCap with
bfloat16 weights, float32 LoRA adapters and mapper, and gradient checkpointing (whose rollouts decode in training mode
inside the step, and whose evaluations decode greedily), saved, resumed and continued. The levers themselves are
tested per backbone in ``tests/models/test_memory.py``."""

from __future__ import annotations

import json

import torch
import yaml

from finecap.models import memory
from finecap.models.backbones import load_captioner
from finecap.runs import checkpoint_dir, model_dir
from finecap.train.run import train

LEVERS = ["model.dtype=bfloat16", "train.gradient_checkpointing=true", "lora.lm=true", "lora.rank=4", "lora.alpha=4"]
RL = ["train.objective=reinforce", "rl.rewards={cider: 1.0}", "rl.samples=2", "rl.baseline=leave_one_out",
      "train.batch_size=8", "decode.max_length=8", "train.lr=1e-3"]  # fmt: skip


def test_reinforce_run_with_the_levers_saves_and_resumes(make_cfg):
    run_dir = train(make_cfg(*LEVERS, *RL, "train.max_steps=2", "train.eval_every=2"))
    folder = model_dir(checkpoint_dir(run_dir, "last"))
    stored = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert stored["model"]["dtype"] == "bfloat16" and stored["train"]["gradient_checkpointing"] is True
    dtypes = json.loads((folder / "captioner.json").read_text())["dtypes"]
    assert dtypes["lm"] == {"trainable": "float32", "frozen": "bfloat16"}  # adapters over a bfloat16 GPT-2
    assert dtypes["rest"] == {"trainable": "float32"}  # the mapper
    saved = load_captioner(folder)  # float32 by default: the stored values, exactly
    masters = {n: p.detach().clone() for n, p in saved.named_parameters() if n.startswith("mapper.")}
    assert masters and all(p.dtype == torch.float32 for p in masters.values())

    train(make_cfg(*LEVERS, *RL, "train.max_steps=3", "train.eval_every=3"), resume=True)
    info = json.loads((checkpoint_dir(run_dir, "last") / "trainer_state.json").read_text())
    assert info["step"] == 3
    again = load_captioner(model_dir(checkpoint_dir(run_dir, "last")))
    assert memory.part_dtypes(again)  # loads; the mapper moved on from the resumed float32 values
    assert any(not torch.equal(p, masters[n]) for n, p in again.named_parameters() if n in masters)
