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

from collections.abc import Callable
from typing import TYPE_CHECKING

from finecap.objectives.base import Objective, ObjectiveBase, ObjectiveOutput, as_objective
from finecap.registry import OBJECTIVES, import_object, lookup

if TYPE_CHECKING:
    from finecap.config import Config

__all__ = ["OBJECTIVES", "Objective", "ObjectiveBase", "ObjectiveOutput", "get_objective",
           "import_object"]  # fmt: skip


def get_objective(name: str, cfg: Config) -> ObjectiveBase:
    """Build the objective ``name`` (a registry name or ``"pkg.module:factory"``) from ``cfg``; a user factory may
    return a plain callable (:func:`~finecap.objectives.base.as_objective` wraps it)."""
    factory: Callable[[Config], Objective] = lookup(name, OBJECTIVES, "train.objective", "objective")
    return as_objective(factory(cfg))
