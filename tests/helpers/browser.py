"""What the browser tests (tests/report/test_browser.py) wait on: the page's own state, never a time."""

from __future__ import annotations


def loaded(driver) -> bool:
    """Whether the page the browser shows has finished loading: its document, images and scripts (the page's own
    ``document.readyState``, which is ``complete`` only after its load event)."""
    return driver.execute_script("return document.readyState") == "complete"
