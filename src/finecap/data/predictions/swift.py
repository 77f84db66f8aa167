"""ms-swift's inference JSONL (``swift infer --result_path``): the data set's record with ``response`` added.

The caption is ``response``; the references are ``labels`` (text, a stringified list, or a list) when present, else
the last assistant turn of ``messages`` (ms-swift keeps the data set's answer there); the id is the line's number
from 0.
"""

from __future__ import annotations

from pathlib import Path

from finecap.data.predictions import PredictionFormat, Predictions
from finecap.data.predictions.jsonl import first_record, read_caption_lines
from finecap.data.records import DataError


def _answer(rec: dict, where: str) -> object:
    if rec.get("labels") is not None:
        return rec["labels"]
    turns = rec.get("messages")
    if isinstance(turns, list):
        for turn in reversed(turns):
            if isinstance(turn, dict) and turn.get("role") == "assistant":
                return turn.get("content")
    raise DataError(f"{where}: no reference: neither 'labels' nor an assistant turn in 'messages'")


def _read(path: Path) -> Predictions:
    return read_caption_lines(path, "response", "labels", _answer)


def _detect(path: Path) -> bool:
    rec = first_record(path)
    return rec is not None and "response" in rec and ("messages" in rec or "labels" in rec)


FORMAT = PredictionFormat("swift", _read, _detect, references=True)
