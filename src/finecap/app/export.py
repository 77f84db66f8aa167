"""``finecap export RUN --merged OUT``: a trained captioner as a plain checkpoint other tools load.

RUN is a run directory (its best checkpoint, else its last), a checkpoint folder or its ``model/`` folder; a relative
RUN not in the working directory is looked for under the runs root, as ``finecap caption --checkpoint`` looks
(:func:`finecap.inference.checkpoint_where`: ``finecap export demo/mle --merged OUT``). OUT gets
the captioner with its LoRA adapters merged into the base weights (:func:`finecap.models.export.export_merged`): for
BLIP and VLMs a ``save_pretrained`` folder transformers loads alone, for ClipCap the language model (``lm/``, a plain
``AutoModelForCausalLM`` folder) and the mapper, plus the source's model card with a line saying what was merged.
A run that decoded under an autocast (``train.mixed_precision`` on the device its ``trainer_state.json`` records:
:func:`run_autocast`) is exported with a warning (:data:`AUTOCAST_WARNING`): the export cannot carry it; the card
then says, as for adapters merged into 16-bit weights, that the validation values it shows are the run's.

OUT must be new or empty. The folder is written beside OUT (``.OUT.tmp``, never an existing one) and swapped in once
complete (:func:`finecap.utils.folders.atomic_replace_dir`), so it carries finecap's folder mark
(:data:`finecap.utils.folders.FOLDER_MARK`, kind :data:`EXPORT_KIND`). An earlier export (a folder holding that mark)
is replaced only with ``--force``; any other folder at OUT or at ``OUT.old`` (where the swap keeps the replaced one) is
refused, with or without ``--force``, and so is OUT inside a run's checkpoint folders (:func:`finecap.runs.
training_folder_of`: only training writes there, and a resumable checkpoint is never replaced by an export).

A run still training may swap a new ``best`` in while it is exported: the export holds the run's
:func:`finecap.runs.swap_guard` while it reads the checkpoint (:func:`finecap.runs.reading_checkpoint`: its weights,
configuration, ``trainer_state.json``, fingerprints and decoding settings), so they are one save's and its card states
the step and values of the weights it holds; the run's swap waits for it.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from pathlib import Path

from finecap.caption import autocast_dtype
from finecap.config import load_stored
from finecap.inference import checkpoint_where
from finecap.locks import command_argv
from finecap.models.base import read_meta
from finecap.models.export import export_merged
from finecap.runs import (
    FINGERPRINTS_FILE,
    INFO_FILE,
    decode_event,
    model_dir,
    reading_checkpoint,
    stored_config,
    temporary_dir,
    training_folder_of,
)
from finecap.train.checkpoint import saved_dtype
from finecap.train.model_card import CARD_NAME, md_code, model_card, with_hub_keys
from finecap.utils.files import OutputRefused, refuse_link
from finecap.utils.folders import FOLDER_MARK, atomic_replace_dir, check_own_folder, is_finecap_folder, previous_dir
from finecap.utils.reading import METADATA, read_json, read_text_bounded

log = logging.getLogger(__name__)

EXPORT_KIND = "export"
"""The folder kind of a merged export (:func:`finecap.utils.folders.folder_mark_text`)."""


AUTOCAST_WARNING = (
    "%s: the run captioned under train.mixed_precision=%s (an autocast to %s), which no file of the export carries: "
    "transformers, vLLM and finecap (Captioner.from_pretrained, finecap caption without that override) compute "
    "without it, so some captions can differ from the run's: caption and score the export itself for numbers of "
    "its own"
)
"""The warning of an export whose run decoded under an autocast."""


def run_autocast(mixed_precision: str, info: dict) -> str | None:
    """The autocast the run computed under, in words (``bfloat16``), ``None`` when none: ``train.mixed_precision`` on
    the device type ``info`` (the checkpoint's ``trainer_state.json``) records (:func:`finecap.caption.autocast_dtype`:
    ``fp16`` autocasts on a GPU only); for ``fp16`` with no device recorded (a checkpoint of finecap before it), a
    float16 autocast if the run was on a GPU."""
    device = info.get("device")
    if mixed_precision == "fp16" and not isinstance(device, str):
        return "float16 if it ran on a GPU (its trainer_state.json records no device)"
    dtype = autocast_dtype(mixed_precision, device if isinstance(device, str) else "cpu")
    return None if dtype is None else str(dtype).removeprefix("torch.")


def checkpoint_info(checkpoint: Path) -> dict:
    """The checkpoint's ``trainer_state.json`` (its non-finite values decoded), ``{}`` when it has none."""
    info_file = checkpoint / INFO_FILE
    return decode_event(read_json(info_file)) if info_file.is_file() else {}


def check_export_dir(out: Path, source: Path, force: bool) -> None:
    """:class:`OutputRefused` when ``out`` may not receive the export of ``source``: a link, inside or around the
    source, inside a run's checkpoint folders, a file, a non-empty folder that is not an earlier export (finecap's
    mark), an earlier export without ``--force``, anything but an earlier export at ``OUT.old``, or a path that names
    no folder of its own (``.``, ``..``, ``sub/..``: the export is written beside OUT and renamed to it, which such a
    name cannot be)."""
    if out.name in ("", ".", ".."):
        raise OutputRefused(f"{out}: name the export's own folder (OUT ending in . or .. names none); export into a "
                            "new folder")  # fmt: skip
    refuse_link(out)
    real_out, real_source = out.resolve(), source.resolve()
    if real_out == real_source or real_source in real_out.parents or real_out in real_source.parents:
        raise OutputRefused(f"{out}: OUT is {source} or holds it or lies in it; export into a new folder")
    training = training_folder_of(out)
    if training is not None:
        raise OutputRefused(
            f"{out}: lies in the run's checkpoint folder {training}, which only training writes (a resumable "
            "checkpoint is never replaced, with or without --force); export into a new folder outside the run's "
            "checkpoints/"
        )
    check_own_folder(previous_dir(out), EXPORT_KIND)  # OUT.old: the swap would remove it
    if not out.exists():
        return
    if not out.is_dir():
        raise OutputRefused(f"{out}: exists and is not a folder; export into a new folder")
    if not any(out.iterdir()):
        return
    if not is_finecap_folder(out, EXPORT_KIND):
        raise OutputRefused(f"{out}: a folder finecap did not write as an export (no {FOLDER_MARK} of an export); "
                            "export into a new folder")  # fmt: skip
    if not force:
        raise OutputRefused(f"{out}: holds an earlier export already; pass --force to replace it")


def export_card(checkpoint: Path, source: Path, merged_meta: dict, merged: str,
                differs: Sequence[str] = ()) -> str | None:  # fmt: skip
    """The merged export's model card: made anew from the source checkpoint's records (its configuration, training
    state and fingerprints) and the export's own ``captioner.json``, so it says what the folder is (merged weights,
    no adapter folder) and that the validation values are the run's, measured on
    ``source`` (``differs``: how the export computes otherwise); a bare source with no configuration keeps its card
    with a note (its ``library_name`` and ``pipeline_tag`` as the export's backbone says:
    :func:`finecap.train.model_card.with_hub_keys`); ``None`` when the source has no card."""
    stored = stored_config(checkpoint)
    if stored is not None:
        prints_file = checkpoint / FINGERPRINTS_FILE
        prints = read_json(prints_file) if prints_file.is_file() else None
        return model_card(load_stored(stored), checkpoint_info(checkpoint), merged_meta, prints, command_argv(),
                          merged_from=str(source), merged=merged, which=checkpoint.name, differs=differs)  # fmt: skip
    card = source / CARD_NAME
    if not card.is_file():
        return None
    text = with_hub_keys(read_text_bounded(card, METADATA), merged_meta)  # an older card's said otherwise
    note = (f"\n## Export\n\nA merged export of {md_code(str(source))} (`finecap export --merged`): LoRA adapters "
            f"folded into the base weights: {merged or 'none'}; no adapter folder. Any values above are the run's, "
            "measured on the source, not on this export"
            + (f", which computes otherwise: {'; '.join(differs)}.\n" if differs else ".\n"))  # fmt: skip
    return text + note


def main(checkpoint: str, out: str, merged: bool, force: bool = False) -> Path:
    """Export the captioner of ``checkpoint`` into ``out`` (module docstring); returns ``out``."""
    if not merged:
        raise ValueError("finecap export: say what to write: --merged OUT (a plain checkpoint, LoRA adapters merged)")
    # a run name as caption --checkpoint reads it; one checkpoint's weights, configuration and records, never a best
    # swapped in between
    with reading_checkpoint(checkpoint_where(checkpoint, option="RUN")) as found:
        return _export(found, Path(out), force)


def _export(found: Path, target: Path, force: bool) -> Path:
    """:func:`main`'s work on the checkpoint ``found``, which a training run does not swap meanwhile."""
    source = model_dir(found)
    meta = read_meta(source)
    check_export_dir(target, source, force)
    tmp = temporary_dir(target)
    refuse_link(tmp)
    if tmp.exists():  # never deleted: it may be the user's
        raise OutputRefused(f"{tmp}: exists (an unfinished export? remove it) and is where OUT is written first")
    try:
        stored = stored_config(found)  # the run's model.dtype (else the folder's), which `finecap caption` loads in
        run_cfg = load_stored(stored) if stored is not None else None
        rounded: list[str] = []
        export_merged(source, tmp, run_cfg.model.dtype if run_cfg is not None else saved_dtype(source), rounded,
                      run_cfg)  # fmt: skip
        differs = [f"its LoRA adapters are merged into {' and '.join(rounded)} weights, rounded to that dtype"
                   ] if rounded else []  # fmt: skip
        autocast = run_autocast(run_cfg.train.mixed_precision, checkpoint_info(found)) if run_cfg else None
        if autocast is not None:
            log.warning(AUTOCAST_WARNING, found, run_cfg.train.mixed_precision, autocast)  # type: ignore[union-attr]
            differs.append(f"the run computed under an autocast to {autocast} (train.mixed_precision), this export "
                           "without it")  # fmt: skip
        card = export_card(found, source, read_meta(tmp), ", ".join(sorted(meta.get("lora") or {})), differs)
        if card is not None:
            (tmp / CARD_NAME).write_text(card, encoding="utf-8")
        if target.is_dir() and not any(target.iterdir()):
            target.rmdir()  # an empty folder the user made for it: rmdir removes only an empty one
        atomic_replace_dir(tmp, target, kind=EXPORT_KIND)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    parts = ", ".join(sorted(meta.get("lora") or {})) or "none"
    log.info(f"finecap export: {source} -> {target} (merged adapters: {parts})")
    return target
