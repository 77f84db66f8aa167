"""The ``smile`` section: options of ``train.objective=smile``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from finecap.config.fields import Section, check, doc

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
