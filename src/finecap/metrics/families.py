"""Retrieval among the members of a scene family: the world's analogue of ImageCoDe (Krojer et al. 2022), which
DiscriTune (appendix D.1, Table 11) and NDLB (Sec. 5, Table 8) use zero-shot to test fine-grained captions.

An ImageCoDe set is 10 images that differ in small details (consecutive video frames); a caption of one of them must
let a CLIP retriever pick that image among the 10 (P@1; chance is 10%). The world's sets are scene families
(``world.families = k``, :func:`finecap.world.scene.sample_family`): a base scene and ``k - 1`` variants, each one
detail away from the base (a colour, a position, a shape, a size, a pattern, the background, an object added or
removed). :func:`family_test_world` is the test world of such families for a training world (same seed and scene
settings, test split only); :func:`family_retrieval` ranks each caption's image among the members of its family
over a caption-image score matrix, and :func:`family_self_retrieval` embeds captions and images with a retriever
first. With one target per caption, P@1 is the recall at 1 (``family/R@1``).

Example (caption 0's image is first in its family, caption 1's second)::

    >>> import numpy as np
    >>> scores = np.array([[0.9, 0.1], [0.8, 0.3]])
    >>> family_retrieval(scores, [10, 11], {10: 0, 11: 0}, size=2)["family/R@1"]
    0.5
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from finecap.config import WorldConfig
from finecap.metrics.retrieval import bag_ranks, rank_items, summarize_ranks

FAMILY_SIZE = 10
"""Images per set: ImageCoDe's 10 frames."""


def family_test_world(cfg: WorldConfig, size: int = FAMILY_SIZE, out: str | None = None) -> WorldConfig:
    """The scene-family test world of the training world ``cfg``: the same seed and scene settings, families of
    ``size`` (``world.families``), a test split of ``cfg.n_test`` images rounded down to whole families and no
    training or validation images, written to ``out`` (default ``<world.out>-families<size>``; with ``world.out``
    empty, empty too: the world's own folder in the finecap home). Its scenes come from the family random streams
    (:func:`finecap.world.make.generate_scenes`), never the training world's."""
    if size < 2:
        raise ValueError(f"family size must be >= 2, got {size}")
    n_test = cfg.n_test - cfg.n_test % size
    if n_test == 0:
        raise ValueError(f"world.n_test={cfg.n_test} holds no whole family of {size} scenes")
    out = out if out is not None else (f"{cfg.out}-families{size}" if cfg.out else "")
    return dataclasses.replace(cfg, families=size, n_train=0, n_val=0, n_test=n_test, out=out)


def family_sets(families: Mapping[Hashable, Hashable | None], size: int) -> list[list[Hashable]]:
    """The image ids of every family with exactly ``size`` members in ``families`` (``{image_id: family id}``;
    ``None`` = no family), in order of first appearance; smaller families (the last of a split may be cut) are left
    out.

    Example::

        >>> family_sets({1: "a", 2: "a", 3: "b", 4: None, 5: "a"}, size=3)
        [[1, 2, 5]]
    """
    members: dict[Hashable, list[Hashable]] = {}
    for image_id, family in families.items():
        if family is not None:
            members.setdefault(family, []).append(image_id)
    return [ids for ids in members.values() if len(ids) == size]


def family_retrieval(
    scores: Any,
    image_ids: Sequence[Hashable],
    families: Mapping[Hashable, Hashable | None],
    size: int = FAMILY_SIZE,
    targets: Any = None,
    ks: Sequence[int] = (1, 5),
) -> dict[str, float]:
    """Each caption's image ranked among the members of its family (ties counted against it, as
    :func:`finecap.metrics.retrieval.target_ranks`).

    Args:
        scores: ``(Q, N)`` caption-image scores; column ``n`` is image ``image_ids[n]``.
        image_ids: the id of every column.
        families: ``{image_id: family id}`` of the images (others are ignored).
        size: family size; only families with exactly this many scored members count, and only captions of their
            members are ranked.
        targets: target column per caption (default ``arange(Q)``).
        ks: recall cut-offs below ``size``.

    Returns:
        ``family/R@k``, ``family/mean_rank``, ``family/median_rank``, ``family/n`` (captions ranked) and
        ``family/size``. Raises ``ValueError`` when no complete family is among the scored images.
    """
    return family_retrieval_items(scores, image_ids, families, size, targets, ks)[0]


def family_retrieval_items(
    scores: Any,
    image_ids: Sequence[Hashable],
    families: Mapping[Hashable, Hashable | None],
    size: int = FAMILY_SIZE,
    targets: Any = None,
    ks: Sequence[int] = (1, 5),
) -> tuple[dict[str, float], dict[int, dict[str, float]]]:
    """:func:`family_retrieval` and the per-caption values of its means (``family/R@k``, ``family/mean_rank``;
    :func:`finecap.metrics.retrieval.rank_items`) by caption row, for the captions ranked in a family."""
    scored = set(image_ids)
    sets = family_sets({i: f for i, f in families.items() if i in scored}, size)
    if not sets:
        raise ValueError(f"no family of {size} scored images (check world.families and the images scored)")
    ranked = [(q, rank) for q, n, rank in bag_ranks(scores, sets, image_ids, targets) if n == size]
    if not ranked:
        raise ValueError("no caption belongs to a complete family")
    rows, ranks = [q for q, _ in ranked], [r for _, r in ranked]
    ks = [k for k in ks if k < size]
    result = {f"family/{k}": v for k, v in summarize_ranks(ranks, ks).items()}
    result["family/n"] = float(len(ranks))
    result["family/size"] = float(size)
    per_rank = rank_items(ranks, ks)
    items = {q: {f"family/{k}": float(v[j]) for k, v in per_rank.items()} for j, q in enumerate(rows)}
    return result, items


def family_self_retrieval(
    predictions: Mapping[Hashable, str],
    retriever: Any,
    records: Sequence[Any],
    families: Mapping[Hashable, Hashable | None],
    size: int = FAMILY_SIZE,
    cache_dir: str | Path | None = None,
) -> dict[str, float]:
    """:func:`family_retrieval` of the captions ``{image_id: caption}`` with a retriever (``embed_texts`` and
    ``image_embeddings``, :class:`finecap.models.retriever.Retriever`) over the images of ``records`` (objects with
    ``image_id``); scores are cosine similarities of the unit-norm embeddings."""
    return family_self_retrieval_items(predictions, retriever, records, families, size, cache_dir)[0]


def family_self_retrieval_items(
    predictions: Mapping[Hashable, str],
    retriever: Any,
    records: Sequence[Any],
    families: Mapping[Hashable, Hashable | None],
    size: int = FAMILY_SIZE,
    cache_dir: str | Path | None = None,
) -> tuple[dict[str, float], dict[Hashable, dict[str, float]]]:
    """:func:`family_self_retrieval` and the per-image values of its means (:func:`family_retrieval_items`) by
    image id."""
    column = {r.image_id: c for c, r in enumerate(records)}
    missing = [i for i in predictions if i not in column]
    if missing:
        raise KeyError(f"captions of images not among the records: {missing[:5]}")
    ids = list(predictions)
    image_emb = retriever.image_embeddings(list(records), cache_dir)  # (N, D)
    text_emb = retriever.embed_texts([predictions[i] for i in ids])  # (Q, D)
    scores = np.asarray(text_emb @ image_emb.T, dtype=np.float64)  # (Q, N)
    targets = np.array([column[i] for i in ids], dtype=np.int64)
    corpus, items = family_retrieval_items(scores, [r.image_id for r in records], families, size, targets)
    return corpus, {ids[q]: values for q, values in items.items()}
