"""Waiting on a state in a test (CONTRIBUTING.md: a test waits on the state it needs, never on a fixed sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable


def until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Return once ``condition()`` holds (checked every 5 ms); fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)
