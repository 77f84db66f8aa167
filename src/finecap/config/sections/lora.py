"""The ``lora`` section: LoRA adapters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from finecap.config.fields import Section, check, doc, option_fields

if TYPE_CHECKING:
    from finecap.config.sections import Config

LoraInit = Literal["kaiming", "gaussian", "normal"]


@dataclass
class LoraConfig(Section, name="lora"):
    lm: bool = doc(False, "Train the language model through LoRA adapters (needs model.train_lm=true).")
    encoder: bool = doc(False, "Train the vision encoder through LoRA adapters (needs model.train_encoder=true).")
    rank: int = doc(
        32,
        "LoRA rank r (NDLB: 32 on GPT-2 and CLIP).",
        ge=1,
        le=4096,
        why="a rank beyond the layer's width adapts nothing more",
    )
    alpha: float = doc(32.0, "LoRA alpha; the update is scaled by alpha / rank.", gt=0)
    dropout: float = doc(0.0, "Dropout on the LoRA input.", ge=0, lt=1)
    init: LoraInit = doc(
        "kaiming",
        "Adapter initialisation: kaiming (peft's default: B = 0, A Kaiming-uniform), gaussian (peft: A with std 1/r), "
        "normal (NDLB's released code: the weight's column-side factor N(0, 1), the other 0).",
    )
    lm_targets: list[str] = doc([], "LM module names (suffixes) to adapt; empty = every linear layer but the head.")
    encoder_targets: list[str] = doc([], "Encoder module names (suffixes); empty = every image-side linear layer.")

    def check_config(self, cfg: Config) -> None:
        # here rather than when the model is built, so that `finecap train --dry-run` names it too
        for part, key in (("lm", "model.train_lm"), ("encoder", "model.train_encoder")):
            check(
                not getattr(self, part) or getattr(cfg.model, key.split(".")[1]),
                f"lora.{part}",
                f"true trains the {'language model' if part == 'lm' else 'vision encoder'} through adapters: set "
                f"{key}=true as well",
            )

    def unread_options(self, cfg: Config) -> dict[str, tuple[str, str]]:
        """The adapters' settings when no part has adapters; a part's targets when that part has none."""
        if not (self.lm or self.encoder):
            have = "lora.lm=false, lora.encoder=false"
            return {k: ("lora.lm=true or lora.encoder=true", have) for k, _, _ in option_fields(LoraConfig, "lora.")
                    if k not in ("lora.lm", "lora.encoder")}  # fmt: skip
        return {f"lora.{part}_targets": (f"lora.{part}=true", f"lora.{part}=false")
                for part in ("lm", "encoder") if not getattr(self, part)}  # fmt: skip
