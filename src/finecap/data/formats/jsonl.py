"""``data.format=jsonl``: one ``{"image": path, "captions": [str, ...], "id"?, "split"?, "questions"?}`` per line.

``id`` defaults to the image path as written; a line without ``split`` names none
(:data:`~finecap.data.records.NO_SPLIT`: the commands split such records, :mod:`finecap.data.splits`); a split spelled
in another case or word (``"TRAIN"``, ``"validation"``) is read as that split and said
(:class:`~finecap.data.records.SplitKeys`). Captions are one line each (:func:`~finecap.data.records.clean_text`: line
breaks and tabs made spaces, other control characters refused). A line holding a key twice is refused
(:func:`~finecap.utils.reading.parse_json`). Relative image paths are resolved against ``data.images`` (default: the
JSONL file's folder). The file is streamed, each line read within :data:`~finecap.utils.reading.LINE`. Detected: a
``.jsonl`` file (whose first line is not a chat record: :mod:`.messages`).
"""

from __future__ import annotations

import os
from pathlib import Path

from finecap.data.containment import ImageFolder
from finecap.data.formats import DataSource, Format
from finecap.data.json_files import json_lines
from finecap.data.records import (
    NO_SPLIT,
    DataError,
    Record,
    SplitKeys,
    check_image_files,
    clean_captions,
    read_boosted,
    read_questions_field,
    require,
    require_id,
    require_image,
)
from finecap.utils.text import short_repr


def read_jsonl(
    path: str | Path,
    images: str | Path | None = None,
    check_images: bool = True,
    split: str = NO_SPLIT,
    allow_outside: bool = False,
) -> list[Record]:
    """Read ``{"image": path, "captions": [...], "id"?, "split"?, "questions"?}`` per line (blank lines are skipped;
    ``questions``: the image's multiple-choice questions, CapRL's layout, for ``qa_utility``); a line without
    ``split`` gets ``split`` (default :data:`NO_SPLIT`: the commands split such records by
    :func:`finecap.data.splits.assign_splits`). Image paths, absolute ones too, must lie inside ``images``
    (:class:`~finecap.data.containment.ImageFolder`) unless ``allow_outside``."""
    path = Path(path)
    root = Path(images) if images is not None else path.parent
    folder = ImageFolder(root, allow_outside)
    if not path.exists():
        raise DataError(f"{path}: file not found")
    records = []
    seen: dict[str, tuple[int | str, str]] = {}  # an id as text -> (as written, where)
    by_file: dict[str, tuple[str, str, bool]] = {}  # normalised image path -> (split, where, its id given)
    splits = SplitKeys(path)
    for where, rec in json_lines(path):
        image = require_image(rec, "image", where)
        caps = require(rec, "captions", list, where)
        image_id = require_id(rec, "id", where) if "id" in rec else image
        rec_split = splits.read(rec, where, split)
        first_id, first_where = seen.setdefault(str(image_id), (image_id, where))  # 1 and "1": one id
        if first_where != where:
            written = "" if first_id == image_id else f" (written {short_repr(first_id)} at {first_where}: one id)"
            raise DataError(f"{where}: duplicate image id {short_repr(image_id)}{written}")
        p = Path(image)
        path_ = p if p.is_absolute() else root / p
        key = os.path.normpath(path_)  # ./a.jpg, a//b.jpg: the file, however written
        if key in by_file:  # one image in two splits, or twice under spellings of its path standing for its id
            first_split, first, named = by_file[key]
            if first_split != rec_split:
                here, there = (repr(x) if x != NO_SPLIT else "no split" for x in (rec_split, first_split))
                raise DataError(f"{where}: image {image!r} has split {here} here but {there} at {first} (the same "
                                "file); give each image one split")  # fmt: skip
            if not (named and "id" in rec and rec_split != NO_SPLIT):  # no split: the ids' hash may part them
                raise DataError(f"{where}: image {image!r} is the file of {first} already (duplicate image); give "
                                "each image one line, its captions in one list")  # fmt: skip
        by_file.setdefault(key, (rec_split, where, "id" in rec))
        folder.check(path_, where, image)
        questions = read_questions_field(rec.get("questions"), where)
        records.append(Record(image_id, path_, rec_split, clean_captions(caps, where), read_boosted(rec, where),
                              questions=questions))  # fmt: skip
    splits.say()
    if check_images:
        check_image_files(records, path, root)
    return records


def _read(source: DataSource) -> list[Record]:
    return read_jsonl(source.path, source.images, source.check_images, allow_outside=source.allow_outside)


FORMAT = Format("jsonl", _read, detect=lambda path: path if path.suffix == ".jsonl" and path.is_file() else None,
                split_hint='a "split" key on each line ("train", "val" or "test")')  # fmt: skip
