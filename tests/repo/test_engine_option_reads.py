"""``decode.engine`` is read in one place (issue 63): :func:`finecap.engines.base.engine_class`, which every
caller asks for the engine's class and its facts (``open_engine``, ``--dry-run``'s device share). Only the
configuration package also reads it, to check the name and to warn about ``vllm.*`` options no engine reads. A
comparison of ``decode.engine`` with an engine's name elsewhere (``--dry-run`` had one for vLLM's memory share) is
the string dispatch the engine contract replaced."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "finecap"
ALLOWED = {"engines/base.py", "config/loading.py", "config/sections/vllm.py"}


def _reads_decode_engine(node: ast.AST) -> bool:
    """``<x>.decode.engine`` (an attribute ``engine`` of an attribute ``decode``), or ``decode.engine`` of a name
    ``decode``."""
    if not (isinstance(node, ast.Attribute) and node.attr == "engine"):
        return False
    inner = node.value
    return (isinstance(inner, ast.Attribute) and inner.attr == "decode") or (
        isinstance(inner, ast.Name) and inner.id == "decode"
    )


def test_decode_engine_is_read_only_where_the_engine_class_is_resolved():
    reads = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if _reads_decode_engine(node):
                reads.append((str(path.relative_to(SRC)), node.lineno))
    assert any(p == "engines/base.py" for p, _ in reads)  # the walk finds the one place
    assert [f"{p}:{n}" for p, n in reads if p not in ALLOWED] == []
