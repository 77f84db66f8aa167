"""The ``sr`` section: the self-retrieval reward."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from finecap.config.fields import Section, doc, every_option
from finecap.config.sections.limits import (
    MAX_BAG,
)
from finecap.registry import REWARDS

if TYPE_CHECKING:
    from finecap.config.sections import Config

SRReward = Literal["log_prob", "accuracy", "cosine"]
Distractors = Literal["batch", "bag", "hard"]


@dataclass
class SRConfig(Section, name="sr"):
    reward: SRReward = doc(
        "log_prob", "Self-retrieval reward: log-softmax of the target (NDLB Eq. 1), top-1 hit, or cosine alone."
    )
    distractors: Distractors = doc(
        "batch", "Distractors: other images of the global batch, bag-mates only, or k mined + in-batch random."
    )
    hard_k: int = doc(
        5,
        "distractors=hard: nearest training images (retriever image cosine) per target (D.2: 5/10).",
        ge=1,
        le=MAX_BAG,
        why="mined distractors per target; DiscriTune D.2: 5 or 10",
    )
    duplicate_threshold: float | None = doc(
        None,
        "Drop distractors whose image cosine to the target exceeds this (near-duplicates); null = keep all.",
        ge=-1,
        le=1,
    )
    logit_scale: float = doc(
        0.0,
        "Similarity scale of the log-softmax; 0 = the retriever's own exp(logit_scale).",
        ge=0,
        le=1000,
        why="CLIP clamps its own scale at 100; cosines times a larger one make every log-softmax 0 or -inf",
    )

    def unread_options(self, cfg: Config) -> dict[str, tuple[str, str]]:
        """Every option when ``rl.rewards`` names no ``retrieval`` reward, its only reader (in training or
        ``finecap serve-reward``; a reward of one's own, by dotted path, may read it); ``sr.hard_k`` without
        ``sr.distractors=hard``."""
        rewards = cfg.rl.rewards
        if "retrieval" not in rewards and all(name in REWARDS for name in rewards):
            return every_option(SRConfig, "rl.rewards.retrieval", f"rl.rewards={{{', '.join(rewards)}}}")
        if self.distractors != "hard":
            return {"sr.hard_k": ("sr.distractors=hard", f"sr.distractors={self.distractors}")}
        return {}
