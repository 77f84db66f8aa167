"""A value refused alike as a command-line override and as a recipe's: the configuration tests' one check of both
places a setting is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from finecap.config import ConfigError, load


def refused_both_ways(key: str, written: str, tmp_path: Path, override: str, recipe: str) -> None:
    """``key=written`` on the command line raises a :class:`ConfigError` matching ``override``, and a recipe holding
    ``key: written`` one matching ``recipe`` (regular expressions)."""
    with pytest.raises(ConfigError, match=override):
        load(None, [f"{key}={written}"])
    section, name = key.split(".")
    path = tmp_path / "recipe.yaml"
    path.write_text(f"{section}:\n  {name}: {written}\n")
    with pytest.raises(ConfigError, match=recipe):
        load(path)
