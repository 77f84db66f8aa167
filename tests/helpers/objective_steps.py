"""Optimizer steps of an objective on a tiny captioner, for the objective tests that train a few steps
(tests/objectives/), and the stand-ins of their hand-computed tests: fixed logits, a second process."""

from __future__ import annotations

import math
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


class FixedLogits(torch.nn.Module):
    """A stand-in captioner whose logits (B, T, V) are the parameter ``logits``, whatever the batch: the teacher-forced
    objectives' (MLE, SMILE) hand-computed tests."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = torch.nn.Parameter(logits)

    def forward(self, batch: dict) -> torch.Tensor:
        return self.logits


class OtherProcess:
    """An accelerator of two processes; the other process's per-token metrics are the hand-made ``[sum, count]``
    rows ``others`` (by name, sorted), its step extremes (``TokenMeans.add_extreme``) the values ``extremes`` (every
    name, a ``.../*min`` one a minimum; ``None``: it has none), and it adds nothing to the other reductions (the
    monitor's, the tallies')."""

    num_processes, device = 2, "cpu"

    def __init__(self, others: dict[str, list[float]], extremes: dict[str, float] | None = None):
        self.others = torch.tensor([others[name] for name in sorted(others)], dtype=torch.float64)
        signed = [(-1.0 if name.endswith("min") else 1.0) * v for name, v in sorted((extremes or {}).items())]
        self.extremes = None if extremes is None else torch.tensor(signed, dtype=torch.float64)

    def reduce(self, t: torch.Tensor, reduction: str) -> torch.Tensor:
        assert reduction == "sum"
        return t + self.others if t.dim() == 2 else t  # (K, 2): the token means' sums and counts

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        """(K,) signed extremes: this process's, then the other's (-inf: none)."""
        other = torch.full_like(t, -math.inf) if self.extremes is None else self.extremes
        return torch.cat([t, other])
