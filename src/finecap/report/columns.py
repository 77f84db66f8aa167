"""What a results column means for display: which direction is better, and whether it counts things.

The one place that says so (:data:`COLUMNS`): the HTML report colours cells and differences by it, and every table
(HTML, ``results.md``) prints numbers with :func:`format_value`. A column is matched by ``fnmatch`` patterns, the
first match wins, so ``sample/mBLEU-4`` (lower is better: the captions of one image are less alike) is caught
before the ``*BLEU-*`` rule. A column no pattern matches has no direction and is never coloured.

Directions: ``"higher"`` or ``"lower"`` is better, or None where neither is (caption length, facts stated per
caption, counts of captions). Counts (``bag3/n``, ``Vocab usage``, ``faith/hallucinated``) print as integers: the
metrics return them as floats (``54.0``), which would otherwise print as ``54.000``.

Example::

    >>> direction("faith/halluc_rate"), direction("listener/RD19/R@1"), direction("Length")
    ('lower', 'higher', None)
    >>> format_value(54.0, "Vocab usage"), format_value(0.5, "RD19/R@1"), format_value(7, "x"), format_value(None)
    ('54', '0.500', '7', '-')
    >>> better(0.1, 0.3, "faith/halluc_rate"), better(0.3, 0.3004, "CIDEr-D"), better(9.0, 8.0, "Length")
    (True, None, None)
"""

from __future__ import annotations

import fnmatch
import functools
from dataclasses import dataclass
from typing import Literal

Direction = Literal["higher", "lower"]


@dataclass(frozen=True)
class Column:
    """Results columns matching ``pattern``: which direction is better (None: neither) and whether they count."""

    pattern: str
    better: Direction | None
    count: bool = False


COLUMNS: tuple[Column, ...] = (
    # lower is better
    Column("*mBLEU-*", "lower"),  # self-BLEU among an image's captions: lower = more diverse
    Column("*halluc_rate", "lower"),
    Column("*hallucinated", "lower", count=True),
    Column("*halluc/*", "lower", count=True),
    Column("*false facts", "lower"),
    Column("*mean_rank", "lower"),
    Column("*median_rank", "lower"),
    Column("*tie_rate", "lower"),  # the listener cannot tell the target from a distractor
    Column("*exploit", "lower"),  # the retriever is right where the facts do not say so
    Column("perplexity/tokens", None, count=True),
    Column("perplexity/truncated", None, count=True),
    Column("*perplexity*", "lower"),
    Column("*loss*", "lower"),
    # no better direction
    Column("*/n", None, count=True),  # captions counted (bag3/n)
    Column("*/bags", None, count=True),  # TrueMatch bags kept (bag3/bags)
    Column("*/curated", None, count=True),  # ... and curated before the filter (bags.keep_hardest)
    Column("*/alpha*", None),  # mean intra-bag similarity: how hard the bags are, not how good a captioner is
    Column("family/size", None, count=True),
    Column("*Length", None),
    Column("faith/facts", None),
    # higher is better
    Column("*true facts", "higher"),
    Column("*R@*", "higher"),
    Column("*BLEU-*", "higher"),
    Column("Bleu_*", "higher"),
    Column("*CIDEr*", "higher"),
    Column("*ROUGE*", "higher"),
    Column("*METEOR*", "higher"),
    Column("*SPICE*", "higher"),
    Column("*CLIPScore*", "higher"),
    Column("*ClipSc*", "higher"),
    Column("*precision*", "higher"),
    Column("*recall*", "higher"),
    Column("*Div-*", "higher"),
    Column("*Lexical diversity", "higher", count=True),
    Column("*Vocab usage", "higher", count=True),
    Column("*acc", "higher"),
    Column("*accuracy", "higher"),
    Column("*reward*", "higher"),
)
"""Every results column the toolkit writes, by pattern (first match wins)."""

DECIMALS = 3
"""Decimals of non-integer numbers in every table."""


@functools.lru_cache(maxsize=4096)
def column_info(column: str) -> Column | None:
    """The first entry of :data:`COLUMNS` matching ``column``, or None."""
    return next((c for c in COLUMNS if fnmatch.fnmatchcase(column, c.pattern)), None)


def direction(column: str) -> Direction | None:
    """``"higher"`` or ``"lower"`` when that is better for ``column``, None when neither is or it is unknown."""
    info = column_info(column)
    return info.better if info is not None else None


def is_count(column: str) -> bool:
    info = column_info(column)
    return info is not None and info.count


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def format_value(value: object, column: str | None = None) -> str:
    """A table cell: integers (and whole values of count columns) without decimals, other numbers with
    :data:`DECIMALS`, None as ``-``."""
    if value is None:
        return "-"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if column is not None and is_count(column) and value.is_integer():
            return str(int(value))
        return f"{value:.{DECIMALS}f}"
    return str(value)


def format_difference(new: float, old: float, column: str) -> str:
    """``new - old`` with a sign, as the cells print (``+12`` for counts, ``-0.158``; ``±0`` / ``±0.000`` when equal
    at that precision)."""
    diff = float(new) - float(old)
    if is_count(column) and float(new).is_integer() and float(old).is_integer():
        return f"{int(diff):+d}" if diff else "±0"
    text = f"{diff:+.{DECIMALS}f}"
    return "±" + text[1:] if float(text) == 0 else text


def better(new: object, old: object, column: str) -> bool | None:
    """Whether ``new`` is better than ``old`` by the column's direction; None when the column has no direction,
    either is not a number, or they are equal at the precision shown."""
    side = direction(column)
    if side is None or not _number(new) or not _number(old):
        return None
    if format_value(float(new), column) == format_value(float(old), column):
        return None
    return (float(new) > float(old)) == (side == "higher")
