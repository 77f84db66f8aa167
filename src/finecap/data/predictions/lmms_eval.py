"""lmms-eval's sample logs (``--log_samples``: ``<date>_samples_<task>.jsonl``), one line per document; or the
``<task>.json`` that lmms-eval wrote up to 0.2.3 (its commit e20d5d6b, in 0.2.4, changed it): one JSON object
``{"args", "model_configs", "logs": [document, ...], "time"}`` whose ``logs`` are those lines.

A caption task's line holds its metric entries, each the ``process_results`` dict of the document: for COCO
(``tasks/coco_cap``) ``"coco_Bleu_4": {"answer": [references], "pred": caption, "image_id": id, "id": ...}``, for
Flickr30k / NoCaps / DetailCaps alike. The first such entry (a dict with ``pred`` and ``answer``) gives the caption,
the references and the image id (``image_id``, else the line's ``doc_id``). A line whose entry names its image
without references is a test split's (``coco_passthrough``, ``nocaps_passthrough``, ``flickr_passthrough``:
``{"pred", "image_id"}``, ``pred`` a caption or a list of them): its ``pred`` and ``image_id`` (``doc_id`` is the
document's row, no image's id), and no references: lmms-eval scores none there (it writes a submission file), and
the line's ``target`` is the test document's answer field, no reference captions; a log of such lines carries no
references (``references`` is ``None``: ``finecap eval`` then needs ``--references``), and one mixing them with
lines that carry references is an error naming the line. A line with neither entry falls back to
``filtered_resps`` (the caption: text, or a list of them) and ``target`` (the references, a stringified list:
parsed) with ``doc_id`` as id. An image id on several lines (its captions are then samples) must carry the same
references on each; other references are an error naming the line.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from finecap.data.predictions import PredictionFormat, Predictions
from finecap.data.predictions.jsonl import first_record, head_text, records
from finecap.data.predictions.reference_lists import ReferenceLists, first_of
from finecap.data.records import DataError, check_id
from finecap.utils.reading import DATA_FILE, parse_json, read_bounded
from finecap.utils.text import short_repr


def _entry(rec: dict, *keys: str) -> dict | None:
    """The document's first metric entry holding ``pred`` and ``keys`` (default ``answer``), or ``None``."""
    for value in rec.values():
        if isinstance(value, dict) and "pred" in value and all(k in value for k in keys or ("answer",)):
            return value
    return None


def _read(path: Path) -> Predictions:
    read = Predictions({}, {})
    targets = ReferenceLists(path, "target", lines=True)
    test_split: bool | None = None  # whether the lines are a test split's (no references), as the first line says
    for n, where, rec in _documents(path):
        entry, named = _entry(rec), _entry(rec, "image_id")
        refs: list[str] | None = None
        if entry is not None and not isinstance(entry["pred"], str):
            raise DataError(_not_a_caption(rec, entry, where))
        if entry is not None:
            image_id = check_id(entry.get("image_id", rec.get("doc_id")), where)
            pred, refs = entry["pred"], targets.parse(entry["answer"], n)
        elif named is not None:  # a test split's entry (nocaps_passthrough): its image's id, not the document's row
            image_id, pred = check_id(named["image_id"], where), first_of(named["pred"])
        elif "filtered_resps" in rec and "target" in rec:
            image_id, pred = check_id(rec.get("doc_id"), where, "'doc_id'"), first_of(rec["filtered_resps"])
            refs = targets.parse(rec["target"], n)
        else:
            raise DataError(f"{where}: no caption entry (a metric entry with 'pred' and 'answer', or 'filtered_resps' "
                            "and 'target'): not an lmms-eval sample log of a caption task")  # fmt: skip
        if not isinstance(pred, str):
            raise DataError(f"{where}: the caption must be text, got {type(pred).__name__}")
        if test_split is None:
            test_split = refs is None
        elif test_split != (refs is None):
            raise DataError(f"{where}: a line {'with' if test_split else 'without'} references among lines "
                            f"{'without' if test_split else 'with'} them (a test split's entry has 'pred' and "
                            "'image_id' but no 'answer'): not the log of one caption task")  # fmt: skip
        read.add(image_id, pred, refs, where)
    return Predictions(read.captions, None if test_split else read.references, targets.warnings())


def _not_a_caption(rec: dict, entry: dict, where: str) -> str:
    """Why a metric entry whose ``pred`` is no text is refused. lmms-eval's CHAIR task (``tasks/coco_cap_chair``,
    ``coco_cap_chair_process_result``: the entries ``coco_cap_chair_s``, ``coco_cap_chair_i``, ``coco_cap_recall``)
    logs as ``pred`` the COCO object categories its caption names (``["person", "dog"]``) and as ``answer`` the
    image's annotated ones (``gt_object``): object lists, no caption and no reference captions; the caption is the
    line's ``filtered_resps``, the image's COCO id the entry's ``image_id``."""
    key = next(k for k, v in rec.items() if v is entry)
    pred = entry["pred"]
    if isinstance(pred, list) and any("chair" in k.lower() for k in rec):
        return (f"{where}: the entry {key!r} is a CHAIR task's (lmms-eval's coco_cap_chair): its 'pred' is the list "
                f"of COCO object categories the caption names ({short_repr(pred)}) and its 'answer' the image's "
                "annotated objects, not a caption and its references, so n-gram metrics cannot score it; finecap "
                "computes CHAIR from the captions themselves: write each line's caption ('filtered_resps') under the "
                "entry's 'image_id' as COCO results ([{\"image_id\": ..., \"caption\": ...}]) and run finecap eval "
                "--predictions results.json --references captions_<split>.json --instances instances_<split>.json "
                "--metrics hallucination (COCO's caption and instance annotations of those images)")  # fmt: skip
    return (f"{where}: the caption must be text, got {type(pred).__name__} (the entry {key!r} holds as 'pred' "
            f"{short_repr(pred)}): not the log of a caption task")  # fmt: skip


def _documents(path: Path) -> Iterator[tuple[int | str, str, dict[str, Any]]]:
    """``(at, where, document)`` of each logged document: the lines of a ``.jsonl`` log (at: the line number), the
    ``logs`` of an old ``<task>.json`` (at: ``"logs[k]"``, its place in ``logs``, from 0)."""
    if not _old_log(path):
        for n, rec in records(path):
            yield n, f"{path}, line {n}", rec
        return
    data = parse_json(read_bounded(path, DATA_FILE), path)
    logs = data.get("logs") if isinstance(data, dict) else None
    if not isinstance(logs, list):
        raise DataError(f"{path}: an lmms-eval <task>.json holds its documents in a list 'logs'")
    for k, rec in enumerate(logs):
        if not isinstance(rec, dict):
            raise DataError(f"{path}: logs[{k}]: expected a JSON object")
        yield f"logs[{k}]", f"{path}: logs[{k}]", rec


def _old_log(path: Path) -> bool:
    """Whether ``path`` is a ``.json`` object that starts as lmms-eval's old ``<task>.json`` (``args`` and
    ``model_configs`` before ``logs``, within its first MiB: the file is parsed once, by the reader)."""
    if path.suffix.lower() != ".json":
        return False
    head = head_text(path)
    return head.startswith("{") and '"model_configs"' in head and '"logs": [' in head


def _detect(path: Path) -> bool:
    if _old_log(path):
        return True
    rec = first_record(path)
    return rec is not None and "doc_id" in rec and ("filtered_resps" in rec or _entry(rec) is not None)


FORMAT = PredictionFormat("lmms-eval", _read, _detect, references=True)
