"""The one ``finecap demo --quick`` of a test session (``quick_demo_run`` in tests/conftest.py), run by the installed
wheel (:mod:`helpers.wheel`) as a user runs it: from an empty working directory with only ``--run-dir`` given, its
world and world encoder in the finecap home of its own (``FINECAP_HOME``). The tests that only read it share it
across the xdist workers; a test that runs more stages into it works on a copy of its own (:func:`own_copy`)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.wheel import run


@dataclass(frozen=True)
class QuickDemo:
    """A finished quick demo: ``run_dir`` (its working directory ``run_dir.parent`` holds nothing else), the ``argv``
    of ``finecap`` that ran it, the finecap ``home`` it used and the virtualenv ``venv`` that ran it."""

    run_dir: Path
    argv: list[str]
    home: Path
    venv: Path


def demo_argv(run_dir: Path) -> list[str]:
    """``finecap``'s arguments of a quick demo into ``run_dir``, as a user gives them: only ``--run-dir``."""
    return ["demo", "--quick", "--run-dir", str(run_dir)]


def quick_demo_in(out: Path, env_dir: Path) -> QuickDemo:
    """The quick demo :func:`run_quick_demo` runs into ``out``: working directory ``out/cwd``, home ``out/home``."""
    run_dir = out / "cwd" / "run"
    return QuickDemo(run_dir, demo_argv(run_dir), out / "home", env_dir)


def run_quick_demo(out: Path, env_dir: Path) -> None:
    """``finecap demo --quick`` of the virtualenv ``env_dir`` into the empty folder ``out`` (:func:`quick_demo_in`)."""
    demo = quick_demo_in(out, env_dir)
    demo.run_dir.parent.mkdir()
    demo.home.mkdir()
    run([env_dir / "bin" / "finecap", *demo.argv], cwd=demo.run_dir.parent, timeout=900,
        env={"FINECAP_HOME": str(demo.home)})  # fmt: skip


def own_copy(demo: QuickDemo, folder: Path, monkeypatch: pytest.MonkeyPatch) -> QuickDemo:
    """A copy of ``demo``'s run folder in ``folder`` for a test that runs more stages into it (the shared run is
    read by tests on the other worker meanwhile), with ``FINECAP_HOME`` set to the demo's home, where its world and
    world encoder are: the copy's finished stages are reused, as in the demo's own folder (their fingerprints
    name contents, not paths)."""
    run_dir = folder / "run"
    shutil.copytree(demo.run_dir, run_dir, symlinks=True)
    monkeypatch.setenv("FINECAP_HOME", str(demo.home))
    return QuickDemo(run_dir, demo_argv(run_dir), demo.home, demo.venv)
