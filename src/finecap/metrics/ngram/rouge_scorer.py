"""ROUGE-L as pycocoevalcap's ``Rouge()``: longest common subsequences, bit-parallel over all pairs at once."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from itertools import chain

import numpy as np

from finecap.metrics.items import corpus_only
from finecap.metrics.ngram.counting import PerItem, align, encode, per_item_rows

_ROUGE_BETA = 1.2


def lcs_lengths(a: Sequence[Sequence[Hashable]], b: Sequence[Sequence[Hashable]]) -> np.ndarray:
    """Length of the longest common subsequence of each pair ``(a[i], b[i])`` of token sequences: (P,) int64.

    Bit-parallel (Hyyrö 2004) over all pairs at once: the shorter side of a pair (if at most 64 tokens) is a bit
    mask; pairs with both sides longer than 64 tokens fall back to the quadratic dynamic programme.
    """
    if len(a) != len(b):
        raise ValueError(f"lcs_lengths: {len(a)} sequences vs {len(b)}")
    vocab: dict[Hashable, int] = {}
    sd = vocab.setdefault
    wa = np.array([sd(t, len(vocab)) for x in a for t in x], dtype=np.int64)
    wb = np.array([sd(t, len(vocab)) for x in b for t in x], dtype=np.int64)
    la = np.fromiter(map(len, a), dtype=np.int64, count=len(a))
    lb = np.fromiter(map(len, b), dtype=np.int64, count=len(b))
    rows = np.arange(len(a))
    return _lcs_pairs(_Flat(wa, la), rows, _Flat(wb, lb), rows)


class _Flat:
    """Sentences as one flat int64 word-id array plus lengths."""

    def __init__(self, words: np.ndarray, lengths: np.ndarray):
        self.words, self.lengths = words, lengths
        self.starts = np.cumsum(lengths) - lengths

    def padded(self, rows: np.ndarray, width: int, pad: int) -> np.ndarray:
        """(len(rows), width) word ids of the given sentences, right-padded with ``pad``."""
        j = np.arange(width)
        idx = self.starts[rows][:, None] + j[None, :]
        valid = j[None, :] < self.lengths[rows][:, None]
        if len(self.words) == 0:
            return np.full(idx.shape, pad, dtype=np.int64)
        return np.where(valid, self.words[np.minimum(idx, len(self.words) - 1)], pad)

    def tokens(self, row: int) -> list[int]:
        return self.words[self.starts[row] : self.starts[row] + self.lengths[row]].tolist()


def _lcs_dp(x: Sequence[int], y: Sequence[int]) -> int:
    prev = [0] * (len(y) + 1)
    for xi in x:
        cur = [0]
        for j, yj in enumerate(y):
            cur.append(prev[j] + 1 if xi == yj else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def _lcs_pairs(a: _Flat, rows_a: np.ndarray, b: _Flat, rows_b: np.ndarray) -> np.ndarray:
    """LCS length of sentence ``rows_a[i]`` of ``a`` with sentence ``rows_b[i]`` of ``b``: (P,) int64."""
    la, lb = a.lengths[rows_a], b.lengths[rows_b]
    out = np.zeros(len(rows_a), dtype=np.int64)
    bits_b = np.flatnonzero((lb <= 64) & (lb > 0) & (la > 0))  # b is the bit side
    bits_a = np.flatnonzero((lb > 64) & (la <= 64) & (la > 0))  # a is the bit side
    out[bits_b] = _lcs_bitparallel(b, rows_b[bits_b], a, rows_a[bits_b])
    out[bits_a] = _lcs_bitparallel(a, rows_a[bits_a], b, rows_b[bits_a])
    for i in np.flatnonzero((lb > 64) & (la > 64)):
        out[i] = _lcs_dp(a.tokens(rows_a[i]), b.tokens(rows_b[i]))
    return out


def _lcs_bitparallel(
    bit: _Flat, bit_rows: np.ndarray, it: _Flat, it_rows: np.ndarray, chunk: int = 4096
) -> np.ndarray:
    """LCS lengths where the ``bit`` side has 1..64 tokens (Hyyrö's bit-vector algorithm, one uint64 per pair)."""
    out = np.zeros(len(bit_rows), dtype=np.int64)
    if len(bit_rows) == 0:
        return out
    m_all, l_all = bit.lengths[bit_rows], it.lengths[it_rows]
    order = np.argsort(l_all, kind="stable")  # similar lengths per chunk keep the padding small
    ones = ~np.uint64(0)
    for start in range(0, len(order), chunk):
        idx = order[start : start + chunk]
        m, L = int(m_all[idx].max()), int(l_all[idx].max())  # noqa: N806
        S = bit.padded(bit_rows[idx], m, -1)  # (P, m)
        T = it.padded(it_rows[idx], L, -2)  # (P, L)
        eq = T[:, :, None] == S[:, None, :]  # (P, L, m): position j of the bit side matches token t
        packed = np.packbits(eq, axis=-1, bitorder="little")  # (P, L, ceil(m / 8))
        masks = np.zeros((len(idx), L, 8), dtype=np.uint8)
        masks[..., : packed.shape[-1]] = packed
        masks = masks.view("<u8")[..., 0]  # (P, L) uint64 match masks
        v = np.full(len(idx), ones)
        for t in range(L):
            u = v & masks[:, t]
            v = (v + u) | (v & ~u)  # wraps at 64 bits; only the low m bits are read
        mb = m_all[idx]
        low = np.where(mb >= 64, ones, (np.uint64(1) << np.minimum(mb, 63).astype(np.uint64)) - np.uint64(1))
        out[idx] = mb - _popcount(v & low)
    return out


def _popcount(x: np.ndarray) -> np.ndarray:
    """Number of set bits of each uint64."""
    if hasattr(np, "bitwise_count"):  # numpy >= 2.0
        return np.bitwise_count(x).astype(np.int64)
    return np.unpackbits(x.view(np.uint8).reshape(len(x), 8), axis=1).sum(axis=1).astype(np.int64)


def rouge_l_arrays(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> np.ndarray:
    """pycocoevalcap ROUGE-L of each prediction against its references (``str.split(" ")`` words): (N,)."""
    _, words, lengths = encode(list(preds) + list(chain.from_iterable(refs)), sep=" ")  # one vocabulary for all
    n_pred_words = int(lengths[: len(preds)].sum())
    n_refs = np.fromiter(map(len, refs), dtype=np.int64, count=len(refs))
    wc, lc = words[:n_pred_words], lengths[: len(preds)]
    return rouge_l_ids(wc, lc, words[n_pred_words:], lengths[len(preds) :], n_refs)


def rouge_l_ids(wc: np.ndarray, lc: np.ndarray, wr: np.ndarray, lr: np.ndarray, n_refs: np.ndarray) -> np.ndarray:
    """ROUGE-L from flat word ids and lengths of the predictions (``wc``, ``lc``) and references (``wr``, ``lr``,
    ``n_refs[i]`` references per prediction, in order): (N,)."""
    img = np.repeat(np.arange(len(lc)), n_refs)  # image of each reference
    lcs = _lcs_pairs(_Flat(wc, lc), img, _Flat(wr, lr), np.arange(len(lr))).astype(np.float64)  # (R,)
    first = np.cumsum(n_refs) - n_refs
    prec = np.maximum.reduceat(lcs / lc[img], first)  # lc >= 1: "".split(" ") == [""]
    rec = np.maximum.reduceat(lcs / lr, first)
    beta2 = _ROUGE_BETA**2
    ok = (prec != 0) & (rec != 0)
    den = np.where(ok, rec + beta2 * prec, 1.0)
    return np.where(ok, ((1 + beta2) * prec * rec) / den, 0.0)


def rouge_l_per_item(
    predictions: Mapping[Hashable, str], references: Mapping[Hashable, Sequence[str]]
) -> tuple[dict[str, float], PerItem]:
    """Corpus (mean) and per-image ROUGE-L exactly as pycocoevalcap's ``Rouge().compute_score``."""
    ids, preds, refs = align(predictions, references)
    per = rouge_l_arrays(preds, refs)
    return {"ROUGE-L": float(np.mean(per))}, per_item_rows(ids, {"ROUGE-L": per})


@corpus_only(rouge_l_per_item)
def rouge_l() -> dict[str, float]:
    """Corpus ROUGE-L (key ``ROUGE-L``), pycocoevalcap-identical."""
