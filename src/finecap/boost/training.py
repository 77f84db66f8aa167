"""Training captioners on boosted captions of the embedded world: the world's boosting settings (the world backends,
the visual expert's checkpoint) and the settings that train a captioner on one caption field of the boosted data
set (NDLB Table 3 on the world). The demo's ``vcb`` stages (``finecap.app.demo_vcb``) and the papers' grids
(``benchmarks/paper_tables/``) train on boosted captions alike through these."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from finecap.config import Config, load
from finecap.data.datasets import load_records

BOOSTED_DIR = "world_holistic"
"""The boosted data set's folder in a run directory (a world folder whose records carry every caption field)."""
MAX_TOKENS = 55
"""Caption tokens (EOS included) of captioners trained on boosted captions, in training and decoding: the most the
world-tiny LM's 64 positions allow after a 10-token prefix (boosted captions are long; the longest are still cut)."""
SECTIONS = ("run", "world", "retriever", "eval", "decode")
"""The sections of a run's configuration that boosting its world keeps (world, retriever and cache settings)."""


def epoch_steps(cfg: Config) -> int:
    """Optimizer steps of a training run configured by ``cfg``: ``train.max_steps``, or epochs x ceil(training
    captions / batch size)."""
    if cfg.train.max_steps > 0:
        return cfg.train.max_steps
    n = sum(len(r.captions) for r in load_records(cfg, "train"))
    return math.ceil(cfg.train.epochs * math.ceil(n / cfg.train.batch_size))


def field_overrides(boosted: Path, field: str, steps: int | None = None) -> list[str]:
    """The settings that train a captioner on caption field ``field`` of the boosted data set in folder ``boosted``:
    its data set and field, captions of up to :data:`MAX_TOKENS` tokens, and ``steps`` optimizer steps when given (an
    MLE start on one boosted caption per image gets as many steps as on the five human captions)."""
    out = [f"data.path={boosted / 'dataset.json'}", f"data.captions={field}", f"data.max_tokens={MAX_TOKENS}",
           f"decode.max_length={MAX_TOKENS}"]  # fmt: skip
    return [*out, f"train.max_steps={steps}"] if steps is not None else out


def world_boost_config(cfg: Config, items: Sequence[str], expert: Path) -> Config:
    """The configuration of ``finecap boost`` on the world of ``cfg``: mode ``holistic`` with the world backends and
    the visual expert checkpoint ``expert``, over the sections of ``cfg`` (:data:`SECTIONS`), under ``items``."""
    base: dict[str, dict[str, Any]] = {k: v for k, v in cfg.to_dict().items() if k in SECTIONS}
    return load(None, [*items, "boost.mode=holistic", "boost.llm_backend=world", "boost.vlm_backend=world",
                       f"boost.vlm_model={expert}"], base=base)  # fmt: skip
