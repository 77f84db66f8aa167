"""LLaMA-Factory's ``generated_predictions.jsonl`` (``do_predict``): ``{"prompt", "predict", "label"}`` per line.

Each line is one image: the caption is ``predict``, its reference ``label`` (a stringified list is parsed into
several); the id is the line's number from 0 (the order of the evaluation data set).
"""

from __future__ import annotations

from pathlib import Path

from finecap.data.predictions import PredictionFormat, Predictions
from finecap.data.predictions.jsonl import first_record, records
from finecap.data.predictions.reference_lists import ReferenceLists
from finecap.data.records import require


def _read(path: Path) -> Predictions:
    captions, references = {}, {}
    labels = ReferenceLists(path, "label")
    for k, (n, rec) in enumerate(records(path)):
        where = f"{path}, line {n}"
        captions[k] = [require(rec, "predict", str, where)]
        references[k] = labels.parse(require(rec, "label", str, where), n)
    return Predictions(captions, references, labels.warnings())


def _detect(path: Path) -> bool:
    rec = first_record(path)
    return rec is not None and "predict" in rec and "label" in rec


FORMAT = PredictionFormat("llamafactory", _read, _detect, references=True)
