"""What an objective is: ``objective(model, batch) -> ObjectiveOutput(losses, metrics)``.

The training loop (:func:`finecap.app.train.train`) multiplies each named loss by its weight
(``train.loss_weights``, 1.0 when absent), sums them, back-propagates the sum and logs every part as
``loss/<name>`` next to the objective's ``metrics`` (plain floats, e.g. token accuracy or a mean reward).

Optional attributes and hooks an objective may define (the loop uses them when present):

- ``example_unit = "image"``: train on one example per image instead of one per reference caption (objectives that
  sample captions of each image: REINFORCE, self-retrieval); ``data.train_unit`` overrides it.

- ``setup(ctx: TrainContext)`` once before training: the accelerator (device, ``gather`` for global-batch rewards),
  the training records (e.g. CIDEr-D document frequencies), the tokenizer and the run directory.
- ``end_step()`` after every optimizer step (state updated once per step, whatever the micro-batches: a running-mean
  baseline).
- ``state_dict() -> dict`` / ``load_state_dict(state)``: state that must survive ``--resume`` (a running-mean
  baseline, a private random generator); it is stored in the trainer state of every checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from accelerate.utils import extract_model_from_parallel

if TYPE_CHECKING:
    from accelerate import Accelerator

    from finecap.config import Config


@dataclass
class ObjectiveOutput:
    """Named losses (scalar tensors with gradient), named metrics (floats, logged only) and ``num_items``: how many
    items (tokens, captions, ...) the losses are means over, so that the loop can weight micro-batches and give an
    optimizer step the gradient of the mean over the whole global batch (``None``: the batch's examples)."""

    losses: dict[str, torch.Tensor]
    metrics: dict[str, float] = field(default_factory=dict)
    num_items: float | None = None


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


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The bare captioner inside a DDP / FSDP / compiled wrapper (``accelerate``'s ``extract_model_from_parallel``):
    what decoding (``generate``) and attribute access (``tokenizer``) use. Gradients flow only through the wrapped
    model's ``forward``; decode on the bare model under ``no_grad`` (TRL's pattern for generation)."""
    return extract_model_from_parallel(model)
