"""Writing a boosted data set in the format it was read in (``finecap boost --out DIR``).

Every image keeps its record and gains ``"boost": {"original": [...], "<step>": [...], ...}`` (all caption fields
computed, each a list; a failed step holds the human captions); its ordinary captions become those of
``boost.mode``. :func:`finecap.data.caption_fields.select_captions` (``data.captions``, ``bags.text_from``) reads the
fields back.

- ``world``: ``DIR/dataset.json`` (Karpathy layout), with ``scenes.jsonl``, ``dense.json`` and ``world.json`` copied
  and ``DIR/images`` a symbolic link to the source images, so ``DIR`` is a world folder for every command;
- ``karpathy``: ``DIR/<file name>`` with ``sentences`` replaced (``raw`` and ``tokens``);
- ``coco``: ``DIR/<file name>`` with ``annotations`` replaced (one per caption, renumbered, in the order the images
  were read) and the source's kept as ``original_annotations``; images without a caption annotation are left as they
  are (they were not read, so not boosted);
- ``jsonl``: ``DIR/<file name>`` with ``captions`` replaced and image paths made absolute.

Karpathy and COCO files name images relative to an image root: read them with ``data.images`` set to the source
root (the default, the file's folder, is now ``DIR``).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from finecap.data.formats import Record
from finecap.utils import atomic_write_text, read_json, write_json

WRITABLE = ("world", "karpathy", "coco", "jsonl")
"""Formats :func:`write_boosted` writes (``data.format``); a Hugging Face data set is boosted after exporting it."""


def check_writable(fmt: str) -> None:
    """``ValueError`` naming ``data.format`` unless :func:`write_boosted` can write ``fmt``."""
    if fmt not in WRITABLE:
        raise ValueError(f"data.format={fmt}: finecap boost writes {', '.join(WRITABLE)} only")


def _check_aligned(n_raw: int, records: Sequence[Record], path: Path) -> None:
    if n_raw != len(records):
        raise ValueError(f"{path}: {n_raw} entries in the file but {len(records)} records were read; file changed?")


def write_boosted(
    fmt: str,
    source: str | Path,
    out_dir: str | Path,
    records: Sequence[Record],
    fields: Sequence[dict[str, list[str]]],
    mode: str,
) -> Path:
    """Write the boosted data set; returns the file written (the world's ``dataset.json``)."""
    source, out_dir = Path(source), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if fmt == "world" and source.is_dir():
        source = source / "dataset.json"
    if source.resolve().parent == out_dir.resolve():
        raise ValueError(f"--out {out_dir}: would overwrite the source data set {source}; choose another folder")
    out = out_dir / source.name
    if fmt in ("world", "karpathy"):
        raw = read_json(source)
        _check_aligned(len(raw["images"]), records, source)
        for img, f in zip(raw["images"], fields):
            img["sentences"] = [{"raw": c, "tokens": c.split()} for c in f[mode]]
            img["boost"] = f
        write_json(out, raw, indent=None)
        if fmt == "world":
            for name in ("scenes.jsonl", "dense.json", "world.json"):
                if (source.parent / name).exists():
                    shutil.copyfile(source.parent / name, out_dir / name)
            link = out_dir / "images"
            if not link.exists():
                os.symlink((source.parent / "images").resolve(), link, target_is_directory=True)
    elif fmt == "coco":
        raw = read_json(source)
        by_id = dict(zip((r.image_id for r in records), fields, strict=True))
        annotations: list[dict[str, Any]] = []
        for img in raw.get("images", ()):  # images without a caption were not read: they stay as they are
            if img["id"] in by_id:
                img["boost"] = by_id[img["id"]]
        for image_id, f in by_id.items():
            annotations += [{"id": len(annotations) + 1, "image_id": image_id, "caption": c} for c in f[mode]]
        raw["original_annotations"] = raw["annotations"]
        raw["annotations"] = annotations
        write_json(out, raw, indent=None)
    elif fmt == "jsonl":
        lines = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
        _check_aligned(len(lines), records, source)
        rows = []
        for row, r, f in zip(lines, records, fields):
            row["image"] = str(Path(r.path).resolve())
            row["captions"] = f[mode]
            row["boost"] = f
            rows.append(json.dumps(row))
        atomic_write_text(out, "\n".join(rows) + "\n")
    else:
        check_writable(fmt)
    return out
