"""Evaluate captions: n-gram metrics, CLIPScore, self-retrieval, TrueMatch bags, diversity, faithfulness, perplexity.

``finecap eval --predictions results.json --references DATA [--images DIR] [--bags bags.json] [--metrics ...]
--out eval.json`` calls :func:`main`; code calls :func:`evaluate` with in-memory captions. Metric *groups* are chosen
by name from :data:`METRICS` (a plain dict; an unknown name raises ``ValueError`` listing the valid ones):

============  =====================================================  ======================================
group         keys                                                   needs
============  =====================================================  ======================================
bleu          ``BLEU-1`` .. ``BLEU-4``                               references
rouge         ``ROUGE-L``                                            references
cider         ``CIDEr-D``                                            references
meteor        ``METEOR`` (optional: skipped with a warning without   references, Java + pycocoevalcap jar
              Java or the jar)
spice         ``SPICE`` (optional, likewise)                         references, Java + SPICE jars
length        ``Length`` (mean words per caption)                    --
vocab         ``Lexical diversity`` (distinct words), ``Vocab        --
              usage`` (words used >= ``eval.vocab_min_count`` = 5
              times, NDLB Table 6)
diversity     ``Div-1``, ``Div-2``, ``mBLEU-4``                      ``samples`` (>= 2 captions per image)
faithfulness  ``faith/precision``, ``faith/recall``, hallucination   scene graphs (the world)
              counts (:mod:`finecap.metrics.faithfulness`)
retrieval     ``RD{N}/R@1,5,10``, ``mean_rank``, ``median_rank``     images + retriever
              (N = ``eval.n_distractors`` random distractors,
              ``eval.draws`` draws) and ``pool/...`` (the whole
              image pool)
bags          ``bag{s}/R@1``, ``mean_rank``, ``median_rank``,        images + retriever + bags
              ``n`` per bag size s (TrueMatch)
clipscore     ``CLIPScore``, ``RefCLIPScore``                        images + retriever (+ references)
perplexity    ``perplexity``, ``perplexity/nll``, ...                ``eval.lm`` (a causal LM)
============  =====================================================  ======================================

Text handling: the n-gram metrics, METEOR, SPICE, length, vocabulary and diversity metrics see PTB-tokenised text
(:func:`finecap.metrics.ptb_tokenize.tokenize`: lower-cased, punctuation removed), as pycocoevalcap does;
faithfulness, the CLIP metrics and perplexity see the captions as written. Recalls are fractions in ``[0, 1]``,
ranks start at 1. The images evaluated are those of ``predictions`` (like pycocoevalcap); extra references are
ignored, but the retrieval pool is every image given in ``images``.

Reference files (:func:`load_references`): the format is recognised from the file: a folder or a ``dataset.json``
with ``scenes.jsonl`` next to it is the world (its scene graphs are then used for faithfulness, and its scene
families reported by ``finecap bags build``); ``*.jsonl`` is JSONL; a JSON whose ``images`` carry ``sentences`` is
Karpathy, one with ``annotations`` is COCO (:mod:`finecap.data.formats`).

Predictions (:func:`read_predictions`): COCO results ``[{"image_id", "caption"}]``. An image listed several times
has several samples: its first caption is its prediction for every metric, and all of them form its ``samples`` for
the ``diversity`` group.

Example::

    >>> evaluate({1: "A red circle."}, None, metrics=["length", "vocab"])
    {'Length': 3.0, 'Lexical diversity': 3.0, 'Vocab usage': 0.0}
    >>> out = evaluate({1: "a red circle"}, {1: ["a red circle", "a big red circle"]}, metrics="bleu,cider")
    >>> round(out["BLEU-1"], 6), sorted(out)
    (1.0, ['BLEU-1', 'BLEU-2', 'BLEU-3', 'BLEU-4', 'CIDEr-D'])
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from finecap.config import Config
    from finecap.data.formats import Record
    from finecap.world.scene import Scene

Predictions = Mapping[Hashable, str]
References = Mapping[Hashable, Sequence[str]]


# --------------------------------------------------------------------------------------------------------------------
# Evaluation context: inputs plus values shared between metric groups (tokenised text, embeddings, scores)
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class _Context:
    predictions: dict[Hashable, str]
    references: dict[Hashable, list[str]] | None
    cfg: Config
    retriever: Any = None
    images: list[Record] | None = None
    scenes: Mapping[Hashable, Scene] | None = None
    bags: dict[int, list[list[Hashable]]] | None = None
    samples: dict[Hashable, list[str]] | None = None
    requested: tuple[str, ...] = ()
    cache: dict[str, Any] = field(default_factory=dict)

    def need(self, what: str, group: str, hint: str) -> Any:
        value = getattr(self, what)
        if value is None:
            raise ValueError(f"metric {group!r} needs {what}: {hint}")
        return value

    # tokenised text -------------------------------------------------------------------------------------------------

    def tok_predictions(self) -> dict[Hashable, str]:
        if "tok_pred" not in self.cache:
            from finecap.metrics.ptb_tokenize import tokenize

            self.cache["tok_pred"] = {i: tokenize(c) for i, c in self.predictions.items()}
        return self.cache["tok_pred"]

    def tok_references(self, group: str) -> dict[Hashable, list[str]]:
        if "tok_refs" not in self.cache:
            from finecap.metrics.ptb_tokenize import tokenize

            refs = self.need("references", group, "pass the reference captions")
            missing = [i for i in self.predictions if not refs.get(i)]
            if missing:
                raise ValueError(f"metric {group!r}: no references for {len(missing)} image(s), e.g. {missing[:5]}")
            self.cache["tok_refs"] = {i: [tokenize(c) for c in refs[i]] for i in self.predictions}
        return self.cache["tok_refs"]

    # self-retrieval -------------------------------------------------------------------------------------------------

    def get_retriever(self) -> Any:
        if self.retriever is None:
            from finecap.models.retriever import load_retriever

            self.retriever = load_retriever(self.cfg)
        return self.retriever

    def retrieval_scores(self, group: str) -> tuple[Any, list[Hashable], Any]:
        """(SelfRetrieval, query image ids, cosine scores (Q, N)), computed once for 'retrieval' and 'bags'."""
        if "retrieval" not in self.cache:
            from finecap.metrics.retrieval import SelfRetrieval

            images = self.need("images", group, "pass the image records (the retrieval pool)")
            e = self.cfg.eval
            sr = SelfRetrieval(self.get_retriever(), images, cache_dir=self.cfg.run.cache_dir or None,
                               n_distractors=e.n_distractors, draws=e.draws, seed=e.seed)  # fmt: skip
            ids, scores = sr.scores(self.predictions)
            self.cache["retrieval"] = (sr, ids, scores)
        return self.cache["retrieval"]


# --------------------------------------------------------------------------------------------------------------------
# Metric groups
# --------------------------------------------------------------------------------------------------------------------


def _ngram(ctx: _Context, group: str) -> dict[str, float]:
    """BLEU / ROUGE-L / CIDEr-D; the groups asked for in this evaluation share one reference index."""
    if "ngram" not in ctx.cache:
        from finecap.metrics.ngram import ngram_metrics

        names = {"bleu": "bleu", "rouge": "rouge_l", "cider": "cider_d"}
        wanted = [names[g] for g in ctx.requested if g in names] or [names[group]]
        ctx.cache["ngram"] = ngram_metrics(ctx.tok_predictions(), ctx.tok_references(group), wanted)[0]
    corpus = ctx.cache["ngram"]
    prefix = {"bleu": "BLEU-", "rouge": "ROUGE-L", "cider": "CIDEr-D"}[group]
    return {k: v for k, v in corpus.items() if k.startswith(prefix)}


def _bleu(ctx: _Context) -> dict[str, float]:
    return _ngram(ctx, "bleu")


def _rouge(ctx: _Context) -> dict[str, float]:
    return _ngram(ctx, "rouge")


def _cider(ctx: _Context) -> dict[str, float]:
    return _ngram(ctx, "cider")


def _java_metric(ctx: _Context, group: str) -> dict[str, float]:
    from finecap.metrics.meteor import MetricUnavailable

    if group == "meteor":
        from finecap.metrics.meteor import meteor as fn
    else:
        from finecap.metrics.spice import spice as fn
    refs = ctx.tok_references(group)
    try:
        return fn(ctx.tok_predictions(), refs)
    except MetricUnavailable as e:
        warnings.warn(f"skipping {group.upper()}: {e}", stacklevel=2)
        return {}


def _meteor(ctx: _Context) -> dict[str, float]:
    return _java_metric(ctx, "meteor")


def _spice(ctx: _Context) -> dict[str, float]:
    return _java_metric(ctx, "spice")


def _length(ctx: _Context) -> dict[str, float]:
    from finecap.metrics.diversity import mean_length

    return {"Length": mean_length(ctx.tok_predictions().values())}


def _vocab(ctx: _Context) -> dict[str, float]:
    from finecap.metrics.diversity import vocabulary_metrics

    out = vocabulary_metrics(ctx.tok_predictions(), min_count=ctx.cfg.eval.vocab_min_count)
    return {k: out[k] for k in ("Lexical diversity", "Vocab usage")}


def _diversity(ctx: _Context) -> dict[str, float]:
    from finecap.metrics.diversity import set_diversity
    from finecap.metrics.ptb_tokenize import tokenize

    samples = ctx.need("samples", "diversity", "pass several sampled captions per image ({id: [caption, ...]})")
    return set_diversity({i: [tokenize(c) for c in caps] for i, caps in samples.items()})


def _faithfulness(ctx: _Context) -> dict[str, float]:
    from finecap.metrics.faithfulness import faithfulness

    scenes = ctx.need("scenes", "faithfulness", "scene graphs exist only for the world (scenes.jsonl)")
    return faithfulness(ctx.predictions, scenes)


def _retrieval(ctx: _Context) -> dict[str, float]:
    import numpy as np

    from finecap.metrics.retrieval import pool_retrieval, rd_retrieval

    sr, ids, scores = ctx.retrieval_scores("retrieval")
    targets = np.array([sr.column[i] for i in ids], dtype=np.int64)
    e = ctx.cfg.eval
    out = {f"RD{e.n_distractors}/{k}": v for k, v in rd_retrieval(scores, targets, e.n_distractors, e.draws,
                                                                   e.seed).items()}  # fmt: skip
    out.update({f"pool/{k}": v for k, v in pool_retrieval(scores, targets).items()})
    return out


def _bags(ctx: _Context) -> dict[str, float]:
    import numpy as np

    from finecap.metrics.retrieval import bag_retrieval

    bags = ctx.need("bags", "bags", "pass TrueMatch bags ({size: [[image_id, ...], ...]}, `finecap bags build`)")
    sr, ids, scores = ctx.retrieval_scores("bags")
    targets = np.array([sr.column[i] for i in ids], dtype=np.int64)
    out: dict[str, float] = {}
    for size in sorted(bags):
        result = bag_retrieval(scores, bags[size], sr.image_ids, targets)
        if not result:
            warnings.warn(f"no predicted image lies in a bag of size {size}", stacklevel=2)
        out.update(result)
    return out


def _clipscore(ctx: _Context) -> dict[str, float]:
    from finecap.metrics.clipscore import CLIPScore

    images = ctx.need("images", "clipscore", "pass the image records")
    scorer = CLIPScore(ctx.get_retriever(), images, cache_dir=ctx.cfg.run.cache_dir or None)
    refs = None
    if ctx.references is not None and all(ctx.references.get(i) for i in ctx.predictions):
        refs = {i: list(ctx.references[i]) for i in ctx.predictions}
    return scorer(ctx.predictions, refs)


def _perplexity(ctx: _Context) -> dict[str, float]:
    from finecap.metrics.perplexity import Perplexity

    if not ctx.cfg.eval.lm:
        raise ValueError("metric 'perplexity' needs a language model: set eval.lm=<causal LM name or path>")
    import torch

    device = "cuda" if torch.cuda.is_available() and not ctx.cfg.train.cpu else None
    return Perplexity(ctx.cfg.eval.lm, batch_size=ctx.cfg.eval.batch_size, device=device)(ctx.predictions)


METRICS: dict[str, Callable[[_Context], dict[str, float]]] = {
    "bleu": _bleu,
    "rouge": _rouge,
    "cider": _cider,
    "meteor": _meteor,
    "spice": _spice,
    "length": _length,
    "vocab": _vocab,
    "diversity": _diversity,
    "faithfulness": _faithfulness,
    "retrieval": _retrieval,
    "bags": _bags,
    "clipscore": _clipscore,
    "perplexity": _perplexity,
}
"""Metric groups by name (see the module docstring for their keys and inputs)."""

IMAGE_METRICS = ("retrieval", "bags", "clipscore")


def parse_metrics(metrics: str | Sequence[str] | None, default: Sequence[str] = ()) -> list[str]:
    """Metric group names from ``"a,b"`` or a list (default ``default``); unknown names list the valid ones."""
    if metrics is None:
        names = list(default)
    elif isinstance(metrics, str):
        names = [m.strip() for m in metrics.split(",") if m.strip()]
    else:
        names = [str(m).strip() for m in metrics]
    unknown = [m for m in names if m not in METRICS]
    if unknown:
        raise ValueError(f"unknown metric(s) {', '.join(map(repr, unknown))}; valid metrics: {', '.join(METRICS)}")
    if not names:
        raise ValueError(f"no metrics to compute; valid metrics: {', '.join(METRICS)}")
    return list(dict.fromkeys(names))


def evaluate(
    predictions: Predictions,
    references: References | None,
    *,
    metrics: str | Sequence[str],
    retriever: Any = None,
    images: Sequence[Record] | None = None,
    scenes: Mapping[Hashable, Scene] | None = None,
    bags: Mapping[int, Sequence[Sequence[Hashable]]] | Sequence[Sequence[Hashable]] | None = None,
    samples: Mapping[Hashable, Sequence[str]] | None = None,
    cfg: Config | None = None,
) -> dict[str, float]:
    """Compute the metric groups ``metrics`` (names of :data:`METRICS`) for ``{image_id: caption}`` predictions.

    Args:
        predictions: ``{image_id: caption}``.
        references: ``{image_id: [reference captions]}`` (for n-gram metrics, METEOR, SPICE, RefCLIPScore).
        metrics: group names, as a list or ``"a,b,c"``.
        retriever: a :class:`~finecap.models.retriever.Retriever`; default: the configured one (``retriever.*``),
            loaded only when a CLIP metric is asked for.
        images: records (``image_id``, ``path``) of the retrieval pool; must include every predicted image.
        scenes: ``{image_id: Scene}`` for ``faithfulness``.
        bags: ``{size: [[image_id, ...], ...]}`` (or a plain list of bags) for ``bags``.
        samples: ``{image_id: [sampled captions]}`` for ``diversity``.
        cfg: configuration (``eval.*``, ``run.cache_dir``, ``retriever.*``); default: the defaults.

    Returns:
        ``{metric key: value}`` in the order of the groups asked for (module docstring). A group whose input is
        missing raises ``ValueError`` naming it; METEOR / SPICE without Java are skipped with a warning.
    """
    from finecap.config import load

    cfg = cfg if cfg is not None else load()
    names = parse_metrics(metrics)
    if not predictions:
        raise ValueError("predictions: empty, nothing to evaluate")
    if bags is not None and not isinstance(bags, Mapping):
        grouped: dict[int, list[list[Hashable]]] = {}
        for b in bags:
            grouped.setdefault(len(b), []).append(list(b))
        bags = grouped
    ctx = _Context(
        predictions=dict(predictions),
        references={i: list(r) for i, r in references.items()} if references is not None else None,
        cfg=cfg,
        retriever=retriever,
        images=list(images) if images is not None else None,
        scenes=scenes,
        bags={int(s): [list(b) for b in v] for s, v in bags.items()} if bags is not None else None,
        samples={i: list(s) for i, s in samples.items()} if samples is not None else None,
        requested=tuple(names),
    )
    out: dict[str, float] = {}
    for name in names:
        out.update({k: float(v) for k, v in METRICS[name](ctx).items()})
    return out


# --------------------------------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class LoadedReferences:
    """Records of a reference file, where they came from, and the world's scene graphs / families when present."""

    records: list[Record]
    path: Path
    format: str
    scenes: dict[Hashable, Scene] | None = None
    families: dict[Hashable, Any] | None = None

    def captions(self) -> dict[Hashable, list[str]]:
        return {r.image_id: list(r.captions) for r in self.records}


def detect_format(path: str | Path) -> tuple[str, Path]:
    """``(format, file)`` of a reference file or world folder (module docstring)."""
    path = Path(path)
    if path.is_dir():
        if (path / "dataset.json").exists():
            return "world", path / "dataset.json"
        raise FileNotFoundError(f"{path}: a folder, but no dataset.json in it (expected a world folder)")
    if not path.exists():
        raise FileNotFoundError(f"{path}: reference file not found")
    if path.suffix == ".jsonl":
        return "jsonl", path
    if (path.parent / "scenes.jsonl").exists() and path.name == "dataset.json":
        return "world", path
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a JSON reference file ({e})") from None
    if isinstance(data, dict) and "annotations" in data:
        return "coco", path
    if isinstance(data, dict) and isinstance(data.get("images"), list):
        return "karpathy", path
    raise ValueError(
        f"{path}: unrecognised reference format; expected a world folder, Karpathy JSON ('images' with "
        "'sentences'), COCO annotations ('images' + 'annotations') or JSONL"
    )


def load_references(
    cfg: Config,
    data: str | Path | None = None,
    *,
    split: str | None = None,
    images: str | Path | None = None,
    check_images: bool = False,
) -> LoadedReferences:
    """Read a reference data set: ``data`` (format detected), or the configured one (``data.format``/``data.path``,
    default the world at ``world.out``). ``split`` keeps one split (``"train"`` also takes Karpathy's ``restval``).
    ``images`` (default ``data.images``) is the image root; ``check_images`` verifies that the image files exist."""
    from finecap.data.datasets import TRAIN_SPLITS, data_file
    from finecap.data.formats import read_dataset

    if data is None:
        fmt, path = cfg.data.format, data_file(cfg)
        if fmt == "world" and not path.exists():
            raise FileNotFoundError(f"{path}: no world here; run `finecap world make` (or pass the data set file)")
    else:
        fmt, path = detect_format(data)
    root = images if images is not None else (cfg.data.images or None)
    records = read_dataset(fmt, path, images=root, check_images=check_images)
    if split is not None:
        wanted = TRAIN_SPLITS if split == "train" else (split,)
        kept = [r for r in records if r.split in wanted]
        if not kept:
            present = sorted({r.split for r in records})
            raise ValueError(f"{path}: no records in split {split!r}; splits present: {', '.join(present)}")
        records = kept
    scenes = families = None
    scene_file = Path(path).parent / "scenes.jsonl"
    if fmt == "world" and scene_file.exists():
        from finecap.world.make import load_scene_records

        scene_records = load_scene_records(scene_file.parent)
        scenes = {r["imgid"]: r["scene"] for r in scene_records}
        families = {r["imgid"]: r.get("family") for r in scene_records}
    return LoadedReferences(records, Path(path), fmt, scenes, families)


def read_predictions(path: str | Path) -> tuple[dict[Hashable, str], dict[Hashable, list[str]] | None]:
    """COCO results -> ``(predictions, samples)``: the first caption of each image, and every caption of each image
    when some image is listed more than once (else ``None``)."""
    from finecap.data.formats import DataError, _load_json, _require

    path = Path(path)
    data = _load_json(path)
    if not isinstance(data, list):
        raise DataError(f"{path}: COCO results must be a list of {{'image_id', 'caption'}} objects")
    all_caps: dict[Hashable, list[str]] = {}
    for i, rec in enumerate(data):
        where = f"{path}: [{i}]"
        image_id = _require(rec, "image_id", (int, str), where)
        all_caps.setdefault(image_id, []).append(_require(rec, "caption", str, where))
    if not all_caps:
        raise DataError(f"{path}: no predictions")
    predictions = {i: caps[0] for i, caps in all_caps.items()}
    samples = all_caps if any(len(c) > 1 for c in all_caps.values()) else None
    return predictions, samples


def main(
    cfg: Config,
    *,
    predictions: str | Path,
    references: str | Path | None,
    images: str | Path | None = None,
    bags: str | Path | None = None,
    metrics: str | Sequence[str] | None = None,
    out: str | Path,
    split: str | None = None,
) -> dict[str, float]:
    """``finecap eval``: score a COCO results file against a reference data set, print a table, write JSON.

    ``metrics`` default to ``eval.metrics``; then groups whose inputs are absent (faithfulness without scene graphs,
    bags without ``--bags``, diversity without several captions per image, perplexity without ``eval.lm``) are
    skipped with a note, whereas explicitly asked-for groups raise an error naming what is missing. Without
    ``split``, the retrieval pool is the split of the predicted images (or every referenced image when they span
    several splits). Writes ``{metric: value}`` to ``out``.
    """
    from finecap.data.formats import DataError
    from finecap.data.truematch import read_bags
    from finecap.report.table import markdown_table
    from finecap.utils import write_json

    explicit = metrics is not None
    names = parse_metrics(metrics, cfg.eval.metrics)
    preds, samples = read_predictions(predictions)
    bag_data = read_bags(bags) if bags is not None else None
    needs_images = any(n in IMAGE_METRICS for n in names)
    refs = load_references(cfg, references, split=split, images=images, check_images=needs_images)
    by_id = {r.image_id: r for r in refs.records}
    missing = [i for i in preds if i not in by_id]
    if missing:
        where = f" (split {split!r})" if split else ""
        raise DataError(
            f"{predictions}: {len(missing)} predicted image id(s) are not in the references {refs.path}{where}, "
            f"e.g. {missing[:5]}"
        )
    pool = refs.records
    if split is None:
        splits = {by_id[i].split for i in preds}
        if len(splits) == 1:
            pool = [r for r in refs.records if r.split in splits]
    if not explicit:
        reasons = {
            "faithfulness": None if refs.scenes else "no scene graphs (not a world data set)",
            "bags": None if bag_data else "no --bags file",
            "diversity": None if samples else "one caption per image (diversity needs several)",
            "perplexity": None if cfg.eval.lm else "eval.lm is not set",
        }
        for name in [n for n in names if reasons.get(n)]:
            print(f"skipping {name}: {reasons[name]}")
            names.remove(name)
        if not names:
            raise ValueError("none of the metrics of eval.metrics can be computed here; pass --metrics")
    result = evaluate(
        preds,
        refs.captions(),
        metrics=names,
        images=pool if needs_images else None,
        scenes=refs.scenes,
        bags=bag_data,
        samples=samples,
        cfg=cfg,
    )
    title = Path(predictions).name
    print(f"{len(preds)} images of {refs.path}" + (f" (split {split})" if split else ""))
    print(markdown_table({k: {title: v} for k, v in result.items()}, columns=[title], row_header="metric"))
    write_json(out, result)
    print(f"wrote {out}")
    return result
