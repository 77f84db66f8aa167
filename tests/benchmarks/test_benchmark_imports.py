"""The benchmarks use finecap's library and its commands' entry points, never the application's internals: every
``finecap.app`` module a benchmark imports (``benchmarks/*.py`` and the package ``benchmarks/paper_tables/``, deferred
imports included) or runs (``python -m finecap.app.cli``) is on :data:`ALLOWED`, each with the reason it is there.
The demo's modules (its stage table, its VCB and transfer stages) are not: what the benchmarks share with the demo is
in the library (``finecap.stages``, ``finecap.recipes.settings``, ``finecap.boost.training``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
FILES = sorted([*BENCHMARKS.glob("*.py"), *BENCHMARKS.glob("paper_tables/*.py")])
APP = re.compile(r"^finecap\.app(\.\w+)*$")

ALLOWED = {
    "finecap.app.cli": "the command line, run as a user runs it (`python -m finecap.app.cli demo ...`)",
    "finecap.app.serve_reward": "the `finecap serve-reward` command's reward service (`build_service`): the reward "
    "as the command loads and sets it up, which reward_server.py times in process next to the command's server",
    "finecap.app.bags": "the `finecap bags build` command's `main`: TrueMatch bags as the command writes them",
    "finecap.app.boost": "the `finecap boost` command's `main`: the boosted data set of the world",
    "finecap.app.retriever": "the `finecap retriever` command's world-encoder training and probes, which "
    "world_encoder_budget.py measures",
    "finecap.app.demo_families": "the scene-family test world as the demo's rows are scored on it (the family world "
    "made by `prepare`, its bags by `finecap bags build`, family R@1, hard RD and bags): the paper tables and "
    "bag_hardness.py score their runs the same way; it builds on the two commands above, so it cannot sit in the "
    "library",
}
"""Application modules the benchmarks may use: commands' entry points, each with why."""


def app_modules(path: Path) -> set[str]:
    """The ``finecap.app`` modules ``path`` imports (anywhere in it) or names as a string (``-m finecap.app.cli``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names if node.module == "finecap.app"}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and APP.match(node.value):
            found.add(node.value)
    return {name for name in found if APP.match(name)}


def test_app_modules_sees_imports_deferred_imports_and_module_strings(tmp_path):
    path = tmp_path / "b.py"
    path.write_text("import finecap.app.bags\nfrom finecap.app import demo_vcb\n"
                    "def f():\n    from finecap.app.demo import STAGES\n    return ['-m', 'finecap.app.cli']\n"
                    "from finecap.stages import StageRunner\n")  # fmt: skip
    assert app_modules(path) == {"finecap.app", "finecap.app.bags", "finecap.app.demo_vcb", "finecap.app.demo",
                                 "finecap.app.cli"}  # fmt: skip


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(BENCHMARKS)))
def test_benchmarks_use_only_the_allowed_application_modules(path):
    used = {m for m in app_modules(path) if m != "finecap.app"}  # the package itself: `from finecap.app import x`
    assert not used - set(ALLOWED), f"{path.name} uses application internals: {sorted(used - set(ALLOWED))}"


def test_every_allowed_module_is_used():
    """The list names no more than the benchmarks use (an entry no longer needed is taken off)."""
    used = set().union(*(app_modules(p) for p in FILES))
    assert set(ALLOWED) <= used, f"allowed but unused: {sorted(set(ALLOWED) - used)}"
