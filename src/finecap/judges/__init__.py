"""Judges: what answers the judge-backed rewards (``qa_utility``, ``claims``) and metrics (``qa``, ``claims``,
``clair``) ask of a caption: :mod:`finecap.judges.base` holds the contract, :data:`JUDGES` the built-in judges
(``world``: exact, from the world's scene graphs; ``openai``: any OpenAI-compatible server), a user's own is a dotted
path ``"pkg.module:factory"`` (``judge.name``). A factory is called ``factory(cfg, **options)``. The design:
docs/methods/judges.md.

Example::

    >>> from finecap.judges.base import Ask, Question, CANNOT_ANSWER
    >>> judge = get_judge("world", None)
    >>> q = Question("0/color/circle", "What colour is the circle?", ("red", "blue"), "red", ("color", "circle"))
    >>> judge.answer([Ask(q, ("blue", "red", CANNOT_ANSWER), "a red circle on grass")])
    ['red']
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from finecap.registry import JUDGES, lookup

if TYPE_CHECKING:
    from finecap.config import Config
    from finecap.judges.base import Judge

__all__ = ["JUDGES", "get_judge"]


def get_judge(name: str, cfg: Config | None, **options: Any) -> Judge:
    """Build the judge ``name`` (a :data:`JUDGES` name or ``"pkg.module:factory"``) from ``cfg`` (its ``judge``
    section; ``None``: defaults) and ``options``."""
    from finecap.judges.base import Judge

    factory = lookup(name, JUDGES, "judge.name", "judge")
    judge = factory(cfg, **options)
    if not isinstance(judge, Judge):
        raise ValueError(f"judge.name: {name!r} made a {type(judge).__name__}, not a finecap.judges.base.Judge")
    return judge
