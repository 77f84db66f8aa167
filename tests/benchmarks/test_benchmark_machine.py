"""Every benchmark that times or measures says on what machine (``benchmarks/machine.py``: processor, CPUs, torch's
threads, torch and Python versions, commit): it prints :func:`machine_line` with its numbers and stores
:func:`machine` in what it writes. Only ``reward_server.py`` did; the other timing scripts printed their ratios with
no processor or torch version beside them, and their ``--json`` files held numbers of an unknown machine."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from helpers.scripts import benchmark

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
MEASURES = {"perf_counter", "process_time", "time", "peak_bytes", "max_memory_allocated", "measure", "interleaved"}
"""Calls that time a step or read a memory peak (``time.time``, ``peak_rss.peak_bytes``, ``timing.interleaved``,
...)."""
EXEMPT = {
    "machine.py": "the module itself",
    "peak_rss.py": "the peak-memory method the memory benchmarks call, not a benchmark",
    "timing.py": "the interleaved timer the speed benchmarks call, not a benchmark",
    "effects.py": "times a seed's demo run for its log; its numbers are results, not speed",
    "chair_lemmatiser_gap.py": "prints each lemmatiser's seconds to stderr as progress; its numbers are CHAIR values",
    "gpu_check.py": "records its own machine: GPU, CUDA, and every package's version (its env line)",
}
"""Scripts that call a timer without being a speed or memory benchmark, each with why."""


def called(tree: ast.AST) -> set[str]:
    """The names of the functions ``tree`` calls (``time.perf_counter()`` -> ``perf_counter``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            names.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""))
    return names


def measures(tree: ast.AST) -> bool:
    """Whether ``tree`` calls or hands on a timer or a memory peak (``CLOCKS = {"wall": time.perf_counter}``)."""
    attributes = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    return bool((called(tree) | attributes) & MEASURES)


MEASURING = sorted(p for p in BENCHMARKS.glob("*.py") if p.name not in EXEMPT and measures(ast.parse(p.read_text())))


def test_the_timing_scripts_are_found():
    assert {"decode.py", "train_step.py", "ngram_metrics.py", "memory.py", "reward_server.py"} <= {
        p.name for p in MEASURING
    }


@pytest.mark.parametrize("path", MEASURING, ids=lambda p: p.name)
def test_every_measuring_benchmark_prints_and_stores_its_machine(path):
    tree = ast.parse(path.read_text())
    names = called(tree)
    assert "machine_line" in names, f"{path.name} prints numbers without the machine (machine.machine_line)"
    writes_json = "--json" in path.read_text() or "write" in names
    if writes_json and path.name != "judge_cost.py":  # judge_cost prints a table and writes no file
        assert "machine" in names, f"{path.name} writes its numbers without the machine (machine.machine)"


def test_machine_records_the_threads_the_benchmark_set():
    import torch

    module = benchmark("machine")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        record = module.machine()
        assert record["threads"] == 1 and "torch threads 1" in module.machine_line()
    finally:
        torch.set_num_threads(before)
    assert {"processor", "cpus", "python", "torch", "numpy", "commit"} <= set(record)
    assert record["torch"] == torch.__version__


def test_a_benchmarks_json_holds_its_machine(tmp_path):
    """vlm_step.py at a tiny shape (one step, seconds): its --json file names the machine it ran on."""
    out = tmp_path / "out.json"
    benchmark("vlm_step").main(["--shared-prompt", "--images", "1", "--samples", "2", "--image-tokens", "4",
                                "--tokens", "3", "--steps", "1", "--json", str(out)])  # fmt: skip
    record = json.loads(out.read_text())["machine"]
    assert record["threads"] == 1 and record["processor"] and record["torch"]
