"""Any two folders of tests/ collect together (issue 63): ``pytest --collect-only`` over every pair of test folders
succeeds, so a part of the suite runs alone or beside any other (``pytest tests/models tests/train``).

What breaks a pair is what two folders' files share by name: two test modules of one basename (pytest imports each
by its basename, its folder put on ``sys.path``), a module beside tests imported by its bare name, or two
``conftest.py`` collected as modules (``--doctest-modules`` over tests/, which is why the doctests are their own run,
``make doctest``). Every pair is collected by pytest itself, one after another in one worker process, which puts
``sys.path`` and every module imported from tests/ back as they were between two (as pytest's own ``pytester`` does
for its in-process runs), so each pair is collected as in a fresh process while torch, transformers and the other
libraries are imported once (assertions left plain: collection only). pytest's ``unraisableexception`` plugin is left
out: it runs five full garbage collections at the end of every session (half of a pair's time with torch's objects
in memory) and concerns only tests that run. One worker: a second would import every library again, on a machine
whose two cores `make test` already keeps busy. :func:`test_a_duplicate_basename_is_caught` plants the fault this
test exists for.
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
                            "--assert=plain", "-p", "no:unraisableexception", f"{tests}/{a}", f"{tests}/{b}"])
    results.append([a, b, int(code), out.getvalue()[-3000:]])
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        if (getattr(sys.modules[name], "__file__", None) or "").startswith(tests):
            del sys.modules[name]
print(json.dumps(results))
"""


def folders_of_tests(tests: Path = TESTS) -> list[str]:
    """The folders of ``tests`` holding test modules (tests/helpers/ holds none)."""
    return sorted(p.name for p in tests.iterdir() if p.is_dir() and any(p.glob("test_*.py")))


def collect_pairs(tests: Path, pairs: list[tuple[str, str]]) -> list[tuple[str, str, int, str]]:
    """``pytest --collect-only`` of each pair of folders of ``tests``, in order, in one worker process run from
    ``tests``'s parent: ``(a, b, exit code, the end of what it printed)`` for each."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", WORKER, str(tests), json.dumps(pairs)], cwd=tests.parent, env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [tuple(row) for row in json.loads(proc.stdout.strip().splitlines()[-1])]


def test_no_test_module_sits_at_the_root_of_tests():
    # every test module is filed under the package it tests (CONTRIBUTING.md, "Where a test goes")
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == []


def test_a_duplicate_basename_is_caught(tmp_path):
    # the fault this file exists for, planted in a tree of three folders: one basename in two of them fails their
    # pair ("import file mismatch") and no other, as the worker's purge of tests' modules between pairs must keep it
    for folder, name in (("a", "test_same"), ("b", "test_same"), ("c", "test_other")):
        (tmp_path / "tests" / folder).mkdir(parents=True)
        (tmp_path / "tests" / folder / f"{name}.py").write_text("def test_it():\n    pass\n")
    tests = tmp_path / "tests"
    pairs = list(itertools.combinations(folders_of_tests(tests), 2))
    results = collect_pairs(tests, [*pairs, ("a", "b")])  # the failing pair again, after the others
    assert [(a, b, code != 0) for a, b, code, _ in results] == [
        ("a", "b", True), ("a", "c", False), ("b", "c", False), ("a", "b", True),
    ]  # fmt: skip
    assert all("import file mismatch" in out for a, b, _, out in results if (a, b) == ("a", "b"))


@pytest.mark.slow  # every pair in one process (231 of 22 folders on 2026-11-29): about 0.25 s a pair
def test_every_pair_of_test_folders_collects_together():
    folders = folders_of_tests()
    assert {"models", "train", "serve", "repo"} <= set(folders), folders
    pairs = list(itertools.combinations(folders, 2))
    results = collect_pairs(TESTS, pairs)
    assert [(a, b) for a, b, _, _ in results] == pairs
    failed = [f"tests/{a} tests/{b} (exit {code}):\n{out}" for a, b, code, out in results if code != 0]
    assert failed == [], "pairs of test folders that do not collect together:\n" + "\n".join(failed)
