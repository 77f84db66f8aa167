"""The package's import graph, read from the source with ``ast``: no import cycles, the library in a declared order of
layers with at most :data:`MAX_UPWARD` imports from a lower layer up to a higher one (each listed with its reason), and
arrows from the application layer (``finecap.app``) down into the library, never back.

Edges are every ``import`` / ``from ... import`` of a ``finecap`` module anywhere in a module: at module level,
inside functions and methods (a deferred import still ties the two modules together) and in ``if TYPE_CHECKING:``
blocks (a type-only import is a dependency of the code's meaning and of every type checker's run, and a circle of
them is a circle a reader must untangle). Importing ``finecap.a.b`` also runs the package ``finecap.a``, so the edge
goes to the package too (unless the importer lives in it: a package is initialised before its own modules).
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
APP = "finecap.app"
# Modules that may import the application layer: the layer itself and `python -m finecap`.
APP_LAYER = (APP, "finecap.__main__")
# A registry entry naming an import path ("pkg.module:attr"), resolved when looked up.
DOTTED = re.compile(r"^(finecap(?:\.\w+)+):\w+$")

# The library's floors, bottom first (docs/architecture.md, the layout of the design): a module may import its own
# floor and those below. Each entry names packages or modules (a package covers its modules); every module of finecap
# must be on one floor, so a new top-level module is placed here on purpose.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # Nothing of the library's concepts: helpers, name tables, the configuration's types and loading, the finecap
    # home and the run-directory layout, locks and output files, the one-line messages of known errors.
    ("bottom floor", ("finecap.utils", "finecap.registry", "finecap.recipes", "finecap.config", "finecap.home",
                      "finecap.runs", "finecap.locks", "finecap.outputs", "finecap.library_warnings",
                      "finecap.errors")),
    ("world", ("finecap.world",)),
    ("data", ("finecap.data",)),
    ("decode", ("finecap.decode",)),  # the captioners' Stepper contract and the decoding loops over it
    ("models", ("finecap.models",)),
    ("engines", ("finecap.engines",)),  # generation engines serving a captioner (vLLM), which rollouts will use
    ("judges", ("finecap.judges",)),  # what judge-backed rewards and metrics ask (the world judge reads the world)
    # Metrics sit below the training components: CIDEr-D's reward is the metric's n-gram code, the exploration
    # objective's diversity is the metric's.
    ("metrics", ("finecap.metrics",)),
    ("compat", ("finecap.compat",)),  # other tools' interfaces to the metrics (pycocoevalcap's scorer classes)
    ("contract", ("finecap.contract",)),  # what the engine hands objectives and rewards
    ("rewards", ("finecap.rewards",)),
    ("objectives", ("finecap.objectives",)),  # REINFORCE scores samples with the rewards
    ("caption", ("finecap.caption",)),  # the captioning loop, which training's validators run
    ("train", ("finecap.train",)),
    # the stage runner (training runs and what is made of them), the reward server and the trainers' adapters
    # the openai judge talks through boost's client (found by name from the JUDGES table, imported by no one)
    ("uses of trained models", ("finecap.inference", "finecap.boost", "finecap.integrations", "finecap.report",
                                "finecap.stages", "finecap.serve", "finecap.judges.openai",
                                "finecap.judges.vllm")),
    ("api", ("finecap.api", "finecap")),
    ("application", (APP, "finecap.__main__")),
]  # fmt: skip
MAX_UPWARD = 3
"""At most this many imports from a lower floor up to a higher one, each in :data:`UPWARD`."""
UPWARD: dict[tuple[str, str], str] = {
    ("finecap.home", "finecap.world.key"): "the home names a world's folder by the world's content key "
    "(home.world_path); world.key is that hash alone and imports no finecap module at run time",
    ("finecap.data.bags", "finecap.models.retriever"): "BagCurri's neighbour table (data.bags.neighbour_table) embeds "
    "the training images with the configured retriever, TrueMatch's Algorithm 1, when the sampler is built",
}
"""The imports allowed to point up, each with its reason: ``{(importer, imported): why}``."""


@functools.cache
def module_files() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "finecap").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imported_names(name: str, path: Path) -> set[str]:
    """Dotted names a module imports, type-only imports included (``from a import b`` gives ``a.b``, which is the
    module ``a.b`` or the name ``b`` of the module ``a``; relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def imported_module(target: str, files: dict[str, Path]) -> str | None:
    """The finecap module an imported name lives in (its longest prefix that is a module), or None."""
    parts = target.split(".")
    for i in range(len(parts), 1, -1):
        if ".".join(parts[:i]) in files:
            return ".".join(parts[:i])
    return None


@functools.cache
def direct_imports() -> dict[str, set[str]]:
    """``{module: finecap modules it names in an import}``: the modules themselves, not the packages run on the way
    (what the layer order is checked on)."""
    files = module_files()
    out = {}
    for name, path in files.items():
        targets = {imported_module(t, files) for t in imported_names(name, path)}
        out[name] = {t for t in targets if t is not None and t != name}
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


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of the floor ``module`` is on (its longest listed prefix), or None. The entry
    ``finecap`` is the package's own ``__init__`` only, not a prefix of every module."""
    best: tuple[int, int] | None = None  # (length of the matching entry, floor)
    for floor, (_, members) in enumerate(LAYERS):
        for member in members:
            covers = module == member or (member != "finecap" and module.startswith(member + "."))
            if covers and (best is None or len(member) > best[0]):
                best = (len(member), floor)
    return None if best is None else best[1]


def upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """``(importer, imported)`` for every import from a lower floor up to a higher one."""
    return {(m, t) for m, targets in graph.items() for t in targets if layer_of(t) > layer_of(m)}


# --------------------------------------------------------------------------------------------------------------------
# The checks of the helpers themselves, on hand-made graphs
# --------------------------------------------------------------------------------------------------------------------


def test_find_cycles_reports_a_closed_path():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_imported_names_sees_function_bodies_and_type_checking_blocks(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import sibling\n"
        "if TYPE_CHECKING:\n    from finecap.config import Config\n"
        "else:\n    import finecap.utils\n"
        "def f():\n    from finecap.models.retriever import Retriever\n"
    )
    names = imported_names("finecap.data.m", path)
    assert {
        "finecap.data.sibling",
        "finecap.utils",
        "finecap.models.retriever.Retriever",
        "finecap.config.Config",
    } <= names
    files = {n: Path() for n in ("finecap.config", "finecap.models", "finecap.models.retriever", "finecap.utils")}
    assert imported_module("finecap.models.retriever.Retriever", files) == "finecap.models.retriever"
    assert imported_module("finecap.config.Config", files) == "finecap.config"
    assert imported_module("finecap.nowhere", files) is None


def test_layer_of_takes_the_longest_listed_prefix():
    assert LAYERS[layer_of("finecap.models.retriever")][0] == "models"
    assert LAYERS[layer_of("finecap.app.cli")][0] == "application"
    assert LAYERS[layer_of("finecap")][0] == "api"  # the package's own __init__, not everything under it
    assert layer_of("finecap.runs") < layer_of("finecap.world.key") < layer_of("finecap.data.bags")
    assert layer_of("numpy") is None and layer_of("finecap.unplaced") is None
    graph = {"finecap.home": {"finecap.world.key", "finecap.utils"}, "finecap.world.key": {"finecap.config"}}
    assert upward_imports(graph) == {("finecap.home", "finecap.world.key")}


# --------------------------------------------------------------------------------------------------------------------
# The package
# --------------------------------------------------------------------------------------------------------------------


def test_graph_covers_the_package():
    graph = import_graph()
    assert {"finecap.app.cli", "finecap.config", "finecap.metrics.suite"} <= set(graph)
    assert "finecap.config" in graph["finecap.app.cli"]


def test_every_module_is_on_a_floor():
    unplaced = sorted(m for m in module_files() if layer_of(m) is None)
    assert not unplaced, f"modules on no floor of LAYERS (place them): {unplaced}"


def test_imports_point_down_the_floors():
    """Every import goes to the importer's floor or one below, except those listed in :data:`UPWARD`, at most
    :data:`MAX_UPWARD` of them; an exception no longer taken is removed from the list."""
    assert len(UPWARD) <= MAX_UPWARD
    found = upward_imports(direct_imports())
    floors = {m: LAYERS[layer_of(m)][0] for pair in found for m in pair}
    new = sorted(found - set(UPWARD))
    assert not new, "imports up the floors of LAYERS:\n" + "\n".join(
        f"  {a} ({floors[a]}) -> {b} ({floors[b]})" for a, b in new
    )
    stale = sorted(set(UPWARD) - found)
    assert not stale, f"UPWARD lists imports the code no longer makes (remove them): {stale}"


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


# --------------------------------------------------------------------------------------------------------------------
# Commands call the library, never each other
# --------------------------------------------------------------------------------------------------------------------

CLI = "finecap.app.cli"
COMMANDS_CALLING_COMMANDS: dict[tuple[str, str], str] = {
    ("finecap.app.demo", "finecap.app.bags"): "the demo's stages build TrueMatch bags with the bags command's main",
    ("finecap.app.demo", "finecap.app.report"): "the demo ends by writing the report with the report command's main",
    ("finecap.app.demo_vcb", "finecap.app.bags"): "the VCB stage builds its bags with the bags command's main",
    ("finecap.app.demo_vcb", "finecap.app.boost"): "the VCB stage boosts the world with the boost command's main",
    ("finecap.app.demo_transfer", "finecap.app.bags"): "the transfer stage builds bags with the bags command's main",
    ("finecap.app.demo_families", "finecap.app.bags"): "the family world's bags come from the bags command's main",
}
"""Imports of a command module by another module of ``finecap.app`` still made, each with what it takes; the
demo's stages still run three commands' ``main`` (bags, boost, report) until their work moves into the library.
Nothing may be added here."""


def command_modules() -> set[str]:
    """The modules of ``finecap.app`` that are commands: those :mod:`finecap.app.cli` dispatches to (it imports each
    command's module in the function that runs it)."""
    return {m for m in direct_imports()[CLI] if m.startswith(APP + ".")}


def test_commands_are_the_modules_the_cli_dispatches_to():
    commands = command_modules()
    assert {"finecap.app.serve_reward", "finecap.app.caption", "finecap.app.demo", "finecap.app.report"} <= commands
    assert not commands & {"finecap.app.demo_vcb", "finecap.app.demo_families"}  # the demo's helpers, no commands
    assert "finecap.app.train" not in module_files()  # `finecap train` calls the library (finecap.train.run)


def test_no_app_module_imports_another_command():
    """A module of ``finecap.app`` (a command or a helper of one) imports no command module but its own: what two
    commands share is in the library (or a helper module of ``finecap.app`` that is no command). Only the pairs of
    :data:`COMMANDS_CALLING_COMMANDS` are left, and one no longer made must be struck from it."""
    commands = command_modules()
    found = {
        (m, t)
        for m, targets in direct_imports().items()
        if m.startswith(APP + ".") and m != CLI
        for t in targets
        if t in commands and t != m
    }
    new = sorted(found - set(COMMANDS_CALLING_COMMANDS))
    assert not new, "app modules importing another command module:\n" + "\n".join(f"  {a} -> {b}" for a, b in new)
    stale = sorted(set(COMMANDS_CALLING_COMMANDS) - found)
    assert not stale, f"COMMANDS_CALLING_COMMANDS lists imports the code no longer makes (remove them): {stale}"


def test_the_reward_server_and_captioning_import_no_command():
    """The two entry points whose configuration is followed through the code (issue 63) reach only the library."""
    commands = command_modules()
    for entry in ("finecap.app.serve_reward", "finecap.app.caption"):
        assert not (direct_imports()[entry] & commands) - {entry}, entry
