"""JSON and JSONL data files read within bounds, their faults a :class:`~finecap.data.records.DataError` naming the
file and the line.

Every file is parsed strictly (:func:`~finecap.utils.reading.parse_json`): an object holding a key twice, or nesting
deeper than Python's parser goes, is a :class:`~finecap.data.records.DataError` naming the file and the line, as a
syntax error is.

A JSON file is read whole only up to :data:`~finecap.utils.reading.DATA_FILE` (2 GiB, ``FINECAP_MAX_DATA_BYTES``); a
JSONL file is streamed with each line within :data:`~finecap.utils.reading.LINE` (:mod:`finecap.utils`, "Bounded
reads"): a larger file or line is an error naming it and the limit, never a ``MemoryError``.

Format detection (:func:`finecap.data.formats.detect_format`) looks inside a JSON file before a reader reads it:
:func:`peek_json` parses it once and keeps the result for the reader's :func:`load_json` (a second parse of a large
file costs as much as the whole evaluation of its captions).

Nothing here imports torch.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from finecap.data.hashing import file_version
from finecap.data.records import DataError
from finecap.utils.reading import DATA_FILE, JSONRefused, parse_json, read_bounded, read_lines

_HANDOFF: dict[tuple[str, tuple[int, ...]], Any] = {}
"""The last file :func:`peek_json` parsed (by real path and :func:`~finecap.data.hashing.file_version`), for the next
:func:`load_json`: a file replaced since by another of the same modification time (``cp -p``, ``rsync -t``, one tick
of a coarse clock) is parsed again."""


def _key(path: Path) -> tuple[str, tuple[int, ...]] | None:
    try:
        return os.path.realpath(path), file_version(path.stat())
    except OSError:
        return None


def peek_json(path: str | Path) -> Any:
    """The parsed contents of the JSON file ``path``, kept for the next :func:`load_json` of the same unchanged file
    (one file at a time: :func:`forget_json` drops it); a ``ValueError`` naming the file when it is not JSON (format
    detection's error: no format reads it), a :class:`DataError` naming the file and the line when it is JSON that
    no reader takes (a key twice in an object, nesting too deep: :func:`~finecap.utils.reading.parse_json`)."""
    path = Path(path)
    key = _key(path)
    if key is not None and key in _HANDOFF:
        return _HANDOFF[key]
    try:
        data = parse_json(read_bounded(path, DATA_FILE), path)  # parsed whole: at most DATA_FILE
    except JSONRefused as e:
        if e.syntax:
            raise ValueError(f"{path}: not a JSON reference file ({e.detail})") from None
        raise DataError(str(e)) from None
    _HANDOFF.clear()
    if key is not None:
        _HANDOFF[key] = data
    return data


def forget_json() -> None:
    """Drop what :func:`peek_json` kept (detection found no format that reads it)."""
    _HANDOFF.clear()


def load_json(path: Path) -> Any:
    """The parsed contents of the JSON data file ``path`` (as :func:`peek_json` left it, when it did): a
    :class:`DataError` naming the file when it is missing, not UTF-8, not JSON, holds a key twice in an object or is
    nested too deeply (the line and column: :func:`~finecap.utils.reading.parse_json`)."""
    if _HANDOFF:
        data = _HANDOFF.pop(_key(path), None)
        _HANDOFF.clear()
        if data is not None:
            return data
    if not path.exists():
        raise DataError(f"{path}: file not found")
    try:
        return parse_json(read_bounded(path, DATA_FILE), path)  # at most DATA_FILE: parsed whole into memory
    except JSONRefused as e:
        raise DataError(str(e)) from None


def json_lines(path: Path) -> Iterator[tuple[str, Any]]:
    """``(where, record)`` of every non-blank line of the JSONL file ``path`` (``where``: ``"<path>, line <n>"``),
    streamed: each line is read within :data:`~finecap.utils.reading.LINE` (:func:`~finecap.utils.reading.read_lines`),
    the file's size is not bounded. A line that is not JSON (or holds a key twice in an object, or nests too deeply:
    :func:`~finecap.utils.reading.parse_json`), or a file that is not UTF-8, is a :class:`DataError` naming it. A
    byte-order mark at the start of the file (Windows editors write one) is skipped, as :func:`load_json` skips
    one."""
    lines = read_lines(path, encoding="utf-8-sig")
    try:
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{path}, line {lineno}"
            try:
                record = parse_json(line.rstrip("\r\n"), where, one_line=True)  # the column of a fault in the line
            except JSONRefused as e:
                raise DataError(str(e)) from None
            yield where, record
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not a UTF-8 text file ({e.reason})") from None
    finally:
        lines.close()


def first_json_line(path: Path) -> Any:
    """The record on the first non-blank line of the JSONL file ``path`` (read within bounds), or ``None`` when the
    file has none or it is not JSON (format detection peeks at it; the reader names a bad line)."""
    records = json_lines(path)
    try:
        return next(records, (None, None))[1]
    except (ValueError, OSError):  # DataError is a ValueError, as a line over the limit is
        return None
    finally:
        records.close()
