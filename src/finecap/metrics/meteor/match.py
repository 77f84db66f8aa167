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
    the words of the evaluation it is a synonym of (their synonym sets intersect; :func:`synonym_sets`)."""

    __slots__ = ("hash", "stem", "function", "synonyms")

    def __init__(self, hash_: int, stem: int, function: bool, synonyms: frozenset[str] = frozenset()):
        self.hash = hash_
        self.stem = stem
        self.function = function
        self.synonyms = synonyms


class Segment:
    """One normalised segment as the stages look it up, computed once however many segments it is compared with:
    its words and :class:`Word` s, where each word, hash and stem occurs, and the paraphrase-table phrases found by
    walking it (``(start, length, paraphrases)``, by start, shorter phrases first)."""

    __slots__ = ("words", "info", "by_word", "by_hash", "by_stem", "phrases")

    def __init__(self, words: Sequence[str], info: Sequence[Word], table: ParaphraseTable | None):
        self.words = tuple(words)
        self.info = list(info)
        self.by_word: dict[str, list[int]] = {}
        self.by_hash: dict[int, list[int]] = {}
        self.by_stem: dict[int, list[int]] = {}
        for i, (w, x) in enumerate(zip(self.words, self.info)):
            self.by_word.setdefault(w, []).append(i)
            self.by_hash.setdefault(x.hash, []).append(i)
            self.by_stem.setdefault(x.stem, []).append(i)
        self.phrases: list[tuple[int, int, list[tuple[str, ...]]]] = []
        if table is not None and table.pairs:
            words_, n = self.words, len(self.words)
            for a in range(n):
                for k in range(1, min(table.max_len, n - a) + 1):
                    key = words_[a : a + k]
                    found = table.pairs.get(key)
                    if found is not None:
                        self.phrases.append((a, k, found))
                    if key not in table.prefixes:
                        break

    def find(self, phrase: tuple[str, ...]) -> list[int]:
        """Where ``phrase`` occurs, in order."""
        n = len(phrase)
        words = self.words
        return [b for b in self.by_word.get(phrase[0], ()) if words[b : b + n] == phrase]


def candidates(hyp: Segment, ref: Segment) -> list[list[Match]]:
    """The candidate matches of each reference position, in the jar's order (module docstring)."""
    out: list[list[Match]] = [[] for _ in ref.words]
    hyp_info = hyp.info
    for j, r in enumerate(ref.info):
        for i in hyp.by_hash.get(r.hash, ()):
            out[j].append((j, 1, i, 1, EXACT))
    if hyp.words == ref.words:
        return out
    for j, r in enumerate(ref.info):
        h = r.hash
        for i in hyp.by_stem.get(r.stem, ()):
            if hyp_info[i].hash != h:
                out[j].append((j, 1, i, 1, STEM))
    hyp_words = hyp.by_word.keys()
    for j, r in enumerate(ref.info):
        if not r.synonyms:
            continue
        h = r.hash
        found = [i for w in r.synonyms & hyp_words for i in hyp.by_word[w] if hyp_info[i].hash != h]
        found.sort()
        out[j].extend((j, 1, i, 1, SYNONYM) for i in found)
    for a, k, paras in ref.phrases:  # reference phrases, their paraphrases in the hypothesis
        for p in paras:
            n = len(p)
            for b in hyp.find(p):
                out[a].append((a, k, b, n, PARAPHRASE))
    for a, k, paras in hyp.phrases:  # hypothesis phrases, their paraphrases in the reference
        for p in paras:
            n = len(p)
            for b in ref.find(p):
                out[b].append((b, n, a, k, PARAPHRASE))
    return out
