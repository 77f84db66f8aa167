"""finecap as a user installs it: a wheel built from a copy of the source tree, installed into a fresh virtualenv
without the source tree on the path (tests/repo/test_wheel.py checks where it imports from; the quick demo the
tests share, ``quick_demo_run`` in tests/conftest.py, is run by it).

The new virtualenv gets the heavy dependencies (torch, transformers, ...) from this environment's site-packages
through a path entry in a ``.pth`` file: ``.pth`` files inside a directory added that way are not processed, so
this environment's *editable* finecap (an import hook installed by its own ``.pth``) stays invisible.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(cmd: list, cwd: Path, timeout: int = 600, env: dict[str, str] | None = None) -> str:
    """``cmd`` run as a user's shell would, without this environment's ``PYTHONPATH`` and ``VIRTUAL_ENV``
    (``env``: more variables); its stdout, one torch thread (the other core runs the other test worker: conftest.py).
    A failure fails the test with the end of its stderr."""
    full = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    full.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **(env or {}))
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full)
    assert proc.returncode == 0, f"{cmd}: {proc.stderr[-3000:]}"
    return proc.stdout


def venv_in(out: Path) -> Path:
    """The virtualenv :func:`install_wheel` makes in ``out``."""
    return out / "venv"


def source_tree(tree: Path) -> Path:
    """A copy, at ``tree``, of what a clone holds that a build reads (no ``build/``, ``*.egg-info`` or caches of this
    checkout's): pyproject.toml, the in-tree build backend (build_backend/), README, LICENSE, MANIFEST.in and src/."""
    tree.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy2(ROOT / name, tree / name)
    for folder in ("build_backend", "src"):
        shutil.copytree(ROOT / folder, tree / folder, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return tree


def build_wheel(tree: Path, wheels: Path) -> Path:
    """The wheel ``pip wheel`` builds of the source tree ``tree`` into the folder ``wheels`` (this environment's
    setuptools: no build isolation, no network)."""
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", wheels, tree],
        cwd=tree.parent)  # fmt: skip
    (wheel,) = wheels.glob("finecap-*.whl")
    return wheel


def install_wheel(out: Path) -> Path:
    """Build finecap's wheel and install it into the new virtualenv :func:`venv_in` ``out``; returns it."""
    wheel = build_wheel(source_tree(out / "tree"), out / "wheels")
    env_dir = venv_in(out)
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    own = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=out).strip())
    (own / "parent_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel], cwd=out)
    return env_dir
