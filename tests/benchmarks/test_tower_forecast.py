"""benchmarks/tower_forecast.py: docs/memory.md's per-family table of a trained tower layer's saved bytes is the
script's output, and a SigLIP tower (Idefics3's, SmolVLM's) measures exactly what the forecast counts, with and
without autocast (the other families' gaps are findings the page states, not bounds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.markdown_tables import table_lines
from helpers.scripts import benchmark

MEMORY_PAGE = Path(__file__).resolve().parents[2] / "docs" / "memory.md"


@pytest.fixture(scope="module")
def script():
    return benchmark("tower_forecast")


def test_the_per_family_tower_table_is_the_scripts(script):
    assert table_lines(MEMORY_PAGE.read_text(), "**Per family, on the CPU.**") == script.table()[2:]


@pytest.mark.parametrize("autocast", [False, True], ids=["bf16", "autocast"])
def test_a_siglip_tower_layer_saves_exactly_the_forecast(script, autocast):
    tower, patches, measured, forecast = script.row("idefics3", autocast)
    assert tower == "Idefics3VisionTransformer" and patches == 4 * 16
    assert measured == forecast
