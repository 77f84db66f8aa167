"""benchmarks/timing.py: the two sides of a speed comparison run interleaved, round after round, and keep every run."""

from __future__ import annotations

import doctest

from helpers.scripts import benchmark


def test_sides_alternate_run_by_run_and_every_run_is_kept():
    timing = benchmark("timing")
    order = []
    clock = iter([0, 1, 1, 4, 4, 6, 6, 10]).__next__  # ours 1 s then 2 s, theirs 3 s then 4 s
    times = timing.interleaved({"ours": lambda: order.append("ours"), "theirs": lambda: order.append("theirs")},
                               repeat=2, clock=clock)  # fmt: skip
    assert order == ["ours", "theirs", "ours", "theirs"]  # a burst of load hits both sides alike
    assert times["ours"].runs == [1, 2] and times["theirs"].runs == [3, 4]
    assert (times["ours"].best, times["ours"].median, times["theirs"].worst) == (1, 1.5, 4)
    assert timing.spread(times["ours"], times["theirs"]) == "3.00 (rounds 2.00-3.00)"  # 3/1 best; 3/1 and 4/2


def test_its_docstring_example_runs():
    timing = benchmark("timing")
    assert doctest.testmod(timing).failed == 0
