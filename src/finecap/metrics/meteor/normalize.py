"""METEOR 1.5's ``-norm`` text normaliser (a Moses-style tokenizer with Java regex semantics), as the jar applies it.

Each rule below was pinned by running the jar on crafted lines (``-writeAlignments`` prints the normalised words);
tens of thousands of random strings over an alphabet of letters, digits, punctuation, quotes, dashes, Unicode
spaces, accented and Cyrillic letters, emoji and the prefix words gave the same words.

Java semantics that differ from Python's defaults and matter here: ``\\s`` is ASCII (``[ \\t\\n\\x0B\\f\\r]``: a
vertical tab separates nothing, it stays inside a word), digits are ASCII, "letters" are ASCII plus Latin-1,
Latin Extended-A, Cyrillic (to U+0527), Phonetic Extensions and Cyrillic Extended-B (part), lowercasing follows
Unicode 13 (Java 17: letters cased only in later Unicode versions stay as they are), and ``trim`` strips every
character up to U+0020.

Example::

    >>> Normalizer({"Mr": 1}).words("It's the U.S. cat, e.g. Mr. Smith's dog--and \\u201cquotes\\u201d.")
    ['it', "'s", 'the', 'us', 'cat', ',', 'eg', 'mr.', 'smith', "'s", 'dog', 'and', '"', 'quotes', '"', '.']
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

__all__ = ["Normalizer", "java_lower", "java_trim", "parse_prefixes", "plain_words", "protect_dots", "restore_dots"]

# "alphanumeric" of the jar's rules (the same set for the split of other characters, the hyphen, and the inner-dot
# test of abbreviations); ALPHA is it without the digits
_ALPHA = "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u017e\u0400-\u0527\u1d00-\u1d7f\ua640-\ua66e\ua67e-\ua697"
_ALNUM = "0-9" + _ALPHA
_JAVA_SPACE = " \t\n\x0b\f\r"  # Java's \s

_OTHER = re.compile(f"([^{_ALNUM}{_JAVA_SPACE}.'`,\\-\u2018\u2019])")
_DOTS = re.compile(r"\.(\.+)")
_DOTMULTI = re.compile(r"DOTMULTI(\.*)")
_DOT_TOKEN = re.compile(r"(?:DOT)*DOTMULTI")


def _rules(*rules: tuple[str, str]) -> tuple[tuple[re.Pattern[str], str], ...]:
    """``(pattern, replacement)`` rules, compiled; :func:`_apply` runs them in order."""
    return tuple((re.compile(pattern), replacement) for pattern, replacement in rules)


def _apply(rules: tuple[tuple[re.Pattern[str], str], ...], s: str) -> str:
    for pattern, replacement in rules:
        s = pattern.sub(replacement, s)
    return s


_COMMAS = _rules(  # a comma is split off unless it stands between two digits
    (r"([^0-9]),([^0-9])", r"\1 , \2"), (r"([0-9]),([^0-9])", r"\1 , \2"), (r"([^0-9]),([0-9])", r"\1 , \2")
)
_HYPHEN = re.compile(f"([{_ALNUM}.])-([{_ALNUM}])")
_APOSTROPHES = _rules(  # English: it's -> it 's, dogs' -> dogs ', 5's -> 5 's
    (f"([^{_ALPHA}])'([^{_ALPHA}])", r"\1 ' \2"),
    (f"([^{_ALPHA}0-9])'([{_ALPHA}])", r"\1 ' \2"),
    (f"([{_ALPHA}])'([^{_ALPHA}])", r"\1 ' \2"),
    (f"([{_ALPHA}])'([{_ALPHA}])", r"\1 '\2"),
    (r"([0-9])'(s)", r"\1 '\2"),
)
_WORDS = re.compile("[ \t\n\r\f]+")
_HAS_ALPHA = re.compile(f"[{_ALPHA}]")
_UNICODE_SPACE = re.compile("[\u00a0\u2000-\u200a\u202f\u205f\u3000]")
_SPACES = re.compile(" +")
_PLAIN = re.compile("[a-z0-9 ]*")
_QUOTES = str.maketrans({"`": "'", "\u2018": "'", "\u2019": "'"})

# Upper-case letters that Python lowercases but Java 17 (Unicode 13) does not: cased only since Unicode 14 or 16
_NEWER_CASE = re.compile(
    "[\u1c89\u2c2f\ua7c0\ua7cb\ua7cc\ua7d0\ua7d6\ua7d8\ua7da\ua7dc"
    "\U00010570-\U0001057a\U0001057c-\U0001058a\U0001058c-\U00010592\U00010594\U00010595\U00010d50-\U00010d65]"
)


def protect_dots(s: str) -> str:
    """The jar's (Moses') loop over a line whose runs of dots became ``DOTMULTI`` + the other dots, in one pass::

        while "DOTMULTI." in s:
            s = re.sub(r"DOTMULTI\\.([^.])", r"DOTDOTMULTI \\1", s)
            s = s.replace("DOTMULTI.", "DOTDOTMULTI")

    Each round turns one dot after every ``DOTMULTI`` into a ``DOT`` before it, the last one with a space after it
    (the first rule), so the loop ran once per dot of the longest run over the whole line: quadratic (8,000 dots took
    3 s, a caption of one long run of dots minutes). Here a ``DOTMULTI`` followed by ``k`` dots becomes ``DOT`` x k +
    ``DOTMULTI`` and a space, at once; without the space only at the line's end, or when it has one dot and follows,
    with nothing between, a ``DOTMULTI`` whose single dot the first rule took in the same round together with its
    ``D`` (text a line can hold, e.g. ``DOTMULTI.DOTMULTI.x``). Equal to the loop on 1.3 million random strings of
    ``DOTMULTI``, dots, ``DOT`` pieces, spaces and other characters (tests/metrics/test_meteor_limits.py keeps the loop
    as its oracle).

    >>> protect_dots(" a DOTMULTI.. b DOTMULTI.DOTMULTI.x ")
    ' a DOTDOTDOTMULTI  b DOTDOTMULTI DOTDOTMULTIx '
    """
    out, pos, fired_end, fired_single = [], 0, -1, False
    for m in _DOTMULTI.finditer(s):
        dots = len(m.group(1))
        out.append(s[pos : m.start()])
        pos = m.end()
        out.append("DOT" * dots + "DOTMULTI")
        if not dots:
            continue
        blocked = dots == 1 and fired_single and fired_end == m.start()  # its D taken by the one before
        if blocked or m.end() == len(s):
            fired_end = -1
        else:
            out.append(" ")
            fired_end, fired_single = m.end(), dots == 1
    out.append(s[pos:])
    return "".join(out)


def restore_dots(s: str) -> str:
    """The jar's (Moses') restoring of :func:`protect_dots`' words, ``DOT`` x k + ``DOTMULTI`` -> k + 1 dots, in one
    pass (its loop ``while "DOTDOTMULTI" in s: s = s.replace("DOTDOTMULTI", "DOTMULTI.")`` and then
    ``s.replace("DOTMULTI", ".")`` ran once per ``DOT``).

    >>> restore_dots("a DOTDOTDOTMULTI b DOTMULTI")
    'a ... b .'
    """
    return _DOT_TOKEN.sub(lambda m: "." * ((len(m.group()) - 5) // 3), s)


def java_trim(s: str) -> str:
    """Java's ``String.trim``: strip every character ``<= U+0020`` from both ends (not Unicode spaces).

    >>> java_trim("\\x01 a b\\x0b ")
    'a b'
    """
    return s.strip(_CONTROL_AND_SPACE)


_CONTROL_AND_SPACE = "".join(map(chr, range(0x21)))


def java_lower(s: str) -> str:
    """Java 17's ``String.toLowerCase`` (English locale): Python's ``lower`` except for letters cased since Unicode 14.

    >>> java_lower("ABC \\u0130 \\u2c2f")  # dotted I -> i + combining dot; U+2C2F is cased only since Unicode 14
    'abc i\\u0307 \\u2c2f'
    """
    if _NEWER_CASE.search(s) is None:
        return s.lower()
    return "".join(p if _NEWER_CASE.fullmatch(p) else p.lower() for p in re.split(f"({_NEWER_CASE.pattern})", s))


def parse_prefixes(text: str) -> dict[str, int]:
    """The Moses non-breaking prefix file: ``{prefix: 1}``, or ``2`` for the ``#NUMERIC_ONLY#`` ones.

    >>> parse_prefixes("# comment\\nMr\\nNo #NUMERIC_ONLY# \\n")
    {'Mr': 1, 'No': 2}
    """
    out: dict[str, int] = {}
    for line in text.split("\n"):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "#NUMERIC_ONLY#" in line:
            out[line.split()[0]] = 2
        else:
            out[line] = 1
    return out


def plain_words(lines: Sequence[str], sep: str = "|") -> list[str] | None:
    """The normalised words of every line, one line's after another's with ``sep`` between them, when every line is
    plain (lower-case ASCII letters, digits and spaces, as tokenised captions are: the normaliser only splits them at
    spaces, and ``sep`` is none of their words); ``None`` when one is not. One split of one string: a tenth of the
    time of :meth:`Normalizer.words` line by line.

    >>> plain_words(["a dog", "", "two  cats"]), plain_words(["a dog", "A cat"])
    (['a', 'dog', '|', '|', 'two', 'cats'], None)
    """
    if _PLAIN.fullmatch(" ".join(lines)) is None:
        return None
    return f" {sep} ".join(lines).split()


class Normalizer:
    """METEOR's ``-norm`` for English; ``prefixes`` is :func:`parse_prefixes` of the jar's
    ``nonbreaking/english.prefixes``. :meth:`words` gives the normalised words of one line."""

    def __init__(self, prefixes: Mapping[str, int]):
        self.prefixes = dict(prefixes)

    def words(self, line: str) -> list[str]:
        """The words of ``line`` after the jar's normalisation (lower-cased)."""
        if _PLAIN.fullmatch(line):  # lower-case letters, digits and spaces (tokenised captions): no rule applies
            return line.split()
        s = " " + line + " "
        s = _OTHER.sub(r" \1 ", s)  # split off what is not a letter, digit, space or . ' ` , - ‘ ’
        s = protect_dots(_DOTS.sub(r" DOTMULTI\1", s))  # protect runs of dots
        s = _apply(_COMMAS, s)
        s = s.translate(_QUOTES)
        s = s.replace("''", ' " ').replace("\u201c", ' " ').replace("\u201d", ' " ')
        s = s.replace("\u2013", "-").replace("--", "-")
        s = _HYPHEN.sub(r"\1 \2", s)  # a hyphen after a letter, digit or dot and before a letter or digit goes
        s = _apply(_APOSTROPHES, s)
        s = " ".join(self._prefix_rule(_WORDS.split(s)))
        s = _UNICODE_SPACE.sub(" ", s)
        s = java_trim(_SPACES.sub(" ", s))
        s = java_lower(restore_dots(s))
        return [w for w in _WORDS.split(s) if w]

    def _prefix_rule(self, words: list[str]) -> list[str]:
        """A word ending in a dot: abbreviations with an inner dot lose their dots (U.S. -> US), listed prefixes and
        words before a lower-case word keep theirs, numeric-only prefixes before a digit too; otherwise the dot is
        split off."""
        last = len(words) - 1
        for k, w in enumerate(words):
            if len(w) < 2 or w[-1] != ".":
                continue
            pre = w[:-1]
            nxt = words[k + 1] if k < last else ""
            if "." in pre and _HAS_ALPHA.search(pre):
                words[k] = pre.replace(".", "")
            else:
                kind = self.prefixes.get(pre)
                keep = kind == 1 or "a" <= nxt[:1] <= "z" or (kind == 2 and "0" <= nxt[:1] <= "9")
                if not keep:
                    words[k] = pre + " ."
        return words
