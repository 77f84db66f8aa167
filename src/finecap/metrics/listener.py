"""Listener retrieval: self-retrieval with the fact-based listener (:mod:`finecap.world.listener`) in place of CLIP.

The same protocols as :mod:`finecap.metrics.retrieval`, on the same candidates: RD-N uses exactly the retriever's
distractor draws (draw ``d`` from ``numpy.random.default_rng((seed, d))`` over the same pool columns and targets,
:func:`finecap.metrics.retrieval.random_distractors`), and bags are the same TrueMatch bags. Only the scorer
differs: each candidate's scene graph is scored by the caption's stated facts (true +1, false -1), ties broken at
random. Keys (``<p>`` is ``RD{N}`` or ``bag{s}``):

- ``listener/<p>/R@1`` (and ``R@5`` for RD-N with ``N >= 5``, where it can fail:
  :func:`~finecap.metrics.retrieval.recall_ks`): with the drawn tie-break (``default_rng((seed, d, 1))`` for draw
  ``d``, ``default_rng((seed, s, 2))`` for bags of size ``s``).
- ``listener/<p>/R@1_expected``: the same in expectation over tie-breaks (``1 / (1 + tied)`` when nothing beats the
  target), free of tie-break noise.
- ``listener/<p>/tie_rate``: share of captions whose target is tied for first place with another candidate (the
  listener had to guess): high when captions state little.
- ``listener/<p>/exploit`` (when the retriever's scores are given): share of captions the *retriever* ranks first
  but the listener does not (expected over tie-breaks): the caption carries what the retriever uses, not facts a
  reader could use. ``retriever R@1 - listener R@1_expected`` is this minus the reverse case.

Example::

    >>> from finecap.world.scene import Obj, Scene
    >>> scenes = {0: Scene(0, "grass", [Obj("circle", "red", "large", 1, 1)]),
    ...           1: Scene(1, "sand", [Obj("circle", "red", "large", 1, 1)]),
    ...           2: Scene(2, "sand", [Obj("square", "blue", "large", 1, 1)])}
    >>> out = listener_retrieval({0: "a red circle", 2: "a blue square"}, scenes, [0, 1, 2], n_distractors=2)
    >>> out["listener/RD2/R@1_expected"], out["listener/RD2/tie_rate"]   # caption 0 ties with scene 1: 1/2
    (0.75, 0.5)
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from finecap.data.bags_file import check_bag_size
from finecap.data.records import id_keys, refuse_repeated_ids, some_ids
from finecap.metrics.faithfulness import scene_of
from finecap.metrics.retrieval import bag_columns, random_distractors, recall_ks, target_ranks
from finecap.world.listener import RankResult, rank_with_ties, support_matrix

if TYPE_CHECKING:
    from finecap.world.scene import Scene

__all__ = ["listener_retrieval"]


def _summary(prefix: str, results: list[RankResult], ks: Sequence[int], retriever_first: list[np.ndarray] | None):
    out = {f"{prefix}/R@{k}": float(np.mean([(r.ranks <= k).mean() for r in results])) for k in ks}
    out[f"{prefix}/R@1_expected"] = float(np.mean([r.expected_r1.mean() for r in results]))
    out[f"{prefix}/tie_rate"] = float(np.mean([r.top_tie.mean() for r in results]))
    if retriever_first is not None:
        pairs = zip(retriever_first, results, strict=True)
        out[f"{prefix}/exploit"] = float(np.mean([(f * (1.0 - r.expected_r1)).mean() for f, r in pairs]))
    return out


def listener_retrieval(
    predictions: Mapping[Hashable, str],
    scenes: Mapping[Hashable, Scene],
    image_ids: Sequence[Hashable],
    n_distractors: int = 99,
    draws: int = 3,
    seed: int = 0,
    bags: Mapping[int, Sequence[Sequence[Hashable]]] | None = None,
    retriever_scores: Any = None,
) -> dict[str, float]:
    """Listener R@k against random distractors and in bags (module docstring for the keys).

    Args:
        predictions: ``{image_id: caption}``, one query per image in this order (as :class:`SelfRetrieval`); an id
            and the pool's may be an int and its string (:func:`~finecap.data.records.id_keys`).
        scenes: ``{image_id: Scene}`` of every pool image.
        image_ids: the pool, in the retriever's column order (the retrieval records' ids), so the distractor draws
            are the retriever's.
        n_distractors, draws, seed: RD-N settings (``eval.*``).
        bags: ``{size: [[image_id, ...], ...]}`` TrueMatch bags, or None. A bag with an image not in the pool or
            one twice is a ``ValueError`` naming it (``bags[5][0]``), as in the retriever's bag metric
            (:func:`finecap.metrics.retrieval.bag_columns`), so the two score the same captions; so is a bag whose
            number of images is not its size.
        retriever_scores: the retriever's ``(Q, N)`` scores of the same queries and columns, for ``exploit``.

    No caption is a ``ValueError``, as in the retriever's metrics (a mean of none would be NaN); so are two
    predictions, pool images or scenes keyed by ids naming one image (``1`` and ``"1"``:
    :func:`~finecap.data.records.refuse_repeated_ids`).
    """
    if not predictions:
        raise ValueError("listener: no captions to rank")
    for what, given in (("predictions", predictions), ("pool", image_ids), ("scenes", scenes)):
        refuse_repeated_ids(given, f"listener {what}")  # 1 and "1": one image, ranked (or a candidate) once
    column = {i: c for c, i in enumerate(image_ids)}
    found, missing = id_keys(predictions, column)  # 1 and "1": one image
    if missing:
        raise KeyError(f"listener: predictions for images not in the retrieval pool, e.g. {missing[:5]}; its ids are "
                       f"e.g. {some_ids(column)}")  # fmt: skip
    pool = []
    for i in image_ids:
        scene = scene_of(i, scenes)
        if scene is None:
            raise ValueError(f"listener: no scene graph for pool image {i!r} (the listener needs the world's scenes)")
        pool.append(scene)
    ids = list(predictions)
    support = support_matrix([predictions[i] for i in ids], pool)  # (Q, N)
    targets = np.array([column[found[i]] for i in ids], dtype=np.int64)  # (Q,)
    q, n = support.shape
    first: list[np.ndarray] | None = [] if retriever_scores is not None else None
    results = []
    for d in range(draws):
        cands = random_distractors(q, n, targets, n_distractors, np.random.default_rng((seed, d)))  # (Q, N_d)
        results.append(rank_with_ties(support, targets, cands, np.random.default_rng((seed, d, 1))))
        if first is not None:
            first.append(target_ranks(retriever_scores, targets, cands) == 1)
    prefix = f"listener/RD{n_distractors}"
    out = _summary(prefix, results, recall_ks((1, 5), n_distractors + 1, prefix), first)
    for size, size_bags in sorted((bags or {}).items()):
        for b, bag in enumerate(size_bags):  # the retriever's metric would score it under its own length
            check_bag_size(size, list(bag), f"listener: bags[{size}][{b}]")
        bag_of = bag_columns(size_bags, column, f"listener: bags[{size}][{{}}]")  # the retriever's bags, or its error
        rows = [r for r, t in enumerate(targets) if int(t) in bag_of]
        if not rows:
            continue
        sel = np.array(rows, dtype=np.int64)
        cands = np.array([bag_of[int(targets[r])] for r in rows], dtype=np.int64)  # (Q_s, size)
        result = rank_with_ties(support[sel], targets[sel], cands, np.random.default_rng((seed, size, 2)))
        f = None if retriever_scores is None else [target_ranks(np.asarray(retriever_scores)[sel], targets[sel],
                                                                 cands) == 1]  # fmt: skip
        out.update(_summary(f"listener/bag{size}", [result], (1,), f))
    return out
