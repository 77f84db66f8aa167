"""The memory numbers docs/memory.md and docs/scaling.md quote, against what backs them: the forecast tables are
``benchmarks/memory_forecast.py``'s output (from shapes alone, seconds), and the H200 rows are the committed
``benchmarks/results/gpu_check_h200_2026-11-26*.json`` records, so neither page can keep a number its source no
longer gives."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from helpers.scripts import benchmark

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def table_after(page: str, heading: str) -> list[str]:
    """The data rows of the first Markdown table after ``heading`` on ``page`` (docs/<page>), header left out."""
    text = (ROOT / "docs" / page).read_text()
    lines = text[text.index(heading) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    return list(itertools.takewhile(lambda line: line.startswith("|"), lines[start:]))[2:]


@pytest.fixture(scope="module")
def forecast():
    return benchmark("memory_forecast", neighbours=True)


def test_the_forecast_per_recipe_table_is_the_scripts(forecast):
    assert table_after("memory.md", "### Forecast per recipe") == forecast.table(80.0)[2:]


def test_the_h200_forecast_table_is_the_scripts_from_the_committed_records(forecast):
    assert table_after("memory.md", "**Against the first H200 run**") == forecast.h200()[2:]


def h200_record(name: str) -> dict:
    for file in sorted(RESULTS.glob("gpu_check_h200_2026-11-26*.json")):
        for check in json.loads(file.read_text())["checks"]:
            if check["name"] == name and check["status"] == "pass":
                return check
    raise AssertionError(f"no passing {name} in the committed H200 records")


@pytest.mark.parametrize("name", ["memory:mle_vlm", "memory:smile_vlm", "memory:sr_l_vlm", "memory:grpo_cider_vlm"])
def test_scalings_h200_memory_rows_are_the_committed_records(name):
    """docs/scaling.md's "Measured: one H200" rows: batch, forecast, measured peak and step seconds as each record
    has them (the peak to 0.1 GiB, or 0.01 under 10 GiB as the page writes it)."""
    row = next(r for r in table_after("scaling.md", "### Measured: one H200") if f"`{name}`" in r).replace("**", "")
    r = h200_record(name)
    peak = f"{r['measured_peak_gib']:.1f}" if r["measured_peak_gib"] >= 10 else f"{r['measured_peak_gib']:.2f}"
    for part in (f"batch {r['batch']}:", f"forecast {r['forecast_gib']:.2f} GiB", f" {peak} GiB",
                 f"{r['step_seconds']:.1f} s a step"):  # fmt: skip
        assert part in row, (name, part, row)


def test_scalings_h200_grpo_row_is_the_committed_record():
    row = next(r for r in table_after("scaling.md", "### Measured: one H200") if r.startswith("| `grpo` |"))
    r = h200_record("grpo")
    for part in (f"{r['seconds_per_step']:.2f} s a step", f"{r['captions_per_second']:.0f} sampled captions/s",
                 f"peak {r['peak_cuda_gib_steps_2_on']:.1f} GiB"):  # fmt: skip
        assert part in row, (part, row)
