"""A drop-in for pycocoevalcap's ``COCOEvalCap``: same inputs, same attributes, same numbers, no Java but for SPICE.

Switching is a one-line import change::

    from pycocotools.coco import COCO
    from finecap.metrics import COCOEvalCap      # was: from pycocoevalcap.eval import COCOEvalCap

    coco = COCO("captions_val2014.json")
    coco_result = coco.loadRes("results.json")
    coco_eval = COCOEvalCap(coco, coco_result)
    coco_eval.params["image_id"] = coco_result.getImgIds()
    coco_eval.evaluate()
    for metric, score in coco_eval.eval.items():
        print(f"{metric}: {score:.3f}")

``coco`` / ``cocoRes`` are pycocotools ``COCO`` objects (anything with ``getImgIds()`` and ``imgToAnns``), or paths
of a COCO caption annotation file and a COCO results file (then pycocotools is not needed: :class:`CaptionFile`
reads them). After :meth:`COCOEvalCap.evaluate`, ``eval`` maps pycocoevalcap's metric names (``Bleu_1`` ..
``Bleu_4``, ``METEOR``, ``ROUGE_L``, ``CIDEr``, ``SPICE``) to corpus scores, ``imgToEval[image_id]`` holds
``image_id`` and the per-image scores, and ``evalImgs`` lists those dicts, as pycocoevalcap fills them, with its
types: Python floats for BLEU and METEOR, numpy ``float64`` for ROUGE-L and CIDEr (corpus and per image) and
SPICE's corpus score.

How it computes them: captions go through :func:`finecap.metrics.ptb_tokenize.tokenize_all` (the Python equivalent
of pycocoevalcap's Java PTB tokenizer), BLEU / ROUGE-L / CIDEr-D through :func:`finecap.metrics.ngram.ngram_metrics`
(pycocoevalcap-identical, tested), METEOR in Python from pycocoevalcap's own data (:mod:`finecap.metrics.meteor`,
reproducing its jar; ``meteor_backend="java"`` runs the jar) and SPICE through the same jars as pycocoevalcap
(:mod:`finecap.metrics.spice`). Differences, chosen on purpose:

- ``metrics`` (constructor) selects the scorers; by default all five, as pycocoevalcap runs. A metric that cannot
  run here (METEOR without pycocoevalcap's data; SPICE without Java or with its Stanford CoreNLP jars missing:
  pycocoevalcap would try to download them) is skipped with a warning saying why, instead of failing after the
  other metrics; its key is then absent.
- SPICE's per-image entry is its F-score (``imgToEval[i]["SPICE"]``), not pycocoevalcap's dict of per-category
  precision/recall, and it is image ``i``'s: pycocoevalcap gives an image another's whenever ``params["image_id"]``
  is not sorted (its ``Spice`` returns sorted ids' scores, assigned in ``params`` order; docs/evaluation.md#output);
  the corpus ``eval["SPICE"]`` is the same mean F-score.
- Nothing is printed (pycocoevalcap prints progress and each score); ``verbose=True`` prints the scores.
- An image of ``params["image_id"]`` without a result caption, or with several, or with a caption that is not a
  string, raises ``ValueError`` naming it (pycocoevalcap fails with a bare ``KeyError``, ``AssertionError`` or
  ``AttributeError``).
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Hashable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from finecap.metrics.ngram import ngram_metrics
from finecap.metrics.ptb_tokenize import tokenize_all
from finecap.utils.reading import DATA_FILE, parse_json, read_bounded

__all__ = ["COCOEvalCap", "CaptionFile", "COCO_METRICS", "COCO_NAMES"]

COCO_METRICS = ("bleu", "meteor", "rouge", "cider", "spice")
"""Scorer names accepted by ``COCOEvalCap(metrics=...)``, in pycocoevalcap's order."""

COCO_NAMES = {"BLEU-1": "Bleu_1", "BLEU-2": "Bleu_2", "BLEU-3": "Bleu_3", "BLEU-4": "Bleu_4", "METEOR": "METEOR",
              "ROUGE-L": "ROUGE_L", "CIDEr-D": "CIDEr", "SPICE": "SPICE"}  # fmt: skip
"""finecap's metric keys -> pycocoevalcap's (``COCOEvalCap.eval``; ``finecap eval --format coco``)."""


class CaptionFile:
    """The part of pycocotools' ``COCO`` that caption evaluation reads, from a file path or a loaded dict.

    ``dataset``, ``imgToAnns`` (``defaultdict(list)`` of annotation dicts), ``getImgIds()`` and ``loadRes(path)``
    behave as pycocotools' (``loadRes`` keeps every result entry and requires its images to be in this file).
    """

    def __init__(self, source: str | Path | dict | list | None = None):
        self.source = source
        data = parse_json(read_bounded(source, DATA_FILE), source) if isinstance(source, str | Path) else source
        if isinstance(data, list):  # a results list
            data = {"annotations": data}
        self.dataset: dict[str, Any] = data or {}
        anns = self.dataset.get("annotations", [])
        if not isinstance(anns, list):
            raise ValueError(f"{source}: 'annotations' must be a list")
        self.imgToAnns: defaultdict[Hashable, list[dict]] = defaultdict(list)  # noqa: N815 (pycocotools name)
        for j, ann in enumerate(anns):
            if not isinstance(ann, dict) or "image_id" not in ann or "caption" not in ann:
                raise ValueError(f"{source}: annotations[{j}] must be an object with 'image_id' and 'caption'")
            self.imgToAnns[ann["image_id"]].append(ann)
        if "images" in self.dataset:
            self._img_ids = [img["id"] for img in self.dataset["images"]]
        else:
            self._img_ids = list(self.imgToAnns)

    def getImgIds(self) -> list[Hashable]:  # noqa: N802 (pycocotools name)
        return list(self._img_ids)

    def loadRes(self, results: str | Path | list[dict]) -> CaptionFile:  # noqa: N802 (pycocotools name)
        res = CaptionFile(results)
        extra = set(res.imgToAnns) - set(self._img_ids)
        if extra:
            raise ValueError(
                f"{results if isinstance(results, str | Path) else 'results'}: {len(extra)} image id(s) are not in "
                f"the reference file {self.source}, e.g. {sorted(extra, key=str)[:5]}"
            )
        res.dataset["images"] = [img for img in self.dataset.get("images", []) if img["id"] in res.imgToAnns]
        res._img_ids = [i for i in self._img_ids if i in res.imgToAnns]
        return res


def _as_coco(obj: Any, what: str) -> Any:
    if isinstance(obj, str | Path):
        return CaptionFile(obj)
    if not hasattr(obj, "imgToAnns") or not hasattr(obj, "getImgIds"):
        raise TypeError(f"{what}: expected a pycocotools COCO object or a file path, got {type(obj).__name__}")
    return obj


class COCOEvalCap:
    """pycocoevalcap's ``COCOEvalCap`` on finecap's metrics (module docstring): ``COCOEvalCap(coco, cocoRes)``."""

    def __init__(
        self,
        coco: Any,
        cocoRes: Any,
        *,
        metrics: Iterable[str] = COCO_METRICS,
        verbose: bool = False,  # noqa: N803
        meteor_backend: str = "python",
    ):
        self.coco = _as_coco(coco, "coco")
        self.cocoRes = (  # noqa: N815 (pycocoevalcap name)
            self.coco.loadRes(cocoRes) if isinstance(cocoRes, str | Path) else _as_coco(cocoRes, "cocoRes")
        )
        self.metrics = list(metrics)
        unknown = [m for m in self.metrics if m not in COCO_METRICS]
        if unknown:
            raise ValueError(f"COCOEvalCap(metrics=...): unknown {unknown}; valid: {', '.join(COCO_METRICS)}")
        self.verbose = verbose
        from finecap.metrics.meteor import BACKENDS  # METEOR's package loads here, not when this module is imported

        if meteor_backend not in BACKENDS:
            raise ValueError(
                f"COCOEvalCap(meteor_backend=...): expected one of {', '.join(BACKENDS)}, got {meteor_backend!r}"
            )
        self.meteor_backend = meteor_backend
        self.evalImgs: list[dict] = []  # noqa: N815
        self.eval: dict[str, float] = {}
        self.imgToEval: dict[Hashable, dict] = {}  # noqa: N815
        self.params: dict[str, Any] = {"image_id": self.coco.getImgIds()}

    def evaluate(self) -> None:
        """Tokenise, score every selected metric, and fill ``eval``, ``imgToEval`` and ``evalImgs``. An image listed
        several times in ``params["image_id"]`` is scored once, where it is first listed (pycocoevalcap keys its
        captions by image id)."""
        img_ids = list(dict.fromkeys(self.params["image_id"]))
        gts_raw: dict[Hashable, list[str]] = {}
        res_raw: dict[Hashable, str] = {}
        for i in img_ids:
            refs = self.coco.imgToAnns[i]
            res = self.cocoRes.imgToAnns[i]
            if len(res) != 1:
                got = "no result caption" if not res else f"{len(res)} result captions"
                raise ValueError(f"image {i!r}: {got}; pycocoevalcap's scorers need exactly one per image")
            if not refs:
                raise ValueError(f"image {i!r}: no reference caption in the annotations")
            gts_raw[i] = [_caption(a, i, "reference") for a in refs]
            res_raw[i] = _caption(res[0], i, "result")
        gts, res = _tokenize(gts_raw), dict(zip(img_ids, tokenize_all(res_raw.values())))
        ngram = [m for m in ("bleu", "rouge", "cider") if m in self.metrics]
        per: dict[Hashable, dict] = {}
        corpus: dict[str, float] = {}
        if ngram:
            wanted = {"bleu": "bleu", "rouge": "rouge_l", "cider": "cider_d"}
            c, p = ngram_metrics(res, gts, [wanted[m] for m in ngram])
            corpus.update({COCO_NAMES[k]: v for k, v in c.items()})
            per = {i: {COCO_NAMES[k]: v for k, v in p[i].items()} for i in img_ids}
        for name in ("meteor", "spice"):
            if name in self.metrics:
                c, p = _java_metric(name, res, gts, self.meteor_backend)
                corpus.update(c)
                for i in p:
                    per.setdefault(i, {}).update(p[i])
        order = [n for m in self.metrics for n in _KEYS[m] if n in corpus]
        for name in order:
            self.setEval(np.float64(corpus[name]) if name in _NUMPY_CORPUS else corpus[name], name)
            scores = [per[i][name] for i in img_ids]
            self.setImgToEvalImgs(np.array(scores) if name in _NUMPY_PER_IMAGE else scores, img_ids, name)
            if self.verbose:
                print(f"{name}: {corpus[name]:0.3f}")
        self.setEvalImgs()

    # pycocoevalcap's three public setters, which its evaluate() calls and subclasses overriding evaluate() call too
    def setEval(self, score: Any, method: str) -> None:  # noqa: N802 (pycocoevalcap name)
        """``eval[method] = score``."""
        self.eval[method] = score

    def setImgToEvalImgs(self, scores: Iterable, imgIds: Iterable[Hashable], method: str) -> None:  # noqa: N802, N803
        """``imgToEval[imgId][method] = score`` for ``imgIds`` and ``scores`` zipped (up to the shorter), creating
        ``{"image_id": imgId}`` for an image seen first."""
        for img_id, score in zip(imgIds, scores):
            self.imgToEval.setdefault(img_id, {"image_id": img_id})[method] = score

    def setEvalImgs(self) -> None:  # noqa: N802 (pycocoevalcap name)
        """``evalImgs``: the dicts of ``imgToEval``, in its order (the same objects)."""
        self.evalImgs = list(self.imgToEval.values())


def _caption(ann: Any, image_id: Hashable, what: str) -> str:
    """The ``caption`` of an annotation or result entry of ``image_id``; a ``ValueError`` naming the image when it
    is not a string (pycocoevalcap fails on it with a bare ``AttributeError``)."""
    caption = ann.get("caption") if isinstance(ann, dict) else None
    if not isinstance(caption, str):
        raise ValueError(f"image {image_id!r}: a {what} caption must be a string, got {caption!r} in {ann!r}"[:300])
    return caption


# pycocoevalcap's types, as its COCOEvalCap stores what its scorers return: Bleu and Meteor give Python floats,
# Rouge and Cider a numpy mean and a numpy array (np.float64 items), Spice a numpy mean (and per image a dict)
_NUMPY_CORPUS = frozenset({"ROUGE_L", "CIDEr", "SPICE"})
_NUMPY_PER_IMAGE = frozenset({"ROUGE_L", "CIDEr"})

_KEYS = {
    "bleu": ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4"),
    "meteor": ("METEOR",),
    "rouge": ("ROUGE_L",),
    "cider": ("CIDEr",),
    "spice": ("SPICE",),
}


def _tokenize(captions: dict[Hashable, Sequence[str]]) -> dict[Hashable, list[str]]:
    """Tokenise ``{id: [caption, ...]}`` in one batch (:func:`tokenize_all`)."""
    flat = tokenize_all([c for caps in captions.values() for c in caps])
    out, k = {}, 0
    for i, caps in captions.items():
        out[i] = flat[k : k + len(caps)]
        k += len(caps)
    return out


def _java_metric(
    name: str, res: dict[Hashable, str], gts: dict[Hashable, list[str]], meteor_backend: str
) -> tuple[dict[str, float], dict[Hashable, dict]]:
    from finecap.metrics.meteor.resources import MetricUnavailable

    try:
        if name == "meteor":
            from finecap.metrics.meteor import meteor_per_item

            return meteor_per_item(res, gts, backend=meteor_backend)
        from finecap.metrics.spice import spice_per_item

        return spice_per_item(res, gts)
    except MetricUnavailable as e:
        warnings.warn(f"COCOEvalCap: skipping {name.upper()}: {e}", stacklevel=3)
        return {}, {}
