"""VLMEvalKit's result files (``<model>_<dataset>.xlsx``, or ``.tsv``): one row per image with the columns ``index``
(the id), ``prediction`` (the caption) and ``answer`` (the references as a stringified list, which VLMEvalKit's own
scorer reads with ``eval``: parsed here, :mod:`.reference_lists`). ``.xlsx`` needs openpyxl (``pip install
'finecap[xlsx]'``).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from finecap.data.predictions import PredictionFormat, Predictions
from finecap.data.predictions.reference_lists import ReferenceLists
from finecap.data.records import DataError, check_id
from finecap.utils.reading import DATA_FILE, read_bounded

COLUMNS = ("index", "prediction", "answer")


def _rows(path: Path) -> tuple[list[str], list[list[object]]]:
    if path.suffix.lower() == ".xlsx":
        try:
            import openpyxl
        except ImportError:
            raise DataError(f"{path}: reading .xlsx needs openpyxl: pip install 'finecap[xlsx]' (or save the "
                            "sheet as .tsv)") from None  # fmt: skip
        book = openpyxl.load_workbook(path, read_only=True, data_only=True)
        rows = [list(r) for r in book.worksheets[0].iter_rows(values_only=True)]
        book.close()
    else:
        text = read_bounded(path, DATA_FILE).decode("utf-8-sig")
        rows = list(csv.reader(io.StringIO(text), delimiter="\t"))
    if not rows:
        raise DataError(f"{path}: empty file")
    return [str(h) for h in rows[0]], rows[1:]


def _read(path: Path) -> Predictions:
    header, rows = _rows(path)
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise DataError(f"{path}: no column {', '.join(map(repr, missing))} (VLMEvalKit's result files have "
                        f"{', '.join(COLUMNS)}); columns: {header}")  # fmt: skip
    col = {c: header.index(c) for c in COLUMNS}
    answers = ReferenceLists(path, "answer")
    captions, references = {}, {}
    for n, row in enumerate(rows, 2):  # row 1 is the header
        if not any(v not in (None, "") for v in row):
            continue
        raw = row[col["index"]]
        image_id = check_id(int(raw) if isinstance(raw, float) and raw.is_integer() else raw, f"{path}: row {n}")
        if isinstance(image_id, str) and image_id.isdigit():
            image_id = int(image_id)
        pred = row[col["prediction"]]
        captions.setdefault(image_id, []).append("" if pred is None else str(pred))
        references[image_id] = answers.parse(row[col["answer"]], n)
    return Predictions(captions, references, answers.warnings())


def _detect(path: Path) -> bool:
    return path.suffix.lower() in (".xlsx", ".tsv")


FORMAT = PredictionFormat("vlmevalkit", _read, _detect, references=True)
