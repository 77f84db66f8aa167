"""The training engine: one loop for every model finecap trains (captioners with any objective, the world encoder).

An :class:`Engine` takes what a recipe built (model, objective, data with its sampler, optimizer, scheduler, and
optionally an evaluation function and a way to save the model) and runs AdamW-style optimizer steps on
``accelerate`` with gradient accumulation, logging, evaluation, checkpoints and resume. It knows nothing about
captioners, rewards or the world: components declare what they need (``needs``), samplers give per-example fields,
and every micro-batch carries one typed :class:`~finecap.contract.StepInfo`.

**Steps.** Each optimizer step takes one *global batch* from the sampler (:mod:`finecap.data.samplers`) and cuts it
into ``processes x grad_accum_steps`` micro-batches. So that a step's gradient is that of the objective over the whole
global batch, whatever the split, every micro-batch's loss (a mean over its items: tokens for MLE and SMILE, captions
for REINFORCE; ``ObjectiveOutput.num_items``) is weighted by its item count, and at the synchronising micro-batch the
gradients are multiplied by ``processes x accumulation / (items of the global batch)``: DDP's average and
accelerate's division by the accumulation steps are undone and the sum is divided by the global item count (the
normalisation torchtune and transformers' Trainer use). The weight is relative, ``items / R``, with ``R`` the mean
item count of the processes' first micro-batches that have items (:func:`reference_items`: one scalar all-reduce after
the step's first forward, the same on every process; on one process, the first micro-batch's that has items), and the
sync multiplies by ``R`` again, so the back-propagated loss stays of the order of a mean loss. Weighted by ``items``
itself it was hundreds of times that (tokens), and fp16's scaled gradients overflowed: the scaler skipped steps,
halving its scale, until they fitted (``tests/train/test_mixed_precision.py``). A global batch smaller than the
micro-batches (an epoch's last) is repeated to fill them; the copies run with weight 0
(:func:`~finecap.data.samplers.repeated_micro_batches`), their logged values are left out, and the objective sees
them marked (:attr:`~finecap.contract.StepInfo.copy`).
Objectives with per-step state update it once per optimizer step (``end_step``); an objective that needs the whole
step first gets this process's micro-batches before any of them runs (``begin_step``: the GRPO family rolls them all
out there, for batch statistics of the global batch).
``tests/train/test_equivalence.py`` checks that 2 processes x batch b, and 1 process x batch b x 2 accumulation
steps, give the parameters of 1 process x batch 2b.

**A step no caption of which carries a learning signal is not taken.** An RL objective says how many of a
micro-batch's captions carry one (``ObjectiveOutput.scored``: a reward scored them and they have an advantage; none
when every caption failed, a judge down, a retrieval reward's one-image batch, or when none that was scored has a
baseline, ``rl.samples=1`` with every greedy caption failed); when the sum over the step's micro-batches and processes
is 0 (reduced with the step's item counts: every process decides alike), the step's gradient is 0 and the engine
skips the clipping and ``optimizer.step`` (AdamW would move the weights by its momentum and weight decay alone),
warns, and logs ``skipped/unscored``. The step still counts, as
an fp16 scaler's skip does (below): docs/training.md#a-step-no-caption-of-which-was-scored.

**Divergence stops the run.** A non-finite loss (on any process) raises :class:`TrainingDiverged` before the
optimizer step, naming the step and the last good checkpoint; so does a non-finite gradient norm, unless a gradient
scaler is at work; a non-finite evaluation value never becomes ``best``.

**Mixed precision** is accelerate's (``train.mixed_precision``): the objective runs under ``accelerator.autocast()``
and so does evaluation (:meth:`Engine.evaluate`: the validation loss, validation decoding, sample captions), with
float32 master weights. Under ``fp16`` accelerate adds a gradient scaler, which *skips* an optimizer step whose
gradients overflowed (inf/NaN) and halves its scale: such a step is not divergence. The engine logs it (``skipped``,
``loss_scale``), counts consecutive skips (:class:`SkippedSteps`, reset by a step that is taken) and stops with
:class:`TrainingDiverged` only after more than ``train.max_skipped_steps`` in a row; a non-finite *loss* stops it at
once. A skipped step still counts as a step: it consumed its global batch, and the learning-rate scheduler advances
with it, so the schedule stays a function of ``TrainState.step`` and a resumed run (scaler scale, growth tracker and
the skip count are in the checkpoint) takes exactly the steps of an uninterrupted one. ``train.tf32`` sets TF32 on
CUDA (:func:`apply_tf32`).

**Distribution** is accelerate's own: model, optimizer and scheduler go through ``accelerator.prepare`` (DDP under
``accelerate launch``/``torchrun``; gloo on a CPU-only machine). Decoding runs on the unwrapped model under
``no_grad``; under DDP every process holds full parameters, so that is exact. ``train.strategy=fsdp`` shards the
captioner with torch's FSDP2, applied by finecap (:mod:`finecap.models.sharding`): decoding inside training (REINFORCE
rollouts, validators) runs within :func:`finecap.models.sharding.decoding`, every process gathering the full
parameters at once (tests/train/test_fsdp.py, test_fsdp_validation.py). accelerate's own FSDP and DeepSpeed plugins
are refused (:func:`make_accelerator`).

**Checkpoints** (:mod:`finecap.train.state`): weights from ``accelerator.get_state_dict``, written by the main process
through the recipe's ``save`` function (the backbone's own format); the optimizer, scheduler, scaler, RNG, objective
and logger states as JSON + safetensors, never pickle. A resumed run takes the same steps, on the same data, as an
uninterrupted one: the batches of an epoch are a function of ``(seed, epoch)``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedDataParallelKwargs, DistributedType, broadcast_object_list
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from finecap.config import TrainConfig
from finecap.contract import StepInfo
from finecap.data.datasets import to_device
from finecap.data.loading import LoaderSettings
from finecap.data.samplers import GlobalBatchSampler, StepBatches, repeated_micro_batches
from finecap.models import sharding
from finecap.objectives.base import ObjectiveBase, StopTraining, unwrap
from finecap.runs import BEST, INFO_FILE, LAST, METRICS_FILE, STATE_DIR, TRACKERS_DIR, checkpoint_dir, temporary_dir
from finecap.train.logging import JsonlTracker, Logger, Means, MlflowTracker, step_sum
from finecap.train.resume_checks import apply_schedule, check_main_state
from finecap.train.state import (
    CHECKPOINT_KIND,
    CheckpointError,
    TrainState,
    check_resume,
    is_checkpoint_folder,
    load_tree,
    new_checkpoint_folder,
    read_info,
    remove_unfinished_checkpoint,
    save_tree,
    state_errors,
    trained_digest,
)
from finecap.utils.files import refuse_link
from finecap.utils.folders import check_swap
from finecap.utils.reading import read_json
from finecap.utils.rng import epoch_seed, rng_state, seed_everything, set_rng_state
from finecap.utils.system import launched_processes, progress_enabled
from finecap.utils.text import short_repr

log = logging.getLogger(__name__)


class TrainingDiverged(ValueError):
    """The loss or gradient norm became non-finite, or the fp16 gradient scaler skipped more than
    ``train.max_skipped_steps`` steps in a row; the message names the step and the last good checkpoint."""


@dataclass
class SkippedSteps:
    """The optimizer steps an fp16 gradient scaler skipped, and when that becomes divergence.

    A scaler multiplies the loss by its scale before the backward pass so that small float16 gradients do not
    flush to zero; when the scaled gradients overflow (inf/NaN) it skips ``optimizer.step`` and halves the scale
    (``torch.amp.GradScaler``). A few skips are routine (at the start, while the scale falls from 2**16 to what the
    gradients allow, and about once per ``growth_interval`` = 2,000 steps after the scale doubled); a run whose
    steps keep being skipped learns nothing while looking alive. :meth:`record` counts each optimizer step and says
    when more than ``limit`` (``train.max_skipped_steps``) consecutive steps were skipped.

    Example::

        >>> skips = SkippedSteps(limit=2)
        >>> [skips.record(s) for s in (True, True, False, True, True, True)]  # a taken step resets the count
        [False, False, False, False, False, True]
        >>> skips.consecutive, skips.total
        (3, 5)
    """

    limit: int
    consecutive: int = 0
    total: int = 0

    def record(self, skipped: bool) -> bool:
        """Count one optimizer step (``skipped`` by the scaler or taken); returns whether the run diverged: more
        than ``limit`` consecutive skipped steps."""
        if not skipped:
            self.consecutive = 0
            return False
        self.consecutive += 1
        self.total += 1
        return self.consecutive > self.limit

    def state_dict(self) -> dict[str, int]:
        return {"consecutive": self.consecutive, "total": self.total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        values = [state["consecutive"], state["total"]]
        if not all(type(v) is int and v >= 0 for v in values) or values[0] > values[1]:
            raise ValueError(f"skipped-step counts must be integers, 0 <= consecutive <= total: {short_repr(state)}")
        self.consecutive, self.total = values


class IndexedDataset(Protocol):
    """What the engine needs of a training data set: examples with an ``"index"`` and an image id per index."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> dict[str, Any]: ...

    def image_id(self, index: int) -> Any: ...


SaveFn = Callable[..., Any]
"""``save(path, *, state_dict, info, keep_tmp_contents)``: write the model (with ``state_dict``) into
``temporary_dir(path)``, then ``trainer_state.json`` (``info``) last, then swap it in as ``path``
(:func:`finecap.train.checkpoint.save_checkpoint` with the model and config bound)."""

EvaluateFn = Callable[[torch.nn.Module], dict[str, Any]]
"""``evaluate(bare_model) -> {name: value}`` on every process (numbers; strings are logged as text)."""


# ------------------------------------------------------------------------------------------------------------------
# Building blocks
# ------------------------------------------------------------------------------------------------------------------


def _use_cpu(settings: TrainConfig) -> bool:
    return settings.cpu or (launched_processes() > 1 and not torch.accelerator.is_available())


def apply_tf32(enabled: bool, device: torch.device) -> bool:
    """``train.tf32`` on a CUDA ``device``: whether float32 matmuls and cuDNN convolutions may use TF32 tensor cores
    (10-bit mantissa inputs, float32 accumulation; ~2-8x faster matmuls on Ampere and later). ``False`` also turns
    it off for cuDNN convolutions (torch's own default allows it there), so that float32 means float32. Returns
    whether anything was set: nothing on other devices (the CPU has no TF32). Set through torch's ``fp32_precision``
    (``"tf32"`` or ``"ieee"`` for cuBLAS matmuls and cuDNN convolutions), not the legacy ``allow_tf32`` flags: once a
    caller or a library (transformers' ``TrainingArguments(tf32=...)``) has set the new API, torch refuses to read the
    legacy flags ("mix of the legacy and new APIs") and ignores what the legacy cuDNN one sets."""
    if torch.device(device).type != "cuda":
        return False
    precision = "tf32" if enabled else "ieee"
    torch.backends.cuda.matmul.fp32_precision = precision
    torch.backends.cudnn.conv.fp32_precision = precision
    return True


def tf32_settings() -> tuple[str, str]:
    """torch's TF32 settings that :func:`apply_tf32` sets: cuBLAS matmuls' and cuDNN convolutions' ``fp32_precision``
    (readable whichever API set them, where the legacy ``allow_tf32`` raises after the new one was used)."""
    return torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision


@contextlib.contextmanager
def tf32_kept() -> Iterator[None]:
    """Within the block, training may set torch's TF32 flags (:func:`apply_tf32`, on a CUDA device: ``false`` turns
    cuDNN's off too); after it they are as before, so that the float32 matmuls a caller runs after
    :func:`finecap.train` keep the caller's precision. The flags are process-wide and exist without a GPU; they are
    read and put back through :func:`tf32_settings` (set by the caller through either API, the legacy one's flags
    read back as they were)."""
    saved = tf32_settings()
    try:
        yield
    finally:
        torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision = saved


def process_state(settings: TrainConfig) -> PartialState:
    """The launch's processes (accelerate's ``PartialState``, set up as :func:`make_accelerator` would), for work
    that must be coordinated before an ``Accelerator`` exists (preparing data and encoders on the main process)."""
    return PartialState(cpu=_use_cpu(settings))


def _release_precision(mixed_precision: str) -> None:
    """Let this process's next ``Accelerator`` take ``mixed_precision`` although an earlier one, now finished, took
    another. accelerate keeps one ``AcceleratorState`` per process and refuses a second ``Accelerator`` with another
    precision ("AcceleratorState has already been initialized and cannot be changed"), which is what a command that
    trains the world encoder (float32) and then a captioner in bf16 does on an empty finecap home. Only the
    accelerator state is reset (``AcceleratorState._reset_state``, accelerate's own way, used by its tests); the
    process group (``PartialState``) stays. Nothing changes when the precision is the same, so runs that never
    switch keep accelerate's state untouched."""
    from accelerate.state import AcceleratorState

    if AcceleratorState._shared_state and AcceleratorState().mixed_precision != mixed_precision:
        AcceleratorState._reset_state(reset_partial_state=False)


@contextlib.contextmanager
def accelerate_state_kept() -> Iterator[None]:
    """Within the block, training may set up accelerate's per-process state as its runs need (its device, another
    precision, its accumulation steps: :func:`process_state`, :func:`make_accelerator`); after it, that state
    (``PartialState``, ``AcceleratorState``, ``GradientState``) is as it was, so a caller's own ``Accelerator`` keeps
    its device, precision and accumulation, and a process that had none may create one with any (the Python API,
    :func:`finecap.train`). A ``PartialState`` the block made was kept: it holds its device for the process, so a
    notebook's run with ``train.cpu`` and a later one without it on a GPU machine trained both on the CPU (and the
    other way round both on the GPU). The process group itself (``torch.distributed``) is left as it is: accelerate
    joins one already started."""
    from accelerate.state import AcceleratorState, GradientState

    saved = [(cls, dict(cls._shared_state)) for cls in (PartialState, AcceleratorState, GradientState)]
    try:
        yield
    finally:
        for cls, state in saved:
            cls._shared_state.clear()
            cls._shared_state.update(state)


def check_callers_device(settings: TrainConfig) -> None:
    """A ``ValueError`` when this process already has accelerate's state (``PartialState``: a caller's own
    ``PartialState`` or ``Accelerator``, made before :func:`finecap.train`) on another kind of device than
    ``train.cpu`` asks for (the CPU with it; without it this machine's accelerator, else the CPU, as
    :func:`make_accelerator` sets up). accelerate keeps one device per process and ignores the ``cpu`` of a later
    ``Accelerator``, and :func:`accelerate_state_kept` keeps a caller's state, so such a run trained on the caller's
    device, silently. The error names both devices and what to do. No state yet, or one on the device asked for:
    nothing is said."""
    theirs = PartialState._shared_state.get("device")
    if theirs is None:
        return
    here = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    wanted = "cpu" if _use_cpu(settings) or here is None else here.type
    if torch.device(theirs).type == wanted:
        return
    flag = "true" if settings.cpu else "false"
    raise ValueError(f"train.cpu={flag} asks for {wanted}, but this process's accelerate state (a PartialState or "
                     f"Accelerator made before finecap.train) is on {theirs}, and accelerate keeps one device per "
                     f"process: the run would train on {theirs}. Set train__cpu={not settings.cpu} to train there, or "
                     f"train in a process that has made no PartialState or Accelerator (or before making "
                     "one)")  # fmt: skip


def check_trackers_installed(log_with: Sequence[str]) -> None:
    """``ValueError`` naming ``train.log_with`` and the package when a tracker asked for is not installed (accelerate
    drops it with a debug message only, and the run would log nothing there)."""
    from accelerate.tracking import get_available_trackers

    available = {str(getattr(t, "value", t)) for t in get_available_trackers()}
    missing = [t for t in log_with if t != "jsonl" and t not in available]
    if missing:
        raise ValueError(f"train.log_with: {', '.join(missing)} not installed (pip install {' '.join(missing)}); "
                         "nothing would be logged there")  # fmt: skip


def make_accelerator(settings: TrainConfig, run_dir: Path | None = None) -> Accelerator:
    """``Accelerator`` on the CPU when ``train.cpu`` is set, or when launched as several processes (``WORLD_SIZE``)
    on a machine without an accelerator device: accelerate only sets up multi-CPU (gloo) when asked for the CPU, and
    would otherwise run N independent single-process copies. With ``run_dir``, the trackers of ``train.log_with``
    are configured (``jsonl`` writes ``<run_dir>/metrics.jsonl``, the others log under ``<run_dir>/trackers``).
    Note: accelerate 1.15's ``accelerate launch --cpu --num_processes N`` starts a *single* process (its CPU launcher
    needs an MPI hostfile for more), so use ``--multi_gpu`` (torchrun) for several CPU processes."""
    world = launched_processes()
    cpu = _use_cpu(settings)
    _release_precision(settings.mixed_precision)
    trackers: list[Any] = []
    if run_dir is not None:
        check_trackers_installed(settings.log_with)
        # finecap's own jsonl; mlflow with the names it accepts (finecap.train.logging.MlflowTracker)
        trackers = [JsonlTracker(run_dir / METRICS_FILE) if t == "jsonl" else MlflowTracker("finecap") if t == "mlflow"
                    else t for t in settings.log_with]  # fmt: skip
    accelerator = Accelerator(
        cpu=cpu,
        mixed_precision=settings.mixed_precision,
        gradient_accumulation_steps=settings.grad_accum_steps,
        step_scheduler_with_optimizer=False,  # stepped once per optimizer step, whatever the process count
        log_with=trackers or None,
        project_dir=str(run_dir / TRACKERS_DIR) if run_dir is not None else None,
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=False)],
    )
    if accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        raise ValueError(
            f"accelerate: its {accelerator.distributed_type.value} plugin is not supported by finecap; launch with "
            "accelerate launch --multi_gpu (or torchrun) and set train.strategy=fsdp for torch's FSDP2 sharding, "
            "which finecap applies itself (docs/training.md), or train.strategy=ddp"
        )
    if accelerator.num_processes != world:
        raise RuntimeError(f"launched as {world} processes but accelerate set up {accelerator.num_processes}")
    if settings.mixed_precision == "fp16" and accelerator.scaler is None and accelerator.is_main_process:
        log.warning(
            "train.mixed_precision=fp16 on %s: accelerate has no float16 autocast or gradient scaler there, so this "
            "runs in float32; use bf16 for mixed precision on the CPU",
            accelerator.device,
        )
    apply_tf32(settings.tf32, accelerator.device)
    return accelerator


def build_optimizer(model: torch.nn.Module, settings: TrainConfig, no_decay: Sequence[str] = ()) -> torch.optim.AdamW:
    """AdamW over the trainable parameters; weight decay on matrices only (not on biases, norms, scales or the
    parameters named in ``no_decay``)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise ValueError("model: no trainable parameters (check model.train_lm / model.train_encoder)")
    decay = [p for n, p in named if p.ndim >= 2 and n not in no_decay]
    rest = [p for n, p in named if not (p.ndim >= 2 and n not in no_decay)]
    groups = [{"params": decay, "weight_decay": settings.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=settings.lr)


def total_steps(settings: TrainConfig, sampler: GlobalBatchSampler, resumed: dict[str, Any] | None = None) -> int:
    """``train.max_steps``, or the optimizer steps of ``train.epochs`` (a fractional last epoch rounds up).

    ``resumed``: the checked trainer state (``step``, ``epoch``, ``position``) of the checkpoint a resumed run
    continues from. Its steps count as taken, and only the epochs left are counted in ``sampler``'s batches: a
    checkpoint written at an epoch's end with another global batch (another process count,
    ``train.batch_size`` or ``train.grad_accum_steps``) still ends after ``train.epochs`` epochs. For a run resumed
    with its own global batch this is the total of the uninterrupted run; one that trained more epochs than
    ``train.epochs`` gets fewer steps than it took (which :func:`~finecap.train.state.check_resume` refuses)."""
    if settings.max_steps > 0:
        return settings.max_steps
    full = int(settings.epochs)
    steps = sum(sampler.num_batches(e) for e in range(full))
    frac = settings.epochs - full
    if frac > 0:
        steps += math.ceil(frac * sampler.num_batches(full))
    if resumed:  # the steps taken, in place of as many of this run's batches as the epochs they trained
        epoch, position = resumed.get("epoch", 0), resumed.get("position", 0)
        steps += resumed["step"] - position - sum(sampler.num_batches(e) for e in range(epoch))
    return steps


def weighted_loss(losses: dict[str, torch.Tensor], weights: dict[str, float]) -> torch.Tensor:
    """``sum_i w_i * loss_i`` (weight 1.0 when absent); a weight naming no loss of the objective is an error."""
    if not losses:
        raise ValueError("train.objective: the objective returned no losses")
    unknown = set(weights) - set(losses)
    if unknown:
        raise ValueError(
            f"train.loss_weights: {sorted(unknown)} are not losses of this objective; its losses: {sorted(losses)}"
        )
    return sum(weights.get(name, 1.0) * loss for name, loss in losses.items())


def num_items(out: Any, batch: dict[str, Any]) -> float:
    """What a micro-batch's losses are means over (``ObjectiveOutput.num_items``; default: its examples)."""
    if out.num_items is not None:
        return float(out.num_items)
    return float(len(batch["index"]))


def signal(out: Any) -> float:
    """What a micro-batch's output adds to its step's learning signal: the captions that carry one
    (``ObjectiveOutput.scored``), or 1 for an objective without the notion (MLE, SMILE: every item teaches). A step
    whose sum over its micro-batches and processes is 0 has a gradient of 0 and is not taken
    (:meth:`Engine.train_step`)."""
    return 1.0 if out.scored is None else float(out.scored)


def marked_copy(batch: dict[str, Any]) -> dict[str, Any]:
    """``batch`` (a micro-batch that repeats another's examples) with ``step_info.copy`` set
    (:attr:`~finecap.contract.StepInfo.copy`); ``ValueError`` without a ``step_info`` to mark."""
    info = batch.get("step_info")
    if info is None:
        raise ValueError("train_step: a copy micro-batch needs batch['step_info'] to be marked as one")
    return {**batch, "step_info": replace(info, copy=True)}


def reference_items(accelerator: Accelerator, items: float) -> float:
    """The step's reference item count ``R``: the mean over processes of the items of their first micro-batches,
    over those that have items (a copy's are 0; every process calls it at its first micro-batch, copy or not: one
    scalar all-reduce, none with one process); 1 where none has items (a count that is not finite is none). Each
    micro-batch back-propagates ``loss x items / R``, a loss of the order of a mean loss (``items / R`` near 1), and
    the sync multiplies the gradients by ``R`` again."""
    items = items if math.isfinite(items) and items > 0 else 0.0
    count = 1.0 if items > 0 else 0.0
    if accelerator.num_processes > 1:
        total = accelerator.reduce(torch.tensor([items, count], device=accelerator.device), "sum")
        items, count = float(total[0]), float(total[1])
    return items / count if count > 0 else 1.0


def is_better(value: float, best: float | None, mode: str) -> bool:
    """Whether ``value`` improves on ``best`` (``mode`` ``min`` or ``max``); a non-finite value never does."""
    if not math.isfinite(value):
        return False
    if best is None or not math.isfinite(best):
        return True
    return value < best if mode == "min" else value > best


def best_mode(settings: TrainConfig) -> str:
    if settings.best_mode != "auto":
        return settings.best_mode
    return "min" if settings.best_metric in ("loss", "perplexity") else "max"


# ------------------------------------------------------------------------------------------------------------------
# The engine
# ------------------------------------------------------------------------------------------------------------------


@dataclass
class TrainingData:
    """The training examples, how to batch them, which examples form each global batch, and the DataLoader's
    workers and pinning (:class:`finecap.data.loading.LoaderSettings`; default: batches made in the main
    process)."""

    dataset: IndexedDataset
    collator: Callable[[list[dict[str, Any]]], dict[str, Any]]
    sampler: GlobalBatchSampler
    loader: LoaderSettings = field(default_factory=LoaderSettings)


@dataclass
class Checkpoints:
    """Where and how the engine saves: ``save`` (:data:`SaveFn`) writes a model checkpoint; ``config`` is the
    (secret-masked) configuration saved with the run and sent to trackers."""

    run_dir: Path
    save: SaveFn
    config: dict[str, dict[str, Any]] = field(default_factory=dict)


def headline(values: dict[str, Any], names: Sequence[str]) -> dict[str, str]:
    """The training progress bar's values: those of ``names`` (the objective's ``headline``) the step logged, else
    its loss.

    Example::

        >>> headline({"loss": -0.0, "reward": 0.51234, "kl": 0.0213}, ("reward", "kl"))
        {'reward': '0.5123', 'kl': '0.0213'}
        >>> headline({"loss": 2.5}, ("reward", "kl"))
        {'loss': '2.5000'}
    """
    shown = {name: f"{values[name]:.4g}" for name in names if isinstance(values.get(name), int | float)}
    return shown or {"loss": f"{values['loss']:.4f}"}


class Engine:
    """Runs training; see the module docstring.

    Args:
        settings: ``train.*`` (steps or epochs, accumulation, clipping, logging/evaluation/saving cadence, best
            metric, loss weights).
        accelerator: from :func:`make_accelerator`.
        model, objective, data, optimizer, scheduler: what the recipe built (not yet prepared).
        seed: ``run.seed``: per-process dropout seeds and the data order (the sampler's own seed).
        evaluate: :data:`EvaluateFn`, run every ``train.eval_every`` steps (0: each epoch) and at the end.
        checkpoints: where to save (``None``: no checkpoints, e.g. the world encoder).
        callbacks: ``callback(state)`` after every step (tests use one to simulate a kill).
        progress: a progress bar (main process).
        desc: the progress bar's label.
    """

    def __init__(
        self,
        settings: TrainConfig,
        accelerator: Accelerator,
        model: torch.nn.Module,
        objective: ObjectiveBase,
        data: TrainingData,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        *,
        seed: int,
        total: int,
        evaluate: EvaluateFn | None = None,
        checkpoints: Checkpoints | None = None,
        callbacks: Sequence[Callable[[TrainState], None]] = (),
        progress: bool = True,
        desc: str = "train",
    ):
        self.settings, self.accelerator, self.objective, self.data = settings, accelerator, objective, data
        self.seed, self.total, self.evaluate_fn, self.checkpoints = seed, total, evaluate, checkpoints
        self.callbacks, self.progress, self.desc = list(callbacks), progress, desc
        if accelerator.gradient_accumulation_steps != settings.grad_accum_steps:
            raise RuntimeError(
                f"train.grad_accum_steps={settings.grad_accum_steps} but the accelerator accumulates "
                f"{accelerator.gradient_accumulation_steps} (another Accelerator was made after this one: make the "
                "engine's accelerator last)"
            )
        self.sharded = sharding.is_sharded(model)
        if self.sharded:  # FSDP2, applied by the recipe before the optimizer was built: no DDP wrapper
            self.model = model
            self.optimizer, self.scheduler = accelerator.prepare(optimizer, scheduler)
        else:
            self.model, self.optimizer, self.scheduler = accelerator.prepare(model, optimizer, scheduler)
        self.state = TrainState()
        self.logger = Logger(accelerator)
        self.last_saved: tuple[Path, int] | None = None
        self.last_values: dict[str, float] = {}  # the last step's logged values
        self.mode = best_mode(settings)
        self.skipped = SkippedSteps(settings.max_skipped_steps)  # fp16: steps the gradient scaler skipped
        self._loader: DataLoader | None = None  # the run's one training DataLoader (epoch_loader)
        self._plan: StepBatches | None = None  # its batch sampler, pointed at each epoch's batches
        self._worker_seeds = torch.Generator()
        seed_everything(seed + accelerator.process_index)  # different dropout on each process; restore() overrides

    # -- state ---------------------------------------------------------------------------------------------------

    def _optimizer_state(self) -> dict[str, Any]:
        """The optimizer's state: torch's own (indexed by parameter) or, sharded, the full state keyed by parameter
        names (:func:`finecap.models.sharding.optimizer_state`; every process must call it then)."""
        if self.sharded:
            return sharding.optimizer_state(self.model, self.optimizer.optimizer)
        return self.optimizer.state_dict()

    def _main_state(self, optimizer: dict[str, Any] | None = None) -> dict[str, Any]:
        """What the main process saves (``optimizer``: :meth:`_optimizer_state`, gathered beforehand when sharded)."""
        scaler = self.accelerator.scaler
        return {
            "optimizer": self._optimizer_state() if optimizer is None else optimizer,
            "scheduler": self.scheduler.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "skipped_steps": self.skipped.state_dict(),
        }

    def _process_state(self) -> dict[str, Any]:
        return {"rng": rng_state(), "objective": self.objective.state_dict(), "logger": self.logger.state_dict()}

    def restore(self, folder: Path) -> None:
        """Continue from the resumable checkpoint ``folder`` (the model itself was built from ``folder/model``).

        Nothing read is trusted: the counters are checked (types, ranges, against this run's steps and its epoch's
        batches: :func:`~finecap.train.state.read_info`, :func:`~finecap.train.state.check_resume`), the scheduler's
        step must be the counters' step, the optimizer's, scheduler's and scaler's saved settings must be this run's
        configuration (:func:`~finecap.train.resume_checks.check_main_state`: torch would otherwise apply the saved
        ones over it), and a state the optimizer, scheduler, RNG, logger or objective refuses is a
        :class:`~finecap.train.state.CheckpointError` naming its file (:func:`~finecap.train.state.state_errors`)."""
        info = read_info(folder)
        check_resume(info, folder, self.total, self.data.sampler.num_batches, self.global_batch,
                     self.data.sampler.batches)  # fmt: skip
        for key, value in asdict(TrainState()).items():
            setattr(self.state, key, info.get(key, value))
        self._keep_best_of_this_metric(info, folder)
        self._forget_a_best_of_redone_steps(folder)
        main = load_tree(folder / STATE_DIR, "main")
        main_file = folder / STATE_DIR / "main.json"
        with state_errors(main_file, "the optimizer and scheduler state"):
            scheduled = main["scheduler"].get("last_epoch", self.state.step)
            if scheduled != self.state.step:  # the scheduler steps once per optimizer step
                raise CheckpointError(
                    f"{main_file}: the learning-rate scheduler is at step {short_repr(scheduled)}, but "
                    f"{folder / INFO_FILE} says step {self.state.step}: one of them was changed"
                )
            named = sharding.is_named_optimizer_state(main["optimizer"])  # written by a sharded run
            if self.sharded and not named:  # written unsharded (DDP, or one process): keyed by names here
                try:
                    main["optimizer"] = sharding.named_optimizer_state(unwrap(self.model), self.optimizer.optimizer,
                                                                       main["optimizer"])  # fmt: skip
                except ValueError as e:
                    raise CheckpointError(f"{main_file}: the optimizer state does not fit this model: {e}") from None
                named = True
            scheduler = getattr(self.scheduler, "scheduler", self.scheduler)  # accelerate's wrapper, or torch's own
            check_main_state(main, optimizer=self.optimizer.optimizer, scheduler=scheduler,
                             scaler=self.accelerator.scaler, path=main_file, step=self.state.step,
                             saved_total=info.get("total_steps", self.total))  # fmt: skip
            if named:
                sharding.load_optimizer_state(unwrap(self.model), self.optimizer.optimizer, main["optimizer"])
            else:
                self.optimizer.load_state_dict(main["optimizer"])
            self.scheduler.load_state_dict(main["scheduler"])
            apply_schedule(scheduler)  # the configured schedule's rate at the step (an extended run's new one)
            if main["scaler"] is not None and self.accelerator.scaler is not None:
                self.accelerator.scaler.load_state_dict(main["scaler"])
            if "skipped_steps" in main:  # absent in checkpoints of finecap before train.max_skipped_steps
                self.skipped.load_state_dict(main["skipped_steps"])
        processes = int(info.get("num_processes", 1))
        index = self.accelerator.process_index
        if processes == self.accelerator.num_processes:
            mine = load_tree(folder / STATE_DIR, f"process_{index}")
            with state_errors(folder / STATE_DIR / f"process_{index}.json", "the random, logger and objective state"):
                set_rng_state(mine["rng"])
                self.logger.load_state_dict(mine["logger"])
                self.objective.load_state_dict(mine["objective"])
        else:
            # a process of the checkpoint's: the pending log values (the step's loss and parts and the learning rate
            # are every process's alike; the objectives' other values that process's) and the objective state
            mine = load_tree(folder / STATE_DIR, f"process_{min(index, processes - 1)}")
            with state_errors(folder / STATE_DIR / f"process_{min(index, processes - 1)}.json",
                              "the logger and objective state"):  # fmt: skip
                self.logger.load_state_dict(mine["logger"])
                self.objective.load_state_dict(mine["objective"])
            if self.accelerator.is_main_process:
                log.warning(
                    "resume: the checkpoint was written by %d processes, now %d; random states are re-seeded, "
                    "so the continuation is not bit-identical",
                    processes,
                    self.accelerator.num_processes,
                )
            # from (run.seed, step) as an epoch's draws are, and the process: runs of other seeds draw otherwise
            seed_everything((epoch_seed(self.seed, self.state.step) + index) % 2**64)
        self.last_saved = (folder, self.state.step)

    def _save(self, path: Path, info: dict[str, Any], *, resumable: bool) -> None:
        """Write a checkpoint at ``path`` (``resumable``: with ``state/``), atomically; every process takes part."""
        acc, ckpt = self.accelerator, self.checkpoints
        assert ckpt is not None
        tmp = temporary_dir(path)
        if resumable:
            if acc.is_main_process:
                refuse_link(tmp)  # a link planted at .last.tmp is named, never deleted or written through
                check_swap(path, CHECKPOINT_KIND, is_checkpoint_folder)  # a folder of the user's there stops it
                remove_unfinished_checkpoint(tmp)  # this run's unfinished save (a finished one was promoted on resume)
                new_checkpoint_folder(tmp)
            acc.wait_for_everyone()
            save_tree(tmp / STATE_DIR, f"process_{acc.process_index}", self._process_state())
            optimizer = self._optimizer_state()  # sharded: gathered by every process
            if acc.is_main_process:
                save_tree(tmp / STATE_DIR, "main", self._main_state(optimizer))
            acc.wait_for_everyone()
        state_dict = sharding.model_state(self.model) if self.sharded else acc.get_state_dict(self.model)
        if acc.is_main_process:
            ckpt.save(path, state_dict=state_dict, info=info, keep_tmp_contents=resumable)
        acc.wait_for_everyone()

    def _info(self) -> dict[str, Any]:
        return {**asdict(self.state), "best_metric": self.settings.best_metric, "best_mode": self.mode,
                "total_steps": self.total, "num_processes": self.accelerator.num_processes,
                "global_batch": self.global_batch, "sharded": self.sharded,
                "device": self.accelerator.device.type,  # with train.mixed_precision: whether it autocast
                **({"trained": trained_digest(self._plan.batches, self.state.position)}
                   if self._plan is not None and self.state.position else {})}  # fmt: skip

    @property
    def global_batch(self) -> int:
        """Examples a step: ``train.batch_size × processes × train.grad_accum_steps``."""
        return self.settings.batch_size * self.accelerator.num_processes * self.settings.grad_accum_steps

    def _keep_best_of_this_metric(self, info: dict[str, Any], folder: Path) -> None:
        """Forget the restored best value when it was chosen by another ``train.best_metric`` or ``best_mode`` than
        this run's (a loss of 2.4 would otherwise stand as the best CIDEr-D for ever): the next validation starts
        the best anew. A checkpoint of finecap before ``best_metric`` was recorded: the ``best`` checkpoint's own
        ``metric`` says it."""
        if self.state.best_value is None:
            return
        metric, mode = info.get("best_metric"), info.get("best_mode")
        if metric is None:
            with contextlib.suppress(OSError, ValueError):  # bounded and strict, as every metadata file is read
                best = read_json(folder.parent / BEST / INFO_FILE)
                metric = best.get("metric") if isinstance(best, dict) else None
        if (metric is None or metric == self.settings.best_metric) and (mode is None or mode == self.mode):
            return
        if self.accelerator.is_main_process:
            log.warning("resume: the best so far (%s at step %s) was chosen by %s (%s); this run selects by %s "
                        "(%s): the next validation starts the best anew", self.state.best_value,
                        self.state.best_step, metric or self.settings.best_metric, mode or "its mode",
                        self.settings.best_metric, self.mode)  # fmt: skip
        self.state.best_value = self.state.best_step = None

    def _forget_a_best_of_redone_steps(self, folder: Path) -> None:
        """Forget the restored best value when the run's ``best`` was saved at a later step than ``folder``, the
        checkpoint resumed from: the run was killed after saving ``best`` and before the next ``last`` (at the same
        step: ``best`` is saved first; or later, under ``train.save_every``). The resumed run redoes that step, and
        unless it does so bit for bit (another process count, kernels that are not deterministic) ``best`` holds a
        model of steps the run no longer took, with values its ``metrics.jsonl`` (truncated to ``folder``'s step)
        does not hold, while the restored best value is another step's, whose model that save replaced. The next
        validation saves ``best`` anew, so ``best``, the run's best value and step, and its log agree again; a
        bit-exact redo saves the same ``best`` again at that step."""
        saved = None
        with contextlib.suppress(OSError, ValueError):  # no best, or unreadable: nothing to reconcile
            saved = read_json(folder.parent / BEST / INFO_FILE)
        step = saved.get("step") if isinstance(saved, dict) else None
        if type(step) is not int or step <= self.state.step:
            return
        if self.accelerator.is_main_process:
            log.warning("resume: %s was saved at step %d, after this checkpoint's step %d (a run killed before it "
                        "saved last there): the steps are redone, and the next validation saves best anew",
                        folder.parent / BEST, step, self.state.step)  # fmt: skip
        self.state.best_value = self.state.best_step = None

    def save_last(self) -> None:
        assert self.checkpoints is not None
        path = checkpoint_dir(self.checkpoints.run_dir, LAST)
        self._save(path, self._info(), resumable=True)
        self.last_saved = (path, self.state.step)

    def _maybe_save_best(self, values: dict[str, Any]) -> None:
        metric = self.settings.best_metric
        numbers = {k: v for k, v in values.items() if not isinstance(v, str)}
        if metric not in numbers:
            raise ValueError(
                f"train.best_metric: {metric!r} is not a validation value; available: {', '.join(sorted(numbers))} "
                "(add a validator with train.validators)"
            )
        if not is_better(float(numbers[metric]), self.state.best_value, self.mode):
            return
        self.state.best_value, self.state.best_step = float(numbers[metric]), self.state.step
        if self.checkpoints is not None:
            info = {**self._info(), "metric": metric, "values": numbers}
            self._save(checkpoint_dir(self.checkpoints.run_dir, BEST), info, resumable=False)

    # -- steps ---------------------------------------------------------------------------------------------------

    def _diverged(self, what: str) -> TrainingDiverged:
        where = (
            f"last good checkpoint: {self.last_saved[0]} (step {self.last_saved[1]})"
            if self.last_saved
            else "no checkpoint was saved yet"
        )
        return TrainingDiverged(
            f"train: {what} at step {self.state.step + 1}; training stopped ({where}). Lower train.lr (now "
            f"{self.settings.lr:g}) or check the data, then resume or restart"
        )

    def train_step(self, micro_batches: list[dict[str, Any]], copies: Sequence[bool] = ()) -> dict[str, float]:
        """One optimizer step over this process's micro-batches of a global batch; returns the values to log (total
        and per-part losses, objective metrics, lr, grad norm), averaged over the micro-batches (an extreme such as
        ``advantage/min``: the extreme over them, :data:`~finecap.train.logging.EXTREMES`; seconds such as
        ``time/generate``: their sum, the step's, a copy's included, :func:`~finecap.train.logging.step_sum`); the
        total ``loss``
        and its parts ``loss/<name>`` are the step's: item-weighted means over every process's micro-batches (the
        loss whose gradient the step takes, and each part's share of it: ``loss = sum(w * loss/<name>)``), so they
        do not change with the process count or accumulation. ``copies``: which micro-batches repeat another's
        examples (:func:`~finecap.data.samplers.repeated_micro_batches`, a global batch smaller than processes x
        accumulation steps); they run (every process steps in step) with weight 0, so they add nothing to the
        step's loss and gradient, their values are left out of the logged means (a process whose every micro-batch
        is a copy logs none of the objective's values: the other processes' are the step's), and the objective
        sees each marked (``batch["step_info"].copy``, :func:`marked_copy`), to leave it out of what it sums over
        the step (the reward-hacking monitor's measures, the batch statistics of advantages, a running-mean
        baseline). Until 2026-11-28 the copies' values were logged as another micro-batch's, and the monitor counted
        their captions again.

        Gradient: without accumulation on one process, that of the micro-batch's loss itself; otherwise each
        micro-batch back-propagates ``loss x items / R`` (``R``: :func:`reference_items`, taken at the first
        micro-batch, on one process at the first that has items; of the order of the mean loss, so fp16's scaled
        gradients do not overflow for the item counts' sake) and the sync multiplies the gradients by ``processes x
        accumulation x R / (the step's items)``: the step's gradient is that of the item-weighted mean loss over every
        process's micro-batches, up to float rounding. Every process, a copy's included, takes part in the same
        collectives in the same order (FSDP2).

        A step none of whose captions carries a learning signal (``ObjectiveOutput.scored``, summed over every
        micro-batch and process) is not taken: no clipping, no ``optimizer.step``, no ``grad_norm``; it logs
        ``skipped/unscored`` 1 (0 at the other steps of an objective that reports ``scored``) and warns (module
        docstring). The objective's ``update_skipped`` runs before its ``end_step`` after this skip and the fp16
        scaler's."""
        acc, model, optimizer = self.accelerator, self.model, self.optimizer
        if not model.training:  # a recursive walk over every module: only after an evaluation
            model.train()
        # One process, no accumulation: the micro-batch is the global batch, its loss is already the mean over the
        # step's items, and the gradient needs no rescaling (saves a pass over every gradient per step).
        single = acc.num_processes * acc.gradient_accumulation_steps == 1
        optimizer.zero_grad(set_to_none=True)  # at the start, so the step's gradients stay inspectable after it
        # the logged values' means over the micro-batches (extremes: extremes; seconds: sums; NaN: where all are)
        means = Means(summed=step_sum)
        local_items, local_bad, local_loss = 0.0, 0.0, 0.0  # local_loss: the item-weighted sum of the losses
        local_signal = 0.0  # the captions with a signal (ObjectiveOutput.scored; 1 per micro-batch without one)
        reports_scored = False  # whether the objective says what it scored (the RL family)
        unscored = False  # set at the sync: no caption of any process carries a signal (the update is skipped)
        local_parts: dict[str, float] = {}  # the item-weighted sum of each part
        step_losses: dict[str, float] = {}  # the step's loss and parts, means over all its items (not of the means)
        grad_norm = None
        reference: float | None = None  # R: every micro-batch back-propagates its loss x items / R (not single)
        lr = optimizer.param_groups[0]["lr"]
        copies = list(copies) or [False] * len(micro_batches)
        micro_batches = [marked_copy(b) if copy else b for b, copy in zip(micro_batches, copies, strict=True)]
        with acc.autocast():
            self.objective.begin_step(model, micro_batches)  # e.g. the GRPO family's rollouts of the whole step
        for batch, copy in zip(micro_batches, copies, strict=True):
            with acc.accumulate(model):
                with acc.autocast():
                    out = self.objective(model, batch)
                    loss = weighted_loss(out.losses, self.settings.loss_weights)
                items = 0.0 if copy else num_items(out, batch)  # a copy's items are counted where it was cut from
                local_items += items
                reports_scored |= out.scored is not None
                local_signal += 0.0 if copy else signal(out)
                loss_value = loss.item()
                parts = {f"loss/{k}": v.item() for k, v in out.losses.items()}
                local_loss += loss_value * items
                for k, v in parts.items():
                    local_parts[k] = local_parts.get(k, 0.0) + v * items
                local_bad += 0.0 if math.isfinite(loss_value) else 1.0
                if single and local_bad:
                    raise self._diverged("the loss is not finite")
                if not single:  # an item-weighted sum over R items, normalised at the sync below
                    # R before any backward, the same everywhere: at the first micro-batch (a collective), or on one
                    # process at the first that has items (those before it back-propagate 0 whatever R is)
                    if reference is None and (acc.num_processes > 1 or items > 0):
                        reference = reference_items(acc, items)
                    loss = loss * (items / (reference or 1.0))
                acc.backward(loss)
                if acc.sync_gradients:
                    params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
                    step_signal = local_signal
                    if not single:  # every process learns the global item count and whether any loss diverged
                        names = sorted(local_parts)  # the objective's parts: the same on every process
                        counts = acc.reduce(torch.tensor([local_items, local_bad, local_signal, local_loss,
                                                          *(local_parts[k] for k in names)], device=acc.device),
                                            "sum")  # fmt: skip
                        if counts[1] > 0:
                            raise self._diverged("the loss is not finite")
                        step_signal = float(counts[2])  # the same on every process: all skip, or all step
                        step_losses = {k: float(v / counts[0]) for k, v in zip(["loss", *names], counts[3:],
                                                                                  strict=True)}  # fmt: skip
                        scale = acc.num_processes * acc.gradient_accumulation_steps * (reference or 1.0)
                        factor = scale / (float(counts[0]) or 1.0)  # no items: every loss weighted 0, each gradient 0
                        torch._foreach_mul_([p.grad for p in params], factor)  # undo DDP mean x 1/steps x 1/R; / items
                    unscored = step_signal == 0  # no caption of the step carries a signal: its gradient is 0
                    if not unscored:  # skipped: no clipping either (FSDP2's norm is a collective every process skips)
                        max_norm = self.settings.grad_clip if self.settings.grad_clip > 0 else float("inf")
                        norm = acc.clip_grad_norm_(params, max_norm)  # of the unscaled gradients
                        grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # DTensor
                        if not math.isfinite(grad_norm) and acc.scaler is None:  # nothing would skip the update
                            raise self._diverged(f"the gradient norm is {grad_norm}")
                # accelerate skips it until the synchronising micro-batch; an fp16 gradient scaler skips a step whose
                # gradients overflowed (and lowers its scale); a step no caption of which has a signal is not taken:
                # AdamW would move the weights by its momentum and weight decay alone, with nothing learned
                if not unscored:
                    optimizer.step()
            if not copy:  # a copy's values are counted where it was cut from
                means.add({"loss": loss_value, **parts, **out.metrics})
            else:  # but the seconds spent on it were spent: the step's seconds include them
                means.add({k: v for k, v in out.metrics.items() if step_sum(k)})
        if not acc.sync_gradients:
            raise RuntimeError("train.grad_accum_steps: the step ended without a synchronising micro-batch")
        scaler_values = self._scaler_step(grad_norm) if acc.scaler is not None and not unscored else {}
        if unscored:
            self._unscored_step()
        # Also after a skipped step: the schedule is a function of the step (module docstring). torch warns when the
        # first optimizer.step did not run, which is what a skip means.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
            self.scheduler.step()
        values = means.means()
        values.update(step_losses)  # the metrics stay means over the micro-batches
        skipped = unscored or scaler_values.get("skipped")
        grad = {} if skipped else {"grad_norm": grad_norm if grad_norm is not None else math.nan}
        unscored_values = {"skipped/unscored": float(unscored)} if reports_scored else {}
        values = {**values, "lr": lr, **grad, **scaler_values, **unscored_values}
        try:  # a skipped step left the weights as they were (an RL objective's rollout engine needs no sync)
            if skipped:
                self.objective.update_skipped()
            self.objective.end_step()
        except StopTraining as stop:  # the step ran: its values go with the stop, for the log (_fit)
            stop.values = {**values, **self.objective.step_values()}
            raise
        values.update(self.objective.step_values())  # the whole step's, in place of a mean over the micro-batches
        return values

    def _unscored_step(self) -> None:
        """After a step no caption of which carries a learning signal (every process's micro-batches:
        ``ObjectiveOutput.scored`` 0), whose update was skipped: say so (main process)."""
        if self.accelerator.is_main_process:
            log.warning(
                "train: step %d: no caption of the step carries a learning signal (a reward could score none of its "
                "global batch, or none it scored has a baseline to compare with: see reward/failed and "
                "reward_greedy/failed); the optimizer update is skipped, and the step still counts for "
                "train.max_steps and the learning-rate schedule (docs/training.md)",
                self.state.step + 1,
            )  # fmt: skip

    def _scaler_step(self, grad_norm: float | None) -> dict[str, float]:
        """After an optimizer step with an fp16 gradient scaler: count it as skipped or taken (:class:`SkippedSteps`),
        log a skip, stop after more than ``train.max_skipped_steps`` in a row; the values to log (``skipped``: 1 or
        0, whose mean over a logging window is the fraction of skipped steps; ``loss_scale``: the scale after it)."""
        skipped = bool(self.optimizer.step_was_skipped)
        scale = float(self.accelerator.scaler.get_scale())
        limit = self.settings.max_skipped_steps
        if self.skipped.record(skipped):
            raise self._diverged(
                f"the fp16 gradient scaler skipped {self.skipped.consecutive} consecutive steps (gradients not "
                f"finite; loss scale now {scale:g}), more than train.max_skipped_steps={limit}"
            )
        if skipped and self.accelerator.is_main_process:
            log.warning(
                "train: step %d: the gradients overflowed (norm %s); the fp16 gradient scaler skipped the update and "
                "lowered its scale to %g (%d consecutive skipped steps, train.max_skipped_steps=%d)",
                self.state.step + 1, grad_norm, scale, self.skipped.consecutive, limit,
            )  # fmt: skip
        return {"skipped": float(skipped), "loss_scale": scale}

    def epoch_loader(self, batches: list[list[int]]) -> DataLoader:
        """This process's micro-batches of the epoch's global batches from ``state.position`` on
        (``grad_accum_steps`` consecutive ones per optimizer step), from the run's one DataLoader.

        The DataLoader is built at the first epoch and kept (so are its workers with ``data.persistent_workers``);
        its batch sampler (:class:`~finecap.data.samplers.StepBatches`) is pointed at each epoch's batches before the
        epoch is iterated, so the batches are those of a new loader per epoch. The private generator drawing the
        workers' seeds is re-seeded with ``(seed, epoch)`` each epoch, as a per-epoch loader's was: creating an
        iterator must not consume the global RNG (a resumed run creates its iterator mid-epoch, the uninterrupted
        one at the epoch start). Persistent workers draw their seeds once, at the first epoch this process runs;
        finecap's examples use no randomness in the workers, so the batches do not depend on it."""
        if not batches:
            raise ValueError(f"data.sampler: no batches in epoch {self.state.epoch}")
        if self._loader is None:
            acc = self.accelerator
            self._plan = StepBatches([], rank=acc.process_index, world=acc.num_processes,
                                     accum=self.settings.grad_accum_steps)  # fmt: skip
            self._loader = self.data.loader.loader(self.data.dataset, self._plan, self.data.collator,
                                                   generator=self._worker_seeds)  # fmt: skip
        assert self._plan is not None
        self._plan.batches, self._plan.start = batches, self.state.position
        self._worker_seeds.manual_seed(epoch_seed(self.seed, self.state.epoch))
        return self._loader

    def close_loader(self) -> None:
        """Drop the run's DataLoader (its workers stop); the next epoch would build a new one."""
        self._loader, self._plan = None, None

    def step_info(self, global_batch: list[int], fields: dict[str, dict[int, int]]) -> StepInfo:
        ids = [self.data.dataset.image_id(i) for i in global_batch]
        values = {name: torch.tensor([table[i] for i in global_batch]) for name, table in fields.items()}  # (G,) each
        return StepInfo(self.state.step, ids, values)

    def evaluate(self) -> dict[str, Any]:
        """The recipe's evaluation on the bare model (no gradient, no DDP wrapper), the main process's values on
        every process."""
        assert self.evaluate_fn is not None
        bare = unwrap(self.model)
        bare.eval()
        # sharded: full parameters on every process for the whole evaluation (finecap.models.sharding.decoding)
        with sharding.decoding(bare), torch.no_grad(), self.accelerator.autocast():  # the run's mixed precision
            values = self.evaluate_fn(bare)
        bare.train()
        if self.accelerator.num_processes > 1:  # every process selects checkpoints on the main process's values
            values = broadcast_object_list([values])[0]
        return values

    # -- the loop ------------------------------------------------------------------------------------------------

    def _log_stop(self, stop: StopTraining, batches_in_epoch: int, described: dict[str, Any]) -> None:
        """The objective ended training after the step that just ran (:class:`StopTraining`): log that step's values
        with those since the last log event (up to ``train.log_every - 1`` steps, which the run would otherwise never
        write), then the reason as a ``stop`` event at that step (``text.reason``). The state is not advanced: the
        run ends here, and a resume starts from the last checkpoint, whose later events it drops."""
        state = self.state
        step, epoch = state.step + 1, state.epoch + (state.position + 1) / batches_in_epoch
        if stop.values is not None:
            self.logger.add({**stop.values, **described})
        if self.logger.sums:
            self.logger.flush_train(step, epoch)
        self.logger.write(step, epoch, "stop", {"reason": str(stop)})

    def fit(self) -> TrainState:
        """Train to ``total`` steps (from the restored state, if any); returns the final state."""
        acc, settings, state = self.accelerator, self.settings, self.state
        progress = tqdm(total=self.total, initial=state.step, desc=self.desc,
                        disable=not progress_enabled(self.progress and acc.is_main_process))  # fmt: skip
        accum = settings.grad_accum_steps
        try:
            with torch.enable_grad():  # a caller's no_grad (a notebook's inference cell) must not reach the steps
                self._fit(progress, accum)
        finally:
            self.close_loader()
            self.objective.close()  # e.g. the vLLM engine of REINFORCE's rollouts (decode.engine=vllm)
            # an error or Ctrl-C too: a notebook keeps the traceback, and an open bar there would stay open,
            # redrawn under the next run's bar
            progress.close()
        acc.wait_for_everyone()
        return state

    def _fit(self, progress: tqdm, accum: int) -> None:
        """:meth:`fit`'s loop over epochs and steps."""
        acc, settings, state = self.accelerator, self.settings, self.state
        while state.step < self.total:
            batches = self.data.sampler.batches(state.epoch)
            fields = self.data.sampler.example_fields(state.epoch)
            described = self.data.sampler.epoch_values(state.epoch)  # e.g. BagCurri's bags/filled, logged each step
            pending: list[dict[str, Any]] = []
            for micro in self.epoch_loader(batches):
                for name, table in fields.items():  # the micro-batch's own rows, e.g. batch["bag"] (B,)
                    micro[name] = torch.tensor([table[int(i)] for i in micro["index"]])
                pending.append(micro)
                if len(pending) < accum:
                    continue
                info = self.step_info(batches[state.position], fields)
                micro_batches = [to_device({**mb, "step_info": info}, acc.device) for mb in pending]
                pending = []
                copies = repeated_micro_batches(len(batches[state.position]), acc.process_index, acc.num_processes,
                                                accum)  # fmt: skip
                try:
                    values = self.last_values = self.train_step(micro_batches, copies)
                except StopTraining as stop:
                    self._log_stop(stop, len(batches), described)
                    raise
                self.logger.add({**values, **described})
                end_of_epoch = state.advance(len(batches))
                epoch = state.epoch + state.position / len(batches)
                progress.update(1)
                shown = headline(values, getattr(self.objective, "headline", ("loss",)))
                progress.set_postfix(**shown, epoch=f"{epoch:.2f}", refresh=False)
                done = state.step >= self.total
                if done or state.step % settings.log_every == 0:
                    self.logger.flush_train(state.step, epoch)
                every = settings.eval_every
                due = done or (state.step % every == 0 if every else end_of_epoch)
                evaluated = self.evaluate_fn is not None and due
                if evaluated:
                    val = self.evaluate()
                    self.logger.write(state.step, epoch, "val", val)
                    self._maybe_save_best(val)
                save_every = settings.save_every
                if self.checkpoints is not None and (
                    done or (state.step % save_every == 0 if save_every else evaluated)
                ):
                    self.save_last()
                for callback in self.callbacks:
                    callback(state)
                if done or end_of_epoch:
                    break
