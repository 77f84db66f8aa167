"""What importing finecap runs needs only what ``pip install finecap`` installs: every third-party module a module of
finecap imports when it is imported (at module level, outside ``if TYPE_CHECKING:`` and outside a ``try`` that
catches the ``ImportError``) comes from a distribution pyproject.toml's ``dependencies`` name themselves, not one that
arrives only because a dependency requires it (markupsafe through jinja2: a dependency may drop it). An extra's
package (datasets, flask, starlette, vllm, ...) is imported inside the function that needs it, or behind a ``try``
that raises :class:`~finecap.utils.system.MissingExtra` naming the extra; and every module finecap imports anywhere
(lazily too: pyarrow, werkzeug, huggingface_hub) comes from a distribution the dependencies or an extra name.

The test environment holds every extra (``make install``: ``.[test]``), and the wheel's virtualenv of
tests/repo/test_wheel.py sees it too (helpers/wheel.py), so an import of an extra's package at module level would pass
every other test and break ``import`` for a user; this test reads the source instead (``ast``) and the installed
distributions' metadata (:mod:`importlib.metadata`) for which distribution provides a module. Which extra a lazily
imported package belongs in is pyproject.toml's comments' business, not this test's.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "finecap"


def declared() -> dict[str, set[str]]:
    """The canonical names of the distributions pyproject.toml names itself, each with where: ``dependencies`` (the
    core: what ``pip install finecap`` installs) or the names of the extras (finecap's own ``finecap[...]`` left
    out)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    places: dict[str, set[str]] = {}
    for place, lines in [("dependencies", project["dependencies"]), *project["optional-dependencies"].items()]:
        for req in map(Requirement, lines):
            if canonicalize_name(req.name) != "finecap":
                places.setdefault(canonicalize_name(req.name), set()).add(place)
    return places


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


def all_modules(tree: ast.Module) -> set[str]:
    """The top-level names of every module ``tree`` imports absolutely, wherever (functions, guarded blocks)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def third_party(modules: set[str]) -> set[str]:
    return {m for m in modules if m not in sys.stdlib_module_names and m not in ("finecap", "__future__")}


def distributions(module: str, providers: Mapping[str, list[str]]) -> set[str]:
    """The canonical names of the installed distributions providing ``module``; one not installed here (vllm, in a
    virtualenv of its own) by its own name."""
    return {canonicalize_name(d) for d in providers.get(module, [module])}


def imports_outside(places: set[str], modules_of: Callable[[ast.Module], set[str]]) -> dict[str, list[str]]:
    """``{module: [files]}`` of the third-party modules that ``modules_of`` finds in finecap's files and that no
    distribution of ``places`` (canonical names) provides."""
    providers = metadata.packages_distributions()
    outside: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        for module in third_party(modules_of(ast.parse(path.read_text(encoding="utf-8")))):
            if not distributions(module, providers) & places:
                outside.setdefault(module, []).append(str(path.relative_to(ROOT)))
    return outside


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


def test_all_modules_sees_lazy_and_guarded_imports():
    source = (
        "import os\nfrom . import x\ndef f():\n    from werkzeug.serving import y\n"
        "try:\n    import flask\nexcept ImportError:\n    pass\n"
    )
    assert third_party(all_modules(ast.parse(source))) == {"werkzeug", "flask"}


def test_finecap_imports_only_core_dependencies_when_imported():
    places = declared()
    core = {name for name, where in places.items() if "dependencies" in where}
    assert {"torch", "transformers", "numpy", "jinja2"} <= core
    assert "datasets" not in core and "flask" not in core  # extras (hf, review) are not in it
    outside = imports_outside(core, import_time_modules)
    assert outside == {}, (
        f"imported when finecap's modules are, but no core dependency pyproject.toml names: {outside}"
    )


def test_every_module_finecap_imports_is_a_declared_dependency():
    # pyarrow, werkzeug and huggingface_hub were imported (lazily) and markupsafe at import, each arriving only as
    # another dependency's (datasets', flask's, transformers', jinja2's), which may stop requiring it
    outside = imports_outside(set(declared()), all_modules)
    assert outside == {}, f"imported by finecap, but in neither dependencies nor an extra of pyproject.toml: {outside}"
