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
