"""METEOR's candidate matches between a hypothesis and a reference: exact, stem, synonym and paraphrase stages.

A match is ``(j, ref_len, i, hyp_len, stage)``: reference words ``j .. j + ref_len - 1`` against hypothesis words
``i .. i + hyp_len - 1``; stage 0 exact, 1 stem, 2 synonym, 3 paraphrase. :func:`candidates` lists them by
reference position, in the jar's order (that order decides ties in the alignment search):

1. exact: the words' **Java hashes** are equal (so ``as`` matches ``c5`` and ``20s`` matches ``225``, whose
   ``String.hashCode`` collide), for each j then each i;
2. stem: the Java hashes of the Snowball stems are equal and those of the words differ;
3. synonym: the words' WordNet synonym sets intersect and their hashes differ;
4. paraphrase: each reference position starts a walk along the reference through the phrases of the paraphrase
   table (shorter phrases first); each paraphrase of a phrase found (in the table's order) matches wherever the
   hypothesis holds it; then the same from each hypothesis position against the reference. A pair found both ways
   is listed twice.

When the two word lists are identical only the exact stage runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from finecap.metrics.meteor.resources import JarData, ParaphraseTable
from finecap.metrics.meteor.score import DELTA

__all__ = [
    "EXACT",
    "PARAPHRASE",
    "STEM",
    "SYNONYM",
    "Match",
    "Segment",
    "Word",
    "candidates",
    "java_hash",
    "synonym_sets",
]

EXACT, STEM, SYNONYM, PARAPHRASE = 0, 1, 2, 3
Match = tuple[int, int, int, int, int]
"""``(j, ref_len, i, hyp_len, stage)``."""

# WordNet's morphological fallback ("morphy") for a word that is not an irregular form: suffix -> ending, for nouns,
# verbs and adjectives (20 rules)
_MORPHY = (
    ("s", ""), ("ses", "s"), ("xes", "x"), ("zes", "z"), ("ches", "ch"), ("shes", "sh"), ("men", "man"), ("ies", "y"),
    ("s", ""), ("ies", "y"), ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""), ("ing", "e"), ("ing", ""),
    ("er", ""), ("est", ""), ("er", "e"), ("est", "e"),
)  # fmt: skip


def java_hash(s: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units, 32-bit signed).

    >>> java_hash("as") == java_hash("c5"), java_hash("20s") == java_hash("225"), java_hash("as")
    (True, True, 3122)
    >>> java_hash("\\U0001f600")  # one code point, two UTF-16 code units
    1772899
    """
    h = 0
    for ch in s:
        c = ord(ch)
        if c > 0xFFFF:
            c -= 0x10000
            h = (31 * h + 0xD800 + (c >> 10)) & 0xFFFFFFFF
            c = 0xDC00 + (c & 0x3FF)
        h = (31 * h + c) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


def synonym_sets(word: str, data: JarData) -> frozenset[str]:
    """The synset ids a word matches through: its own, plus those of the base words it is an irregular form of
    (WordNet's exception list), or else those of the first base WordNet's suffix rules give (in the rules' order:
    nouns, verbs, adjectives; the first base listed in WordNet wins; a word ending in ``ss`` is no plural, and words
    of one or two letters have no base).

    >>> from finecap.metrics.meteor.resources import JarData
    >>> data = JarData(frozenset(), {}, {"hat": "1", "hate": "2", "loathe": "2"}, {})
    >>> sorted(synonym_sets("hated", data))  # ed -> e gives "hate" first; "hat" (ed -> nothing) is not tried
    ['2']
    """
    out = data.synsets_of(word)
    bases = data.exceptions.get(word)
    if bases is not None:
        for b in bases:
            out = out | data.synsets_of(b)
        return out
    if len(word) <= 2:  # "as" is not a plural of "a"
        return out
    for suffix, ending in _MORPHY:
        if word.endswith(suffix) and not (suffix == "s" and word.endswith("ss")):
            found = data.synsets_of(word[: len(word) - len(suffix)] + ending)
            if found:
                return out | found
    return out


class Word:
    """What the stages compare of one word: its Java hash, its stem's Java hash, whether it is a function word, and
    the words of the evaluation it is a synonym of (their synonym sets intersect; :func:`synonym_sets`); ``weight``
    is what a match of it weighs in precision or recall before the stage's weight (``delta``, ``1 - delta`` for a
    function word)."""

    __slots__ = ("hash", "stem", "function", "synonyms", "weight")

    def __init__(self, hash_: int, stem: int, function: bool, synonyms: frozenset[str] = frozenset()):
        self.hash = hash_
        self.stem = stem
        self.function = function
        self.synonyms = synonyms
        self.weight = 1.0 - DELTA if function else DELTA


class Segment:
    """One normalised segment as the stages look it up, computed once however many segments it is compared with:
    its words and :class:`Word` s (and their ``weight`` s), the number of function words, and the paraphrase-table
    phrases found by walking it (``(start, length, phrase id)``, by start, shorter phrases first; the ids index
    ``table.paraphrases``).

    As a hypothesis it is compared with every reference of its image, so what that side needs (where each word, hash
    and stem occurs; the matches of each reference word and phrase) is built on first use and kept
    (:meth:`word_matches`, :meth:`phrase_matches`, :meth:`paraphrases_by_first_word`).
    """

    __slots__ = (
        "words",
        "info",
        "weights",
        "n_function",
        "phrases",
        "table",
        "_by_word",
        "_words",
        "_phrases",
        "_by_first",
        "_keys",
    )

    def __init__(self, words: Sequence[str], info: Sequence[Word], table: ParaphraseTable | None):
        self.words = tuple(words)
        self.info = list(info)
        self.weights = [w.weight for w in self.info]
        self.n_function = sum(w.function for w in self.info)
        self.table = table
        self._by_word: dict[str, list[int]] | None = None
        self._words: dict[str, tuple[tuple[int, int], ...]] = {}
        self._phrases: dict[int, list[tuple[int, int]]] = {}
        self._by_first: dict[str, list[tuple[int, int, int, tuple[str, ...]]]] | None = None
        self._keys: tuple[set[int], set[int], frozenset[str]] | None = None
        self.phrases: list[tuple[int, int, int]] = []
        if table is not None and table.trie:
            trie, words_, n, out = table.trie, self.words, len(self.words), self.phrases
            for a in range(n):
                node = trie.get(words_[a])
                k = 1
                while node is not None:
                    pid, children = node
                    if pid >= 0:
                        out.append((a, k, pid))
                    if not children or a + k >= n:
                        break
                    node = children.get(words_[a + k])
                    k += 1

    @property
    def by_word(self) -> dict[str, list[int]]:
        """Where each word occurs."""
        if self._by_word is None:
            self._by_word = {}
            for i, w in enumerate(self.words):
                self._by_word.setdefault(w, []).append(i)
        return self._by_word

    def find(self, phrase: tuple[str, ...]) -> list[int]:
        """Where ``phrase`` occurs, in order."""
        n = len(phrase)
        words = self.words
        return [b for b in self.by_word.get(phrase[0], ()) if words[b : b + n] == phrase]

    def word_matches(self, word: str, info: Word) -> tuple[tuple[int, int], ...]:
        """``(position, stage)`` of this segment's words that match ``word`` (whose :class:`Word` is ``info``) in the
        exact, stem and synonym stages, in the jar's order: exact by position, then stem by position, then synonym
        by position (a word can be both a stem and a synonym candidate)."""
        out = self._words.get(word)
        if out is None:
            h, s, syn = info.hash, info.stem, info.synonyms
            if self._keys is None:
                self._keys = ({x.hash for x in self.info}, {x.stem for x in self.info}, frozenset(self.words))
            hashes, stems, words = self._keys
            if h not in hashes and s not in stems and (not syn or syn.isdisjoint(words)):  # most words: no match
                out = self._words[word] = ()
                return out
            exact: list[tuple[int, int]] = []
            stem: list[tuple[int, int]] = []
            synonym: list[tuple[int, int]] = []
            for i, (w, x) in enumerate(zip(self.words, self.info)):
                if x.hash == h:
                    exact.append((i, EXACT))
                    continue
                if x.stem == s:
                    stem.append((i, STEM))
                if w in syn:
                    synonym.append((i, SYNONYM))
            out = self._words[word] = (*exact, *stem, *synonym)
        return out

    def phrase_matches(self, pid: int) -> list[tuple[int, int]]:
        """``(position, length)`` of the paraphrases of table phrase ``pid`` in this segment, in the table's order
        (each paraphrase wherever it occurs, by position)."""
        out = self._phrases.get(pid)
        if out is None:
            table = self.table
            if table.first_words[pid].isdisjoint(self.by_word):  # no paraphrase starts with a word of this segment
                out = []
            else:
                out = [(b, len(p)) for p in table.paraphrases[pid] for b in self.find(p)]
            self._phrases[pid] = out
        return out

    def paraphrases_by_first_word(self) -> dict[str, list[tuple[int, int, int, tuple[str, ...]]]]:
        """The paraphrases of this segment's phrases by their first word: ``(order, start, length, paraphrase)``,
        ``order`` numbering them in the order the jar tries them (by phrase, then in the table's order)."""
        if self._by_first is None:
            self._by_first = {}
            order = 0
            paraphrases = self.table.paraphrases if self.table is not None else []
            for a, k, pid in self.phrases:
                for p in paraphrases[pid]:
                    self._by_first.setdefault(p[0], []).append((order, a, k, p))
                    order += 1
        return self._by_first


def candidates(hyp: Segment, ref: Segment) -> list[list[Match]]:
    """The candidate matches of each reference position, in the jar's order (module docstring)."""
    rw = ref.words
    if hyp.words == rw:
        hashes: dict[int, list[int]] = {}
        for i, x in enumerate(hyp.info):
            hashes.setdefault(x.hash, []).append(i)
        return [[(j, 1, i, 1, EXACT) for i in hashes[r.hash]] for j, r in enumerate(ref.info)]
    memo, info = hyp._words, ref.info
    by_first = hyp.paraphrases_by_first_word()
    out: list[list[Match]] = []
    hits = []  # paraphrases of hypothesis phrases found in the reference: (order, position, length, a, k)
    for j, w in enumerate(rw):
        found = memo.get(w)
        if found is None:
            found = hyp.word_matches(w, info[j])
        out.append([(j, 1, i, 1, s) for i, s in found] if found else [])
        tried = by_first.get(w)
        if tried is not None:
            for order, a, k, p in tried:
                n = len(p)
                if n == 1 or rw[j : j + n] == p:
                    hits.append((order, j, n, a, k))
    phrases = hyp._phrases
    for a, k, pid in ref.phrases:  # reference phrases, their paraphrases in the hypothesis
        found = phrases.get(pid)
        if found is None:
            found = hyp.phrase_matches(pid)
        if found:
            out[a].extend([(a, k, b, n, PARAPHRASE) for b, n in found])
    if hits:  # then the hypothesis phrases' (in the jar's order: by phrase and paraphrase, then by position)
        hits.sort()
        for _, b, n, a, k in hits:
            out[b].append((b, n, a, k, PARAPHRASE))
    return out
