"""What an objective is: ``objective(model, batch) -> ObjectiveOutput(losses, metrics)``.

The training loop (:func:`finecap.app.train.train`) multiplies each named loss by its weight
(``train.loss_weights``, 1.0 when absent), sums them, back-propagates the sum and logs every part as
``loss/<name>`` next to the objective's ``metrics`` (plain floats, e.g. token accuracy or a mean reward).

Optional attributes and hooks an objective may define (the loop uses them when present):

- ``example_unit = "image"``: train on one example per image instead of one per reference caption (objectives that
  sample captions of each image: REINFORCE, self-retrieval); ``data.train_unit`` overrides it.

- ``setup(ctx: TrainContext)`` once before training: the accelerator (device, ``gather`` for global-batch rewards),
  the training records (e.g. CIDEr-D document frequencies), the tokenizer and the run directory.
- ``state_dict() -> dict`` / ``load_state_dict(state)``: state that must survive ``--resume`` (a running-mean
  baseline, a private random generator); it is stored in the trainer state of every checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from accelerate import Accelerator

    from finecap.config import Config


@dataclass
class ObjectiveOutput:
    """Named losses (scalar tensors with gradient) and named metrics (floats, logged only)."""

    losses: dict[str, torch.Tensor]
    metrics: dict[str, float] = field(default_factory=dict)


class Objective(Protocol):
    def __call__(self, model: torch.nn.Module, batch: dict[str, Any]) -> ObjectiveOutput: ...


@dataclass
class TrainContext:
    """What :meth:`setup` of an objective receives from the loop."""

    cfg: Config
    accelerator: Accelerator
    train_records: list
    tokenizer: Any
    run_dir: Path
