"""Waiting on a state in a test (CONTRIBUTING.md: a test waits on the state it needs, never on a fixed sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable


def until(condition: Callable[[], bool], what: str, timeout: float = 30.0, every: float = 0.005) -> None:
    """Return once ``condition()`` holds (checked every ``every`` seconds); fail with ``what`` after ``timeout``
    seconds (a liveness bound for a loaded machine, not a speed claim)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(every)


SAYS_WAITING = """
import logging


class Said(logging.Handler):
    def emit(self, record):
        if "waiting for it" in record.getMessage():
            print("waiting", flush=True)


logging.getLogger("finecap").addHandler(Said())
logging.getLogger("finecap").setLevel(logging.INFO)
"""
"""The start of a script a test runs as a second process that waits on finecap's lock (a home's world encoder, a
feature file): it prints ``waiting`` once finecap logs that it waits for another process, which the test reads
from its standard output."""
