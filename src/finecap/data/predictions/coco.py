"""COCO results ``[{"image_id", "caption"}]``: :func:`finecap.data.results.read_results` as a predictions format."""

from __future__ import annotations

import shlex
from pathlib import Path

from finecap.data.predictions import PredictionFormat, Predictions, not_recognised
from finecap.data.predictions.jsonl import first_record
from finecap.data.records import MAX_LISTED, DataError
from finecap.data.results import read_results


def _read(path: Path) -> Predictions:
    try:
        return Predictions(read_results(path))
    except DataError as e:
        first = first_record(path)
        # JSON Lines of COCO results: a second line is extra data, and a file of one line reads as one object
        lines = "invalid JSON at line 2" in str(e)
        one_a_line = lines or "COCO results must be a list" in str(e)
        if first is not None and lines and "image_id" not in first:  # another tool's JSON Lines, not "invalid JSON"
            keys = ", ".join(map(repr, list(first)[:MAX_LISTED])) + (", ..." if len(first) > MAX_LISTED else "")
            raise not_recognised(path, f"JSON Lines whose line 1 has the keys {keys or 'none'}") from None
        if first is not None and "image_id" in first and one_a_line:
            raise DataError(
                f"{path}: holds one JSON object a line (JSON Lines); COCO results are one JSON list "
                '[{"image_id": ..., "caption": ...}, ...], e.g. python -c "import json, sys; print(json.dumps('
                f'[json.loads(line) for line in open(sys.argv[1]) if line.strip()]))" {shlex.quote(str(path))} '
                f"> results.json ({e})"
            ) from None
        raise


def _detect(path: Path) -> bool:
    return True  # the last row of the registry: what no other format recognises is read as COCO results (its errors)


FORMAT = PredictionFormat("coco", _read, _detect, references=False)
