"""Any two folders of tests/ collect together (issue 63): ``pytest --collect-only`` over every pair of test folders
succeeds, so a part of the suite runs alone or beside any other (``pytest tests/models tests/train``).

What breaks a pair is what two folders' files share by name: two test modules of one basename (pytest imports each
by its basename, its folder put on ``sys.path``), a module beside tests imported by its bare name, or two
``conftest.py`` collected as modules (``--doctest-modules`` over tests/, which is why the doctests are their own run,
``make doctest``). Every pair is collected by pytest itself in a worker process; a worker collects its share of the
pairs one after another, putting ``sys.path`` and every module imported from tests/ back as they were between two
(as pytest's own ``pytester`` does for its in-process runs), so each pair is collected as in a fresh process while
torch and transformers are imported once per worker (assertions left plain: collection only).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
WORKERS = min(4, os.cpu_count() or 1)
"""Worker processes, each collecting its share of the pairs."""

WORKER = """
import contextlib, io, json, sys
import pytest

tests = sys.argv[1]
results = []
for a, b in json.loads(sys.argv[2]):
    path, modules = list(sys.path), set(sys.modules)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-m", "slow or not slow",
                            "--assert=plain", f"{tests}/{a}", f"{tests}/{b}"])
    results.append([a, b, int(code), out.getvalue()[-3000:]])
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        if (getattr(sys.modules[name], "__file__", None) or "").startswith(tests):
            del sys.modules[name]
print(json.dumps(results))
"""


def folders_of_tests() -> list[str]:
    """The folders of tests/ holding test modules (tests/helpers/ holds none)."""
    return sorted(p.name for p in TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py")))


def test_no_test_module_sits_at_the_root_of_tests():
    # every test module is filed under the package it tests (CONTRIBUTING.md, "Where a test goes")
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == []


@pytest.mark.slow  # 210 pairs: about a second each (the test modules' imports), shared by the workers
def test_every_pair_of_test_folders_collects_together():
    folders = folders_of_tests()
    assert {"models", "train", "serve", "repo"} <= set(folders), folders
    pairs = list(itertools.combinations(folders, 2))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(TESTS), json.dumps(pairs[k::WORKERS])],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for k in range(WORKERS)
    ]  # fmt: skip
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        results += json.loads(out.strip().splitlines()[-1])
    assert sorted((a, b) for a, b, _, _ in results) == sorted(pairs)
    failed = [f"tests/{a} tests/{b} (exit {code}):\n{out}" for a, b, code, out in results if code != 0]
    assert failed == [], "pairs of test folders that do not collect together:\n" + "\n".join(failed)
