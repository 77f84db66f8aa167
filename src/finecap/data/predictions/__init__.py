"""Prediction files of other toolkits for ``finecap eval``: each a :class:`PredictionFormat` spec in a module of its
own, named in one registry row (:data:`finecap.registry.PREDICTION_FORMATS`).

========================  ==================================================================  ==================
name                      file (what the tool writes)                                         references
========================  ==================================================================  ==================
``coco`` (:mod:`.coco`)   COCO results ``[{"image_id", "caption"}]`` (finecap, pycocoevalcap)  ``--references``
``lmms-eval``             lmms-eval's ``--log_samples`` JSONL (``*_samples_<task>.jsonl``):    in the file
(:mod:`.lmms_eval`)       per line the metric entries ``{"pred", "answer", "image_id"}`` of
                          its caption tasks, else ``filtered_resps`` / ``target``; or the
                          ``<task>.json`` of lmms-eval up to 0.2.3 (``logs``: those lines);
                          a test split's (``{"pred", "image_id"}``) carries none
``vlmevalkit``            VLMEvalKit's result file (``<model>_<dataset>.xlsx`` / ``.tsv`` /    in the file
(:mod:`.vlmevalkit`)      ``.json``): columns ``index``, ``prediction``, ``answer`` (a
                          stringified list); ``.json`` a list of those rows
``llamafactory``          LLaMA-Factory's ``generated_predictions.jsonl``: ``predict``,        in the file
(:mod:`.llamafactory`)    ``label``; ids are line numbers (from 0)
``swift``                 ms-swift's ``swift infer --result_path`` JSONL: ``response``;        in the file
(:mod:`.swift`)           references from ``labels`` (ms-swift 2: ``label``), never from
                          ``messages``; ids are line numbers (from 0)
========================  ==================================================================  ==================

:func:`read_predictions` reads a file in the named format, or detects it (:func:`detect_prediction_format`: each
registered format looking at the file's suffix and its first record; a file two of them recognise is an error, one
none does is COCO results, the last row). A reference column that holds
stringified lists (VLMEvalKit's ``answer``, lmms-eval's ``target``) is parsed (:mod:`.reference_lists`); a value that
looks like one but does not parse is kept as one caption and said in a warning naming the file, the column and the
rows (:attr:`Predictions.warnings`), never scored silently (VLMEvalKit #1308's CIDEr of 2e-8).
Nothing here imports torch, nor a format's module until that format is asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from finecap.data.records import DataError, refuse_repeated_ids
from finecap.registry import PREDICTION_FORMATS, lookup
from finecap.utils.text import short_repr

__all__ = [
    "Predictions",
    "PredictionFormat",
    "check_line_order",
    "detect_prediction_format",
    "prediction_format",
    "read_predictions",
]


@dataclass
class Predictions:
    """What a prediction file holds: captions per image (several when the file lists an image several times), the
    references it carries (``None`` for COCO results and an lmms-eval test split's log) and warnings about them."""

    captions: dict[int | str, list[str]]
    references: dict[int | str, list[str]] | None = None
    warnings: list[str] = field(default_factory=list)

    def add(self, image_id: int | str, caption: str, references: list[str] | None, where: str) -> None:
        """Add ``caption`` of ``image_id`` with the ``references`` its record carries (``None``: none). An image
        listed again (its captions are then samples) must carry the same references: other ones are a
        :class:`~finecap.data.records.DataError` naming ``where``, as its first caption would be scored against the
        last record's."""
        if references is not None:
            if self.references is None:
                self.references = {}
            known = self.references.setdefault(image_id, references)
            if known != references:
                raise DataError(f"{where}: image id {image_id!r} is listed again with other references than with its "
                                f"first caption ({known!r} there, {references!r} here)"[:400])  # fmt: skip
        self.captions.setdefault(image_id, []).append(caption)


@dataclass(frozen=True)
class PredictionFormat:
    """A prediction file format: the one place that knows how its files are recognised and read."""

    name: str
    """The format's name: ``finecap eval --predictions-format``'s value (the registry row's key)."""
    read: Callable[[Path], Predictions]
    """The reader: :class:`Predictions`; bad input is a :class:`~finecap.data.records.DataError` naming the file and
    the record."""
    detect: Callable[[Path], bool]
    """Whether ``path`` is of this format (its suffix, its first record)."""
    references: bool
    """Whether its files carry the references (then ``--references`` is optional; a file that carries none, an
    lmms-eval test split's log, reads as :attr:`Predictions.references` ``None``)."""
    line_ids: bool = False
    """Whether its ids are the records' numbers from 0 (LLaMA-Factory's, ms-swift's): they name the images of a
    ``--references`` file only when the records follow its order, which :func:`check_line_order` checks."""


def prediction_format(name: str) -> PredictionFormat:
    """The registered format ``name`` (or a dotted path ``pkg.module:FORMAT``); ``ValueError`` listing the names."""
    return lookup(name, PREDICTION_FORMATS, "--predictions-format", "predictions format")


def detect_prediction_format(path: Path) -> str:
    """The name of the registered format that recognises ``path``: the last row's (COCO results, which reads what
    no other format recognises) when none of the others does; a ``DataError`` naming the file and the formats when
    two of them do (a first record with the fields of two tools) or none at all. What is not a file is ``coco``'s,
    whose reader says what it is (missing, a folder)."""
    if not path.is_file():
        return "coco"
    *specific, fallback = PREDICTION_FORMATS
    found = [name for name in specific if prediction_format(name).detect(path)]
    if len(found) > 1:
        raise DataError(f"{path}: its first record reads as {' and as '.join(found)} predictions; name its format "
                        "with --predictions-format")  # fmt: skip
    if found:
        return found[0]
    if prediction_format(fallback).detect(path):
        return fallback
    raise not_recognised(path)


def not_recognised(path: Path, detail: str = "") -> DataError:
    """The error for a file of no registered format (``detail``: what it holds, e.g. its first line's keys)."""
    return DataError(
        f"{path}: {detail + ': ' if detail else ''}not a predictions file finecap recognises "
        f"({', '.join(PREDICTION_FORMATS)}); name its format with --predictions-format"
    )


def read_predictions(path: str | Path, fmt: str = "auto") -> tuple[str, Predictions]:
    """``(format name, Predictions)`` of ``path`` in format ``fmt`` (``"auto"``: :func:`detect_prediction_format`).
    A file carrying references that names one image by two ids (``7`` and ``"7"``: two reference lists, two captions
    of one image scored as two images) is a ``ValueError`` naming the file
    (:func:`~finecap.data.records.refuse_repeated_ids`); captions alone are matched with ``--references``, which
    refuses two ids naming one of its images (:mod:`finecap.app.eval`)."""
    path = Path(path)
    name = detect_prediction_format(path) if fmt == "auto" else fmt
    spec = prediction_format(name)
    read = spec.read(path)
    if read.references is not None:
        refuse_repeated_ids(read.references, str(path))
    return spec.name, read


def check_line_order(
    path: Path, carried: dict[int | str, list[str]], matched: dict[int | str, Hashable], captions: Mapping
) -> None:
    """Refuse pairing the records of a :attr:`~PredictionFormat.line_ids` file with the ``--references`` images
    their numbers match (``matched``: record number -> image id; ``captions``: image id -> its references) unless
    every record's own reference is among its image's (compared by their letters and digits, case aside, as
    tokenizers re-space text): a :class:`DataError` naming the first record that is not, and how many."""

    def key(text: str) -> str:
        return "".join(c for c in text.casefold() if c.isalnum())

    bad = [k for k, image in matched.items() if not {key(r) for r in carried[k]} & {key(c) for c in captions[image]}]
    if bad:
        k, image = bad[0], matched[bad[0]]
        raise DataError(
            f"{path}: its ids are record numbers (from 0), which name the images of --references only when the "
            f"records follow their order, and {len(bad)} of {len(matched)} records' references are not among their "
            f"image's, e.g. id {k} {short_repr(carried[k])} against image {image!r} {short_repr(captions[image])}; "
            "leave out --references to score against the references the file carries"
        )
