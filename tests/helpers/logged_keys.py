"""The training log's keys that docs/training.md lists ("What a run logs"), for the tests that check a tiny run logs
no key the page does not explain."""

from __future__ import annotations

import re
from pathlib import Path

from helpers.markdown_tables import markdown_table

TRAINING_DOC = Path(__file__).resolve().parents[2] / "docs" / "training.md"


def documented_keys() -> list[re.Pattern[str]]:
    """Each key of the table's first column (``loss/<name>``: ``<name>`` any one name) as a full-match pattern."""
    _, *rows = markdown_table(TRAINING_DOC.read_text(encoding="utf-8"), "### What a run logs")
    keys = [key for row in rows for key in re.findall(r"`([^`]+)`", row[0])]
    return [re.compile("/".join("[^/]+" if p.startswith("<") else re.escape(p) for p in k.split("/"))) for k in keys]


def undocumented(keys: list[str] | set[str]) -> list[str]:
    """The logged ``keys`` no entry of the page's table names."""
    patterns = documented_keys()
    return sorted(k for k in keys if not any(p.fullmatch(k) for p in patterns))
