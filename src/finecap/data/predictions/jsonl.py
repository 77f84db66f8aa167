"""Reading the JSONL files of other toolkits: records, each with its line number, and a peek at the first one."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from finecap.data.predictions import Predictions
from finecap.data.predictions.reference_lists import ReferenceLists
from finecap.data.records import DataError, require
from finecap.utils.reading import DATA_FILE, parse_json, read_bounded, text_lines


def records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number from 1, object)`` of each non-blank line (a byte-order mark before the first skipped); a
    :class:`DataError` naming the line otherwise."""
    text = read_bounded(path, DATA_FILE).decode("utf-8-sig", errors="strict")
    for n, line in enumerate(text_lines(text), 1):
        if not line.strip():
            continue
        rec = parse_json(line, f"{path}, line {n}", one_line=True)
        if not isinstance(rec, dict):
            raise DataError(f"{path}, line {n}: expected a JSON object")
        yield n, rec


def first_record(path: Path, suffixes: tuple[str, ...] = (".jsonl", ".json")) -> dict[str, Any] | None:
    """The first line of ``path`` (after a byte-order mark) as a JSON object when ``path`` has one of ``suffixes``
    and that line is one. A line opening an array (a COCO results file written on one line: the whole file) is
    not parsed: it is no object (8 ms for each format that asks, on 8,000 results)."""
    if path.suffix.lower() not in suffixes:
        return None
    try:
        with open(path, "rb") as f:
            line = f.readline(1 << 24).removeprefix(codecs.BOM_UTF8)
        if line.lstrip(b" \t\r\n").startswith(b"["):  # in every encoding json reads: an array, or no JSON
            return None
        rec = parse_json(line, str(path), one_line=True)
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


HEAD_BYTES = 1 << 20
"""How much of a file :func:`head_text` reads to tell its format (the file is parsed once, by its reader)."""


def head_text(path: Path) -> str:
    """The start of ``path`` as text (its first :data:`HEAD_BYTES`, a byte-order mark and leading white space left
    out, undecodable bytes replaced), for a format's detection to peek at; ``""`` when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read(HEAD_BYTES).decode("utf-8-sig", errors="replace").lstrip()
    except OSError:
        return ""


def read_caption_lines(
    path: Path, caption: str, labels: str, reference: Callable[[dict[str, Any], str], object] | None = None
) -> Predictions:
    """The predictions of a JSONL file with one image a line, its id the line's number from 0: the caption is the
    text field ``caption``, the references the field ``labels`` (text, a stringified list or a list:
    :class:`ReferenceLists`), or what ``reference(record, where)`` gives when the format checks that field itself."""
    captions, references = {}, {}
    lists = ReferenceLists(path, labels, lines=True)
    for k, (n, rec) in enumerate(records(path)):
        where = f"{path}, line {n}"
        captions[k] = [require(rec, caption, str, where)]
        references[k] = lists.parse(
            require(rec, labels, str, where) if reference is None else reference(rec, where), n
        )
    return Predictions(captions, references, lists.warnings())
