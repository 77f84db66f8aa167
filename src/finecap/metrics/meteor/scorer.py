"""METEOR 1.5 in Python: each hypothesis against its references, as the jar's ``SCORE`` line computes it.

:class:`MeteorScorer` holds the jar's data (:mod:`finecap.metrics.meteor.resources`) and per-word caches;
:meth:`MeteorScorer.statistics` returns the 23 statistics of the best reference (the first with the highest
score), which :func:`~finecap.metrics.meteor.score.segment_score` and
:func:`~finecap.metrics.meteor.score.corpus_score` turn into scores. :meth:`MeteorScorer.score_all` scores many
captions, in worker processes when there are enough of them (captions are independent; the workers are forked
after the data is loaded, so they share it instead of loading it again).
"""

from __future__ import annotations

import gc
import multiprocessing
from collections.abc import Iterable, Sequence

import numpy as np

from finecap.metrics.meteor.align import align, count_chunks
from finecap.metrics.meteor.inputs import segment_fields
from finecap.metrics.meteor.match import Match, Segment, Word, candidates, java_hash, related_words, synonym_sets
from finecap.metrics.meteor.normalize import Normalizer, plain_words
from finecap.metrics.meteor.resources import JarData, ParaphraseIndex, ParaphraseTable, PendingIndex
from finecap.metrics.meteor.score import N_STATS, WEIGHTS, score_bound, segment_score
from finecap.metrics.meteor.stemmer import Stemmer
from finecap.utils.system import usable_cpus

__all__ = ["MAX_CACHED", "MIN_PARALLEL", "MeteorScorer", "bound", "default_processes"]

MAX_CACHED = 500_000
"""Normalised captions kept between evaluations (beyond this the cache starts again)."""
MIN_PARALLEL = 1000
"""Fewer captions than this are scored in this process (starting workers would cost more than it saves)."""


def default_processes() -> int:
    """Worker processes for :meth:`MeteorScorer.score_all`: the CPUs this process may use (at most 8), or 1 where
    processes cannot be forked (forking is what lets the workers share the loaded data)."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return min(usable_cpus(), 8)


class MeteorScorer:
    """Scores hypotheses against references with the jar's data.

    Args:
        data: the jar's resources (:func:`~finecap.metrics.meteor.resources.read_jar_data`).
        paraphrases: the paraphrase index (:func:`~finecap.metrics.meteor.resources.load_paraphrase_index`, or a
            :class:`~finecap.metrics.meteor.resources.PendingIndex` still loading it), or ``None`` to match without
            paraphrases. :meth:`prepare` keeps the pairs the captions can use.
    """

    def __init__(self, data: JarData, paraphrases: ParaphraseIndex | PendingIndex | None):
        self.data = data
        self._index = paraphrases
        self._pending = paraphrases if isinstance(paraphrases, PendingIndex) else None  # joined before forking
        self.table: ParaphraseTable | None = None
        self.normalizer = Normalizer(data.prefixes)
        self.stem = Stemmer()
        self._words: dict[str, Word] = {}  # of every word prepared
        self._hashes: dict[str, tuple[int, int]] = {}  # word -> its Java hash and its stem's
        self._norm: dict[str, tuple[str, ...]] = {}
        self._vocab: set[str] = set()
        self._bigrams: set[tuple[str, str]] = set()  # adjacent words of the captions prepared (restrict)
        self._prepared: set[str] = set()  # texts whose words and adjacent words are in _vocab and _bigrams

    def words(self, text: str) -> tuple[str, ...]:
        """The normalised words of one (trimmed) segment, memoised."""
        out = self._norm.get(text)
        if out is None:
            out = self._norm[text] = tuple(self.normalizer.words(text))
        return out

    @property
    def index(self) -> ParaphraseIndex | None:
        """The paraphrase index (waiting for it when it is still being loaded)."""
        if isinstance(self._index, PendingIndex):
            self._index = self._index.result()
        return self._index

    @property
    def failed(self) -> bool:
        """Whether loading the paraphrase index failed (:class:`~finecap.metrics.meteor.resources.PendingIndex`)."""
        return self._pending is not None and self._pending.failed

    def prepare(self, texts: Iterable[str]) -> None:
        """Normalise ``texts``, find which of their words are synonyms and keep the paraphrase pairs whose words all
        occur in them (needed before scoring texts with words not seen by an earlier call). The paraphrase index is
        waited for last, so that the rest runs while it loads. Texts prepared before are skipped (a later evaluation
        against the same references prepares only its new captions)."""
        done = self._prepared
        new = [t for t in texts if t not in done]
        if not new and (self.table is not None or self._index is None):
            return
        vocab, bigrams = self._words_and_bigrams(new)
        if vocab <= self._vocab and bigrams <= self._bigrams and (self.table is not None or self._index is None):
            done.update(new)
            return
        self._bigrams |= bigrams
        if vocab <= self._vocab and self._index is not None:  # only new adjacent words: the same synonyms
            self.table = self.index.restrict(self._vocab, self._bigrams)
            done.update(new)
            return
        self._vocab |= vocab
        self._update_words(self._vocab)
        if self._index is not None:
            self.table = self.index.restrict(self._vocab, self._bigrams)
        done.update(new)

    def _words_and_bigrams(self, texts: list[str]) -> tuple[set[str], set[tuple[str, str]]]:
        """The words of ``texts`` and their pairs of adjacent words. Tokenised captions are split all at once
        (:func:`~finecap.metrics.meteor.normalize.plain_words`), others one by one (:meth:`words`); the pairs are
        found as numbers (word ids), so that a pair is made for each distinct pair only."""
        flat: list[str | None] | None = plain_words(texts)
        sep: str | None = "|"
        if flat is None:  # not all plain: "|" may be a word, None is none
            flat, sep = [], None
            extend, append = flat.extend, flat.append
            for t in texts:
                extend(self.words(t))
                append(None)
        vocab = set(flat)
        vocab.discard(sep)  # type: ignore[arg-type]
        words = list(vocab)
        ids = {w: k for k, w in enumerate(words)}
        ids[sep] = -1  # type: ignore[index]
        flat_ids = np.fromiter(map(ids.__getitem__, flat), dtype=np.int64, count=len(flat))
        first, second = flat_ids[:-1], flat_ids[1:]
        codes = np.sort((first * len(words) + second)[(first >= 0) & (second >= 0)])
        if len(codes):  # distinct (np.unique's hashing takes 6 times as long)
            codes = codes[np.append(True, codes[1:] != codes[:-1])]
        a, b = np.divmod(codes, max(len(words), 1))
        return vocab, set(zip(map(words.__getitem__, a.tolist()), map(words.__getitem__, b.tolist())))

    def _update_words(self, vocab: set[str]) -> None:
        """Give each word of ``vocab`` its :class:`~finecap.metrics.meteor.match.Word`, which words of ``vocab`` it
        matches included (:func:`~finecap.metrics.meteor.match.related_words`): the words known before are updated
        in place, with a new generation, so that the segments holding them match the new words too."""
        hashes = self._hashes
        for w in vocab:
            if w not in hashes:
                hashes[w] = (java_hash(w), java_hash(self.stem(w)))
        by_hash: dict[int, list[str]] = {}
        by_stem: dict[int, list[str]] = {}
        for w in vocab:
            h, st = hashes[w]
            by_hash.setdefault(h, []).append(w)
            by_stem.setdefault(st, []).append(w)
        synsets = {w: synonym_sets(w, self.data) for w in vocab}
        holders: dict[str, set[str]] = {}
        for w, ids in synsets.items():
            for s in ids:
                holders.setdefault(s, set()).add(w)
        fw = self.data.function_words
        known, generation = self._words, object()
        for w, ids in synsets.items():
            syn: set[str] = set()
            for s in ids:
                syn |= holders[s]
            syn.discard(w)
            h, st = hashes[w]
            related = related_words(w, hashes, syn, by_hash, by_stem)
            word = known.get(w)
            if word is None:
                known[w] = Word(h, st, w in fw, related, generation)
            else:
                word.related, word.generation = related, generation

    def segment(self, text: str) -> Segment:
        """The normalised segment of ``text`` as the matching stages look it up (prepared first if a word is new)."""
        words = self.words(text)
        known = self._words
        try:
            info = [known[w] for w in words]
        except KeyError:
            self.prepare([text])
            known = self._words
            info = [known[w] for w in words]
        return Segment(words, info, self.table)

    def pair_statistics(self, hyp: Segment, ref: Segment, cands: list[list[Match]] | None = None) -> list[float]:
        """The 23 statistics of hypothesis ``hyp`` against reference ``ref`` (``cands``: their
        :func:`~finecap.metrics.meteor.match.candidates`, when already listed)."""
        hw, rw = hyp.info, ref.info
        matches = align(candidates(hyp, ref) if cands is None else cands, len(hw))
        st = [0.0] * N_STATS
        st[0], st[1], st[2], st[3] = len(hw), len(rw), hyp.n_function, ref.n_function
        for j, rl, i, hl, stage in matches:
            base = 4 + 4 * stage
            for w in hw[i : i + hl]:
                st[base + (2 if w.function else 0)] += 1
            for w in rw[j : j + rl]:
                st[base + (3 if w.function else 1)] += 1
            st[21] += hl
            st[22] += rl
        st[20] = count_chunks(matches)
        return st

    def statistics(self, hypothesis: str, references: Sequence[str]) -> list[float]:
        """The statistics of the best reference (the first with the highest score) for pycocoevalcap's input: the
        statistics its ``SCORE`` line returns."""
        hyp, refs = segment_fields(hypothesis, references)
        self.prepare([hyp, *refs])
        return self._best(hyp, refs)

    def score_all(
        self, hypotheses: Sequence[str], references: Sequence[Sequence[str]], processes: int | None = None
    ) -> list[list[float]]:
        """:meth:`statistics` of every hypothesis against its references, in order (prepared here).

        ``processes``: worker processes (default :func:`default_processes`; fewer than :data:`MIN_PARALLEL`
        captions are scored here).
        """
        fields = [segment_fields(h, rs) for h, rs in zip(hypotheses, references)]
        if len(self._norm) > MAX_CACHED:  # a long-lived scorer (evaluations during training) forgets old captions
            self._norm.clear()
            self._prepared.clear()
        self.prepare(t for h, rs in fields for t in (h, *rs))
        n = default_processes() if processes is None else max(1, processes)
        collect = gc.isenabled()
        gc.disable()  # scoring makes millions of small tuples and no reference cycle: the collector would only cost
        try:
            if n == 1 or len(fields) < MIN_PARALLEL or "fork" not in multiprocessing.get_all_start_methods():
                out = [self._best(h, rs) for h, rs in fields]
                self._cached()
                return out
            self._cached()  # no thread of ours runs when the workers are forked
            size = -(-len(fields) // (4 * n))  # a few chunks per worker: even load, little overhead
            global _WORKER
            _WORKER = (self, fields)
            try:  # forked workers inherit the scorer (data, paraphrase table, caches), the captions and the
                # collector's state: only the chunks' bounds and the statistics travel between the processes
                with multiprocessing.get_context("fork").Pool(n) as pool:
                    parts = pool.map(_score_chunk, [(k, k + size) for k in range(0, len(fields), size)])
            finally:
                _WORKER = None
            return [st for part in parts for st in part]
        finally:
            if collect:
                gc.enable()

    def _cached(self) -> None:
        """Wait for the index loader's thread to end (the index it built cached); raise what caching it raised."""
        if self._pending is not None:
            self._pending.join()

    def _best(self, hyp: str, refs: list[str]) -> list[float]:
        """The statistics of the first reference with the highest score. The references are aligned in the order of
        an upper bound of their score (:func:`bound`), and one whose bound is below the best score found is not
        aligned at all: the alignment search is most of the time, and with 5 references this skips about 70 % of them
        (on the benchmark's COCO-like captions, 1.4 of 5 are aligned)."""
        h = self.segment(hyp)
        if len(refs) <= 1:
            return [self.pair_statistics(h, self.segment(r)) for r in refs][0] if refs else []
        segs = [self.segment(r) for r in refs]
        cands = [candidates(h, r) for r in segs]
        bounds = [bound(h, r, c) for r, c in zip(segs, cands)]
        best: list[float] = []
        best_score, best_k = -1.0, len(refs)
        for k in sorted(range(len(refs)), key=bounds.__getitem__, reverse=True):
            if bounds[k] < best_score:
                continue  # its score is lower than the best one's: it cannot be the one chosen
            st = self.pair_statistics(h, segs[k], cands[k])
            s = segment_score(st)
            if s > best_score or (s == best_score and k < best_k):
                best, best_score, best_k = st, s, k
        return best


def bound(hyp: Segment, ref: Segment, cands: list[list[Match]]) -> float:
    """An upper bound of the score of any alignment of these candidates (:func:`score_bound`).

    The weighted matches of the hypothesis (what precision counts: each matched word's stage weight times ``delta``,
    or ``1 - delta`` for a function word) are at most both of:

    - the sum over its words of the highest weight a candidate gives the word (each word is matched once at most);
    - the sum over the reference's words of the highest share a candidate covering it gives: a candidate's
      hypothesis-side weight divided by its number of reference words (the candidates of an alignment cover each
      reference word once at most, so their weights add up to the sum of their shares): a word the hypothesis
      holds three times and the reference once counts once here.

    and so for the reference's weighted matches, the other way round. A chunk is a chain of matches, each starting
    where the one before ends in both sentences; the longest chain the candidates can form (in words of both
    sentences) bounds every chunk's size, so an alignment of ``m`` matched words has at least ``m / longest``
    chunks and a fragmentation of at least ``2 / longest``; only a chain covering both sentences whole can score
    without penalty."""
    hf, rf = hyp.weights, ref.weights
    hw = [0.0] * len(hf)  # per hypothesis word: the highest weight a candidate gives it
    rw = [0.0] * len(rf)
    col = [0.0] * len(rf)  # per reference word: the highest share of hypothesis-side weight of a candidate covering it
    row = [0.0] * len(hf)
    ends: dict[int, int] = {}  # reference end * m + hypothesis end -> longest chain ending there
    m = len(hf) + 1
    longest = 0
    for ms in cands:  # by reference position: a chain's earlier matches come first
        for j, rl, i, hl, stage in ms:
            w = WEIGHTS[stage]
            if rl == 1 and hl == 1:
                a, b = w * hf[i], w * rf[j]
                if hw[i] < a:
                    hw[i] = a
                if col[j] < a:
                    col[j] = a
                if rw[j] < b:
                    rw[j] = b
                if row[i] < b:
                    row[i] = b
                key = j * m + i
                v = 2 + ends.get(key, 0)
                key += m + 1  # (j + 1, i + 1)
            else:
                a, b = w * sum(hf[i : i + hl]), w * sum(rf[j : j + rl])
                for x in range(i, i + hl):
                    if hw[x] < w * hf[x]:
                        hw[x] = w * hf[x]
                    if row[x] < b / hl:
                        row[x] = b / hl
                for x in range(j, j + rl):
                    if rw[x] < w * rf[x]:
                        rw[x] = w * rf[x]
                    if col[x] < a / rl:
                        col[x] = a / rl
                v = rl + hl + ends.get(j * m + i, 0)
                key = (j + rl) * m + i + hl
            if ends.get(key, 0) < v:
                ends[key] = v
                if longest < v:
                    longest = v
    p = min(sum(hw), sum(col))
    r = min(sum(rw), sum(row))
    return score_bound(p, r, hyp, ref, longest, longest >= len(hf) + len(rf))


_WORKER: tuple[MeteorScorer, list[tuple[str, list[str]]]] | None = None  # what forked workers inherit (set only
# while a pool runs): the scorer and the captions


def _score_chunk(bounds: tuple[int, int]) -> list[list[float]]:
    assert _WORKER is not None, "worker started without a scorer"
    scorer, fields = _WORKER
    return [scorer._best(h, rs) for h, rs in fields[bounds[0] : bounds[1]]]
