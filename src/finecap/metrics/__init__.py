"""finecap.metrics.

``from finecap.metrics import COCOEvalCap`` is the drop-in for pycocoevalcap's class
(:mod:`finecap.metrics.cocoeval`); it is imported on first use, so ``import finecap.metrics`` stays free.
"""

from __future__ import annotations

from typing import Any

__all__ = ["COCOEvalCap", "CaptionFile"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from finecap.metrics import cocoeval

        return getattr(cocoeval, name)
    raise AttributeError(f"module 'finecap.metrics' has no attribute {name!r}")
