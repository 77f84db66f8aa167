"""The ``model`` section: the captioner's backbone kind and what of it trains (each backbone's own options are its
section: :mod:`~finecap.config.sections.backbones`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from finecap.config.fields import Section, doc
from finecap.registry import BACKBONES

WeightsDtype = Literal["auto", "float32", "bfloat16", "float16"]
TrainableDtype = Literal["float32", "bfloat16", "float16", "same"]
AttnImplementation = Literal["auto", "sdpa", "eager", "flash_attention_2"]
Quantization = Literal["none", "4bit", "8bit"]


@dataclass
class ModelConfig(Section, name="model"):
    kind: str = doc(
        "clipcap",
        f"Captioner backbone: {', '.join(BACKBONES)} (docs/backbones.md; its options are in the section of the same "
        "name), or a dotted path 'pkg.module:Class' to one's own CaptionerBase subclass (docs/architecture.md).",
    )
    encoder: str = doc(
        "world",
        "'world' (the cached world encoder) or a CLIP checkpoint name/path: ClipCap's vision tower, the image tokens "
        "of the world-tiny BLIP and VLM (a pretrained BLIP or VLM brings its own).",
    )
    train_encoder: bool = doc(False, "Train the vision encoder too (SR-V); otherwise features are frozen and cached.")
    train_lm: bool = doc(True, "Train the language model (otherwise only the mapper / projector).")
    dtype: WeightsDtype = doc(
        "float32",
        "Weights' dtype of every loaded or built model (auto: the checkpoint's own); frozen parts stay in it "
        "(docs/memory.md).",
    )
    trainable_dtype: TrainableDtype = doc(
        "float32", "Dtype of the parameters that learn (float32: master weights); same: model.dtype's, no upcast."
    )
    attn_implementation: AttnImplementation = doc(
        "auto", "Attention kernel passed to transformers (auto: its default; flash_attention_2 needs flash-attn)."
    )
    quantization: Quantization = doc(
        "none",
        "Load the language model's base weights in 4 or 8 bits (bitsandbytes, the quant extra): QLoRA with lora.lm.",
    )
