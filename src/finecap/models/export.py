"""Checkpoints for other tools: a captioner with its LoRA adapters merged into plain weights.

:func:`export_merged` loads any captioner checkpoint folder, folds its adapters into the base weights
(:func:`finecap.models.lora.merge_lora`, peft's ``merge_and_unload``) and writes it again in the backbone's own format
without adapters: for BLIP and VLMs a plain ``save_pretrained`` folder that transformers loads alone
(``BlipForConditionalGeneration`` / ``AutoModelForImageTextToText.from_pretrained(out)``); for ClipCap the language
model as a plain ``AutoModelForCausalLM`` folder (``out/lm``) beside the mapper (``out/mapper.safetensors``), which
:meth:`finecap.models.clipcap.ClipCap.from_checkpoint` reads.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from finecap.config import Config
from finecap.models import lora, strict
from finecap.models.backbones import load_captioner
from finecap.models.first_token import decode_unshifted
from finecap.models.memory import LoadOptions
from finecap.runs import GENERATION_CONFIG

log = logging.getLogger(__name__)

ROUNDED_DTYPES = (torch.bfloat16, torch.float16)
"""Weight dtypes a merged adapter is rounded into (:func:`export_merged` warns)."""


def export_merged(model_folder: str | Path, out: str | Path, dtype: str = "float32",
                  rounded: list[str] | None = None, cfg: Config | None = None) -> Path:  # fmt: skip
    """Load the captioner of ``model_folder`` (a folder holding ``captioner.json``) in ``dtype`` (a ``model.dtype``:
    the run's, so a bfloat16 run exports bfloat16 weights, computing as ``finecap caption`` of the run does where it
    has no adapters to merge (below);
    never quantized: a QLoRA run's weights are exported dequantized, in ``dtype``), merge its LoRA adapters (peft
    rounds a merged 16-bit weight to its dtype) and save it as a plain checkpoint in ``out`` (which the caller has
    checked may be written), with the source's decoding
    settings: each ``generation_config.json`` of the source (its own, ClipCap's ``lm/``) replaces the one a save
    writes at the same place, so the export captions as the run did, with finecap and with ``generate``. Loading is
    strict (:mod:`finecap.models.strict`: weights that do not fit or hold NaN or infinity are refused, as ``finecap
    caption`` refuses them); the merged weights are checked to be finite again before anything is written (a merge
    can overflow). A 16-bit export of adapters is logged as a warning: the run adds each adapter's product (kept in
    float32 weights) to the 16-bit base layer's output, the export computes with ``W + BA`` rounded to 16 bits, so
    its outputs differ from the run's by that rounding and its captions can differ (``docs/caption.md``, merged
    exports); ``rounded``, when given, receives the 16-bit dtypes the adapters were merged into (none: the merge
    rounded nothing), which the export's model card names. ``cfg``: the run's configuration, which names the
    first-token shift of SMILE-shifted weights whose ``captioner.json`` predates its record: the export records the
    shift ``finecap caption`` of the source writes its captions without
    (:func:`finecap.models.first_token.decode_unshifted`), so finecap's loaders of the export, which has no
    configuration, write them so too."""
    model = decode_unshifted(load_captioner(model_folder, options=LoadOptions(dtype=dtype)), cfg)
    adapters = lora.has_adapters(model)  # type: ignore[arg-type]
    model = lora.merge_lora(model)  # type: ignore[arg-type]
    sixteen = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.dtype in ROUNDED_DTYPES})
    merged_into = sixteen if adapters else []
    if rounded is not None:
        rounded.extend(merged_into)
    if merged_into:
        log.warning("%s: its LoRA adapters are merged into %s weights, rounded to that dtype: the export's outputs "
                    "differ from the run's by the rounding and some captions can too: caption and score "
                    "the export itself for numbers of its own", model_folder, " and ".join(merged_into))  # fmt: skip
    strict.check_finite_weights(model, f"{model_folder} (its adapters merged)")
    saved = model.save(out, masters=False)  # not resumed: its weights are those the captioner computes with
    source = Path(model_folder)
    for config in [source / GENERATION_CONFIG, *sorted(source.glob(f"*/{GENERATION_CONFIG}"))]:
        target = Path(out) / config.relative_to(source)
        if config.is_file() and target.parent.is_dir():
            target.write_bytes(config.read_bytes())
    return saved
