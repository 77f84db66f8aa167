"""Evaluation of captions: metric groups chosen by name, computed together with shared intermediate results.

:func:`evaluate` computes metric *groups* for in-memory captions; the ``finecap eval`` command
(:mod:`finecap.app.eval`) reads files and calls it. Groups are chosen by name from :data:`METRICS`, the records
(:class:`~finecap.metrics.group.MetricGroup`, in :mod:`finecap.metrics.groups`) that
:data:`finecap.registry.METRIC_GROUPS` names, or by the dotted path of a user's own record (``"pkg.module:GROUP"``);
an unknown name raises ``ValueError`` listing the valid ones:

=============  =====================================================  ======================================
group          keys                                                   needs
=============  =====================================================  ======================================
bleu           ``BLEU-1`` .. ``BLEU-4``                               references
rouge          ``ROUGE-L``                                            references
cider          ``CIDEr-D``                                            references
meteor         ``METEOR`` (optional: skipped with a warning without   references, pycocoevalcap's data (no
               pycocoevalcap's data; no Java with the default         Java; ``eval.meteor_backend=java``: Java)
               ``eval.meteor_backend=python``)
spice          ``SPICE`` (optional, likewise)                         references, Java + SPICE jars
length         ``Length`` (mean words per caption)                    --
vocab          ``Lexical diversity`` (distinct words), ``Vocab        --
               usage`` (words used >= ``eval.vocab_min_count`` = 5
               times, NDLB Table 6)
diversity      ``Div-1``, ``Div-2``, ``mBLEU-4``                      ``samples`` (>= 2 captions per image)
faithfulness   ``faith/precision``, ``faith/recall``, hallucination   scene graphs (the world)
               counts (:mod:`finecap.metrics.faithfulness`)
retrieval      ``RD{N}/R@1,5,10``, ``mean_rank``, ``median_rank``     images + retriever
               (N = ``eval.n_distractors`` random distractors,
               ``eval.draws`` draws) and ``pool/...`` (the whole
               image pool)
bags           ``bag{s}/R@1``, ``mean_rank``, ``median_rank``,        images + retriever + bags
               ``n`` per bag size s (TrueMatch)
clipscore      ``CLIPScore``, ``RefCLIPScore``, ``ClipSc`` (NDLB)     images + retriever (+ references)
listener       ``listener/RD{N}/R@1``, ``listener/bag{s}/R@1``, tie   scene graphs (+ bags; + images and
               rate, ``exploit`` (:mod:`finecap.metrics.listener`)    retriever for ``exploit``)
perplexity     ``perplexity``, ``perplexity/nll``, ...                ``eval.lm`` (a causal LM)
hallucination  ``CHAIRs``, ``CHAIRi``, ``chair/recall``,              COCO instance annotations (``instances``
               ``chair/objects`` (CHAIR, object recall:               or ``eval.instances``; + references)
               :mod:`finecap.metrics.hallucination`)
=============  =====================================================  ======================================

Text handling: the n-gram metrics, METEOR, SPICE, length, vocabulary and diversity metrics see PTB-tokenised text
(:func:`finecap.metrics.ptb_tokenize.tokenize`: lower-cased, punctuation removed), as pycocoevalcap does;
faithfulness, the CLIP metrics, perplexity and hallucination (which splits and lemmatises them itself) see the
captions as written. Recalls are fractions in ``[0, 1]``,
ranks start at 1. The images evaluated are those of ``predictions`` (like pycocoevalcap); extra references are
ignored, but the retrieval pool is every image given in ``images``. Every group that reads references (the n-gram
groups, METEOR, SPICE, and ``clipscore`` for ``RefCLIPScore`` when references are given) refuses a predicted image
with none, naming it.

The ``length`` and ``vocab`` groups count words with :func:`finecap.metrics.diversity.caption_words`, the one
definition of a caption's words (the ``captions`` training validator uses it too).

Per-image scores: :func:`evaluate_items` also returns ``{image_id: {metric key: score}}`` for the groups that have
them: the caption metrics (``bleu``, ``meteor``, ``rouge``, ``cider``, ``spice``), as pycocoevalcap's
``COCOEvalCap.imgToEval`` holds them (SPICE's entry is its F-score), and the per-image values whose mean is the corpus
value: ``Length``; ``Div-1`` and ``Div-2`` (of the image's sampled captions); ``faith/precision``, ``faith/recall``,
``faith/facts``, ``faith/no_facts`` (1 when the caption states no fact), ``faith/halluc_rate`` (1 when the caption
states a false fact); ``RD{N}/R@k`` (the share of the
``eval.draws`` draws in which the image ranks in the top k), ``RD{N}/mean_rank``, ``pool/R@k`` (1 or 0),
``pool/mean_rank``; ``bag{s}/R@k`` and ``bag{s}/mean_rank`` for the images in a bag of size s; ``CLIPScore`` and
``RefCLIPScore``; ``CHAIRs``, ``CHAIRi`` (the caption's own share), ``chair/objects`` and ``chair/recall`` (for
images with annotated objects). Of the per-image keys, only those of :data:`NOT_IMAGE_MEANS` do not average to their
corpus value.
Keys with no per-image value: the medians and counts (``median_rank``, ``bag{s}/n``, ``faith/hallucinated``,
``faith/halluc/<kind>``, ``retrieval/truncated`` and ``clipscore/truncated``: captions longer than the retriever's
text window, written only when there is one, :mod:`finecap.models.text_window`), the pooled or set-level scores
(``faith/precision_micro``, ``ClipSc``, whose corpus mean is clipped at 0, ``Lexical diversity``, ``Vocab usage``,
``mBLEU-4``, ``perplexity``: the exponential of the mean token loss) and the ``listener`` group.

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

from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from finecap.config import did_you_mean, load
from finecap.data.bags_file import check_bag_size
from finecap.data.records import id_keys, refuse_repeated_ids
from finecap.metrics.context import EvalContext
from finecap.metrics.group import MetricGroup, metric_group
from finecap.metrics.items import corpus_only
from finecap.registry import METRIC_GROUPS, is_dotted_path

if TYPE_CHECKING:
    from finecap.config import Config
    from finecap.data.records import Record
    from finecap.judges.base import Question
    from finecap.world.scene import Scene

Predictions = Mapping[Hashable, str]
References = Mapping[Hashable, Sequence[str]]


METRICS: dict[str, MetricGroup] = {name: metric_group(name, "METRIC_GROUPS") for name in METRIC_GROUPS}
"""The built-in metric groups by name (:data:`finecap.registry.METRIC_GROUPS`; their records in
:mod:`finecap.metrics.groups`; the module docstring lists their keys and inputs)."""

NOT_IMAGE_MEANS = tuple(key for group in METRICS.values() for key in group.not_image_means)
"""Per-image keys of :func:`evaluate_items` whose mean is not the corpus value: BLEU pools n-gram counts over the
corpus (its brevity penalty too) and METEOR scores the corpus at once; every other per-image key averages to it."""

IMAGE_METRICS = tuple(name for name, group in METRICS.items() if "images" in group.reads)
"""Groups that read image files (through the retriever)."""

CAPTION_METRICS = ("bleu", "meteor", "rouge", "cider", "spice")
"""pycocoevalcap's scorers, in its order: the default of every evaluation (``finecap eval``, :func:`finecap.evaluate`;
METEOR and SPICE when they can run)."""


def unavailable_reason(group: str, cfg: Config | None = None) -> str | None:
    """Why the metric ``group`` cannot run on this machine (its record's ``unavailable``: METEOR with
    ``eval.meteor_backend`` needs pycocoevalcap's data, or Java and the jar; SPICE Java and its jars), or ``None``."""
    check = metric_group(group).unavailable
    return check(cfg if cfg is not None else load(None)) if check is not None else None


def parse_metrics(
    metrics: str | Sequence[str] | None, default: Sequence[str] = (), option: str = "metrics"
) -> list[str]:
    """Metric group names from ``"a,b"`` or a list (default ``default``): names of :data:`METRICS` or dotted paths
    of a user's :class:`~finecap.metrics.group.MetricGroup` (``"pkg.module:GROUP"``, imported here so that a wrong
    one fails before any work). Unknown names list the valid ones; errors name ``option``."""
    if metrics is None:
        names = list(default)
    elif isinstance(metrics, str):
        names = [m.strip() for m in metrics.split(",") if m.strip()]
    else:
        names = [str(m).strip() for m in metrics]
    unknown = [m for m in names if m not in METRICS and not is_dotted_path(m)]
    if unknown:
        hint = did_you_mean(unknown[0], METRICS)
        valid = ", ".join(METRICS)
        raise ValueError(
            f"{option}: unknown metric(s) {', '.join(map(repr, unknown))}{hint}; valid metrics: {valid} "
            "(or a dotted path 'pkg.module:GROUP')"
        )
    if not names:
        raise ValueError(f"{option}: no metrics to compute; valid metrics: {', '.join(METRICS)}")
    for name in names:
        if is_dotted_path(name):
            metric_group(name, option)
    return list(dict.fromkeys(names))


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
    instances: str | Path | Mapping[Hashable, frozenset[str]] | None = None,
    questions: Mapping[Hashable, Sequence[Question]] | None = None,
    cfg: Config | None = None,
    per_image: bool = True,
    about: dict[str, Any] | None = None,
) -> tuple[dict[str, float], dict[Hashable, dict[str, float]]]:
    """:func:`evaluate`, and the per-image scores ``{image_id: {metric key: score}}`` of the groups that have them
    (the caption metrics; module docstring), in the order of ``predictions`` (``{}`` with ``per_image=False``).
    ``about``, when given, is filled with what made the scores beyond ``cfg``: ``about["judge"]``, when a
    judge-backed group ran, the judge's record (:func:`finecap.metrics.judged.judge_record`: name, model, noise,
    seed, shuffles, ...), which ``finecap eval`` writes beside the scores.

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
    for size, size_bags in (bags or {}).items():  # a bag of 3 under 5 would be scored, and overwrite, as bag3
        for j, bag in enumerate(size_bags):
            check_bag_size(int(size), list(bag), f"bags[{size!r}][{j}]")
    keyed = {"references": references, "questions": questions, "predictions": predictions, "samples": samples,
             "scenes": scenes, "instances": instances if isinstance(instances, Mapping) else None}  # fmt: skip
    for what, given in keyed.items():  # 1 and "1": one image, scored once (which one scores: no silent choice)
        if given is not None:
            refuse_repeated_ids(given, what)
    if images is not None:
        refuse_repeated_ids([r.image_id for r in images], "images")
    predictions, samples = _as_given_ids(predictions, samples, references, images)
    groups = [metric_group(name) for name in names]
    reads_instances = any("instances" in g.reads for g in groups)  # a file of ~160 MB: read only when asked for
    if reads_instances and (isinstance(instances, (str, Path)) or (instances is None and cfg.eval.instances)):
        from finecap.metrics.hallucination import read_instances

        option = "instances" if instances is not None else "eval.instances"
        instances = read_instances(instances if instances is not None else cfg.eval.instances, option)
    ctx = EvalContext(
        predictions=dict(predictions),
        references=caption_lists(references, "references") if references is not None else None,
        cfg=cfg,
        retriever=retriever,
        images=list(images) if images is not None else None,
        scenes=scenes,
        bags={int(s): [list(b) for b in v] for s, v in bags.items()} if bags is not None else None,
        samples=caption_lists(samples, "samples") if samples is not None else None,
        instances=instances,
        questions=questions,
        requested=tuple(names),
        items={i: {} for i in predictions} if per_image else None,
    )
    out: dict[str, float] = {}
    try:
        for group in groups:
            out.update({k: float(v) for k, v in group.compute(ctx).items()})
    finally:
        ctx.close()
    if about is not None:
        about.update(ctx.about)
    return out, ctx.items if ctx.items is not None else {}


def _as_given_ids(
    predictions: Predictions,
    samples: Mapping[Hashable, Sequence[str]] | None,
    references: References | None,
    images: Sequence[Record] | None,
) -> tuple[Predictions, Mapping[Hashable, Sequence[str]] | None]:
    """``predictions`` and ``samples`` keyed by the ids of the references (else of the images) as those write them,
    an int and its string being one id (:func:`finecap.data.records.id_keys`): every group then reads one id per
    image, and the per-image scores carry the references' ids. An id naming none is kept as written (the groups that
    need it say so); the caller has refused two naming one image (``1`` and ``"1"``: :func:`refuse_repeated_ids`)."""
    keys = references if references is not None else [r.image_id for r in images] if images is not None else None
    if keys is None:
        return predictions, samples
    found, _ = id_keys(predictions, keys)
    if all(i == k and type(i) is type(k) for i, k in found.items()):
        return predictions, samples
    rekeyed = {found.get(i, i): caption for i, caption in predictions.items()}
    if samples is not None:
        of_samples, _ = id_keys(samples, keys)
        samples = {of_samples.get(i, i): caps for i, caps in samples.items()}
    return rekeyed, samples


def caption_lists(given: Mapping[Hashable, Sequence[str]], what: str) -> dict[Hashable, list[str]]:
    """``{image_id: [captions]}`` of ``given`` (references, samples); a ``TypeError`` naming the image for a string
    (``list`` would split it into its characters, and every score would be of letters)."""
    out = {}
    for i, captions in given.items():
        if isinstance(captions, str):
            raise TypeError(f"{what}[{i!r}]: expected a list of captions, got a string")
        out[i] = captions if type(captions) is list else list(captions)
    return out


@corpus_only(evaluate_items, per_image=False)
def evaluate() -> dict[str, float]:
    """Compute the metric groups ``metrics`` (names of :data:`METRICS`) for ``{image_id: caption}`` predictions.

    Args:
        predictions: ``{image_id: caption}``.
        references: ``{image_id: [reference captions]}`` (for n-gram metrics, METEOR, SPICE, RefCLIPScore); one key
            per image (``1`` and ``"1"`` both, here or in ``questions``, are a ``ValueError``).
        metrics: group names (or dotted paths of :class:`~finecap.metrics.group.MetricGroup` records), as a list or
            ``"a,b,c"``.
        retriever: a :class:`~finecap.models.retriever.Retriever`; default: the configured one (``retriever.*``),
            loaded only when a CLIP metric is asked for.
        images: records (``image_id``, ``path``) of the retrieval pool; must include every predicted image.
        scenes: ``{image_id: Scene}`` for ``faithfulness``.
        bags: ``{size: [[image_id, ...], ...]}`` (or a plain list of bags) for ``bags``; a bag listed under another
            size than its number of images is refused.
        samples: ``{image_id: [sampled captions]}`` for ``diversity`` (every predicted image needs its own).
        instances: a COCO ``instances_*.json`` (or its ``{image_id: categories}``,
            :func:`finecap.metrics.hallucination.read_instances`) for ``hallucination``; default ``eval.instances``.
        questions: ``{image_id: [Question]}``, the data set's own questions
            (:func:`finecap.judges.questions.questions_of` of its records) for ``qa``, read before ``judge.questions``
            and the scenes, as the ``qa_utility`` reward reads them (:func:`finecap.judges.questions.pick_questions`).
        about: a dict filled with what made the scores beyond ``cfg`` (:func:`evaluate_items`: the judge).
        cfg: configuration (``eval.*``, ``run.cache_dir``, ``retriever.*``); default: the defaults.

    Returns:
        ``{metric key: value}`` in the order of the groups asked for (module docstring). A group whose input is
        missing raises ``ValueError`` naming it; METEOR without pycocoevalcap's data and SPICE without Java or its jars
        are skipped with a warning.
    """
