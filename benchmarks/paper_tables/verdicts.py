"""Verdicts: pure functions over the result files' numbers (the package docstring says the rules)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from .schema import Column, Results, Row, Table


def metric_value(metrics: dict[str, float], key: str) -> float | None:
    """``metrics[key]``, with ``RD/`` standing for the RD-N key the run has (``RD99/`` in a full run)."""
    if key.startswith("RD/") or "/RD/" in key:
        head, _, tail = key.partition("RD/")
        found = [k for k in metrics if re.fullmatch(rf"{re.escape(head)}RD\d+/{re.escape(tail)}", k)]
        key = found[0] if found else key
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


def sign(x: float) -> int:
    return (x > 0) - (x < 0)


@dataclass
class Check:
    """One judged column of one row against one other row."""

    column: str
    against: str
    paper_sign: int  # the paper's effect (+1 / -1; 0 = the paper shows no change)
    agree: int  # seeds whose world effect has the paper's sign
    seeds: int  # seeds with both rows run
    ties: int = 0  # seeds whose world values are equal (no world effect either way)

    def text(self) -> str:
        if self.paper_sign == 0:
            return f"{self.column} = (paper: no change; not judged)"
        arrow = "↑" if self.paper_sign > 0 else "↓"
        return f"{self.column} {arrow} {self.agree}/{self.seeds}" + (f" ({self.ties} tied)" if self.ties else "")


def row_checks(table: Table, row: Row, results: Results) -> list[Check]:
    """The judged columns of ``row`` against each row of ``row.vs``, over the seeds where both rows were run."""
    by_id = {r.id: r for r in table.rows}
    checks = []
    for other_id in row.vs:
        other = by_id[other_id]
        for i, column in enumerate(table.columns):
            if row.paper and other.paper and row.paper[i] is not None and other.paper[i] is not None:
                paper_sign = sign(row.paper[i] - other.paper[i])
            elif row.expect and i < len(row.expect) and row.expect[i] is not None:
                paper_sign = row.expect[i]
            else:
                continue
            mine, theirs = world_values(results, row, column), world_values(results, other, column)
            seeds = sorted(set(mine) & set(theirs))
            if not seeds:
                continue
            world = [sign(mine[s] - theirs[s]) for s in seeds]
            agree = sum(w == paper_sign for w in world) if paper_sign else 0
            label = column.label + (f" vs {other.label}" if len(row.vs) > 1 else "")
            checks.append(Check(label, other_id, paper_sign, agree, len(seeds), ties=world.count(0)))
    return checks


def row_verdict(table: Table, row: Row, results: Results) -> str:
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
    checks = row_checks(table, row, results)
    judged = [c for c in checks if c.paper_sign != 0]
    if not judged:
        if missing:
            return "not judged: " + ", ".join(by_id[v].label for v in missing) + " not run"
        return "no paper effect to judge" + ("" if not checks else ": " + "; ".join(c.text() for c in checks))
    if all(c.agree == c.seeds for c in judged):
        word = "holds"
    elif all(c.ties == c.seeds for c in judged):
        word = "no world difference"
    elif all(c.agree == 0 for c in judged):
        word = "does not hold"
    else:
        word = "partly holds"
    return f"{word}: " + ", ".join(c.text() for c in checks)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    m = sum(values) / len(values)
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return m, s


def best_verdict(table: Table, results: Results) -> str | None:
    """Whether the paper's chosen row of a grid is the world's best on the chosen column (mean over seeds)."""
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
    return (f"{head}World: the best {best.column} (mean over {seeds} seed(s)) is {winner.label} "
            f"({means[pick]:.2f}): {word}.")  # fmt: skip
