"""COCO results ``[{"image_id", "caption"}]``: :func:`finecap.data.results.read_results` as a predictions format."""

from __future__ import annotations

from pathlib import Path

from finecap.data.predictions import PredictionFormat, Predictions
from finecap.data.results import read_results


def _read(path: Path) -> Predictions:
    return Predictions(read_results(path))


def _detect(path: Path) -> bool:
    return True  # the last row of the registry: what no other format recognises is read as COCO results (its errors)


FORMAT = PredictionFormat("coco", _read, _detect, references=False)
