"""What an objective is: ``objective(model, batch) -> ObjectiveOutput(losses, metrics)``.

The training engine (:class:`finecap.train.engine.Engine`) multiplies each named loss by its weight
(``train.loss_weights``, 1.0 when absent), sums them, back-propagates the sum and logs every part as
``loss/<name>`` next to the objective's ``metrics`` (plain floats, e.g. token accuracy or a mean reward).

Objectives derive from :class:`ObjectiveBase`, which declares every attribute and hook the engine uses, with no-op
defaults (a plain callable is wrapped by :func:`as_objective`), so the engine never probes for them:

- ``needs``: what the objective needs prepared before :meth:`setup` (``{"retriever"}`` for self-retrieval rewards);
  the application prepares it (trains or finds the world encoder), the engine never checks component names.
- ``example_unit = "image"``: train on one example per image instead of one per reference caption (objectives that
  sample captions of each image: REINFORCE, self-retrieval); ``data.train_unit`` overrides it.

- ``setup(ctx: TrainContext)`` once before training (:class:`finecap.contract.TrainContext`): the accelerator
  (device, ``gather`` for global-batch rewards), the training records (e.g. CIDEr-D document frequencies), the
  tokenizer and the run directory.
- ``batch_repeats``: how many optimizer steps in a row each global batch is used for (1; the GRPO family's
  ``grpo.iterations``): the application repeats the sampler's batches (:class:`finecap.data.samplers.RepeatedBatches`).
- ``begin_step(model, micro_batches)`` before an optimizer step's micro-batches run, with this process's micro-batches
  of the step, under the run's autocast: an objective that needs the whole step first (the GRPO family rolls out and
  scores every micro-batch here, so that batch statistics are those of the global batch) prepares it.
- ``update_skipped()`` before ``end_step`` after a step whose update the engine skipped (no caption of it with a
  signal: ``ObjectiveOutput.scored``; or the fp16 gradient scaler skipped it), whose weights are those of the step
  before: REINFORCE's rollout engine is then not sent them again. A loop of one's own that calls ``end_step`` alone
  after each step has every step count as a change (the safe default: a sync too many, never a stale engine).
- ``end_step()`` after every optimizer step (state updated once per step, whatever the micro-batches: a running-mean
  baseline), a step whose update the engine skipped too; it may end training by raising :class:`StopTraining`, which
  the engine logs first.
- ``step_values() -> dict`` after ``end_step``: values of the whole optimizer step (every micro-batch and process),
  logged with the step's in place of the micro-batches' mean of the same key (the share of the step's captions a
  reward could not score, ``reward/failed``, the ``rl.alarms.failed`` alarm's own measure).
- ``close()`` once when training ends (also after an error): free what the objective holds besides its state (the
  vLLM engine of REINFORCE's rollouts with ``decode.engine=vllm``).
- ``state_dict() -> dict`` / ``load_state_dict(state)``: state that must survive ``--resume`` (a running-mean
  baseline, a private random generator); it is stored in every resumable checkpoint as JSON plus safetensors
  (:mod:`finecap.train.state`: nested dicts, lists, numbers, strings and tensors; never pickle).

Every micro-batch carries ``batch["step_info"]``, one :class:`~finecap.contract.StepInfo` per optimizer step: the
step number, the image ids of the whole global batch and the sampler's per-example fields of the global batch
(BagCurri's bag numbers), so that rewards scoring against the global batch (self-retrieval distractors) and seeded
sampling do not depend on the number of processes or accumulation steps. The micro-batch's own rows of those fields
are in the batch under the same names (``batch["bag"]``). A micro-batch that repeats another's examples (an epoch's
last global batch, too small for every micro-batch) carries it with ``copy=True``
(:func:`~finecap.contract.is_copy`): the engine weights it 0 and logs none of its values, and an objective leaves it
out of what it sums over the step (REINFORCE's reward-hacking monitor and running-mean baseline, the GRPO family's
batch statistics).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from accelerate.utils import extract_model_from_parallel

if TYPE_CHECKING:
    from finecap.contract import TrainContext


@dataclass
class ObjectiveOutput:
    """Named losses (scalar tensors with gradient), named metrics (floats, logged only) and ``num_items``: how many
    items (tokens, captions, ...) the losses are means over, so that the loop can weight micro-batches and give an
    optimizer step the gradient of the mean over the whole global batch (``None``: the batch's examples).

    ``scored``: how many of the micro-batch's sampled captions carry a learning signal, for objectives that learn
    from rewards: a reward scored them (not ``RewardOutput.failed``) and a term of the loss covers them, their
    advantage being defined (not a caption without a baseline: ``Reinforce.signal``); ``None`` (MLE, SMILE): every
    item teaches. A step whose micro-batches, on every process, hold none has a gradient of 0, and the engine skips its
    update (:meth:`finecap.train.engine.Engine.train_step`, docs/training.md#a-step-no-caption-of-which-was-scored)."""

    losses: dict[str, torch.Tensor]
    metrics: dict[str, float] = field(default_factory=dict)
    num_items: float | None = None
    scored: float | None = None


class Objective(Protocol):
    def __call__(self, model: torch.nn.Module, batch: dict[str, Any]) -> ObjectiveOutput: ...


class ObjectiveBase:
    """Base of training objectives: the hooks the engine calls, with no-op defaults (module docstring)."""

    example_unit: ClassVar[str] = "caption"
    needs: frozenset[str] = frozenset()
    batch_repeats: int = 1
    headline: ClassVar[tuple[str, ...]] = ("loss",)
    """The step values the training progress bar shows, those the step logged (:func:`finecap.train.engine.headline`):
    what says how training goes (the reward and KL of RL, not a surrogate loss that is 0 by construction)."""

    def __call__(self, model: torch.nn.Module, batch: dict[str, Any]) -> ObjectiveOutput:
        raise NotImplementedError

    def setup(self, ctx: TrainContext) -> None:
        """Called once before training (after ``needs`` were prepared)."""

    def begin_step(self, model: torch.nn.Module, micro_batches: list[dict[str, Any]]) -> None:
        """Called before an optimizer step's micro-batches (this process's), under the run's autocast."""

    def update_skipped(self) -> None:
        """Called before :meth:`end_step` after a step whose optimizer update the engine skipped: the weights are
        those of the step before (module docstring)."""

    def end_step(self) -> None:
        """Called after every optimizer step."""

    def step_values(self) -> dict[str, float]:
        """After :meth:`end_step`: values of the whole step to log, replacing the micro-batches' mean of a key."""
        return {}

    def close(self) -> None:
        """Called once when training ends (also after an error)."""

    def state_dict(self) -> dict[str, Any]:
        """State that must survive ``--resume`` (JSON-able values and tensors)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""


class StopTraining(ValueError):
    """Raised by an objective's ``end_step`` to end training after the step that just ran (a reward-hacking alarm
    with ``rl.alarm_action=stop``); the message says why. The engine logs the values the step logged, flushes every
    value since the last log event and logs the message as a ``stop`` event (``text.reason``) before the error goes on
    (:meth:`finecap.train.engine.Engine.train_step`). Every process must raise it at the same step (the engine's
    flush gathers every process's values): decide on values reduced over the processes. ``values`` is set by the
    engine: the step's logged values."""

    values: dict[str, float] | None = None


class FunctionObjective(ObjectiveBase):
    """A plain callable ``fn(model, batch) -> ObjectiveOutput`` as an objective (no state, no setup)."""

    def __init__(self, fn: Callable[[torch.nn.Module, dict[str, Any]], ObjectiveOutput]):
        self.fn = fn

    def __call__(self, model: torch.nn.Module, batch: dict[str, Any]) -> ObjectiveOutput:
        return self.fn(model, batch)


def as_objective(obj: Any) -> ObjectiveBase:
    """``obj`` itself when it is an :class:`ObjectiveBase`, else a plain callable wrapped in
    :class:`FunctionObjective`; anything else is a ``ValueError`` naming ``train.objective``."""
    if isinstance(obj, ObjectiveBase):
        return obj
    if callable(obj):
        return FunctionObjective(obj)
    raise ValueError(f"train.objective: the factory returned {type(obj).__name__}, not a callable objective")


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The bare captioner inside a DDP or compiled wrapper (``accelerate``'s ``extract_model_from_parallel``):
    what decoding (``generate``) and attribute access (``tokenizer``) use. Gradients flow only through the wrapped
    model's ``forward``; decode on the bare model under ``no_grad`` (TRL's pattern for generation)."""
    return extract_model_from_parallel(model)


def token_stats(name: str, values: torch.Tensor, stats: Sequence[str] = ("mean", "min", "max")) -> dict[str, float]:
    """The logged ``{name}/{stat}`` of ``values`` (1-D: the tokens' or the captions' values) for each of ``stats``
    (``mean``, ``min``, ``max``), each NaN over no value (a micro-batch whose captions have no token): undefined,
    and the logged means and extremes leave a NaN out (:class:`finecap.train.logging.Means`), where a 0 would pull
    the step's mean and minimum down. Until 2026-11-29 the GRPO family's ``ratio/*`` raised there and ``vllm/*``
    logged 0, as TRL 1.16 logs its ``sampling/*`` metrics.

    >>> token_stats("ratio", torch.tensor([0.5, 1.5]))
    {'ratio/mean': 1.0, 'ratio/min': 0.5, 'ratio/max': 1.5}
    >>> token_stats("vllm/logp_diff", torch.tensor([]), ("mean", "max"))
    {'vllm/logp_diff/mean': nan, 'vllm/logp_diff/max': nan}
    """
    return {f"{name}/{stat}": float(getattr(values, stat)()) if values.numel() else math.nan for stat in stats}
