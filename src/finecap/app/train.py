"""The one training loop: any objective, on ``accelerate``, resumable, single- or multi-process.

``train(cfg)`` builds the captioner (``train.init_from`` or a fresh ``model.kind``: :mod:`finecap.models.backbones`),
the objective named by ``train.objective``, the training data (one example per reference caption, or per image for
objectives that sample captions: :func:`train_unit`), and runs
AdamW with warmup + linear/cosine/constant decay and gradient clipping. Every step the objective's named losses
are weighted (``train.loss_weights``) and summed; every part is logged. Every ``train.eval_every`` steps (0: each
epoch) and at the end it evaluates on the validation split: the teacher-forced MLE token loss (``loss``, always,
whatever the objective, so runs are comparable) plus every validator's values; the best value of
``train.best_metric`` selects ``checkpoints/best``. Events go to the trackers (``metrics.jsonl`` by default); the
resolved config to ``config.yaml``; layout and atomic writes in :mod:`finecap.train.checkpoint`.

Validators are callables ``validator(model, cfg, accelerator) -> dict[str, float]`` run on every process at each
evaluation (they shard their own work and gather results, e.g. with :func:`finecap.caption.generate_captions`). They
come from ``train.validators`` (names of :data:`VALIDATORS`, or ``"pkg.module:factory"`` with ``factory(cfg)``
returning the validator) and from the ``validators`` argument. Example: a self-retrieval validator returning
``{"r@1": ...}`` with ``train.best_metric=r@1`` keeps the checkpoint that retrieves best, as SMILE does.

Distribution is accelerate's own: the model, optimizer and scheduler go through ``accelerator.prepare``, so
under ``accelerate launch`` (or ``torchrun``) the captioner is wrapped in ``DistributedDataParallel`` and DDP averages
the gradients, overlapping the communication with backward. Every gradient flows through the captioner's ``forward``
(:mod:`finecap.models.captioner`); decoding runs on the unwrapped model under ``no_grad``. Gradient accumulation is
``accelerator.accumulate`` with ``train.grad_accum_steps`` micro-batches per optimizer step; the **effective batch**
is ``train.batch_size x processes x train.grad_accum_steps``.

Each optimizer step takes one *global batch* from the sampler (:mod:`finecap.data.samplers`) and cuts it into
``processes x grad_accum_steps`` micro-batches (:func:`finecap.data.samplers.step_micro_batches`). So that a step's
gradient is that of the objective over the whole global batch, whatever the split, every micro-batch's loss (a mean
over its items: tokens for MLE and SMILE, captions for REINFORCE; ``ObjectiveOutput.num_items``) is weighted by its
item count, and at the synchronising micro-batch the gradients are multiplied by ``processes x accumulation /
(items of the global batch)``: DDP's average and accelerate's division by the accumulation steps are undone and
the sum is divided by the global item count (the normalisation torchtune and transformers' Trainer use). Every
micro-batch also carries the global batch's image ids (``step_image_ids``, and ``step_bags`` with BagCurri) and the
step number (``step``), so that rewards scoring against the global batch (self-retrieval distractors) and seeded
sampling do not depend on the number of processes or accumulation steps; objectives with per-step state (a running
mean baseline) update it once per optimizer step (``end_step``). The equivalence tests
(``tests/train/test_equivalence.py``) check that 2 processes x batch b, and 1 process x batch b x 2 accumulation
steps, give the parameters of 1 process x batch 2b.

Logged values are averaged over micro-batches and processes and go to the trackers of ``train.log_with`` through
``accelerator.log`` (``jsonl``: ``metrics.jsonl``, one event per line; ``tensorboard``, ``wandb``, ``mlflow``, ...
as accelerate supports them, under ``<run>/trackers``); at each evaluation the greedy captions of the first
``train.log_captions`` validation images are logged as text. Only the main process writes. On a machine without
GPU the processes run on the CPU (gloo). Note: accelerate 1.15's ``accelerate launch --cpu --num_processes N`` starts
a *single* process (its CPU launcher needs an MPI hostfile for more), so use ``--multi_gpu`` (torchrun) for several
CPU processes.

Checkpoints never assume full replicas: the weights come from ``accelerator.get_state_dict`` (a collective that
gathers sharded weights) and are written by the main process in the backbone's own format; the optimizer,
scheduler, gradient-scaler and per-process RNG states go through ``accelerator.save_state`` / ``load_state``
(which handle sharded optimizers), next to this loop's own counters and every process's objective and logger state.

Resuming (``resume=True``) restores the model, optimizer, scheduler, objective state, every process's RNG states and
the position in the epoch from ``checkpoints/last``; the batches of an epoch are a function of ``(run.seed, epoch)``,
so a resumed run takes the same steps, on the same data, as an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from accelerate import Accelerator
from accelerate.tracking import GeneralTracker
from accelerate.utils import DistributedDataParallelKwargs, broadcast_object_list, gather_object
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from finecap.app.retriever import ensure_world_encoder
from finecap.app.validators import VALIDATORS
from finecap.config import Config, DecodeConfig
from finecap.data.datasets import CaptionCollator, CaptionDataset, load_records, model_collator, to_device
from finecap.data.features import model_features
from finecap.data.samplers import StepBatches, get_sampler, process_slice
from finecap.models.backbones import build_model as build_captioner
from finecap.models.backbones import load_captioner
from finecap.models.lora import configure_training
from finecap.objectives import TrainContext, get_objective
from finecap.objectives.base import unwrap
from finecap.objectives.mle import IGNORE_INDEX, mle_loss
from finecap.registry import lookup
from finecap.train.checkpoint import BEST, LAST, checkpoint_dir, model_dir, save_checkpoint, temporary_dir
from finecap.train.schedule import build_scheduler
from finecap.utils import append_jsonl, atomic_write_text, seed_everything

Validator = Callable[[torch.nn.Module, Config, Accelerator], dict[str, float]]

METRICS_FILE = "metrics.jsonl"
TRACKERS_DIR = "trackers"
ACCELERATE_STATE = "accelerate"  # accelerate's save_state folder inside checkpoints/last


@dataclass
class TrainState:
    """Counters saved in every checkpoint. ``position``: global batches of ``epoch`` already trained on."""

    step: int = 0
    epoch: int = 0
    position: int = 0
    best_value: float | None = None
    best_step: int | None = None

    def advance(self, batches_in_epoch: int) -> bool:
        """Count one optimizer step; returns whether it ended the epoch (then moves to the next one)."""
        self.step += 1
        self.position += 1
        if self.position < batches_in_epoch:
            return False
        self.epoch, self.position = self.epoch + 1, 0
        return True


@dataclass
class TrainData:
    train: CaptionDataset
    val: CaptionDataset
    collator: CaptionCollator
    train_records: list


# ------------------------------------------------------------------------------------------------------------------
# Trackers
# ------------------------------------------------------------------------------------------------------------------


class JsonlTracker(GeneralTracker):
    """accelerate tracker ``jsonl``: one line per event in ``metrics.jsonl``,
    ``{"step", "epoch", "split", "values", "text"?}``; keys logged as ``"<split>/<name>"`` are grouped by split,
    string values go to ``text``."""

    name = "jsonl"
    requires_logging_directory = False
    main_process_only = True

    def __init__(self, path: Path):
        super().__init__()
        self.path = Path(path)

    @property
    def tracker(self) -> Path:
        return self.path

    def store_init_configuration(self, values: dict) -> None:  # the run's config.yaml holds it
        pass

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        epoch = values.get("epoch")
        splits: dict[str, dict[str, Any]] = {}
        for key, value in values.items():
            if key == "epoch" or "/" not in key:
                continue
            split, name = key.split("/", 1)
            splits.setdefault(split, {})[name] = value
        for split, items in splits.items():
            record: dict[str, Any] = {"step": step, "epoch": epoch, "split": split}
            record["values"] = {k: v for k, v in items.items() if not isinstance(v, str)}
            text = {k: v for k, v in items.items() if isinstance(v, str)}
            if text:
                record["text"] = text
            append_jsonl(self.path, record)


def tracker_config(cfg: Config) -> dict[str, int | float | str | bool]:
    """The configuration flattened to ``section.key`` scalars (what trackers' hyper-parameter tables accept)."""
    flat = {}
    for section, values in cfg.to_dict().items():
        for key, value in values.items():
            ok = isinstance(value, int | float | str | bool)
            flat[f"{section}.{key}"] = value if ok else json.dumps(value)
    return flat


# ------------------------------------------------------------------------------------------------------------------
# Building blocks
# ------------------------------------------------------------------------------------------------------------------


def make_accelerator(cfg: Config, run_dir: Path | None = None) -> Accelerator:
    """``Accelerator`` on the CPU when ``train.cpu`` is set, or when launched as several processes (``WORLD_SIZE``)
    on a machine without an accelerator device: accelerate only sets up multi-CPU (gloo) when asked for the CPU, and
    would otherwise run N independent single-process copies. With ``run_dir``, the trackers of ``train.log_with``
    are configured (``jsonl`` writes ``<run_dir>/metrics.jsonl``, the others log under ``<run_dir>/trackers``)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cpu = cfg.train.cpu or (world > 1 and not torch.accelerator.is_available())
    trackers: list[Any] = []
    if run_dir is not None:
        trackers = [JsonlTracker(run_dir / METRICS_FILE) if t == "jsonl" else t for t in cfg.train.log_with]
    accelerator = Accelerator(
        cpu=cpu,
        mixed_precision=cfg.train.mixed_precision,
        gradient_accumulation_steps=cfg.train.grad_accum_steps,
        step_scheduler_with_optimizer=False,  # stepped once per optimizer step below, whatever the process count
        log_with=trackers or None,
        project_dir=str(run_dir / TRACKERS_DIR) if run_dir is not None else None,
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=False)],
    )
    if accelerator.num_processes != world:
        raise RuntimeError(f"launched as {world} processes but accelerate set up {accelerator.num_processes}")
    return accelerator


def build_model(cfg: Config, resume_from: Path | None = None) -> torch.nn.Module:
    """The captioner to train: ``resume_from`` (a checkpoint), else ``train.init_from``, else a fresh one; what it
    trains (``model.train_lm``, ``model.train_encoder``, LoRA adapters ``lora.*``) follows ``cfg``, also for a
    checkpoint (:func:`finecap.models.lora.configure_training`)."""
    start = resume_from or cfg.train.init_from
    model = load_captioner(model_dir(start)) if start else build_captioner(cfg)
    return configure_training(model, cfg)


def train_unit(cfg: Config, objective: Any) -> str:
    """``data.train_unit``, or with ``auto`` the objective's ``example_unit`` attribute (``"caption"`` if absent):
    per-caption for likelihood objectives (as ClipCap), per-image for objectives that sample captions of an image
    (REINFORCE, self-retrieval), so that no image appears twice in a batch or several times per epoch."""
    unit = cfg.data.train_unit if cfg.data.train_unit != "auto" else getattr(objective, "example_unit", "caption")
    if unit not in ("caption", "image"):
        raise ValueError(f"train.objective: example_unit must be 'caption' or 'image', got {unit!r}")
    return unit


def build_data(cfg: Config, model: torch.nn.Module, accelerator: Accelerator, *, per_caption: bool) -> TrainData:
    """Training examples (one per reference caption, or per image) and the first ``train.eval_samples`` validation
    images."""
    train_records = load_records(cfg, "train")
    val_records = load_records(cfg, "val")
    if cfg.train.eval_samples:
        val_records = val_records[: cfg.train.eval_samples]
    feats: dict[str, torch.Tensor | None] = {"train": None, "val": None}
    if not model.train_encoder and model.cache_features:
        with accelerator.main_process_first():  # the main process computes the cache, the others then read it
            for split, records in (("train", train_records), ("val", val_records)):
                feats[split] = model_features(model, records, cfg, split, progress=accelerator.is_main_process)
    return TrainData(
        train=CaptionDataset(train_records, per_caption=per_caption, features=feats["train"]),
        val=CaptionDataset(val_records, per_caption=False, features=feats["val"]),
        collator=model_collator(model, cfg.data.max_tokens),
        train_records=train_records,
    )


def build_optimizer(model: torch.nn.Module, cfg: Config) -> torch.optim.AdamW:
    """AdamW over the trainable parameters; weight decay on matrices only (not on biases, norms or scales)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("model: no trainable parameters (check model.train_lm / model.train_encoder)")
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.train.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.train.lr)


def total_steps(cfg: Config, sampler: Any) -> int:
    """``train.max_steps``, or the optimizer steps of ``train.epochs`` (a fractional last epoch rounds up)."""
    if cfg.train.max_steps > 0:
        return cfg.train.max_steps
    full = int(cfg.train.epochs)
    steps = sum(sampler.num_batches(e) for e in range(full))
    frac = cfg.train.epochs - full
    if frac > 0:
        steps += math.ceil(frac * sampler.num_batches(full))
    return steps


def resolve_validators(cfg: Config, extra: Sequence[Validator] | None) -> list[Validator]:
    factories = [lookup(name, VALIDATORS, "train.validators", "validator") for name in cfg.train.validators]
    return [factory(cfg) for factory in factories] + list(extra or [])


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


def mean_over_processes(values: dict[str, float], accelerator: Accelerator) -> dict[str, float]:
    """Per-key mean of each process's ``values`` (keys present on only some processes average over those)."""
    if accelerator.num_processes == 1:
        return values
    sums: dict[str, list[float]] = {}
    for part in gather_object([values]):
        for k, v in part.items():
            sums.setdefault(k, []).append(v)
    return {k: sum(v) / len(v) for k, v in sums.items()}


# ------------------------------------------------------------------------------------------------------------------
# Step, evaluation, checkpoints
# ------------------------------------------------------------------------------------------------------------------


def num_items(out: Any, batch: dict[str, Any]) -> float:
    """What a micro-batch's losses are means over (``ObjectiveOutput.num_items``; default: its examples)."""
    if out.num_items is not None:
        return float(out.num_items)
    return float(len(batch["image_ids"]))


def train_step(model, micro_batches: list[dict], objective, optimizer, scheduler, accelerator,
               cfg: Config) -> dict[str, float]:  # fmt: skip
    """One optimizer step over this process's micro-batches of a global batch; returns the values to log (total and
    per-part losses, objective metrics, lr, grad norm), averaged over the micro-batches."""
    model.train()
    optimizer.zero_grad(set_to_none=True)  # at the start, so the step's gradients stay inspectable after it
    sums: dict[str, float] = {}
    local_items = 0.0
    grad_norm = None
    for batch in micro_batches:
        with accelerator.accumulate(model):
            with accelerator.autocast():
                out = objective(model, batch)
                loss = weighted_loss(out.losses, cfg.train.loss_weights)
            items = num_items(out, batch)
            local_items += items
            accelerator.backward(loss * items)  # an item-weighted sum; normalised at the sync below
            if accelerator.sync_gradients:
                params = [p for g in optimizer.param_groups for p in g["params"]]
                total_items = accelerator.reduce(torch.tensor(local_items, device=accelerator.device), "sum")
                factor = accelerator.num_processes * accelerator.gradient_accumulation_steps / float(total_items)
                for p in params:
                    if p.grad is not None:
                        p.grad.mul_(factor)  # (DDP mean x accumulate's 1/steps) undone, / items of the global batch
                max_norm = cfg.train.grad_clip if cfg.train.grad_clip > 0 else float("inf")
                grad_norm = accelerator.clip_grad_norm_(params, max_norm)
            lr = optimizer.param_groups[0]["lr"]
            optimizer.step()  # accelerate skips it until the synchronising micro-batch
        values = {"loss": loss.item(), **{f"loss/{k}": v.item() for k, v in out.losses.items()}, **out.metrics}
        for k, v in values.items():
            sums[k] = sums.get(k, 0.0) + float(v)
    if not accelerator.sync_gradients:
        raise RuntimeError("train.grad_accum_steps: the step ended without a synchronising micro-batch")
    scheduler.step()
    if hasattr(objective, "end_step"):
        objective.end_step()
    values = {k: v / len(micro_batches) for k, v in sums.items()}
    return {**values, "lr": lr, "grad_norm": float(grad_norm) if grad_norm is not None else float("nan")}


@torch.no_grad()
def validation_loss(model, data: TrainData, cfg: Config, accelerator: Accelerator) -> dict[str, float]:
    """Teacher-forced MLE token loss on the validation images (first reference each), summed over processes."""
    model.eval()
    mine = process_slice(len(data.val), accelerator.process_index, accelerator.num_processes)
    totals = torch.zeros(2, dtype=torch.float64, device=accelerator.device)  # (nll sum, tokens)
    for start in range(0, len(mine), cfg.train.batch_size):
        batch = data.collator([data.val[i] for i in mine[start : start + cfg.train.batch_size]])
        batch = to_device(batch, accelerator.device)
        with accelerator.autocast():
            logits = model(batch)  # (B, T, V)
        labels = batch["labels"]  # (B, T)
        nll = mle_loss(logits, labels, reduction="sum")
        totals += torch.stack([nll.double(), (labels != IGNORE_INDEX).sum().double()])
    totals = accelerator.reduce(totals, reduction="sum")
    loss = float(totals[0] / totals[1])
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0))}


@torch.no_grad()
def caption_samples(model, data: TrainData, cfg: Config, accelerator: Accelerator) -> str:
    """Greedy captions of the first ``train.log_captions`` validation images, one ``image_id: caption`` per line."""
    n = min(cfg.train.log_captions, len(data.val))
    if n == 0 or not accelerator.is_main_process:
        return ""
    batch = to_device(data.collator([data.val[i] for i in range(n)]), accelerator.device)
    model.eval()
    gen = model.generate(batch, DecodeConfig(strategy="greedy", max_length=cfg.decode.max_length))
    return "\n".join(f"{i}: {t}" for i, t in zip(batch["image_ids"], gen.texts, strict=True))


def evaluate(model, data: TrainData, validators: list[Validator], cfg: Config, accelerator) -> dict[str, float]:
    """Validation loss and every validator's values on the bare model (no gradient, no DDP wrapper)."""
    bare = unwrap(model)
    values = validation_loss(bare, data, cfg, accelerator)
    for validator in validators:
        bare.eval()
        extra = validator(bare, cfg, accelerator)
        clash = set(extra) & set(values)
        if clash:
            raise ValueError(f"train.validators: {validator!r} returned keys already used: {sorted(clash)}")
        values.update(extra)
    bare.train()
    if accelerator.num_processes > 1:  # every process selects checkpoints on the main process's values
        values = broadcast_object_list([values])[0]
    return values


def is_better(value: float, best: float | None, cfg: Config) -> bool:
    mode = cfg.train.best_mode
    if mode == "auto":
        mode = "min" if cfg.train.best_metric == "loss" else "max"
    if best is None:
        return True
    return value < best if mode == "min" else value > best


def epoch_loader(data: TrainData, batches: list[list[int]], state: TrainState, accelerator, cfg: Config) -> DataLoader:
    """This process's micro-batches of the epoch's global batches from ``state.position`` on (``grad_accum_steps``
    consecutive ones per optimizer step)."""
    if not batches:
        raise ValueError(f"data.sampler: no batches in epoch {state.epoch}")
    sampler = StepBatches(batches, rank=accelerator.process_index, world=accelerator.num_processes,
                          accum=cfg.train.grad_accum_steps, start=state.position)  # fmt: skip
    return DataLoader(
        data.train,
        batch_sampler=sampler,
        collate_fn=data.collator,
        num_workers=cfg.data.num_workers,
        # A private generator: creating the iterator draws a worker seed, which must not consume the global RNG
        # (a resumed run creates its iterator mid-epoch, the uninterrupted one at the epoch start).
        generator=torch.Generator().manual_seed(cfg.run.seed * 1_000_003 + state.epoch),
    )


def save_model(path: Path, model, cfg: Config, accelerator: Accelerator, info: dict[str, Any],
               keep_tmp_contents: bool = False) -> None:  # fmt: skip
    """Write the model (weights from ``accelerator.get_state_dict``: gathered when sharded) in the backbone's own
    format, with ``config.yaml`` and ``info``; the main process writes, every process takes part in the gather.
    ``keep_tmp_contents``: keep what was already written into the checkpoint's temporary folder."""
    state_dict = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        save_checkpoint(path, model=unwrap(model), cfg=cfg, info=info, state_dict=state_dict,
                        keep_tmp_contents=keep_tmp_contents)  # fmt: skip
    accelerator.wait_for_everyone()


def save_best(values: dict[str, float], state: TrainState, run_dir: Path, model, cfg: Config, accelerator) -> None:
    """Write ``checkpoints/best`` when ``values[train.best_metric]`` improves on the best so far."""
    metric = cfg.train.best_metric
    if metric not in values:
        raise ValueError(
            f"train.best_metric: {metric!r} is not a validation value; available: {', '.join(sorted(values))} "
            "(add a validator with train.validators)"
        )
    if not is_better(values[metric], state.best_value, cfg):
        return
    state.best_value, state.best_step = values[metric], state.step
    save_model(checkpoint_dir(run_dir, BEST), model, cfg, accelerator, {**asdict(state), "metric": metric,
                                                                         "values": values})  # fmt: skip


class ProcessStates:
    """What ``accelerator.save_state`` keeps beyond model/optimizer/scheduler/RNG: the loop's counters and every
    process's objective and pending-log state (``state_dict`` gathers them; each process restores its own)."""

    def __init__(self, accelerator: Accelerator, state: TrainState, objective: Any, logger: Logger):
        self.accelerator, self.state, self.objective, self.logger = accelerator, state, objective, logger
        self.restored_processes: int | None = None

    def state_dict(self) -> dict[str, Any]:
        local = {"logger": self.logger.state_dict()}
        if hasattr(self.objective, "state_dict"):
            local["objective"] = self.objective.state_dict()
        every = gather_object([local]) if self.accelerator.num_processes > 1 else [local]
        return {"state": asdict(self.state), "processes": every}

    def load_state_dict(self, blob: dict[str, Any]) -> None:
        for key, value in blob["state"].items():
            setattr(self.state, key, value)
        processes = blob["processes"]
        self.restored_processes = len(processes)
        mine = processes[min(self.accelerator.process_index, len(processes) - 1)]
        if len(processes) == self.accelerator.num_processes:
            self.logger.load_state_dict(mine["logger"])
        if hasattr(self.objective, "load_state_dict") and "objective" in mine:
            self.objective.load_state_dict(mine["objective"])


def save_last(run_dir: Path, model, cfg: Config, states: ProcessStates, accelerator: Accelerator, total: int) -> None:
    """``checkpoints/last``: the resumable state (``accelerate/``, written by every process through
    ``accelerator.save_state``) and the model (as :func:`save_model`), assembled in a temporary folder that replaces
    the previous checkpoint only once complete."""
    path = checkpoint_dir(run_dir, LAST)
    tmp = temporary_dir(path)
    if accelerator.is_main_process:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp / ACCELERATE_STATE))
    info = {**asdict(states.state), "total_steps": total, "num_processes": accelerator.num_processes}
    save_model(path, model, cfg, accelerator, info, keep_tmp_contents=True)


def skip_model_weights(models: list, weights: list, *args: Any) -> None:
    """``save_state`` pre-hook: the model is saved in the backbone's own format, not a second time by accelerate."""
    weights.clear()


def skip_model_loading(models: list, *args: Any) -> None:
    """``load_state`` pre-hook: the model was built from ``checkpoints/last/model`` before ``prepare``."""
    models.clear()


def restore(run_dir: Path, states: ProcessStates, accelerator: Accelerator) -> None:
    """Load ``checkpoints/last``'s resumable state (the model itself was loaded by :func:`build_model`)."""
    folder = checkpoint_dir(run_dir, LAST) / ACCELERATE_STATE
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no resumable state in the last checkpoint")
    accelerator.load_state(str(folder))
    if states.restored_processes != accelerator.num_processes:
        accelerator.print(
            f"resume: the checkpoint was written by {states.restored_processes} processes, now "
            f"{accelerator.num_processes}; random states are re-seeded, so the continuation is not bit-identical"
        )
        seed_everything(states.state.step * 1000 + accelerator.process_index)


def prepare_run_dir(run_dir: Path, *, resume: bool, overwrite: bool, accelerator: Accelerator) -> bool:
    """Check (and on a fresh start clear) the run directory; returns whether a checkpoint will be resumed."""
    last = checkpoint_dir(run_dir, LAST)
    has_run = (run_dir / "checkpoints").exists() or (run_dir / METRICS_FILE).exists()
    if has_run and not resume and not overwrite:
        raise ValueError(
            f"run.dir: {run_dir} already holds a run; pass --resume to continue it, or choose another run.name / "
            "run.dir"
        )
    resuming = resume and (last / ACCELERATE_STATE).exists()
    if resume and not resuming:
        accelerator.print(f"resume: no checkpoint in {last}; starting from scratch")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process and not resuming:
        for old in (run_dir / "checkpoints", run_dir / METRICS_FILE, run_dir / TRACKERS_DIR):
            if old.is_dir():
                shutil.rmtree(old)
            elif old.exists():
                old.unlink()
    accelerator.wait_for_everyone()
    return resuming


def truncate_metrics(path: Path, step: int) -> None:
    """Drop the events after ``step`` (written by a killed run after its last checkpoint)."""
    if path.exists():
        lines = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] <= step]
        atomic_write_text(path, "".join(ln + "\n" for ln in lines))


def config_changes(saved: Path, cfg: Config) -> list[str]:
    """``section.key: old -> new`` for every value the saved run configuration has and ``cfg`` changes."""
    if not saved.exists():
        return []
    old = yaml.safe_load(saved.read_text()) or {}
    changes = []
    for section, values in cfg.to_dict().items():
        before = old.get(section) or {}
        changes += [
            f"{section}.{k}: {before[k]!r} -> {v!r}" for k, v in values.items() if k in before and before[k] != v
        ]
    return changes


class Logger:
    """Averages training values between log events and sends events to the trackers (``accelerator.log``)."""

    def __init__(self, accelerator: Accelerator):
        self.accelerator = accelerator
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def state_dict(self) -> dict[str, dict]:
        return {"sums": dict(self.sums), "counts": dict(self.counts)}

    def load_state_dict(self, state: dict[str, dict]) -> None:
        self.sums, self.counts = dict(state["sums"]), dict(state["counts"])

    def add(self, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v)
            self.counts[k] = self.counts.get(k, 0) + 1

    def flush_train(self, step: int, epoch: float) -> dict[str, float]:
        local = {k: self.sums[k] / self.counts[k] for k in self.sums}
        self.sums, self.counts = {}, {}
        values = mean_over_processes(local, self.accelerator)
        self.write(step, epoch, "train", values)
        return values

    def write(self, step: int, epoch: float, split: str, values: dict[str, Any]) -> None:
        """Log ``values`` as ``<split>/<name>`` (numbers as scalars, strings as text) at ``step``."""
        self.accelerator.log({"epoch": round(epoch, 4), **{f"{split}/{k}": v for k, v in values.items()}}, step=step)


def step_extras(global_batch: list[int], data: TrainData, step: int, bags: dict[int, int] | None) -> dict[str, Any]:
    """What every micro-batch of an optimizer step carries about the whole step (see the module docstring)."""
    extras: dict[str, Any] = {"step": step, "step_image_ids": [data.train.image_id(i) for i in global_batch]}
    if bags is not None:
        extras["step_bags"] = torch.tensor([bags[i] for i in global_batch])  # (G,)
    return extras


def needs_world_encoder(cfg: Config) -> bool:
    """Whether this run uses the world encoder: as the captioner's encoder of a fresh model, or as the retriever
    (``retriever.checkpoint`` empty) of the retrieval validator, the retrieval reward or BagCurri's bags."""
    fresh = cfg.model.encoder == "world" and not cfg.train.init_from
    retriever = "retrieval" in cfg.train.validators or "retrieval" in cfg.rl.rewards or cfg.data.sampler == "bagcurri"
    return fresh or (retriever and not cfg.retriever.checkpoint)


def ensure_encoder(cfg: Config, accelerator: Accelerator) -> None:
    """The world encoder is trained (or found in the cache) once, by the main process, before any process builds a
    captioner or retriever on it; library builders only load it."""
    if needs_world_encoder(cfg):
        with accelerator.main_process_first():
            if accelerator.is_main_process:
                ensure_world_encoder(cfg, progress=True)


# ------------------------------------------------------------------------------------------------------------------
# The loop
# ------------------------------------------------------------------------------------------------------------------


def train(
    cfg: Config,
    *,
    validators: Sequence[Validator] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    callbacks: Sequence[Callable[[TrainState], None]] = (),
) -> Path:
    """Train a captioner as configured; returns the run directory (``cfg.run.path``).

    ``resume=True`` continues from ``checkpoints/last`` (or starts fresh when there is none); without it an existing
    run directory is an error unless ``overwrite=True``. ``callbacks(state)`` run after every step (tests use one to
    simulate a kill).
    """
    run_dir = cfg.run.path
    accelerator = make_accelerator(cfg, run_dir)
    resuming = prepare_run_dir(run_dir, resume=resume, overwrite=overwrite, accelerator=accelerator)
    ensure_encoder(cfg, accelerator)
    seed_everything(cfg.run.seed)  # the same initial model on every process (DDP also broadcasts rank 0's)
    model = build_model(cfg, checkpoint_dir(run_dir, LAST) if resuming else None).to(accelerator.device)
    objective = get_objective(cfg.train.objective, cfg)
    data = build_data(cfg, model, accelerator, per_caption=train_unit(cfg, objective) == "caption")
    all_validators = resolve_validators(cfg, validators)
    optimizer = build_optimizer(model, cfg)
    global_batch = cfg.train.batch_size * accelerator.num_processes * cfg.train.grad_accum_steps
    sampler = get_sampler(cfg, data.train, global_batch)
    total = total_steps(cfg, sampler)
    scheduler = build_scheduler(optimizer, warmup=cfg.train.warmup_steps, total=total, kind=cfg.train.schedule)
    if hasattr(objective, "setup"):
        objective.setup(TrainContext(cfg, accelerator, data.train_records, model.tokenizer, run_dir))
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)

    seed_everything(cfg.run.seed + accelerator.process_index)  # different dropout on each process
    state = TrainState()
    logger = Logger(accelerator)
    states = ProcessStates(accelerator, state, objective, logger)
    accelerator.register_for_checkpointing(states)
    accelerator.register_save_state_pre_hook(skip_model_weights)
    accelerator.register_load_state_pre_hook(skip_model_loading)
    if resuming:
        restore(run_dir, states, accelerator)
        accelerator.print(f"resume: continuing {run_dir} from step {state.step} of {total}")
        for change in config_changes(run_dir / "config.yaml", cfg):
            accelerator.print(f"resume: configuration changed: {change}")
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        cfg.save(run_dir / "config.yaml")
        if resuming:
            truncate_metrics(run_dir / METRICS_FILE, state.step)
    accelerator.init_trackers("finecap", config=tracker_config(cfg))

    progress = tqdm(total=total, initial=state.step, desc="train", disable=not accelerator.is_main_process)
    accum = cfg.train.grad_accum_steps
    while state.step < total:
        batches = sampler.batches(state.epoch)
        bags = sampler.bag_index(state.epoch) if hasattr(sampler, "bag_index") else None  # BagCurri bag numbers
        pending: list[dict[str, Any]] = []
        for micro in epoch_loader(data, batches, state, accelerator, cfg):
            if bags is not None:  # batch["bag"] (B,): bag-mates share a number (self-retrieval distractors)
                micro["bag"] = torch.tensor([bags[int(i)] for i in micro["index"]])
            pending.append(micro)
            if len(pending) < accum:
                continue
            extras = step_extras(batches[state.position], data, state.step, bags)
            micro_batches = [to_device({**mb, **extras}, accelerator.device) for mb in pending]
            pending = []
            values = train_step(model, micro_batches, objective, optimizer, scheduler, accelerator, cfg)
            logger.add(values)
            end_of_epoch = state.advance(len(batches))
            epoch = state.epoch + state.position / len(batches)
            progress.update(1)
            progress.set_postfix(loss=f"{values['loss']:.4f}", epoch=f"{epoch:.2f}")
            done = state.step >= total
            if done or state.step % cfg.train.log_every == 0:
                logger.flush_train(state.step, epoch)
            evaluated = done or (state.step % cfg.train.eval_every == 0 if cfg.train.eval_every else end_of_epoch)
            if evaluated:
                val_values = evaluate(model, data, all_validators, cfg, accelerator)
                text = caption_samples(unwrap(model), data, cfg, accelerator)
                logger.write(state.step, epoch, "val", {**val_values, **({"captions": text} if text else {})})
                save_best(val_values, state, run_dir, model, cfg, accelerator)
            if done or (state.step % cfg.train.save_every == 0 if cfg.train.save_every else evaluated):
                save_last(run_dir, model, cfg, states, accelerator, total)
            for callback in callbacks:
                callback(state)
            if done or end_of_epoch:
                break
    progress.close()
    for tracker in accelerator.trackers:  # not end_training(): it would destroy the process group, and a caller (the
        tracker.finish()  # demo, a sweep) may train again in the same processes
    accelerator.wait_for_everyone()
    return run_dir
