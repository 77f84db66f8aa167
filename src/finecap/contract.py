"""What the training engine hands to the components it runs: :class:`TrainContext` (once, to ``setup``) and
:class:`StepInfo` (every micro-batch, as ``batch["step_info"]``; :func:`is_copy`).

Why a module of its own, below :mod:`finecap.objectives` and :mod:`finecap.rewards`: objectives, rewards and
baselines all receive these, and the engine (:mod:`finecap.train.engine`) and the ``train`` command build them. Kept
in ``objectives/base.py`` they made every reward import the objectives package (whose REINFORCE imports the rewards);
here both stand on the same floor and neither imports the other's package for the engine's handshake. It imports
nothing of finecap at run time.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from accelerate import Accelerator

    from finecap.config import Config


@dataclass(frozen=True)
class StepInfo:
    """What every micro-batch of one optimizer step knows about the whole step (``batch["step_info"]``), and whether
    it is a copy.

    Attributes:
        step: optimizer steps completed before this one (0 for the first).
        image_ids: image ids of the step's global batch (every process, every micro-batch), in order.
        fields: the sampler's per-example fields of the global batch, each ``(G,)`` in the order of ``image_ids``
            (:meth:`finecap.data.samplers.GlobalBatchSampler.example_fields`, e.g. ``"bag"``).
        copy: the micro-batch repeats examples of another of the step (a global batch smaller than processes x
            accumulation steps, :func:`finecap.data.samplers.repeated_micro_batches`). It runs, as every process
            steps in step, but counts nowhere: the engine weights its loss 0 and leaves its logged values out, and
            an objective leaves it out of what it sums over the step (the reward-hacking monitor's measures, the
            GRPO family's batch statistics, the running-mean baseline); :func:`is_copy`.
    """

    step: int
    image_ids: Sequence[Hashable]
    fields: dict[str, torch.Tensor] = field(default_factory=dict)
    copy: bool = False


def is_copy(batch: Mapping[str, Any]) -> bool:
    """Whether the micro-batch ``batch`` is a copy (:attr:`StepInfo.copy`); one without ``step_info`` (called outside
    the training engine) is not."""
    info = batch.get("step_info")
    return info is not None and info.copy


@dataclass
class TrainContext:
    """What ``setup`` of an objective receives, once before training: the configuration, the accelerator (device,
    ``gather``), the training records, the tokenizer, the run directory and the captioner. A reward is set up with the
    :class:`finecap.rewards.RewardInputs` made of it (:meth:`~finecap.rewards.RewardInputs.from_context`).

    Without an accelerator (a script) ``accelerator`` is ``None``: one process, the work on ``device`` (default the
    CPU), and :meth:`main_process_first` holds nothing. A component that needs the accelerator itself (an objective's
    global-batch baseline) is a training component and is never set up so.
    """

    cfg: Config
    accelerator: Accelerator | None
    train_records: list
    tokenizer: Any
    run_dir: Path
    device: torch.device | None = None
    """Where set-up components compute (their frozen models, tables): the accelerator's device when there is one,
    else the given device, else the CPU."""
    model: Any = None
    """The captioner being trained, before the accelerator wraps it (what an objective's rollout engine checks it can
    decode: :meth:`finecap.engines.rollouts.RolloutEngine.check_model`); ``None`` in a script that gives none."""

    def __post_init__(self) -> None:
        if self.device is None:
            self.device = getattr(self.accelerator, "device", None) or torch.device("cpu")

    def main_process_first(self) -> AbstractContextManager:
        """The accelerator's ``main_process_first()`` (the main process fills a shared cache, the others then read
        it); without an accelerator, one process: nothing to wait for."""
        return self.accelerator.main_process_first() if self.accelerator is not None else nullcontext()
