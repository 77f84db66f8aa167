"""The GRPO recipes: ``finecap train demo/grpo_sr_cider`` runs on the CPU (the recipe as shipped, made tiny by
overrides: a tiny world, a tiny ClipCap from scratch and a tiny CLIP as the retriever, four steps) and its
metrics.jsonl shows the KL, the clip fraction, the ratios and each reward part; every GRPO recipe says what its name
promises (group advantages; GDPO and KL for SR + CIDEr-D); a run of it saved after every step resumes bit-exactly
from each save point, mid-cycle ones included, with 2 to 4 iterations per rollout."""

from __future__ import annotations

import json
import shutil
from shutil import ignore_patterns

import numpy as np
import pytest
import torch

from finecap.app.cli import main
from finecap.config import load
from finecap.locks import TRAIN_LOCK
from finecap.models.clipcap import ClipCap
from finecap.runs import checkpoint_dir, model_dir
from finecap.train.run import train
from finecap.train.state import load_tree

TINY = ["clipcap.tiny_layers=1", "clipcap.tiny_hidden=32", "clipcap.tiny_heads=2", "clipcap.prefix_length=2",
        "train.init_from=", "train.max_steps=4", "train.batch_size=8", "train.eval_every=4", "train.eval_samples=4",
        "train.log_every=1", "train.log_captions=0", "decode.max_length=8", "decode.beam_size=2", "rl.samples=3",
        "eval.n_distractors=3"]  # fmt: skip


@pytest.mark.slow
def test_demo_grpo_sr_cider_trains_on_the_cpu_and_logs_kl_clipping_and_reward_parts(world_args, clip_dir, tmp_path):
    run_dir = tmp_path / "run"
    args = ["train", "demo/grpo_sr_cider", *world_args, *TINY, f"model.encoder={clip_dir}",
            f"retriever.checkpoint={clip_dir}", f"run.cache_dir={tmp_path / 'cache'}",
            f"run.dir={run_dir}"]  # fmt: skip
    assert main(args) == 0
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [e["values"] for e in events if e["split"] == "train"]
    assert len(train) == 4
    for key in ("kl", "clip_fraction", "ratio/mean", "reward/retrieval", "reward/cider", "advantage_std",
                "monitor/length_drift", "monitor/fact_precision"):  # fmt: skip
        assert all(key in v for v in train), key
    assert train[0]["ratio/max"] == 1.0 and train[1]["time/generate"] == 0.0  # step 2 reuses step 1's rollout
    assert any(v["kl"] > 0 for v in train[1:])
    assert any(e["split"] == "val" and "r@1" in e["values"] for e in events)


@pytest.mark.parametrize("name", ["demo/grpo_cider", "demo/grpo_sr_cider", "coco/grpo_cider_vlm",
                                  "coco/grpo_sr_cider_vlm"])  # fmt: skip
def test_grpo_recipes_set_the_group_options(name):
    cfg = load(name)
    rl, grpo = cfg.rl, cfg.grpo
    assert cfg.train.objective == "grpo"
    assert (grpo.advantage, grpo.policy_loss, rl.samples) == ("group", "clipped", 8)
    two_rewards = "sr" in name
    assert (grpo.reward_aggregation == "normalize_then_sum") == two_rewards  # GDPO over SR + CIDEr-D
    assert (grpo.kl_coef > 0) == two_rewards and (grpo.iterations > 1) == two_rewards
    # TRL's disable_dropout, except where the GRPO check page's committed runs used the recipe with dropout
    assert rl.disable_dropout == (name != "demo/grpo_cider")
    if name.startswith("coco/"):  # SmolVLM with LoRA, bf16 and checkpointing
        cfg = load(name)
        assert cfg.lora.lm and cfg.train.mixed_precision == "bf16" and cfg.train.gradient_checkpointing
        assert cfg.model.dtype == "bfloat16" and "Qwen2-VL" in _text(name)


def _text(name: str) -> str:
    from finecap.recipes import resolve_recipe

    return resolve_recipe(name).read_text()


BACKBONES = {
    "blip": ["model.kind=blip", "blip.name=world-tiny", "blip.tiny_layers=1", "blip.tiny_hidden=32",
             "blip.tiny_heads=2", "blip.tiny_dropout=0"],  # no dropout: the policy at step 0 is the reference
    "vlm": ["model.kind=vlm", "vlm.name=world-tiny", "vlm.tiny_layers=1", "vlm.tiny_hidden=32", "vlm.tiny_heads=2"],
}  # fmt: skip
LEVERS = ["lora.lm=true", "lora.rank=4", "train.mixed_precision=bf16", "train.gradient_checkpointing=true"]


@pytest.mark.slow
@pytest.mark.parametrize("backbone", [*BACKBONES, "qlora"])
def test_grpo_with_kl_composes_with_each_backbone_lora_bf16_and_checkpointing(backbone, world_args, clip_dir,
                                                                              tmp_path):  # fmt: skip
    """GDPO of SR + CIDEr-D with the KL on (demo/grpo_sr_cider) on the world BLIP and VLM, and QLoRA (4-bit base) on
    a saved tiny Idefics3: LoRA adapters on the language model (the reference is the model with them disabled), bf16
    autocast, gradient checkpointing; the KL starts at 0 and moves, every loss is finite."""
    import math

    if backbone == "qlora":
        from finecap.models.presets import save_tiny_vlm

        tiny = save_tiny_vlm(tmp_path / "vlm", "idefics3")
        model = ["model.kind=vlm", f"vlm.name={tiny}", "model.quantization=4bit"]
    else:
        model = BACKBONES[backbone]
    run_dir = tmp_path / "run"
    tiny_rl = [o for o in TINY if not o.startswith(("clipcap.", "train.max_steps"))]
    args = ["train", "demo/grpo_sr_cider", *world_args, *tiny_rl, *model, *LEVERS, "train.max_steps=3",
            f"model.encoder={clip_dir}", f"retriever.checkpoint={clip_dir}", f"run.cache_dir={tmp_path / 'cache'}",
            f"run.dir={run_dir}"]  # fmt: skip
    assert main(args) == 0
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [e["values"] for e in events if e["split"] == "train"]
    assert len(train) == 3 and all(math.isfinite(v["loss"]) for v in train)
    assert train[0]["kl"] == pytest.approx(0.0, abs=1e-6) and any(v["kl"] > 0 for v in train[1:])


@pytest.mark.slow
@pytest.mark.parametrize("iterations, accumulation", [(2, 1), (3, 2), (4, 1)])
def test_demo_grpo_sr_cider_resumes_bit_exactly_from_every_save_point(iterations, accumulation, world_args, clip_dir,
                                                                      tmp_path):  # fmt: skip
    """SR + CIDEr-D (the self-retrieval reward's ``log_prob`` part is its total: one tensor twice in the kept rollout)
    with a checkpoint after every step, most of them mid-cycle: the run folder as each save left it, resumed, ends
    with the weights, optimizer state and logged values of the uninterrupted run."""
    steps = 5
    run_dir = tmp_path / "run"
    options = [*world_args, *TINY, f"train.max_steps={steps}", "train.save_every=1", "train.eval_every=0",
               f"grpo.iterations={iterations}", f"train.grad_accum_steps={accumulation}", "train.batch_size=6",
               "clipcap.tiny_dropout=0.1", f"model.encoder={clip_dir}", f"retriever.checkpoint={clip_dir}",
               f"run.cache_dir={tmp_path / 'cache'}", f"run.dir={run_dir}"]  # fmt: skip
    cfg = load("demo/grpo_sr_cider", options)
    saved = {}

    def snapshot(state):
        saved[state.step] = shutil.copytree(run_dir, tmp_path / f"at{state.step}", ignore=ignore_patterns(TRAIN_LOCK))

    train(cfg, callbacks=[snapshot])
    full = shutil.copytree(run_dir, tmp_path / "full")

    def outcome(folder):
        last = checkpoint_dir(folder, "last")
        weights = ClipCap.from_checkpoint(model_dir(last), load_encoder=False).state_dict()
        states = [load_tree(last / "state", name) for name in ("main", "process_0")]
        lines = (folder / "metrics.jsonl").read_text().splitlines()
        logged = [{k: v for k, v in e["values"].items() if not k.startswith("time/")} for e in map(json.loads, lines)]
        return weights, states, logged

    mid_cycle = 0
    for step in range(1, steps):
        kept = json.loads((checkpoint_dir(saved[step], "last") / "state" / "process_0.json").read_text())
        mid_cycle += kept["objective"]["policy"]["taken"] > 0
        shutil.rmtree(run_dir)
        shutil.copytree(saved[step], run_dir)
        train(cfg, resume=True)
        assert_same(outcome(run_dir), outcome(full), f"resumed from step {step}")
    assert mid_cycle == steps - 1 - (steps - 1) // iterations  # every save point but the cycles' ends


def assert_same(a, b, where: str) -> None:
    """``a`` and ``b`` (nested dicts, lists, tuples of tensors, arrays, numbers, strings) are equal bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for key in a:
            assert_same(a[key], b[key], f"{where}: {key}")
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}: [{i}]")
    else:
        assert a == b or (a != a and b != b), f"{where}: {a!r} != {b!r}"
