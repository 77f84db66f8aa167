"""A pure-Python equivalent of pycocoevalcap's ``PTBTokenizer`` on ordinary caption text.

pycocoevalcap runs Stanford CoreNLP 3.4.1's ``PTBTokenizer -preserveLines -lowerCase`` (Java) over all captions and
then drops the tokens in :data:`PUNCTUATIONS`. :func:`tokenize` reproduces that for one caption::

    >>> tokenize("A man's dog can't swim, (really).")
    "a man 's dog ca n't swim -lrb- really -rrb-"

The scanner is a longest-match lexer over the Stanford lexer's token classes that matter for captions (words,
hyphenated words, numbers, fractions, PTB contractions ``n't 's 're 've 'm 'll 'd``, ``cannot gonna gotta wanna gimme
lemme 'tis``, words with inner apostrophes like ``o'clock``, abbreviations and acronyms keeping their period, quotes,
brackets, dashes, ellipses, symbols), followed by lower-casing and the removal of pycocoevalcap's punctuation list.
Captions made only of plain words, possessives, hyphenated words, integers and commas (most real captions) skip the
lexer (``_FAST``): their tokens are their words, which is several times faster. :func:`tokenize_all` goes further:
it reads all captions as the lines of one text and tokenises the lines of a slightly larger grammar (contractions
and double quotes too) with a few numpy operations on the bytes of the whole text, and only the other lines one by
one (about 10x faster than one by one on COCO-like captions; the batch grammar is described above
:class:`_Text`). It is checked token for token against the Java tokenizer on several thousand generated
caption-like and edge-case lines, and against the lexer line by line (``tests/metrics/test_ptb_tokenize.py``; the
Java comparisons are marked ``java``).

Faithfully reproduced quirks: brackets become ``-lrb- -rrb- -lsb- -rsb- -lcb- -rcb-`` and *stay* (pycocoevalcap's
list holds the upper-case forms, but the Java tokenizer has already lower-cased them); ``!!!``, ``?!``, ``/``, ``&``,
``%``, ``$``, ``#``, ``*``, ``@`` stay; ``2 1/2`` is one token joined by a no-break space (U+00A0);
abbreviations such as ``st.``, ``mr.``, ``etc.``, ``jan.``, acronyms (``u.s.``, ``a.m.``) and single letters
(``plan b.``) keep their period, ``no.``/``nos.``/``prop.`` only before a number.

Known differences from the Java tokenizer (outside ordinary caption text):

- Java's lexer reads pycocoevalcap's captions as the lines of one file, and at a line's end it can look into the
  next line: ``plan b.`` gives ``b`` when the next caption starts with a sentence-start word such as ``The`` or
  ``A`` (``b.`` otherwise), and ``says no.`` keeps ``no.`` when the next caption starts with a digit.
  :func:`tokenize_all` and :func:`ptb_tokenize` reproduce both from the next caption in their input (give captions
  in pycocoevalcap's order: images, then each image's captions); :func:`tokenize` alone tokenises a caption as if it
  were the last line.
- URLs, e-mail addresses, SGML tags, phone numbers, dates and Twitter names are recognised only in their simplest
  forms; rare Unicode symbols and characters Java cannot tokenise (it deletes them with a warning) are kept as
  single-character tokens only if they are letters, digits or common symbols, otherwise dropped.
- A few rare apostrophe forms: Java keeps ``o'o`` as one token (here ``o o``) and reads ``'T.`` after a
  hyphenated word as ``t`` (here ``t.``); before a word, the right single quote ``\u2019`` is an apostrophe for
  Java in more places (``\u2019red`` gives ``'re d``; here ``red``).
- Java lower-cases with ``String.toLowerCase()``; Python's ``str.lower()`` differs on a handful of special
  characters (e.g. the Turkish dotted capital I).
- A caption containing a carriage return splits into two lines in pycocoevalcap (a bug that misaligns every later
  caption); here it is whitespace.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Hashable, Iterable, Mapping, Sequence
from itertools import chain

import numpy as np

__all__ = ["PUNCTUATIONS", "ptb_tokenize", "tokenize", "tokenize_all", "tokens"]

# pycocoevalcap/tokenizer/ptbtokenizer.py, verbatim
PUNCTUATIONS = frozenset(
    ["''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-", ".", "?", "!", ",", ":", "-", "--", "...", ";"]
)

_L = r"[^\W\d_]"  # a letter (Java [:letter:])
_AN = r"[^\W_]"  # a letter or digit
_NUM = r"(?:\d*(?:[.:,]\d+)+|\d+)"
_REDAUX = r"'(?:[msdMSD]|[rR][eE]|[vV][eE]|[lL][lL])"
_ACRO = r"[A-Za-z](?:\.[A-Za-z])+"

# Abbreviations keeping their period (CoreNLP 3.4.1, probed against the jar): case-insensitive ones ...
_ABBREV = (
    "jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec|mon|tue|tues|wed|thu|thurs|fri|"
    "ala|ariz|calif|colo|conn|dak|fla|ga|ind|kans?|ky|md|mich|minn|mo|mont|neb|nev|okla|penn|tenn|va|vt|wisc?|wyo|"
    "mr|mrs|ms|drs?|profs?|sens?|reps?|attys?|lt|col|gen|messrs|govs?|adm|rev|maj|sgt|cpl|pvt|mt|capt|ste?|ave|pres|"
    "lieut|hon|brig|co?mdr|pfc|spc|supts?|det|jr|sr|bros|blvd|rd|esq|inc|cos?|corp|ptys?|ltd|plc|bancorp|dept|bhd|"
    "assn|univ|intl|sys|invt|elec|natl|m[ft]g|ph|tel|est|ext|sq|ft|etc|al|seq|vs|alex|wm|jos|cie|cf|treas"
)
# ... ones that need a capital first letter (their lower-case forms are ordinary words) ...
_ABBREV_CAP = "A(?i:rk)|I(?i:ll)|M(?i:ass)|M(?i:iss)|O(?i:re)|W(?i:ash)|P(?i:a)|L(?i:a)|T(?i:ex)|D(?i:el)"
# ... and ones that keep the period only before a number
_ABBREV_NUM = "nos?|prop"
# words after which a single letter + period counts as sentence end ("the letter I. The ...")
_SENT_START = (
    "About|According|Additionally|After|An|A|As|At|But|Earlier|He|Her|Here|However|If|In|It|Last|Many|More|Mr\\.|"
    "Ms\\.|Now|Once|One|Other|Our|She|Since|So|Some|Such|That|The|Then|There|These|They|This|We|When|While|What|"
    "Yet|You"
)

_SPACE = re.compile(r"[ \t\n\r\f\v\xa0\u2000-\u200a\u202f\u3000\u0085\u2028\u2029\ufeff\u200b]+")

# (name, pattern); the token is group "t" when the pattern has one (the rest is trailing context that counts for the
# longest match, as in JFlex), else the whole match. On equal lengths the earlier rule wins.
_RULES: list[tuple[str, str]] = [
    (
        "assim",
        (
            r"(?P<t>(?i:can))(?=(?i:not)(?!" + _AN + "))(?i:not)|"
            r"(?P<t2>(?i:gon|wan))(?=(?i:na)(?!" + _AN + "))(?i:na)|"
            r"(?P<t3>(?i:got))(?=(?i:ta)(?!" + _AN + "))(?i:ta)|"
            r"(?P<t4>(?i:gim|lem))(?=(?i:me)(?!" + _AN + "))(?i:me)|"
            r"(?P<t5>'(?i:t))(?=(?i:is|was)(?!" + _AN + "))(?i:is|was)"
        ),
    ),
    ("sgml", (r"</?[A-Za-z!][^>\n]*>")),
    ("dash", (r"[\u2013\u2014\u2015]")),
    ("word_redaux", (rf"(?P<t>{_L}+(?:[.!?]{_L}+)*)(?={_REDAUX})" + _REDAUX)),
    ("sword_nt", (rf"(?P<t>{_L}*[A-MO-Za-mo-z])(?=[nN]'[tT])[nN]'[tT]")),
    ("word", (rf"{_L}+(?:[.!?]{_L}+)*")),
    (
        "apoword",
        (
            rf"'n'?|[lLdDjJ]'|(?i:dunkin|somethin|ol)'|'(?i:em)|[A-HJ-XZn]'{_L}{{2,}}|'[2-9]0(?i:s)|'(?i:till?)|"
            rf"{_L}+[aeiouyAEIOUY]'[aeiouA-Z]{_L}*|'(?i:cause)|(?i:nor'easter|c'mon|e'er|s'mores|ev'ry|li'l|nat'l)"
        ),
    ),
    ("apoword2", (rf"(?P<t>[yY]')(?={_L}){_L}")),
    (
        "url",
        (r"(?:https?|ftp)://[^ \t\n\"<>|()]*[^ \t\n\"<>|().!?,;:'\-]|www\.[A-Za-z0-9.-]+\.[A-Za-z]{2,4}"),
    ),
    (
        "email",
        (r'[A-Za-z0-9][^ \t\n\f\r"<>|()\xa0]*@(?:[^ \t\n\f\r"<>|().\xa0]+\.)*[^ \t\n\f\r"<>|().\xa0]+'),
    ),
    ("twitter", (rf"@[A-Za-z_][A-Za-z0-9_]*|#{_L}(?:{_AN}|_)*")),
    ("redaux", (rf"(?P<t>{_REDAUX})(?:[^A-Za-z]|$)")),
    ("nt", (r"[nN]'[tT]")),
    ("date", (r"\d{1,2}[-/]\d{1,2}[-/]\d{2,4}")),
    ("number", (rf"[-+]?{_NUM}")),
    ("frac", (r"(?:\d{1,4}[- \xa0])?\d{1,4}\\?/\d{1,4}")),
    ("frac2", (r"[\u00bc\u00bd\u00be\u2153\u2154]")),
    ("tbspec", (r"(?i:-(?:rrb|lrb|rcb|lcb|rsb|lsb)-|c\.d\.s|pro-|anti-|s&p-500|s&ls|cap'n|c'est)")),
    ("thing3", (rf"{_AN}+(?:-{_L}+){{0,2}}(?:\\?/{_AN}+(?:-{_L}+){{0,2}}){{1,2}}")),
    ("dolsign", (r"[A-Za-z]*\$|#")),
    ("currency", (r"[\u00a2\u00a3\u00a4\u00a5\u20a0\u20ac]")),
    # ACRONYM (multi-letter) before a sentence-start word: token keeps the period, a period is re-emitted
    ("acronym_end", (rf"(?P<t>{_ACRO}\.)(?=[ \t\xa0]+(?:{_SENT_START})[ \t\xa0])")),
    # single letter + period before a sentence-start word: letter, then period
    ("letter_end", (rf"(?P<t>[A-Za-z])(?=\.[ \t\xa0]+(?:{_SENT_START})[ \t\xa0])\.")),
    ("abbrev", (rf"(?i:{_ABBREV})\.|(?:{_ABBREV_CAP})\.")),
    ("abbrev_num", (rf"(?i:{_ABBREV_NUM})\.(?=[ \t\xa0]+\d)")),
    ("abbrev2", (rf"{_ACRO}\.|[A-Za-z]\.")),
    ("acro", (_ACRO)),
    ("tbspec2", (r"'\d\d(?=[\s\xa0]|$)")),
    ("word_dot_insentp", (rf"(?P<t>{_L}+(?:[.!?]{_L}+)*\.)(?=[,;:])")),
    ("smiley", (r"[<>]?[:;=][\-o*']?[()DPdpO\\{@|\[\]](?![A-Za-z0-9])")),
    (
        "asiansmiley",
        (
            r"[\^x=~<>]\.[\^x=~<>]|[\-\^x=~<>']_[\-\^x=~<>']|\([\-\^x=~<>'][_.]?[\-\^x=~<>']\)|"
            r"\([\^x=~<>']-[\^x=~<>'`]\)"
        ),
    ),
    ("dblquote", (r'"')),
    ("symbol", (r"[+%&~^|\\=/<>\u2030\u2031]")),
    ("bracket", (r"[()\[\]{}]")),
    ("hyphens", (r"-+")),
    ("ldots", (r"\.{3,5}|(?:\.[ \xa0]){2,4}\.|\u2026")),
    ("fnmarks", (r"@+|#+|_+")),
    ("asts", (r"\*+")),
    ("insentp", (r"[,;:]")),
    ("qmark", (r"[?!]+")),
    ("dot", (r"[.\u00a1\u00bf]")),
    ("hthing", (rf"{_AN}(?:{_AN}|[.,])*(?:-(?:{_AN}+|{_ACRO}\.))+(?:\.(?=[,;:]))?")),
    ("thing", (rf"(?:[dDoOlL]'{_AN})?{_AN}+(?:[-_](?:[dDoOlL]'{_AN})?{_AN}+)*")),
    ("thinga", (r"[A-Z]+(?:[+&][A-Z]+)+")),
    ("lquote", (r"(?P<t>')[A-Za-z][^ \t\n\r\xa0]")),
    (
        "quotes",
        (r"''|'|`{1,2}|[\u2018\u2019\u201a\u201b\u201c\u201d\u201e\u201f\u2039\u203a\u00ab\u00bb]{1,2}"),
    ),
    ("misc", (r"[\u00a6\u00a7\u00a8\u00a9\u00ac\u00ae\u00af\u00b0-\u00b3\u00b4-\u00ba\u00d7\u00f7]")),
]

# the characters each rule can start with: only those rules are tried at a position
_FIRST = {
    "assim": r"[cCgGwWlL']",
    "sgml": r"<",
    "dash": r"[\u2013\u2014\u2015]",
    "word_redaux": _L,
    "sword_nt": _L,
    "word": _L,
    "apoword": _L + "|'",
    "apoword2": r"[yY]",
    "url": r"[hHfFwW]",
    "email": r"[A-Za-z0-9]",
    "twitter": r"[@#]",
    "redaux": r"'",
    "nt": r"[nN]",
    "date": r"\d",
    "number": r"[-+\d.,:]",
    "frac": r"\d",
    "frac2": r"[\u00bc\u00bd\u00be\u2153\u2154]",
    "tbspec": r"[-cCpPaAsS]",
    "thing3": _AN,
    "dolsign": r"[A-Za-z$#]",
    "currency": r"[\u00a2\u00a3\u00a4\u00a5\u20a0\u20ac]",
    "acronym_end": r"[A-Za-z]",
    "letter_end": r"[A-Za-z]",
    "abbrev": r"[A-Za-z]",
    "abbrev_num": r"[A-Za-z]",
    "abbrev2": r"[A-Za-z]",
    "acro": r"[A-Za-z]",
    "tbspec2": r"'",
    "word_dot_insentp": _L,
    "smiley": r"[<>:;=]",
    "asiansmiley": r"[\^x=~<>\-'(]",
    "dblquote": '"',
    "symbol": r"[+%&~^|\\=/<>\u2030\u2031]",
    "bracket": r"[()\[\]{}]",
    "hyphens": r"-",
    "ldots": r"[.\u2026]",
    "fnmarks": r"[@#_]",
    "asts": r"\*",
    "insentp": r"[,;:]",
    "qmark": r"[?!]",
    "dot": r"[.\u00a1\u00bf]",
    "hthing": _AN,
    "thing": _AN,
    "thinga": r"[A-Z]",
    "lquote": r"'",
    "quotes": r"['`\u2018\u2019\u201a\u201b\u201c\u201d\u201e\u201f\u2039\u203a\u00ab\u00bb]",
    "misc": r"[\u00a6\u00a7\u00a8\u00a9\u00ac\u00ae\u00af\u00b0-\u00b3\u00b4-\u00ba\u00d7\u00f7]",
}
_CANDIDATES: dict[str, list[tuple[str, re.Pattern[str]]]] = {}


def _candidates(ch: str) -> list[tuple[str, re.Pattern[str]]]:
    rules = _CANDIDATES.get(ch)
    if rules is None:
        # compiled here, on first use (most captions never reach the lexer: tokenize_all, _FAST)
        rules = _CANDIDATES[ch] = [(n, re.compile(rx)) for n, rx in _RULES if re.fullmatch(_FIRST[n], ch)]
    return rules


_PLAIN = re.compile(r"[A-Za-z]+(?=[ \t]|$)")  # a plain word before a space: a WORD token for every rule set
# a run of plain words (a comma followed by a space may end each): WORD (and ',') tokens for every rule set, read with
# one match instead of two per word
_PLAIN_RUN = re.compile(r"(?:[A-Za-z]+,?[ \t]+)*[A-Za-z]+(?=[ \t]|$)")
_ASSIM_WORDS = frozenset(["cannot", "gonna", "wanna", "gotta", "gimme", "lemme"])

_BRACKETS = {"(": "-LRB-", ")": "-RRB-", "[": "-LSB-", "]": "-RSB-", "{": "-LCB-", "}": "-RCB-"}
_CURRENCY = {"\u00a2": "cents", "\u00a3": "#", "\u00a4": "$", "\u20a0": "$", "\u20ac": "$", "\u00a5": "\u00a5"}
_FRAC2 = {"\u00bc": "1/4", "\u00bd": "1/2", "\u00be": "3/4", "\u2153": "1/3", "\u2154": "2/3"}
_ABBREV_END = re.compile(rf"(?:(?i:{_ABBREV})|{_ABBREV_CAP}|[A-Za-z])\.")
_TOKEN_GROUPS = ("t", "t2", "t3", "t4", "t5")


@functools.lru_cache(maxsize=65536)
def _keeps_period(word: str) -> bool:
    """Whether ``word`` (with its final period, as written) is an abbreviation or single letter keeping the period
    at the end of a caption (``St.``, ``etc.``, ``b.``); cached: captions end with few distinct words."""
    return len(word) <= 8 and _ABBREV_END.fullmatch(word) is not None


def _has_assim(lowered: str) -> bool:
    """Whether a lower-cased caption may hold cannot / gonna / ... (a substring test, a superset of the lexer's)."""
    return ("nn" in lowered or "tt" in lowered or "mm" in lowered) and any(w in lowered for w in _ASSIM_WORDS)


def _normalise(text: str) -> str:
    # the right single quote is an apostrophe for the Java lexer (don\u2019t, dog\u2019s); elsewhere a quote (removed)
    return text.replace("\u2019", "'")


def tokens(text: str) -> list[str]:
    """PTB tokens of one line of text, before lower-casing and punctuation removal (``-LRB-`` etc. upper case)."""
    text = _normalise(text)
    out: list[str] = []
    pos, n = 0, len(text)
    while pos < n:
        m = _SPACE.match(text, pos)
        if m:
            pos = m.end()
            continue
        m = _PLAIN_RUN.match(text, pos)
        if m:
            words = m.group(0).replace(",", " , ").split()
            if _ASSIM_WORDS.isdisjoint(w.lower() for w in words):
                out.extend(words)
                pos = m.end()
                continue
        m = _PLAIN.match(text, pos)
        if m and m.group(0).lower() not in _ASSIM_WORDS:
            out.append(m.group(0))
            pos = m.end()
            continue
        best, best_len, best_name = None, 0, ""
        for name, rx in _candidates(text[pos]):
            m = rx.match(text, pos)
            if m and m.end() - pos > best_len:
                best, best_len, best_name = m, m.end() - pos, name
        if best is None:
            ch = text[pos]
            if ch.isalnum() or ch in "$#@%&*+=/<>|\\^~":
                out.append(ch)
            pos += 1  # Java deletes untokenizable characters
            continue
        group = next((g for g in _TOKEN_GROUPS if g in best.re.groupindex and best.group(g) is not None), None)
        tok = best.group(group) if group else best.group(0)
        end = pos + len(tok)
        if best_name == "acronym_end":
            end -= 1  # the period is emitted again as its own token
        elif best_name == "frac":
            tok = tok.replace(" ", "\xa0")
        elif best_name == "dash" or (best_name == "hyphens" and 3 <= len(tok) <= 4):
            tok = "--"
        elif best_name in ("smiley", "asiansmiley"):
            tok = tok.replace("(", "-LRB-").replace(")", "-RRB-")
        elif best_name == "bracket":
            tok = _BRACKETS[tok]
        elif best_name == "ldots":
            tok = "..."
        elif best_name == "currency":
            tok = _CURRENCY[tok]
        elif best_name == "frac2":
            tok = _FRAC2[tok]
        elif best_name == "dblquote":
            tok = "``" if end < n and (text[end].isalnum() or text[end] == "$") else "''"
        elif best_name == "lquote":
            tok = "`"
        elif best_name == "quotes":
            tok = "''"  # Java maps every quote character to ` `` ' or '' (all removed)
        out.append(tok)
        pos = end
    return out


# A caption made only of these words needs no lexer: plain words (possibly with a possessive 's or hyphenated, as
# "dog's", "black-and-white"), integers, commas followed by a space, an optional final period. Its PTB tokens are its
# words, "'s" split off, commas and the final period dropped (tests/metrics/test_ptb_tokenize.py checks this against
# the lexer and the Java tokenizer). A final "st." / "b." (abbreviation or single letter) keeps its period: lexer.
_FAST_WORD = r"(?:[A-Za-z]+(?:'[sS]|(?:-[A-Za-z]+)+)?|\d+)"
_FAST_SEP = r"(?:[ \t]*,[ \t]+|[ \t]+)"
_FAST = re.compile(rf"[ \t]*(?:{_FAST_WORD}{_FAST_SEP})*{_FAST_WORD}(?:[ \t]*\.)?[ \t]*")
# what makes Java's tokenizer look past the end of a line into the next one (module docstring)
_LETTER_END = re.compile(r"(?:^|[^\w.'])[A-Za-z]\.$")
_NUM_ABBREV_END = re.compile(r"(?:^|[^\w.'])(?i:nos?|prop)\.$")
_NO_END = ("no", "os", "op")  # the last two letters of no. nos. prop.
_SENT_NEXT = re.compile(rf"[ \t\xa0]*(?:{_SENT_START})(?P<end>[ \t\xa0]|$)")


def tokenize(text: str) -> str:
    """One caption as pycocoevalcap's PTBTokenizer returns it: lower-cased PTB tokens without punctuation.

    The caption is tokenised as the last line of pycocoevalcap's file; :func:`tokenize_all` also applies the rare
    effects of the next line (module docstring).
    """
    text = text.replace("\n", " ")
    # plain letter words separated by spaces, an optional final period (most captions): string methods only
    body = text.rstrip(" ")
    period = body.endswith(".")
    words = (body[:-1] if period else body).split()
    letters = "".join(words)
    if letters.isalpha() and body.isascii() and len(body) - period == body.count(" ") + len(letters):
        out = " ".join(words).lower()
        if not _has_assim(out):  # cannot gonna gotta ... are split by the lexer
            # a final abbreviation or single letter keeps a period written right after it ("on st.", "plan b."; but
            # "plan b ." is "plan b")
            return out + "." if period and body[-2:-1] != " " and _keeps_period(words[-1] + ".") else out
    if _FAST.fullmatch(text) and not _has_assim(text.lower()):
        words = text.replace(",", " ").split()
        out = " ".join(words).lower()
        if out.endswith("."):
            out = out if _keeps_period(words[-1]) else out.removesuffix(".").rstrip()
        return out.replace("'s", " 's") if "'" in out else out
    return " ".join(t for t in (w.lower() for w in tokens(text)) if t not in PUNCTUATIONS)


def _next_line_effect(text: str, out: str, nxt: str, more: bool) -> str:
    """``out`` (:func:`tokenize` of ``text``) as Java gives it when the line ``nxt`` follows (``more``: and more
    lines after it). Java's lexer looks across the line break in two rules: a single letter with a period before a
    sentence-start word (``plan b.`` + ``The ...`` gives ``b``, then the period is dropped), and ``no.`` /
    ``nos.`` / ``prop.`` directly before a digit (``says no.`` + ``5 dogs`` keeps ``no.``)."""
    if _LETTER_END.search(text.rstrip(" \t\xa0")) and out.endswith("."):
        m = _SENT_NEXT.match(nxt)
        if m and (m.group("end") or more):
            return out[:-1]
    elif _NUM_ABBREV_END.search(text) and nxt[:1].isdigit() and not out.endswith("."):
        return out + "."
    return out


# --------------------------------------------------------------------------------------------------------------------
# Many captions at once
# --------------------------------------------------------------------------------------------------------------------
# tokenize_all reads all captions as the lines of one text, as pycocoevalcap hands them to Java, and tokenises the
# lines of the *batch grammar* with a few numpy operations on the bytes of the whole text; the other lines go
# through tokenize() one by one. A batch line is words separated by spaces, tabs, double quotes (a double quote is
# always a token of its own, removed as punctuation, and no rule that applies to a batch line looks at it) and
# commas followed by a space, with an optional final period. A word is letters, possibly hyphenated
# (black-and-white) or followed by 's 'd 'm 're 've 'll (he's, they're: split off) or by n't after a letter other
# than n (doesn't: "does n't"), or an integer. Excluded (tokenize() handles them): a line with an apostrophe and a
# hyphen, a final word that keeps its period (st., b.), cannot / gonna / ... (the lexer splits them), anything else.
# A batch line's tokens are its words lower-cased with quotes, commas and the final period dropped, contractions split
# off and spaces collapsed (tests/metrics/test_ptb_tokenize.py checks this against tokenize() and the Java tokenizer).
_LET, _DIG, _SP, _COM, _APO, _HYP, _PER, _NL = 1, 2, 4, 8, 16, 32, 64, 128
_CLASS = bytearray(256)  # class of each byte; 0: not in the batch grammar (non-ASCII text is encoded as "?")
for _c in range(128):
    _CLASS[_c] = (_LET if chr(_c).isalpha() else _DIG if chr(_c).isdigit() else _SP if chr(_c) in ' \t"'
                  else {",": _COM, "'": _APO, "-": _HYP, ".": _PER, "\n": _NL}.get(chr(_c), 0))  # fmt: skip
_CLASS_TABLE = bytes(_CLASS)
_SPECIAL_TABLE = bytes(int(c not in (_LET, _SP, _NL)) for c in _CLASS)  # characters that need a rule
# the output: lower-cased, quotes, tabs, commas and periods become spaces (collapsed afterwards)
_OUT_TABLE = bytes(range(256)).lower().translate(bytes.maketrans(b'"\t,.', b"    "))
_BOUNDARY = _SP | _COM | _PER | _NL  # what may follow a word
_PAD = 3  # newlines around the text, so that every look-around stays inside
_MAX_SKIP = 4  # spaces looked past around a comma or a final period (more: tokenize() decides)
_ASSIM_BYTES = sorted(w.encode() for w in _ASSIM_WORDS)  # each has its doubled letter at offset 2 (ca-nn-ot)


class _Text:
    """All captions as the bytes of one text: one byte per character (non-ASCII ones are "?"), :data:`_PAD`
    newlines around, the class of every byte (:data:`_CLASS`) and the position of every line's first byte."""

    def __init__(self, texts: list[str], joined: str):
        pad = b"\n" * _PAD
        self.raw = pad + joined.encode("ascii", "replace") + pad
        self.b = np.frombuffer(self.raw, dtype=np.uint8)
        self.cls = np.frombuffer(self.raw.translate(_CLASS_TABLE), dtype=np.uint8)
        lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        self.starts = np.cumsum(lengths + 1) - lengths - 1 + _PAD  # (n,)
        self.n = len(texts)

    def lines_of(self, pos: np.ndarray) -> np.ndarray:
        """Line of each byte position."""
        return np.searchsorted(self.starts, pos, side="right") - 1

    def next_class(self, pos: np.ndarray, step: int) -> np.ndarray:
        """Class of the first character other than a space after (``step=1``) or before (``step=-1``) each
        position, looking past at most :data:`_MAX_SKIP` spaces (further: 0)."""
        out = np.zeros(len(pos), dtype=np.uint8)
        todo = np.arange(len(pos))
        for k in range(1, _MAX_SKIP + 2):
            c = self.cls[pos[todo] + k * step]
            done = c != _SP
            out[todo[done]] = c[done]
            todo = todo[~done]
        return out


def _batch_lines(text: _Text) -> tuple[list[str], np.ndarray]:
    """Tokens of every line of the batch grammar, and which lines are not of it (their entries are wrong)."""
    b, cls = text.b, text.cls
    pos = np.flatnonzero(np.frombuffer(text.raw.translate(_SPECIAL_TABLE), dtype=bool))  # digits, punctuation, ...
    c, prev, nxt = cls[pos], cls[pos - 1], cls[pos + 1]
    bad = c == 0
    bad |= (c == _DIG) & (((prev | nxt) & (_LET | _APO | _HYP)) != 0)  # integers only (no 2nd, 3-year, '90s)
    bad |= (c == _HYP) & ((prev != _LET) | (nxt != _LET))
    # apostrophe: a letter and 's 'd 'm 're 've 'll, or a letter other than n and n't; then the end of the word
    a = pos[c == _APO]
    n1, n2 = b[a + 1] | 32, b[a + 2] | 32  # the next two characters, lower-cased if letters
    one = ((n1 == ord("s")) | (n1 == ord("d")) | (n1 == ord("m"))) & ((cls[a + 2] & _BOUNDARY) != 0)
    two = (((n1 == ord("r")) | (n1 == ord("v"))) & (n2 == ord("e"))) | ((n1 == ord("l")) & (n2 == ord("l")))
    two &= (cls[a + 3] & _BOUNDARY) != 0
    nt = ((b[a - 1] | 32) == ord("n")) & (n1 == ord("t")) & ((cls[a + 2] & _BOUNDARY) != 0)
    nt &= (cls[a - 2] == _LET) & ((b[a - 2] | 32) != ord("n"))
    ok_apo = (cls[a - 1] == _LET) & (one | two | nt)
    # comma: a word before it, a space and a word after it
    m = pos[c == _COM]
    ok_com = (nxt[c == _COM] == _SP) & ((text.next_class(m, 1) & (_LET | _DIG)) != 0)
    ok_com &= (text.next_class(m, -1) & (_LET | _DIG)) != 0
    # period: only a final one, after a word
    p = pos[c == _PER]
    ok_per = (text.next_class(p, 1) == _NL) & ((text.next_class(p, -1) & (_LET | _DIG)) != 0)
    bad_pos = [pos[bad], a[~ok_apo], m[~ok_com], p[~ok_per], _kept_periods(text, p[ok_per]), _assim(text)]
    bad_lines = np.zeros(text.n, dtype=bool)
    bad_lines[text.lines_of(np.concatenate(bad_pos))] = True
    # an apostrophe after a hyphenated word (a-b's): tokenize(); a word of hyphens and letters only between them
    hyphens = pos[c == _HYP]
    if len(a) and len(hyphens):
        h = hyphens[np.maximum(np.searchsorted(hyphens, a) - 1, 0)]  # the hyphen before each apostrophe (if any)
        same = (h < a) & (text.lines_of(h) == text.lines_of(a))
        near = np.flatnonzero(same & (a - h <= 64))
        gap = cls[np.minimum(h[near, None] + 1 + np.arange(63), a[near, None])]  # (M, 63) up to the apostrophe
        joined_word = (((gap & (_LET | _HYP)) != 0) | (gap == _APO)).all(axis=1)
        far = a[same & (a - h > 64)]  # a word of over 64 characters, or the hyphen of another word: tokenize()
        bad_pos = [a[near[joined_word]], far]
        bad_lines[text.lines_of(np.concatenate(bad_pos))] = True
    # the tokens: lower-cased, punctuation as spaces, a space before each contraction, spaces collapsed
    out = np.insert(np.frombuffer(text.raw.translate(_OUT_TABLE), dtype=np.uint8), np.where(nt, a - 1, a), 32)
    out = np.delete(out, np.flatnonzero((out[:-1] == 32) & ((out[1:] == 32) | (out[1:] == 10))))  # runs: last only
    out = np.delete(out, np.flatnonzero((out[:-1] == 10) & (out[1:] == 32)) + 1)  # no space after a line break
    lines = out.tobytes().decode("ascii").split("\n")
    return lines[_PAD : _PAD + text.n], bad_lines


def _kept_periods(text: _Text, end: np.ndarray) -> np.ndarray:
    """Those of the final periods ``end`` written right after a word that keeps it (:func:`_keeps_period`: st.,
    etc., b.; each distinct word is tested once)."""
    b, cls = text.b, text.cls
    end = end[cls[end - 1] == _LET]
    run = np.zeros(len(end), dtype=np.int64)  # letters before the period (up to 8)
    alive = np.ones(len(end), dtype=bool)
    for k in range(1, 9):
        alive &= cls[end - k] == _LET
        run += alive
    whole = (run <= 7) & ((cls[end - run - 1] & (_SP | _NL)) != 0)  # a whole word of at most 7 letters
    end, run = end[whole], run[whole]
    offs = np.arange(8)
    word = np.where(offs < run[:, None], b[np.minimum(end[:, None] - run[:, None] + offs, len(b) - 1)], 0)  # (M, 8)
    lower = np.ascontiguousarray(((word | 32) * (word != 0)).astype(np.uint8)).view("<u8")[:, 0]  # (M,) zero-padded
    keeps = (run == 1) | np.isin(lower, _ABBREV_KEYS)  # single letters, abbreviations in any case
    keeps |= np.isin(lower, _ABBREV_CAP_KEYS) & (word[:, 0] >= ord("A")) & (word[:, 0] <= ord("Z"))  # Ark., Ill.
    return end[keeps]


def _expand(pattern: str) -> list[str]:
    """The words matched by ``pattern``, an alternation of letters, optional letters (``s?``) and classes (``[ft]``)
    (:data:`_ABBREV`)."""
    words = []
    for alternative in pattern.split("|"):
        out, i = [""], 0
        while i < len(alternative):
            j = alternative.index("]", i) + 1 if alternative[i] == "[" else i + 1
            options = list(alternative[i:j].strip("[]"))
            if alternative[j : j + 1] == "?":
                options, j = [*options, ""], j + 1
            out, i = [w + o for w in out for o in options], j
        words += out
    return words


def _keys(words: list[str]) -> np.ndarray:
    """Words of at most 8 ASCII bytes as sorted little-endian uint64 keys (zero-padded), as :func:`_kept_periods`
    reads them."""
    return np.array(sorted({int.from_bytes(w.encode("ascii"), "little") for w in words}), dtype=np.uint64)


_ABBREV_KEYS = _keys(_expand(_ABBREV))
_ABBREV_CAP_KEYS = _keys([a.lower() + b for a, b in re.findall(r"([A-Z])\(\?i:([a-z]+)\)", _ABBREV_CAP)])


def _assim(text: _Text) -> np.ndarray:
    """Positions of cannot / gonna / gotta / wanna / gimme / lemme (any case, also inside words)."""
    low = text.b | 32  # letters lower-cased (other bytes change, but never into letters that would match)
    start = np.flatnonzero(low[1:] == low[:-1])  # doubled letters (and other bytes)
    start = start[(low[start] == ord("n")) | (low[start] == ord("t")) | (low[start] == ord("m"))] - 2
    start = start[(start >= 0) & (start + 6 <= len(low))]
    first = low[start]
    start = start[(first == ord("c")) | (first == ord("g")) | (first == ord("w")) | (first == ord("l"))]
    window = low[start[:, None] + np.arange(6)]  # (M, 6)
    hit = np.zeros(len(start), dtype=bool)
    for w in _ASSIM_BYTES:
        hit |= (window[:, : len(w)] == np.frombuffer(w, dtype=np.uint8)).all(axis=1)
    return start[hit]


def _next_line_candidates(texts: list[str], text: _Text) -> list[int]:
    """Lines but the last whose end may depend on the next line: a final period after a single letter or no / nos /
    prop (the test of :func:`tokenize_all`'s older loop), preselected on the bytes of all lines at once."""
    b, cls = text.b, text.cls
    last = text.starts[1:] - 2  # (n - 1,) last character of every line but the last (or the newline before it)
    blank = (b[last] == ord(" ")) | (b[last] == ord("\t")) | (b[last] == ord("?"))  # white space, non-ASCII
    letter = (cls[last - 1] == _LET) | (b[last - 1] == ord("?"))
    single = letter & ((cls[last - 2] & (_LET | _DIG)) == 0)
    x, y = b[last - 2] | 32, b[last - 1] | 32  # the two letters before the period, lower-cased
    no = ((x == ord("n")) & (y == ord("o"))) | ((x == ord("o")) & ((y == ord("s")) | (y == ord("p"))))
    out = []
    for k in np.flatnonzero(blank | ((b[last] == ord(".")) & (single | no))).tolist():
        end = texts[k].rstrip(" \t\xa0")[-5:]
        if end.endswith(".") and (end[-2:-1].isalpha() and not end[-3:-2].isalnum() or end[-3:-1].lower() in _NO_END):
            out.append(k)
    return out


def tokenize_all(texts: Iterable[str]) -> list[str]:
    """:func:`tokenize` over a sequence of captions, as pycocoevalcap tokenises them: as consecutive lines of one
    file, so that a caption's end can depend on the next caption (:func:`_next_line_effect`; pycocoevalcap's order
    is the images' order, then each image's captions). Most captions are tokenised all at once (the batch grammar
    above), the others one by one."""
    texts = list(texts)
    if not texts:
        return []
    joined = "\n".join(texts)
    if joined.count("\n") != len(texts) - 1:  # a caption holding a line break: whitespace (module docstring)
        texts = [t.replace("\n", " ") for t in texts]
        joined = "\n".join(texts)
    text = _Text(texts, joined)
    out, bad = _batch_lines(text)
    for k in np.flatnonzero(bad).tolist():
        out[k] = tokenize(texts[k])
    for k in _next_line_candidates(texts, text):
        out[k] = _next_line_effect(texts[k], out[k], texts[k + 1], k + 2 < len(texts))
    return out


def ptb_tokenize(captions: Mapping[Hashable, Sequence[str] | Sequence[dict]]) -> dict[Hashable, list[str]]:
    """Tokenise ``{id: [caption, ...]}`` (strings, or COCO dicts with a ``"caption"`` key, as pycocoevalcap takes),
    all captions as one batch in this order (:func:`tokenize_all`), as pycocoevalcap's ``PTBTokenizer`` does."""
    for key, caps in captions.items():
        if isinstance(caps, str):
            raise TypeError(f"captions[{key!r}]: expected a list of captions, got a string")
    flat = list(chain.from_iterable(captions.values()))
    try:
        "\n".join(flat)  # all strings (the common case: no per-caption test)
    except TypeError:
        flat = [c["caption"] if isinstance(c, dict) else c for c in flat]
    done = tokenize_all(flat)
    out: dict[Hashable, list[str]] = {}
    k = 0
    for key, caps in captions.items():
        out[key] = done[k : k + len(caps)]
        k += len(caps)
    return out
