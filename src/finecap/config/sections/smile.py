"""The ``smile`` section: options of ``train.objective=smile``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from finecap.config.fields import Section, check, doc, every_option
from finecap.config.sections.train import objective_without

if TYPE_CHECKING:
    from finecap.config.sections import Config

Subset = Literal["sequence", "reverse", "random", "full"]
FirstToken = Literal["mle", "shift", "none"]
ShiftForm = Literal["token", "subword"]


@dataclass
class SmileConfig(Section, name="smile"):
    subset: Subset = doc("sequence", "Softmax subset (SMILE Sec. 2.2, 3.4).")
    first_token: FirstToken = doc("mle", "Initial-context restriction (SMILE Sec. 3.3).")
    mle_weight: float = doc(0.0, "λ of Eq. 4: loss = λ·MLE + (1-λ)·SMILE.", ge=0, le=1)
    include_eos: bool = doc(True, "The end-of-sequence id belongs to the sequence subset (as in the paper's code).")
    shift_token_id: int | None = doc(None, "Alternative first-token id for first_token=shift.")
    shift_form: ShiftForm = doc(
        "token",
        "first_token=shift: every first token becomes shift_token_id, or its own '##' sub-word form (SMILE's).",
    )
    random_k: int = doc(
        10,
        "Random ids per sequence for subset=random.",
        ge=1,
        le=262_144,
        why="more ids than the largest vocabularies (256k)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check(
            self.first_token != "shift" or self.shift_form == "subword" or self.shift_token_id is not None,
            "smile.shift_token_id",
            "must be set when smile.first_token=shift (or smile.shift_form=subword)",
        )
        check(
            self.shift_form != "subword" or self.shift_token_id is None,
            "smile.shift_token_id",
            "must be unset with smile.shift_form=subword (each first token is shifted to its own sub-word form)",
        )

    def unread_options(self, cfg: Config) -> dict[str, tuple[str, str]]:
        """Every option under another registered objective; under SMILE, ``random_k`` without ``subset=random``,
        ``include_eos`` without ``subset=sequence`` or ``reverse`` (the subsets built from the caption's ids),
        ``shift_token_id`` and ``shift_form`` without ``first_token=shift``
        (:func:`finecap.objectives.smile.subset_mask`)."""
        have = objective_without(cfg, ("smile",))
        if have or cfg.train.objective != "smile":  # one's own objective (dotted path) may read any option
            return every_option(SmileConfig, "train.objective=smile", have) if have else {}
        subset = f"smile.subset={self.subset}"
        out = {}
        if self.subset != "random":
            out["smile.random_k"] = ("smile.subset=random", subset)
        if self.subset not in ("sequence", "reverse"):
            out["smile.include_eos"] = ("smile.subset=sequence or reverse", subset)
        if self.first_token != "shift":
            for key in ("smile.shift_token_id", "smile.shift_form"):
                out[key] = ("smile.first_token=shift", f"smile.first_token={self.first_token}")
        return out
