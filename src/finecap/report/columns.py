"""What a results column means for display: which direction is better, and whether it counts things.

The metric groups' records say it for the columns they write (:class:`finecap.metrics.group.Column` in each
:class:`~finecap.metrics.group.MetricGroup`); :data:`OTHER_COLUMNS` says it for the columns no metric group writes
(training logs, the demo's tables, TrueMatch bag curation). :func:`column_rules` puts them in one
:class:`ColumnRules`: the HTML report colours cells and differences by it, and every table (HTML, ``results.md``,
``finecap eval``) prints numbers with :func:`format_value`. A column is matched by ``fnmatch`` patterns, the first
match wins: a user's own groups (``eval.metrics`` by dotted path) first, then the built-in patterns with those
saying lower-is-better or no direction before the broad higher-is-better ones, so ``sample/mBLEU-4`` (lower is
better: the captions of one image are less alike) is caught before the ``*BLEU-*`` rule. A column no pattern matches
has no direction and is never coloured.

Directions: ``"higher"`` or ``"lower"`` is better, or None where neither is (caption length, facts stated per
caption, counts of captions). Counts (``bag3/n``, ``Vocab usage``, ``faith/hallucinated``) print as integers: the
metrics return them as floats (``54.0``), which would otherwise print as ``54.000``. The functions take ``rules``
(default: the built-in groups' and :data:`OTHER_COLUMNS`).

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
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from finecap.metrics.group import Column, Direction, MetricGroup, metric_group
from finecap.registry import METRIC_GROUPS, is_dotted_path

__all__ = ["Column", "ColumnRules", "Direction", "OTHER_COLUMNS", "column_rules", "rules_for"]

log = logging.getLogger(__name__)

OTHER_COLUMNS: tuple[Column, ...] = (
    Column("*false facts", "lower"),  # the demo's VCB tables: facts stated per caption
    Column("*true facts", "higher"),
    Column("*loss*", "lower"),  # training logs
    Column("*reward*/truncated", None),  # the share of captions longer than the retriever's text window
    Column("*reward*/chunked", None),
    Column("*reward*", "higher"),
    Column("*acc", "higher"),
    Column("*accuracy", "higher"),
    Column("*/bags", None, count=True),  # TrueMatch bags kept (bag3/bags)
    Column("*/curated", None, count=True),  # ... and curated before the filter (bags.keep_hardest)
    Column("*/alpha*", None),  # mean intra-bag similarity: how hard the bags are, not how good a captioner is
    Column("family/size", None, count=True),
    Column("family/truncated", None, count=True),  # captions longer than the retriever's text window
    Column("family/chunked", None, count=True),
)
"""The results columns the toolkit writes that no metric group does, by pattern."""


@dataclass(frozen=True)
class ColumnRules:
    """Column patterns in the order they are tried (the first match wins)."""

    columns: tuple[Column, ...]
    _found: dict[str, Column | None] = field(default_factory=dict, compare=False, repr=False)

    def info(self, column: str) -> Column | None:
        """The first entry matching ``column``, or None."""
        if column not in self._found:
            self._found[column] = next((c for c in self.columns if fnmatch.fnmatchcase(column, c.pattern)), None)
        return self._found[column]


def column_rules(groups: Iterable[MetricGroup] = ()) -> ColumnRules:
    """The columns of ``groups`` (a user's own, tried first, in their order), then those of the built-in groups
    (:data:`finecap.registry.METRIC_GROUPS`) and :data:`OTHER_COLUMNS`, the ones not higher-is-better before the
    others (module docstring)."""
    own = [c for g in groups for c in g.columns]
    builtin = [c for name in METRIC_GROUPS for c in metric_group(name, "METRIC_GROUPS").columns] + list(OTHER_COLUMNS)
    exceptions_first = sorted(dict.fromkeys(builtin), key=lambda c: c.better == "higher")  # stable: order kept
    return ColumnRules(tuple(dict.fromkeys(own + exceptions_first)))


@functools.cache
def _builtin() -> ColumnRules:
    return column_rules()


def rules_for(metrics: Iterable[str]) -> ColumnRules:
    """The rules for results of the metric groups ``metrics`` (``eval.metrics``; names or dotted paths): the built-in
    ones with those of the user's own groups. A dotted path that does not import is logged and left out: its
    columns are then shown without a direction."""
    groups = []
    for name in metrics:
        if is_dotted_path(name):
            try:
                groups.append(metric_group(name))
            except ValueError as e:
                log.warning("%s; its columns are shown without a direction", e)
    return column_rules(groups) if groups else _builtin()


DECIMALS = 3
"""Decimals of non-integer numbers in every table."""


def column_info(column: str, rules: ColumnRules | None = None) -> Column | None:
    """The first column pattern of ``rules`` matching ``column``, or None."""
    return (rules or _builtin()).info(column)


def direction(column: str, rules: ColumnRules | None = None) -> Direction | None:
    """``"higher"`` or ``"lower"`` when that is better for ``column``, None when neither is or it is unknown."""
    info = column_info(column, rules)
    return info.better if info is not None else None


def is_count(column: str, rules: ColumnRules | None = None) -> bool:
    info = column_info(column, rules)
    return info is not None and info.count


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def finite_number(value: object) -> bool:
    """Whether ``value`` is a finite number (not a bool): what a table ranks, a headline compares and a plot draws.
    A results file finecap wrote holds a NaN or infinite metric as ``null`` (:func:`finecap.utils.files.strict_json`):
    never a number.

    >>> finite_number(0.5), finite_number(None), finite_number(float("nan")), finite_number(True)
    (True, False, False, False)
    """
    return _number(value) and math.isfinite(value)  # type: ignore[arg-type]


def format_value(value: object, column: str | None = None, rules: ColumnRules | None = None) -> str:
    """A table cell: integers (and whole values of count columns) without decimals, other numbers with
    :data:`DECIMALS`, None as ``-``."""
    if value is None:
        return "-"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if column is not None and is_count(column, rules) and value.is_integer():
            return str(int(value))
        return f"{value:.{DECIMALS}f}"
    return str(value)


def format_difference(new: float, old: float, column: str, rules: ColumnRules | None = None) -> str:
    """``new - old`` with a sign, as the cells print (``+12`` for counts, ``-0.158``; ``±0`` / ``±0.000`` when equal
    at that precision), of the two values as they are printed beside it: a reader who subtracts the printed numbers
    gets the printed difference, and it is ``±0.000`` exactly when :func:`better` calls them equal.

    >>> format_difference(0.3606, 0.1904, "CIDEr-D"), format_difference(0.8804, 0.8795, "sample/Div-2")
    ('+0.171', '+0.001')
    """
    if is_count(column, rules) and float(new).is_integer() and float(old).is_integer():
        diff = float(new) - float(old)
        return f"{int(diff):+d}" if diff else "±0"
    shown = [float(f"{float(v):.{DECIMALS}f}") for v in (new, old)]  # the values as the cells print them
    text = f"{shown[0] - shown[1]:+.{DECIMALS}f}"
    return "±" + text[1:] if float(text) == 0 else text


def better(new: object, old: object, column: str, rules: ColumnRules | None = None) -> bool | None:
    """Whether ``new`` is better than ``old`` by the column's direction; None when the column has no direction,
    either is not a finite number (NaN, inf: a diverged run is neither better nor worse), or they are equal at the
    precision shown."""
    side = direction(column, rules)
    if side is None or not _number(new) or not _number(old):
        return None
    if not math.isfinite(float(new)) or not math.isfinite(float(old)):
        return None
    if format_value(float(new), column, rules) == format_value(float(old), column, rules):
        return None
    return (float(new) > float(old)) == (side == "higher")
