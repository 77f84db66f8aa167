"""LLaMA-Factory's ``generated_predictions.jsonl`` (``do_predict``): ``{"prompt", "predict", "label"}`` per line.

Each line is one image: the caption is ``predict``, its reference ``label`` (a stringified list is parsed into
several); the id is the line's number from 0 (the order of the evaluation data set).
"""

from __future__ import annotations

from pathlib import Path

from finecap.data.predictions import PredictionFormat, Predictions
from finecap.data.predictions.jsonl import first_record, read_caption_lines


def _read(path: Path) -> Predictions:
    return read_caption_lines(path, "predict", "label")


def _detect(path: Path) -> bool:
    rec = first_record(path)
    return rec is not None and "predict" in rec and "label" in rec


FORMAT = PredictionFormat("llamafactory", _read, _detect, references=True, line_ids=True)
