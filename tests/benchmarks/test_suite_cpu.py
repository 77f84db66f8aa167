"""benchmarks/suite_cpu.py: the plugin charges each test its own CPU and its reaped children's, and refuses to run
without a file named to append to; the report's header says the threads the tests ran with, not the report's."""

from __future__ import annotations

import doctest
import json
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


CONFTEST = "import torch\n\ntorch.set_num_threads(1)\n"
"""What the suite's root conftest.py does to torch's threads (its OMP_NUM_THREADS=1 is the environment's here)."""


def run_pytest(folder: Path, out: Path | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SUITE_CPU_OUT"}
    env["PYTHONPATH"] = str(BENCHMARKS)
    env["OMP_NUM_THREADS"] = "1"
    if out is not None:
        env["SUITE_CPU_OUT"] = str(out)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "suite_cpu",
                           "-o", "addopts=", "test_spin.py"], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


@pytest.mark.slow
def test_each_test_is_charged_its_own_cpu_and_its_childrens(tmp_path):
    (tmp_path / "test_spin.py").write_text(TESTS)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    out = tmp_path / "cpu.jsonl"
    proc = run_pytest(tmp_path, out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = {r["id"]: r for r in benchmark("suite_cpu").read_records(out)}
    child, itself = records["test_spin.py::test_spins_a_child"], records["test_spin.py::test_spins_itself"]
    assert child["threads"] == itself["threads"] == 1 and child["omp"] == itself["omp"] == "1"  # what they ran with
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


def test_the_reports_header_says_the_threads_the_tests_ran_with(tmp_path, capsys):
    """The header's "torch threads" was the printing process's (2 on the development machine), while the suite's
    conftest.py runs every test with one thread and OMP_NUM_THREADS=1: it says what the records say."""
    import torch

    suite_cpu = benchmark("suite_cpu")
    records = tmp_path / "cpu.jsonl"
    row = {"id": "tests/a/test_x.py::t", "worker": "gw0", "start": 0.0, "wall": 1.0, "self": 1.0, "child": 0.0,
           "threads": 1, "omp": "1"}  # fmt: skip
    records.write_text(json.dumps(row) + "\n" + json.dumps({**row, "id": "tests/a/test_x.py::u"}) + "\n")
    before = torch.get_num_threads()
    torch.set_num_threads(3)  # the process printing the report: not the tests' threads
    try:
        assert suite_cpu.main([str(records), "--json", str(tmp_path / "summary.json")]) == 0
    finally:
        torch.set_num_threads(before)
    first = capsys.readouterr().out.splitlines()[0]
    assert ", torch threads 1, " in first and first.endswith("(torch threads: the tests'; their OMP_NUM_THREADS 1)")
    machine = json.loads((tmp_path / "summary.json").read_text())["machine"]
    assert machine["threads"] == 1 and machine["omp_threads"] == "1"
    old = {k: v for k, v in row.items() if k not in ("threads", "omp")}  # records of the plugin before it said
    records.write_text(json.dumps(old) + "\n")
    suite_cpu.main([str(records)])
    assert ", torch threads unknown, " in capsys.readouterr().out.splitlines()[0]
    assert doctest.testmod(suite_cpu).failed == 0  # machine_as_tested's examples: values seen, mixed, one
