"""A tiny VLM's folder rewritten as the Hub's checkpoints of its family were written by transformers 4.x, which is what
a user downloads (tests/models/test_hub_layout.py):

- tensor names: transformers 5 renames the old names at load (``transformers.conversion_mapping``); the old ones are
  those names reversed by transformers' own mapping, as ``save_pretrained`` of a model loaded from them writes them
  (:func:`legacy_keys`). Qwen/Qwen2.5-VL-3B-Instruct: ``model.embed_tokens``, ``model.layers.*``, ``visual.*``,
  ``lm_head``; llava-hf/llava-onevision-qwen2-0.5b-ov-hf, google/gemma-3-4b-it: ``language_model.model.*``,
  ``vision_tower.vision_model.*``, ``multi_modal_projector.*``;
- ``config.json`` in the old field names (:func:`legacy_config`): ``torch_dtype`` (``dtype``), ``rope_theta`` and
  ``rope_scaling`` (``rope_parameters``), no ``layer_types``, and for Qwen2-VL / Qwen2.5-VL the language model's
  fields at the top level (no ``text_config``), ``rope_scaling: {"type": "mrope", "mrope_section": ...}``, the
  vision config's ``in_chans`` (Qwen/Qwen2.5-VL-3B-Instruct's ``config.json``);
- ``generation_config.json`` with the sampling defaults the Hub's instruct checkpoints ship
  (:data:`QWEN_GENERATION`: Qwen/Qwen2.5-VL-3B-Instruct's).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

QWEN_GENERATION = {"bos_token_id": None, "pad_token_id": None, "do_sample": True, "eos_token_id": None,
                   "repetition_penalty": 1.05, "temperature": 0.1, "top_p": 0.001, "top_k": 1,
                   "transformers_version": "4.49.0"}  # fmt: skip
"""Qwen/Qwen2.5-VL-3B-Instruct's ``generation_config.json`` (its token ids are the tiny model's, filled in)."""

FLAT_TEXT = ("qwen2_vl", "qwen2_5_vl")
"""Families whose Hub ``config.json`` holds the language model's fields at the top level (no ``text_config``)."""


def legacy_keys(folder: Path) -> list[str]:
    """Rewrite the weights of ``folder`` (a transformers 5 save of a tiny VLM) with the tensor names of the Hub's
    transformers 4.x files: the model's names mapped back by the reverse of transformers' whole conversion mapping
    for the architecture, prefix changes included (a CLIP / SigLIP tower's ``vision_model.``), as ``save_pretrained``
    writes a model loaded from those names. Returns the names written."""
    from safetensors import safe_open
    from transformers import AutoModelForImageTextToText
    from transformers.conversion_mapping import get_model_conversion_mapping

    model = AutoModelForImageTextToText.from_pretrained(folder)
    model._weight_conversions = get_model_conversion_mapping(model, add_legacy=False)
    model.save_pretrained(folder)
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return sorted(f.keys())


def _old_rope(section: dict[str, Any], flat_mrope: bool) -> None:
    """``rope_parameters`` of a config section written as transformers 4.x wrote it: ``rope_theta`` beside
    ``rope_scaling`` (only where the rope is not the default one; Qwen2-VL's ``{"type": "mrope", ...}``)."""
    rope = section.pop("rope_parameters", None)
    if not isinstance(rope, dict):
        return
    rope = dict(rope)
    if "full_attention" in rope:  # Gemma 3: one per kind of layer (google/gemma-3-4b-it: rope_local_base_freq)
        section["rope_local_base_freq"] = rope.get("sliding_attention", {}).get("rope_theta")
        rope = dict(rope["full_attention"])
    if "rope_theta" in rope:
        section["rope_theta"] = rope.pop("rope_theta")
    kind = rope.pop("rope_type", "default")
    if flat_mrope and "mrope_section" in rope:
        section["rope_scaling"] = {"type": "mrope", "mrope_section": rope["mrope_section"]}
    elif kind != "default" or rope:
        section["rope_scaling"] = {"rope_type": kind, **rope}


def legacy_config(folder: Path) -> dict[str, Any]:
    """Rewrite ``folder/config.json`` in the field names of the Hub's transformers 4.x files (module docstring);
    returns it."""
    file = folder / "config.json"
    config = json.loads(file.read_text())
    family = config["model_type"]
    flat = family in FLAT_TEXT
    for section in (config, config.get("text_config") or {}, config.get("vision_config") or {}):
        if "dtype" in section:
            section["torch_dtype"] = section.pop("dtype")
        section.pop("layer_types", None)
        _old_rope(section, flat and section is not config.get("vision_config"))
    if flat:
        text = config.pop("text_config")
        text.pop("model_type", None)
        config = {**text, **config}
        vision = config["vision_config"]
        vision["in_chans"] = vision.pop("in_channels")
        vision.pop("rope_theta", None)
    config["transformers_version"] = "4.49.0"
    file.write_text(json.dumps(config, indent=2))
    return config


def qwen_generation(folder: Path) -> dict[str, Any]:
    """Write :data:`QWEN_GENERATION` as ``folder/generation_config.json`` with the folder's own token ids."""
    file = folder / "generation_config.json"
    own = json.loads(file.read_text())
    written = {key: own.get(key) if value is None else value for key, value in QWEN_GENERATION.items()}
    file.write_text(json.dumps(written, indent=2))
    return written


def hub_folder(out: Any, family: str, seed: int = 0) -> Path:
    """A tiny VLM of ``family`` (tests/helpers/vlm_families.py) saved in ``out`` and rewritten as the Hub's files of
    the family (module docstring: tensor names, ``config.json``, the sampling ``generation_config.json``)."""
    from helpers.vlm_families import save_family

    folder = Path(save_family(out, family, seed=seed))
    legacy_keys(folder)
    legacy_config(folder)
    qwen_generation(folder)
    return folder
