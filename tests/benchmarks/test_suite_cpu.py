"""benchmarks/suite_cpu.py: the plugin charges each test its own CPU and its reaped children's, and refuses to run
without a file named to append to."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.scripts import benchmark

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
TESTS = """
import subprocess, sys

SPIN = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.5: pass"

def test_spins_a_child():
    subprocess.run([sys.executable, "-c", SPIN], check=True)

def test_spins_itself():
    import time
    t = time.process_time()
    while time.process_time() - t < 0.3:
        pass
"""


def run_pytest(folder: Path, out: Path | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SUITE_CPU_OUT"}
    env["PYTHONPATH"] = str(BENCHMARKS)
    if out is not None:
        env["SUITE_CPU_OUT"] = str(out)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "suite_cpu",
                           "-o", "addopts=", "test_spin.py"], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


@pytest.mark.slow
def test_each_test_is_charged_its_own_cpu_and_its_childrens(tmp_path):
    (tmp_path / "test_spin.py").write_text(TESTS)
    out = tmp_path / "cpu.jsonl"
    proc = run_pytest(tmp_path, out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = {r["id"]: r for r in benchmark("suite_cpu").read_records(out)}
    child, itself = records["test_spin.py::test_spins_a_child"], records["test_spin.py::test_spins_itself"]
    assert child["child"] >= 0.5 and child["self"] < 0.5  # the spinning process is the child, reaped in the test
    assert itself["self"] >= 0.3 and itself["child"] == 0.0
    assert child["worker"] == itself["worker"] == "main" and child["wall"] >= 0.5
    report = benchmark("suite_cpu").summary([child, itself])
    assert report["cpu"] == round(child["self"] + child["child"] + itself["self"], 1) and report["tests"] == 2
    assert report["top_tests"][0][0] == "test_spin.py::test_spins_a_child"


@pytest.mark.slow
def test_without_a_file_to_append_to_the_run_is_refused(tmp_path):
    (tmp_path / "test_spin.py").write_text(TESTS)
    proc = run_pytest(tmp_path, None)
    assert proc.returncode == 4 and "set SUITE_CPU_OUT" in proc.stderr, proc.stdout + proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test_spin.py"]  # nothing written
    assert "passed" not in proc.stdout  # no test ran
