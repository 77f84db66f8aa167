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

:func:`hard_rd_retrieval` is the hard RD-N (``hardRD{N}/R@k``): RD-N (:func:`finecap.metrics.retrieval.rd_ranks`)
with the target's ``size - 1`` family members among its ``N`` distractors and ``N - size + 1`` random images of other
families. Random distractors alone rarely clash with a detailed caption (RD99 sits at its ceiling for
self-retrieval-trained captioners), and family retrieval alone has only 10 candidates; the hard RD keeps RD-N's
100 candidates, so it reads on the same scale as RD99, while every caption must tell its image from its 9
one-detail variants.

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
from finecap.data.records import id_keys, refuse_repeated_ids, some_ids
from finecap.metrics.items import corpus_only
from finecap.metrics.retrieval import (
    as_score_matrix,
    bag_retrieval_items,
    rank_items,
    recall_ks,
    stream_keys,
    stream_rows,
    summarize_ranks,
    target_columns,
    target_ranks,
)
from finecap.models.text_window import encode_texts, log_note

FAMILY_SIZE = 10
"""Images per set: ImageCoDe's 10 frames."""
_CHUNK = 1024  # captions per block when drawing distractors (bounds memory at CHUNK x N floats)


def family_tag() -> str:
    """Names the family world's files: ``captions_families10_test.json``, ``families10/bags_test.json`` (read when
    called: tests shrink :data:`FAMILY_SIZE` for tiny worlds)."""
    return f"families{FAMILY_SIZE}"


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


def scored_families(
    families: Mapping[Hashable, Hashable | None], image_ids: Sequence[Hashable]
) -> dict[Hashable, Hashable | None]:
    """``{image id: family}`` of ``families`` for the scored images ``image_ids``, keyed as those write their ids
    (``1`` and ``"1"`` are one image: :func:`~finecap.data.records.id_keys`), in ``families``' order; the others are
    left out. Two keys of ``families`` naming one image are a ``ValueError``
    (:func:`~finecap.data.records.refuse_repeated_ids`).

    Example::

        >>> scored_families({"1": "a", 2: "a", 3: "b"}, [1, 2])
        {1: 'a', 2: 'a'}
    """
    refuse_repeated_ids(families, "families")
    found, _ = id_keys(families, set(image_ids))
    return {found[i]: family for i, family in families.items() if i in found}


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
    sets = family_sets(scored_families(families, image_ids), size)
    if not sets:
        raise ValueError(f"no family of {size} scored images (check world.families and the images scored)")
    out, per_caption = bag_retrieval_items(scores, sets, image_ids, targets, ks)  # each family is a bag of `size`
    prefix = f"bag{size}/"
    if prefix + "n" not in out:
        raise ValueError("no caption belongs to a complete family")
    result = {"family/" + k.removeprefix(prefix): v for k, v in out.items()}
    result["family/size"] = float(size)
    items = {q: {"family/" + k.removeprefix(prefix): v for k, v in row.items()} for q, row in per_caption.items()}
    return result, items


@corpus_only(family_retrieval_items)
def family_retrieval() -> dict[str, float]:
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


def hard_rd_ranks(
    scores: Any,
    image_ids: Sequence[Hashable],
    families: Mapping[Hashable, Hashable | None],
    size: int = FAMILY_SIZE,
    targets: Any = None,
    n_distractors: int = 99,
    draws: int = 3,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Ranks ``(draws, Q')`` of the captions whose image is in a complete family of ``size`` among the scored images,
    each against its ``size - 1`` family members and ``n_distractors - size + 1`` random images outside its family
    (of other families, or of none: an incomplete family's, an image without one), and the indices ``(Q',)`` of those
    captions among the ``Q`` rows of ``scores``.

    A caption draws from the row :func:`finecap.metrics.retrieval.stream_rows` gives its image's place among the
    columns of complete families (and its place among that image's captions); draw ``d`` of the block of rows
    starting at ``first`` (1,024 rows a block) uses ``numpy.random.default_rng((seed, d, first))``. So a caption's
    distractors depend only on (seed, d, N, the families, its image), never on the scores, the order of the captions
    or the other images captioned, as :func:`finecap.metrics.retrieval.rd_ranks`: captioners evaluated with the
    same seed face the same distractors on every image both captioned. Ties count against the caption.
    """
    scores = as_score_matrix(scores)
    targets = target_columns(scores, targets)
    n = scores.shape[1]
    n_random = n_distractors - (size - 1)
    if n_random < 0:
        raise ValueError(f"n_distractors={n_distractors} is below the {size - 1} family members of a target")
    if n_random > n - size:
        raise ValueError(f"hard RD{n_distractors} needs {n_random} images outside a family, the pool has {n - size}")
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    column = {i: c for c, i in enumerate(image_ids)}
    family_of = np.full(n, -1, dtype=np.int64)  # (N,) family number of each column, -1 = none / incomplete
    for f, members in enumerate(family_sets(scored_families(families, image_ids), size)):
        family_of[[column[i] for i in members]] = f
    keep = np.flatnonzero(family_of[targets] >= 0)  # (Q',) captions of complete families
    if not len(keep):
        raise ValueError(f"no caption belongs to a complete family of {size} scored images")
    in_family = np.flatnonzero(family_of >= 0)  # the columns of complete families, ascending
    position = np.searchsorted(in_family, targets[keep])  # (Q',) each caption's image among them
    rows, n_rows = stream_rows(position)  # (Q',) the caption's row of each draw's stream
    out = np.empty((draws, len(keep)), dtype=np.int64)
    for start in range(0, n_rows, _CHUNK):
        here = np.flatnonzero((rows >= start) & (rows < start + _CHUNK))  # (C,) captions drawing from this block
        if not len(here):
            continue
        own = targets[keep[here]]  # (C,)
        same = family_of[None, :] == family_of[own][:, None]  # (C, N): the target and its family members
        mates = same.copy()
        mates[np.arange(len(here)), own] = False
        mates = np.nonzero(mates)[1].reshape(len(here), size - 1)  # (C, size - 1) family members, ascending
        by_row = np.argsort(rows[here])  # (C,) this block's captions in the order of their rows (distinct)
        for d in range(draws):
            # one generator per (draw, block): the draws of a block never depend on the blocks before it
            rng = np.random.default_rng((seed, d, start))
            keys = np.empty((len(here), n))  # (C, N) random order of the images, only the captions' rows drawn
            keys[by_row] = stream_keys(rng, rows[here][by_row] - start, n)[0]
            keys[same] = 2.0  # the target's family sorts last, never drawn
            randoms = np.argpartition(keys, n_random - 1, axis=1)[:, :n_random] if n_random else keys[:, :0]
            candidates = np.concatenate([mates, randoms.astype(np.int64)], axis=1)  # (C, n_distractors)
            out[d, here] = target_ranks(scores[keep[here]], own, candidates)
    return out, keep


def hard_rd_items(
    scores: Any,
    image_ids: Sequence[Hashable],
    families: Mapping[Hashable, Hashable | None],
    size: int = FAMILY_SIZE,
    targets: Any = None,
    n_distractors: int = 99,
    draws: int = 3,
    seed: int = 0,
    ks: Sequence[int] = (1, 5),
) -> tuple[dict[str, float], dict[int, dict[str, float]]]:
    """:func:`hard_rd_retrieval` and the per-caption values of its means (``R@k`` as the share of draws,
    ``mean_rank``; :func:`finecap.metrics.retrieval.rank_items`) by caption row."""
    ranks, keep = hard_rd_ranks(scores, image_ids, families, size, targets, n_distractors, draws, seed)
    ks = recall_ks(ks, n_distractors + 1, f"hardRD{n_distractors}")  # the others are 1 whatever the captions
    per_draw = [summarize_ranks(r, ks) for r in ranks]
    prefix = f"hardRD{n_distractors}/"
    out = {prefix + k: float(np.mean([p[k] for p in per_draw])) for k in per_draw[0]}
    out[prefix + "n"] = float(len(keep))
    per_rank = rank_items(ranks, ks)  # (Q',) each
    items = {int(q): {prefix + k: float(v[j]) for k, v in per_rank.items()} for j, q in enumerate(keep)}
    return out, items


@corpus_only(hard_rd_items)
def hard_rd_retrieval() -> dict[str, float]:
    """Hard RD-N (module docstring): ``hardRD{N}/R@k``, ``mean_rank``, ``median_rank`` averaged over ``draws``
    draws (:func:`hard_rd_ranks`), and ``hardRD{N}/n`` (captions ranked).

    Example (families of 2 and RD-3: a caption's family mate and both images of the other family; caption 0 beats
    its mate 1 but not image 3, rank 2; caption 1 beats all three, rank 1)::

        >>> scores = np.array([[0.5, 0.4, 0.1, 0.9], [0.2, 0.8, 0.1, 0.3]])
        >>> out = hard_rd_retrieval(scores, [0, 1, 2, 3], {0: "a", 1: "a", 2: "b", 3: "b"}, size=2, targets=[0, 1],
        ...                         n_distractors=3, draws=1, ks=(1,))
        >>> out["hardRD3/R@1"], out["hardRD3/mean_rank"]
        (0.5, 1.5)
    """


def family_self_retrieval_items(
    predictions: Mapping[Hashable, str],
    retriever: Any,
    records: Sequence[Any],
    families: Mapping[Hashable, Hashable | None],
    size: int = FAMILY_SIZE,
    cache_dir: str | Path | None = None,
    *,
    n_distractors: int | None = None,
    draws: int = 3,
    seed: int = 0,
) -> tuple[dict[str, float], dict[Hashable, dict[str, float]]]:
    """:func:`family_self_retrieval` and the per-image values of its means (:func:`family_retrieval_items`, and the
    hard RD's :func:`hard_rd_items`) by image id. A predicted id finds its record written either way (``1`` and
    ``"1"`` are one image: :func:`~finecap.data.records.id_keys`); two predicted ids, or records, naming one image
    are a ``ValueError`` (:func:`~finecap.data.records.refuse_repeated_ids`)."""
    image_ids = [r.image_id for r in records]
    refuse_repeated_ids(image_ids, "family records")
    refuse_repeated_ids(predictions, "family predictions")  # one image's two captions: ranked twice in the means
    column = {i: c for c, i in enumerate(image_ids)}
    found, missing = id_keys(predictions, column)
    if missing:
        raise KeyError(f"captions of images not among the records: {missing[:5]}; their ids are e.g. "
                       f"{some_ids(column)}")  # fmt: skip
    ids = list(predictions)
    image_emb = retriever.image_embeddings(list(records), cache_dir)  # (N, D)
    encoding = encode_texts(retriever, [predictions[i] for i in ids], ids)
    log_note(encoding, "family")
    scores = np.asarray(encoding.embeddings @ image_emb.T, dtype=np.float64)  # (Q, N)
    targets = np.array([column[found[i]] for i in ids], dtype=np.int64)
    corpus, items = family_retrieval_items(scores, image_ids, families, size, targets)
    if n_distractors is not None:
        hard, hard_items = hard_rd_items(scores, image_ids, families, size, targets, n_distractors, draws, seed)
        corpus.update(hard)
        for q, values in hard_items.items():
            items.setdefault(q, {}).update(values)
    corpus.update(encoding.counts("family"))  # captions longer than the retriever's text window, when any
    return corpus, {ids[q]: values for q, values in items.items()}


@corpus_only(family_self_retrieval_items)
def family_self_retrieval() -> dict[str, float]:
    """:func:`family_retrieval` of the captions ``{image_id: caption}`` with a retriever (``embed_texts`` and
    ``image_embeddings``, :class:`finecap.models.retriever.Retriever`) over the images of ``records`` (objects with
    ``image_id``); scores are cosine similarities of the unit-norm embeddings. On the same scores, with
    ``n_distractors``: the hard RD (:func:`hard_rd_retrieval`, ``draws`` draws from ``seed``)."""
