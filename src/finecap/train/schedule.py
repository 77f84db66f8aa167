"""Learning-rate schedules: linear warmup, then linear decay, cosine decay or constant.

The factor multiplies the peak learning rate ``train.lr``; optimizer step ``s`` (0-based) uses ``lr_factor(s)``:

- warmup (``s < warmup``): ``(s + 1) / warmup``, so the first update already moves (HF's ``s / warmup`` spends the
  first step at lr 0) and step ``warmup - 1`` reaches the peak;
- then, with ``d = total - warmup`` decay steps and ``u = s - warmup``: ``linear`` ``1 - u / d``, ``cosine``
  ``(1 + cos(pi * u / d)) / 2``, ``constant`` 1. Both decays end just above 0 at the last step ``total - 1``.

Example::

    >>> [round(lr_factor(s, warmup=2, total=6, kind="linear"), 3) for s in range(6)]
    [0.5, 1.0, 1.0, 0.75, 0.5, 0.25]
"""

from __future__ import annotations

import math
from functools import partial
from typing import get_args

import torch

from finecap.config import Schedule

SCHEDULES = get_args(Schedule)


def lr_factor(step: int, *, warmup: int, total: int, kind: str) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step`` (0-based) of ``total``."""
    if kind not in SCHEDULES:
        raise ValueError(f"train.schedule: unknown schedule {kind!r}; valid: {', '.join(SCHEDULES)}")
    if step < warmup:
        return (step + 1) / warmup
    if kind == "constant":
        return 1.0
    decay = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / decay)
    if kind == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer, *, warmup: int, total: int, kind: str
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` applying :func:`lr_factor`; call ``.step()`` after every optimizer step."""
    lr_factor(0, warmup=warmup, total=total, kind=kind)  # validate ``kind`` now, not at the first step
    return torch.optim.lr_scheduler.LambdaLR(optimizer, partial(lr_factor, warmup=warmup, total=total, kind=kind))
