"""finecap: train and evaluate image captioners that say more than maximum-likelihood captions do.

The Python API (:mod:`finecap.api`): ``from finecap import Captioner, evaluate``. Both are imported on first use, so
``import finecap`` imports no torch.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Captioner", "__version__", "evaluate"]

_API = ("Captioner", "evaluate")


def __getattr__(name: str) -> Any:
    if name in _API:
        from finecap import api

        return getattr(api, name)
    raise AttributeError(f"module 'finecap' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
