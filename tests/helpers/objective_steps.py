"""Optimizer steps of an objective on a tiny captioner, for the objective tests that train a few steps
(tests/objectives/)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def train_steps(model: Any, objective: Any, batch: dict | Callable[[], dict], steps: int, lr: float = 1e-3) -> list:
    """``steps`` Adam steps (on the parameters that train) of ``objective`` on ``model``, each on ``batch`` (a dict,
    or a callable giving each step's), the objective's ``end_step`` after each as the training loop calls it; every
    step's loss must be finite. The objective's outputs, one a step."""
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    outs = []
    for _ in range(steps):
        out = objective(model, batch() if callable(batch) else batch)
        loss = sum(out.losses.values())
        assert torch.isfinite(loss), out.losses
        opt.zero_grad()
        loss.backward()
        opt.step()
        objective.end_step()
        outs.append(out)
    return outs
