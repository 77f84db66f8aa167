"""Timing two (or more) implementations against each other in one process: their runs interleaved, so that a burst of
load on the machine hits every side alike, and the spread of each side kept beside its best.

    >>> import itertools
    >>> ticks = itertools.count()
    >>> times = interleaved({"ours": lambda: 1, "theirs": lambda: 2}, repeat=3, clock=lambda: next(ticks))
    >>> times["ours"].best, times["ours"].runs, times["theirs"].out
    (1, [1, 1, 1], 2)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Timing:
    """The times of one side's runs, in run order, and what its last run returned."""

    runs: list[float] = field(default_factory=list)
    out: Any = None

    @property
    def best(self) -> float:
        return min(self.runs)

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def worst(self) -> float:
        return max(self.runs)


def interleaved(fns: Mapping[str, Callable[[], Any]], repeat: int,
                clock: Callable[[], float] = time.perf_counter) -> dict[str, Timing]:  # fmt: skip
    """Run each of ``fns`` ``repeat`` times, round after round (one run of every side a round, in the order given),
    timing each run with ``clock``."""
    times = {name: Timing() for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = clock()
            times[name].out = fn()
            times[name].runs.append(clock() - start)
    return times


def spread(a: Timing, b: Timing) -> str:
    """``b / a`` of the best runs, with the range of the ratios of the rounds (run k of each side): a ratio whose range
    crosses 1 is within the noise."""
    ratios = [y / x for x, y in zip(a.runs, b.runs)]
    return f"{b.best / a.best:.2f} (rounds {min(ratios):.2f}-{max(ratios):.2f})"
