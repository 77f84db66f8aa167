"""Verdicts: pure functions over the result files' numbers (the package docstring says the rules)."""

from __future__ import annotations

import functools
import math
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from paired_difference import (  # benchmarks/ is on sys.path, as for every benchmark script
    mean_std,
    paired_bootstrap,
    t_975,
    t_interval,
)

from .runs import RUNS
from .schema import Column, Items, Paper, Results, Row, Table, replicate_key


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
    """``{seed: value}`` of a row's column (in the paper's unit) for the seeds whose run has it (the grid's own run
    of each world seed, run seed = world seed)."""
    out = {}
    for seed, runs in results.items():
        if row.run is not None and row.run in runs:
            value = metric_value(runs[row.run], row.prefix + column.key)
            if value is not None:
                out[seed] = value * column.scale
    return out


def run_image_values(items: Items, seed: int, run: str, key: str, scale: float) -> dict[str, float] | None:
    """``{image id: value}`` of metric ``key`` (resolved as :func:`resolve_key`) of one run (a key of
    :data:`Results`, replicates included) on one seed, times ``scale``; None without per-image values."""
    per_key = items.get(seed, {}).get(run)
    if not per_key or not key:
        return None
    values = per_key.get(resolve_key(per_key, key))
    return None if values is None else {i: v * scale for i, v in values.items()}


def image_values(items: Items, seed: int, row: Row, column: Column) -> dict[str, float] | None:
    """``{image id: value}`` of a row's column on one seed (in the paper's unit), or None without per-image values."""
    if not column.key:
        return None
    return run_image_values(items, seed, row.run or "", row.prefix + column.key, column.scale)


def sign(x: float) -> int:
    return (x > 0) - (x < 0)


HOLDS, REVERSED, WITHIN, CHANGED = "holds", "reversed", "within noise", "changed"
SPREAD, MIXED, NO_ESTIMATE = "within the seeds' spread", "mixed", "no noise estimate"

DRAWS = 2_000
"""Bootstrap resamples per interval (seed 0: a page is the same every time it is made). 2,000 rather than
paired_difference's 10,000: a page judges hundreds of cells, each in about 0.03 s on 1,000 test images."""

MIN_RUNS = 3
"""Run seeds per world seed from which a cell's interval holds retraining noise (:func:`run_seed_interval`); with
fewer, its per-seed interval is the test split's alone."""

RUN_TO_TEST_NOISE = (1.8, 9.7)
"""How much larger retraining noise is than a one-run cell's test-split noise, as measured: the run-to-run standard
deviation of SLE − SCST within a world seed (the 12 pairs of docs/results.md, "Training noise: SLE against SCST in 12
runs", as committed in benchmarks/results/effects/ and its run_seeds/: beam CIDEr-D 0.037-0.131 over four run seeds on
each of three worlds, sampled Div-2 0.014-0.029, run seed 0's Div-2 being the issue-35 re-run's, which the page's
table predates) over the standard error of the same difference over the 1,000 test images of one run (the
exploration grid's per-image values: CIDEr-D 0.0135 and 0.0201, Div-2 0.0033 and 0.0032), the smallest spread over
the largest error to the largest over the smallest: 1.8-9.7 times for CIDEr-D, 4.1-9.0 for Div-2
(tests/benchmarks/test_quoted_results.py recomputes them from those files). Used for the chance rates of the page's
multiplicity note (:func:`chance_note`)."""


def zero_width(low: float, high: float) -> bool:
    """Whether an interval has no width (up to rounding): no noise was measured, so it decides nothing."""
    return high - low <= 1e-12 * max(1.0, abs(low), abs(high))


@functools.lru_cache(maxsize=4096)
def bootstrap_interval(differences: tuple[float, ...]) -> tuple[float, float] | None:
    """The 95% paired-bootstrap interval of the mean of per-image ``differences``
    (:func:`paired_difference.paired_bootstrap`, :data:`DRAWS` resamples, seed 0); None when it has no width (every
    image's difference alike: no noise measured)."""
    _, low, high = paired_bootstrap(differences, draws=DRAWS, seed=0)
    return None if zero_width(low, high) else (low, high)


def seed_spread(differences: Sequence[float]) -> tuple[float, float] | None:
    """The 95% Student-t interval of the mean of the seeds' differences (``n - 1`` degrees of freedom,
    :func:`paired_difference.t_interval`); None with fewer than two seeds or when the seeds' differences are alike
    (a zero-width interval: an integer count that moved equally on both seeds measures no noise)."""
    if len(differences) < 2:
        return None
    _, low, high = t_interval(differences)
    return None if zero_width(low, high) else (low, high)


def t_quantile(df: int) -> float:
    """Student's t 97.5% quantile for ``df`` degrees of freedom (:func:`paired_difference.t_975`)."""
    return t_975(df)


def run_seed_interval(per_run: Sequence[float], per_image: Sequence[Sequence[float]] | None = None
                      ) -> tuple[float, float, float] | None:  # fmt: skip
    """One world seed's difference over ``R >= MIN_RUNS`` run seeds and its 95% interval over both levels, run seeds
    and test images: a random-effects t interval, ``mean ± t(0.975, R - 1)·√(s²/R + v/n)``, where ``s`` is the
    standard deviation of the runs' differences ``per_run`` and ``v/n`` the variance of the mean over the ``n`` test
    images of the runs' mean per-image difference (``per_image``: one sequence per run, the same images in the same
    order; None when the runs' per-image values are not on common images: ``s`` alone, whose runs then saw other
    images). The test images are the same for every run of a world seed, so their noise is shared by the runs and
    ``s`` cannot see it; ``v/n`` adds it (and counts the runs' image-by-run noise a second time, on the safe side).
    A random-effects t rather than a two-level bootstrap: with three run seeds a bootstrap over them draws from ten
    distinct multisets and its percentile interval is too narrow; the t quantile with ``R - 1`` degrees of freedom
    (4.30 for three) widens it for the few runs. Returns (mean, low, high), or None when the interval has no width.

    >>> [round(x, 4) for x in run_seed_interval([1.0, 2.0, 3.0])]  # s = 1: 2 ± 4.303/√3
    [2.0, -0.4843, 4.4843]
    """
    runs = len(per_run)
    if runs < 2:
        return None
    mean, sd = mean_std(per_run)
    variance = sd**2 / runs
    if per_image is not None:
        images = [statistics.fmean(values) for values in zip(*per_image, strict=True)]
        if len(images) > 1:
            variance += statistics.variance(images) / len(images)
    half = t_quantile(runs - 1) * math.sqrt(variance)
    low, high = mean - half, mean + half
    return None if zero_width(low, high) else (mean, low, high)


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


def fmt_width(value: float) -> str:
    """A spread or half-width as :func:`fmt` writes it, but never a non-zero one as ``0.000`` (below 0.001: two
    significant digits) and 0 as ``0``.

    >>> fmt_width(0.0), fmt_width(0.000068), fmt_width(0.0042), fmt_width(12.3)
    ('0', '0.000068', '0.004', '12.3')
    """
    if value == 0:
        return "0"
    if abs(value) < 0.001:
        return f"{value:.{1 - math.floor(math.log10(abs(value)))}f}"
    return fmt(value)


def signed(value: float) -> str:
    """``value`` as :func:`fmt` writes it, with its sign (none when it rounds to 0)."""
    text = fmt(abs(value))
    return text if float(text) == 0 else ("+" if value > 0 else "-") + text


@dataclass
class Check:
    """One judged column of one row against one other row: the world difference (row - other, the paper's unit) on
    each seed both rows ran, and each seed's 95% interval: over the test images (one run), or over run seeds and test
    images (a primary cell with :data:`MIN_RUNS` run seeds or more on that seed, :func:`run_seed_interval`)."""

    column: str
    against: str
    paper_sign: int  # the paper's effect (+1 / -1; 0 = the paper shows no change)
    differences: dict[int, float]  # seed -> world difference (the mean over its run seeds; at matched length, over
    # the images whose two captions are equally long)
    intervals: dict[int, tuple[float, float]]  # seed -> 95% interval (zero-width ones left out: no noise measured)
    runs: dict[int, int] = field(default_factory=dict)  # seed -> run seeds behind its difference (default 1)
    primary: bool = False  # the table's declared headline comparison (:class:`.schema.Primary`)
    saturated: bool = False  # a row's mean above the column's ceiling: printed, not in the row's word
    matched: dict[int, int] = field(default_factory=dict)  # seed -> equal-length images (length-matched cells)
    every_image: dict[int, float] = field(default_factory=dict)  # seed -> the difference over all test images
    unjudged: str = ""  # why the cell is printed but not judged (:data:`OTHER_REFERENCES`); "" = judged

    @property
    def per_seed(self) -> list[str]:
        """The outcome of each seed with an interval."""
        return [judge(self.paper_sign, *self.intervals[s]) for s in sorted(self.intervals)]

    @property
    def spread(self) -> tuple[float, float] | None:
        """The seeds' t-interval of the mean difference (two seeds or more, and some spread between them)."""
        return seed_spread(list(self.differences.values()))

    @property
    def retrained(self) -> bool:
        """Whether every seed's difference is over :data:`MIN_RUNS` run seeds or more (its interval, when it has one,
        then holds retraining noise)."""
        return bool(self.differences) and all(self.runs.get(s, 1) >= MIN_RUNS for s in self.differences)

    @property
    def verdict(self) -> str:
        """The cell's word (the package docstring's rule): every seed's own outcome when every seed has an interval
        (one word when they agree, *mixed* otherwise); else the seeds' interval alone (*within the seeds' spread*
        when it covers 0); else *no noise estimate* (one seed without an interval, or intervals of zero width). A
        cell that is not judged says why (:attr:`unjudged`)."""
        if self.unjudged:
            return self.unjudged
        if self.intervals and len(self.intervals) == len(self.differences):
            outcomes = set(self.per_seed)
            return outcomes.pop() if len(outcomes) == 1 else MIXED
        spread = self.spread
        if spread is None:
            return NO_ESTIMATE
        word = judge(self.paper_sign, *spread)
        return SPREAD if word == WITHIN else word

    @property
    def opposite(self) -> bool:
        """A *mixed* cell whose seeds are each beyond noise, in opposite directions."""
        return {HOLDS, REVERSED} <= set(self.per_seed) or {HOLDS, CHANGED} <= set(self.per_seed)

    @property
    def noise(self) -> str:
        """What the cell's noise estimate is made of: run seeds and test images (:data:`MIN_RUNS` run seeds or more
        on every world seed), the test split alone (fewer run seeds: the grid's own run), each world seed's own of
        the two while the run seeds are complete on some world seeds only, or the world seeds' spread (no per-seed
        interval)."""
        seeds = sorted(self.differences)
        counts = [self.runs.get(s, 1) for s in seeds]
        if self.retrained:
            runs = f"{min(counts)}" if min(counts) == max(counts) else f"{min(counts)}-{max(counts)}"
            return f"{runs} run seeds per world seed: retraining and test-split noise"
        if set(counts) != {1}:
            head = f"run seeds per world seed {', '.join(map(str, counts))} (fewer than {MIN_RUNS} somewhere)"
            over = [s for s, n in zip(seeds, counts) if n >= MIN_RUNS]
            if not over:
                return f"{head}: the grid's own run, test-split noise only"
            own = [s for s, n in zip(seeds, counts) if n < MIN_RUNS]  # each world seed's interval is its own
            return (
                f"{head}: world seed {', '.join(map(str, over))} over its run seeds (retraining and test-split "
                f"noise), world seed {', '.join(map(str, own))} the grid's own run (test-split noise only)"
            )
        return "one run: test-split noise only" if self.intervals else "one run per world seed"

    def text(self) -> str:
        arrow = {1: "↑", -1: "↓", 0: "="}[self.paper_sign]
        head = f"{'★ ' if self.primary else ''}{self.column} {arrow} {self.verdict}"
        head += " at matched length" if self.matched else ""
        details = []
        if self.primary:
            details.append(self.noise)
        if self.saturated:
            details.append("saturated: a row above 90 on the world, not in the row's word")
        if self.intervals:
            counts = {w: self.per_seed.count(w) for w in dict.fromkeys(self.per_seed)}
            details.append("per seed: " + ", ".join(f"{w} {c}" for w, c in counts.items()))
        diffs = [self.differences[s] for s in sorted(self.differences)]
        if len(diffs) >= 2:
            spread = self.spread
            width = "no spread" if spread is None else f"± {fmt_width((spread[1] - spread[0]) / 2)}"
            details.append(f"Δ {signed(mean_std(diffs)[0])} {width}, {len(diffs)} seeds")
        elif self.intervals:
            low, high = next(iter(self.intervals.values()))
            details.append(f"Δ {signed(diffs[0])} [{signed(low)}, {signed(high)}]")
        else:
            details.append(f"Δ {signed(diffs[0])}")
        if self.matched:
            images = " and ".join(str(self.matched[s]) for s in sorted(self.matched))
            every = mean_std(list(self.every_image.values()))[0]
            details.append(f"on {images} images whose captions are equally long; every image: Δ {signed(every)}")
        return f"{head} ({'; '.join(details)})"


def paper_effect(row: Row, other: Row, i: int, column: Column, columns: Sequence[Column] = ()) -> int | None:
    """The paper's effect of ``row`` against ``other`` on column ``i``: +1 / -1, 0 for no change (a difference
    smaller than ``column.same``, or a stated 0), None when the paper gives neither numbers nor a sign. A world-only
    column (``column.sign_from``) takes the effect of the paper's column of that label among ``columns``."""
    if column.sign_from:
        source = [c.label for c in columns].index(column.sign_from)
        return paper_effect(row, other, source, columns[source], columns)
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
    primary = {(p.row, p.against, p.column) for p in table.primary}
    checks = []
    for other_id in row.vs:
        other = by_id[other_id]
        for i, column in enumerate(table.columns):
            paper_sign = paper_effect(row, other, i, column, table.columns)
            if paper_sign is None:
                continue
            label = column.label + (f" vs {other.label}" if len(row.vs) > 1 else "")
            check = pair_check(label, row, other, column, paper_sign, results, items,
                               primary=(row.id, other.id, column.label) in primary)  # fmt: skip
            if check is not None:
                checks.append(check)
    return checks


def caption_field(row: Row) -> str:
    """The caption field ``row``'s run was trained on and is scored against (``original``: the human captions)."""
    return RUNS[row.run].captions if row.run in RUNS else "original"


def own_field_cider(row: Row, other: Row, column: Column) -> bool:
    """Whether the cell compares own-field CIDEr-D where a row was trained on a boosted field (NDLB's BlendCap and
    HolisticCap rows, scored against their field's one long caption), which follows caption length (NDLB's check
    table: r = 0.90 over the HolisticCap results)."""
    return column.key == "CIDEr-D" and not row.prefix and {caption_field(row), caption_field(other)} != {"original"}


def length_matched(row: Row, other: Row, column: Column) -> bool:
    """Whether the cell is judged at matched length: own-field CIDEr-D of two runs of the same boosted field, judged
    on the images whose two captions have the same number of words (the package docstring says why this way)."""
    return own_field_cider(row, other, column) and caption_field(row) == caption_field(other)


OTHER_REFERENCES = "not judged: other references, other lengths"
"""The word of an own-field CIDEr-D cell between runs of different caption fields (a boosted field's MLE start
against the human captions'): scores against other references, of captions of other lengths (almost no image has
two equally long captions), so no difference of content can be read from it; left out of the row's word."""


def replicate_seeds(runs: dict[str, dict[str, float]], run: str) -> set[int]:
    """The run seeds of ``run``'s replicates among one world seed's runs (:func:`.schema.replicate_key`)."""
    pattern = re.compile(rf"{re.escape(run)}@r(\d+)")
    return {int(m.group(1)) for key in runs if (m := pattern.fullmatch(key))}


def run_pairs(runs: dict[str, dict[str, float]], row: Row, other: Row) -> list[tuple[str, str]]:
    """The (row, other) run keys of one world seed, one pair per run seed: the grid's own runs, then each run seed
    both rows were retrained with (a row without a training recipe, the human references, is the same under every
    run seed)."""
    assert row.run is not None and other.run is not None

    def fixed(run: str) -> bool:
        return run in RUNS and RUNS[run].recipe is None

    pairs = [(row.run, other.run)]
    seeds = replicate_seeds(runs, row.run) if not fixed(row.run) else replicate_seeds(runs, other.run)
    for m in sorted(seeds):
        a = row.run if fixed(row.run) else replicate_key(row.run, m)
        b = other.run if fixed(other.run) else replicate_key(other.run, m)
        if a in runs and b in runs:
            pairs.append((a, b))
    return pairs


def pair_check(label: str, row: Row, other: Row, column: Column, paper_sign: int, results: Results,
               items: Items, *, primary: bool = False) -> Check | None:  # fmt: skip
    """The :class:`Check` of ``row`` against ``other`` on ``column`` over the seeds where both ran (None: no such
    seed). Each seed's interval: with :data:`MIN_RUNS` or more run seeds of a primary cell, over run seeds and test
    images (:func:`run_seed_interval`); else the paired bootstrap over the test images of the grid's own run where
    both runs have per-image values for the same images. A length-matched cell (:func:`length_matched`) compares
    the images whose two captions have the same length, its difference their mean difference."""
    mine, theirs = world_values(results, row, column), world_values(results, other, column)
    seeds = sorted(set(mine) & set(theirs))
    if not seeds:
        return None
    matched_cell = length_matched(row, other, column)
    key = row.prefix + column.key
    differences = {s: mine[s] - theirs[s] for s in seeds}
    check = Check(label, other.id, paper_sign, dict(differences), {}, primary=primary)
    if own_field_cider(row, other, column) and not matched_cell:
        check.unjudged = OTHER_REFERENCES
        return check
    if column.ceiling is not None:
        check.saturated = max(mean_std(list(mine.values()))[0], mean_std(list(theirs.values()))[0]) > column.ceiling
    for s in seeds:
        pairs = run_pairs(results[s], row, other) if primary else [(row.run, other.run)]
        if primary:
            check.runs[s] = len(pairs)
        per_run = []  # per run seed: {image: difference} (None without per-image values)
        for a_key, b_key in pairs:
            a = run_image_values(items, s, a_key, key, column.scale)
            b = run_image_values(items, s, b_key, key, column.scale)
            per_run.append(image_differences(items, s, a_key, b_key, a, b, matched_cell))
        if matched_cell:
            check.every_image[s] = differences[s]
            if per_run[0] is None:  # no per-image lengths: not judged at matched length on this seed
                continue
            check.matched[s] = len(per_run[0])
        if len(pairs) >= MIN_RUNS:
            run_values = [mean_std(list(d.values()))[0] if d else None for d in per_run]
            if matched_cell and any(v is None for v in run_values):
                continue
            corpus = [v if v is not None else run_difference(results[s], a, b, key, column.scale)
                      for v, (a, b) in zip(run_values, pairs, strict=True)]  # fmt: skip
            if any(v is None for v in corpus):
                continue
            common = None
            if not matched_cell and all(per_run) and all(d.keys() == per_run[0].keys() for d in per_run):
                common = [[d[i] for i in sorted(per_run[0])] for d in per_run]
            found = run_seed_interval(corpus, common)
            check.differences[s] = statistics.fmean(corpus)
            if found is not None:
                check.intervals[s] = found[1:]
            continue
        first = per_run[0]
        if matched_cell and first is not None:
            check.differences[s] = statistics.fmean(first.values()) if first else 0.0
        if first:
            interval = bootstrap_interval(tuple(first[i] for i in sorted(first)))
            if interval is not None:
                check.intervals[s] = interval
    return check


def image_differences(items: Items, seed: int, a_key: str, b_key: str, a: dict[str, float] | None,
                      b: dict[str, float] | None, matched: bool) -> dict[str, float] | None:  # fmt: skip
    """``{image: a - b}`` on the images both runs scored (None unless both have the same images); with ``matched``,
    only the images whose two captions have the same length (per-image ``Length``; None without it)."""
    if not a or not b or a.keys() != b.keys():
        return None
    ids = sorted(a)
    if matched:
        la = run_image_values(items, seed, a_key, "Length", 1.0)
        lb = run_image_values(items, seed, b_key, "Length", 1.0)
        if not la or not lb:
            return None
        ids = [i for i in ids if i in la and i in lb and la[i] == lb[i]]
    return {i: a[i] - b[i] for i in ids}


def run_difference(runs: dict[str, dict[str, float]], a: str, b: str, key: str, scale: float) -> float | None:
    """``runs[a][key] - runs[b][key]`` in the paper's unit (None when either lacks it)."""
    x, y = metric_value(runs[a], key), metric_value(runs[b], key)
    return None if x is None or y is None else (x - y) * scale


def row_word(checks: Sequence[Check]) -> str:
    """A row's word from its cells: from the paper's directional cells (↑ / ↓) that are not saturated; *holds* when
    every one holds, *partly holds* when some do, *reversed* when every one reverses, *does not hold* when none
    holds and one reverses, *within noise* when every one is within noise or the seeds' spread, *no noise estimate*
    when none has one, *undecided* otherwise. No-change (=) cells never make a row hold: a row with only = cells is
    *unchanged within noise* when each holds, *changed* when one changed. A row whose directional cells are all
    saturated takes their word, prefixed ``saturated:``. Cells that are not judged (:attr:`Check.unjudged`) do not
    count."""
    checks = [c for c in checks if not c.unjudged]
    directional = [c for c in checks if c.paper_sign and not c.saturated]
    prefix = ""
    if not directional and any(c.paper_sign for c in checks):
        directional, prefix = [c for c in checks if c.paper_sign], "saturated: "
    if not directional:
        if not checks:
            return "not judged"
        words = {c.verdict for c in checks}
        if words == {HOLDS}:
            return "unchanged within noise"
        if CHANGED in words:
            return "changed"
        return NO_ESTIMATE if words == {NO_ESTIMATE} else "undecided"
    words = {c.verdict for c in directional}
    if words == {HOLDS}:
        word = "holds"
    elif HOLDS in words:
        word = "partly holds"
    elif words == {REVERSED}:
        word = "reversed"
    elif REVERSED in words:
        word = "does not hold"
    elif words <= {WITHIN, SPREAD}:
        word = "within noise"
    elif words == {NO_ESTIMATE}:
        word = "no noise estimate"
    else:
        word = "undecided"  # within noise, mixed or without a noise estimate, column by column
    return prefix + word


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
    return f"{row_word(checks)}: " + ", ".join(c.text() for c in checks)


def best_verdict(table: Table, results: Results, items: Items | None = None) -> str | None:
    """Whether the paper's chosen row of a grid is the world's best on the chosen column: by the mean over seeds, and
    against the noise (the chosen row judged against every other row with :class:`Check`'s rule, the paper's sign
    being "better"): *best beyond noise* when it beats every row; else the rows better beyond noise, the rows it is
    *mixed* against (better beyond noise on one seed, worse beyond noise on another), and the rows it is not shown
    better than on every seed, with how it fares on each (:func:`choice_counts`)."""
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
    if checks and all(c.verdict == HOLDS for c in checks):
        noise = "best beyond noise"
    else:
        better = [c.column for c in checks if c.verdict == REVERSED]
        mixed = [f"{c.column} ({choice_counts(c)})" for c in checks if c.verdict == MIXED and c.opposite]
        within = [f"{c.column} ({choice_counts(c)})" for c in checks
                  if c.verdict not in (HOLDS, REVERSED) and not (c.verdict == MIXED and c.opposite)]  # fmt: skip
        parts = []
        if better:
            parts.append("another row is better beyond noise: " + ", ".join(better))
        if mixed:
            parts.append("mixed, one seed each way beyond noise: " + ", ".join(mixed))
        if within:
            parts.append("not shown better than " + ", ".join(within))
        noise = "; ".join(parts)
    return (f"{head}World: the best {best.column} (mean over {seeds} seed(s)) is {winner.label} "
            f"({means[pick]:.2f}): {word} by the mean; against the noise: {noise}.")  # fmt: skip


CHOICE_WORDS = {HOLDS: "better beyond noise", REVERSED: "worse beyond noise", WITHIN: "within noise"}
"""A grid's chosen row against another row, per seed (:func:`best_verdict`)."""


def choice_counts(check: Check) -> str:
    """How the chosen row fares against one other row, seed by seed (``better beyond noise on 1 seed, within noise
    on 1``), or the cell's word when the seeds have no intervals."""
    if not check.intervals:
        return check.verdict
    counts = {w: check.per_seed.count(w) for w in dict.fromkeys(check.per_seed)}
    return ", ".join(f"{CHOICE_WORDS.get(w, w)} on {n} seed{'s' if n > 1 else ''}" for w, n in counts.items())


def page_checks(paper: Paper, results: Results, items: Items | None = None) -> list[Check]:
    """Every judged cell of a paper's page (the rows' cells, not the grids' choices)."""
    return [c for t in paper.tables if t.runnable for r in t.rows if r.run and r.vs
            for c in row_checks(t, r, results, items)]  # fmt: skip


def seed_rate(tails: int, ratio: float = 0.0) -> float:
    """The probability that one seed's 95% interval excludes 0 (in one given direction, ``tails`` 1; in either,
    2) when the true difference is 0 and the seed's difference has ``√(1 + ratio²)`` times the standard error the
    interval assumes (``ratio``: retraining noise over test-split noise, for an interval that leaves retraining
    out)."""
    return tails * 0.5 * math.erfc(1.96 / math.sqrt(1 + ratio**2) / math.sqrt(2))


def chance_rate(check: Check, ratio: float = 0.0) -> float:
    """The probability that ``check`` comes out *holds* (a directional cell) or *changed* (a no-change cell) when
    the true difference is 0: every seed's interval must exclude 0 (:func:`seed_rate`, the seeds independent;
    ``ratio`` widens the one-run intervals' seeds only); a cell the seeds' t-interval decides, its own 5% level
    (2.5% in the paper's direction)."""
    tails = 1 if check.paper_sign else 2
    if check.intervals and len(check.intervals) == len(check.differences):
        return seed_rate(tails, 0.0 if check.retrained else ratio) ** len(check.intervals)
    return tails * 0.025


def expected_count(value: float) -> str:
    """An expected number of cells as the multiplicity note writes it: one decimal, or two significant digits where
    one decimal would print a positive count as 0.0 (a page of few cells, mostly no-change).

    >>> expected_count(0.44), expected_count(0.028), expected_count(0.0)
    ('0.4', '0.028', '0.0')
    """
    return f"{value:.1f}" if value == 0 or round(value, 1) > 0 else f"{value:.2g}"


def chance_note(paper: Paper, results: Results, items: Items | None = None) -> str:
    """The page's multiplicity note: how many cells it judges, and how many would come out *holds* / *changed* by
    chance were every effect zero, at the intervals' level and with retraining noise as measured
    (:data:`RUN_TO_TEST_NOISE`)."""
    checks = [c for c in page_checks(paper, results, items) if c.verdict != NO_ESTIMATE]
    if not checks:
        return ""
    directional = [c for c in checks if c.paper_sign]
    nominal = sum(chance_rate(c) for c in checks)
    low, high = (sum(chance_rate(c, r) for c in checks) for r in RUN_TO_TEST_NOISE)
    one = [c for c in checks if c.intervals and not c.retrained]
    lo_rate, hi_rate = (seed_rate(1, r) ** 2 for r in RUN_TO_TEST_NOISE)
    chance, rates = expected_count(nominal), f"{expected_count(low)}-{expected_count(high)}"
    return (
        f"**Multiplicity.** This page judges {len(checks)} cells with a noise estimate ({len(directional)} "
        f"directional, {len(checks) - len(directional)} no-change). Were every effect zero, a directional cell "
        "decided by two seeds' 95% intervals would come out *holds* with probability 0.025² (both seeds past 0 in "
        "the paper's direction), a no-change cell *changed* with 0.05², and a cell decided by the seeds' t-interval "
        f"with 0.025 (0.05): about {chance} of these cells by chance, at the intervals' level. But {len(one)} "
        "of them rest on one run per world seed, whose intervals leave out retraining noise, measured for the one "
        "comparison repeated over run seeds (SLE − SCST's CIDEr-D and sampled Div-2, 12 pairs, docs/results.md) at "
        f"{RUN_TO_TEST_NOISE[0]:g}-{RUN_TO_TEST_NOISE[1]:g} times its test split's noise: with it, a directional "
        f"one-run cell holds on two seeds by chance with probability {lo_rate:.1%}-"
        f"{hi_rate:.1%}, and about {rates} of this page's cells would come out *holds* or *changed* "
        "with no effect at all. A single cell that holds is therefore weak evidence; a primary cell (★) with "
        f"{MIN_RUNS} run seeds per world seed or more carries retraining noise in its interval."
    )
