"""The docstring examples run: pytest collects them in a run of their own (``make doctest``: ``--doctest-modules``
over ``src/finecap``, which ``make test`` runs), and none is wholly skipped, so an example shows what the code
computes, not what someone once wrote (the names they use come from the root ``conftest.py``'s
``doctest_namespace``)."""

from __future__ import annotations

import ast
import doctest
import shlex
import tomllib
from pathlib import Path

from helpers.makefile import make_target

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "finecap"


def docstrings(path: Path) -> list[tuple[str, int, str]]:
    """``(name, line, docstring)`` of the module, classes and functions of the Python file at ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in [tree, *ast.walk(tree)]:
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            text = ast.get_docstring(node, clean=False)
            if text:
                out.append((getattr(node, "name", "<module>"), getattr(node, "lineno", 1), text))
    return out


def wholly_skipped(text: str) -> bool:
    """True when ``text`` has examples and every one is marked ``+SKIP``."""
    examples = doctest.DocTestParser().get_examples(text)
    return bool(examples) and all(e.options.get(doctest.SKIP) for e in examples)


def test_wholly_skipped_is_recognised():
    # the check itself: one runnable example is enough; examples that are all skipped are caught
    assert wholly_skipped(">>> f()  # doctest: +SKIP\n1\n>>> g()  # doctest: +SKIP\n")
    assert not wholly_skipped(">>> f()  # doctest: +SKIP\n>>> g()\n2\n")
    assert not wholly_skipped("no example here")


def test_no_docstring_has_only_skipped_examples():
    found = [
        f"{path.relative_to(ROOT)}:{line} {name}"
        for path in sorted(SRC.rglob("*.py"))
        for name, line, text in docstrings(path)
        if wholly_skipped(text)
    ]
    assert found == [], (
        "examples that never run (give them a fixture in conftest.py's doctest_namespace):\n" + "\n".join(found)
    )


def test_docstring_examples_are_collected():
    # their own run (make doctest) over the whole package, which make test runs after the suite
    (line,) = [line for line in make_target("doctest") if " pytest" in line]
    args = shlex.split(line.split(" pytest", 1)[1])
    assert "--doctest-modules" in args and args[-1] == "src/finecap", args
    assert "$(MAKE) --no-print-directory doctest" in make_target("test")
    # and only there: in the suite's options they would collect every folder's conftest.py as one module `conftest`
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "--doctest-modules" not in shlex.split(options["addopts"]), options["addopts"]
