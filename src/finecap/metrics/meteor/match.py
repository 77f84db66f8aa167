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

from collections.abc import Iterable, Mapping, Sequence

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
    "related_words",
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
    """What the stages compare of one word: its Java hash, its stem's Java hash, whether it is a function word,
    ``weight`` (what a match of it weighs in precision or recall before the stage's weight: ``delta``, ``1 - delta``
    for a function word), and ``related``: the words of the evaluation that match it, with their stage, in the
    stages' order (:func:`related_words`). When the evaluation's words grow, the scorer updates ``related`` in place
    and gives every word a new ``generation`` (an object), so that segments made before see the new words too
    (:meth:`Segment.word_matches`).

    >>> Word(java_hash("dog"), java_hash("dog"), False, (("dog", EXACT),)).related
    (('dog', 0),)
    """

    __slots__ = ("hash", "stem", "function", "weight", "related", "generation")

    def __init__(self, hash_: int, stem: int, function: bool, related: tuple[tuple[str, int], ...] = (),
                 generation: object = None):  # fmt: skip
        self.hash = hash_
        self.stem = stem
        self.function = function
        self.weight = 1.0 - DELTA if function else DELTA
        self.related = related
        self.generation = generation


def related_words(
    word: str, hashes: Mapping[str, tuple[int, int]], synonyms: Iterable[str],
    by_hash: Mapping[int, Sequence[str]], by_stem: Mapping[int, Sequence[str]],
) -> tuple[tuple[str, int], ...]:  # fmt: skip
    """The words a hypothesis word matches in a reference, as ``(word, stage)``: those with its Java hash (exact,
    itself included), then those with its stem's hash and another hash (stem), then its ``synonyms`` with another
    hash (synonym: a word of the same hash is an exact match, never a synonym one). ``hashes[w]`` is a word's hash
    and its stem's; ``by_hash`` and ``by_stem`` list the words of each.

    >>> h = {"as": (3122, 3122), "c5": (3122, 3122), "dog": (99644, 99644), "dogs": (3089208, 99644)}
    >>> related_words("dog", h, ["hound"] * 0, {3122: ["as", "c5"], 99644: ["dog"]}, {99644: ["dog", "dogs"]})
    (('dog', 0), ('dogs', 1))
    >>> related_words("as", h, ["c5"], {3122: ["as", "c5"]}, {3122: ["as", "c5"]})  # same hash: exact only
    (('as', 0), ('c5', 0))
    """
    h, st = hashes[word]
    out = [(v, EXACT) for v in by_hash[h]]
    out += [(v, STEM) for v in by_stem[st] if hashes[v][0] != h]
    out += [(v, SYNONYM) for v in synonyms if hashes[v][0] != h]
    return tuple(out)


class Segment:
    """One normalised segment as the stages look it up, computed once however many segments it is compared with:
    its words and :class:`Word` s (and their ``weight`` s), the number of function words, where each word occurs
    (``positions``), and the paraphrase-table phrases found by walking it (``(start, length, phrase id)``, by start,
    shorter phrases first; the ids index ``table.paraphrases``).

    As a hypothesis it is compared with every reference of its image, so what that side needs (the matches of each
    reference word and phrase) is built on first use and kept (:meth:`word_matches`, :meth:`phrase_matches`,
    :meth:`paraphrases_by_first_word`).
    """

    __slots__ = ("words", "info", "weights", "n_function", "positions", "phrases", "table", "_rel", "_rel_generation",
                 "_phrases", "_by_first")  # fmt: skip

    def __init__(self, words: Sequence[str], info: Sequence[Word], table: ParaphraseTable | None):
        self.words = words = tuple(words)
        self.info = info = info if isinstance(info, list) else list(info)
        self.weights = [w.weight for w in info]
        self.n_function = [w.function for w in info].count(True)
        self.table = table
        self.positions = positions = {}
        for i, w in enumerate(words):
            if w in positions:
                positions[w].append(i)
            else:
                positions[w] = [i]
        self._rel: dict[str, tuple[tuple[int, int], ...]] | None = None
        self._rel_generation: object = None
        self._phrases: dict[int, list[tuple[int, int]]] = {}
        self._by_first: dict[str, list[tuple[int, int, int, tuple[str, ...]]]] | None = None
        self.phrases: list[tuple[int, int, int]] = []
        if table is not None and table.trie:
            get, n, out = table.trie.get, len(words), self.phrases
            for a, w in enumerate(words):
                node = get(w)
                k = a + 1  # the end of the phrase walked so far
                while node is not None:
                    pid, children = node
                    if pid >= 0:
                        out.append((a, k - a, pid))
                    if not children or k >= n:
                        break
                    node = children.get(words[k])
                    k += 1

    def find(self, phrase: tuple[str, ...]) -> list[int]:
        """Where ``phrase`` occurs, in order."""
        n = len(phrase)
        words = self.words
        return [b for b in self.positions.get(phrase[0], ()) if words[b : b + n] == phrase]

    def word_matches(self) -> dict[str, tuple[tuple[int, int], ...]]:
        """``{reference word: ((position, stage), ...)}``: this segment's words that each word matches in the
        exact, stem and synonym stages (their :class:`Word` s' ``related``), in the jar's order: exact by position,
        then stem by position, then synonym by position (a word can be both a stem and a synonym candidate). A word
        not listed matches none. Kept until the words' ``generation`` changes."""
        generation = self.info[0].generation if self.info else None
        if self._rel is None or self._rel_generation is not generation:
            self._rel_generation = generation
            found: dict[str, list[tuple[int, int]]] = {}
            for i, x in enumerate(self.info):
                for v, stage in x.related:
                    found.setdefault(v, []).append((stage, i))
            self._rel = {
                v: tuple((i, s) for s, i in (sorted(f) if len(f) > 1 else f)) for v, f in found.items()
            }  # fmt: skip
        return self._rel

    def phrase_matches(self, pid: int) -> list[tuple[int, int]]:
        """``(position, length)`` of the paraphrases of table phrase ``pid`` in this segment, in the table's order
        (each paraphrase wherever it occurs, by position)."""
        out = self._phrases.get(pid)
        if out is None:
            table = self.table
            if self.positions.keys().isdisjoint(table.first_words[pid]):  # no paraphrase starts with a word here
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


def candidates(hyp: Segment, ref: Segment) -> list[Sequence[Match]]:
    """The candidate matches of each reference position, in the jar's order (module docstring); a position without
    any has an empty tuple."""
    rw = ref.words
    n = len(rw)
    if hyp.words == rw:  # only the exact stage runs; the words of one Java hash match each other
        hashes: dict[int, list[int]] = {}
        for i, x in enumerate(hyp.info):
            hashes.setdefault(x.hash, []).append(i)
        return [[(j, 1, i, 1, EXACT) for i in hashes[r.hash]] for j, r in enumerate(ref.info)]
    out: list[Sequence[Match]] = [()] * n
    where = ref.positions
    rel = hyp.word_matches()
    for w in rel.keys() & where.keys() if len(rel) < len(where) else where.keys() & rel.keys():
        found = rel[w]
        for j in where[w]:
            out[j] = [(j, 1, i, 1, s) for i, s in found]
    phrases = hyp._phrases
    for a, k, pid in ref.phrases:  # reference phrases, their paraphrases in the hypothesis
        found = phrases.get(pid)
        if found is None:
            found = hyp.phrase_matches(pid)
        if found:
            ms = out[a]
            if not ms:
                ms = out[a] = []
            ms.extend([(a, k, b, m, PARAPHRASE) for b, m in found])
    by_first = hyp.paraphrases_by_first_word()
    if by_first:  # then the hypothesis phrases' paraphrases found in the reference, in the jar's order: by phrase
        hits = []  # and paraphrase, then by position: (order, position, length, a, k)
        for w in by_first.keys() & where.keys():
            starts = where[w]
            for order, a, k, p in by_first[w]:
                m = len(p)
                for j in starts:
                    if m == 1 or rw[j : j + m] == p:
                        hits.append((order, j, m, a, k))
        hits.sort()
        for _, b, m, a, k in hits:
            ms = out[b]
            if not ms:
                ms = out[b] = []
            ms.append((b, m, a, k, PARAPHRASE))
    return out
