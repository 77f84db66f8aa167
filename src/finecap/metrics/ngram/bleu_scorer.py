"""BLEU-1..4 as pycocoevalcap's ``Bleu(4)``: one sort per n-gram order over the candidates' n-grams (the reference
index of :mod:`.index` when the keys would overflow int64)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from itertools import chain

import numpy as np

from finecap.metrics.items import corpus_only
from finecap.metrics.ngram.counting import (
    PerItem,
    align,
    bleu_from_counts,
    check_strings,
    closest_ref_length,
    encode,
    per_item_rows,
    sort_order,
    token_layout,
)
from finecap.metrics.ngram.index import RefIndex

_BLEU_KEY_LIMIT = 1 << 62  # BLEU's (group, slot) keys stay below it (else the reference-index path is taken)


def bleu_arrays(preds: Sequence[str], refs: Sequence[Sequence[str]], n: int) -> tuple[np.ndarray, np.ndarray]:
    """pycocoevalcap BLEU of ``preds[i]`` against ``refs[i]``: (corpus BLEU-1..n (n,), per-candidate (C, n)); no
    candidates: zeros and a (0, n) array, as pycocoevalcap.

    BLEU only needs, for every distinct n-gram of a candidate, its count in the candidate and its maximum count in
    any one reference of the same image: reference n-grams absent from their image's candidate never matter. So,
    instead of indexing every reference n-gram (:class:`RefIndex`, which CIDEr-D needs), each order is one sort of
    the keys ``(group, slot)`` of the occurrences that can still match, where a *group* is an (image, n-gram) pair
    and the slot is 0 for the candidate and ``1 + r`` for reference ``r``. Runs of equal keys are the counts; a
    group whose first run has slot 0 holds a candidate n-gram, and gets a dense id. An order-k group is keyed
    ``dense id of its (k-1)-gram prefix group * W + last word`` (the prefix group carries the image), and only
    occurrences whose prefix group holds a candidate n-gram are kept (a k-gram in the candidate has its prefix
    there too), so orders 2..n sort a fraction of the reference n-grams and no n-gram table is built.
    (Implementation choice: the results are those of :meth:`RefIndex.bleu`, which stays for ``ngram_metrics``
    where the index is shared with CIDEr-D.)
    """
    C = len(preds)  # noqa: N806
    if C == 0:  # no candidates: pycocoevalcap's corpus BLEU is 0.0 (brevity penalty exp(1 - 1/ratio), ratio 1e-6)
        return np.zeros(n), np.zeros((0, n))
    n_refs = np.fromiter(map(len, refs), dtype=np.int64, count=C)
    R = int(n_refs.max())  # noqa: N806  slots: 0 = candidate, 1..R = references, in the low `sb` bits of a key
    sb = int(R).bit_length()
    vocab, words, lengths = encode(list(chain.from_iterable(refs)) + list(preds))
    W = len(vocab)  # noqa: N806
    n_ref_sent = int(n_refs.sum())
    img_of_ref = np.repeat(np.arange(C, dtype=np.int64), n_refs)
    first_ref = np.cumsum(n_refs) - n_refs
    slot_of_ref = np.arange(n_ref_sent, dtype=np.int64) - first_ref[img_of_ref] + 1
    img_of_sent = np.concatenate([img_of_ref, np.arange(C, dtype=np.int64)])  # (sentences,)
    slot_of_sent = np.concatenate([slot_of_ref, np.zeros(C, dtype=np.int64)])
    ref_words = np.full((C, R), -1, dtype=np.int64)
    ref_words[img_of_ref, slot_of_ref - 1] = lengths[:n_ref_sent]
    testlen = lengths[n_ref_sent:]
    sent, rem = token_layout(lengths)
    if max(C, len(words) - int(lengths[:n_ref_sent].sum())) * W << sb >= _BLEU_KEY_LIMIT:  # int64 keys overflow
        return RefIndex(refs, n, cider=False, extra=preds).bleu(preds, np.arange(C))
    correct = np.zeros((C, n))
    prev_id = np.zeros(0, dtype=np.int64)  # (T,) dense group id of the (k-1)-gram starting at each token, or -1
    p = np.arange(len(words), dtype=np.int64)  # start positions of the occurrences still in play
    for k in range(1, n + 1):
        if k == 1:  # group: the image, then the dense id of the (k-1)-gram prefix's group
            key = ((img_of_sent[sent] * W + words) << sb) | slot_of_sent[sent]  # (T,) (group, slot)
        else:
            p = p[(rem[p] >= k) & (prev_id[p] >= 0)]  # a k-gram starts here and its prefix matters
            key = ((prev_id[p] * W + words[p + k - 1]) << sb) | slot_of_sent[sent[p]]  # (P,)
        if len(p) == 0:
            break
        sk, order = sort_order(key)
        m = len(sk)
        pos = p[order] if k > 1 else order  # (P,) token position of each sorted occurrence
        g = sk >> sb
        new_g = np.empty(m, dtype=bool)  # first occurrence of each (image, n-gram) group
        new_g[0] = True
        np.not_equal(g[1:], g[:-1], out=new_g[1:])
        new_run = np.empty(m, dtype=bool)  # first occurrence of each (group, slot) run
        new_run[0] = True
        np.not_equal(sk[1:], sk[:-1], out=new_run[1:])
        run_start = np.flatnonzero(new_run)
        run_len = np.diff(np.append(run_start, m))  # (runs,) count of the n-gram in one sentence
        run_slot = sk[run_start] & ((1 << sb) - 1)
        first_run = np.flatnonzero(new_g[run_start])  # (groups,) index of each group's first run
        maxref = np.maximum.reduceat(np.where(run_slot > 0, run_len, 0), first_run)  # (groups,)
        in_cand = run_slot[first_run] == 0  # slot 0 sorts first: the candidate has the n-gram
        tf = run_len[first_run]
        cand_img = img_of_sent[sent[pos[run_start[first_run[in_cand]]]]]  # (kept groups,)
        correct[:, k - 1] = np.bincount(cand_img, np.minimum(tf[in_cand], maxref[in_cand]), minlength=C)
        if k < n:
            gid = np.where(in_cand, np.cumsum(in_cand) - 1, -1)  # (groups,) dense id of the kept groups
            prev_id = np.full(len(words), -1, dtype=np.int64)
            prev_id[pos] = gid[np.cumsum(new_g) - 1]
    guess = np.maximum(0, testlen[:, None] - np.arange(n)[None, :]).astype(np.float64)  # (C, n)
    reflen = closest_ref_length(ref_words, testlen)
    per = bleu_from_counts(correct, guess, testlen, reflen)
    corpus = bleu_from_counts(
        correct.sum(0, keepdims=True), guess.sum(0, keepdims=True), testlen.sum(keepdims=True),
        reflen.sum(keepdims=True),
    )[0]  # fmt: skip
    return corpus, per


def bleu_per_item(
    predictions: Mapping[Hashable, str], references: Mapping[Hashable, Sequence[str]], n: int = 4
) -> tuple[dict[str, float], PerItem]:
    """Corpus BLEU-1..n and per-image BLEU-1..n exactly as pycocoevalcap's ``Bleu(n).compute_score``."""
    ids, preds, refs = align(predictions, references)
    try:
        corpus, per = bleu_arrays(preds, refs, n)
    except TypeError:
        check_strings("references", ids, refs)
        raise
    names = [f"BLEU-{k}" for k in range(1, n + 1)]
    return dict(zip(names, corpus.tolist())), per_item_rows(ids, {m: per[:, j] for j, m in enumerate(names)})


@corpus_only(bleu_per_item)
def bleu() -> dict[str, float]:
    """Corpus BLEU-1..n (keys ``BLEU-1`` ... ``BLEU-n``), pycocoevalcap-identical."""
