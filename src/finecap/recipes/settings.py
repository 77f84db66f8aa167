"""The settings every packaged demo recipe (``demo/*.yaml``) runs on, beneath or above the recipe itself: what
``finecap demo`` and the papers' grids (``benchmarks/paper_tables/``) layer around each stage's recipe
(:class:`finecap.stages.StageRunner` ``base`` / ``over``)."""

from __future__ import annotations

from typing import Any

DEMO_BASE: dict[str, dict[str, Any]] = {
    "decode": {"strategy": "beam", "beam_size": 5},
}
"""Settings of the default demo that differ from the library defaults (beneath recipes and user overrides). Test
captions use beam search (beam 5), as ClipCap, DiscriTune and NDLB evaluate. TrueMatch bags keep every curated bag
(``bags.keep_hardest`` 1): on the family world, where the demo builds them, the hardest third by α sat near chance
for every row and did not separate the methods (docs/metrics.md, measured 2026-11-24).
The world and the world encoder live in the finecap home, keyed by their settings (world.out and run.cache_dir
empty), as every run's do."""

DEMO_QUICK: dict[str, dict[str, Any]] = {
    "world": {"n_train": 300, "n_val": 40, "n_test": 100},
    "retriever": {"epochs": 2, "batch_size": 64},
    "train": {
        "max_steps": 12,
        "eval_every": 12,
        "eval_samples": 40,
        "warmup_steps": 2,
        "log_every": 4,
        "batch_size": 32,
    },
    "eval": {"n_distractors": 19, "draws": 2},
}
"""``--quick``: a tiny world and a few steps per stage (tests use it); not meant to meet the quality bars. Above the
recipes, beneath the user's overrides."""
