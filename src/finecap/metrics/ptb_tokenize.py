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
lexer (``_FAST``): their tokens are their words, which is several times faster.
It is checked token for token against the Java tokenizer on several hundred generated caption-like sentences
(``tests/metrics/test_ptb_tokenize.py``, marked ``java``).

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
- Java lower-cases with ``String.toLowerCase()``; Python's ``str.lower()`` differs on a handful of special
  characters (e.g. the Turkish dotted capital I).
- A caption containing a carriage return splits into two lines in pycocoevalcap (a bug that misaligns every later
  caption); here it is whitespace.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Hashable, Iterable, Mapping, Sequence

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
_RULES: list[tuple[str, re.Pattern[str]]] = [
    (
        "assim",
        re.compile(
            r"(?P<t>(?i:can))(?=(?i:not)(?!" + _AN + "))(?i:not)|"
            r"(?P<t2>(?i:gon|wan))(?=(?i:na)(?!" + _AN + "))(?i:na)|"
            r"(?P<t3>(?i:got))(?=(?i:ta)(?!" + _AN + "))(?i:ta)|"
            r"(?P<t4>(?i:gim|lem))(?=(?i:me)(?!" + _AN + "))(?i:me)|"
            r"(?P<t5>'(?i:t))(?=(?i:is|was)(?!" + _AN + "))(?i:is|was)"
        ),
    ),
    ("sgml", re.compile(r"</?[A-Za-z!][^>\n]*>")),
    ("dash", re.compile(r"[\u2013\u2014\u2015]")),
    ("word_redaux", re.compile(rf"(?P<t>{_L}+(?:[.!?]{_L}+)*)(?={_REDAUX})" + _REDAUX)),
    ("sword_nt", re.compile(rf"(?P<t>{_L}*[A-MO-Za-mo-z])(?=[nN]'[tT])[nN]'[tT]")),
    ("word", re.compile(rf"{_L}+(?:[.!?]{_L}+)*")),
    (
        "apoword",
        re.compile(
            rf"'n'?|[lLdDjJ]'|(?i:dunkin|somethin|ol)'|'(?i:em)|[A-HJ-XZn]'{_L}{{2,}}|'[2-9]0(?i:s)|'(?i:till?)|"
            rf"{_L}+[aeiouyAEIOUY]'[aeiouA-Z]{_L}*|'(?i:cause)|(?i:nor'easter|c'mon|e'er|s'mores|ev'ry|li'l|nat'l)"
        ),
    ),
    ("apoword2", re.compile(rf"(?P<t>[yY]')(?={_L}){_L}")),
    (
        "url",
        re.compile(r"(?:https?|ftp)://[^ \t\n\"<>|()]*[^ \t\n\"<>|().!?,;:'\-]|www\.[A-Za-z0-9.-]+\.[A-Za-z]{2,4}"),
    ),
    (
        "email",
        re.compile(r'[A-Za-z0-9][^ \t\n\f\r"<>|()\xa0]*@(?:[^ \t\n\f\r"<>|().\xa0]+\.)*[^ \t\n\f\r"<>|().\xa0]+'),
    ),
    ("twitter", re.compile(rf"@[A-Za-z_][A-Za-z0-9_]*|#{_L}(?:{_AN}|_)*")),
    ("redaux", re.compile(rf"(?P<t>{_REDAUX})(?:[^A-Za-z]|$)")),
    ("nt", re.compile(r"[nN]'[tT]")),
    ("date", re.compile(r"\d{1,2}[-/]\d{1,2}[-/]\d{2,4}")),
    ("number", re.compile(rf"[-+]?{_NUM}")),
    ("frac", re.compile(r"(?:\d{1,4}[- \xa0])?\d{1,4}\\?/\d{1,4}")),
    ("frac2", re.compile(r"[\u00bc\u00bd\u00be\u2153\u2154]")),
    ("tbspec", re.compile(r"(?i:-(?:rrb|lrb|rcb|lcb|rsb|lsb)-|c\.d\.s|pro-|anti-|s&p-500|s&ls|cap'n|c'est)")),
    ("thing3", re.compile(rf"{_AN}+(?:-{_L}+){{0,2}}(?:\\?/{_AN}+(?:-{_L}+){{0,2}}){{1,2}}")),
    ("dolsign", re.compile(r"[A-Za-z]*\$|#")),
    ("currency", re.compile(r"[\u00a2\u00a3\u00a4\u00a5\u20a0\u20ac]")),
    # ACRONYM (multi-letter) before a sentence-start word: token keeps the period, a period is re-emitted
    ("acronym_end", re.compile(rf"(?P<t>{_ACRO}\.)(?=[ \t\xa0]+(?:{_SENT_START})[ \t\xa0])")),
    # single letter + period before a sentence-start word: letter, then period
    ("letter_end", re.compile(rf"(?P<t>[A-Za-z])(?=\.[ \t\xa0]+(?:{_SENT_START})[ \t\xa0])\.")),
    ("abbrev", re.compile(rf"(?i:{_ABBREV})\.|(?:{_ABBREV_CAP})\.")),
    ("abbrev_num", re.compile(rf"(?i:{_ABBREV_NUM})\.(?=[ \t\xa0]+\d)")),
    ("abbrev2", re.compile(rf"{_ACRO}\.|[A-Za-z]\.")),
    ("acro", re.compile(_ACRO)),
    ("tbspec2", re.compile(r"'\d\d(?=[\s\xa0]|$)")),
    ("word_dot_insentp", re.compile(rf"(?P<t>{_L}+(?:[.!?]{_L}+)*\.)(?=[,;:])")),
    ("smiley", re.compile(r"[<>]?[:;=][\-o*']?[()DPdpO\\{@|\[\]](?![A-Za-z0-9])")),
    (
        "asiansmiley",
        re.compile(
            r"[\^x=~<>]\.[\^x=~<>]|[\-\^x=~<>']_[\-\^x=~<>']|\([\-\^x=~<>'][_.]?[\-\^x=~<>']\)|"
            r"\([\^x=~<>']-[\^x=~<>'`]\)"
        ),
    ),
    ("dblquote", re.compile(r'"')),
    ("symbol", re.compile(r"[+%&~^|\\=/<>\u2030\u2031]")),
    ("bracket", re.compile(r"[()\[\]{}]")),
    ("hyphens", re.compile(r"-+")),
    ("ldots", re.compile(r"\.{3,5}|(?:\.[ \xa0]){2,4}\.|\u2026")),
    ("fnmarks", re.compile(r"@+|#+|_+")),
    ("asts", re.compile(r"\*+")),
    ("insentp", re.compile(r"[,;:]")),
    ("qmark", re.compile(r"[?!]+")),
    ("dot", re.compile(r"[.\u00a1\u00bf]")),
    ("hthing", re.compile(rf"{_AN}(?:{_AN}|[.,])*(?:-(?:{_AN}+|{_ACRO}\.))+(?:\.(?=[,;:]))?")),
    ("thing", re.compile(rf"(?:[dDoOlL]'{_AN})?{_AN}+(?:[-_](?:[dDoOlL]'{_AN})?{_AN}+)*")),
    ("thinga", re.compile(r"[A-Z]+(?:[+&][A-Z]+)+")),
    ("lquote", re.compile(r"(?P<t>')[A-Za-z][^ \t\n\r\xa0]")),
    (
        "quotes",
        re.compile(r"''|'|`{1,2}|[\u2018\u2019\u201a\u201b\u201c\u201d\u201e\u201f\u2039\u203a\u00ab\u00bb]{1,2}"),
    ),
    ("misc", re.compile(r"[\u00a6\u00a7\u00a8\u00a9\u00ac\u00ae\u00af\u00b0-\u00b3\u00b4-\u00ba\u00d7\u00f7]")),
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
        rules = _CANDIDATES[ch] = [(n, rx) for n, rx in _RULES if re.fullmatch(_FIRST[n], ch)]
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
            # a final abbreviation or single letter keeps its period ("on st.", "plan b.")
            return out + "." if period and _keeps_period(words[-1] + ".") else out
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


def tokenize_all(texts: Iterable[str]) -> list[str]:
    """:func:`tokenize` over a sequence of captions, as pycocoevalcap tokenises them: as consecutive lines of one
    file, so that a caption's end can depend on the next caption (:func:`_next_line_effect`; pycocoevalcap's order
    is the images' order, then each image's captions)."""
    texts = [t.replace("\n", " ") for t in texts]
    out = [tokenize(t) for t in texts]
    for k in range(len(texts) - 1):
        end = texts[k].rstrip(" \t\xa0")[-5:]
        # only a single letter or no./nos./prop. before a final period can change (quick test before the regexes)
        if end.endswith(".") and (end[-2:-1].isalpha() and not end[-3:-2].isalnum() or end[-3:-1].lower() in _NO_END):
            out[k] = _next_line_effect(texts[k], out[k], texts[k + 1], k + 2 < len(texts))
    return out


def ptb_tokenize(captions: Mapping[Hashable, Sequence[str] | Sequence[dict]]) -> dict[Hashable, list[str]]:
    """Tokenise ``{id: [caption, ...]}`` (strings, or COCO dicts with a ``"caption"`` key, as pycocoevalcap takes),
    all captions as one batch in this order (:func:`tokenize_all`), as pycocoevalcap's ``PTBTokenizer`` does."""
    flat: list[str] = []
    sizes: list[int] = []
    for key, caps in captions.items():
        if isinstance(caps, str):
            raise TypeError(f"captions[{key!r}]: expected a list of captions, got a string")
        flat.extend(c["caption"] if isinstance(c, dict) else c for c in caps)
        sizes.append(len(caps))
    done = tokenize_all(flat)
    out: dict[Hashable, list[str]] = {}
    k = 0
    for key, n in zip(captions, sizes):
        out[key] = done[k : k + n]
        k += n
    return out
