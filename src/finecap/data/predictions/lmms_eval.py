"""lmms-eval's sample logs (``--log_samples``: ``<date>_samples_<task>.jsonl``), one line per document.

A caption task's line holds its metric entries, each the ``process_results`` dict of the document: for COCO
(``tasks/coco_cap``) ``"coco_Bleu_4": {"answer": [references], "pred": caption, "image_id": id, "id": ...}``, for
Flickr30k / NoCaps / DetailCaps alike. The first such entry (a dict with ``pred`` and ``answer``) gives the caption,
the references and the image id (``image_id``, else the line's ``doc_id``). A line without one falls back to
``filtered_resps`` (the caption) and ``target`` (the references, a stringified list: parsed) with ``doc_id`` as id.
An image id on several lines (its captions are then samples) must carry the same references on each; other
references are an error naming the line.
"""

from __future__ import annotations

from pathlib import Path

from finecap.data.predictions import PredictionFormat, Predictions
from finecap.data.predictions.jsonl import first_record, records
from finecap.data.predictions.reference_lists import ReferenceLists, first_of
from finecap.data.records import DataError, check_id


def _entry(rec: dict) -> dict | None:
    for value in rec.values():
        if isinstance(value, dict) and "pred" in value and "answer" in value:
            return value
    return None


def _read(path: Path) -> Predictions:
    captions: dict[int | str, list[str]] = {}
    references: dict[int | str, list[str]] = {}
    targets = ReferenceLists(path, "target")
    for n, rec in records(path):
        where = f"{path}, line {n}"
        entry = _entry(rec)
        if entry is not None:
            image_id = check_id(entry.get("image_id", rec.get("doc_id")), where)
            pred, refs = entry["pred"], targets.parse(entry["answer"], n)
        elif "filtered_resps" in rec and "target" in rec:
            image_id = check_id(rec.get("doc_id"), where, "'doc_id'")
            pred, refs = first_of(rec["filtered_resps"]), targets.parse(rec["target"], n)
        else:
            raise DataError(f"{where}: no caption entry (a metric entry with 'pred' and 'answer', or 'filtered_resps' "
                            "and 'target'): not an lmms-eval sample log of a caption task")  # fmt: skip
        if not isinstance(pred, str):
            raise DataError(f"{where}: the caption must be text, got {type(pred).__name__}")
        if image_id in references and references[image_id] != refs:  # the first caption is scored: against which?
            raise DataError(f"{where}: image id {image_id!r} is listed again with other references than on the line "
                            f"of its first caption ({references[image_id]!r} there, {refs!r} here)"[:400])  # fmt: skip
        captions.setdefault(image_id, []).append(pred)
        references[image_id] = refs
    return Predictions(captions, references, targets.warnings())


def _detect(path: Path) -> bool:
    rec = first_record(path)
    return rec is not None and "doc_id" in rec and ("filtered_resps" in rec or _entry(rec) is not None)


FORMAT = PredictionFormat("lmms-eval", _read, _detect, references=True)
