"""The reference index of BLEU and CIDEr-D: every (image, n-gram of its references) pair with its counts, built
once and shared by the two metrics (:func:`finecap.metrics.ngram.ngram_metrics`) and by the CIDEr-D reward
(:class:`finecap.metrics.ngram.CiderD`)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np

from finecap.metrics.ngram.counting import (
    Grams,
    bleu_from_counts,
    check_strings,
    closest_ref_length,
    count_ngrams_first,
    find_sorted,
    key_bits,
    order_of_distinct,
)

_PACKED_BITS = 63
"""Bits of a sort key of CIDEr-D's occurrences (image, n-gram, slot, occurrence) at most: an int64's non-negative
values. A corpus whose key needs more sorts through the occurrences' permutation instead (same result, slower)."""


class RefIndex:
    """Reference statistics per image, all n-gram orders in one index.

    Every (image, n-gram of the image's references) pair is a *row*, keyed ``K[o] + image * size[o] + id`` for an
    order-(o+1) n-gram (so the rows of all orders form one sorted array), holding the n-gram's count in each
    reference slot (``tf[row, slot]``, CIDEr-D) and its maximum over the references (``maxref[row]``, BLEU
    clipping); plus CIDEr-D idf weights per n-gram and tf-idf norms per reference.

    ``df_refs`` (optional) are extra images whose references only count towards document frequencies; ``extra``
    are the captions to be evaluated, added to the n-gram tables so that they need no lookup.
    """

    def __init__(
        self,
        refs: Sequence[Sequence[str]],
        n: int,
        *,
        df_refs: Sequence[Sequence[str]] | None = None,
        cider: bool = True,
        extra: Sequence[str] | None = None,
        keep_words: bool = False,
    ):
        self.n = n
        self.n_images = I = len(refs)  # noqa: N806
        all_refs = list(refs) + (list(df_refs) if df_refs is not None else [])
        n_refs = np.fromiter(map(len, all_refs), dtype=np.int64, count=len(all_refs))
        if len(n_refs) and n_refs.min() == 0:
            bad = int(np.argmin(n_refs))
            raise ValueError(f"image #{bad} of the reference corpus has no reference caption")
        self.R = R = int(n_refs.max()) if len(n_refs) else 1  # noqa: N806
        sentences = list(chain.from_iterable(all_refs))
        n_sent = len(sentences)
        try:
            # the evaluated captions (``extra``) join the n-gram tables: they then need no lookup (their n-grams
            # absent from the references get document frequency 0, as unseen n-grams do)
            self.grams = Grams(sentences + list(extra or ()), n, keep_words=keep_words)
        except TypeError:
            check_strings("references", range(len(all_refs)), all_refs)
            raise
        img_of_sent = np.repeat(np.arange(len(all_refs), dtype=np.int64), n_refs)
        first_sent = np.cumsum(n_refs) - n_refs
        slot_of_sent = np.arange(n_sent, dtype=np.int64) - first_sent[img_of_sent]
        lengths = self.grams.lengths[:n_sent]
        self.n_refs = n_refs[:I]
        # reference lengths per (image, slot); padding slots are -1 (never used: their tf is 0 everywhere)
        self.ref_words = np.full((I, R), -1, dtype=np.int64)
        own = img_of_sent < I
        self.ref_words[img_of_sent[own], slot_of_sent[own]] = lengths[own]
        sizes = np.array(self.grams.sizes, dtype=np.int64)
        self.sizes = sizes
        self.gram_off = np.concatenate([[0], np.cumsum(sizes)])  # global n-gram id = gram_off[o] + id
        self.key_off = np.concatenate([[0], np.cumsum(I * sizes)])  # row key = key_off[o] + image * size + id
        df_images = len(all_refs) - I if df_refs is not None else I
        self.ref_len = float(np.log(float(df_images))) if df_images > 0 else 0.0
        self.ref_norm = np.zeros((I, R, n))

        rows, row_ptr, tfs, maxrefs, idfs, extra_counts = [], [], [], [], [], []
        n_rows = 0
        n_images = len(all_refs)
        for o in range(n):  # one order at a time, in a method: its temporaries are freed before the next (memory)
            p, ids = self.grams.own[o]
            self.grams.own[o] = (p[:0], ids[:0])  # per-token arrays are freed as soon as they are read
            s = self.grams.sent if o == 0 else self.grams.sent[p]
            del p
            if extra is not None:
                cut = int(np.searchsorted(s, n_sent))  # occurrences are in sentence order: references first
                extra_counts.append(count_ngrams_first(s[cut:] - n_sent, ids[cut:], int(sizes[o])))
            out = self._order(o, s, ids, img_of_sent, slot_of_sent, n_images, n_sent, df_refs is not None, cider)
            del s, ids
            row_ptr.append(n_rows + out[1])
            n_rows += len(out[0])
            for acc, x in zip((rows, maxrefs, idfs, tfs), (out[0], out[2], out[3], out[4])):
                if x is not None:
                    acc.append(x)
        self.rows = np.concatenate(rows)  # (rows,) sorted keys
        self.row_ptr = np.stack(row_ptr)  # (n, I + 1): rows of image i, order o: row_ptr[o, i] .. row_ptr[o, i + 1]
        self.maxref = np.concatenate(maxrefs)  # (rows,)
        self.tf = np.concatenate(tfs) if cider else None  # (rows, R)
        self.idf = np.concatenate(idfs) if cider else None  # (n-grams of all orders,)
        self._extra = extra
        self._extra_match: tuple[np.ndarray, tuple[np.ndarray, np.ndarray]] | None = None  # (img, _match of extra)
        if extra is not None and len(extra) <= I:
            # extra[i] is scored against image i (ngram_metrics, cider_d_per_item): its matches, order by order, with
            # queries (candidate, id) and rows (image, id) both sorted already (no sort, a table per order)
            found, q_off, r_off = [], 0, 0
            for o, ((cand, ids, _, _), rows_o) in enumerate(zip(extra_counts, rows)):
                f, pos = find_sorted(rows_o, self.key_off[o] + cand * int(sizes[o]) + ids)
                found.append((q_off + f, r_off + pos))
                q_off, r_off = q_off + len(cand), r_off + len(rows_o)
            q, row = (np.concatenate(x) for x in zip(*found))
            self._extra_match = (np.arange(len(extra)), (q, row))
        self._extra_counts = self._merge(extra_counts) if extra is not None else None
        self._extra_lengths = self.grams.lengths[n_sent:]
        self.grams.own, self.grams.sent = [], np.zeros(0, dtype=np.int64)  # per-token arrays: no longer needed
        # word ids of the evaluated images' references and of ``extra`` for ROUGE-L (keep_words, single spaces)
        self.rouge_words = None
        if self.grams.space_words is not None and extra is not None:
            words, lengths = self.grams.space_words
            n_own = int(self.n_refs.sum())
            starts = np.cumsum(lengths) - lengths
            wr = words[: starts[n_own]] if n_own < len(lengths) else words
            self.rouge_words = (words[starts[n_sent] :] if n_sent < len(lengths) else words[:0], lengths[n_sent:],
                                wr, lengths[:n_own])  # fmt: skip
        self.grams.space_words = None

    def _order(
        self,
        o: int,
        s: np.ndarray,
        ids: np.ndarray,
        img_of_sent: np.ndarray,
        slot_of_sent: np.ndarray,
        n_images: int,
        n_sent: int,
        df_only: bool,
        cider: bool,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
        """Rows of order ``o`` from its occurrences (sentence ``s``, n-gram ``ids``; references first):
        ``(row keys, row_ptr, maxref, idf, tf)`` (the last two with ``cider``), and its slice of ``ref_norm``."""
        I, R, size = self.n_images, self.R, int(self.sizes[o])  # noqa: N806
        cut = int(np.searchsorted(s, n_sent))
        # keys (image, n-gram, slot) packed in bits: unpacked with shifts and masks (no integer division)
        gb, sb = key_bits(size), key_bits(R)
        if key_bits(n_images) + gb + sb > 62:
            raise ValueError(f"reference corpus too large for the n-gram index ({n_images} images)")
        key = ((img_of_sent << (gb + sb)) | slot_of_sent)[s[:cut]]  # (E,) image and slot of each occurrence
        key |= ids[:cut] << sb
        ob = key_bits(cut)  # CIDEr-D sums in the order of each entry's first occurrence (occurrences in text order)
        packed = cider and key_bits(n_images) + gb + sb + ob <= _PACKED_BITS
        if packed:  # the occurrence in the key's low bits: one in-place sort, each run starts at its first occurrence
            key <<= ob
            key |= np.arange(cut, dtype=np.int64)
            key.sort()
            occ = key & ((1 << ob) - 1)
            key >>= ob
        elif cider:  # no room for the occurrence: sorted through its permutation (three times as long)
            perm = np.argsort(key)
            key = key[perm]
        else:
            key.sort()  # by (image, n-gram, slot); the runs of equal keys are the counts
        first = np.empty(len(key) + 1, dtype=bool)
        first[0] = first[-1] = True
        np.not_equal(key[1:], key[:-1], out=first[1:-1])
        starts = np.flatnonzero(first)
        key, tf = key[starts[:-1]], np.diff(starts)
        first_occ = None  # each entry's first occurrence (occurrences are in text order): CIDEr-D's summing order
        if packed:
            first_occ = occ[starts[:-1]]
            del occ
        elif cider:
            first_occ = np.minimum.reduceat(perm, starts[:-1]) if len(key) else perm[:0]
        del first
        rowkey = key >> sb  # image << gb | n-gram
        new_row = np.empty(len(rowkey), dtype=bool)
        new_row[:1] = True
        np.not_equal(rowkey[1:], rowkey[:-1], out=new_row[1:])
        row_start = np.flatnonzero(new_row)
        order_rows = rowkey[row_start]
        del rowkey
        n_keep = int(np.searchsorted(order_rows, I << gb))  # df-only images are a suffix of the sorted rows
        e_keep = int(row_start[n_keep]) if n_keep < len(order_rows) else len(key)
        gram = order_rows & ((1 << gb) - 1)  # (rows,) n-gram id of each row
        rows = self.key_off[o] + (order_rows[:n_keep] >> gb) * size + gram[:n_keep]
        row_ptr = np.searchsorted(order_rows[:n_keep], np.arange(I + 1) << gb)
        small = np.uint8 if tf.max(initial=0) < 256 else np.int64
        maxref = (np.maximum.reduceat(tf[:e_keep], row_start[:n_keep]) if n_keep else tf[:0]).astype(small)
        if not cider:
            return rows, row_ptr, maxref, None, None
        row_of_entry = np.cumsum(new_row[:e_keep]) - 1
        df = np.bincount(gram[n_keep:] if df_only else gram, minlength=size).astype(np.float64)
        idf = self.ref_len - np.log(np.maximum(1.0, df))  # pycocoevalcap: ref_len - log(max(1.0, df))
        slot = key[:e_keep] & ((1 << sb) - 1)
        v = tf[:e_keep] * idf[gram[:n_keep]][row_of_entry]  # (E,) reference tf-idf weights
        flat_slot = (key[:e_keep] >> (gb + sb)) * R + slot  # image * R + slot
        # each reference's squared weights summed in the order of its n-grams' first occurrences, as pycocoevalcap's
        # counts2vec sums them (floating-point addition is not associative: this order gives its very bits)
        by_text = order_of_distinct(first_occ[:e_keep], cut)  # first occurrences are distinct positions
        sq = v * v
        self.ref_norm[..., o] = np.sqrt(np.bincount(flat_slot[by_text], sq[by_text], minlength=I * R)).reshape(I, R)
        tf_mat = np.zeros((n_keep, R), dtype=small)
        tf_mat[row_of_entry, slot] = tf[:e_keep]
        return rows, row_ptr, maxref, idf, tf_mat

    @staticmethod
    def _merge(counts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, ...]:
        """Per-order (candidate, id, tf, first occurrence) as one set of arrays (candidate, order, id, tf, first);
        each order's first occurrences are shifted past the previous order's, so that they are distinct, as
        :meth:`candidates`' are (their order within an order kept)."""
        cand = np.concatenate([x[0] for x in counts])
        order = np.concatenate([np.full(len(x[0]), o, dtype=np.int64) for o, x in enumerate(counts)])
        ids = np.concatenate([x[1] for x in counts])
        tf = np.concatenate([x[2] for x in counts])
        ends = np.cumsum([int(x[3].max()) + 1 if len(x[3]) else 0 for x in counts])
        first = np.concatenate([x[3] + (ends[o - 1] if o else 0) for o, x in enumerate(counts)])
        return cand, order, ids, tf, first

    # ------------------------------------------------------------------------------------------------------------
    def candidates(self, captions: Sequence[str]) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
        """(candidate, order, id, tf, first) of every distinct n-gram of every caption, and the caption lengths in
        words.

        ``id < sizes[order]`` for n-grams of the tables, larger for n-grams never seen (document frequency 0).
        ``first`` orders a caption's n-grams of one order as their first occurrences in its text (CIDEr-D sums
        them in that order, as pycocoevalcap does); its values are distinct.
        """
        if captions is self._extra:
            return self._extra_counts, self._extra_lengths
        occ, lengths = self.grams.lookup(captions)
        # one count over all orders: order o's ids are shifted by off[o] into one id space
        bounds = [int(ids.max()) + 1 if len(ids) else 1 for _, ids in occ]
        off = np.concatenate([[0], np.cumsum(bounds)])
        total = int(off[-1])
        key = np.concatenate([sent * total + off[o] + ids for o, (sent, ids) in enumerate(occ)])
        key, first, tf = np.unique(key, return_index=True, return_counts=True)
        cand, g = key // total, key % total
        order = np.searchsorted(off, g, side="right") - 1
        return (cand, order, g - off[order], tf, first), lengths

    def _matched(self, captions: Sequence[str], img: np.ndarray, c: np.ndarray, o: np.ndarray, ids: np.ndarray):
        """:meth:`_match` of the n-grams of ``captions`` (candidates ``c`` of images ``img``), kept for the captions
        given at construction (``extra``), which BLEU and CIDEr-D both score against the same images."""
        if captions is not self._extra:
            return self._match(img[c], o, ids)
        if self._extra_match is None or not np.array_equal(self._extra_match[0], img):
            self._extra_match = (img.copy(), self._match(img[c], o, ids))
        return self._extra_match[1]

    def _match(self, cand_img: np.ndarray, order: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows matching (image, order, id) queries: (positions of the queries with a row, their rows)."""
        size = self.sizes[order]
        known = np.flatnonzero(ids < size)
        o, img, g, size = order[known], cand_img[known], ids[known], size[known]
        if len(known) * 16 >= len(self.rows):
            found, pos = find_sorted(self.rows, self.key_off[o] + img * size + g)
            return known[found], pos
        # few queries (a training batch): search only the rows of the images involved, gathered into a small array
        # keyed local_off[o] + local image * size + id (same order of rows, so still sorted)
        images, local = np.unique(img, return_inverse=True)
        m = len(images)
        local_off = np.concatenate([[0], np.cumsum(m * self.sizes)])
        start = self.row_ptr[:, images].ravel()  # (n * m,) ranges in (order, image) order
        stop = self.row_ptr[:, images + 1].ravel()
        span = stop - start
        gathered = np.repeat(start - (np.cumsum(span) - span), span) + np.arange(int(span.sum()))
        o_r = np.repeat(np.arange(self.n), m)  # order and image of each range
        img_r, loc_r = np.tile(images, self.n), np.tile(np.arange(m), self.n)
        shift = local_off[o_r] + loc_r * self.sizes[o_r] - self.key_off[o_r] - img_r * self.sizes[o_r]
        local_keys = self.rows[gathered] + np.repeat(shift, span)
        found, pos = find_sorted(local_keys, local_off[o] + local * size + g)
        return known[found], gathered[pos]

    # ------------------------------------------------------------------------------------------------------------
    def bleu(self, captions: Sequence[str], img: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """pycocoevalcap BLEU statistics: (corpus BLEU-1..n (n,), per-candidate BLEU-1..n (C, n))."""
        (c, o, ids, tf, _), testlen = self.candidates(captions)
        C, n = len(captions), self.n  # noqa: N806
        q, row = self._matched(captions, img, c, o, ids)
        clipped = np.minimum(tf[q], self.maxref[row])  # clipped counts of the n-grams found in a reference
        correct = np.bincount(c[q] * n + o[q], clipped, minlength=C * n).reshape(C, n)
        guess = np.maximum(0, testlen[:, None] - np.arange(n)[None, :])  # (C, n): max(0, len - k + 1)
        reflen = closest_ref_length(self.ref_words[img], testlen)
        per = bleu_from_counts(correct, guess.astype(np.float64), testlen, reflen)
        corpus = bleu_from_counts(
            correct.sum(0, keepdims=True),
            guess.sum(0, keepdims=True),
            testlen.sum(keepdims=True),
            reflen.sum(keepdims=True),
        )[0]
        return corpus, per

    def cider(self, captions: Sequence[str], img: np.ndarray, sigma: float = 6.0) -> np.ndarray:
        """pycocoevalcap CIDEr-D score of each caption against the references of image ``img[i]``: (C,)."""
        if self.idf is None:
            raise RuntimeError("this reference index was built without CIDEr-D statistics (cider=False)")
        (c, o, ids, tf, first), words = self.candidates(captions)
        C, n, R = len(captions), self.n, self.R  # noqa: N806
        known = ids < self.sizes[o]
        gid = self.gram_off[o] + np.where(known, ids, 0)
        # unseen n-grams have df = 0: weight tf * (ref_len - log(max(1, 0))) = tf * ref_len
        vc = tf * np.where(known, self.idf[np.minimum(gid, len(self.idf) - 1)], self.ref_len)  # (E,)
        # sums over a caption's n-grams run in the order of their first occurrences, as pycocoevalcap's (its bits)
        bound = int(first.max()) + 1 if len(first) else 0
        by_text = order_of_distinct(first, bound)
        sq = vc * vc
        cand_norm = np.sqrt(np.bincount((c * n + o)[by_text], sq[by_text], minlength=C * n)).reshape(C, n)
        q, row = self._matched(captions, img, c, o, ids)
        q_text = order_of_distinct(first[q], bound)
        q, row = q[q_text], row[q_text]
        vr = self.tf[row] * self.idf[gid[q]][:, None]  # (H, R) reference weights per slot
        contrib = np.minimum(vc[q][:, None], vr) * vr  # (H, R): vrama91's clipping
        flat = (c[q][:, None] * R + np.arange(R)[None, :]) * n + o[q][:, None]  # (H, R) -> (C, R, n) cell
        val = np.bincount(flat.ravel(), contrib.ravel(), minlength=C * R * n).reshape(C, R, n)
        ref_norm = self.ref_norm[img]  # (C, R, n)
        both = (cand_norm[:, None, :] != 0) & (ref_norm != 0)
        val = np.where(both, val / np.where(both, cand_norm[:, None, :] * ref_norm, 1.0), val)
        # length in bigrams, as pycocoevalcap's counts2vec counts it (`if n == 1: length += term_freq`)
        cand_len = np.maximum(words - 1, 0)
        ref_len = np.maximum(self.ref_words[img] - 1, 0)  # (C, R)
        delta = (cand_len[:, None] - ref_len).astype(np.float64)
        # the Gaussian penalty with Python's float power (C's pow), as pycocoevalcap (numpy's vectorised power can
        # differ in the last bit), once per distinct length difference
        deltas, where = np.unique(delta, return_inverse=True)
        penalty = np.array([np.e ** (-(d**2) / (2 * sigma**2)) for d in deltas.tolist()])[where.reshape(delta.shape)]
        val = val * penalty[..., None]
        score = val.sum(axis=1)  # (C, n): padding slots hold exact zeros
        return score.mean(axis=1) / self.n_refs[img] * 10.0
