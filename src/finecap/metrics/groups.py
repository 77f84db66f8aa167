"""The built-in metric groups: one :class:`~finecap.metrics.group.MetricGroup` record each, named in
:data:`finecap.registry.METRIC_GROUPS` (keys, inputs and per-image values: :mod:`finecap.metrics.suite`).

The columns say which way is better for every key a group writes, by ``fnmatch`` pattern; a leading ``*`` also
covers the same key under a prefix (``sample/Div-1``, ``listener/RD19/R@1``, ``family/R@1``), as the demo's tables
write them. Importing this module imports no torch: the groups of the world (faithfulness, listener), of images
(retrieval, bags, clipscore), perplexity, SPICE (Java) and hallucination (LemmInflect) import their modules when they
run.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from finecap.home import cache_dir
from finecap.metrics.diversity import caption_length, mean_length, set_diversity_per_item, vocabulary_metrics
from finecap.metrics.group import Column, MetricGroup
from finecap.metrics.ngram import ngram_metrics
from finecap.metrics.ptb_tokenize import tokenize

if TYPE_CHECKING:
    from finecap.config import Config
    from finecap.metrics.context import EvalContext

RANKS = (Column("*R@*", "higher"), Column("*mean_rank", "lower"), Column("*median_rank", "lower"))
"""The columns of every ranking: recalls at k, mean and median rank (of RD-N, the pool, bags, families, the
listener)."""


def long_caption_columns(what: str) -> tuple[Column, ...]:
    """The counts of captions longer than the retriever's text window that the groups scoring captions through it
    write (``<what>/truncated``, ``<what>/chunked``: :mod:`finecap.models.text_window`): no better direction."""
    return tuple(Column(f"{what}/{done}", None, count=True) for done in ("truncated", "chunked"))


# --------------------------------------------------------------------------------------------------------------------
# Caption metrics (pycocoevalcap's scorers)
# --------------------------------------------------------------------------------------------------------------------


def _ngram(ctx: EvalContext, group: str) -> dict[str, float]:
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


def _scored_by(ctx: EvalContext, group: str, per_item: Callable[..., tuple[dict[str, float], Mapping]]) -> dict:
    """METEOR or SPICE: ``per_item(tokenised predictions, tokenised references)``; skipped with a warning saying
    what to install when it cannot run here."""
    # METEOR's package (snowballstemmer's every language) is imported when METEOR or SPICE runs, not at start-up
    from finecap.metrics.meteor.resources import MetricUnavailable

    refs = ctx.tok_references(group)
    try:
        corpus, items = per_item(ctx.tok_predictions(), refs)
    except MetricUnavailable as e:
        warnings.warn(f"skipping {group.upper()}: {e}", stacklevel=2)
        return {}
    ctx.add_items(items, list(corpus))
    return corpus


def _meteor(ctx: EvalContext) -> dict[str, float]:
    """METEOR in Python, or the jar with ``eval.meteor_backend=java``."""
    from finecap.metrics.meteor import meteor_per_item

    e = ctx.cfg.eval
    return _scored_by(ctx, "meteor", partial(meteor_per_item, backend=e.meteor_backend, max_words=e.meteor_max_words))


def _meteor_unavailable(cfg: Config) -> str | None:
    from finecap.metrics.meteor import meteor_unavailable_reason

    return meteor_unavailable_reason(backend=cfg.eval.meteor_backend)


def _spice(ctx: EvalContext) -> dict[str, float]:
    from finecap.metrics.spice import spice_per_item

    return _scored_by(ctx, "spice", spice_per_item)


def _spice_unavailable(cfg: Config) -> str | None:
    from finecap.metrics.spice import spice_unavailable_reason

    return spice_unavailable_reason()


BLEU = MetricGroup("bleu", partial(_ngram, group="bleu"), reads=frozenset({"references"}),
                   columns=(Column("*BLEU-*", "higher"), Column("Bleu_*", "higher")),
                   not_image_means=("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4"))  # fmt: skip
"""``BLEU-1`` .. ``BLEU-4`` (``Bleu_1`` .. with pycocoevalcap's names). BLEU pools n-gram counts over the corpus
(its brevity penalty too): the mean of the per-image scores is not the corpus score."""
ROUGE = MetricGroup("rouge", partial(_ngram, group="rouge"), reads=frozenset({"references"}),
                    columns=(Column("*ROUGE*", "higher"),))  # fmt: skip
CIDER = MetricGroup("cider", partial(_ngram, group="cider"), reads=frozenset({"references"}),
                    columns=(Column("*CIDEr*", "higher"),))  # fmt: skip
METEOR = MetricGroup("meteor", _meteor, reads=frozenset({"references"}), columns=(Column("*METEOR*", "higher"),),
                     not_image_means=("METEOR",), unavailable=_meteor_unavailable)  # fmt: skip
"""METEOR scores the corpus at once: the mean of the per-image scores is not the corpus score."""
SPICE = MetricGroup("spice", _spice, reads=frozenset({"references"}), columns=(Column("*SPICE*", "higher"),),
                    unavailable=_spice_unavailable)  # fmt: skip


# --------------------------------------------------------------------------------------------------------------------
# Text statistics and diversity
# --------------------------------------------------------------------------------------------------------------------


def _length(ctx: EvalContext) -> dict[str, float]:
    if ctx.items is not None:  # (plain `finecap eval` asks for none: no second count of every caption)
        ctx.add_items({i: {"Length": caption_length(c)} for i, c in ctx.predictions.items()}, ["Length"])
    return {"Length": mean_length(ctx.predictions.values())}


def _vocab(ctx: EvalContext) -> dict[str, float]:
    out = vocabulary_metrics(ctx.predictions, min_count=ctx.cfg.eval.vocab_min_count)
    return {k: out[k] for k in ("Lexical diversity", "Vocab usage")}


def _diversity(ctx: EvalContext) -> dict[str, float]:
    from finecap.metrics.faithfulness import scene_of

    samples = ctx.need("samples", "diversity", "pass several sampled captions per image ({id: [caption, ...]})")
    mine = {i: caps for i in ctx.predictions if (caps := scene_of(i, samples)) is not None}  # the evaluated images'
    if not mine:
        raise ValueError("samples: none is of a predicted image (the images evaluated are those of the predictions)")
    missing = [i for i in ctx.predictions if i not in mine]
    if missing:  # a mean over the images that have samples would pass for the predictions' (faithfulness refuses too)
        raise ValueError(f"samples: none for {len(missing)} of the {len(ctx.predictions)} predicted images, e.g. "
                         f"{missing[:5]}; Div-1, Div-2 and mBLEU-4 average over every predicted image")  # fmt: skip
    corpus, per = set_diversity_per_item({i: [tokenize(c) for c in caps] for i, caps in mine.items()})
    # Div-n is the mean of its per-image values; mBLEU-4 is not (corpus BLEU per sample round), so it has none
    ctx.add_items({i: {"Div-1": v["Div-1"], "Div-2": v["Div-2"]} for i, v in per.items()}, ["Div-1", "Div-2"])
    return corpus


LENGTH = MetricGroup("length", _length, columns=(Column("*Length", None),))
"""Mean words per caption: longer is not better in itself."""
VOCAB = MetricGroup("vocab", _vocab, columns=(Column("*Lexical diversity", "higher", count=True),
                                              Column("*Vocab usage", "higher", count=True)))  # fmt: skip
DIVERSITY = MetricGroup("diversity", _diversity, reads=frozenset({"samples"}),
                        columns=(Column("*Div-*", "higher"), Column("*mBLEU-*", "lower")))  # fmt: skip
"""Distinct n-grams among an image's samples (higher: more diverse) and their self-BLEU (lower: less alike)."""


# --------------------------------------------------------------------------------------------------------------------
# The world's scene graphs
# --------------------------------------------------------------------------------------------------------------------


def _faithfulness(ctx: EvalContext) -> dict[str, float]:
    from finecap.metrics.faithfulness import faithfulness_per_item

    scenes = ctx.need("scenes", "faithfulness", "scene graphs exist only for the world (scenes.jsonl)")
    corpus, items = faithfulness_per_item(ctx.predictions, scenes)
    keys = ["faith/precision", "faith/recall", "faith/facts", "faith/no_facts", "faith/halluc_rate"]
    ctx.add_items({i: {"faith/precision": f.precision, "faith/recall": f.recall, "faith/facts": f.n_stated,
                       "faith/no_facts": float(f.n_stated == 0), "faith/halluc_rate": float(bool(f.hallucinated))}
                   for i, f in items.items()}, keys)  # fmt: skip
    return corpus


def _listener(ctx: EvalContext) -> dict[str, float]:
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


FAITHFULNESS = MetricGroup(
    "faithfulness", _faithfulness, reads=frozenset({"world"}),
    columns=(Column("*halluc_rate", "lower"), Column("*hallucinated", "lower", count=True),
             Column("*halluc/*", "lower", count=True), Column("faith/facts", None), Column("faith/no_facts", None),
             Column("*precision*", "higher"), Column("*recall*", "higher")),
)  # fmt: skip
"""Precision and recall of the stated facts, hallucinations (counts and the share of captions with one); facts
stated per caption and the share of captions stating none have no better direction."""
LISTENER = MetricGroup("listener", _listener, reads=frozenset({"world"}),
                       columns=(Column("*tie_rate", "lower"), Column("*exploit", "lower"), *RANKS))  # fmt: skip
"""The fact-based listener's recalls; its ties (it cannot tell the target from a distractor) and ``exploit`` (the
retriever is right where the facts do not say so) are lower-is-better."""


# --------------------------------------------------------------------------------------------------------------------
# Objects of real images (COCO's instance annotations)
# --------------------------------------------------------------------------------------------------------------------


def _hallucination(ctx: EvalContext) -> dict[str, float]:
    """CHAIR and object recall against the instance annotations (and the references' objects, when given)."""
    from finecap.metrics.hallucination import chair

    hint = "pass a COCO instances_*.json (finecap eval --instances FILE, or eval.instances)"
    objects = ctx.need("instances", "hallucination", hint)
    corpus, items = chair(ctx.predictions, objects, ctx.references, source="hallucination (instances)")
    ctx.add_items({i: c.scores() for i, c in items.items()}, ["CHAIRs", "CHAIRi", "chair/recall", "chair/objects"])
    return corpus


HALLUCINATION = MetricGroup("hallucination", _hallucination, reads=frozenset({"instances"}),
                            columns=(Column("*CHAIR*", "lower"), Column("*chair/recall", "higher"),
                                     Column("*chair/objects", None)),
                            not_image_means=("CHAIRi",))  # fmt: skip
"""CHAIRs, CHAIRi (lower: fewer hallucinated objects), object recall (higher) and object mentions per caption (no
direction), :mod:`finecap.metrics.hallucination`. CHAIRi pools mentions over the corpus: the mean of the per-image
values is not the corpus value."""


# --------------------------------------------------------------------------------------------------------------------
# Images, through the retriever
# --------------------------------------------------------------------------------------------------------------------


def _retrieval(ctx: EvalContext) -> dict[str, float]:
    from finecap.metrics import retrieval as r

    sr, ids, scores = ctx.retrieval_scores("retrieval")
    targets = np.array([sr.column[i] for i in ids], dtype=np.int64)
    e = ctx.cfg.eval
    rd = r.rd_ranks(scores, targets, e.n_distractors, e.draws, e.seed)  # (draws, Q): drawn once, for both uses
    out = {f"RD{e.n_distractors}/{k}": v for k, v in r.rd_summary(rd, e.n_distractors).items()}
    out.update({f"pool/{k}": v for k, v in r.pool_retrieval(scores, targets).items()})
    out.update(ctx.long_captions())  # captions longer than the retriever's text window, when any
    if ctx.items is not None:  # the per-image values of the means (R@k, mean rank; RD-N's averaged over draws)
        pool = r.target_ranks(scores, targets)  # (Q,)
        # the corpus values' recalls (rd_summary and pool_retrieval noted those they left out)
        for name, ranks, candidates in (
            (f"RD{e.n_distractors}", rd, e.n_distractors + 1),
            ("pool", pool, scores.shape[1]),
        ):
            per_image = r.rank_items(ranks, r.recall_ks(r.KS, candidates))
            ctx.add_items({i: {f"{name}/{k}": v[q] for k, v in per_image.items()} for q, i in enumerate(ids)},
                          [f"{name}/{k}" for k in per_image])  # fmt: skip
    return out


def _bags(ctx: EvalContext) -> dict[str, float]:
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
    return out | ctx.long_captions()


def _clipscore(ctx: EvalContext) -> dict[str, float]:
    from finecap.metrics.clipscore import CLIPScore

    images = ctx.need("images", "clipscore", "pass the image records")
    scorer = CLIPScore(ctx.get_retriever(), images, cache_dir=cache_dir(ctx.cfg.run))
    # RefCLIPScore when references are given, of every predicted image (refused, as the n-gram groups, otherwise)
    refs = ctx.predicted_references("clipscore") if ctx.references is not None else None
    corpus, items = scorer.corpus_and_items(ctx.predictions, refs)
    ctx.add_items(items, ["CLIPScore", "RefCLIPScore"])  # not ClipSc: its corpus value is the mean clipped at 0
    return corpus


RETRIEVAL = MetricGroup("retrieval", _retrieval, reads=frozenset({"images"}),
                        columns=(*RANKS, *long_caption_columns("retrieval")))  # fmt: skip
BAGS = MetricGroup("bags", _bags, reads=frozenset({"images", "bags"}),
                   columns=(*RANKS, Column("*/n", None, count=True), *long_caption_columns("retrieval")))  # fmt: skip
"""TrueMatch recalls and ranks per bag size, and the captions counted (``bag3/n``)."""
CLIPSCORE = MetricGroup("clipscore", _clipscore, reads=frozenset({"images"}),
                        columns=(Column("*CLIPScore*", "higher"), Column("*ClipSc*", "higher"),
                                 *long_caption_columns("clipscore")))  # fmt: skip


# --------------------------------------------------------------------------------------------------------------------
# A language model
# --------------------------------------------------------------------------------------------------------------------


def _perplexity(ctx: EvalContext) -> dict[str, float]:
    if not ctx.cfg.eval.lm:
        raise ValueError("metric 'perplexity' needs a language model: set eval.lm=<causal LM name or path>")
    # Deferred: perplexity runs a causal LM (torch + transformers); text-only evaluation must not import them.
    from finecap.metrics.perplexity import Perplexity
    from finecap.models.memory import eval_device

    return Perplexity(ctx.cfg.eval.lm, batch_size=ctx.cfg.eval.batch_size, device=eval_device(ctx.cfg))(
        ctx.predictions
    )


PERPLEXITY = MetricGroup("perplexity", _perplexity, reads=frozenset({"lm"}),
                         columns=(Column("perplexity/tokens", None, count=True),
                                  Column("perplexity/truncated", None, count=True),
                                  Column("*perplexity*", "lower")))  # fmt: skip
"""The LM's perplexity and mean token loss (lower: more fluent); the tokens counted have no direction."""
