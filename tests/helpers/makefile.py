"""The repository's Makefile read as the tests that check its targets need it."""

from __future__ import annotations

import re
import subprocess
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


def make_variable(name: str) -> str:
    """The value GNU make gives the Makefile's variable ``name`` (``?=`` defaults and overrides applied by make)."""
    proc = subprocess.run(
        ["make", "-s", "--no-print-directory", "--eval", "print-var-%: ; @echo $($*)", f"print-var-{name}"],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=True,
    )  # fmt: skip
    return proc.stdout.strip()
