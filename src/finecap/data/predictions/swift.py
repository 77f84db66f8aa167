"""ms-swift's inference JSONL (``swift infer --result_path``): one record of the evaluation data set a line, with the
model's ``response``.

ms-swift 3 and 4 (``swift/pipelines/infer/infer.py``, ``infer_dataset``; ``swift/llm/infer/infer.py`` before 4) write
``{"response", "labels", "logprobs", **record}``: ``labels`` is the answer turn taken off the end of the record's
``messages`` (``null`` when it ended with no answer), and since March 2025 (ms-swift ccf47658) ``messages`` ends with
the response itself, appended as an assistant turn; the interactive ``swift infer`` writes no ``labels`` at all. So
``messages`` never holds the reference: ``labels`` does. ms-swift 2 (``swift/llm/infer.py``) wrote ``{"system",
"query", "response", "label", "history"}``: its ``label``.

The caption is ``response``; the references ``labels`` (``label`` in ms-swift 2's files: text, a stringified list, or
a list); the id is the line's number from 0. A line without one (missing or ``null``) is an error naming it, never
scored against the record's last assistant turn, the response again.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from finecap.data.predictions import PredictionFormat, Predictions
from finecap.data.predictions.jsonl import first_record, read_caption_lines
from finecap.data.records import DataError


def _label(key: str) -> Callable[[dict, str], object]:
    """The reader of the reference field ``key`` of a line: a ``DataError`` naming the line when it has none."""

    def reference(rec: dict, where: str) -> object:
        if rec.get(key) is None:
            state = "null" if key in rec else "missing"
            raise DataError(f"{where}: {key!r} is {state}: no reference caption (ms-swift puts the data set's answer "
                            "turn there; the record's 'messages' end with the response itself, not a reference): give "
                            "the evaluation data set its answers")  # fmt: skip
        return rec[key]

    return reference


def _read(path: Path) -> Predictions:
    first = first_record(path) or {}
    key = "label" if "label" in first and "labels" not in first else "labels"  # ms-swift 2's files: `label`
    return read_caption_lines(path, "response", key, _label(key))


def _detect(path: Path) -> bool:
    rec = first_record(path)
    return rec is not None and "response" in rec and any(k in rec for k in ("labels", "messages", "label"))


FORMAT = PredictionFormat("swift", _read, _detect, references=True, line_ids=True)
