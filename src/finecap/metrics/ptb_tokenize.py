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
caption-like and edge-case lines, on every character of the Basic Multilingual Plane and on lines in many scripts,
and against the lexer line by line (``tests/metrics/test_ptb_tokenize.py``; the Java comparisons are marked
``java``).

Faithfully reproduced quirks: brackets become ``-lrb- -rrb- -lsb- -rsb- -lcb- -rcb-`` and *stay* (pycocoevalcap's
list holds the upper-case forms, but the Java tokenizer has already lower-cased them); ``!!!``, ``?!``, ``/``, ``&``,
``%``, ``$``, ``#``, ``*``, ``@`` stay; ``2 1/2`` is one token joined by a no-break space (U+00A0);
the abbreviations of the Java lexer's lists (``st.``, ``mr.``, ``etc.``, ``jan.``, ``ct.``, ``ph.d.``, ...: in the
cases they may be written in, ``Ark.`` ``ARK.`` ``Mfg.`` but not ``ark.`` ``MFG.`` ``PTY.``), acronyms (``u.s.``,
``a.m.``, ``non-u.s``) and single letters (``plan b.``) keep their period, ``no. nos. prop. fig. ca. art. pp. op.``
only before a number; SGML tags are Java's (a name, attributes with quoted values, ``<!...>``, ``<?...>``; a
tag's spaces become no-break spaces: ``<end of text>`` is one token, ``<i a=b>`` is not a tag); ``etc.X y`` gives
``etc. x y`` (the lexer reads the two characters after ``etc.``, ``jan.``, ``inc.``, ...: the longer word ``etc.Xy``
wins).

Text in any script is tokenised as Java does it (``docs/evaluation.md#tokenisation``). The lexer's character classes
(its letters, digits, the combining marks it reads as letters of a word, its symbols) were read off the jar by running
every character of the Basic Multilingual Plane through it (:data:`_JLETTER` and the tables after it): CJK and
full-width punctuation (``。，、！？（）：；．｡``) and symbols (``• → ♥ ™ † ★ ✓ −``) are tokens of their own and stay;
combining marks stay inside their word (``कुत्ता``, NFD ``na\u0308ive``), except those of the scripts the lexer
does not know (Myanmar, Khmer, Sinhala, ...), which it deletes, splitting the word there; ``½ ¼ ¾ ⅓ ⅔`` become
``1/2 ...``; quote characters become PTB quotes (removed) except ``„ ‚ ‟``, which stay; ``o\u2019clock`` keeps its
apostrophe; the entities ``&amp; &quot; &apos; &lt; &gt; &nbsp; &mdash;`` are read (``&amp;`` gives ``&``,
``caf&eacute;`` is one word); emoji, characters beyond the BMP and characters the lexer does not know (``Ⅻ``, most
private-use and unassigned ones, ``「」``) are deleted.

Known differences from the Java tokenizer (outside ordinary caption text):

- Java's lexer reads pycocoevalcap's captions as the lines of one file, and at a line's end it can look into the
  next line: ``plan b.`` gives ``b`` when the next caption starts with a sentence-start word such as ``The`` or
  ``A``, or with an SGML tag (blank lines between count as white space; ``b.`` otherwise), ``says no.`` (``fig.``,
  ...) keeps ``no.`` when the next caption starts with a digit, and ``plan b. The`` gives ``b``, ``photo 5.x``
  keeps ``5.x``, ``etc.X`` gives ``etc. x`` and ``etc.5`` ``etc. 5`` when another caption follows (at the end of the
  file they give ``b.``, ``5 x``, ``etc.x`` and ``etc. .5``). :func:`tokenize_all` and :func:`ptb_tokenize`
  reproduce these from the captions after it in their input (give captions in pycocoevalcap's order: images, then
  each image's captions); :func:`tokenize` alone tokenises a caption as if it were the last line.
- Phone numbers and dates are recognised only in their simplest forms.
- A smiley at the very end of the file (the end of the last caption of a call): Java reads ``:)`` and ``;P`` as
  smileys only with a character after them (there ``:`` ``-rrb-`` and ``;`` ``p``); here they are smileys.
- The Greek capital sigma inside a token where digits, marks, hyphens or other scripts sit next to it: Java picks
  ``σ`` or ``ς`` by ``java.text.BreakIterator``'s word boundaries, Python by Unicode's Final_Sigma rule
  (``ΟΔΟΣ-ΣΟΣ`` gives ``οδοσ-σος`` in Java, ``οδος-σος`` here); in words of Greek letters both agree.
- Letters newer than the JVM's Unicode (Java 17: Unicode 13), kept only inside an e-mail address or URL: Java does
  not lower-case them.
- A caption holding a line break other than ``\\n`` (carriage return, vertical tab, form feed, U+0085, U+2028,
  U+2029) splits into two lines in pycocoevalcap (a bug that misaligns every later caption); here it is white space.
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

# The Java lexer's character classes, read off the jar: every character of the Basic Multilingual Plane run through
# it in several contexts (tests/metrics/test_ptb_tokenize.py checks every one against the jar again). Hex code points
# and ranges. CoreNLP 3.4.1's lexer was generated by JFlex from an older Unicode than Python's and reads UTF-16 code
# units: a character outside the BMP (emoji, ...) is in none of these classes and is deleted, as Java deletes it.
# [:letter:]: letters (the ASCII ones too)
_JLETTER = (
    "0041-005a 0061-007a 00aa 00b5 00ba 00c0-00d6 00d8-00f6 00f8-02c1 02c6-02d1 02e0-02e4 02ec 02ee 0370-0374 "
    "0376-0377 037a-037d 0386 0388-038a 038c 038e-03a1 03a3-03f5 03f7-0481 048a-0527 0531-0556 0559 0561-0587 "
    "05d0-05ea 05f0-05f2 0620-064a 066e-066f 0671-06d3 06d5 06e5-06e6 06ee-06ef 06fa-06fc 06ff 0710 0712-072f "
    "074d-07a5 07b1 07ca-07ea 07f4-07f5 07fa 0800-0815 081a 0824 0828 0840-0858 08a0 08a2-08ac 0904-0939 093d 0950 "
    "0958-0961 0971-0977 0979-097f 0985-098c 098f-0990 0993-09a8 09aa-09b0 09b2 09b6-09b9 09bd 09ce 09dc-09dd "
    "09df-09e1 09f0-09f1 0a05-0a0a 0a0f-0a10 0a13-0a28 0a2a-0a30 0a32-0a33 0a35-0a36 0a38-0a39 0a59-0a5c 0a5e "
    "0a72-0a74 0a85-0a8d 0a8f-0a91 0a93-0aa8 0aaa-0ab0 0ab2-0ab3 0ab5-0ab9 0abd 0ad0 0ae0-0ae1 0b05-0b0c 0b0f-0b10 "
    "0b13-0b28 0b2a-0b30 0b32-0b33 0b35-0b39 0b3d 0b5c-0b5d 0b5f-0b61 0b71 0b83 0b85-0b8a 0b8e-0b90 0b92-0b95 "
    "0b99-0b9a 0b9c 0b9e-0b9f 0ba3-0ba4 0ba8-0baa 0bae-0bb9 0bd0 0c05-0c0c 0c0e-0c10 0c12-0c28 0c2a-0c33 0c35-0c39 "
    "0c3d 0c58-0c59 0c60-0c61 0c85-0c8c 0c8e-0c90 0c92-0ca8 0caa-0cb3 0cb5-0cb9 0cbd 0cde 0ce0-0ce1 0cf1-0cf2 "
    "0d05-0d0c 0d0e-0d10 0d12-0d3a 0d3d 0d4e 0d60-0d61 0d7a-0d7f 0d85-0d96 0d9a-0db1 0db3-0dbb 0dbd 0dc0-0dc6 "
    "0e01-0e30 0e32-0e33 0e40-0e46 0e81-0e82 0e84 0e87-0e88 0e8a 0e8d 0e94-0e97 0e99-0e9f 0ea1-0ea3 0ea5 0ea7 "
    "0eaa-0eab 0ead-0eb0 0eb2-0eb3 0ebd 0ec0-0ec4 0ec6 0edc-0edf 0f00 0f40-0f47 0f49-0f6c 0f88-0f8c 1000-102a 103f "
    "1050-1055 105a-105d 1061 1065-1066 106e-1070 1075-1081 108e 10a0-10c5 10c7 10cd 10d0-10fa 10fc-1248 124a-124d "
    "1250-1256 1258 125a-125d 1260-1288 128a-128d 1290-12b0 12b2-12b5 12b8-12be 12c0 12c2-12c5 12c8-12d6 12d8-1310 "
    "1312-1315 1318-135a 1380-138f 13a0-13f4 1401-166c 166f-167f 1681-169a 16a0-16ea 1700-170c 170e-1711 1720-1731 "
    "1740-1751 1760-176c 176e-1770 1780-17b3 17d7 17dc 1820-1877 1880-18a8 18aa 18b0-18f5 1900-191c 1950-196d "
    "1970-1974 1980-19ab 19c1-19c7 1a00-1a16 1a20-1a54 1aa7 1b05-1b33 1b45-1b4b 1b83-1ba0 1bae-1baf 1bba-1be5 "
    "1c00-1c23 1c4d-1c4f 1c5a-1c7d 1ce9-1cec 1cee-1cf1 1cf5-1cf6 1d00-1dbf 1e00-1f15 1f18-1f1d 1f20-1f45 1f48-1f4d "
    "1f50-1f57 1f59 1f5b 1f5d 1f5f-1f7d 1f80-1fb4 1fb6-1fbc 1fbe 1fc2-1fc4 1fc6-1fcc 1fd0-1fd3 1fd6-1fdb 1fe0-1fec "
    "1ff2-1ff4 1ff6-1ffc 2071 207f 2090-209c 2102 2107 210a-2113 2115 2119-211d 2124 2126 2128 212a-212d 212f-2139 "
    "213c-213f 2145-2149 214e 2183-2184 2c00-2c2e 2c30-2c5e 2c60-2ce4 2ceb-2cee 2cf2-2cf3 2d00-2d25 2d27 2d2d "
    "2d30-2d67 2d6f 2d80-2d96 2da0-2da6 2da8-2dae 2db0-2db6 2db8-2dbe 2dc0-2dc6 2dc8-2dce 2dd0-2dd6 2dd8-2dde 2e2f "
    "3005-3006 3031-3035 303b-303c 3041-3096 309d-309f 30a1-30fa 30fc-30ff 3105-312d 3131-318e 31a0-31ba 31f0-31ff "
    "3400-4db5 4e00-9fcc a000-a48c a4d0-a4fd a500-a60c a610-a61f a62a-a62b a640-a66e a67f-a697 a6a0-a6e5 a717-a71f "
    "a722-a788 a78b-a78e a790-a793 a7a0-a7aa a7f8-a801 a803-a805 a807-a80a a80c-a822 a840-a873 a882-a8b3 a8f2-a8f7 "
    "a8fb a90a-a925 a930-a946 a960-a97c a984-a9b2 a9cf aa00-aa28 aa40-aa42 aa44-aa4b aa60-aa76 aa7a aa80-aaaf aab1 "
    "aab5-aab6 aab9-aabd aac0 aac2 aadb-aadd aae0-aaea aaf2-aaf4 ab01-ab06 ab09-ab0e ab11-ab16 ab20-ab26 ab28-ab2e "
    "abc0-abe2 ac00-d7a3 d7b0-d7c6 d7cb-d7fb f900-fa6d fa70-fad9 fb00-fb06 fb13-fb17 fb1d fb1f-fb28 fb2a-fb36 "
    "fb38-fb3c fb3e fb40-fb41 fb43-fb44 fb46-fbb1 fbd3-fd3d fd50-fd8f fd92-fdc7 fdf0-fdfb fe70-fe74 fe76-fefc "
    "ff21-ff3a ff41-ff5a ff66-ffbe ffc2-ffc7 ffca-ffcf ffd2-ffd7 ffda-ffdc "
)
# [:digit:]
_JDIGIT = (
    "0030-0039 0660-0669 06f0-06f9 07c0-07c9 0966-096f 09e6-09ef 0a66-0a6f 0ae6-0aef 0b66-0b6f 0be6-0bef 0c66-0c6f "
    "0ce6-0cef 0d66-0d6f 0e50-0e59 0ed0-0ed9 0f20-0f29 1040-1049 1090-1099 17e0-17e9 1810-1819 1946-194f 19d0-19d9 "
    "1a80-1a89 1a90-1a99 1b50-1b59 1bb0-1bb9 1c40-1c49 1c50-1c59 a620-a629 a8d0-a8d9 a900-a909 a9d0-a9d9 aa50-aa59 "
    "abf0-abf9 ff10-ff19 "
)
# what PTBLexer's LETTER (the letters of a word) adds to [:letter:]: combining marks and modifier letters of
# many scripts (Latin, Greek, Hebrew, Arabic, Devanagari, Bengali, Thai, ...), the soft hyphen (removed from words)
_LETTER_EXTRA = (
    "00ad 02c2-02c5 02d2-02df 02e5-02eb 02ed 02ef-036f 0375 0378-0379 0384-0385 03f6 0483-0487 055a-055f 0591-05bd "
    "05bf 05c1-05c2 05c4-05c5 05c7 0615-061a 064b-065e 0670 06d6-06e4 06e7-06ed 06fd-06fe 070f 0711 0730-074c "
    "07a6-07b0 07eb-07f3 0900-0903 093c 093e-094e 0951-0955 0962-0963 0981-0983 09bc 09be-09c4 09c7-09c8 09cb-09cd "
    "09d7 09e2-09e3 0a01-0a03 0a3c 0a3e-0a4f 0a81-0a83 0abc 0abe-0acf 0b82 0bbe-0bc2 0bc6-0bc8 0bca-0bcd 0c01-0c03 "
    "0c3e-0c56 0d3e-0d44 0d46-0d48 0e31 0e34-0e3a 0e47-0e4e 0eb1 0eb4-0ebc 0ec8-0ecd "
)
# non-ASCII characters that are a token each (MISCSYMBOL): math, arrows, dingbats, box drawing, full-width
# punctuation, ...; others have rules of their own below (quotes, dashes, currencies, fractions, periods)
_SYMBOL = (
    "00a6-00a9 00ac 00ae-00b1 00b4 00b6-00b8 00d7 00f7 0387 05be 05c0 05c3 05c6 05f3-05f4 0600-0603 0606-060a 060c "
    "0614 061b 061e 066a 066d 0703-070d 07f6-07f8 0964-0965 0e4f 1fbd 2016-2017 2020-2023 2030-2038 203b 203e-2042 "
    "2044 207a-207e 208a-208e 2100-2101 2103-2106 2108-2109 2114 2116-2118 211e-2123 2125 2127 2129 212e 213a-213b "
    "2140-2144 214a-214d 214f 2155-215e 2190-2bff 3012 30fb ff01-ff0f ff1a-ff20 ff3b-ff40 ff5b-ff65 "
)


@functools.cache
def _class_body(table: str, ascii_only: bool) -> str:
    out = []
    for r in table.split():
        lo, _, hi = r.partition("-")
        first, last = int(lo, 16), int(hi or lo, 16)
        if ascii_only and first > 0x7F:
            break
        last = min(last, 0x7F) if ascii_only else last
        out.append(rf"\u{first:04x}" + (rf"-\u{last:04x}" if last > first else ""))
    return "".join(out)


def _class(*tables: str, ascii_only: bool = False) -> str:
    """A regex character class of the code points and ranges of ``tables`` (``ascii_only``: of their ASCII ones;
    "" if none)."""
    body = "".join(_class_body(t, ascii_only) for t in tables)
    return f"[{body}]" if body else ""


# The classes of the rules: (a letter (Java [:letter:]), a digit ([:digit:]), a letter or digit, a letter of a word
# (PTBLexer's LETTER), a letter of a word or digit, a symbol). An ASCII line is read by the rules with the classes'
# ASCII parts (the same matches there; the full classes take some 0.1 s to compile, once, for the first line that
# holds another character).
_CLASSES = {
    a: (
        _class(_JLETTER, ascii_only=a),
        _class(_JDIGIT, ascii_only=a),
        _class(_JLETTER, _JDIGIT, ascii_only=a),
        _class(_JLETTER, _LETTER_EXTRA, ascii_only=a),
        _class(_JLETTER, _LETTER_EXTRA, _JDIGIT, ascii_only=a),
        _class(_SYMBOL, ascii_only=a),
    )
    for a in (False, True)
}
_D = _CLASSES[False][1]
_SP = r"[ \t\xa0\u2000-\u200a\u3000]"  # a space (Java SPACE)
_INSENTP = r"[,;:\u3001]"
# Java's ACRO: letters joined by periods (u.s, a.m), and a few written with a hyphen (non-U.S, U.S.-U.K)
_ACRO_HYPHEN = r"(?i:(?:canada|sino|korean|eu|japan|non)-u\.s|u\.s\.-(?:u\.k|u\.s\.s\.r))"
_ACRO_DOTS = r"[A-Za-z](?:\.[A-Za-z])+"
_ACRO = rf"(?:{_ACRO_HYPHEN}|{_ACRO_DOTS})"

# Abbreviations keeping their period: the lists of CoreNLP 3.4.1's PTBLexer.flex (checked against the jar), written as
# there: letters in any case, a [class] only as written (Java's lexer is caseless except inside character classes:
# "Ark." and "ARK." are abbreviations, "ark." is not; "Mfg." is, "MFG." is not), "s?" an optional letter. ABBREV1, the
# ones usually followed by a lower-case word: the lexer reads them with the two characters after them (any two), so
# that "etc.X y" gives "etc." before the word "etc.X" (a longer word wins: "etc.Xy z"); with fewer characters left
# (the end of the file) it reads the period again ("etc.5" gives "etc." and ".5").
_ABBREV1 = (
    "jan|feb|mar|apr|jun|jul|aug|sept?|oct|nov|dec|mon|tues?|wed|thu|thurs|fri|"
    "ala|ariz|[A]z|[A]rk|calif|colo|conn|ct|dak|[D]el|fla|ga|[I]ll|ind|kans?|ky|[L]a|[M]ass|md|mich|minn|[M]iss|mo|"
    "mont|neb|nev|okla|[O]re|[P]a|penn|tenn|[T]ex|va|vt|[W]ash|wisc?|wyo|"
    "inc|cos?|corp|pp?t[ye]s?|ltd|plc|rt|bancorp|bhd|assn|univ|intl|sys|tel|est|ext|sq|"
    "jr|sr|bros|ed.d|ph.d|blvd|rd|esq|etc|al|seq|bldg"
)
# ABBREV2 (titles and a few more, usually followed by a capitalised word): the token is the word and its period
_ABBREV2 = (
    "mr|mrs|ms|[M]iss|drs?|profs?|sens?|reps?|attys?|lt|col|gen|messrs|govs?|adm|rev|maj|sgt|cpl|pvt|capt|ste?|ave|"
    "pres|lieut|hon|brig|co?mdr|pfc|spc|supts?|det|mt|ft|adj|adv|asst|assoc|ens|insp|mlle|mme|msgr|sfc|"
    "vs|alex|wm|jos|cie|cf|treas|ph|invt|elec|natl|m[ft]g|dept"
)
_ABBREV = f"{_ABBREV1}|{_ABBREV2}"  # all that keep a period written right after them
# ABBREV3: ones that keep the period only before a number ("fig. 5", "no.5"; "bldg." is in ABBREV1 too)
_ABBREV_NUM = "ca|figs?|prop|nos?|art|bldg|pp|op"


# what the abbreviation rules match starts with: letters and a period (or, an ACRO, a hyphen: "non-U.S"), tested
# first (the long alternations are slow to fail)
_GUARD = r"(?=[A-Za-z]+\.)"
_GUARD_ACRO = r"(?=[A-Za-z]+[.-])"


def _abbrev_regex(pattern: str) -> str:
    """A regex of the abbreviation list ``pattern`` (:data:`_ABBREV1`): letters in any case, classes as written."""
    body = pattern.replace(".", r"\.")
    return "(?i:" + re.sub(r"\[[^]]*\]", lambda m: f"(?-i:{m.group(0)})", body) + ")"


# words after which a single letter + period counts as sentence end ("the letter I. The ...")
# (the first letter a capital, the rest in any case: Java's lexer is caseless but for character classes)
_SENT_START_WORDS = (
    "About|According|Additionally|After|An|A|As|At|But|Earlier|He|Her|Here|However|If|In|It|Last|Many|More|Mr\\.|"
    "Ms\\.|Now|Once|One|Other|Our|She|Since|So|Some|Such|That|The|Their|Then|There|These|They|This|We|When|While|"
    "What|Yet|You"
)
_SENT_START = "|".join(w[0] + f"(?i:{w[1:]})" for w in _SENT_START_WORDS.split("|"))

_SPACE = re.compile(_SP + "+")  # Java's SPACES
# what the lexer skips: spaces, invisible characters (one at a time), line breaks (Java ends a line there; here they
# are white space: module docstring)
_BLANK = frozenset(" \t\xa0\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u3000")
_BLANK |= frozenset("\x00\x7f\u200b\u200e\u200f\ufeff\n\r\x0b\x0c\x85\u2028\u2029")
_NO_RULE_START = frozenset(" \t\n\r\x0b\x0c\x85\u2028\u2029")  # blanks no rule starts with

_DOT = r"[.\xa1\xbf\u037e\u0589\u061f\u06d4\u0700-\u0702\u07fa\u3002]"  # a period (kept unless ASCII)
_QUOTE = r"[`\u0091-\u0094\u2018-\u201f\u2039\u203a\xab\xbb]"  # a quote character
_CURRENCY_CLASS = r"[\x80\xa2-\xa5\u060b\u0e3f\u20a0\u20a4\u20ac\uffe0\uffe1\uffe5\uffe6]"
_FILENAME_EXT = (
    "bat|bmp|c|class|cgi|cpp|dll|doc|docx|exe|gif|gz|h|htm|html|jar|java|jpeg|jpg|mov|mp3|pdf|php|pl|png|ppt|ps|py|sql|"
    "tar|txt|wav|x|xml|zip"
)
_ENTITY_LETTER = r"&[aeiouAEIOU](?i:acute|grave|uml);"  # a letter of a word too: caf&eacute;
_SGML_NAME = r"[A-Za-z][A-Za-z0-9_:.\-]*"
_SGML = (
    rf"<(?:[!?][A-Za-z\-][^>\r\n]*|{_SGML_NAME}(?: +{_SGML_NAME}(?: *= *(?:'[^'\r\n]*'|\"[^\"\r\n]*\"))?)* */?"
    rf"|/{_SGML_NAME}) *>"
)


def _rules(entities: bool, ascii_only: bool) -> list[tuple[str, str, str]]:
    """The lexer's rules: (name, pattern, the characters a match can start with). The token is group "t" when the
    pattern has one (the rest is trailing context that counts for the longest match, as in JFlex), else the whole
    match. On equal lengths the earlier rule wins. ``entities``: with the SGML character entities the Java lexer
    reads (``&amp; &quot; &apos; &lt; &gt; &nbsp; &mdash;``, ``&eacute;`` in words, ...): the rules for a line that
    holds an ampersand (the entities make the patterns slower). ``ascii_only``: the rules for an ASCII line."""
    _L, _D, _AN, _WL, _WLD, _SYM = _CLASSES[ascii_only]
    apos = r"(?:['\u0092\u2019]|&(?i:apos);)" if entities else r"['\u0092\u2019]"  # Java APOS
    apos_etc = (
        r"(?:['`\u0091\u0092\u2018\u2019\u201b]|&(?i:apos);)" if entities else r"['`\u0091\u0092\u2018\u2019\u201b]"
    )
    apos_first = r"['\u0092\u2019&]" if entities else r"['\u0092\u2019]"
    wl = rf"(?:{_WL}|{_ENTITY_LETTER})" if entities else _WL
    wld = rf"(?:{_WLD}|{_ENTITY_LETTER})" if entities else _WLD
    wl_first = _WL[:-1] + "&]" if entities else _WL
    amp = r"(?:&(?i:amp);|&)" if entities else "&"
    word = rf"{wl}{wld}*(?:[.!?]{wl}{wld}*)*"
    redaux = apos + r"(?:[msdMSD]|[rR][eE]|[vV][eE]|[lL][lL])"
    rules = [
        ("cplus", r"(?i:c\+\+|[cf]#)", "[cCfF]"),
        (
            "assim",
            # cannot / gonna / ... / 'tis: the first part is the token, the rest is read again (a longer word wins)
            r"(?P<t>(?i:can))(?i:not)|(?P<t2>(?i:gon|wan))(?i:na)|(?P<t3>(?i:got))(?i:ta)|(?P<t4>(?i:gim|lem))(?i:me)|"
            r"(?P<t5>'(?i:t))(?i:is|was)",
            r"[cCgGwWlL']",
        ),
        # Java's SGML: a tag name, attributes (quoted values only) and an optional "/", a closing tag, or <!...> and
        # <?...>; its spaces become no-break spaces (one token: "<a\xa0b>")
        ("sgml", _SGML, "<"),
        (
            "dash",
            r"[\u0096\u0097\u2013\u2014\u2015]" + (r"|&(?i:md|mdash|ndash);" if entities else ""),
            r"[\u0096\u0097\u2013-\u2015&]",
        ),
        ("amp", r"&(?i:amp);", "&"),
        ("sppunc", r"&(?i:ht|tl|ur|lr|qc|ql|qr|odq|cdq|#[0-9]+);", "&"),
        ("word_redaux", rf"(?P<t>{word})(?={redaux}){redaux}", wl_first),
        (
            "sword_nt",
            rf"(?P<t>[A-Za-z\xad]*[A-MO-Za-mo-z]\xad*)(?=[nN]{apos_etc}[tT])[nN]{apos_etc}[tT]",
            r"[A-Za-z\xad]",
        ),
        ("word", word, wl_first),
        (
            "apoword",
            rf"{apos}(?i:n){apos}?|[lLdDjJ]{apos}|(?i:dunkin|somethin|ol){apos}|{apos}(?i:em)|"
            rf"[A-HJ-XZn]{apos_etc}{_L}{{2,}}|{apos}[2-9]0(?i:s)|{apos}(?i:till?)|"
            rf"{_L}+[aeiouyAEIOUY]{apos_etc}[aeiouA-Z]{_L}*|{apos}(?i:cause)|(?i:cont'd\.?)|"
            rf"(?i:nor'easter|c'mon|e'er|s'mores|ev'ry|li'l|nat'l)|(?i:o){apos_etc}(?i:o)",
            rf"{_L}|{apos_first}",
        ),
        ("apoword2", rf"(?P<t>[yY]{apos})(?={_L}){_L}", r"[yY]"),
        (
            "url",
            r'(?i:https?)://[^ \t\n\f\r"<>|(){}]+[^ \t\n\f\r"<>|.!?(){},\-]',
            r"[hH]",
        ),
        (
            # Java's LIKELYURL; its class [^...,-_$] excludes the range from "," to "_" (digits, capitals, ...)
            "url2",
            r'(?:(?i:www)\.(?:[^ \t\n\f\r"<>|.!?(){},]+\.)+[a-zA-Z]{2,4}|'
            r'(?:[^ \t\n\f\r"`\'<>|.!?(){}\x2c-\x5f$]+\.)+(?i:com|net|org|edu))'
            r'(?:/[^ \t\n\f\r"<>|()]+[^ \t\n\f\r"<>|.!?(){},\-])?',
            r'[^ \t\n\f\r"`\'<>|.!?(){}\x2c-\x5f$]|[wW]',
        ),
        (
            "email",
            (r"(?:<|&(?i:lt);)?" if entities else "<?")
            + r'[A-Za-z0-9][^ \t\n\f\r"<>|(){}\xa0]*@(?:[^ \t\n\f\r"<>|(){}.\xa0]+\.)*[^ \t\n\f\r"<>|(){}.\xa0]+'
            + (r"(?:>|&(?i:gt);)?" if entities else ">?"),
            r"[A-Za-z0-9<&]",
        ),
        ("twitter", rf"@[A-Za-z_][A-Za-z0-9_]*|#{wl}+", r"[@#]"),
        ("redaux", rf"(?P<t>{redaux})(?:[^A-Za-z]|$)", apos_first),
        ("nt", rf"[nN]{apos_etc}[tT]", r"[nN]"),
        ("date", rf"{_D}{{1,2}}[-/]{_D}{{1,2}}[-/]{_D}{{2,4}}", _D),
        ("number", rf"[-+]?(?:{_D}*(?:[.:,\xad\u066b\u066c]{_D}+)+|{_D}+)", rf"[-+.:,\xad\u066b\u066c]|{_D}"),
        (
            "subsupnum",
            r"[\u207a\u207b\u208a\u208b]?(?:[\u2070\xb9\xb2\xb3\u2074-\u2079]+|[\u2080-\u2089]+)",
            r"[\u207a\u207b\u208a\u208b\u2070\xb9\xb2\xb3\u2074-\u2079\u2080-\u2089]",
        ),
        ("frac", rf"(?:{_D}{{1,4}}[- \xa0])?{_D}{{1,4}}(?:\\?/|\u2044){_D}{{1,4}}", _D),
        ("frac2", r"[\xbc-\xbe\u2153-\u215e]", r"[\xbc-\xbe\u2153-\u215e]"),
        (
            "tbspec",
            rf"(?i:-(?:rrb|lrb|rcb|lcb|rsb|lsb)-|c\.d\.s|pro-|anti-|s{amp}p-500|s{amp}ls|cap{apos}n|c{apos}est)",
            r"[-cCpPaAsS]",
        ),
        ("thing3", r"[A-Za-z0-9]+(?:-[A-Za-z]+){0,2}(?:\\?/[A-Za-z0-9]+(?:-[A-Za-z]+){0,2}){1,2}", r"[A-Za-z0-9]"),
        ("dolsign", r"[A-Z]*\$|#", r"[A-Z$#]"),
        ("currency", _CURRENCY_CLASS, _CURRENCY_CLASS),
        # ACRONYM (multi-letter) before a sentence-start word: token keeps the period, a period is re-emitted
        ("acronym_end", rf"{_GUARD_ACRO}(?P<t>{_ACRO}\.)(?={_SP}+(?:{_SENT_START}){_SP})", r"[A-Za-z]"),
        # single letter + period before a sentence-start word or an SGML tag: letter, then period
        ("letter_end", rf"(?P<t>[A-Za-z])(?=\.{_SP}+(?:{_SENT_START}|{_SGML}){_SP})\.", r"[A-Za-z]"),
        # the abbreviations (before a number, pty. ltd., ABBREV1 with its two characters after, ABBREV2, ACRO.)
        ("abbrev_num", rf"{_GUARD}(?P<t>{_abbrev_regex(_ABBREV_NUM)}\.){_SP}?{_D}", r"[A-Za-z]"),
        ("pty_ltd", rf"(?P<t>(?i:pt[eyEY]|co)\.){_SP}(?i:ltd|lim)", r"[pPcC]"),
        ("abbrev1", rf"{_GUARD}(?P<t>{_abbrev_regex(_ABBREV1)}\.)(?P<after>(?s:..))?", r"[A-Za-z]"),
        ("abbrev2", rf"{_GUARD_ACRO}(?:{_abbrev_regex(_ABBREV2)}\.|{_ACRO}\.|[A-Za-z]\.)", r"[A-Za-z]"),
        # (an ACRO written with a hyphen is a token before a space only; the others are words anyway)
        ("acro", rf"{_GUARD_ACRO}(?:(?P<t>{_ACRO_HYPHEN}){_SP}|{_ACRO_DOTS})", r"[A-Za-z]"),
        ("tbspec2", rf"{apos}[0-9][0-9](?={_SP}|$)", apos_first),
        # (the character after a file name or "word." counts for the longest match: "Ala.gz " is a file name)
        ("filename", rf"(?P<t>{_WLD}+(?:\.{_WLD}+)*\.(?i:{_FILENAME_EXT}))(?:{_SP}|[.?!,])", _WLD),
        ("word_dot_insentp", rf"(?P<t>{word}\.){_INSENTP}", wl_first),
        ("smiley", r"[<>]?[:;=][\-o*']?[()DPdpO\\{@|\[\]](?![A-Za-z0-9])", r"[<>:;=]"),
        (
            "asiansmiley",
            # (Java's ASIANSMILEY starts with a "^.^" alternative whose escaped bracket makes it match nothing real)
            r"[\-\^x=~<>']_[\-\^x=~<>']|\([\-\^x=~<>'][_.]?[\-\^x=~<>']\)|"
            r"\([\^x=~<>']-[\^x=~<>'`]\)",
            r"[\^x=~<>\-'(]",
        ),
        ("dblquote", r'"|&(?i:quot);' if entities else '"', r'["&]'),
        ("lt_gt", r"&(?i:lt|gt);", "&"),
        ("nbsp", r"&(?i:nbsp);", "&"),
        ("symbol", r"[+%&~^|\\=/<>\u2030\u2031]", r"[+%&~^|\\=/<>\u2030\u2031]"),
        ("bracket", r"[()\[\]{}]", r"[()\[\]{}]"),
        ("hyphens", r"-+", "-"),
        ("ldots", r"\.{3,5}|(?:\.[ \xa0]){2,4}\.|\u2026", r"[.\u2026]"),
        ("fnmarks", r"@+|#+|_+", r"[@#_]"),
        ("asts", r"\*+|(?:\\\*){1,3}", r"[*\\]"),  # Java's ASTS: "**", and "\*" (PTB's escaped asterisk) up to 3
        ("insentp", _INSENTP, _INSENTP),
        ("qmark", r"[?!]+", r"[?!]"),
        ("dot", _DOT, _DOT),
        (
            "hthing",
            # (the acronym first: the longer match, "x-U.S.a." rather than "x-U"; those with a hyphen are parts)
            rf"[A-Za-z0-9][A-Za-z0-9.,\xad]*(?:-(?:{_ACRO_DOTS}\.|[A-Za-z0-9\xad]+))+(?:\.(?={_INSENTP}))?",
            r"[A-Za-z0-9]",
        ),
        (
            "thing",
            rf"(?:[dDoOlL]{apos_etc}{_AN})?{_AN}+(?:[-_\u058a\u2010\u2011](?:[dDoOlL]{apos_etc}{_AN})?{_AN}+)*"
            rf"(?:\.(?={_INSENTP}))?",
            _AN,
        ),
        ("thinga", rf"[A-Z]+(?:(?:[+]|{amp})[A-Z]+)+(?:\.(?={_INSENTP}))?", r"[A-Z]"),
        ("lquote", r"(?P<t>')[A-Za-z][^ \t\n\r\xa0]", "'"),
        ("redaux_any", redaux, apos_first),
        ("quotes", rf"''|{_QUOTE}{{1,2}}|{apos}", rf"{_QUOTE}|{apos_first}"),
        ("duckfeet", r"<<|>>", r"[<>]"),
        ("misc", _SYM, _SYM),
    ]
    if not entities:  # the rules that read an entity only
        rules = [r for r in rules if r[0] not in ("amp", "sppunc", "lt_gt", "nbsp")]
    return [r for r in rules if r[1]]  # (an ASCII line has no "misc" symbol)


_RULES = {(entities, a): _rules(entities, a) for entities in (False, True) for a in (False, True)}
_CANDIDATES: dict[tuple[str, bool, bool], list[tuple[str, re.Pattern[str]]]] = {}
_compile = functools.cache(re.compile)  # a few patterns hold large character classes: compiled once


def _candidates(ch: str, entities: bool, ascii_only: bool) -> list[tuple[str, re.Pattern[str]]]:
    """The rules a match at ``ch`` can come from (only those are tried at a position)."""
    key = (ch, entities, ascii_only)
    rules = _CANDIDATES.get(key)
    if rules is None:
        # compiled here, on first use (most captions never reach the lexer: tokenize_all, _FAST)
        rules = [(n, _compile(rx)) for n, rx, first in _RULES[entities, ascii_only] if _compile(first).fullmatch(ch)]
        _CANDIDATES[key] = rules
    return rules


_PLAIN = re.compile(r"[A-Za-z]+(?=[ \t]|$)")  # a plain word before a space: a WORD token for every rule set
# a run of plain words (a comma followed by a space may end each): WORD (and ',') tokens for every rule set, read with
# one match instead of two per word
_PLAIN_RUN = re.compile(r"(?:[A-Za-z]+,?[ \t]+)*[A-Za-z]+(?=[ \t]|$)")
_ASSIM_WORDS = frozenset(["cannot", "gonna", "wanna", "gotta", "gimme", "lemme"])

_BRACKETS = {"(": "-LRB-", ")": "-RRB-", "[": "-LSB-", "]": "-RSB-", "{": "-LCB-", "}": "-RCB-"}
_CURRENCY = {"\u00a2": "cents", "\u00a3": "#", "\u00a4": "$", "\u0080": "$", "\u20a0": "$", "\u20ac": "$"}
_FRAC2 = {"\u00bc": "1/4", "\u00bd": "1/2", "\u00be": "3/4", "\u2153": "1/3", "\u2154": "2/3"}
# Java's quote tokens (handleQuotes, latexQuotes): left quotes become ` or ``, right ones ' or '' (all removed by
# pycocoevalcap), the low and reversed double quotes stay as they are (and are kept)
_LATEX = str.maketrans(
    {"\u0091": "`", "\u2018": "`", "\u201b": "`", "\u2039": "`", "\u0092": "'", "\u2019": "'", "\u203a": "'"}
    | {"\u0093": "``", "\u201c": "``", "\u00ab": "``", "\u0094": "''", "\u201d": "''", "\u00bb": "''"}
)
_AMP_ENTITY = re.compile("(?i:&amp;)")
_SOFT_HYPHEN_RULES = frozenset(["word", "word_redaux", "word_dot_insentp", "sword_nt", "number", "hthing"])
_ABBREV_END = re.compile(rf"(?:{_abbrev_regex(_ABBREV)}|[A-Za-z])\.")
_TOKEN_GROUPS = ("t", "t2", "t3", "t4", "t5")
_LEFT_QUOTE_NEXT = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789$")  # ASCII


@functools.lru_cache(maxsize=65536)
def _keeps_period(word: str) -> bool:
    """Whether ``word`` (with its final period, as written) is an abbreviation or single letter keeping the period
    at the end of a caption (``St.``, ``etc.``, ``b.``); cached: captions end with few distinct words."""
    return len(word) <= 8 and _ABBREV_END.fullmatch(word) is not None


def _has_assim(lowered: str) -> bool:
    """Whether a lower-cased caption may hold cannot / gonna / ... (a substring test, a superset of the lexer's)."""
    return ("nn" in lowered or "tt" in lowered or "mm" in lowered) and any(w in lowered for w in _ASSIM_WORDS)


def tokens(text: str) -> list[str]:
    """PTB tokens of one line of text, before lower-casing and punctuation removal (``-LRB-`` etc. upper case)."""
    entities, ascii_only = "&" in text, text.isascii()
    out: list[str] = []
    pos, n = 0, len(text)
    while pos < n:
        ch = text[pos]
        blank_end = 0
        if ch in _BLANK:
            m = _SPACE.match(text, pos)
            blank_end = m.end() if m else pos + 1
            if ch in _NO_RULE_START:
                pos = blank_end
                continue
            # else Java's LIKELYURL may start here ("\u3000b.com" is one token): the longer one wins, below
        else:
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
        for name, rx in _candidates(ch, entities, ascii_only):
            m = rx.match(text, pos)
            if m and m.end() - pos > best_len:
                best, best_len, best_name = m, m.end() - pos, name
        if blank_end and best_len <= blank_end - pos:
            pos = blank_end
            continue
        if best is None:
            pos += 1  # Java deletes a character no rule reads (most symbols outside its lists, emoji, ...)
            continue
        group = next((g for g in _TOKEN_GROUPS if g in best.re.groupindex and best.group(g) is not None), None)
        tok = best.group(group) if group else best.group(0)
        end = pos + len(tok)
        if best_name in _SOFT_HYPHEN_RULES:
            if "\xad" in tok:
                tok = tok.replace("\xad", "") or "-"  # soft hyphens are removed (a token of them only: "-")
        elif best_name == "acronym_end" or (best_name == "abbrev1" and best.group("after") is None):
            end -= 1  # the period is read again (abbrev1: at the end of the text, "etc.5" gives "etc." ".5")
        elif best_name in ("frac", "sgml"):
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
            tok = _CURRENCY.get(tok, tok)
        elif best_name == "frac2":
            tok = _FRAC2.get(tok, tok)
        elif best_name == "dblquote":
            if tok == '"' or tok == "&quot;":  # Java leaves &QUOT; as it is
                tok = "``" if end < n and text[end] in _LEFT_QUOTE_NEXT else "''"
        elif best_name == "lquote":
            tok = "`"
        elif best_name in ("quotes", "redaux", "redaux_any", "nt"):
            tok = tok.replace("&apos;", "'").translate(_LATEX)
        elif best_name in ("amp", "tbspec", "thinga"):
            tok = _AMP_ENTITY.sub("&", tok)
        elif best_name == "lt_gt":
            tok = "<" if tok[1] in "lL" else ">"
        elif best_name == "nbsp":
            pos = end  # &nbsp; is white space
            continue
        out.append(tok)
        pos = end
    return out


# A caption made only of these words needs no lexer: plain words (possibly with a possessive 's or hyphenated, as
# "dog's", "black-and-white"), integers, commas followed by a space, an optional final period. Its PTB tokens are its
# words, "'s" split off, commas and the final period dropped (tests/metrics/test_ptb_tokenize.py checks this against
# the lexer and the Java tokenizer). A final "st." / "b." (abbreviation or single letter) keeps its period: lexer.
_FAST_WORD = r"(?:[A-Za-z]+(?:'[sS]|(?:-[A-Za-z]+)+)?|[0-9]+)"
_FAST_SEP = r"(?:[ \t]*,[ \t]+|[ \t]+)"
_FAST = re.compile(rf"[ \t]*(?:{_FAST_WORD}{_FAST_SEP})*{_FAST_WORD}(?:[ \t]*\.)?[ \t]*")
# what makes Java's tokenizer look past the end of a line into the next one (module docstring)
_LETTER_END = re.compile(r"[A-Za-z]\.$")
_LETTER_END_TOKEN = re.compile(r"(?:^| )[a-z]\.$")  # ... read as a token of its own (not "u.s.", "dog.")
_NUM_ABBREV_END = re.compile(rf"{_abbrev_regex(_ABBREV_NUM)}\.$")
_NUM_ABBREV_TOKEN = re.compile(rf"(?:^| )(?:{_ABBREV_NUM})$")
# line ends that Java reads differently before a line break than at the end of the file (tokenize's last line): a
# single letter and period before a final sentence-start word ("plan b. The"), a final file name ("photo 1.jpg") ...
_BEFORE_LINE_BREAK = re.compile(rf"[A-Za-z]\.{_SP}+(?:{_SENT_START}|{_SGML})$|\.(?i:{_FILENAME_EXT})$")
# ... an ABBREV1 and its period before one character ("etc.X": "etc." and "x" before a line break, the word "etc.x" at
# the end of the file), a final ACRO with a hyphen ("non-U.S"): both have a period before the last character
# (also inside a word: "'90ssr.5" is "'90s" and "sr." for Java)
_BEFORE_LINE_BREAK_SHORT = re.compile(rf"{_GUARD_ACRO}(?:{_abbrev_regex(_ABBREV1)}\..|{_ACRO_HYPHEN})$")
_SENT_NEXT = re.compile(rf"{_SP}*(?:{_SENT_START}|{_SGML})(?P<end>{_SP}|$)")
_SP_CHARS = " \t\xa0\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u3000"  # _SP's
_DIGIT = re.compile(_D)


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


def _next_line_effect(texts: list[str], k: int, out: str) -> str:
    """``out`` (:func:`tokenize` of the line ``texts[k]``) as Java gives it when the lines after it follow (one at
    least). Java's lexer looks across the line break in two rules: a single letter with a period before a
    sentence-start word (``plan b.`` + ``The ...`` gives ``b``, then the period is dropped; blank lines between are
    white space), and the abbreviations of :data:`_ABBREV_NUM` (``no.``, ``fig.``, ``prop.``, ...) directly before a
    digit (``says no.`` + ``5 dogs`` keeps ``no.``)."""
    text = texts[k]
    if _LETTER_END_TOKEN.search(out) and _LETTER_END.search(text.rstrip(_SP_CHARS)):
        j = k + 1
        while j + 1 < len(texts) and not texts[j].strip(_SP_CHARS):
            j += 1
        m = _SENT_NEXT.match(texts[j])
        if m and (m.group("end") or j + 1 < len(texts)):
            return out[:-1]
    elif _NUM_ABBREV_TOKEN.search(out) and _NUM_ABBREV_END.search(text) and _DIGIT.match(texts[k + 1]):
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
    etc., b.)."""
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
    keeps = run == 1  # single letters
    maybe = np.flatnonzero(_among(lower, _ABBREV_LOWER_KEYS))  # abbreviations in some case (few)
    if len(maybe):  # ... in a case they may be written in (Ark. ARK. Mfg., not ark. MFG.)
        key = np.ascontiguousarray(word[maybe].astype(np.uint8)).view("<u8")[:, 0]
        keeps[maybe] |= _among(key, _ABBREV_KEYS)
    return end[keeps]


def _among(keys: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Whether each of ``keys`` is in ``table`` (sorted, non-empty): ``np.isin`` by a binary search (``np.isin``
    sorts both arrays, and its ``np.unique`` imports ``numpy.ma``, 6-7 ms of ``finecap eval``'s start)."""
    return table[np.minimum(np.searchsorted(table, keys), len(table) - 1)] == keys


def _expand(pattern: str, cased: bool = False) -> list[str]:
    """The words matched by ``pattern``, an alternation of letters, optional letters (``s?``) and classes (``[ft]``)
    (:data:`_ABBREV`): lower-cased, or (``cased``) in every case they may be written in (a class only as written)."""
    words = []
    for alternative in pattern.split("|"):
        out, i = [""], 0
        while i < len(alternative):
            j = alternative.index("]", i) + 1 if alternative[i] == "[" else i + 1
            options = list(alternative[i:j].strip("[]"))
            if cased and j == i + 1 and options[0].isalpha():
                options = [options[0].lower(), options[0].upper()]
            if alternative[j : j + 1] == "?":
                options, j = [*options, ""], j + 1
            out, i = [w + o for w in out for o in options], j
        words += out
    return words


def _keys(words: list[str]) -> np.ndarray:
    """Words of at most 8 ASCII bytes as sorted little-endian uint64 keys (zero-padded), as :func:`_kept_periods`
    reads them."""
    return np.array(sorted({int.from_bytes(w.encode("ascii"), "little") for w in words}), dtype=np.uint64)


# the abbreviations (all but ph.d. and ed.d.) lower-cased, and in every case they may be written in (1,838 keys)
_ABBREV_LOWER_KEYS = _keys([w.lower() for w in _expand(_ABBREV) if w.isalpha()])
_ABBREV_KEYS = _keys([w for w in _expand(_ABBREV, cased=True) if w.isalpha()])
# the last two letters of no. nos. fig. figs. prop. ... (lower-cased, as 256 * x + y)
_NO_END = sorted({256 * ord(w[-2]) + ord(w[-1]) for w in _expand(_ABBREV_NUM)})


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
    """Lines but the last whose end may depend on the next line: a final period after a single letter or a word
    that keeps it before a number only (no. fig. prop. ...: :data:`_ABBREV_NUM`; the test of :func:`tokenize_all`'s
    older loop), preselected on the bytes of all lines at once."""
    b, cls = text.b, text.cls
    last = text.starts[1:] - 2  # (n - 1,) last character of every line but the last (or the newline before it)
    blank = (b[last] == ord(" ")) | (b[last] == ord("\t")) | (b[last] == ord("?"))  # white space, non-ASCII
    letter = (cls[last - 1] == _LET) | (b[last - 1] == ord("?"))
    single = letter & ((cls[last - 2] & (_LET | _DIG)) == 0)
    xy = ((b[last - 2] | 32).astype(np.uint16) << 8) | (b[last - 1] | 32)  # the two letters before the period
    no = np.zeros(len(last), dtype=bool)
    for end in _NO_END:
        no |= xy == end
    out = []
    for k in np.flatnonzero(blank | ((b[last] == ord(".")) & (single | no))).tolist():
        end = texts[k].rstrip(_SP_CHARS)[-5:]
        single = end[-2:-1].isascii() and end[-2:-1].isalpha()
        if end.endswith(".") and (single or _NUM_ABBREV_END.search(end)):
            out.append(k)
    return out


def _before_line_break(text: str) -> bool:
    """Whether Java reads the end of the line ``text`` differently before a line break than at the end of the file
    (:data:`_BEFORE_LINE_BREAK`)."""
    if text[-2:-1] == "." and _BEFORE_LINE_BREAK_SHORT.search(text, max(len(text) - 12, 0)):
        return True
    # a match holds one of the line's last two periods, as its first or second character: searched from there
    last = text.rfind(".")
    before = text.rfind(".", 0, last)
    return _BEFORE_LINE_BREAK.search(text, max((before if before >= 0 else last) - 1, 0)) is not None


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
    last = len(texts) - 1
    for k in np.flatnonzero(bad).tolist():
        t = texts[k]
        # "plan b. The", "photo 1.jpg" end a line: Java reads the line break after them as a space (not at the end)
        out[k] = tokenize(t + " " if k < last and "." in t and _before_line_break(t) else t)
    for k in _next_line_candidates(texts, text):
        out[k] = _next_line_effect(texts, k, out[k])
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
