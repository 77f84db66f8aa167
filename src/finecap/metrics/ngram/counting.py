"""Word and n-gram ids and counts, shared by the n-gram engines (:mod:`.index`, :mod:`.bleu_scorer`,
:mod:`.rouge_scorer`) and by the diversity metrics' self-BLEU (:mod:`finecap.metrics.diversity`): the input checks,
the ids of words and n-grams of a sentence collection (:class:`Grams`), distinct n-gram counts per sentence
(:func:`count_ngrams`) and pycocoevalcap's BLEU from clipped counts (:func:`bleu_from_counts`).

Example::

    >>> grams = Grams(["a red circle", "a red square"], n=2)
    >>> (occurrences, lengths) = grams.lookup(["a red red"])
    >>> lengths.tolist(), [len(ids) for _, ids in occurrences]  # 3 words; 3 unigrams and 2 bigrams
    ([3], [3, 2])
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence
from itertools import chain, count, repeat

import numpy as np

from finecap.data.records import id_keys, refuse_repeated_ids
from finecap.metrics.word_ids import split_ids

_TINY = 1e-15  # pycocoevalcap bleu_scorer: "so that if guess is 0 still return 0"
_SMALL = 1e-9

PerItem = dict[Hashable, dict[str, float]]
"""Per-image scores: ``{image id: {metric: score}}``."""


# --------------------------------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------------------------------


def align(
    predictions: Mapping[Hashable, str], references: Mapping[Hashable, Sequence[str]]
) -> tuple[list[Hashable], list[str], list[list[str]]]:
    """Ids, predictions and reference lists in prediction order; errors name the offending id. A prediction's
    references are found whether either side writes its id as an int or as its string
    (:func:`~finecap.data.records.id_keys`); two predictions, or references, naming one image (``1`` and ``"1"``)
    are a ``ValueError`` (:func:`~finecap.data.records.refuse_repeated_ids`)."""
    ids = list(predictions)
    if not ids:
        raise ValueError("predictions: empty, nothing to evaluate")
    refuse_repeated_ids(ids, "predictions")  # one image's two captions: counted twice in the corpus scores
    refuse_repeated_ids(references, "references")  # and its two reference lists: two documents of CIDEr's corpus
    found, missing = id_keys(ids, references)
    if missing:
        raise ValueError(f"references: no entry for prediction id {missing[0]!r}")
    preds = [predictions[i] for i in ids]
    refs = [references[found[i]] for i in ids]
    str_preds = all(type(p) is str for p in preds)  # fast paths: exact types (an ABC isinstance costs ~1 us)
    list_refs = all(type(r) is list and r for r in refs)
    if str_preds and list_refs:
        return ids, preds, refs
    for i, p, r in zip(ids, preds, refs):
        if not isinstance(p, str):
            raise TypeError(f"predictions[{i!r}]: expected a caption string, got {type(p).__name__}")
        if isinstance(r, str) or not isinstance(r, Sequence):
            raise TypeError(f"references[{i!r}]: expected a list of caption strings, got {type(r).__name__}")
        if len(r) == 0:
            raise ValueError(f"references[{i!r}]: empty list of reference captions")
    return ids, preds, [list(r) for r in refs]


def check_strings(name: str, ids: Sequence[Hashable], lists: Sequence[Sequence[str]]) -> None:
    """Slow path after a failed join: name the first non-string reference."""
    for i, r in zip(ids, lists):
        for x in r:
            if not isinstance(x, str):
                raise TypeError(f"{name}[{i!r}]: expected caption strings, found {type(x).__name__}")


# --------------------------------------------------------------------------------------------------------------------
# Word and n-gram ids
# --------------------------------------------------------------------------------------------------------------------

_SENTINEL = "\x01"  # joins sentences for one big str.split (not whitespace for str.split())
_OTHER_ASCII_WS = tuple(c for c in map(chr, range(128)) if c.isspace() and c != " ")


def _single_spaced(joined: str) -> bool:
    """Whether ``joined.split(" ") == joined.split()``: non-empty, single spaces only, none at either end."""
    return (joined != "" and "  " not in joined and joined[0] != " " and joined[-1] != " "
            and not any(c in joined for c in _OTHER_ASCII_WS))  # fmt: skip


def _word_ids(tokens: list[str], vocab: dict[str, int] | None) -> tuple[dict[str, int], np.ndarray]:
    """Ids of the tokens through a dict: a new vocabulary (first-appearance order), or ``vocab`` extended."""
    if vocab is None:
        ids: defaultdict[str, int] = defaultdict(count().__next__)  # new word -> next id, all in C
        words = np.fromiter(map(ids.__getitem__, tokens), dtype=np.int64, count=len(tokens))
        vocab = dict(ids)
        vocab.setdefault(_SENTINEL, len(vocab))
        return vocab, words
    W = len(vocab)  # noqa: N806
    words = np.fromiter(map(vocab.get, tokens, repeat(-1)), dtype=np.int64, count=len(tokens))
    unknown = np.flatnonzero(words < 0)
    if len(unknown):
        local: dict[str, int] = {}
        words[unknown] = [W + local.setdefault(tokens[i], len(local)) for i in unknown]
    return vocab, words


def encode(
    sentences: Sequence[str], vocab: dict[str, int] | None = None, sep: str | None = None, flags: dict | None = None
) -> tuple[dict[str, int], np.ndarray, np.ndarray]:
    """Word ids of ``s.split(sep)`` for every sentence, concatenated, and the sentence lengths.

    With ``vocab=None`` a vocabulary of all words is built (dense ids in an arbitrary order) and returned; with a
    given ``vocab`` unknown words get ids ``len(vocab), len(vocab) + 1, ...`` (equal words, equal ids).
    Works on the sentences joined by a sentinel token: a new vocabulary with ``str.split()`` words comes from
    :func:`finecap.metrics.word_ids.split_ids` (numpy on the bytes, no string per token; also for ``sep=" "`` when
    the text is single-spaced, so that ``split(" ") == split()``);
    otherwise one ``split`` of the joined text (several times faster than one per sentence) and a dict lookup per
    token; per-sentence splitting if a sentence contains the sentinel character.
    ``flags`` (a dict), with ``sep=None``: ``flags["space_split"]`` tells whether every sentence's ``split(" ")``
    gives the same words as its ``split()`` (single spaces only, no empty sentence; then ROUGE-L can reuse the ids).
    """
    S = len(sentences)  # noqa: N806
    joined = f" {_SENTINEL} ".join(sentences)
    fast = joined.count(_SENTINEL) == max(S - 1, 0)
    # split(" ") gives split()'s words when the only whitespace is single spaces between words
    by_bytes = fast and vocab is None and (sep is None or (sep == " " and _single_spaced(joined)))
    stats: dict = {}
    coded = split_ids(joined, stats) if by_bytes else None
    if coded is not None:  # word ids straight from the bytes, no Python string per token
        words, vocab_words = coded
        vocab = dict(zip(vocab_words, range(len(vocab_words))))
        vocab.setdefault(_SENTINEL, len(vocab))
        if flags is not None and sep is None:
            flags["space_split"] = stats["single_spaced"]
    elif fast:
        tokens = joined.split(sep) if S else []
        if flags is not None and sep is None:
            flags["space_split"] = joined.split(" ") == tokens
    else:
        split = [x.split(sep) for x in sentences]
        tokens = list(chain.from_iterable(split))
    if coded is None:
        vocab, words = _word_ids(tokens, vocab)
    if not fast:
        return vocab, words, np.fromiter(map(len, split), dtype=np.int64, count=S)
    if S == 0:
        return vocab, words, np.zeros(0, dtype=np.int64)
    is_sep = words == vocab[_SENTINEL]
    cuts = np.flatnonzero(is_sep)
    lengths = np.diff(np.concatenate([[-1], cuts, [len(words)]])) - 1
    if len(cuts):
        words = words[~is_sep]
    return vocab, words, lengths.astype(np.int64)


def token_layout(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For every token: its sentence index and the number of tokens from it to the end of its sentence."""
    sent = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)  # (T,)
    starts = np.cumsum(lengths) - lengths
    pos = np.arange(int(lengths.sum()), dtype=np.int64) - starts[sent]  # (T,)
    return sent, lengths[sent] - pos


def sort_order(code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(np.sort(code), np.argsort(code, kind="stable"))`` for non-negative int64 codes.

    Packs the position into the low bits of the key when it fits, so that one plain ``np.sort`` (SIMD-accelerated
    in numpy >= 2) replaces the much slower ``argsort``.
    """
    m = len(code)
    bits = max(int(m).bit_length(), 1)
    if m and int(code.max()) < 1 << (62 - bits):
        key = np.sort((code << bits) | np.arange(m, dtype=np.int64))
        return key >> bits, key & ((1 << bits) - 1)
    order = np.argsort(code, kind="stable")
    return code[order], order


def dense_ids(code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(code, return_inverse=True)`` for non-negative int64 codes (sort-based, see :func:`sort_order`)."""
    m = len(code)
    if m == 0:
        return code, code
    sorted_code, order = sort_order(code)
    new = np.empty(m, dtype=bool)
    new[0] = True
    np.not_equal(sorted_code[1:], sorted_code[:-1], out=new[1:])
    inv = np.empty(m, dtype=np.int64)
    inv[order] = np.cumsum(new) - 1
    return sorted_code[new], inv


def find_sorted(table: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the queries ``q`` in the sorted array ``table``: (indices of the found queries, positions).

    Queries are sorted first when they are not (binary search over sorted queries stays in cache: several times
    faster than random queries into a large table).
    """
    if len(table) == 0 or len(q) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if len(q) > 1 and not bool(np.all(q[1:] >= q[:-1])):
        qs, order = sort_order(q)
        pos = np.minimum(np.searchsorted(table, qs), len(table) - 1)
        hit = table[pos] == qs
        return order[hit], pos[hit]
    pos = np.minimum(np.searchsorted(table, q), len(table) - 1)
    hit = table[pos] == q
    return np.flatnonzero(hit), pos[hit]


class HashTable:
    """Bucketed hash map from the entries of a sorted int64 array to their positions.

    Keys are grouped by bucket (Fibonacci hashing, 2-4 keys per bucket on average), stored bucket after bucket; a
    lookup reads the first 8 keys from its bucket's start (one or two cache lines) and compares them at once, so a
    batch of queries costs a handful of vectorised operations. Keys beyond the 8th of a bucket are searched in a
    small sorted overflow array. For a few thousand queries into a table of millions this is faster than
    ``np.searchsorted``, whose binary search misses the cache at every step. Memory: about 20 bytes per key.
    """

    _MUL = np.uint64(0x9E3779B97F4A7C15)
    WIDTH = 8

    def __init__(self, keys: np.ndarray):
        self.keys = keys
        bits = max(int(max(len(keys) // 4, 1)).bit_length(), 1)
        self.shift = np.uint64(64 - bits)
        sorted_bucket, order = sort_order(self._bucket(keys))
        self.start = np.searchsorted(sorted_bucket, np.arange((1 << bits) + 1))  # keys of bucket b: start[b]..
        self.sorted_keys = np.concatenate([keys[order], np.full(self.WIDTH, -1, dtype=keys.dtype)])
        self.sorted_pos = order.astype(np.int32 if len(keys) < 2**31 else np.int64)
        rank = np.arange(len(keys)) - self.start[sorted_bucket]
        over = rank >= self.WIDTH
        self.overflow = np.sort(order[over])  # positions of keys past the 8th of their bucket (keys are sorted)
        self.overflow_keys = keys[self.overflow]
        self.spilled = np.diff(self.start) > self.WIDTH

    def _bucket(self, q: np.ndarray) -> np.ndarray:
        return ((q.astype(np.uint64) * self._MUL) >> self.shift).astype(np.int64)

    def find(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Like :func:`find_sorted`: (indices of the queries present, their positions in ``keys``)."""
        b = self._bucket(q)
        first = self.start[b]
        # keys of other buckets never equal q (they hash elsewhere) and the padding is -1: no mask needed
        eq = self.sorted_keys[first[:, None] + np.arange(self.WIDTH)] == q[:, None]  # (m, 8)
        hit = eq.any(axis=1)
        found = np.flatnonzero(hit)
        pos = self.sorted_pos[first[found] + eq[found].argmax(axis=1)].astype(np.int64)
        if len(self.overflow):
            miss = np.flatnonzero(~hit & self.spilled[b])
            f2, p2 = find_sorted(self.overflow_keys, q[miss])
            found, pos = np.concatenate([found, miss[f2]]), np.concatenate([pos, self.overflow[p2]])
        return found, pos


class Grams:
    """Dense integer ids of all word n-grams (orders 1..n) of a fixed sentence collection (``str.split()`` words).

    Order 1 ids are word ids. A k-gram (k >= 2) is coded as ``id(its (k-1)-gram prefix) * W + id(last word)``; the
    sorted unique codes of the collection form ``tables[k-1]`` and a k-gram's id is its position there, so ids stay
    dense (no overflow whatever the vocabulary) and new sentences are looked up with ``np.searchsorted``.
    """

    def __init__(self, sentences: Sequence[str], n: int, keep_words: bool = False):
        self.n = n
        flags: dict = {}
        self.vocab, words, lengths = encode(sentences, flags=flags if keep_words else None)
        # (word ids, lengths) of every sentence when they are also its ``split(" ")`` words (for ROUGE-L)
        self.space_words = (words, lengths) if flags.get("space_split") else None
        self.W = len(self.vocab)
        sent, rem = token_layout(lengths)
        self.tables: list[np.ndarray] = [np.arange(self.W, dtype=np.int64)]
        self.sizes = [self.W]
        # ids of the collection's own sentences, per order: (flat start positions, ids)
        self.own: list[tuple[np.ndarray, np.ndarray]] = [(np.arange(len(words)), words)]
        prev = words
        for k in range(2, n + 1):
            p = np.flatnonzero(rem >= k)
            code = prev[p] * self.W + words[p + k - 1]  # (P,)
            uniq, inv = dense_ids(code)
            cur = np.full(len(words), -1, dtype=np.int64)
            cur[p] = inv
            self.tables.append(uniq)
            self.sizes.append(len(uniq))
            self.own.append((p, inv))
            prev = cur
        self.sent = sent
        self.lengths = lengths
        self._hashes: dict[int, HashTable] = {}

    def _find(self, k: int, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions of order-k codes in ``tables[k-1]``; few queries into a big table go through a hash table."""
        table = self.tables[k - 1]
        if len(q) * 16 >= len(table):
            return find_sorted(table, q)
        if k not in self._hashes:
            self._hashes[k] = HashTable(table)
        return self._hashes[k].find(q)

    def lookup(self, sentences: Sequence[str]) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
        """Ids of the n-grams of new sentences, per order: (sentence of each occurrence, id).

        Known n-grams get their table id (< ``sizes[k-1]``); n-grams absent from the collection get ids from
        ``sizes[k-1]`` upwards, equal for equal n-grams within this call (so term frequencies stay right).
        Returns the per-order occurrences and the sentence lengths in words.
        """
        _, words, lengths = encode(sentences, self.vocab)
        w_ext = int(words.max()) + 1 if len(words) else self.W  # bound of the extended word ids
        sent, rem = token_layout(lengths)
        out = [(sent, words)]
        p, prev = np.arange(len(words)), words  # start positions of the (k-1)-grams and their ids
        for k in range(2, self.n + 1):
            keep = rem[p] >= k  # k-grams start where a (k-1)-gram does and one more word follows
            p, a = p[keep], prev[keep]
            b = words[p + k - 1]
            ids = np.full(len(p), -1, dtype=np.int64)
            known = np.flatnonzero((a < self.sizes[k - 2]) & (b < self.W))
            found, pos = self._find(k, a[known] * self.W + b[known])
            ids[known[found]] = pos
            new = np.flatnonzero(ids < 0)
            if len(new):
                ids[new] = self.sizes[k - 1] + dense_ids(a[new] * w_ext + b[new])[1]
            out.append((sent[p], ids))
            prev = ids
        return out, lengths


def key_bits(n: int) -> int:
    """Bits that hold the values ``0 .. n - 1`` (at least 1)."""
    return max(int(n - 1).bit_length(), 1)


def count_ngrams(sent: np.ndarray, ids: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sentence, id, term frequency) of every distinct n-gram of every sentence, sorted by (sentence, id)."""
    b = key_bits(bound)  # keys packed with shifts: no integer division (not vectorised) to unpack them
    key, tf = np.unique((sent << b) | ids, return_counts=True)
    return key >> b, key & ((1 << b) - 1), tf


def count_ngrams_first(
    sent: np.ndarray, ids: np.ndarray, bound: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`count_ngrams` and, for each distinct n-gram, the index of its first occurrence in ``(sent, ids)``
    (occurrences in text order: the order in which pycocoevalcap's ``precook`` meets the n-grams)."""
    b = key_bits(bound)
    key, first, tf = np.unique((sent << b) | ids, return_index=True, return_counts=True)
    return key >> b, key & ((1 << b) - 1), tf, first


def order_of_distinct(values: np.ndarray, bound: int) -> np.ndarray:
    """``np.argsort(values)`` of distinct integers ``0 <= values < bound``, by one scatter into ``bound`` slots (a
    counting sort, linear) instead of a comparison sort: CIDEr-D's summing orders, whose values are occurrence
    positions (:class:`~finecap.metrics.ngram.index.RefIndex`; 4-6 ms a sort of 500,000 against 1 ms).

    Example::

        >>> order_of_distinct(np.array([7, 2, 5, 0]), 8).tolist()
        [3, 1, 2, 0]
    """
    at = np.full(bound, -1, dtype=np.int64)
    at[values] = np.arange(len(values))
    return at[at >= 0]


def closest_ref_length(ref_words: np.ndarray, testlen: np.ndarray) -> np.ndarray:
    """pycocoevalcap 'closest': ``min((abs(l - testlen), l) for l in reflens)[1]`` per row; padding is -1."""
    big = np.iinfo(np.int64).max // 4
    diff = np.where(ref_words >= 0, np.abs(ref_words - testlen[:, None]), big)
    key = np.where(ref_words >= 0, diff * (int(ref_words.max(initial=0)) + 1) + ref_words, big)
    return np.take_along_axis(ref_words, key.argmin(axis=1)[:, None], axis=1)[:, 0]


def bleu_from_counts(correct: np.ndarray, guess: np.ndarray, testlen: np.ndarray, reflen: np.ndarray) -> np.ndarray:
    """BLEU-1..n of rows of counts with pycocoevalcap's smoothing constants and brevity penalty: (rows, n)."""
    n = correct.shape[1]
    out = np.empty(correct.shape, dtype=np.float64)
    bleu = np.ones(len(correct))
    for k in range(n):
        bleu = bleu * ((correct[:, k] + _TINY) / (guess[:, k] + _SMALL))
        # Python's float power (C's pow), as pycocoevalcap: numpy's vectorised power can differ in the last bit
        out[:, k] = bleu if k == 0 else list(map(pow, bleu.tolist(), repeat(1.0 / (k + 1))))
    ratio = (testlen + _TINY) / (reflen + _SMALL)
    short = ratio < 1
    # math.exp, as pycocoevalcap: numpy's vectorised exp can differ from the C library's in the last bit
    penalty = np.fromiter(map(math.exp, (1 - 1 / ratio[short]).tolist()), dtype=np.float64, count=int(short.sum()))
    out[short] *= penalty[:, None]
    return out


def per_item_rows(ids: list[Hashable], columns: dict[str, np.ndarray]) -> PerItem:
    names = list(columns)
    rows = np.stack([columns[k] for k in names], axis=1).tolist()
    return {i: dict(zip(names, r)) for i, r in zip(ids, rows)}
