"""Short texts for messages: one-line errors, short reprs, shell commands; and a caption's tokens as Karpathy's files
hold them (:func:`karpathy_tokens`)."""

from __future__ import annotations

import difflib
import os
import re
import reprlib
import shlex
import string
import unicodedata
from collections.abc import Iterable
from typing import Any


def shell_command(argv: Iterable[str | os.PathLike[str]]) -> str:
    """``argv`` as one POSIX shell command line (bash, zsh, sh) that, pasted into a shell, runs exactly ``argv``: each
    word quoted when it needs it (:func:`shlex.join`: ``'run;name'``, ``'$(touch x)'``, ``'it'"'"'s'``; a plain word
    as it is). The one way finecap prints a command for a user to run again (a model card's "Made by", a lock's
    record, a hint naming a path): joining the words with spaces would make ``run.name=a;rm -rf x`` two commands and
    run ``$(...)``. An argument holding a line break keeps it inside its quotes (the command then spans lines and is
    still one command; ``shlex.split`` reads it back).

    Example::

        >>> print(shell_command(["finecap", "train", "demo/mle", "run.name=a b;c", "run.out=$(id)"]))
        finecap train demo/mle 'run.name=a b;c' 'run.out=$(id)'
    """
    return shlex.join(os.fspath(a) for a in argv)


def one_line(error: BaseException) -> str:
    """An exception's message on one line (whitespace runs joined), or its type's name when it has none."""
    return " ".join(str(error).split()) or type(error).__name__


SHORT_REPR_LIMIT = 60


"""Characters of a user's value an error message shows at most (:func:`short_repr`)."""


def short_repr(value: Any, limit: int = SHORT_REPR_LIMIT) -> str:
    """``repr(value)`` in at most ``limit`` characters, for error messages: the one way finecap shows a user's value,
    so that no message can be megabytes long (a value read from a file, or a YAML alias bomb, can be). Built on
    :mod:`reprlib`, which never renders what it leaves out: a long string keeps its two ends, a container its first
    items and the first levels of its nesting.

    Example::

        >>> short_repr("ten"), short_repr("x" * 1000, limit=20), short_repr([[[[1]]]] * 100, limit=30)
        ("'ten'", "'xxxxxxx...xxxxxxxx'", '[[[[...]]], [[[...]]], [[[....')
    """
    shortener = reprlib.Repr()
    shortener.maxlevel = 3
    for name in ("maxlist", "maxtuple", "maxset", "maxfrozenset", "maxdeque", "maxarray", "maxdict"):
        setattr(shortener, name, 6)
    shortener.maxstring = shortener.maxlong = shortener.maxother = max(limit, 5)
    try:
        text = shortener.repr(value)
    except (ValueError, RecursionError):  # an int past Python's digit limit; a self-referencing structure
        text = f"<{type(value).__name__} too long to show>"
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


"""Characters that end a line or are invisible controls (C0, DEL, C1, Unicode's line and paragraph separators): what
a name finecap writes into a file or a page must not hold (``run.name``), and what a card shows escaped
(:func:`finecap.train.model_card.one_line`)."""


def did_you_mean(name: object, valid: Iterable[object], prefix: str = "") -> str:
    """`` (did you mean 'x'?)`` for the closest of ``valid`` to a mistyped ``name`` (:func:`difflib.get_close_matches`,
    as argparse and git suggest), or ``""`` when nothing is close; ``prefix`` is prepended to the suggestion.

    Example::

        >>> did_you_mean("n_trian", ["n_train", "n_val"])
        " (did you mean 'n_train'?)"

    Only a name of at most :data:`SHORT_REPR_LIMIT` characters is compared (a number or a long text
    is no typo of a name, and ``str()`` of a nested value read from a file can be enormous).
    """
    match = closest(name, valid)
    return f" (did you mean {prefix + match!r}?)" if match is not None else ""


def closest(name: object, valid: Iterable[object]) -> str | None:
    """The one of ``valid`` (as text) :func:`did_you_mean` would suggest for ``name``, else ``None``: for a caller that
    suggests something the match stands for (a moved option's new name).

    When nothing is close as written, case is ignored (``train.LR`` -> ``lr``, ``MAX_STEPS`` -> ``max_steps``: a name
    in capitals shares no letter with its lower-case spelling, so difflib alone suggested nothing).

    >>> closest("kl_cof", ["kl_coef", "alpha"]), closest("x", ["kl_coef"]), closest("LR", ["lr", "epochs"])
    ('kl_coef', None, 'lr')
    """
    if not isinstance(name, str | int | float) or len(str(name)) > SHORT_REPR_LIMIT:
        return None
    texts = [str(v) for v in valid]
    match = difflib.get_close_matches(str(name), texts, n=1, cutoff=0.6)
    if not match:  # the same, case ignored; of names equal but for case, the first
        folded = {t.casefold(): t for t in reversed(texts)}
        match = [folded[m] for m in difflib.get_close_matches(str(name).casefold(), list(folded), n=1, cutoff=0.6)]
    return match[0] if match else None


BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")
"""Unicode's bidirectional formatting characters (embeddings, overrides, isolates, their closers, the marks)."""
_EMBEDDINGS, _ISOLATES, _PDF, _PDI, _FSI = (
    "\u202a\u202b\u202d\u202e",
    "\u2066\u2067\u2068",
    "\u202c",
    "\u2069",
    "\u2068",
)


def bidi_isolated(text: str) -> str:
    """``text`` as a unit that cannot reorder what is printed after it: a user's string (a caption, an image id, a
    stage name) holding a right-to-left override would otherwise show the page's own text and numbers beside it
    reversed (``rank 12`` as ``21 knar``). A text holding any of :data:`BIDI_CONTROLS` is wrapped in FSI ... PDI
    (Unicode's isolate, ``<bdi>`` in plain text), its closers that match no opener of its own dropped and its
    openers left open closed; any other text is returned as it is.

    >>> bidi_isolated("mle") == "mle", bidi_isolated("7\\u202e") == "\\u20687\\u202e\\u202c\\u2069"
    (True, True)
    >>> bidi_isolated("\\u2069\\u202e") == "\\u2068\\u202e\\u202c\\u2069"  # its stray PDI would close the isolate
    True
    """
    if BIDI_CONTROLS.isdisjoint(text):
        return text
    out: list[str] = []
    open_: list[str] = []  # the closer each open embedding or isolate awaits, innermost last
    for c in text:
        if c in _EMBEDDINGS:
            open_.append(_PDF)
        elif c in _ISOLATES:
            open_.append(_PDI)
        elif c == _PDF:
            if not open_ or open_[-1] != _PDF:  # a PDF closes no embedding outside the innermost isolate (UAX #9)
                continue
            open_.pop()
        elif c == _PDI:
            if _PDI not in open_:
                continue
            while open_.pop() != _PDI:  # a PDI closes the embeddings opened inside its isolate too
                pass
        out.append(c)
    return _FSI + "".join(out) + "".join(reversed(open_)) + _PDI


def karpathy_tokens(caption: str) -> list[str]:
    """The ``tokens`` of ``caption`` in a Karpathy-format file (``dataset_coco.json``'s ``sentences[].tokens``,
    beside ``raw``): lower-cased, punctuation removed (ASCII ``string.punctuation`` and any Unicode punctuation),
    split on white space, the rule of Karpathy's neuraltalk preprocessing (``"A man with a red helmet on a small moped
    on a dirt road. "`` has the tokens ``["a", "man", ..., "dirt", "road"]``). Every Karpathy file finecap writes
    (the world, ``finecap boost``) makes its tokens here.

    >>> karpathy_tokens("A Red circle, left of the star.  It's big!")
    ['a', 'red', 'circle', 'left', 'of', 'the', 'star', 'its', 'big']
    """
    kept = "".join(
        c for c in caption.lower() if c not in string.punctuation and not unicodedata.category(c).startswith("P")
    )
    return kept.split()
