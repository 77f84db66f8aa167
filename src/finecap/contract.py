"""What the training engine hands to the components it runs: :class:`TrainContext` (once, to ``setup``) and
:class:`StepInfo` (every micro-batch, as ``batch["step_info"]``).

Why a module of its own, below :mod:`finecap.objectives` and :mod:`finecap.rewards`: objectives, rewards and
baselines all receive these, and the engine (:mod:`finecap.train.engine`) and the ``train`` command build them. Kept
in ``objectives/base.py`` they made every reward import the objectives package (whose REINFORCE imports the rewards);
here both stand on the same floor and neither imports the other's package for the engine's handshake. It imports
nothing of finecap at run time.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from accelerate import Accelerator

    from finecap.config import Config


@dataclass(frozen=True)
class StepInfo:
    """What every micro-batch of one optimizer step knows about the whole step (``batch["step_info"]``).

    Attributes:
        step: optimizer steps completed before this one (0 for the first).
        image_ids: image ids of the step's global batch (every process, every micro-batch), in order.
        fields: the sampler's per-example fields of the global batch, each ``(G,)`` in the order of ``image_ids``
            (:meth:`finecap.data.samplers.GlobalBatchSampler.example_fields`, e.g. ``"bag"``).
    """

    step: int
    image_ids: Sequence[Hashable]
    fields: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class TrainContext:
    """What ``setup`` of an objective or a reward receives from the loop, once before training: the configuration,
    the accelerator (device, ``gather`` for global-batch rewards), the training records (e.g. CIDEr-D document
    frequencies), the tokenizer and the run directory."""

    cfg: Config
    accelerator: Accelerator
    train_records: list
    tokenizer: Any
    run_dir: Path
