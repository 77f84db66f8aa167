"""The ``eval`` section: what ``finecap eval`` computes (metric groups, references, retrieval and CLIPScore models)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from finecap.config.fields import Section, check, check_at_most, doc
from finecap.config.sections.limits import (
    MAX_BAG,
    MAX_BATCH,
)

MeteorBackend = Literal["python", "java"]


@dataclass
class EvalConfig(Section, name="eval"):
    metrics: list[str] = doc(
        [], "Metric groups of finecap eval; empty = what the references allow (caption metrics; image, world metrics)."
    )
    n_distractors: int = doc(99, "Random distractors per image for RD-N self-retrieval.", ge=1)
    draws: int = doc(
        3,
        "Random-distractor draws averaged.",
        ge=1,
        le=1000,
        why="each draw ranks every caption again; the papers average 3",
    )
    bag_sizes: list[int] = doc(
        [3, 5, 7],
        f"Bag sizes for TrueMatch-style bag retrieval, each 2 to {MAX_BAG} (images per bag; TrueMatch: 3-7).",
    )
    seed: int = doc(0, "Seed of distractor draws.")
    bag_similarity: Literal["query", "pairwise"] = doc(
        "query", "TrueMatch intra-bag similarity: query-to-members mean (NDLB Alg. 1) or mean over all pairs."
    )
    lm: str = doc("", "Causal LM (HF name or path) scoring caption perplexity; needed by the 'perplexity' metric.")
    instances: str = doc(
        "", "COCO instances_*.json of the hallucination metric (CHAIR) and the chair reward; finecap eval --instances."
    )
    batch_size: int = doc(
        64,
        "Captions per forward pass of the perplexity language model.",
        ge=1,
        le=MAX_BATCH,
        why="captions per forward pass; twice CLIP's contrastive batch of 32,768",
    )
    vocab_min_count: int = doc(5, "A word counts towards vocabulary usage when used at least this often (NDLB).", ge=1)
    meteor_backend: MeteorBackend = doc(
        "python", "METEOR: pure Python (no Java; reproduces the jar) or pycocoevalcap's jar itself (needs Java)."
    )
    meteor_max_words: int = doc(
        1000,
        "METEOR refuses a caption or reference of more words (its alignment time grows faster than the square).",
        ge=1,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check(all(s >= 2 for s in self.bag_sizes), "eval.bag_sizes", "bag sizes must be >= 2")
        check_at_most(max(self.bag_sizes, default=2), "eval.bag_sizes", MAX_BAG, "images per bag; TrueMatch: 3-7")
