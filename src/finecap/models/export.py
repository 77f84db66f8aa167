"""Checkpoints for other tools: a captioner with its LoRA adapters merged into plain weights.

:func:`export_merged` loads any captioner checkpoint folder, folds its adapters into the base weights
(:func:`finecap.models.lora.merge_lora`, peft's ``merge_and_unload``) and writes it again in the backbone's own format
without adapters: for BLIP and VLMs a plain ``save_pretrained`` folder that transformers loads alone
(``BlipForConditionalGeneration`` / ``AutoModelForImageTextToText.from_pretrained(out)``); for ClipCap the language
model as a plain ``AutoModelForCausalLM`` folder (``out/lm``) beside the mapper (``out/mapper.safetensors``), which
:meth:`finecap.models.clipcap.ClipCap.from_checkpoint` reads.
"""

from __future__ import annotations

from pathlib import Path

from finecap.models import lora, strict
from finecap.models.backbones import load_captioner
from finecap.models.memory import LoadOptions
from finecap.runs import GENERATION_CONFIG


def export_merged(model_folder: str | Path, out: str | Path, dtype: str = "float32") -> Path:
    """Load the captioner of ``model_folder`` (a folder holding ``captioner.json``) in ``dtype`` (a ``model.dtype``:
    the run's, so a bfloat16 run exports bfloat16 weights and captions as ``finecap caption`` of the run computes;
    never quantized: a QLoRA run's weights are exported dequantized, in ``dtype``), merge its LoRA adapters (peft
    rounds a merged 16-bit weight to its dtype) and save it as a plain checkpoint in ``out`` (which the caller has
    checked may be written), with the source's decoding
    settings: each ``generation_config.json`` of the source (its own, ClipCap's ``lm/``) replaces the one a save
    writes at the same place, so the export captions as the run did, with finecap and with ``generate``. Loading is
    strict (:mod:`finecap.models.strict`: weights that do not fit or hold NaN or infinity are refused, as ``finecap
    caption`` refuses them); the merged weights are checked to be finite again before anything is written (a merge
    can overflow)."""
    model = lora.merge_lora(load_captioner(model_folder, options=LoadOptions(dtype=dtype)))  # type: ignore[arg-type]
    strict.check_finite_weights(model, f"{model_folder} (its adapters merged)")
    saved = model.save(out, masters=False)  # not resumed: its weights are those the captioner computes with
    source = Path(model_folder)
    for config in [source / GENERATION_CONFIG, *sorted(source.glob(f"*/{GENERATION_CONFIG}"))]:
        target = Path(out) / config.relative_to(source)
        if config.is_file() and target.parent.is_dir():
            target.write_bytes(config.read_bytes())
    return saved
