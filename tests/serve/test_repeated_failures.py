"""The bounded log of a server's failures (``finecap.serve.service.RepeatedFailures``) on its own, with a clock of
the test's: a kind of failure it forgets to stay bounded says its unsaid repeats first."""

from __future__ import annotations

import logging

from finecap.serve.service import RepeatedFailures


def raised(kind: type[Exception]) -> Exception:
    """An exception of ``kind`` with a traceback (a kind of failure is its type and the code it passed through)."""
    try:
        raise kind("lost")
    except Exception as e:
        return e


def test_the_oldest_kind_says_its_unsaid_repeats_when_it_is_forgotten(caplog):
    # two kinds remembered at most; a line per kind every 10 s: ValueError's repeats at 1002 and 1003 s are
    # counted, unsaid; a third kind (1004 s) makes the failures forget ValueError, which said nothing of them
    now = [1000.0]
    failures = RepeatedFailures(kinds=2, clock=lambda: now[0], line_every=10.0)
    with caplog.at_level(logging.INFO, logger="finecap.serve.service"):
        for kind in (ValueError, KeyError, ValueError, ValueError, TypeError):
            now[0] += 1.0
            failures.log(raised(kind), f"request failed: {kind.__name__}", trace=False)
        failures.flush()  # the stop: the two remembered kinds have nothing unsaid
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "request failed: ValueError",
        "request failed: KeyError",
        "request failed: TypeError",
        "request failed: ValueError (the same failure 2 more time(s) since its last line 4 s ago, unsaid until "
        "forgotten for a newer kind (at most 2 kinds are remembered))",
    ]
    assert failures.total == 5


def test_a_forgotten_kind_with_nothing_unsaid_says_nothing_more(caplog):
    now = [1000.0]
    failures = RepeatedFailures(kinds=1, clock=lambda: now[0], line_every=0.0)  # a line for every repeat
    with caplog.at_level(logging.INFO, logger="finecap.serve.service"):
        for kind in (ValueError, ValueError, KeyError):
            now[0] += 1.0
            failures.log(raised(kind), f"request failed: {kind.__name__}", trace=False)
    assert [r.getMessage() for r in caplog.records] == [
        "request failed: ValueError",
        "request failed: ValueError (the same failure 1 time(s) since its full report 1 s ago; the next full report "
        "in 599 s at most)",
        "request failed: KeyError",
    ]
