"""``finecap export RUN --merged OUT``: a trained captioner as a plain checkpoint other tools load.

RUN is a run directory (its best checkpoint, else its last), a checkpoint folder or its ``model/`` folder. OUT gets
the captioner with its LoRA adapters merged into the base weights (:func:`finecap.models.export.export_merged`): for
BLIP and VLMs a ``save_pretrained`` folder transformers loads alone, for ClipCap the language model (``lm/``, a plain
``AutoModelForCausalLM`` folder) and the mapper, plus the source's model card with a line saying what was merged.
OUT must be new or empty; an earlier export (a folder holding a ``captioner.json``) is replaced only with ``--force``,
and never a folder finecap did not write. The folder is written beside OUT and swapped in once complete.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from finecap.models.base import CONFIG_NAME, read_meta
from finecap.models.export import export_merged
from finecap.runs import find_checkpoint, model_dir, temporary_dir
from finecap.train.model_card import CARD_NAME
from finecap.utils import METADATA, OutputRefused, atomic_replace_dir, read_text_bounded, refuse_link


def check_export_dir(out: Path, source: Path, force: bool) -> None:
    """:class:`OutputRefused` when ``out`` may not receive the export of ``source``: a link, inside or around the
    source, a file, a non-empty folder that is not a captioner folder, or a captioner folder without ``--force``."""
    refuse_link(out)
    real_out, real_source = out.resolve(), source.resolve()
    if real_out == real_source or real_source in real_out.parents or real_out in real_source.parents:
        raise OutputRefused(f"{out}: OUT is {source} or holds it or lies in it; export into a new folder")
    if not out.exists():
        return
    if not out.is_dir():
        raise OutputRefused(f"{out}: exists and is not a folder; export into a new folder")
    if not any(out.iterdir()):
        return
    if not (out / CONFIG_NAME).is_file():
        raise OutputRefused(f"{out}: a folder finecap did not write (no {CONFIG_NAME}); export into a new folder")
    if not force:
        raise OutputRefused(f"{out}: holds a captioner already; pass --force to replace it")


def main(checkpoint: str, out: str, merged: bool, force: bool = False) -> Path:
    """Export the captioner of ``checkpoint`` into ``out`` (module docstring); returns ``out``."""
    if not merged:
        raise ValueError("finecap export: say what to write: --merged OUT (a plain checkpoint, LoRA adapters merged)")
    source = model_dir(find_checkpoint(checkpoint))
    meta = read_meta(source)
    target = Path(out)
    check_export_dir(target, source, force)
    tmp = temporary_dir(target)
    refuse_link(tmp)
    if tmp.exists():  # never deleted: it may be the user's
        raise OutputRefused(f"{tmp}: exists (an unfinished export? remove it) and is where OUT is written first")
    try:
        export_merged(source, tmp)
        card = source / CARD_NAME
        if card.is_file():
            merged = ", ".join(sorted(meta.get("lora") or {})) or "none (it had no adapters)"
            note = (f"\n## Export\n\nA merged export of `{source}` (`finecap export --merged`): LoRA adapters folded "
                    f"into the base weights: {merged}.\n")  # fmt: skip
            (tmp / CARD_NAME).write_text(read_text_bounded(card, METADATA) + note, encoding="utf-8")
        atomic_replace_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    parts = ", ".join(sorted(meta.get("lora") or {})) or "none"
    print(f"finecap export: {source} -> {target} (merged adapters: {parts})")
    return target
