"""A wheel of finecap, installed into a fresh virtualenv without the source tree on the path
(:mod:`helpers.wheel`), runs the demo: the recipes ship inside the package and nothing reads files from the
repository. The quick demo is the session's shared one (``quick_demo_run``, tests/conftest.py: run by this wheel),
whose contents tests/app/test_demo.py checks; here, that it ran from the wheel.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from helpers.wheel import build_wheel, run, source_tree

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_installs_and_runs_the_quick_demo(installed_finecap, quick_demo_run, tmp_path):
    work = tmp_path / "elsewhere"  # not the repository: nothing can be found relative to the working directory
    work.mkdir()
    python = installed_finecap / "bin" / "python"
    where = run([python, "-c", "import finecap; print(finecap.__file__)"], cwd=work).strip()
    assert where.startswith(str(installed_finecap)) and not where.startswith(str(ROOT)), where
    listing = run([installed_finecap / "bin" / "finecap", "recipes"], cwd=work)
    assert "demo/mle" in listing and "coco/smile_clipcap" in listing
    assert quick_demo_run.venv == installed_finecap  # the shared quick demo: this virtualenv's `finecap` ran it
    table = (quick_demo_run.run_dir / "results.md").read_text()
    assert "| mle |" in table and "| smile |" in table


def test_the_license_is_declared_as_setuptools_will_keep_building_it():
    """``project.license`` as a table is deprecated by setuptools (builds stop being supported after 2027-02-18): an
    SPDX expression and ``license-files``, with a setuptools that reads them (77 and later)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "MIT" and project["project"]["license-files"] == ["LICENSE"]
    assert "setuptools>=77" in project["build-system"]["requires"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")


# The lowest version of a dependency that finecap was seen to run on (what a researcher's existing environment may
# hold, and pip then keeps): `finecap demo --quick` from the wheel, without torchvision (no dependency of finecap's).
# transformers 5.17 stops there (AutoImageProcessor needs torchvision to build CLIP's) and 4.46, the floor declared
# before, at ``import transformers.video_processing_utils`` (review of 2026-11-27, a throwaway venv per version).
RAN_ON = {"transformers": "5.18"}


def test_the_torch_floor_has_the_apis_finecap_calls_unconditionally():
    # torch>=2.1 was declared while finecap calls torch.accelerator (2.6) and FSDP2's public fully_shard (2.6)
    # outside any version check, and torch<2.6's weights_only=True can be bypassed (CVE-2025-32434)
    import tomllib

    from packaging.requirements import Requirement
    from packaging.version import Version

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (torch,) = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "torch"]
    assert min(Version(s.version) for s in torch.specifier if s.operator == ">=") >= Version("2.6")
    source = "\n".join(p.read_text() for p in (ROOT / "src" / "finecap").rglob("*.py"))
    assert "torch.accelerator" in source and "fully_shard" in source  # what makes 2.6 the floor


def test_declared_floors_are_versions_finecap_ran_on():
    import tomllib

    from packaging.requirements import Requirement
    from packaging.version import Version

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors = {}
    for line in project["dependencies"]:
        req = Requirement(line)
        floors[req.name] = min((Version(s.version) for s in req.specifier if s.operator == ">="), default=None)
    for name, version in RAN_ON.items():
        assert floors[name] is not None and floors[name] >= Version(version), (
            f"pyproject.toml: {name} >= {floors[name]} admits versions finecap was not seen to run on (it needs "
            f"{name}>={version})"
        )


def tracked(folder: str) -> list[str]:
    """The files under ``folder`` that a clone holds (``git ls-files``), relative to the repository root."""
    out = subprocess.run(["git", "ls-files", "-z", folder], cwd=ROOT, capture_output=True, text=True, check=True)
    return [p for p in out.stdout.split("\0") if p]


@pytest.mark.slow
def test_the_wheel_ships_every_file_of_the_package_and_nothing_else(installed_finecap):
    # package-data is a list of globs (pyproject.toml): a recipe, template or prompt file added where no glob reaches
    # would be missing from the wheel alone, the tests of the source tree reading it from src/
    (record,) = installed_finecap.glob("lib/python*/site-packages/finecap-*.dist-info/RECORD")
    shipped = {line.split(",")[0] for line in record.read_text().splitlines()}
    shipped = {p for p in shipped if p.startswith("finecap/") and "/__pycache__/" not in p}
    source = {p.removeprefix("src/") for p in tracked("src/finecap")}
    assert source - shipped == set(), "tracked in src/ but not in the wheel (pyproject.toml's package-data)"
    assert shipped - source == set(), "in the wheel but not tracked in src/"
    assert any(p.endswith(".yaml") for p in source) and any(p.endswith(".html") for p in source)  # data files too


def shipped(wheel: Path) -> set[str]:
    return set(zipfile.ZipFile(wheel).namelist())


@pytest.mark.slow
def test_a_second_build_in_one_tree_ships_nothing_deleted_since(tmp_path):
    # setuptools copies src/ into build/lib and never removes from it what src/ lost (pypa/setuptools#1871): a second
    # `pip wheel .` in a clone shipped a module and a recipe deleted after the first. The in-tree backend
    # (build_backend/finecap_build.py) builds each wheel in a fresh temporary folder instead, and writes no build/
    tree = source_tree(tmp_path / "tree")
    package = tree / "src" / "finecap"
    module = min((package / "utils").glob("[!_]*.py"))
    recipe = min((package / "recipes").glob("*/*.yaml"))
    first = shipped(build_wheel(tree, tmp_path / "first"))
    gone = {p.relative_to(tree / "src").as_posix() for p in (module, recipe)}
    assert gone <= first, gone
    module.unlink()
    recipe.unlink()
    second = shipped(build_wheel(tree, tmp_path / "second"))
    assert second == first - gone
    assert not (tree / "build").exists()  # nothing left in the clone to go stale


def test_the_fresh_build_folder_keeps_the_users_own_extra_config(tmp_path, monkeypatch):
    # DIST_EXTRA_CONFIG names the configuration setuptools reads last: a user's own is merged, not replaced
    import configparser
    import importlib

    monkeypatch.syspath_prepend(str(ROOT / "build_backend"))
    backend = importlib.import_module("finecap_build")
    theirs = tmp_path / "theirs.cfg"
    theirs.write_text("[build]\nbuild_base = /their/build\nparallel = 2\n[egg_info]\ntag_build = .dev\n")
    monkeypatch.setenv(backend.EXTRA_CONFIG, str(theirs))
    with backend.fresh_build_base() as folder:
        config = configparser.ConfigParser()
        config.read(os.environ[backend.EXTRA_CONFIG], encoding="utf-8")
        assert {s: dict(config[s]) for s in config.sections()} == {
            "build": {"build_base": str(folder), "parallel": "2"},
            "egg_info": {"tag_build": ".dev"},
        }
        assert folder.parent.is_dir()
    assert os.environ[backend.EXTRA_CONFIG] == str(theirs) and not folder.parent.exists()
    monkeypatch.delenv(backend.EXTRA_CONFIG)
    with backend.fresh_build_base():
        assert backend.EXTRA_CONFIG in os.environ
    assert backend.EXTRA_CONFIG not in os.environ


@pytest.mark.slow
def test_the_sdist_carries_the_build_backend_and_builds_the_wheel(tmp_path):
    # `python -m build` builds the wheel from the sdist: the in-tree backend must travel in it (MANIFEST.in)
    tree = source_tree(tmp_path / "tree")
    code = "import sys; sys.path[:0] = ['build_backend']; import finecap_build as b; print(b.build_sdist(sys.argv[1]))"
    name = run([sys.executable, "-c", code, tmp_path / "sdist"], cwd=tree).strip().splitlines()[-1]
    with tarfile.open(tmp_path / "sdist" / name) as sdist:
        sdist.extractall(tmp_path / "unpacked", filter="data")
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    assert (unpacked / "build_backend" / "finecap_build.py").is_file()
    wheel = shipped(build_wheel(unpacked, tmp_path / "wheels"))
    assert wheel == shipped(build_wheel(tree, tmp_path / "from-tree"))


def written_version() -> str:
    """``finecap.__version__`` as src/finecap/__init__.py writes it, read without importing (the installed finecap
    of a test environment may be another copy)."""
    return re.search(r'^__version__ = "([^"]+)"', (ROOT / "src" / "finecap" / "__init__.py").read_text(), re.M)[1]


@pytest.mark.slow
def test_the_installed_version_is_the_written_one(installed_finecap, tmp_path):
    # `finecap --version` and the wheel's metadata (what pip and importlib.metadata report) of the installed wheel
    python = installed_finecap / "bin" / "python"
    said = run([installed_finecap / "bin" / "finecap", "--version"], cwd=tmp_path)
    meta = run([python, "-c", "from importlib.metadata import version; print(version('finecap'))"], cwd=tmp_path)
    assert (said, meta) == (f"finecap {written_version()}\n", f"{written_version()}\n")


def test_the_version_is_written_once():
    # pyproject.toml, finecap.__version__ and CITATION.cff each wrote it, a test holding them equal: pyproject.toml
    # now reads finecap.__version__ (a static read of the file: setuptools does not import finecap to build)
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "finecap.__version__"}


def test_the_metadata_version_and_the_cited_one_are_finecap_version():
    # the version setuptools puts in the wheel's metadata (pyproject.toml expanded as a build does, without building),
    # finecap.__version__ (`finecap --version`) and CITATION.cff (how to cite: a file citation tools read as it is)
    from setuptools.config.pyprojecttoml import read_configuration

    import finecap

    built = read_configuration(ROOT / "pyproject.toml", expand=True)["project"]["version"]
    cited = re.search(r"^version: (\S+)$", (ROOT / "CITATION.cff").read_text(), re.M)
    assert cited is not None and (built, finecap.__version__, cited[1]) == (written_version(),) * 3


# An install line of an extra: pip install 'finecap[hf]', -e ".[test]", "finecap[vllm-cpu]" in an error message.
EXTRA = re.compile(r"(?:finecap|\.)\[([a-z][a-z0-9_-]*(?:,[a-z][a-z0-9_-]*)*)\]")  # not a regex's .[0-9]


def test_every_extra_named_in_the_docs_and_messages_is_declared():
    import tomllib

    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    files = [p for p in tracked(".") if p.endswith((".md", ".py")) or p in ("Makefile", "CITATION.cff")]
    named: dict[str, set[str]] = {}
    for path in files:
        for match in EXTRA.finditer((ROOT / path).read_text(encoding="utf-8")):
            for extra in match[1].split(","):
                named.setdefault(extra, set()).add(path)
    assert {"hf", "serve", "review", "xlsx", "quant", "vllm", "test"} <= set(named)  # the pattern finds the lines
    undeclared = {extra: sorted(paths) for extra, paths in named.items() if extra not in declared}
    assert undeclared == {}, f"extras not in pyproject.toml's optional-dependencies: {undeclared}"


def test_each_requirement_is_written_once_and_extras_name_each_other():
    # the test extra repeated the pins of hf, trl, quant, serve and review (and trl hf's datasets): a pin raised in one
    # place would leave `make install` testing another floor than the extra gives a user
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    places: dict[str, list[str]] = {}
    for place, lines in [("dependencies", project["dependencies"]), *extras.items()]:
        for req in map(Requirement, lines):
            if canonicalize_name(req.name) == "finecap":
                assert req.extras and req.extras <= set(extras) - {place}, f"{place}: {req} names no other extra"
            else:
                places.setdefault(canonicalize_name(req.name), []).append(place)
    assert {name: where for name, where in places.items() if len(where) > 1} == {}
    assert "finecap[hf,quant,review,serve,trl,xlsx]" in {str(r) for r in map(Requirement, extras["test"])}
