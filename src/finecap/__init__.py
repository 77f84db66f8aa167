"""finecap: train and evaluate image captioners that say more than maximum-likelihood captions do.

The Python API (:mod:`finecap.api`): ``finecap.train(recipe, **overrides)``, ``from finecap import Captioner,
evaluate``. They are imported on first use, so ``import finecap`` imports no torch.

``finecap.train`` is also the package of the training library (``finecap.train.engine``, ...): a package is what
Python finds at ``finecap.train`` once any of its modules is imported, so the package itself is made callable
(:class:`_TrainPackage`) and a call is :func:`finecap.api.train`, whose signature and docstring ``help`` and
``inspect.signature`` show; its modules import as before.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

from finecap import train as _train_package  # the package only (its __init__ imports nothing): no torch

__version__ = "0.1.0"  # the one place it is written: the wheel's metadata reads it (pyproject.toml's dynamic)
__all__ = ["Captioner", "__version__", "evaluate", "train"]


class _TrainPackage(types.ModuleType):
    # The ``finecap.train`` package, callable: ``finecap.train(recipe_or_config, **overrides)`` is
    # :func:`finecap.api.train`, and what a notebook asks of it (``help(finecap.train)``, ``finecap.train?``,
    # ``inspect.signature``) answers with that function's signature and contract, then the package's own docstring
    # (they showed only the package: its modules, no arguments, no example).

    @property
    def __doc__(self) -> str:  # type: ignore[override]
        from finecap.api import train

        return (f"finecap.train{inspect.signature(train)}\n\n{inspect.getdoc(train)}\n\n"
                f"{vars(self).get('__doc__') or ''}")  # fmt: skip

    @property
    def __signature__(self) -> inspect.Signature:
        from finecap.api import train

        return inspect.signature(train)

    def __call__(self, recipe_or_config: Any, /, *more: Any, **kwargs: Any) -> Any:
        from finecap.api import more_positionals, train

        if more:  # Python's own error named this method and counted its self: "takes 2 positional arguments"
            raise more_positionals(more)
        return train(recipe_or_config, **kwargs)


_train_package.__class__ = _TrainPackage

_API = ("Captioner", "evaluate")


def __getattr__(name: str) -> Any:
    if name in _API:
        from finecap import api

        return getattr(api, name)
    raise AttributeError(f"module 'finecap' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
