"""A metric group's one record (:class:`MetricGroup`): how it computes, what it reads, the columns it writes and
which way each is better.

Everything that needs a fact about a group reads its record: :func:`finecap.metrics.suite.evaluate` calls
``compute``; ``finecap eval`` says why a group cannot run from ``reads`` and ``unavailable``; the report colours
a column by its :class:`Column`'s direction (:mod:`finecap.report.columns`). The built-in groups' records are in
:mod:`finecap.metrics.groups`, named in :data:`finecap.registry.METRIC_GROUPS`; a user's own group is a record
given by dotted path (``eval.metrics=[my_pkg.metrics:GROUP]``, ``finecap eval --metrics bleu,my_pkg.metrics:GROUP``),
found with :func:`metric_group`.

Example (a built-in record, and a group of one's own that counts the words of each caption)::

    >>> bleu = metric_group("bleu")
    >>> sorted(bleu.reads), [(c.pattern, c.better) for c in bleu.columns]
    (['references'], [('*BLEU-*', 'higher'), ('Bleu_*', 'higher')])
    >>> def words(ctx):
    ...     return {"words": sum(len(c.split()) for c in ctx.predictions.values()) / len(ctx.predictions)}
    >>> WORDS = MetricGroup("words", words, columns=(Column("words", None),))
    >>> MetricGroup("bad", words, reads={"pictures"})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: metric group 'bad': unknown input(s) ['pictures']; valid: references, images, world, samples, bags, ...
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from finecap.registry import METRIC_GROUPS, lookup

if TYPE_CHECKING:
    from finecap.config import Config
    from finecap.metrics.context import EvalContext

Direction = Literal["higher", "lower"]
"""Which value of a column is better."""

Input = Literal["references", "images", "world", "samples", "bags", "lm", "instances"]
"""What a group reads besides the captions: reference captions, image files (through the retriever), the world's
scene graphs, several sampled captions per image, TrueMatch bags, a causal language model (``eval.lm``), COCO
instance annotations (``--instances`` / ``eval.instances``)."""
INPUTS: tuple[str, ...] = get_args(Input)


@dataclass(frozen=True)
class Column:
    """Results columns matching the ``fnmatch`` pattern ``pattern``: which direction is better (None: neither, as
    for a caption length or a count of captions) and whether they count things (printed as integers)."""

    pattern: str
    better: Direction | None
    count: bool = False

    def __post_init__(self) -> None:
        if self.better not in (*get_args(Direction), None):
            raise ValueError(f"Column {self.pattern!r}: better must be 'higher', 'lower' or None, got {self.better!r}")


@dataclass(frozen=True)
class MetricGroup:
    """One metric group: its ``name`` (in messages), ``compute(ctx) -> {column: value}`` over an
    :class:`~finecap.metrics.context.EvalContext` (per-image values go to ``ctx.add_items``), what it ``reads``
    (:data:`Input`), the ``columns`` it writes with their direction, its per-image keys whose mean is not the corpus
    value (``not_image_means``), and ``unavailable(cfg)``: why it cannot run on this machine (a missing Java or data
    file), or None."""

    name: str
    compute: Callable[[EvalContext], Mapping[str, float]]
    reads: frozenset[str] = frozenset()
    columns: tuple[Column, ...] = ()
    not_image_means: tuple[str, ...] = ()
    unavailable: Callable[[Config], str | None] | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.reads) - set(INPUTS))
        if unknown:
            raise ValueError(f"metric group {self.name!r}: unknown input(s) {unknown}; valid: {', '.join(INPUTS)}")
        if not all(isinstance(c, Column) for c in self.columns):
            raise TypeError(f"metric group {self.name!r}: columns must be Column records")
        object.__setattr__(self, "reads", frozenset(self.reads))


def metric_group(name: str, option: str = "eval.metrics") -> MetricGroup:
    """The group registered as ``name`` (:data:`finecap.registry.METRIC_GROUPS`) or the :class:`MetricGroup` at the
    dotted path ``name`` (``"pkg.module:GROUP"``); errors are ``ValueError`` naming ``option``."""
    group = lookup(name, METRIC_GROUPS, option, "metric group")
    if not isinstance(group, MetricGroup):
        raise ValueError(
            f"{option}: {name!r} is a {type(group).__name__}, not a MetricGroup (finecap.metrics.group.MetricGroup)"
        )
    return group
