"""What importing finecap runs needs only what ``pip install finecap`` installs: every third-party module a module of
finecap imports when it is imported (at module level, outside ``if TYPE_CHECKING:`` and outside a ``try`` that
catches the ``ImportError``) comes from a distribution of the core dependencies (pyproject.toml's ``dependencies``
and what they require in turn). An extra's package (datasets, flask, starlette, vllm, ...) is imported inside the
function that needs it, or behind a ``try`` that raises :class:`~finecap.utils.system.MissingExtra` naming the extra.

The test environment holds every extra (``make install``: ``.[test]``), and the wheel's virtualenv of
tests/repo/test_wheel.py sees it too (helpers/wheel.py), so an import of an extra's package at module level would pass
every other test and break ``import`` for a user; this test reads the source instead (``ast``) and the installed
distributions' metadata (:mod:`importlib.metadata`) for which distribution provides a module.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "finecap"


def core_closure() -> set[str]:
    """The canonical names of the core dependencies and, recursively, of what they require without extras (markers
    evaluated for this interpreter): what ``pip install finecap`` installs."""
    todo = [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        try:
            todo += [Requirement(r) for r in metadata.requires(req.name) or []]
        except metadata.PackageNotFoundError:  # an optional platform dependency not installed here
            continue
    return seen


def catches_import_error(node: ast.Try) -> bool:
    names = {"ImportError", "ModuleNotFoundError", "Exception"}
    return any(h.type is None or any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(h.type))
               for h in node.handlers)  # fmt: skip


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_time_modules(tree: ast.Module) -> set[str]:
    """The top-level names of the modules ``tree`` imports when it is imported, unguarded: module-level statements
    and class bodies, not functions, not ``if TYPE_CHECKING:``, not a ``try`` body whose handlers catch the
    ``ImportError``."""
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
            elif isinstance(node, ast.If):
                if not is_type_checking(node):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                if not catches_import_error(node):
                    visit(node.body)
                for h in node.handlers:
                    visit(h.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.ClassDef | ast.With):
                visit(node.body)

    visit(tree.body)
    return found


def test_import_time_modules_sees_what_runs_on_import():
    source = (
        "import os, numpy.linalg\nfrom yaml import safe_load\nfrom . import x\n"
        "if TYPE_CHECKING:\n    import datasets\n"
        "try:\n    import flask\nexcept ImportError:\n    flask = None\n"
        "try:\n    import uvicorn\nfinally:\n    pass\n"
        "def f():\n    import vllm\n"
        "class C:\n    import starlette\n"
    )
    assert import_time_modules(ast.parse(source)) == {"os", "numpy", "yaml", "uvicorn", "starlette"}


def test_finecap_imports_only_core_dependencies_when_imported():
    core = core_closure()
    assert {"torch", "transformers", "numpy", "markupsafe"} <= core  # markupsafe: jinja2's, in turn
    assert "datasets" not in core and "flask" not in core  # extras (hf, review) are not in it
    providers = metadata.packages_distributions()
    outside: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        for module in import_time_modules(ast.parse(path.read_text(encoding="utf-8"))):
            if module in sys.stdlib_module_names or module in ("finecap", "__future__"):
                continue
            dists = {canonicalize_name(d) for d in providers.get(module, [])}
            if not dists & core:
                outside.setdefault(module, []).append(str(path.relative_to(ROOT)))
    assert outside == {}, f"imported when finecap's modules are, but in no core dependency: {outside}"
