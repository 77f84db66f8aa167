"""Self-retrieval: does a caption pick out its own image among others?

Three protocols over a precomputed score matrix ``scores (Q, N)`` (caption ``q`` against image ``n``; cosine
similarities or logits, only the order matters) and the column ``targets[q]`` of each caption's own image:

- :func:`rd_retrieval` (RD-N): the target against ``N`` random distractors drawn per caption from the other images
  (DiscriTune / NDLB "random distractors"); ``draws`` seeded draws, metrics averaged over draws.
- :func:`pool_retrieval`: the target against every other image of the pool (the split, plus extra images if the
  caller appends their columns).
- :func:`bag_retrieval` (TrueMatch): the target against the other images of its bag only; reported per bag size.

Each reports ``R@k`` (fraction of captions whose image ranks in the top k, in [0, 1]), ``mean_rank`` and
``median_rank`` (1 = best); ``R@k`` only for the k below the number of images a caption is ranked among (RD-N's
``N + 1``, the pool's size, a bag's size: :func:`recall_ks`), as the papers report only recalls that can fail. Ties
are counted against the caption (pessimistic): rank = 1 + number of other candidates scoring >= the target, so a
collapsed model that scores every image the same gets the worst rank, not the best; this is DiscriTune's definition
(Sec. 3, "Retriever": the image is retrieved iff its score is strictly above every distractor's), which the other
papers leave open. :class:`SelfRetrieval` embeds captions and images with a
:class:`~finecap.models.retriever.Retriever` and runs the protocols on a ``{image_id: caption}`` mapping, adding
``retrieval/truncated`` (``retrieval/chunked``), the number of captions longer than the retriever's text window, when
there is one (:mod:`finecap.models.text_window`).

Example::

    >>> import numpy as np
    >>> scores = np.array([[0.9, 0.1, 0.3], [0.2, 0.1, 0.5]])
    >>> pool_retrieval(scores, targets=np.array([0, 1]))["R@1"]  # caption 0 ranks 1st, caption 1 ranks 2nd
    0.5
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from finecap.data.records import id_keys, refuse_repeated_ids, some_ids
from finecap.metrics.items import corpus_only
from finecap.models.text_window import TextEncoding, encode_texts, log_note
from finecap.utils.once import SaidOnce

KS: tuple[int, ...] = (1, 5, 10)
_CHUNK = 1024  # captions per block when drawing distractors (bounds memory at CHUNK x N floats)

log = logging.getLogger(__name__)


LEFT_OUT_SAID = SaidOnce()
"""The ``(protocol, candidates, cut-offs)`` whose note :func:`recall_ks` has said as a WARNING in this command."""


def recall_ks(ks: Sequence[int], candidates: int, what: str | None = None) -> tuple[int, ...]:
    """The cut-offs of ``ks`` below ``candidates``, the images a caption is ranked among (its own and its
    competitors: ``N + 1`` for RD-N, ``s`` in a bag of ``s``): a caption ranks at most ``candidates``-th, so
    ``R@k`` for ``k >= candidates`` is 1 whatever the captions. Such a recall is left out, as the papers leave it
    (NDLB reports R@1 alone on RD100 and on TrueMatch's bags of 3, 5 and 7; DiscriTune R@1 against 99 distractors).
    ``what`` (the protocol, ``"RD3"``): the note saying which were left out is logged under that name as a WARNING,
    once in a command for each protocol and cut-offs (:data:`LEFT_OUT_SAID`; DEBUG after), so that a user whose
    table lacks R@10 sees why, whatever the logging level (``-q``, a script that configures no logging), and a
    training run does not repeat it at every validation.

    Example::

        >>> recall_ks((1, 5, 10), 4)  # RD3: every caption ranks in the top 4
        (1,)
    """
    kept = tuple(k for k in ks if k < candidates)
    dropped = [k for k in ks if k >= candidates]
    if dropped and what is not None:
        said = (what, candidates, tuple(dropped))
        log.log(logging.WARNING if LEFT_OUT_SAID.first(said) else logging.DEBUG,
                "%s: %s left out: a caption is ranked among %d images, so every caption ranks in the top %d and "
                "these are 1 whatever it says", what, ", ".join(f"R@{k}" for k in dropped), candidates,
                candidates)  # fmt: skip
    return kept


def as_score_matrix(scores: Any) -> np.ndarray:
    """``scores`` (a tensor or array-like) as a float64 ``(captions, images)`` numpy matrix; another shape, or a
    score that is NaN or infinite (an embedding that is not finite: no rank can be read from it, and a NaN compared
    with ``>=`` would rank its caption first), is a ``ValueError``."""
    if hasattr(scores, "detach"):
        scores = scores.detach().cpu().float().numpy()
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 2:
        raise ValueError(f"scores must be a (captions, images) matrix, got shape {scores.shape}")
    bad = ~np.isfinite(scores)
    if bad.any():
        row, col = (int(v) for v in np.argwhere(bad)[0])
        raise ValueError(f"scores: {int(bad.sum())} caption-image score(s) are not finite, the first "
                         f"{scores[row, col]} (caption {row}, image {col}); are the embeddings finite?")  # fmt: skip
    return scores


def target_columns(scores: np.ndarray, targets: Any) -> np.ndarray:
    """The target image column of each caption row of ``scores``: ``targets`` checked (shape ``(Q,)``, columns in
    range), or ``arange(Q)`` when None (one image per caption, ``Q == N``)."""
    q, n = scores.shape
    if targets is None:
        if q != n:
            raise ValueError(f"targets are needed when captions ({q}) and images ({n}) differ in number")
        return np.arange(q)
    targets = np.asarray(targets, dtype=np.int64)
    if targets.shape != (q,):
        raise ValueError(f"targets must have shape ({q},), got {targets.shape}")
    if q and (targets.min() < 0 or targets.max() >= n):
        raise ValueError(f"targets must be image columns in [0, {n}), got range [{targets.min()}, {targets.max()}]")
    return targets


def target_ranks(scores: Any, targets: Any = None, candidates: np.ndarray | None = None) -> np.ndarray:
    """1-based rank ``(Q,)`` of each caption's target image among its candidates (ties counted against it).

    Args:
        scores: ``(Q, N)`` caption-image scores.
        targets: ``(Q,)`` target column per caption (default ``arange(Q)``, needs ``Q == N``).
        candidates: ``(Q, C)`` columns competing with the target per caption (the target itself may be included;
            it is never counted against itself); default: every column.
    """
    scores = as_score_matrix(scores)
    targets = target_columns(scores, targets)
    rows = np.arange(len(targets))
    own = scores[rows, targets]  # (Q,)
    if candidates is None:
        beats = scores >= own[:, None]  # (Q, N)
        return beats.sum(axis=1)  # the target itself is one of the >=, so this is 1 + #others
    candidates = np.asarray(candidates, dtype=np.int64)
    beats = (scores[rows[:, None], candidates] >= own[:, None]) & (candidates != targets[:, None])  # (Q, C)
    return 1 + beats.sum(axis=1)


def summarize_ranks(ranks: Any, ks: Sequence[int] = KS) -> dict[str, float]:
    """``R@k`` for each k (fraction in [0, 1]), ``mean_rank`` and ``median_rank`` of 1-based ranks."""
    ranks = np.asarray(ranks, dtype=np.float64)
    if ranks.size == 0:
        raise ValueError("no captions to rank")
    out = {f"R@{k}": float((ranks <= k).mean()) for k in ks}
    out["mean_rank"] = float(ranks.mean())
    out["median_rank"] = float(np.median(ranks))
    return out


def rank_items(ranks: Any, ks: Sequence[int] = KS) -> dict[str, np.ndarray]:
    """Per-caption values ``(Q,)`` of ``R@k`` (1 or 0; with ``(draws, Q)`` ranks, the share of draws) and
    ``mean_rank`` (mean over draws), whose means over the captions are :func:`summarize_ranks`' values (averaged over
    draws, as :func:`rd_retrieval`). ``median_rank`` has none: a median is not a mean of per-caption values."""
    ranks = np.asarray(ranks, dtype=np.float64).reshape(-1, np.shape(ranks)[-1])  # (draws, Q)
    out = {f"R@{k}": (ranks <= k).mean(axis=0) for k in ks}
    out["mean_rank"] = ranks.mean(axis=0)
    return out


def stream_rows(keys: Any) -> tuple[np.ndarray, int]:
    """The row of a random stream each caption draws from, ``(Q,)``, and the rows the stream needs: ``r * key + k``
    for a caption whose image has key ``key`` (its target column; RD-N) and which is the ``k``-th caption of that
    image, where ``r`` is the most captions any image has. So a caption's draw depends on its image and its place
    among that image's captions, never on the order of the captions or on which other images are captioned: two
    captioners, one of which skipped an image or listed its captions in another order, face the same distractors on
    the images they share. With one caption per image in column order (``arange``), and with ``r`` captions of each
    image listed together, the row is the caption's own index.

    Example::

        >>> stream_rows([2, 0, 2])  # image 2's two captions: rows 4 and 5; image 0's: row 0
        (array([4, 0, 5]), 6)
    """
    keys = np.asarray(keys, dtype=np.int64)
    if not keys.size:
        return np.zeros(0, dtype=np.int64), 0
    order = np.argsort(keys, kind="stable")  # captions grouped by image, each image's in their given order
    sorted_keys = keys[order]
    first = np.r_[0, np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1]) + 1]  # (images,) start of each group
    occurrence = np.empty_like(keys)
    occurrence[order] = np.arange(len(keys)) - np.repeat(first, np.diff(np.r_[first, len(keys)]))
    r = int(occurrence.max()) + 1
    rows = r * keys + occurrence  # (Q,)
    return rows, int(rows.max()) + 1


def _skip(rng: np.random.Generator, values: int) -> None:
    """Move ``rng`` past ``values`` uniform floats of its stream as drawing them would: a PCG64 generator (numpy's
    ``default_rng``: one 64-bit step a float) jumps (``advance``), another draws them in blocks and drops them."""
    if values <= 0:
        return
    if isinstance(rng.bit_generator, np.random.PCG64 | np.random.PCG64DXSM):
        rng.bit_generator.advance(values)
        return
    while values > 0:
        block = min(values, _CHUNK * 1024)
        rng.random(block)
        values -= block


def stream_keys(rng: np.random.Generator, rows: np.ndarray, n: int, at: int = 0) -> tuple[np.ndarray, int]:
    """Rows ``rows`` (ascending, distinct, none before ``at``) of ``rng``'s stream of ``(·, n)`` uniform keys whose
    row ``at`` is drawn next, and the row next drawn after them: ``rng.random((rows[-1] + 1 - at, n))[rows - at]``,
    drawing only those rows (the rows between are skipped, :func:`_skip`), so that the work follows the captions, not
    the largest image column or the most captions of one image (:func:`stream_rows`).

    Example::

        >>> keys, at = stream_keys(np.random.default_rng(0), np.array([1, 3]), 2)
        >>> bool((keys == np.random.default_rng(0).random((4, 2))[[1, 3]]).all()), at
        (True, 4)
    """
    out = np.empty((len(rows), n))
    runs = np.split(np.arange(len(rows)), np.flatnonzero(np.diff(rows) != 1) + 1) if len(rows) else []
    for run in runs:  # consecutive rows drawn together
        first = int(rows[run[0]])
        _skip(rng, (first - at) * n)
        out[run] = rng.random((len(run), n))
        at = first + len(run)
    return out, at


def random_distractors(
    n_queries: int, n_images: int, targets: np.ndarray, n_distractors: int, rng: np.random.Generator
) -> np.ndarray:
    """``(Q, n_distractors)`` image columns drawn uniformly without replacement, never the caption's own target.

    Each caption draws from the row :func:`stream_rows` gives it of ``rng``'s stream of ``(rows, n_images)`` uniform
    keys (its image's distractors do not depend on the other captions); only the captions' rows are drawn
    (:func:`stream_keys`), and ``rng`` is left past the whole stream."""
    if n_distractors > n_images - 1:
        raise ValueError(
            f"n_distractors={n_distractors} needs at least {n_distractors + 1} images, got {n_images} "
            "(lower eval.n_distractors)"
        )
    targets = np.asarray(targets, dtype=np.int64)
    if targets.shape != (n_queries,):
        raise ValueError(f"targets must have shape ({n_queries},), got {targets.shape}")
    rows, n_rows = stream_rows(targets)
    by_row = np.argsort(rows)  # (Q,) the captions in the order of their rows (distinct)
    out = np.empty((n_queries, n_distractors), dtype=np.int64)
    at = 0
    for start in range(0, n_queries, _CHUNK):
        here = by_row[start : start + _CHUNK]  # (h,) captions of this block
        keys, at = stream_keys(rng, rows[here], n_images, at)  # (h, N) random order of the images
        if not n_distractors:
            continue
        keys[np.arange(len(here)), targets[here]] = 2.0  # the target sorts last, never drawn
        out[here] = np.argpartition(keys, n_distractors - 1, axis=1)[:, :n_distractors]
    _skip(rng, (n_rows - at) * n_images)
    return out


def rd_ranks(scores: Any, targets: Any = None, n_distractors: int = 99, draws: int = 3, seed: int = 0) -> np.ndarray:
    """Ranks ``(draws, Q)`` of each caption's image among itself and ``n_distractors`` random other images.

    Draw ``d`` uses ``numpy.random.default_rng((seed, d))``, each caption its image's row of its stream
    (:func:`random_distractors`), so a caption's distractors depend only on (seed, d, N, its image and its place
    among that image's captions), never on the scores, the order of the captions or the other images captioned: two
    captioners evaluated with the same seed face the same distractors on every image both captioned.
    """
    scores = as_score_matrix(scores)
    targets = target_columns(scores, targets)
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    q, n = scores.shape
    out = np.empty((draws, q), dtype=np.int64)
    for d in range(draws):
        rng = np.random.default_rng((seed, d))
        cands = random_distractors(q, n, targets, n_distractors, rng)
        out[d] = target_ranks(scores, targets, cands)
    return out


def rd_retrieval(
    scores: Any, targets: Any = None, n_distractors: int = 99, draws: int = 3, seed: int = 0, ks: Sequence[int] = KS
) -> dict[str, float]:
    """RD-N self-retrieval: metrics of :func:`summarize_ranks` per draw, averaged over ``draws`` draws; ``R@k`` only
    for ``k <= n_distractors`` (the others are 1 whatever the captions: left out with a note, :func:`recall_ks`)."""
    return rd_summary(rd_ranks(scores, targets, n_distractors, draws, seed), n_distractors, ks)


def rd_summary(ranks: Any, n_distractors: int, ks: Sequence[int] = KS) -> dict[str, float]:
    """:func:`rd_retrieval`'s values from the ranks ``(draws, Q)`` of :func:`rd_ranks` against ``n_distractors``:
    each draw's :func:`summarize_ranks`, averaged over the draws (for a caller that keeps the ranks, as the
    ``retrieval`` metric group does for its per-image values)."""
    ks = recall_ks(ks, n_distractors + 1, f"RD{n_distractors}")
    per_draw = [summarize_ranks(r, ks) for r in ranks]
    return {k: float(np.mean([p[k] for p in per_draw])) for k in per_draw[0]}


def pool_retrieval(scores: Any, targets: Any = None, ks: Sequence[int] = KS) -> dict[str, float]:
    """Self-retrieval against every image column of ``scores`` (the whole pool); ``R@k`` only for ``k`` below the
    number of columns (the others are 1 whatever the captions: left out with a note, :func:`recall_ks`)."""
    scores = as_score_matrix(scores)
    return summarize_ranks(target_ranks(scores, targets), recall_ks(ks, scores.shape[1], "pool"))


def bag_columns(
    bags: Sequence[Sequence[Hashable]],
    column: Mapping[Hashable, int],
    where: str = "bag {}",
    numbers: Sequence[int] | None = None,
) -> dict[int, np.ndarray]:
    """``{column: the columns of the bag holding its image}`` of ``bags`` (lists of image ids) under ``column``
    (``{image id: score column}``), the one reading of bags that the retriever's bag metric (:func:`bag_ranks`) and
    the listener's (:mod:`finecap.metrics.listener`) share, so both score the same captions. ``ValueError`` naming
    the bag (``where`` with its index) for a bag of fewer than 2 images (a bag of 1 is always retrieved: its R@1 is
    1 whatever the caption, and the metric would report it as ``bag1/R@1``), for a bag with an image not in
    ``column`` (scoring the rest as a smaller bag would count other captions than the bags say), with one image
    twice, or with an image of an earlier bag (its caption would be ranked in one of the two only; TrueMatch's bags
    of one size are disjoint, NDLB Algorithm 2). ``bags`` are bags of one size; ``numbers`` gives the index
    ``where`` names each by (default its place in ``bags``; :func:`bag_ranks` reads each size's bags apart and names
    them by their place among all it was given).

    Example::

        >>> bag_columns([["a", "b"], ["c", "z"]], {"a": 0, "b": 1, "c": 2}, where="bags[2][{}]")
        Traceback (most recent call last):
        ...
        ValueError: bags[2][1] names images not among the scored images: ['z']; their ids are e.g. ['a', 'b', 'c']
    """
    number = list(numbers) if numbers is not None else list(range(len(bags)))
    bag_of: dict[int, np.ndarray] = {}
    in_bag: dict[int, int] = {}  # column: the place in bags of the bag holding it
    for b, bag in enumerate(bags):
        name = where.format(number[b])
        if len(bag) < 2:
            raise ValueError(f"{name} is a bag of size {len(bag)}: a bag holds at least 2 images (alone in its bag, "
                             "an image is retrieved whatever its caption says)")  # fmt: skip
        found, missing = id_keys(bag, column)  # an id written as an int or as its string: one image
        if missing:
            raise ValueError(f"{name} names images not among the scored images: {missing[:5]}; their ids are e.g. "
                             f"{some_ids(column)}")  # fmt: skip
        cols = np.array([column[found[i]] for i in bag], dtype=np.int64)
        if len(np.unique(cols)) < len(cols):  # [a, b, b] holds 2 images: b would count twice against a, as a bag of 3
            twice = list(dict.fromkeys(i for i, c in zip(bag, cols, strict=True) if (cols == c).sum() > 1))
            raise ValueError(f"{name} names image(s) {twice[:5]} more than once; a bag's images are distinct")
        again = [(i, int(c)) for i, c in zip(bag, cols, strict=True) if int(c) in bag_of]
        if again:
            raise ValueError(
                f"{name} holds image {again[0][0]!r}, already in {where.format(number[in_bag[again[0][1]]])}; the "
                "bags of one size are disjoint (its caption is ranked in one bag)"
            )
        bag_of.update(dict.fromkeys(cols.tolist(), cols))
        in_bag.update(dict.fromkeys(cols.tolist(), b))
    return bag_of


def bag_ranks(
    scores: Any, bags: Sequence[Sequence[Hashable]], image_ids: Sequence[Hashable], targets: Any = None
) -> list[tuple[int, int, int]]:
    """``(caption row, bag size, rank)`` of each caption whose image lies in a bag, ranked among the images of that
    bag, by bag size and then caption row (arguments as :func:`bag_retrieval`, which summarises these ranks per bag
    size). The bags of each size are read apart (:func:`bag_columns`): a caption whose image lies in bags of several
    sizes is ranked in each."""
    scores = as_score_matrix(scores)
    targets = target_columns(scores, targets)
    column = {i: c for c, i in enumerate(image_ids)}
    if len(column) != len(image_ids):
        raise ValueError("image_ids must be unique")
    if len(image_ids) != scores.shape[1]:
        raise ValueError(f"image_ids has {len(image_ids)} ids but scores have {scores.shape[1]} columns")
    of_size: dict[int, list[int]] = {}  # size -> the places of its bags in `bags`
    for b, bag in enumerate(bags):
        of_size.setdefault(len(bag), []).append(b)
    out = []
    for size in sorted(of_size):
        bag_of = bag_columns([bags[b] for b in of_size[size]], column, numbers=of_size[size])
        for q, t in enumerate(targets):
            cols = bag_of.get(int(t))
            if cols is not None:
                out.append((q, size, int(target_ranks(scores[q : q + 1], [t], cols[None, :])[0])))
    return out


def bag_retrieval_items(
    scores: Any,
    bags: Sequence[Sequence[Hashable]],
    image_ids: Sequence[Hashable],
    targets: Any = None,
    ks: Sequence[int] = KS,
) -> tuple[dict[str, float], dict[int, dict[str, float]]]:
    """:func:`bag_retrieval` and the per-caption values of its means (``bag{s}/R@k``, ``bag{s}/mean_rank``;
    :func:`rank_items`) by caption row, for the captions whose image lies in a bag: one ranking serves both."""
    by_size: dict[int, list[tuple[int, int]]] = {}
    for q, size, rank in bag_ranks(scores, bags, image_ids, targets):
        by_size.setdefault(size, []).append((q, rank))
    out: dict[str, float] = {}
    items: dict[int, dict[str, float]] = {}
    for size in sorted(by_size):
        rows, ranks = [q for q, _ in by_size[size]], [r for _, r in by_size[size]]
        cut = recall_ks(ks, size)  # documented, so no note: TrueMatch's bags of 3 and 5 report no R@5, R@10
        out.update({f"bag{size}/{k}": v for k, v in summarize_ranks(ranks, cut).items()})
        out[f"bag{size}/n"] = float(len(ranks))
        for k, values in rank_items(ranks, cut).items():  # (captions of this size,)
            for j, q in enumerate(rows):
                items.setdefault(q, {})[f"bag{size}/{k}"] = float(values[j])
    return out, items


@corpus_only(bag_retrieval_items)
def bag_retrieval() -> dict[str, float]:
    """Self-retrieval within bags (TrueMatch): each caption competes only with the images of its own bag.

    Args:
        scores: ``(Q, N)`` caption-image scores; column ``n`` is image ``image_ids[n]``.
        bags: lists of at least 2 distinct image ids, the bags of one size disjoint (a bag of 1, a bag naming one
            twice, or an image of an earlier bag of its size, is refused: :func:`bag_columns`); an image may lie in
            bags of several sizes (TrueMatch builds each size's bags on its own), its caption is then ranked in each.
        image_ids: the id of every column.
        targets: target column per caption (default ``arange(Q)``).
        ks: recall cut-offs; only those smaller than a bag's size are reported for it (others are trivially 1).

    Returns:
        ``bag{s}/R@k``, ``bag{s}/mean_rank``, ``bag{s}/median_rank`` and ``bag{s}/n`` (captions) per bag size ``s``.
        Each is a mean over the captions whose image lies in a bag (NDLB reports R@1 on TrueMatch without saying
        how it averages): with one caption per image of every bag this is also the mean over bags of their share of
        captions retrieving their image.
    """


class SelfRetrieval:
    """Self-retrieval of generated captions with a retriever: RD-N, whole pool and (optionally) bags.

    Args:
        retriever: a :class:`~finecap.models.retriever.Retriever`.
        records: the images captions are retrieved among (objects with ``image_id`` and ``path``).
        cache_dir: image-feature cache folder (None = no cache).
        extra_records: extra pool images (distractors only, never targets).
        n_distractors, draws, seed: RD-N settings (``eval.n_distractors``, ``eval.draws``, ``eval.seed``).
        bags: TrueMatch bags (lists of image ids; those of several sizes together, as :func:`bag_retrieval` reads
            them) or None.
        protocols: any of ``"rd"``, ``"pool"``, ``"bags"``.

    Calling it with ``{image_id: caption or [captions]}`` returns ``RD{N}/R@1``, ..., ``pool/R@1``, ...,
    ``bag{s}/R@1``, ... (several captions per image are each one query).

    Example (``retriever``: a tiny random CLIP, so retrieval is at chance; ``records``: three images, so RD-2)::

        >>> sr = SelfRetrieval(retriever, records, cache_dir=cache_dir, n_distractors=2, draws=1)
        >>> scores = sr({0: "a red square", 1: "a blue square", 2: "a green square"})
        >>> round(scores["RD2/R@1"], 3), scores["RD2/mean_rank"], scores["pool/R@1"] == scores["RD2/R@1"]
        (0.333, 2.0, True)
    """

    PROTOCOLS = ("rd", "pool", "bags")

    def __init__(
        self,
        retriever: Any,
        records: Sequence[Any],
        cache_dir: str | Path | None = None,
        extra_records: Sequence[Any] = (),
        n_distractors: int = 99,
        draws: int = 3,
        seed: int = 0,
        bags: Sequence[Sequence[Hashable]] | None = None,
        protocols: Sequence[str] = ("rd", "pool", "bags"),
        ks: Sequence[int] = KS,
    ) -> None:
        bad = [p for p in protocols if p not in self.PROTOCOLS]
        if bad:
            raise ValueError(f"unknown self-retrieval protocol(s) {bad}; valid: {', '.join(self.PROTOCOLS)}")
        self.retriever = retriever
        self.records = list(records)
        self.image_ids = [r.image_id for r in self.records] + [r.image_id for r in extra_records]
        # unique as ids are read (1 and "1": one image, whose second column would be its own distractor)
        refuse_repeated_ids(self.image_ids, "self-retrieval images (records + extra_records)")
        self.column = {i: c for c, i in enumerate(self.image_ids[: len(self.records)])}
        self.image_emb = retriever.image_embeddings([*self.records, *extra_records], cache_dir)  # (N, D)
        self.n_distractors, self.draws, self.seed = n_distractors, draws, seed
        self.bags = bags
        self.protocols = tuple(protocols)
        self.ks = tuple(ks)

    def _queries(self, predictions: Mapping[Hashable, str | Sequence[str]]) -> tuple[list[Hashable], list[str]]:
        """The query ids (each caption's image, as the records write its id: ``1`` and ``"1"`` are one image,
        :func:`~finecap.data.records.id_keys`) and the captions; a ``KeyError`` naming the predicted ids that name
        no retrieval image, and some of theirs. Two predicted ids naming one image (``1`` and ``"1"``) are a
        ``ValueError`` (:func:`~finecap.data.records.refuse_repeated_ids`): give an image's captions as one list."""
        refuse_repeated_ids(predictions, "self-retrieval predictions")
        found, missing = id_keys(predictions, self.column)
        if missing:
            raise KeyError(f"predictions for {len(missing)} image(s) not among the retrieval images: "
                           f"{some_ids(missing)}; their ids are e.g. {some_ids(self.column)}")  # fmt: skip
        ids, texts = [], []
        for image_id, caps in predictions.items():
            for cap in [caps] if isinstance(caps, str) else caps:
                ids.append(found[image_id])
                texts.append(cap)
        return ids, texts

    def encode(self, predictions: Mapping[Hashable, str | Sequence[str]]) -> tuple[list[Hashable], TextEncoding]:
        """Query image ids and the captions' embeddings with their lengths (:func:`encode_texts`; the note of
        those longer than the text window is logged)."""
        ids, texts = self._queries(predictions)
        encoding = encode_texts(self.retriever, texts, ids)
        log_note(encoding, "retrieval")
        return ids, encoding

    def score_matrix(self, encoding: TextEncoding) -> np.ndarray:
        """The cosine score matrix ``(Q, N)`` of encoded captions against all pool images."""
        return (encoding.embeddings @ self.image_emb.T).numpy()  # (Q, N)

    def scores(self, predictions: Mapping[Hashable, str | Sequence[str]]) -> tuple[list[Hashable], np.ndarray]:
        """Query image ids and the cosine score matrix ``(Q, N)`` of the captions against all pool images."""
        ids, encoding = self.encode(predictions)
        return ids, self.score_matrix(encoding)

    def per_item(self, predictions: Mapping[Hashable, str | Sequence[str]]) -> dict[Hashable, float]:
        """RD-N rank of each image's caption (averaged over draws, and over the image's captions)."""
        ids, scores = self.scores(predictions)
        targets = np.array([self.column[i] for i in ids], dtype=np.int64)
        ranks = rd_ranks(scores, targets, self.n_distractors, self.draws, self.seed).mean(axis=0)  # (Q,)
        out: dict[Hashable, list[float]] = {}
        for i, r in zip(ids, ranks):
            out.setdefault(i, []).append(float(r))
        return {i: float(np.mean(v)) for i, v in out.items()}

    def __call__(
        self, predictions: Mapping[Hashable, str | Sequence[str]], references: Any = None
    ) -> dict[str, float]:
        ids, encoding = self.encode(predictions)
        scores = self.score_matrix(encoding)
        targets = np.array([self.column[i] for i in ids], dtype=np.int64)
        out: dict[str, float] = {}
        if "rd" in self.protocols:
            rd = rd_retrieval(scores, targets, self.n_distractors, self.draws, self.seed, self.ks)
            out.update({f"RD{self.n_distractors}/{k}": v for k, v in rd.items()})
        if "pool" in self.protocols:
            out.update({f"pool/{k}": v for k, v in pool_retrieval(scores, targets, self.ks).items()})
        if "bags" in self.protocols and self.bags:
            out.update(bag_retrieval(scores, self.bags, self.image_ids, targets, self.ks))
        return out | encoding.counts("retrieval")
