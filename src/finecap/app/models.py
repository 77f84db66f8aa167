"""``finecap models tiny KIND --out DIR``: a tiny random-weight model written as a transformers folder, to try
finecap and its engines offline (docs/vlm.md#tiny-models).

KIND is ``clip``, ``blip`` or a supported VLM family (``finecap.models.vlm.FAMILIES``); the folder holds the config,
safetensors weights and processor / tokenizer (:func:`finecap.models.tiny.save_tiny`). The language model's default
width (64, 2 heads of 32) is one vLLM's CPU attention takes. DIR must be new or an empty folder: nothing is
replaced. The model is written into a new hidden folder (``.<DIR name>.<random>.tmp``) and put in place when
complete: a new DIR is that folder renamed; an existing empty DIR (the user's: its permissions, group, ACLs, or a
mount point) is kept, the folder made inside it and its files moved up, one rename each. Every rename is durable
(:func:`~finecap.utils.files.replace_durably`): what it puts in place is on the disk first, and the rename after it,
so a power loss leaves no empty weights file under its final name. A failure leaves DIR as it was; a kill leaves the
hidden folder (which can be deleted), or, during the final renames, some of the files.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from finecap.utils.files import OutputRefused, apply_umask, make_temporary_dir, refuse_link, replace_durably
from finecap.utils.text import did_you_mean

log = logging.getLogger(__name__)

USE = {
    "clip": "model.encoder={out} (ClipCap's image encoder) or retriever.checkpoint={out} (CLIPScore and "
    "self-retrieval in finecap eval and the rewards)",
    "blip": "model.kind=blip blip.name={out}",
}
"""How a folder of each non-VLM kind is used in a recipe; a VLM's is ``model.kind=vlm vlm.name=DIR``."""


def check_out(out: Path) -> None:
    """:class:`OutputRefused` when ``out`` is a link, a file or a folder with something in it."""
    refuse_link(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OutputRefused(f"--out {out}: exists and is not an empty folder; finecap models tiny writes a new folder")


def tiny_main(kind: str, out: str | Path, *, hidden: int = 64, heads: int = 2, seed: int = 0) -> Path:
    """Write the tiny ``kind`` into ``out`` (module docstring) and print one line saying what it is and how a
    recipe uses it. Returns the folder."""
    from finecap.models import tiny

    if kind not in tiny.KINDS:
        raise ValueError(f"finecap models tiny: unknown KIND {kind!r}{did_you_mean(kind, tiny.KINDS)}; valid: "
                         f"{', '.join(tiny.KINDS)}")  # fmt: skip
    sizes = tiny.Sizes(hidden=hidden, heads=heads)
    out = Path(out)
    check_out(out)
    existing = out.is_dir()
    tmp = make_temporary_dir(out / "model" if existing else out)  # inside an existing folder: its own place
    moved: list[Path] = []
    try:
        tiny.save_tiny(kind, tmp, seed=seed, sizes=sizes)
        apply_umask(tmp)
        if existing:
            if [p for p in out.iterdir() if p.name != tmp.name]:  # appeared meanwhile: refused, never replaced
                raise OutputRefused(f"--out {out}: is no longer empty; finecap models tiny writes a new folder")
            for entry in sorted(tmp.iterdir()):
                if os.path.lexists(out / entry.name):  # appeared meanwhile: the user's, never replaced
                    raise OutputRefused(f"--out {out}: {entry.name} appeared while the model was written")
                replace_durably(entry, out / entry.name)
                moved.append(out / entry.name)
            tmp.rmdir()
        else:
            check_out(out)  # still new: refused rather than replacing what appeared meanwhile
            replace_durably(tmp, out)
    except BaseException:
        for path in [tmp, *moved]:  # finecap's own files only: what it made in this call
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        raise
    use = USE.get(kind, "model.kind=vlm vlm.name={out}").format(out=out)
    needs = f" (its processor loads with {tiny.LOAD_NEEDS[kind]} installed)" if kind in tiny.LOAD_NEEDS else ""
    auto = tiny.AUTO_PROCESSOR_NEEDS.get(kind)
    if auto and auto != tiny.LOAD_NEEDS.get(kind):
        needs += (
            f"; transformers' AutoProcessor reads the folder only with {auto} installed (finecap's loader without)"
        )
    log.info(f"wrote a tiny random {kind} (width {sizes.hidden}, {sizes.heads} heads of {sizes.head_dim}) to {out}; "
             f"use it with {use}{needs}")  # fmt: skip
    return out
