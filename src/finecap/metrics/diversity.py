"""Diversity and vocabulary metrics of generated captions, and sentence-level pairwise BLEU.

Corpus-level, over one caption per image (``(predictions, references) -> dict``; references are not used), on
captions as written:

- ``Length``: mean caption length in words (SMILE Table 1).
- ``Lexical diversity``: number of distinct words over all captions (SMILE Sec. 3.1, "unique word count of all
  captions").
- ``Vocab usage``: number of distinct words used at least ``min_count = 5`` times (NDLB Table 6, over the captions
  of the test images; the paper does not say how it splits words: here as every count, below).

Set-level, over the s captions sampled per image (sequence-level exploration paper, Sec. 3.2, after Shetty et al.
2017; ``samples: dict[id, list[str]]``):

- ``Div-1`` / ``Div-2``: per image, the number of distinct unigrams / bigrams among its s captions divided by the
  total number of words of the s captions, averaged over images. As in the reference implementation used for the
  papers' numbers (Shetty et al.'s ``compute_div_n``, also self-critical.pytorch's ``eval_div_stats``) the
  denominator is ``total words + 1e-6`` (so an image whose captions are all empty scores 0).
- ``mBLEU-4``: for each sample index i, corpus BLEU-4 (pycocoevalcap) of the i-th caption of every image against the
  image's other s-1 captions as references; the mean over i. Per image: the mean over its captions of their
  sentence-level BLEU-4 against the other s-1. Images with different numbers of samples are allowed: round i uses the
  images that have an i-th caption. Every image needs s >= 2.

Words: every length and vocabulary count of the package (these metrics, the ``captions`` training validator, the
``length`` / ``vocab`` evaluation groups) uses :func:`caption_words`, the whitespace-separated tokens of the caption's
PTB tokenisation (:func:`finecap.metrics.ptb_tokenize.tokenize`: lower-cased, punctuation dropped, contractions
split as ``ca n't`` and ``man 's``). That is how pycocoevalcap, and so the n-gram metrics, see a caption; a plain
``str.split()`` would count ``circle.`` and ``Circle`` as new words. The set-level metrics below take captions
already tokenised (words separated by spaces), as the n-gram metrics do.

Pairwise BLEU (the sequence-level exploration distance): :func:`pairwise_bleu` gives ``B[i, j]`` = sentence-level
BLEU-n of caption i as hypothesis against caption j as the single reference, computed exactly as pycocoevalcap's
per-image BLEU: clipped n-gram precisions ``(correct + 1e-15) / (guess + 1e-9)``, geometric mean of orders 1..n,
brevity penalty ``exp(1 - len_j / len_i)`` when caption i is shorter than caption j. It is not symmetric (the
brevity penalty and the precisions' denominators depend on which caption is the hypothesis). Because of the smoothing
constants, a caption shorter than n words has BLEU-n near 0 even against itself (e.g. a 2-word caption: BLEU-3 =
(1 * 1 * 1e-6)^(1/3) = 0.01). :func:`bleu_distance` turns this into the paper's distance
``d(y, y') = 1 - (BLEU-3 + BLEU-4) / 2``.

Example::

    >>> round(float(pairwise_bleu(["a red circle", "a red square"], 2)[0, 1]), 4)
    0.5774
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence

import numpy as np

from finecap.metrics.ngram import bleu_per_item
from finecap.metrics.ngram.counting import Grams, bleu_from_counts, count_ngrams
from finecap.metrics.ptb_tokenize import tokenize

__all__ = [
    "bleu_distance",
    "caption_length",
    "caption_words",
    "div_n",
    "lexical_diversity",
    "mbleu",
    "mean_length",
    "pairwise_bleu",
    "pairwise_bleu_groups",
    "set_diversity",
    "set_diversity_per_item",
    "vocabulary_metrics",
    "vocabulary_usage",
]

PerItem = dict[Hashable, dict[str, float]]


# --------------------------------------------------------------------------------------------------------------------
# Corpus-level vocabulary metrics
# --------------------------------------------------------------------------------------------------------------------


def caption_words(caption: str) -> list[str]:
    """The words of a caption as finecap counts them: the tokens of its PTB tokenisation (module docstring).

    Example::

        >>> caption_words("A man's dog can't swim.")
        ['a', 'man', "'s", 'dog', 'ca', "n't", 'swim']
    """
    return tokenize(caption).split()


def caption_length(caption: str) -> int:
    """Length of a caption in words (:func:`caption_words`): the one definition of caption length.

    Example::

        >>> caption_length("A red circle, on grass.")
        5
    """
    return len(caption_words(caption))


def mean_length(captions: Iterable[str]) -> float:
    """Mean :func:`caption_length` of captions as written; 0.0 for no captions."""
    lengths = [caption_length(c) for c in captions]
    return float(np.mean(lengths)) if lengths else 0.0


def _word_counts(captions: Iterable[str]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for c in captions:
        counts.update(caption_words(c))
    return counts


def lexical_diversity(captions: Iterable[str]) -> int:
    """Number of distinct words (:func:`caption_words`) over all captions."""
    return len(_word_counts(captions))


def vocabulary_usage(captions: Iterable[str], min_count: int = 5) -> int:
    """Number of distinct words (:func:`caption_words`) used at least ``min_count`` times over all captions (NDLB
    Table 6: 5)."""
    return sum(1 for n in _word_counts(captions).values() if n >= min_count)


def vocabulary_metrics(
    predictions: Mapping[Hashable, str],
    references: Mapping[Hashable, Sequence[str]] | None = None,
    *,
    min_count: int = 5,
) -> dict[str, float]:
    """``Length``, ``Lexical diversity`` and ``Vocab usage`` of the predicted captions (references unused)."""
    caps = list(predictions.values())
    counts = _word_counts(caps)
    return {
        "Length": mean_length(caps),
        "Lexical diversity": float(len(counts)),
        "Vocab usage": float(sum(1 for n in counts.values() if n >= min_count)),
    }


# --------------------------------------------------------------------------------------------------------------------
# Set-level diversity over s samples per image
# --------------------------------------------------------------------------------------------------------------------


def _check_samples(samples: Mapping[Hashable, Sequence[str]], min_size: int) -> list[Hashable]:
    ids = list(samples)
    if not ids:
        raise ValueError("samples: empty, nothing to evaluate")
    for i in ids:
        s = samples[i]
        if isinstance(s, str):
            raise TypeError(f"samples[{i!r}]: expected a list of sampled captions, got a string")
        if len(s) < min_size:
            raise ValueError(f"samples[{i!r}]: needs at least {min_size} captions, got {len(s)}")
    return ids


def div_n(samples: Mapping[Hashable, Sequence[str]], n: int) -> tuple[float, dict[Hashable, float]]:
    """Div-n: (mean over images, per image) of distinct n-grams / (total words + 1e-6) over each image's captions."""
    ids = _check_samples(samples, 1)
    per: dict[Hashable, float] = {}
    for i in ids:
        grams: set[tuple[str, ...]] = set()
        total = 0
        for c in samples[i]:
            w = c.split()
            total += len(w)
            grams.update(zip(*(w[k:] for k in range(n))))
        per[i] = len(grams) / (1e-6 + total)
    return float(np.mean(list(per.values()))), per


def mbleu(samples: Mapping[Hashable, Sequence[str]], n: int = 4) -> tuple[float, dict[Hashable, float]]:
    """mBLEU-n: (mean over sample index i of corpus BLEU-n of the i-th captions against the others, per-image mean of
    the captions' sentence BLEU-n against the image's other captions)."""
    ids = _check_samples(samples, 2)
    rounds = []
    per_sum = dict.fromkeys(ids, 0.0)
    for i in range(max(len(samples[k]) for k in ids)):
        preds = {k: samples[k][i] for k in ids if len(samples[k]) > i}
        refs = {k: [c for j, c in enumerate(samples[k]) if j != i] for k in preds}
        corpus, per = bleu_per_item(preds, refs, n)
        rounds.append(corpus[f"BLEU-{n}"])
        for k in preds:
            per_sum[k] += per[k][f"BLEU-{n}"]
    return float(np.mean(rounds)), {k: per_sum[k] / len(samples[k]) for k in ids}


def set_diversity_per_item(samples: Mapping[Hashable, Sequence[str]]) -> tuple[dict[str, float], PerItem]:
    """``Div-1``, ``Div-2`` and ``mBLEU-4`` over the captions sampled per image: ``(corpus, per_item)``."""
    d1, p1 = div_n(samples, 1)
    d2, p2 = div_n(samples, 2)
    mb, pm = mbleu(samples, 4)
    per = {k: {"Div-1": p1[k], "Div-2": p2[k], "mBLEU-4": pm[k]} for k in p1}
    return {"Div-1": d1, "Div-2": d2, "mBLEU-4": mb}, per


def set_diversity(samples: Mapping[Hashable, Sequence[str]]) -> dict[str, float]:
    """``Div-1``, ``Div-2`` and ``mBLEU-4`` (corpus values) of ``{image id: [s sampled captions]}``."""
    return set_diversity_per_item(samples)[0]


# --------------------------------------------------------------------------------------------------------------------
# Pairwise sentence-level BLEU
# --------------------------------------------------------------------------------------------------------------------


def pairwise_bleu_groups(groups: Sequence[Sequence[str]], max_n: int = 4) -> np.ndarray:
    """Sentence BLEU-1..max_n of every ordered pair within each group: (G, max_n, s, s), all groups of equal size s.

    ``out[g, k-1, i, j]`` is BLEU-k of ``groups[g][i]`` (hypothesis) against ``groups[g][j]`` (single reference),
    pycocoevalcap's per-image formula (see the module docstring). Vectorised over all groups at once.
    """
    G = len(groups)  # noqa: N806
    if G == 0:
        return np.zeros((0, max_n, 0, 0))
    s = len(groups[0])
    if any(len(g) != s for g in groups):
        raise ValueError(f"pairwise_bleu_groups: all groups need the same number of captions (first has {s})")
    if s == 0:
        return np.zeros((G, max_n, 0, 0))
    captions = [c for g in groups for c in g]
    grams = Grams(captions, max_n)
    C = len(captions)  # noqa: N806
    lengths = grams.lengths  # (C,)
    group_of = np.arange(C) // s
    correct = np.zeros((max_n, C, s), dtype=np.int64)  # correct[k, i, local j]
    for k in range(1, max_n + 1):
        p, ids = grams.own[k - 1]
        sent = grams.sent if k == 1 else grams.sent[p]
        size = grams.sizes[k - 1]
        c, g, tf = count_ngrams(sent, ids, size)  # distinct n-grams per caption, sorted by (caption, id)
        if len(c) == 0:
            continue
        # group entries by (group, n-gram): every pair of entries in a block shares the n-gram
        key = group_of[c] * size + g
        order = np.argsort(key, kind="stable")
        key, c, tf = key[order], c[order], tf[order]
        start = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        block = np.repeat(np.arange(len(start)), np.diff(np.r_[start, len(key)]))
        bsize = np.diff(np.r_[start, len(key)])[block]  # (E,) size of each entry's block
        a = np.repeat(np.arange(len(key)), bsize)  # (P,) first entry of each pair
        offset = np.arange(len(a)) - np.repeat(np.cumsum(bsize) - bsize, bsize)
        b = start[block][a] + offset  # (P,) second entry
        np.add.at(correct[k - 1], (c[a], c[b] % s), np.minimum(tf[a], tf[b]))
    guess = np.maximum(0, lengths[:, None] - np.arange(max_n)[None, :])  # (C, max_n)
    # rows: (hypothesis i, reference j) pairs within each group
    i_idx = np.repeat(np.arange(C), s)  # (C*s,)
    j_idx = (i_idx // s) * s + np.tile(np.arange(s), C)
    bleu = bleu_from_counts(
        correct.transpose(1, 2, 0).reshape(C * s, max_n).astype(np.float64),
        guess[i_idx].astype(np.float64),
        lengths[i_idx],
        lengths[j_idx],
    )  # (C*s, max_n)
    return bleu.reshape(G, s, s, max_n).transpose(0, 3, 1, 2)


def pairwise_bleu(captions: Sequence[str], n: int) -> np.ndarray:
    """Sentence BLEU-n of every ordered pair of ``captions``: (s, s), ``[i, j]`` = caption i against caption j."""
    if n < 1:
        raise ValueError(f"pairwise_bleu: n must be >= 1, got {n}")
    return pairwise_bleu_groups([captions], n)[0, n - 1]


def bleu_distance(groups: Sequence[Sequence[str]], orders: Sequence[int] = (3, 4)) -> np.ndarray:
    """d(y_i, y_j) = 1 - mean over ``orders`` of BLEU-k(y_i, y_j), within each group: (G, s, s).

    With the default orders this is the sequence-level exploration distance ``1 - (BLEU-3 + BLEU-4) / 2``.
    """
    b = pairwise_bleu_groups(groups, max(orders))  # (G, max_n, s, s)
    return 1.0 - b[:, [k - 1 for k in orders]].mean(axis=1)


def _ngram_counts(words: Sequence[str], n: int) -> Counter[tuple[str, ...]]:
    return Counter(zip(*(words[k:] for k in range(n))))


def ngram_overlap(a: Sequence[str], b: Sequence[str], n: int) -> float:
    """Overlap coefficient of the n-grams of two word lists: shared n-grams (counts clipped, as BLEU clips them)
    over the n-grams of the *shorter* one; order ``min(n, shorter length)`` when the shorter has fewer than n words
    (its whole word sequence is then its one n-gram). Two empty captions overlap fully (1), an empty and a non-empty
    one not at all (0).

    >>> ngram_overlap("a red circle".split(), "a red circle on the grass".split(), 3)  # contained: 1
    1.0
    >>> ngram_overlap("a red circle on grass".split(), "a blue circle on grass".split(), 3)  # 1 of 3 trigrams
    0.3333333333333333
    """
    short = min(len(a), len(b))
    if short == 0:
        return float(len(a) == len(b))
    k = min(n, short)
    ca, cb = _ngram_counts(a, k), _ngram_counts(b, k)
    return sum((ca & cb).values()) / (short - k + 1)


def overlap_distance(groups: Sequence[Sequence[str]], orders: Sequence[int] = (3, 4)) -> np.ndarray:
    """d(y_i, y_j) = 1 - mean over ``orders`` of :func:`ngram_overlap` (y_i, y_j), within each group: (G, s, s).

    A length-neutral counterpart of :func:`bleu_distance` (``sle.distance=overlap34``): the shared n-grams are
    divided by those of the shorter caption, so a caption whose n-grams all occur in another (one that stops sooner,
    or the other one that goes on) is at distance 0 from it: saying less or more is not difference, saying it
    otherwise is; it is symmetric by construction and needs no
    smoothing. Captions are tokenised (words separated by spaces).

    >>> overlap_distance([["a red circle", "a red circle on the grass", "two blue squares"]])[0].round(3).tolist()
    [[0.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]]
    """
    words = [[c.split() for c in g] for g in groups]
    s = len(words[0]) if words else 0
    if any(len(g) != s for g in words):
        raise ValueError(f"overlap_distance: all groups need the same number of captions (first has {s})")
    out = np.zeros((len(words), s, s))
    for g, captions in enumerate(words):
        for i in range(s):
            for j in range(i + 1, s):
                overlap = sum(ngram_overlap(captions[i], captions[j], n) for n in orders) / len(orders)
                out[g, i, j] = out[g, j, i] = 1.0 - overlap
    return out
