"""The backbone sections (``clipcap``, ``blip``, ``vlm``): each registered backbone's own options, and the world-tiny
sizes they share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from finecap.config.fields import Section, check, doc, option_fields
from finecap.config.sections.limits import (
    MAX_TINY_HIDDEN,
    MAX_TINY_LAYERS,
)
from finecap.registry import BACKBONES

Mapper = Literal["mlp", "transformer"]


TINY_SIZES: dict[str, dict[str, Any]] = {
    "layers": {
        "default": 3,
        "ge": 1,
        "le": MAX_TINY_LAYERS,
        "why": "a world-tiny model trained from scratch; GPT-2 XL has 48 layers, 1,600 wide",
    },
    "hidden": {
        "default": 128,
        "ge": 1,
        "le": MAX_TINY_HIDDEN,
        "why": "a world-tiny model trained from scratch; GPT-2 XL has 48 layers, 1,600 wide",
    },
    "heads": {"default": 4, "ge": 1},
    "dropout": {"default": 0.1, "ge": 0, "lt": 1},
}
"""The default and bounds of each size of a backbone's world-tiny model (``<section>.tiny_<size>``), the same in
every backbone section (:func:`tiny`)."""


def tiny(size: str, text: str) -> Any:
    """The field ``tiny_<size>`` of a backbone section (its default and bounds: :data:`TINY_SIZES`), with its doc
    ``text`` (which model of the backbone the size is of)."""
    spec = dict(TINY_SIZES[size])
    return doc(spec.pop("default"), text, **spec)


class WorldTinySection(Section):
    """Base of the backbone sections that build a world-tiny model (fields ``tiny_*``: :func:`tiny`): its attention
    heads divide its hidden size (``<section>.tiny_heads``)."""

    tiny_hidden: int
    tiny_heads: int

    def __post_init__(self) -> None:
        super().__post_init__()
        name, hidden = self.section_name, self.tiny_hidden
        check(
            hidden % self.tiny_heads == 0, f"{name}.tiny_heads", f"must be >= 1 and divide {name}.tiny_hidden={hidden}"
        )

    def unread_options(self, cfg: Any) -> dict[str, tuple[str, str]]:
        """Every option of this section when ``model.kind`` is another registered backbone (a backbone of one's own,
        named by dotted path, may read any section)."""
        kind, name = cfg.model.kind, self.section_name
        if kind == name or kind not in BACKBONES:
            return {}
        needs, have = f"model.kind={name}", f"model.kind={kind}"
        return {key: (needs, have) for key, _, _ in option_fields(type(self), f"{name}.")}


@dataclass
class ClipCapBackboneConfig(WorldTinySection, name="clipcap"):
    lm: str = doc(
        "world-tiny",
        "'world-tiny' (preset GPT-2 + world tokenizer), 'data-tiny' (the same over the training captions' words: "
        "one's own captions offline) or any AutoModelForCausalLM name/path.",
    )
    mapper: Mapper = doc("mlp", "Mapper from image features to the LM prefix.")
    prefix_length: int = doc(
        10,
        "Number of prefix embeddings k fed to the language model.",
        ge=1,
        le=1024,
        why="GPT-2's whole context; ClipCap: 10 or 40",
    )
    mapper_layers: int = doc(
        2, "Transformer mapper: number of layers.", ge=1, le=64, why="ClipCap's transformer mapper has 8"
    )
    mapper_heads: int = doc(
        8,
        "Transformer mapper: attention heads (must divide the LM hidden size).",
        ge=1,
        le=256,
        why="it must divide the LM's hidden size",
    )
    tiny_layers: int = tiny("layers", "lm=world-tiny/data-tiny: GPT-2 layers.")
    tiny_hidden: int = tiny("hidden", "lm=world-tiny: hidden size (n_embd).")
    tiny_heads: int = tiny("heads", "lm=world-tiny: attention heads (must divide clipcap.tiny_hidden).")
    tiny_dropout: float = tiny(
        "dropout", "lm=world-tiny: dropout of embeddings, residuals and attention (GPT-2's 0.1)."
    )


@dataclass
class BlipBackboneConfig(WorldTinySection, name="blip"):
    name: str = doc("world-tiny", "A BlipForConditionalGeneration name/path, or 'world-tiny' (the world BLIP).")
    tiny_layers: int = tiny("layers", "name=world-tiny: text decoder layers.")
    tiny_hidden: int = tiny("hidden", "name=world-tiny: text decoder hidden size.")
    tiny_heads: int = tiny("heads", "name=world-tiny: attention heads (must divide blip.tiny_hidden).")
    tiny_dropout: float = tiny(
        "dropout", "name=world-tiny: dropout of the text decoder's hidden states and attention."
    )


@dataclass
class VlmBackboneConfig(WorldTinySection, name="vlm"):
    name: str = doc(
        "HuggingFaceTB/SmolVLM-256M-Instruct",
        "An AutoModelForImageTextToText name/path of a supported family (docs/vlm.md: Qwen2/2.5/3-VL, SmolVLM, "
        "InternVL, Gemma 3, LLaVA, ...), or 'world-tiny' (world VLM).",
    )
    prompt: str = doc("Describe the image.", "The user's text after the image in the chat prompt.")
    train_projector: bool = doc(
        True, "Train the projector from vision tower to LM (as ClipCap's mapper, whatever else trains)."
    )
    processor_kwargs: dict[str, bool | int | float | str | dict[str, int]] = doc(
        {},
        "Keyword arguments of every processor call, the image-token budget: Qwen2-VL size: {longest_edge: pixels} "
        "(or max_pixels), Idefics3 (SmolVLM) do_image_splitting (docs/vlm.md); recorded in the checkpoint. Its keys "
        "win over those vlm.image_max_pixels maps to.",
    )
    image_max_pixels: int | None = doc(
        None,
        "Pixel budget per image (LLaMA-Factory's name), every crop/tile counted, mapped per family to its processor's "
        "option: Qwen max_pixels, SmolVLM longest_edge/splitting, LLaVA-NeXT grids, InternVL tiles (docs/vlm.md); "
        "null: the processor's own.",
        gt=0,
    )
    tiny_layers: int = tiny("layers", "name=world-tiny: Llama-style LM layers.")
    tiny_hidden: int = tiny("hidden", "name=world-tiny: LM hidden size.")
    tiny_heads: int = tiny("heads", "name=world-tiny: attention heads (must divide vlm.tiny_hidden).")
