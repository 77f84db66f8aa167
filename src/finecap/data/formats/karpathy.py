"""``data.format=karpathy``: a Karpathy split JSON (``dataset_coco.json``, ``dataset_flickr30k.json``).

``{"images": [{"filename", "filepath"?, "split", "imgid"?, "cocoid"?, "sentences": [{"raw", "tokens"?}]}]}``. Image
path: ``<images>/<filepath>/<filename>`` (``filepath`` optional, as in Flickr30k). ``image_id`` is ``cocoid`` when
present (what COCO evaluation expects), else ``imgid``, else the record index. A ``filename`` that names no file
(``""``, ``"."``, ``"sub/"``: :func:`~finecap.data.records.require_image`) is refused naming the entry. Captions are
the ``raw`` strings (stripped), or the joined ``tokens`` when ``raw`` is missing. Splits are read as every reader reads
them (:class:`~finecap.data.records.SplitKeys`: ``restval`` kept, :mod:`finecap.data.references` counts it as
training; ``"Train"`` and ``"validation"`` read as ``train`` and ``val`` and said; another name, ``"dev"``, kept and
warned about). Default image
root: the JSON file's folder. Detected: a JSON object whose ``images`` is a list (and that has no ``annotations``:
COCO, detected first).
"""

from __future__ import annotations

import os
from pathlib import Path

from finecap.data.containment import ImageFolder
from finecap.data.formats import DataSource, Format
from finecap.data.json_files import load_json, peek_json
from finecap.data.records import (
    DataError,
    Record,
    SplitKeys,
    check_image_files,
    check_unique_ids,
    clean_captions,
    read_boosted,
    require,
    require_id,
    require_image,
)


def read_karpathy(
    path: str | Path, images: str | Path | None = None, check_images: bool = True, allow_outside: bool = False
) -> list[Record]:
    """Read a Karpathy split JSON (``dataset_coco.json`` / ``dataset_flickr30k.json`` layout). Image paths must lie
    inside ``images`` (:class:`~finecap.data.containment.ImageFolder`) unless ``allow_outside``
    (``data.allow_outside_paths``)."""
    path = Path(path)
    root = Path(images) if images is not None else path.parent
    folder = ImageFolder(root, allow_outside)
    data = load_json(path)
    entries = require(data, "images", list, f"{path}")
    records = []
    splits = SplitKeys(path)
    for i, img in enumerate(entries):
        where = f"{path}: images[{i}]"
        filename = require_image(img, "filename", where)  # "", ".", "sub/": a folder, no image file
        where = f"{path}: images[{i}] ({filename})"
        require(img, "split", str, where)
        split = splits.read(img, where)  # "Train", "validation" as train, val, said; "dev" kept, warned
        filepath = require(img, "filepath", str, where) if "filepath" in img else ""
        if "cocoid" in img:
            image_id = require_id(img, "cocoid", where)
        elif "imgid" in img:
            image_id = require_id(img, "imgid", where)
        else:
            image_id = i
        sentences = require(img, "sentences", list, where)
        texts = []
        for j, s in enumerate(sentences):
            swhere = f"{where}: sentences[{j}]"
            if isinstance(s, dict) and "raw" not in s and "tokens" in s:
                tokens = require(s, "tokens", list, swhere)
                if not all(isinstance(t, str) for t in tokens):
                    raise DataError(f"{swhere}: 'tokens' must be a list of strings")
                texts.append(" ".join(tokens))
            else:
                texts.append(require(s, "raw", str, swhere))
        image_path = root / filepath / filename
        folder.check(image_path, where, os.path.join(filepath, filename))
        records.append(Record(image_id, image_path, split, clean_captions(texts, where), read_boosted(img, where)))
    splits.say()
    check_unique_ids(records, path, "images")
    if check_images:
        check_image_files(records, path, root)
    return records


def _read(source: DataSource) -> list[Record]:
    return read_karpathy(source.path, source.images, source.check_images, source.allow_outside)


def _detect(path: Path) -> Path | None:
    data = peek_json(path) if path.is_file() else None
    return path if isinstance(data, dict) and isinstance(data.get("images"), list) else None


FORMAT = Format("karpathy", _read, detect=_detect, split_hint='each image\'s "split"')
