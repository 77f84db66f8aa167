"""METEOR 1.5 as pycocoevalcap computes it (``meteor-1.5.jar -l en -norm``), in Python: no Java needed.

:func:`meteor_per_item` returns the corpus score (key ``METEOR``, from the pooled statistics as the jar's ``EVAL``
computes it: not the mean of the per-image scores) and each image's score, equal to pycocoevalcap's
``Meteor().compute_score``. Input captions should be tokenised like the other metrics'
(:func:`finecap.metrics.ptb_tokenize.ptb_tokenize`), as ``COCOEvalCap`` does.

Backends (``backend=``, ``eval.meteor_backend`` in the configuration):

- ``python`` (default): this package. It reads the jar's data at run time from the installed pycocoevalcap (the
  WordNet synonyms, irregular forms, function words and non-breaking prefixes inside ``meteor-1.5.jar``, read as a
  zip file, and the paraphrase table ``data/paraphrase-en.gz`` beside it); nothing of it is copied into finecap. The
  first run builds an index of the paraphrase table in the finecap home (:mod:`~finecap.metrics.meteor.resources`).
  The modules, in the order of the computation: :mod:`~finecap.metrics.meteor.inputs` (what the jar reads),
  :mod:`~finecap.metrics.meteor.normalize`, :mod:`~finecap.metrics.meteor.stemmer`,
  :mod:`~finecap.metrics.meteor.match`, :mod:`~finecap.metrics.meteor.align`,
  :mod:`~finecap.metrics.meteor.score`; :mod:`~finecap.metrics.meteor.scorer` ties them together.
- ``java``: the jar itself, one JVM per evaluation (:mod:`~finecap.metrics.meteor.jar`); the test suite's oracle.

When the data (or, for ``java``, a Java runtime) is missing, :func:`meteor` raises :class:`MetricUnavailable`
saying what to install; callers that evaluate several metrics catch it (or ask :func:`meteor_unavailable_reason`
first) and carry on::

    try:
        scores.update(meteor(preds, refs))
    except MetricUnavailable as e:
        log.warning("skipping METEOR: %s", e)

The jar is looked up in ``$FINECAP_METEOR_JAR``, then in the installed ``pycocoevalcap`` package (found without
importing it); its ``data/paraphrase-en.gz`` must sit next to it.

How exact: the differential tests (``tests/metrics/test_meteor_jar.py``) compare every segment's 23 statistics and
score and the corpus score with the jar's, with ``==``, and the alignment search's kept matches with the jar's own
(``-writeAlignments``) at beam sizes 1 to 40. They agree on every case: COCO-like captions (5 references or 1),
the specification's stress cases (empty captions, Unicode, spaces, contractions, abbreviations, hash collisions),
repeated phrases and 40-100-word captions, human-style captions, and pycocoevalcap's own ``Meteor`` class.
"""

from __future__ import annotations

import typing
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path

from finecap.config import MeteorBackend
from finecap.metrics.meteor.inputs import MAX_WORDS, check_inputs, check_lengths
from finecap.metrics.meteor.jar import jar_per_item, java_unavailable_reason
from finecap.metrics.meteor.resources import (
    METEOR_ENV,
    MetricUnavailable,
    PendingIndex,
    data_unavailable_reason,
    find_meteor_jar,
    read_jar_data,
)
from finecap.metrics.meteor.score import corpus_score, segment_score
from finecap.metrics.meteor.scorer import MeteorScorer

__all__ = [
    "BACKENDS",
    "METEOR_ENV",
    "MetricUnavailable",
    "find_meteor_jar",
    "meteor",
    "meteor_per_item",
    "meteor_scorer",
    "meteor_unavailable_reason",
]

BACKENDS: tuple[str, ...] = typing.get_args(MeteorBackend)
"""``python`` (default) and ``java``."""

_SCORERS: dict[tuple[Path, str], MeteorScorer] = {}


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"METEOR backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")


def meteor_unavailable_reason(
    jar: str | Path | None = None, java: str = "java", backend: str = "python"
) -> str | None:
    """Why METEOR cannot run here with ``backend`` (``None`` when it can)."""
    _check_backend(backend)
    if backend == "java":
        return java_unavailable_reason(jar, java)
    return data_unavailable_reason(jar)


def meteor_scorer(jar: str | Path | None = None, cache_root: str | Path | None = None) -> MeteorScorer:
    """The Python scorer with the data of ``jar`` (default: pycocoevalcap's), loaded once per process (the
    paraphrase index in a thread, waited for by the scorer's first ``prepare``).

    Raises :class:`MetricUnavailable` when the jar or the paraphrase table is missing.
    """
    reason = data_unavailable_reason(jar)
    if reason is not None:
        raise MetricUnavailable(reason)
    path = find_meteor_jar(jar)
    assert path is not None
    key = (path.resolve(), str(cache_root))
    scorer = _SCORERS.get(key)
    if scorer is None or scorer.failed:  # a failed load (e.g. a full disk) is tried again
        index = PendingIndex(path, cache_root)  # loads (the first time: builds) the index while the data is read
        scorer = _SCORERS[key] = MeteorScorer(read_jar_data(path), index)
    return scorer


def meteor_per_item(
    predictions: Mapping[Hashable, str],
    references: Mapping[Hashable, Sequence[str]],
    *,
    backend: str = "python",
    jar: str | Path | None = None,
    java: str = "java",
    memory: str = "2G",
    timeout: float | None = 3600.0,
    processes: int | None = None,
    cache_root: str | Path | None = None,
    max_words: int = MAX_WORDS,
) -> tuple[dict[str, float], dict[Hashable, dict[str, float]]]:
    """Corpus METEOR (key ``METEOR``) and per-image METEOR, as pycocoevalcap's ``Meteor().compute_score``.

    Args:
        predictions: ``{image_id: caption}``.
        references: ``{image_id: [reference captions]}`` (extra ids are ignored).
        backend: ``python`` or ``java`` (module docstring).
        jar: the METEOR jar (default ``$FINECAP_METEOR_JAR``, else pycocoevalcap's).
        java, memory, timeout: the ``java`` backend's runtime, heap and time limit (seconds).
        processes: worker processes of the ``python`` backend (default: the usable CPUs, at most 8; 1 = none).
        cache_root: folder of the ``python`` backend's paraphrase index (default ``<finecap home>/cache/meteor``).
        max_words: the longest caption or reference scored, in words (``eval.meteor_max_words``;
            :func:`~finecap.metrics.meteor.inputs.check_lengths`).

    Raises :class:`MetricUnavailable` when the data (or Java) is missing, ``ValueError`` for inputs that do not fit
    (a caption or reference longer than ``max_words`` included).

    Example (not a doctest: it reads pycocoevalcap's data and the finecap home; ``tests/metrics/test_meteor.py`` checks
    it, and the jar gives the same)::

        corpus, per = meteor_per_item({1: "a dog runs on grass"}, {1: ["a dog running on the grass"]})
        corpus["METEOR"], per[1]["METEOR"]  # 0.4139..., 0.4139... (one image: the corpus score is its score)
    """
    _check_backend(backend)
    ids, preds, refs = check_inputs(predictions, references)
    check_lengths(ids, preds, refs, max_words)
    if backend == "java":
        return jar_per_item(predictions, references, jar=jar, java=java, memory=memory, timeout=timeout)
    scorer = meteor_scorer(jar, cache_root)
    stats = scorer.score_all(preds, refs, processes=processes)
    return {"METEOR": corpus_score(stats)}, {i: {"METEOR": segment_score(st)} for i, st in zip(ids, stats)}


def meteor(
    predictions: Mapping[Hashable, str], references: Mapping[Hashable, Sequence[str]], **kwargs
) -> dict[str, float]:
    """Corpus METEOR (key ``METEOR``); see :func:`meteor_per_item` for the options and errors."""
    return meteor_per_item(predictions, references, **kwargs)[0]
