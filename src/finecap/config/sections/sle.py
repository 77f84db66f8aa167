"""The ``sle`` section: options of ``train.objective=sle``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from finecap.config.fields import Section, doc, every_option
from finecap.config.sections.train import objective_without

if TYPE_CHECKING:
    from finecap.config.sections import Config

Distance = Literal["bleu34", "overlap34"]
DiversityBaseline = Literal["pairwise_mean", "none"]


@dataclass
class SLEConfig(Section, name="sle"):
    """Options of ``train.objective=sle``, sequence-level exploration (docs/methods/sle.md); its rollout, rewards and
    baseline are the ``rl`` section's."""

    alpha: float = doc(0.75, "Weight of the precision term; the diversity term gets 1 - alpha (Eq. 8).", ge=0, le=1)
    distance: Distance = doc(
        "bleu34",
        "Caption distance: bleu34 = 1 - (BLEU-3 + BLEU-4) / 2 (the paper's); overlap34 = 1 - mean n-gram overlap "
        "(n = 3, 4) over the shorter caption's n-grams, length-neutral (finecap's ablation).",
    )
    diversity_baseline: DiversityBaseline = doc(
        "pairwise_mean", "Baseline of the diversity term (pairwise_mean: Sec. 4.3, zero-mean advantages)."
    )

    def unread_options(self, cfg: Config) -> dict[str, tuple[str, str]]:
        """Every option under another registered objective (``train.objective=reinforce`` trains plain SCST)."""
        have = objective_without(cfg, ("sle",))
        return every_option(SLEConfig, "train.objective=sle", have) if have else {}
