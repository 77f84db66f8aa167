"""The two test commands: plain ``pytest`` is the fast suite (tests marked slow left out), and ``make test``, which
CI runs (``.ci/run``), runs every test, slow ones included, so CI cannot silently drop them. Checked by running
pytest with the repository's configuration on a two-test file, one test marked slow."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from helpers.makefile import make_target, make_variable

ROOT = Path(__file__).resolve().parents[2]
TWO_TESTS = """import pytest


def test_fast():
    pass


@pytest.mark.slow
def test_slow():
    pass
"""


def make_test_pytest_args() -> list[str]:
    """The arguments ``make test`` gives pytest (up to the end of its command: the recipe's shell goes on after)."""
    (line,) = [line for line in make_target("test") if " pytest" in line]
    return shlex.split(line.split(" pytest", 1)[1].split(";", 1)[0])


def collected(tmp_path: Path, args: list[str]) -> set[str]:
    """The test names pytest, run with the repository's configuration and ``args``, selects in a two-test file."""
    (tmp_path / "test_two.py").write_text(TWO_TESTS)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
         "-p", "no:cacheprovider", "--collect-only", *args, str(tmp_path / "test_two.py")],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return set(re.findall(r"(?:::|<Function )(test_\w+)", proc.stdout))  # node ids (-q) or the tree (no -q)


def test_plain_pytest_leaves_the_slow_tests_out(tmp_path):
    assert collected(tmp_path, []) == {"test_fast"}


def test_make_test_runs_the_slow_tests_too(tmp_path):
    args = make_test_pytest_args()
    assert collected(tmp_path, args) == {"test_fast", "test_slow"}, args


def test_ci_runs_make_test():
    commands = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and line[0] != "#"]
    assert "make test" in commands, commands


def test_readme_documents_both_commands():
    readme = (ROOT / "README.md").read_text()
    development = readme.split("## Development", 1)[1].split("\n## ", 1)[0]
    assert "make test" in development and re.search(r"^\S*pytest\b", development, re.M), development


def test_make_vllm_test_runs_every_vllm_test_file_once_the_costliest_first():
    """``make vllm-test`` names its files (VLLM_FIRST, then the rest of ``tests/engines/test_vllm_*.py``): a file
    added there is run, none twice, and a file VLLM_FIRST names exists (a renamed one would drop out unseen)."""
    files = make_variable("VLLM_FILES").split()
    first = make_variable("VLLM_FIRST").split()
    every = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "engines").glob("test_vllm_*.py"))
    assert first and files[: len(first)] == first and all((ROOT / f).is_file() for f in first)
    assert sorted(files) == every and len(set(files)) == len(files)


def test_make_adapters_installs_each_framework_as_the_docs_say():
    """docs/integrations.md tells a reader how each framework installs on a CPU; ``make test-adapters`` must install
    it the same way. They drifted once: the Makefile asked pip for OpenRLHF with its requirements (flash-attn, whose
    build needs CUDA), the docs said ``--no-deps``, and the OpenRLHF test skipped where it could run."""
    bare_names = set(make_variable("ADAPTERS_NO_DEPS").split())
    made = {}
    for pair in make_variable("ADAPTERS").split():
        names = pair.split(":", 1)[0].split("+")
        made[names[0]] = ({n for n in names if n not in bare_names}, {n for n in names if n in bare_names})
    documented = {}
    for row in (ROOT / "docs" / "integrations.md").read_text().splitlines():
        cells = [c.strip() for c in row.split("|")]
        if len(cells) < 4 or not re.fullmatch(r"(verl|ms-swift|OpenRLHF) [\d.]+", cells[1]):
            continue
        deps, bare = set(), set()
        for command in re.findall(r"`pip install ([^`]+)`", cells[2]):
            words = command.split()
            (bare if "--no-deps" in words else deps).update(w for w in words if not w.startswith("-"))
        documented[cells[1].split()[0].lower()] = (deps, bare)
    assert documented == made


def test_a_torch_build_of_another_index_is_given_its_index():
    """``make install`` passes ``TORCH`` to pip as one requirement, and PyPI holds no local versions (``+cu128``,
    ``+rocm6.4``): README.md told a GPU user ``make install TORCH="torch==2.13.0+cu128"``, which pip cannot find there.
    Every such override the docs or the Makefile show names the index it comes from (``PIP_EXTRA_INDEX_URL``, which
    pip reads from the environment) just before it."""
    pages = [ROOT / "Makefile", ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
    shown = 0
    for page in pages:
        text = page.read_text()
        for match in re.finditer(r'TORCH="?torch==[^"\s]*\+(?:cu|rocm)\w*', text):
            shown += 1
            before = text[max(0, match.start() - 200) : match.start()]
            line = text.count("\n", 0, match.start()) + 1
            assert re.search(r"PIP_(EXTRA_)?INDEX_URL=https://download\.pytorch\.org/", before), f"{page.name}:{line}"
    assert shown, "no TORCH override of another build is shown any more: drop this test"


def test_make_bytecode_names_a_file_that_does_not_compile(tmp_path):
    """``make bytecode`` (before ``make test``, ``test-fast`` and ``doctest``) stops the run at a file that does not
    compile; it must say which: compileall prints the error on its standard output, which the recipe once sent to
    /dev/null, so make said only ``[Makefile:118: bytecode] Error 1``."""
    for folder in ("src", "tests", "benchmarks"):
        (tmp_path / folder).mkdir()
    (tmp_path / "conftest.py").write_text("")
    (tmp_path / "tests" / "test_broken.py").write_text("def test_broken(:\n    pass\n")
    (recipe,) = make_target("bytecode")
    command = recipe.removeprefix("@").replace("$(BIN)/python", shlex.quote(sys.executable))
    proc = subprocess.run(command, shell=True, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode != 0
    assert "test_broken.py" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
