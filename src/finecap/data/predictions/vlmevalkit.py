"""VLMEvalKit's result files (``<model>_<dataset>.xlsx``, its default, or ``.tsv`` / ``.json`` with
``PRED_FORMAT=tsv`` / ``json``): one row per image with the columns ``index`` (the id), ``prediction`` (the caption)
and ``answer`` (the references as a stringified list, which VLMEvalKit's own scorer reads with ``eval``: parsed here,
:mod:`.reference_lists`). The ``.json`` file is the table as a JSON list of row objects (``vlmeval/smp/file.py``'s
``dump_json``: ``DataFrame.to_dict('records')``). ``.xlsx`` needs openpyxl (``pip install 'finecap[xlsx]'``).
An index on several rows (its captions are then samples) must carry the same ``answer`` on each
(:meth:`Predictions.add <finecap.data.predictions.Predictions.add>`).

Every file is bounded as a data file (:data:`~finecap.utils.reading.DATA_FILE`, ``FINECAP_MAX_DATA_BYTES``): a
``.tsv`` or ``.json`` by its size, read whole; an ``.xlsx`` by its size too, and then by what it unzips to, the sum
of its zip members' sizes (``zipfile`` stops a member at its declared size, so the sum bounds what openpyxl is
given), refused before openpyxl opens it: a workbook of kilobytes can unzip to gigabytes. openpyxl reads it in
read-only mode (streamed) with the formulas as formulas: a cell that holds one (a caption starting with ``=`` that
pandas saved, through openpyxl or xlsxwriter, becomes a formula, with no result or a result of 0) is refused, naming
its row and column, rather than scored as an empty caption or ``"0"``.
"""

from __future__ import annotations

import csv
import io
import json
import zipfile
from pathlib import Path

from finecap.data.predictions import PredictionFormat, Predictions
from finecap.data.predictions.jsonl import head_text
from finecap.data.predictions.reference_lists import ReferenceLists
from finecap.data.records import DataError, check_id, id_from_key, integral_id
from finecap.utils.reading import DATA_FILE, checked_size, parse_json, read_bounded
from finecap.utils.text import short_repr

COLUMNS = ("index", "prediction", "answer")


def _rows(path: Path) -> tuple[list[str], list[list[object]]]:
    if path.suffix.lower() == ".xlsx":
        rows = _sheet_rows(path)
    elif path.suffix.lower() == ".json":
        return _json_rows(path)
    else:
        text = read_bounded(path, DATA_FILE).decode("utf-8-sig")
        rows = list(csv.reader(io.StringIO(text), delimiter="\t"))
    if not rows:
        raise DataError(f"{path}: empty file")
    return [str(h) for h in rows[0]], rows[1:]


class _Formula(str):
    """The text of a cell that holds a formula (``"=A1+1"``): no value of the table; :func:`_read` refuses it where
    it reads the cell."""


def _sheet_rows(path: Path) -> list[list[object]]:
    """The cells of the first sheet of the workbook ``path``, row by row, a formula cell as its :class:`_Formula`:
    a :class:`~finecap.utils.reading.FileTooLarge` when the file or what it unzips to is over
    :data:`~finecap.utils.reading.DATA_FILE` (module docstring), checked before openpyxl opens it."""
    try:
        import openpyxl
        from openpyxl.utils.exceptions import InvalidFileException
    except ImportError:
        raise DataError(f"{path}: reading .xlsx needs openpyxl: pip install 'finecap[xlsx]' (or save the "
                        "sheet as .tsv)") from None  # fmt: skip
    checked_size(path, DATA_FILE)
    unreadable = (zipfile.BadZipFile, KeyError, ValueError, OSError, InvalidFileException)
    with open(path, "rb") as f:  # one file for both: what was measured is what openpyxl reads
        try:
            with zipfile.ZipFile(f) as archive:
                unzipped = sum(member.file_size for member in archive.infolist())
        except unreadable as e:
            raise DataError(f"{path}: not a readable .xlsx workbook ({type(e).__name__}: {e})") from None
        if unzipped > DATA_FILE.limit():
            raise DATA_FILE.refusal(path, unzipped, where=" (unzipped: the sum of its zip members' sizes)")
        f.seek(0)
        try:
            book = openpyxl.load_workbook(f, read_only=True, data_only=False)  # data_only=False: formulas shown
        except unreadable as e:
            raise DataError(f"{path}: not a readable .xlsx workbook ({type(e).__name__}: {e})") from None
        try:
            return [
                [_Formula(getattr(c.value, "text", c.value)) if c.data_type == "f" else c.value for c in row]
                for row in book.worksheets[0].iter_rows()
            ]
        finally:
            book.close()


def _json_rows(path: Path) -> tuple[list[str], list[list[object]]]:
    """The header and rows of a ``.json`` result file: a JSON list of row objects (the columns are the first row's
    keys, as ``DataFrame.to_dict('records')`` gives every row the same keys)."""
    data = parse_json(read_bounded(path, DATA_FILE), path)
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise DataError(f"{path}: VLMEvalKit's .json result file is a JSON list of row objects "
                        '([{"index": ..., "prediction": ..., "answer": ...}, ...])')  # fmt: skip
    if not data:
        raise DataError(f"{path}: empty file")
    header = list(data[0])
    for n, rec in enumerate(data):
        if list(rec) != header:
            raise DataError(f"{path}: [{n}] has the keys {list(rec)}, the first row {header}; not one table")
    return header, [list(rec.values()) for rec in data]


def _read(path: Path) -> Predictions:
    header, rows = _rows(path)
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise DataError(f"{path}: no column {', '.join(map(repr, missing))} (VLMEvalKit's result files have "
                        f"{', '.join(COLUMNS)}); columns: {header}")  # fmt: skip
    col = {c: header.index(c) for c in COLUMNS}
    answers = ReferenceLists(path, "answer")
    read = Predictions({}, {})
    listed = path.suffix.lower() == ".json"  # a JSON list's rows are its elements, [0] on; a sheet's row 1 the header
    for n, row in enumerate(rows, 0 if listed else 2):
        if not any(v not in (None, "") for v in row):
            continue
        at: int | str = f"[{n}]" if listed else n
        where = f"{path}: {at}" if listed else f"{path}: row {n}"
        for column in COLUMNS:
            if isinstance(row[col[column]], _Formula):
                raise DataError(f"{where}: the {column} cell holds a formula ({short_repr(row[col[column]])}), not a "
                                "value (a caption starting with '=' that pandas saved becomes one, read as empty or "
                                "its cached result); save the table as .tsv, or the cell as text")  # fmt: skip
        raw = row[col["index"]]
        image_id = check_id(integral_id(raw), where)  # 42.0 (a float column's) is image 42
        if isinstance(image_id, str):  # a .tsv's "42" is image 42; "042", "²" and a 30-digit index their own ids
            image_id = id_from_key(image_id)
        pred = row[col["prediction"]]
        read.add(image_id, "" if pred is None else str(pred), answers.parse(row[col["answer"]], at), where)
    return Predictions(read.captions, read.references, answers.warnings())


def _detect(path: Path) -> bool:
    suffix = path.suffix.lower()
    return suffix in (".xlsx", ".tsv") or suffix == ".json" and _first_row_is_a_result(path)


def _first_row_is_a_result(path: Path) -> bool:
    """Whether the ``.json`` file is a JSON list whose first element is an object with ``index`` and ``prediction``
    (read from the start of the file, :func:`~finecap.data.predictions.jsonl.head_text`)."""
    head = head_text(path)
    if not head.startswith("["):
        return False
    try:
        first, _ = json.JSONDecoder().raw_decode(head, len(head) - len(head[1:].lstrip()))
    except ValueError:
        return False
    return isinstance(first, dict) and "index" in first and "prediction" in first


FORMAT = PredictionFormat("vlmevalkit", _read, _detect, references=True)
