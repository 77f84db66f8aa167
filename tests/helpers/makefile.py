"""The repository's Makefile read as the tests that check its targets need it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def make_target(name: str) -> list[str]:
    """The recipe lines of the Makefile's target ``name``, stripped."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(rf"{re.escape(name)}:", line))
    recipe = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    return recipe
