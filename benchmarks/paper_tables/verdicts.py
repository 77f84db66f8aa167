"""Verdicts: pure functions over the result files' numbers (the package docstring says the rules)."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from paired_difference import (  # benchmarks/ is on sys.path, as for every benchmark script
    mean_std,
    paired_bootstrap,
    t_interval,
)

from .schema import Column, Items, Results, Row, Table


def resolve_key(keys: Iterable[str], key: str) -> str:
    """``key``, with ``RD/`` standing for the RD-N key among ``keys`` (``RD99/`` in a full run; ``hardRD/`` for the
    hard RD-N, ``hardRD99/``)."""
    head, sep, tail = key.partition("RD/")
    if sep and (head in ("", "hard") or head.endswith(("/", "/hard"))):
        found = [k for k in keys if re.fullmatch(rf"{re.escape(head)}RD\d+/{re.escape(tail)}", k)]
        key = found[0] if found else key
    return key


def metric_value(metrics: dict[str, float], key: str) -> float | None:
    """``metrics[key]``, with ``RD/`` standing for the RD-N key the run has (``RD99/`` in a full run)."""
    key = resolve_key(metrics, key)
    value = metrics.get(key) if key else None  # an empty key: the column has no world analogue
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def world_values(results: Results, row: Row, column: Column) -> dict[int, float]:
    """``{seed: value}`` of a row's column (in the paper's unit) for the seeds whose run has it."""
    out = {}
    for seed, runs in results.items():
        if row.run is not None and row.run in runs:
            value = metric_value(runs[row.run], row.prefix + column.key)
            if value is not None:
                out[seed] = value * column.scale
    return out


def image_values(items: Items, seed: int, row: Row, column: Column) -> dict[str, float] | None:
    """``{image id: value}`` of a row's column on one seed (in the paper's unit), or None without per-image values."""
    per_key = items.get(seed, {}).get(row.run or "")
    if not per_key or not column.key:
        return None
    values = per_key.get(resolve_key(per_key, row.prefix + column.key))
    return None if values is None else {i: v * column.scale for i, v in values.items()}


def sign(x: float) -> int:
    return (x > 0) - (x < 0)


HOLDS, REVERSED, WITHIN, CHANGED = "holds", "reversed", "within noise", "changed"
SPREAD, MIXED, NO_ESTIMATE = "within the seeds' spread", "mixed", "no noise estimate"

DRAWS = 2_000
"""Bootstrap resamples per interval (seed 0: a page is the same every time it is made). 2,000 rather than
paired_difference's 10,000: a page judges hundreds of cells, each in about 0.03 s on 1,000 test images."""


@functools.lru_cache(maxsize=4096)
def bootstrap_interval(differences: tuple[float, ...]) -> tuple[float, float]:
    """The 95% paired-bootstrap interval of the mean of per-image ``differences``
    (:func:`paired_difference.paired_bootstrap`, :data:`DRAWS` resamples, seed 0)."""
    _, low, high = paired_bootstrap(differences, draws=DRAWS, seed=0)
    return low, high


def seed_spread(differences: Sequence[float]) -> tuple[float, float]:
    """The 95% Student-t interval of the mean of the seeds' differences (``n - 1`` degrees of freedom), n >= 2
    (:func:`paired_difference.t_interval`)."""
    return t_interval(differences)[1:]


def judge(paper_sign: int, low: float, high: float) -> str:
    """One noise estimate's outcome: an interval that excludes 0 with the paper's sign *holds*, with the opposite
    sign is *reversed*, covering 0 is *within noise*; for the paper's "no change" (``paper_sign`` 0) covering 0
    *holds* and excluding it is *changed*."""
    covers = low <= 0 <= high
    if paper_sign == 0:
        return HOLDS if covers else CHANGED
    if covers:
        return WITHIN
    return HOLDS if sign(low) == paper_sign else REVERSED


def fmt(value: float | None) -> str:
    if value is None:
        return "—"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def signed(value: float) -> str:
    """``value`` as :func:`fmt` writes it, with its sign (none when it rounds to 0)."""
    text = fmt(abs(value))
    return text if float(text) == 0 else ("+" if value > 0 else "-") + text


@dataclass
class Check:
    """One judged column of one row against one other row: the world difference (row - other, the paper's unit) on
    each seed both rows ran, and the 95% test-image interval of the seeds whose runs both have per-image values."""

    column: str
    against: str
    paper_sign: int  # the paper's effect (+1 / -1; 0 = the paper shows no change)
    differences: dict[int, float]  # seed -> world difference
    intervals: dict[int, tuple[float, float]]  # seed -> 95% paired-bootstrap interval over the test images

    @property
    def per_seed(self) -> list[str]:
        """The outcome of each seed with a test-image interval."""
        return [judge(self.paper_sign, *self.intervals[s]) for s in sorted(self.intervals)]

    @property
    def spread(self) -> tuple[float, float] | None:
        """The seeds' t-interval of the mean difference (two seeds or more)."""
        return seed_spread(list(self.differences.values())) if len(self.differences) >= 2 else None

    @property
    def verdict(self) -> str:
        """The cell's word (the package docstring's rule): every seed's test-image outcome when every seed has one
        (one word when they agree, *mixed* otherwise); else the seeds' interval alone (*within the seeds' spread*
        when it covers 0); else *no noise estimate*."""
        if self.intervals and len(self.intervals) == len(self.differences):
            outcomes = set(self.per_seed)
            return outcomes.pop() if len(outcomes) == 1 else MIXED
        spread = self.spread
        if spread is None:
            return NO_ESTIMATE
        word = judge(self.paper_sign, *spread)
        return SPREAD if word == WITHIN else word

    def text(self) -> str:
        arrow = {1: "↑", -1: "↓", 0: "="}[self.paper_sign]
        details = []
        if self.intervals:
            counts = {w: self.per_seed.count(w) for w in dict.fromkeys(self.per_seed)}
            details.append("per seed: " + ", ".join(f"{w} {c}" for w, c in counts.items()))
        diffs = [self.differences[s] for s in sorted(self.differences)]
        if len(diffs) >= 2:
            low, high = self.spread
            details.append(f"Δ {signed(mean_std(diffs)[0])} ± {fmt((high - low) / 2)}, {len(diffs)} seeds")
        elif self.intervals:
            low, high = next(iter(self.intervals.values()))
            details.append(f"Δ {signed(diffs[0])} [{signed(low)}, {signed(high)}]")
        else:
            details.append(f"Δ {signed(diffs[0])}")
        return f"{self.column} {arrow} {self.verdict} ({'; '.join(details)})"


def paper_effect(row: Row, other: Row, i: int, column: Column) -> int | None:
    """The paper's effect of ``row`` against ``other`` on column ``i``: +1 / -1, 0 for no change (a difference
    smaller than ``column.same``, or a stated 0), None when the paper gives neither numbers nor a sign."""
    if row.paper and other.paper and row.paper[i] is not None and other.paper[i] is not None:
        difference = row.paper[i] - other.paper[i]
        return 0 if abs(difference) < column.same else sign(difference)
    if row.expect and i < len(row.expect) and row.expect[i] is not None:
        return row.expect[i]
    return None


def row_checks(table: Table, row: Row, results: Results, items: Items | None = None) -> list[Check]:
    """The judged columns of ``row`` against each row of ``row.vs``, over the seeds where both rows were run."""
    by_id = {r.id: r for r in table.rows}
    items = items or {}
    checks = []
    for other_id in row.vs:
        other = by_id[other_id]
        for i, column in enumerate(table.columns):
            paper_sign = paper_effect(row, other, i, column)
            if paper_sign is None:
                continue
            label = column.label + (f" vs {other.label}" if len(row.vs) > 1 else "")
            check = pair_check(label, row, other, column, paper_sign, results, items)
            if check is not None:
                checks.append(check)
    return checks


def pair_check(label: str, row: Row, other: Row, column: Column, paper_sign: int, results: Results,
               items: Items) -> Check | None:  # fmt: skip
    """The :class:`Check` of ``row`` against ``other`` on ``column`` over the seeds where both ran (None: no such
    seed), with each seed's test-image interval where both runs have per-image values for the same images."""
    mine, theirs = world_values(results, row, column), world_values(results, other, column)
    seeds = sorted(set(mine) & set(theirs))
    if not seeds:
        return None
    intervals = {}
    for s in seeds:
        a, b = image_values(items, s, row, column), image_values(items, s, other, column)
        if a and b and a.keys() == b.keys():
            intervals[s] = bootstrap_interval(tuple(a[k] - b[k] for k in sorted(a)))
    return Check(label, other.id, paper_sign, {s: mine[s] - theirs[s] for s in seeds}, intervals)


def row_verdict(table: Table, row: Row, results: Results, items: Items | None = None) -> str:
    """The verdict cell of a row (module docstring)."""
    if not table.runnable:
        return "not run yet"
    if row.run is None:
        return f"not comparable: {row.why}"
    if not any(row.run in runs for runs in results.values()):
        return "not run yet"
    if not row.vs:
        return "reference" if any(r.vs and row.id in r.vs for r in table.rows) else "—"
    by_id = {r.id: r for r in table.rows}
    missing = [v for v in row.vs if by_id[v].run is None or not any(by_id[v].run in rs for rs in results.values())]
    checks = row_checks(table, row, results, items)
    if not checks:
        if missing:
            return "not judged: " + ", ".join(by_id[v].label for v in missing) + " not run"
        return "no paper effect to judge"
    words = {c.verdict for c in checks}
    if words == {HOLDS}:
        word = "holds"
    elif HOLDS in words:
        word = "partly holds"
    elif words == {REVERSED}:
        word = "reversed"
    elif words & {REVERSED, CHANGED}:
        word = "does not hold"
    elif words <= {WITHIN, SPREAD}:
        word = "within noise"
    elif words == {NO_ESTIMATE}:
        word = "no noise estimate"
    else:
        word = "undecided"  # within noise, mixed or without a noise estimate, column by column
    return f"{word}: " + ", ".join(c.text() for c in checks)


def best_verdict(table: Table, results: Results, items: Items | None = None) -> str | None:
    """Whether the paper's chosen row of a grid is the world's best on the chosen column: by the mean over seeds, and
    against the noise (the chosen row judged against every other row with :class:`Check`'s rule, the paper's sign
    being "better"): *best beyond noise* when it beats every row, *another row is better beyond noise* when one beats
    it, *within noise* of the rows it neither beats nor loses to otherwise."""
    best = table.best
    if best is None:
        return None
    index = [c.label for c in table.columns].index(best.column)
    column = table.columns[index]
    means = {r.id: mean_std(list(v.values()))[0] for r in table.rows if (v := world_values(results, r, column))}
    chosen = next(r for r in table.rows if r.id == best.chosen)
    head = f"The paper's choice: {chosen.label.removesuffix(' (chosen)')}" + (f" ({best.basis})" if best.basis else "")
    head += ". "
    if len(means) < len([r for r in table.rows if r.run]):
        return head + "World: not every row has run yet."
    pick = (max if best.higher else min)(means, key=means.get)
    winner = next(r for r in table.rows if r.id == pick)
    seeds = len({s for s, runs in results.items() if any(r.run in runs for r in table.rows)})
    word = "holds" if pick == best.chosen else "does not hold"
    checks = [
        c
        for r in table.rows
        if r.run and r.id != chosen.id
        if (c := pair_check(r.label, chosen, r, column, 1 if best.higher else -1, results, items or {}))
    ]
    words = [c.verdict for c in checks]
    if words and all(w == HOLDS for w in words):
        noise = "best beyond noise"
    elif REVERSED in words:
        noise = "another row is better beyond noise: " + ", ".join(c.column for c in checks if c.verdict == REVERSED)
    else:
        noise = "within noise of " + ", ".join(f"{c.column} ({c.verdict})" for c in checks if c.verdict != HOLDS)
    return (f"{head}World: the best {best.column} (mean over {seeds} seed(s)) is {winner.label} "
            f"({means[pick]:.2f}): {word} by the mean; against the noise: {noise}.")  # fmt: skip
