"""Training objectives, chosen by name (``train.objective``).

An objective is a callable ``objective(model, batch) -> ObjectiveOutput(losses, metrics)`` built by a factory
``factory(cfg: Config)`` (see :mod:`finecap.objectives.base`). :data:`OBJECTIVES` maps each built-in name to the
import path of its factory (imported only when used, so a heavy objective costs nothing until chosen); user code is
plugged in with a dotted path ``"pkg.module:factory"`` in place of a name.

Example::

    >>> from finecap.config import load
    >>> objective = get_objective("mle", load())
    >>> type(objective).__name__
    'MLE'
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from finecap.objectives.base import Objective, ObjectiveOutput, TrainContext

if TYPE_CHECKING:
    from finecap.config import Config

__all__ = ["OBJECTIVES", "Objective", "ObjectiveOutput", "TrainContext", "get_objective", "import_object"]

OBJECTIVES: dict[str, str] = {
    "mle": "finecap.objectives.mle:build",
    "smile": "finecap.objectives.smile:build",
    "reinforce": "finecap.objectives.reinforce:build",
    "scst_me": "finecap.objectives.reinforce:build_max_entropy",
    "sle": "finecap.objectives.exploration:build",
}


def import_object(path: str, option: str) -> Any:
    """Import ``"pkg.module:attribute"``; errors name ``option`` (the config key that holds the path)."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{option}: {path!r} is not a dotted path of the form 'pkg.module:factory'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{option}: cannot import module {module_name!r} of {path!r}: {e}") from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"{option}: module {module_name!r} has no attribute {attr!r}") from None


def get_objective(name: str, cfg: Config) -> Objective:
    """Build the objective ``name`` (a registry name or ``"pkg.module:factory"``) from ``cfg``."""
    if ":" in name:
        factory: Callable[[Config], Objective] = import_object(name, "train.objective")
    elif name in OBJECTIVES:
        factory = import_object(OBJECTIVES[name], "train.objective")
    else:
        raise ValueError(
            f"train.objective: unknown objective {name!r}; valid names: {', '.join(sorted(OBJECTIVES))} "
            "(or a dotted path 'pkg.module:factory')"
        )
    return factory(cfg)
