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


def short_run_note(*, warmup: int, total: int) -> str | None:
    """A warning when ``train.warmup_steps`` is not below the run's ``total`` optimizer steps (a recipe's warmup on a
    small data set): the learning rate peaks at ``total / warmup`` of ``train.lr``, at the last step, and never
    decays; ``None`` otherwise."""
    if warmup <= 0 or warmup < total:
        return None
    return (
        f"train.warmup_steps={warmup} is not below this run's {total} optimizer steps: the learning rate rises to "
        f"{lr_factor(total - 1, warmup=warmup, total=total, kind='constant'):.0%} of train.lr at the last step and "
        "never decays; lower train.warmup_steps (e.g. to a tenth of the steps) or train longer (train.epochs)"
    )


def schedule_of(scheduler: torch.optim.lr_scheduler.LRScheduler) -> tuple[int, int, str]:
    """``(warmup, total, kind)`` of a scheduler made by :func:`build_scheduler` (a resumed run compares its saved
    learning rates with them: :mod:`finecap.train.resume_checks`); ``ValueError`` for any other scheduler.

    Example::

        >>> p = torch.nn.Parameter(torch.zeros(1))
        >>> schedule_of(build_scheduler(torch.optim.AdamW([p]), warmup=2, total=6, kind="cosine"))
        (2, 6, 'cosine')
    """
    functions = getattr(scheduler, "lr_lambdas", None) or [None]
    settings = [getattr(f, "keywords", None) for f in functions]
    if any(getattr(f, "func", None) is not lr_factor for f in functions) or any(s != settings[0] for s in settings):
        raise ValueError(f"{type(scheduler).__name__}: not a schedule of finecap.train.schedule.build_scheduler")
    return settings[0]["warmup"], settings[0]["total"], settings[0]["kind"]
