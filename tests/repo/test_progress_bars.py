"""Every progress bar of finecap obeys ``finecap -q`` (``utils.system.progress_enabled``): a bar made with its own
``disable=not show`` ignored it (the retriever's text features and the world encoder's loads showed under -q)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "finecap"


def _calls_progress_enabled(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "progress_enabled" for n in ast.walk(node))


def test_every_tqdm_bar_asks_progress_enabled():
    bars, unruly = 0, []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for function in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]:
            assigned = {t.id: a.value for a in ast.walk(function) if isinstance(a, ast.Assign) for t in a.targets
                        if isinstance(t, ast.Name)}  # fmt: skip
            for call in [n for n in ast.walk(function) if isinstance(n, ast.Call)]:
                if getattr(call.func, "id", None) != "tqdm":
                    continue
                bars += 1
                disable = next((k.value for k in call.keywords if k.arg == "disable"), None)
                names = [n.id for n in ast.walk(disable) if isinstance(n, ast.Name)] if disable is not None else []
                if disable is None or not (_calls_progress_enabled(disable) or any(
                    name in assigned and _calls_progress_enabled(assigned[name]) for name in names
                )):  # fmt: skip
                    unruly.append(f"{path.relative_to(SRC)}:{call.lineno}")
    assert bars >= 10  # the walk finds finecap's bars
    assert unruly == [], unruly
