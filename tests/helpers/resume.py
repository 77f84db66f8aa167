"""A training run killed at a given step, and what two runs are compared by: the weights of their last checkpoint
and their logged training losses (tests/train/test_resume.py, tests/train/test_input_pipeline.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

from finecap.models.clipcap import ClipCap
from finecap.runs import checkpoint_dir, model_dir


class Killed(Exception):
    """Raised by :func:`kill_at`'s callback: the run stops as if killed."""


def kill_at(step: int) -> Callable:
    """A training callback that kills the run when it reaches ``step``."""

    def callback(state):
        if state.step == step:
            raise Killed

    return callback


def killed_at(cfg, step: int) -> Path:
    """Train ``cfg`` until it is killed at ``step`` (:func:`kill_at`); the ``trainer_state.json`` of the run's last
    checkpoint, which a resume continues from."""
    import pytest

    from finecap.home import run_path
    from finecap.train.run import train

    with pytest.raises(Killed):
        train(cfg, callbacks=[kill_at(step)])
    return checkpoint_dir(run_path(cfg.run), "last") / "trainer_state.json"


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The ClipCap of the run's last checkpoint, encoder included: its state dict."""
    return ClipCap.from_checkpoint(model_dir(checkpoint_dir(run_dir, "last"))).state_dict()


def train_events(run_dir: Path) -> list[tuple[int, float]]:
    """``(step, loss)`` of every training event in the run's metrics log."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [(e["step"], e["values"]["loss"]) for e in map(json.loads, lines) if e["split"] == "train"]
