"""The ``retriever`` section: the CLIP-style image-text model behind self-retrieval and CLIPScore."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from finecap.config.fields import Section, doc
from finecap.config.sections.limits import (
    MAX_BATCH,
)

LongText = Literal["truncate", "error", "chunks"]


@dataclass
class RetrieverConfig(Section, name="retriever"):
    checkpoint: str = doc("", "CLIP checkpoint (HF name or local path); empty = train/reuse the world encoder preset.")
    preset: str = doc(
        "world-tiny", "Architecture of the world encoder: a name in finecap.models.world_encoder_cache.PRESETS."
    )
    epochs: int = doc(
        10,
        "Contrastive training epochs of the world encoder.",
        ge=0,
        le=10_000,
        why="the world encoder trains 10 epochs by default",
    )
    batch_size: int = doc(
        64,
        "Batch size of world-encoder training (at least 2: the batch's other images are the negatives).",
        ge=2,
        le=MAX_BATCH,
        why="a batch x batch similarity matrix; twice CLIP's contrastive batch of 32,768",
    )
    lr: float = doc(2e-3, "Peak learning rate of world-encoder training.")
    aux_weight: float = doc(
        5.0, "Weight of the auxiliary scene-graph attribute loss (stands in for pretraining).", ge=0
    )
    dense_fraction: float = doc(
        0.5, "Share of each world-encoder batch also trained against its dense captions.", ge=0, le=1
    )
    batch_size_eval: int = doc(
        256,
        "Batch size when embedding images and texts.",
        ge=1,
        le=MAX_BATCH,
        why="images or texts per pass; twice CLIP's contrastive batch of 32,768",
    )
    long_text: LongText = doc(
        "truncate",
        "Texts longer than the text window (77 tokens for CLIP, 248 for Long-CLIP): cut to it, refused, or encoded "
        "as overlapping windows and pooled (docs/metrics.md#long-captions).",
    )
