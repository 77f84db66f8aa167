"""docs/config-reference.md is generated from the configuration dataclasses (docs/gen_config_reference.py) and must
match them: a field added, removed or re-documented without regenerating the page fails here."""

from __future__ import annotations

from pathlib import Path

from finecap.config import SECTIONS
from finecap.config.fields import option_fields
from helpers.scripts import script_module

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "gen_config_reference.py"
PAGE = ROOT / "docs" / "config-reference.md"


def _generator():
    return script_module(SCRIPT)


def test_committed_config_reference_is_up_to_date():
    expected = _generator().render()
    current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
    assert current == expected, (
        f"{PAGE.relative_to(ROOT)} is out of date with src/finecap/config/sections/; regenerate it with "
        f"`{_generator().COMMAND}` (from the repository root) and commit the result"
    )


def test_every_config_key_has_a_row_with_its_doc():
    page = _generator().render()
    rows = {line.split(" | ")[0].strip("| `"): line for line in page.splitlines() if line.startswith("| `")}
    for name, cls in SECTIONS.items():
        for option, f, _ in option_fields(cls):  # a nested section's keys too (data.hf.image_column)
            key = f"{name}.{option}"
            assert key in rows, f"{key} missing from the generated reference"
            doc = f.metadata.get("doc", "")
            assert doc, f"{key} has no one-line doc (use finecap.config.doc(default, text))"
            first_words = " ".join(doc.split()[:3]).replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
            assert first_words in rows[key], f"{key}: its doc is not in its row: {rows[key]}"


def test_every_bound_and_its_reason_are_in_its_row():
    # the reference is the one place the bounds are written down for users (docs/configuration.md points to it)
    page = _generator().render()
    rows = {line.split(" | ")[0].strip("| `"): line for line in page.splitlines() if line.startswith("| `")}
    reasons = 0
    for name, cls in SECTIONS.items():
        for option, f, _ in option_fields(cls):
            bounds = f.metadata.get("bounds") or {}
            row = rows[f"{name}.{option}"].replace("&gt;", ">").replace("&lt;", "<")
            for bound, value in bounds.items():
                assert str(value) in row, f"{name}.{option}: its bound {bound}={value} is not in its row: {row}"
            why = f.metadata.get("why", "")
            if why:
                assert f"({why})." in row, f"{name}.{option}: the reason of its bound is not in its row: {row}"
                reasons += 1
    assert reasons >= 30  # the options that size memory or work (tests/config/test_config_bounds.py's BOUNDS)


def test_defaults_are_written_as_in_a_recipe():
    fmt = _generator().format_value
    assert fmt(None) == "null"
    assert fmt(True) == "true"
    assert fmt("") == '""'
    assert fmt(["world", "mle"]) == "[world, mle]"
    assert fmt(1e-4) == "0.0001"
    assert fmt(str(Path.home() / "cache" / "finecap")) == "~/cache/finecap"
