"""No module of finecap uses another module's private names, and no test module imports another test module.

A name with a leading underscore is its module's own: when another module needs it, it is made public (or re-exported
from its package's ``__init__``), or the use moves into its module. Checked on the source's syntax trees: ``from
finecap.x import _y``, and ``finecap.x._y`` or ``x._y`` where ``x`` names a finecap module (``import finecap.x``,
``import finecap.x as x``, ``from finecap import x``); dunder names (``__version__``) are public. Test helpers live
in tests/helpers/ (or a ``conftest.py``), never in a test module another one imports.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
TESTS = ROOT / "tests"

# Known uses of other modules' private names: none. An entry that no longer occurs fails
# test_the_allow_list_holds_only_current_uses, so the set only shrinks; nothing may be added to it.
KNOWN_PRIVATE_IMPORTS: frozenset[tuple[str, str]] = frozenset()
"""``(file under src/, qualified private name)`` of the known uses of other modules' private names."""


def is_private(name: str) -> bool:
    """A leading underscore, dunder names (``__all__``, ``__version__``) excepted."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def module_of(path: Path) -> str:
    """The dotted name of the module at ``path`` under src/ (a package's ``__init__.py``: the package)."""
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def is_finecap_module(dotted: str) -> bool:
    """Whether ``dotted`` names a module or package of src/finecap."""
    if dotted.split(".")[0] != "finecap":
        return False
    base = SRC.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imported_module(node: ast.ImportFrom, current: str, is_package: bool) -> str:
    """The absolute module of ``from MODULE import ...`` in module ``current`` (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = current.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def private_uses(path: Path) -> list[tuple[int, str]]:
    """``(line, qualified private name)`` of every use in the module at ``path`` of another finecap module's private
    name: imported by name, or read as an attribute of a name bound to a finecap module."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    current = module_of(path)
    modules: dict[str, str] = {}  # a name bound (anywhere in the file) to a finecap module -> that module
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "finecap":
                    bound = alias.asname or alias.name.split(".")[0]
                    modules[bound] = alias.name if alias.asname else "finecap"
        elif isinstance(node, ast.ImportFrom):
            source = imported_module(node, current, path.name == "__init__.py")
            if source.split(".")[0] != "finecap":
                continue
            for alias in node.names:
                if is_private(alias.name) and source != current:
                    found.append((node.lineno, f"{source}.{alias.name}"))
                elif is_finecap_module(f"{source}.{alias.name}"):
                    modules[alias.asname or alias.name] = f"{source}.{alias.name}"

    def module_named(expr: ast.expr) -> str | None:
        """The finecap module an expression names (``x``, ``finecap.x``, ``x.y`` of bound modules), or None."""
        if isinstance(expr, ast.Name):
            return modules.get(expr.id)
        if isinstance(expr, ast.Attribute):
            outer = module_named(expr.value)
            if outer is not None and is_finecap_module(f"{outer}.{expr.attr}"):
                return f"{outer}.{expr.attr}"
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            owner = module_named(node.value)
            if owner is not None and owner != current:
                found.append((node.lineno, f"{owner}.{node.attr}"))
    return sorted(found)


@functools.cache
def all_private_uses() -> dict[tuple[str, str], list[int]]:
    """``{(file under src/, qualified name): [lines]}`` over every module of src/finecap."""
    uses: dict[tuple[str, str], list[int]] = {}
    for path in sorted((SRC / "finecap").rglob("*.py")):
        for line, name in private_uses(path):
            uses.setdefault((path.relative_to(SRC).as_posix(), name), []).append(line)
    return uses


def test_no_module_uses_another_modules_private_names():
    uses = all_private_uses()
    new = {key: lines for key, lines in uses.items() if key not in KNOWN_PRIVATE_IMPORTS}
    assert not new, (
        "private names of other modules (make them public, or keep the use in their module):\n"
        + "\n".join(f"src/{file}:{','.join(map(str, lines))}: {name}" for (file, name), lines in sorted(new.items()))
    )


def test_the_allow_list_holds_only_current_uses():
    gone = KNOWN_PRIVATE_IMPORTS - set(all_private_uses())
    assert not gone, f"no longer used, remove from KNOWN_PRIVATE_IMPORTS: {sorted(gone)}"


# The checker itself, on hand-made modules


def test_private_names():
    assert [is_private(n) for n in ("_x", "_X", "__x", "__all__", "__version__", "x_", "x")] == [
        True, True, True, False, False, False, False,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from finecap.utils import _private, public", ["finecap.utils._private"]),
        ("from finecap.utils import __all__", []),  # dunder: public
        ("import finecap.utils\nfinecap.utils._private()", ["finecap.utils._private"]),
        ("import finecap.config.fields as f\nf._violated", ["finecap.config.fields._violated"]),
        ("from finecap.config import fields\nfields._violated", ["finecap.config.fields._violated"]),
        ("from finecap import config\nconfig.fields._violated", ["finecap.config.fields._violated"]),
        ("from finecap.config import fields\nfields.doc\nfields.__name__", []),
        ("from finecap.config import Config\nConfig._private", []),  # a class's members: not a module's names
        ("import torch\ntorch._C", []),  # another library's business
        ("from .fields import _violated", ["finecap.config.fields._violated"]),  # relative, from finecap/config/
    ],
    ids=[
        "from-import",
        "dunder",
        "dotted-module",
        "module-alias",
        "from-package-import-module",
        "submodule-of-module",
        "public-names",
        "class-member",
        "other-library",
        "relative-import",
    ],
)
def test_the_checker_finds_private_names_of_other_modules(tmp_path, monkeypatch, source, expected):
    package = tmp_path / "finecap" / "config"
    package.mkdir(parents=True)
    module = package / "mine.py"
    module.write_text(source + "\n")
    for name in ("finecap/__init__.py", "finecap/utils.py", "finecap/config/__init__.py", "finecap/config/fields.py"):
        (tmp_path / name).touch()
    monkeypatch.setattr(f"{__name__}.SRC", tmp_path)
    is_finecap_module.cache_clear()
    try:
        assert [name for _, name in private_uses(module)] == expected
    finally:
        is_finecap_module.cache_clear()


def test_a_modules_own_private_names_are_its_own(tmp_path, monkeypatch):
    (tmp_path / "finecap").mkdir()
    (tmp_path / "finecap" / "__init__.py").touch()
    module = tmp_path / "finecap" / "utils.py"
    module.write_text("import finecap.utils\nfinecap.utils._mine\nfrom finecap.utils import _mine\n")
    monkeypatch.setattr(f"{__name__}.SRC", tmp_path)
    is_finecap_module.cache_clear()
    try:
        assert private_uses(module) == []
    finally:
        is_finecap_module.cache_clear()


# --------------------------------------------------------------------------------------------------------------------
# Test modules
# --------------------------------------------------------------------------------------------------------------------


def imports_of_test_modules(tree: ast.Module, stems: set[str]) -> list[tuple[int, str]]:
    """``(line, module)`` of every import in ``tree`` of a module whose dotted name holds one of ``stems``."""
    found = []
    for node in ast.walk(tree):
        imported = []
        if isinstance(node, ast.Import):
            imported = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported = [node.module]
        found += [(node.lineno, name) for name in imported if set(name.split(".")) & stems]
    return sorted(found)


def test_no_test_module_imports_another():
    files = sorted(TESTS.rglob("*.py"))
    stems = {p.stem for p in files if p.stem.startswith("test_")}
    assert len(stems) > 100  # every test module of the suite
    texts = {path: path.read_text(encoding="utf-8") for path in files}
    # only a file with a line naming both can import a test module: the others need no parsing
    candidates = [p for p, text in texts.items() if any("import" in ln and "test_" in ln for ln in text.splitlines())]
    imports = {
        f"{path.relative_to(ROOT)}:{line}: {name}": name
        for path in candidates
        for line, name in imports_of_test_modules(ast.parse(texts[path]), stems)
    }
    assert not imports, "test modules importing test modules (move what they share to tests/helpers/):\n" + "\n".join(
        imports
    )


def test_the_test_module_check_finds_imports_of_test_modules():
    tree = ast.parse(
        "import test_a\nimport test_a as a\nfrom test_b import x\nfrom tests.train.test_c import y\n"
        "from helpers.cli import run_cli\nimport finecap.test_utils\ndef f():\n    from test_b import z\n"
    )
    found = imports_of_test_modules(tree, {"test_a", "test_b", "test_c"})
    assert found == [(1, "test_a"), (2, "test_a"), (3, "test_b"), (4, "tests.train.test_c"), (8, "test_b")]
