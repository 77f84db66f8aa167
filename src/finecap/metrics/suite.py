"""Evaluation of captions: metric groups chosen by name, computed together with shared intermediate results.

:func:`evaluate` computes metric *groups* for in-memory captions; the ``finecap eval`` command
(:mod:`finecap.app.eval`) reads files and calls it. Groups are chosen by name from :data:`METRICS` (a plain dict,
whose names are :data:`finecap.registry.METRIC_GROUPS`; an unknown name raises ``ValueError`` listing the valid
ones):

============  =====================================================  ======================================
group         keys                                                   needs
============  =====================================================  ======================================
bleu          ``BLEU-1`` .. ``BLEU-4``                               references
rouge         ``ROUGE-L``                                            references
cider         ``CIDEr-D``                                            references
meteor        ``METEOR`` (optional: skipped with a warning without   references, pycocoevalcap's data (no
              pycocoevalcap's data; no Java with the default         Java; ``eval.meteor_backend=java``: Java)
              ``eval.meteor_backend=python``)
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
clipscore     ``CLIPScore``, ``RefCLIPScore``, ``ClipSc`` (NDLB)     images + retriever (+ references)
listener      ``listener/RD{N}/R@1``, ``listener/bag{s}/R@1``, tie   scene graphs (+ bags; + images and
              rate, ``exploit`` (:mod:`finecap.metrics.listener`)    retriever for ``exploit``)
perplexity    ``perplexity``, ``perplexity/nll``, ...                ``eval.lm`` (a causal LM)
============  =====================================================  ======================================

Text handling: the n-gram metrics, METEOR, SPICE, length, vocabulary and diversity metrics see PTB-tokenised text
(:func:`finecap.metrics.ptb_tokenize.tokenize`: lower-cased, punctuation removed), as pycocoevalcap does;
faithfulness, the CLIP metrics and perplexity see the captions as written. Recalls are fractions in ``[0, 1]``,
ranks start at 1. The images evaluated are those of ``predictions`` (like pycocoevalcap); extra references are
ignored, but the retrieval pool is every image given in ``images``.

The ``length`` and ``vocab`` groups count words with :func:`finecap.metrics.diversity.caption_words`, the one
definition of a caption's words (the ``captions`` training validator uses it too).

Per-image scores: :func:`evaluate_items` also returns ``{image_id: {metric key: score}}`` for the groups that have
them: the caption metrics (``bleu``, ``meteor``, ``rouge``, ``cider``, ``spice``), as pycocoevalcap's
``COCOEvalCap.imgToEval`` holds them (SPICE's entry is its F-score), and the per-image values whose mean is the corpus
value: ``Length``; ``Div-1`` and ``Div-2`` (of the image's sampled captions); ``faith/precision``, ``faith/recall``,
``faith/facts``, ``faith/halluc_rate`` (1 when the caption states a false fact); ``RD{N}/R@k`` (the share of the
``eval.draws`` draws in which the image ranks in the top k), ``RD{N}/mean_rank``, ``pool/R@k`` (1 or 0),
``pool/mean_rank``; ``bag{s}/R@k`` and ``bag{s}/mean_rank`` for the images in a bag of size s; ``CLIPScore`` and
``RefCLIPScore``. Of the per-image keys, only those of :data:`NOT_IMAGE_MEANS` do not average to their corpus value.
Keys with no per-image value: the medians and counts (``median_rank``, ``bag{s}/n``, ``faith/hallucinated``,
``faith/halluc/<kind>``), the pooled or set-level scores (``faith/precision_micro``, ``ClipSc``, whose corpus mean is
clipped at 0, ``Lexical diversity``, ``Vocab usage``, ``mBLEU-4``, ``perplexity``: the exponential of the mean token
loss) and the ``listener`` group.

Imports: importing this module imports no torch, so text-only evaluation starts fast. The groups that need torch or
transformers (``retrieval``, ``bags`` and ``clipscore`` load the CLIP retriever, ``perplexity`` a causal LM) import
them when they run, as do the world's groups and the Java metrics.

Example::

    >>> evaluate({1: "A red circle."}, None, metrics=["length", "vocab"])
    {'Length': 3.0, 'Lexical diversity': 3.0, 'Vocab usage': 0.0}
    >>> out = evaluate({1: "a red circle"}, {1: ["a red circle", "a big red circle"]}, metrics="bleu,cider")
    >>> round(out["BLEU-1"], 6), sorted(out)
    (1.0, ['BLEU-1', 'BLEU-2', 'BLEU-3', 'BLEU-4', 'CIDEr-D'])
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from finecap.config import did_you_mean, load
from finecap.home import cache_dir
from finecap.metrics.diversity import caption_length, mean_length, set_diversity_per_item, vocabulary_metrics
from finecap.metrics.meteor import MetricUnavailable
from finecap.metrics.ngram import ngram_metrics
from finecap.metrics.ptb_tokenize import ptb_tokenize, tokenize, tokenize_all

# The groups of the world (faithfulness, listener), of images (retrieval, bags, clipscore) and SPICE (Java) import
# their modules when they run: `finecap eval` on caption metrics starts without them.

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
    items: dict[Hashable, dict[str, float]] | None = None  # per-image scores, when asked for (evaluate_items)
    cache: dict[str, Any] = field(default_factory=dict)

    def add_items(self, per_item: Mapping[Hashable, Mapping[str, float]], keys: Sequence[str]) -> None:
        """Record the per-image scores ``keys`` of ``per_item`` (when per-image scores are asked for)."""
        if self.items is not None:
            for i, scores in per_item.items():
                row = self.items.setdefault(i, {})
                row.update({k: float(scores[k]) for k in keys if k in scores})

    def need(self, what: str, group: str, hint: str) -> Any:
        value = getattr(self, what)
        if value is None:
            raise ValueError(f"metric {group!r} needs {what}: {hint}")
        return value

    # tokenised text -------------------------------------------------------------------------------------------------

    def tok_predictions(self) -> dict[Hashable, str]:
        if "tok_pred" not in self.cache:
            preds = self.predictions
            self.cache["tok_pred"] = dict(zip(preds, tokenize_all(preds.values())))
        return self.cache["tok_pred"]

    def tok_references(self, group: str) -> dict[Hashable, list[str]]:
        if "tok_refs" not in self.cache:
            refs = self.need("references", group, "pass the reference captions")
            missing = [i for i in self.predictions if not refs.get(i)]
            if missing:
                raise ValueError(f"metric {group!r}: no references for {len(missing)} image(s), e.g. {missing[:5]}")
            self.cache["tok_refs"] = ptb_tokenize({i: refs[i] for i in self.predictions})
        return self.cache["tok_refs"]

    # self-retrieval -------------------------------------------------------------------------------------------------

    def get_retriever(self) -> Any:
        if self.retriever is None:
            # Deferred: the retriever module imports torch and transformers, which text-only evaluation never needs
            # (`finecap eval --metrics bleu,...` must not import them; tests/test_cli.py checks).
            from finecap.models.retriever import load_retriever

            self.retriever = load_retriever(self.cfg, device=eval_device(self.cfg))
        return self.retriever

    def retrieval_scores(self, group: str) -> tuple[Any, list[Hashable], Any]:
        """(SelfRetrieval, query image ids, cosine scores (Q, N)), computed once for 'retrieval' and 'bags'."""
        if "retrieval" not in self.cache:
            from finecap.metrics.retrieval import SelfRetrieval

            images = self.need("images", group, "pass the image records (the retrieval pool)")
            e = self.cfg.eval
            sr = SelfRetrieval(self.get_retriever(), images, cache_dir=cache_dir(self.cfg.run),
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
        names = {"bleu": "bleu", "rouge": "rouge_l", "cider": "cider_d"}
        wanted = [names[g] for g in ctx.requested if g in names] or [names[group]]
        ctx.cache["ngram"] = ngram_metrics(ctx.tok_predictions(), ctx.tok_references(group), wanted,
                                           per_item=ctx.items is not None)  # fmt: skip
    corpus, per_item = ctx.cache["ngram"]
    prefix = {"bleu": "BLEU-", "rouge": "ROUGE-L", "cider": "CIDEr-D"}[group]
    out = {k: v for k, v in corpus.items() if k.startswith(prefix)}
    ctx.add_items(per_item, list(out))
    return out


def _bleu(ctx: _Context) -> dict[str, float]:
    return _ngram(ctx, "bleu")


def _rouge(ctx: _Context) -> dict[str, float]:
    return _ngram(ctx, "rouge")


def _cider(ctx: _Context) -> dict[str, float]:
    return _ngram(ctx, "cider")


def unavailable_reason(group: str, cfg: Config | None = None) -> str | None:
    """Why the metric ``group`` cannot run on this machine (METEOR with ``eval.meteor_backend``: pycocoevalcap's data,
    or Java and the jar; SPICE: Java and its jars), or ``None``; the other groups need nothing installed."""
    if group == "meteor":
        from finecap.metrics.meteor import meteor_unavailable_reason

        return meteor_unavailable_reason(backend=(cfg or load(None)).eval.meteor_backend)
    if group == "spice":
        from finecap.metrics.spice import spice_unavailable_reason

        return spice_unavailable_reason()
    return None


def _java_metric(ctx: _Context, group: str) -> dict[str, float]:
    """METEOR (Python, or the jar with ``eval.meteor_backend=java``) or SPICE (jars); skipped with a warning saying
    what to install when it cannot run here."""
    if group == "meteor":
        from functools import partial

        from finecap.metrics.meteor import meteor_per_item

        fn = partial(meteor_per_item, backend=ctx.cfg.eval.meteor_backend, max_words=ctx.cfg.eval.meteor_max_words)
    else:
        from finecap.metrics.spice import spice_per_item as fn
    refs = ctx.tok_references(group)
    try:
        corpus, per_item = fn(ctx.tok_predictions(), refs)
    except MetricUnavailable as e:
        warnings.warn(f"skipping {group.upper()}: {e}", stacklevel=2)
        return {}
    ctx.add_items(per_item, list(corpus))
    return corpus


def _meteor(ctx: _Context) -> dict[str, float]:
    return _java_metric(ctx, "meteor")


def _spice(ctx: _Context) -> dict[str, float]:
    return _java_metric(ctx, "spice")


def _length(ctx: _Context) -> dict[str, float]:
    if ctx.items is not None:  # (plain `finecap eval` asks for none: no second count of every caption)
        ctx.add_items({i: {"Length": caption_length(c)} for i, c in ctx.predictions.items()}, ["Length"])
    return {"Length": mean_length(ctx.predictions.values())}


def _vocab(ctx: _Context) -> dict[str, float]:
    out = vocabulary_metrics(ctx.predictions, min_count=ctx.cfg.eval.vocab_min_count)
    return {k: out[k] for k in ("Lexical diversity", "Vocab usage")}


def _diversity(ctx: _Context) -> dict[str, float]:
    samples = ctx.need("samples", "diversity", "pass several sampled captions per image ({id: [caption, ...]})")
    corpus, per = set_diversity_per_item({i: [tokenize(c) for c in caps] for i, caps in samples.items()})
    # Div-n is the mean of its per-image values; mBLEU-4 is not (corpus BLEU per sample round), so it has none
    ctx.add_items({i: {"Div-1": v["Div-1"], "Div-2": v["Div-2"]} for i, v in per.items()}, ["Div-1", "Div-2"])
    return corpus


def _faithfulness(ctx: _Context) -> dict[str, float]:
    from finecap.metrics.faithfulness import faithfulness_per_item

    scenes = ctx.need("scenes", "faithfulness", "scene graphs exist only for the world (scenes.jsonl)")
    corpus, items = faithfulness_per_item(ctx.predictions, scenes)
    ctx.add_items({i: {"faith/precision": f.precision, "faith/recall": f.recall, "faith/facts": f.n_stated,
                       "faith/halluc_rate": float(bool(f.hallucinated))} for i, f in items.items()},
                  ["faith/precision", "faith/recall", "faith/facts", "faith/halluc_rate"])  # fmt: skip
    return corpus


def _retrieval(ctx: _Context) -> dict[str, float]:
    from finecap.metrics.retrieval import pool_retrieval, rank_items, rd_ranks, rd_retrieval, target_ranks

    sr, ids, scores = ctx.retrieval_scores("retrieval")
    targets = np.array([sr.column[i] for i in ids], dtype=np.int64)
    e = ctx.cfg.eval
    out = {f"RD{e.n_distractors}/{k}": v for k, v in rd_retrieval(scores, targets, e.n_distractors, e.draws,
                                                                   e.seed).items()}  # fmt: skip
    out.update({f"pool/{k}": v for k, v in pool_retrieval(scores, targets).items()})
    if ctx.items is not None:  # the per-image values of the means (R@k, mean rank; RD-N's averaged over draws)
        for name, ranks in ((f"RD{e.n_distractors}", rd_ranks(scores, targets, e.n_distractors, e.draws, e.seed)),
                            ("pool", target_ranks(scores, targets))):  # fmt: skip  # (draws, Q), (Q,)
            per_image = rank_items(ranks)
            ctx.add_items({i: {f"{name}/{k}": v[q] for k, v in per_image.items()} for q, i in enumerate(ids)},
                          [f"{name}/{k}" for k in per_image])  # fmt: skip
    return out


def _bags(ctx: _Context) -> dict[str, float]:
    from finecap.metrics.retrieval import bag_retrieval_items

    bags = ctx.need("bags", "bags", "pass TrueMatch bags ({size: [[image_id, ...], ...]}, `finecap bags build`)")
    sr, ids, scores = ctx.retrieval_scores("bags")
    targets = np.array([sr.column[i] for i in ids], dtype=np.int64)
    out: dict[str, float] = {}
    for size in sorted(bags):
        result, per_caption = bag_retrieval_items(scores, bags[size], sr.image_ids, targets)
        if not result:
            warnings.warn(f"no predicted image lies in a bag of size {size}", stacklevel=2)
        out.update(result)
        # the per-image values of each bag size's means, for the images in its bags
        keys = sorted({k for row in per_caption.values() for k in row})
        ctx.add_items({ids[q]: row for q, row in per_caption.items()}, keys)
    return out


def _clipscore(ctx: _Context) -> dict[str, float]:
    from finecap.metrics.clipscore import CLIPScore

    images = ctx.need("images", "clipscore", "pass the image records")
    scorer = CLIPScore(ctx.get_retriever(), images, cache_dir=cache_dir(ctx.cfg.run))
    refs = None
    if ctx.references is not None and all(ctx.references.get(i) for i in ctx.predictions):
        refs = {i: list(ctx.references[i]) for i in ctx.predictions}
    corpus, items = scorer.corpus_and_items(ctx.predictions, refs)
    ctx.add_items(items, ["CLIPScore", "RefCLIPScore"])  # not ClipSc: its corpus value is the mean clipped at 0
    return corpus


def _listener(ctx: _Context) -> dict[str, float]:
    """The fact-based listener on the retriever's candidates; ``exploit`` when retrieval is evaluated too."""
    from finecap.metrics.listener import listener_retrieval

    scenes = ctx.need("scenes", "listener", "scene graphs exist only for the world (scenes.jsonl)")
    e = ctx.cfg.eval
    pool = [r.image_id for r in ctx.images] if ctx.images is not None else list(ctx.predictions)
    scores = None
    if any(g in ctx.requested for g in ("retrieval", "bags")):
        sr, _, scores = ctx.retrieval_scores("listener")
        pool = sr.image_ids
    return listener_retrieval(ctx.predictions, scenes, pool, e.n_distractors, e.draws, e.seed, ctx.bags, scores)


def _perplexity(ctx: _Context) -> dict[str, float]:
    if not ctx.cfg.eval.lm:
        raise ValueError("metric 'perplexity' needs a language model: set eval.lm=<causal LM name or path>")
    # Deferred: perplexity runs a causal LM (torch + transformers); text-only evaluation must not import them.
    from finecap.metrics.perplexity import Perplexity

    return Perplexity(ctx.cfg.eval.lm, batch_size=ctx.cfg.eval.batch_size, device=eval_device(ctx.cfg))(
        ctx.predictions
    )


def eval_device(cfg: Config) -> Any:
    """Where ``finecap eval`` runs its models (the CLIP retriever, the perplexity LM): the machine's accelerator
    (``torch.accelerator``: a GPU), as accelerate would choose it for training, unless ``train.cpu`` is set; else
    the CPU. Imports torch: call it only for groups that run a model."""
    import torch

    if cfg.train.cpu or not torch.accelerator.is_available():
        return torch.device("cpu")
    return torch.accelerator.current_accelerator()


MetricGroup = Callable[[_Context], dict[str, float]]

METRICS: dict[str, MetricGroup] = {
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
    "listener": _listener,
}
"""Metric groups by name (see the module docstring for their keys and inputs)."""

NOT_IMAGE_MEANS = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR")
"""Per-image keys of :func:`evaluate_items` whose mean is not the corpus value: BLEU pools n-gram counts over the
corpus (its brevity penalty too) and METEOR scores the corpus at once; every other per-image key averages to it."""

IMAGE_METRICS = ("retrieval", "bags", "clipscore")
"""Groups that read image files (through the retriever)."""

CAPTION_METRICS = ("bleu", "meteor", "rouge", "cider", "spice")
"""pycocoevalcap's scorers, in its order: the default of every evaluation (``finecap eval``, :func:`finecap.evaluate`;
METEOR and SPICE when they can run)."""


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
        hint = did_you_mean(unknown[0], METRICS)
        valid = ", ".join(METRICS)
        raise ValueError(f"unknown metric(s) {', '.join(map(repr, unknown))}{hint}; valid metrics: {valid}")
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
        missing raises ``ValueError`` naming it; METEOR without pycocoevalcap's data and SPICE without Java or its jars
        are skipped with a warning.
    """
    return evaluate_items(predictions, references, metrics=metrics, retriever=retriever, images=images,
                          scenes=scenes, bags=bags, samples=samples, cfg=cfg, per_image=False)[0]  # fmt: skip


def evaluate_items(
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
    per_image: bool = True,
) -> tuple[dict[str, float], dict[Hashable, dict[str, float]]]:
    """:func:`evaluate`, and the per-image scores ``{image_id: {metric key: score}}`` of the groups that have them
    (the caption metrics; module docstring), in the order of ``predictions`` (``{}`` with ``per_image=False``).

    Example::

        >>> corpus, items = evaluate_items({1: "a red circle", 2: "two dogs"}, {1: ["a red circle"], 2: ["a cat"]},
        ...                                metrics="rouge")
        >>> corpus, items  # image 1: its reference; image 2: no word in common
        ({'ROUGE-L': 0.5}, {1: {'ROUGE-L': 1.0}, 2: {'ROUGE-L': 0.0}})
    """
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
        references={i: r if type(r) is list else list(r) for i, r in references.items()}
        if references is not None
        else None,
        cfg=cfg,
        retriever=retriever,
        images=list(images) if images is not None else None,
        scenes=scenes,
        bags={int(s): [list(b) for b in v] for s, v in bags.items()} if bags is not None else None,
        samples={i: list(s) for i, s in samples.items()} if samples is not None else None,
        requested=tuple(names),
        items={i: {} for i in predictions} if per_image else None,
    )
    out: dict[str, float] = {}
    for name in names:
        out.update({k: float(v) for k, v in METRICS[name](ctx).items()})
    return out, ctx.items if ctx.items is not None else {}
