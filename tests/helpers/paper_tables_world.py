"""A tiny world for the paper-tables runner (benchmarks/paper_tables/): its world, a tiny random CLIP (captioner
encoder and retriever) and the overrides that make every run two steps of a one-layer ClipCap; shared by
tests/benchmarks/test_paper_tables.py and tests/benchmarks/test_verdict_rule_replicates.py."""

from __future__ import annotations

from pathlib import Path

N_TRAIN, N_VAL, N_TEST = 24, 6, 8


def tiny_world(root: Path) -> list[str]:
    """Make the tiny world and CLIP under ``root``; returns the overrides every run of the grid takes."""
    from finecap.config import WorldConfig
    from finecap.models.presets import save_tiny_clip
    from finecap.world.make import make_world

    world = root / "world"
    make_world(WorldConfig(n_train=N_TRAIN, n_val=N_VAL, n_test=N_TEST, image_size=32, seed=0), out=world,
               progress=False)  # fmt: skip
    clip = save_tiny_clip(root / "clip", image_size=32, patch_size=16)
    return [
        f"world.out={world}", f"world.n_train={N_TRAIN}", f"world.n_val={N_VAL}", f"world.n_test={N_TEST}",
        "world.image_size=32", f"model.encoder={clip}", f"retriever.checkpoint={clip}", f"run.cache_dir={root / 'c'}",
        "clipcap.tiny_layers=1", "clipcap.tiny_hidden=32", "clipcap.tiny_heads=2", "clipcap.prefix_length=2",
        "train.max_steps=2", "train.batch_size=8", "train.eval_every=2", "train.eval_samples=4",
        "train.warmup_steps=0", "decode.max_length=6", "eval.n_distractors=3", "eval.draws=1",
    ]  # fmt: skip
