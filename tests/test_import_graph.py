"""The package's import graph, read from the source with ``ast``: no import cycles, and arrows from the application
layer (``finecap.app``) down into the library, never back.

Edges are every ``import`` / ``from ... import`` of a ``finecap`` module anywhere in a module (at module level and
inside functions and methods alike: a deferred import still ties the two modules together), except in
``if TYPE_CHECKING:`` blocks, which never run. Importing ``finecap.a.b`` also runs the package ``finecap.a``, so the
edge goes to the package too (unless the importer lives in it: a package is initialised before its own modules).
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
APP = "finecap.app"
# Modules that may import the application layer: the layer itself and `python -m finecap`.
APP_LAYER = (APP, "finecap.__main__")
# A registry entry naming an import path ("pkg.module:attr"), resolved when looked up.
DOTTED = re.compile(r"^(finecap(?:\.\w+)+):\w+$")


@functools.cache
def module_files() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "finecap").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` (their ``else`` branches do run)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def imported_names(name: str, path: Path) -> set[str]:
    """Dotted names a module imports (``from a import b`` gives ``a`` and ``a.b``; relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """``{module: finecap modules it imports}`` over the whole package."""
    files = module_files()
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        own_packages = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        edges = set()
        for target in imported_names(name, path):
            parts = target.split(".")
            for i in range(2, len(parts) + 1):  # the target and the packages it runs on the way
                module = ".".join(parts[:i])
                if module in files and module != name and module not in own_packages:
                    edges.add(module)
        graph[name] = edges
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a closed path) per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(component, graph) for component in components]


def _cycle_in(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A closed path ``[a, b, ..., a]`` inside a strongly connected component (breadth-first back to the start)."""
    members, start = set(component), component[0]
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if w not in parents:
                    parents[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{component} is not strongly connected")


# --------------------------------------------------------------------------------------------------------------------
# The checks of the helpers themselves, on hand-made graphs
# --------------------------------------------------------------------------------------------------------------------


def test_find_cycles_reports_a_closed_path():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_imported_names_sees_function_bodies_and_skips_type_checking(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import sibling\n"
        "if TYPE_CHECKING:\n    from finecap.config import Config\n"
        "else:\n    import finecap.utils\n"
        "def f():\n    from finecap.models.retriever import Retriever\n"
    )
    names = imported_names("finecap.data.m", path)
    assert {"finecap.data", "finecap.data.sibling", "finecap.utils", "finecap.models.retriever"} <= names
    assert "finecap.config" not in names


# --------------------------------------------------------------------------------------------------------------------
# The package
# --------------------------------------------------------------------------------------------------------------------


def test_graph_covers_the_package():
    graph = import_graph()
    assert {"finecap.app.cli", "finecap.config", "finecap.metrics.suite"} <= set(graph)
    assert "finecap.config" in graph["finecap.app.cli"]


def test_no_import_cycles():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join("  " + " -> ".join(c) for c in cycles)


@pytest.mark.parametrize("module", sorted(m for m in module_files() if not m.startswith(APP_LAYER)))
def test_library_never_imports_the_application(module):
    path = module_files()[module]
    imports = sorted(m for m in import_graph()[module] if m.startswith(APP))
    assert not imports, f"library module {module} imports the application layer: {imports}"
    # Registry entries ("pkg.module:factory") are imports that happen later; they point down too.
    named = sorted(
        node.value
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and DOTTED.match(node.value)
        and DOTTED.match(node.value).group(1).startswith(APP)
    )  # fmt: skip
    assert not named, f"library module {module} names the application layer: {named}"
