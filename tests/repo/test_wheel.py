"""A wheel of finecap, installed into a fresh virtualenv without the source tree on the path, runs the demo: the
recipes ship inside the package and nothing reads files from the repository.

The new virtualenv gets the heavy dependencies (torch, transformers, ...) from this environment's site-packages
through a path entry in a ``.pth`` file: ``.pth`` files inside a directory added that way are not processed, so
this environment's *editable* finecap (an import hook installed by its own ``.pth``) stays invisible, and the test
checks that ``finecap`` is imported from the new virtualenv.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(cmd: list, cwd: Path, timeout: int = 600) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS="2", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"{cmd}: {proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.slow
def test_wheel_installs_and_runs_the_quick_demo(tmp_path):
    wheels = tmp_path / "wheels"
    # built from a copy of what a clone holds: an in-tree build/ left by an earlier build would ship modules since
    # deleted from src/ (setuptools reuses build/lib without cleaning it)
    tree = tmp_path / "tree"
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        tree.mkdir(exist_ok=True)
        shutil.copy2(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", wheels, tree],
        cwd=tmp_path)  # fmt: skip
    (wheel,) = wheels.glob("finecap-*.whl")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    own = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp_path).strip())
    (own / "parent_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel], cwd=tmp_path)

    work = tmp_path / "elsewhere"  # not the repository: nothing can be found relative to the working directory
    work.mkdir()
    where = run([python, "-c", "import finecap; print(finecap.__file__)"], cwd=work).strip()
    assert where.startswith(str(env_dir)) and not where.startswith(str(ROOT)), where
    listing = run([env_dir / "bin" / "finecap", "recipes"], cwd=work)
    assert "demo/mle" in listing and "coco/smile_clipcap" in listing
    run([env_dir / "bin" / "finecap", "demo", "--quick", "--run-dir", work / "run", f"world.out={work / 'world'}",
         f"run.cache_dir={work / 'cache'}"], cwd=work, timeout=900)  # fmt: skip
    table = (work / "run" / "results.md").read_text()
    assert "| mle |" in table and "| smile |" in table


def test_the_license_is_declared_as_setuptools_will_keep_building_it():
    """``project.license`` as a table is deprecated by setuptools (builds stop being supported after 2027-02-18): an
    SPDX expression and ``license-files``, with a setuptools that reads them (77 and later)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "MIT" and project["project"]["license-files"] == ["LICENSE"]
    assert "setuptools>=77" in project["build-system"]["requires"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
