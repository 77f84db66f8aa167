"""The one training loop: any objective, on ``accelerate``, resumable, single- or multi-process.

``train(cfg)`` builds the captioner (``train.init_from`` or a fresh :func:`finecap.models.clipcap.build_captioner`),
the objective named by ``train.objective``, the training data (one example per reference caption, or per image for
objectives that sample captions: :func:`train_unit`), and runs
AdamW with warmup + linear/cosine/constant decay and gradient clipping. Every step the objective's named losses
are weighted (``train.loss_weights``) and summed; every part is logged. Every ``train.eval_every`` steps (0: each
epoch) and at the end it evaluates on the validation split: the teacher-forced MLE token loss (``loss``, always,
whatever the objective, so runs are comparable) plus every validator's values; the best value of
``train.best_metric`` selects ``checkpoints/best``. Events go to ``metrics.jsonl``; the resolved config to
``config.yaml``; layout and atomic writes in :mod:`finecap.train.checkpoint`.

Validators are callables ``validator(model, cfg, accelerator) -> dict[str, float]`` run on every process at each
evaluation (they shard their own work and gather results, e.g. with :func:`finecap.caption.generate_captions`). They
come from ``train.validators`` (names of :data:`VALIDATORS`, or ``"pkg.module:factory"`` with ``factory(cfg)``
returning the validator) and from the ``validators`` argument. Example: a self-retrieval validator returning
``{"r@1": ...}`` with ``train.best_metric=r@1`` keeps the checkpoint that retrieves best, as SMILE does.

Multi-process (``accelerate launch --multi_gpu --num_processes N -m finecap.app.cli train ...``, or ``torchrun``): each
process takes its slice of every global batch (see :mod:`finecap.data.samplers`); the model is *not* wrapped in
``DistributedDataParallel`` because objectives call methods other than ``forward`` (``generate``,
``sequence_logprob``) whose gradients DDP would not synchronise. Instead every process starts from the main
process's parameters and the gradients are averaged across processes after ``backward`` (one all-reduce per
~16M-element bucket), the same average DDP computes; the end of training checks that the processes agree. Logged
values are averaged over processes; only the main process writes files. On a machine without GPU the processes run
on the CPU (gloo). Note: accelerate 1.15's ``accelerate launch --cpu --num_processes N`` starts a *single* process
(its CPU launcher needs an MPI hostfile for more), so use ``--multi_gpu`` (torchrun) for several CPU processes.

Resuming (``resume=True``) restores the model, optimizer, scheduler, objective state, every process's RNG states and
the position in the epoch from ``checkpoints/last``; the batches of an epoch are a function of ``(run.seed, epoch)``,
so a resumed run takes the same steps, on the same data, as an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from finecap.data.datasets import CaptionCollator, CaptionDataset, load_records, model_collator, to_device
from finecap.data.samplers import ShardedBatches, get_sampler, process_slice
from finecap.objectives import TrainContext, get_objective
from finecap.objectives.mle import IGNORE_INDEX
from finecap.registry import lookup
from finecap.train.checkpoint import (
    BEST,
    LAST,
    checkpoint_dir,
    load_trainer_state,
    model_dir,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from finecap.train.schedule import build_scheduler
from finecap.utils import append_jsonl, atomic_write_text, seed_everything

if TYPE_CHECKING:
    from accelerate import Accelerator

    from finecap.config import Config

Validator = Callable[[torch.nn.Module, "Config", "Accelerator"], dict[str, float]]

VALIDATORS: dict[str, str] = {
    "captions": "finecap.caption:caption_stats_validator",
    "retrieval": "finecap.caption:retrieval_validator",
}
"""Built-in validator factories by name (``train.validators``); each ``factory(cfg)`` returns a validator."""

METRICS_FILE = "metrics.jsonl"


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
# Building blocks
# ------------------------------------------------------------------------------------------------------------------


def make_accelerator(cfg: Config) -> Accelerator:
    """``Accelerator`` on the CPU when ``train.cpu`` is set, or when launched as several processes (``WORLD_SIZE``)
    on a machine without an accelerator device: accelerate only sets up multi-CPU (gloo) when asked for the CPU, and
    would otherwise run N independent single-process copies."""
    import os

    from accelerate import Accelerator

    world = int(os.environ.get("WORLD_SIZE", "1"))
    cpu = cfg.train.cpu or (world > 1 and not torch.accelerator.is_available())
    accelerator = Accelerator(cpu=cpu, mixed_precision=cfg.train.mixed_precision)
    if accelerator.num_processes != world:
        raise RuntimeError(f"launched as {world} processes but accelerate set up {accelerator.num_processes}")
    return accelerator


def build_model(cfg: Config, resume_from: Path | None = None) -> torch.nn.Module:
    """The captioner to train: ``resume_from`` (a checkpoint), else ``train.init_from``, else a fresh one; what it
    trains (``model.train_lm``, ``model.train_encoder``, LoRA adapters ``lora.*``) follows ``cfg``, also for a
    checkpoint (:func:`finecap.models.lora.configure_training`)."""
    from finecap.models.clipcap import ClipCap, build_captioner
    from finecap.models.lora import configure_training

    start = resume_from or cfg.train.init_from
    model = ClipCap.from_checkpoint(model_dir(start)) if start else build_captioner(cfg)
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
    from finecap.data.features import model_features

    train_records = load_records(cfg, "train")
    val_records = load_records(cfg, "val")
    if cfg.train.eval_samples:
        val_records = val_records[: cfg.train.eval_samples]
    feats: dict[str, torch.Tensor | None] = {"train": None, "val": None}
    if not model.train_encoder:
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


def average_gradients(params: list[torch.nn.Parameter], accelerator: Accelerator, bucket: int = 1 << 24) -> None:
    """Average ``.grad`` over processes (missing gradients count as zeros), in buckets of ~``bucket`` elements."""
    if accelerator.num_processes == 1:
        return
    import torch.distributed as dist

    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    start = 0
    while start < len(params):
        end, size = start, 0
        while end < len(params) and (size == 0 or size + params[end].numel() <= bucket):
            size += params[end].numel()
            end += 1
        chunk = params[start:end]
        flat = torch.cat([p.grad.reshape(-1) for p in chunk])  # (size,)
        dist.all_reduce(flat)
        flat /= accelerator.num_processes
        offset = 0
        for p in chunk:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        start = end


def broadcast_parameters(model: torch.nn.Module, accelerator: Accelerator) -> None:
    """Copy the main process's trainable parameters to every process (as DDP does at construction)."""
    if accelerator.num_processes == 1:
        return
    import torch.distributed as dist

    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                dist.broadcast(p.data, src=0)


def check_in_sync(model: torch.nn.Module, accelerator: Accelerator) -> None:
    """Raise if the processes' trainable parameters differ (they must: same start, averaged gradients)."""
    if accelerator.num_processes == 1:
        return
    with torch.no_grad():
        local = torch.stack([p.double().sum() for p in model.parameters() if p.requires_grad]).to(accelerator.device)
    sums = accelerator.gather(local[None])  # (processes, n_params)
    if not torch.equal(sums.min(0).values, sums.max(0).values):
        raise RuntimeError("the processes' model parameters diverged during training (gradient averaging failed)")


def mean_over_processes(values: dict[str, float], accelerator: Accelerator) -> dict[str, float]:
    """Per-key mean of each process's ``values`` (keys present on only some processes average over those)."""
    if accelerator.num_processes == 1:
        return values
    from accelerate.utils import gather_object

    sums: dict[str, list[float]] = {}
    for part in gather_object([values]):
        for k, v in part.items():
            sums.setdefault(k, []).append(v)
    return {k: sum(v) / len(v) for k, v in sums.items()}


# ------------------------------------------------------------------------------------------------------------------
# Step, evaluation, checkpoints
# ------------------------------------------------------------------------------------------------------------------


def train_step(model, batch, objective, optimizer, scheduler, accelerator, cfg: Config) -> dict[str, float]:
    """One optimizer step; returns the values to log (total and per-part losses, objective metrics, lr, grad norm)."""
    model.train()
    with accelerator.autocast():
        out = objective(model, batch)
        loss = weighted_loss(out.losses, cfg.train.loss_weights)
    optimizer.zero_grad(set_to_none=True)
    accelerator.backward(loss)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    average_gradients(params, accelerator)
    max_norm = cfg.train.grad_clip if cfg.train.grad_clip > 0 else float("inf")
    grad_norm = accelerator.clip_grad_norm_(params, max_norm)
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    scheduler.step()
    values = {"loss": loss.item(), **{f"loss/{k}": v.item() for k, v in out.losses.items()}, **out.metrics}
    return {**values, "lr": lr, "grad_norm": float(grad_norm)}


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
        nll = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        totals += torch.stack([nll.double(), (labels != IGNORE_INDEX).sum().double()])
    totals = accelerator.reduce(totals, reduction="sum")
    loss = float(totals[0] / totals[1])
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0))}


def evaluate(model, data: TrainData, validators: list[Validator], cfg: Config, accelerator) -> dict[str, float]:
    values = validation_loss(model, data, cfg, accelerator)
    for validator in validators:
        model.eval()
        extra = validator(model, cfg, accelerator)
        clash = set(extra) & set(values)
        if clash:
            raise ValueError(f"train.validators: {validator!r} returned keys already used: {sorted(clash)}")
        values.update(extra)
    model.train()
    if accelerator.num_processes > 1:  # every process selects checkpoints on the main process's values
        from accelerate.utils import broadcast_object_list

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
    """This process's batches of the epoch from ``state.position`` on."""
    if not batches:
        raise ValueError(f"data.sampler: no batches in epoch {state.epoch}")
    sampler = ShardedBatches(batches, rank=accelerator.process_index, world=accelerator.num_processes,
                             start=state.position)  # fmt: skip
    return DataLoader(
        data.train,
        batch_sampler=sampler,
        collate_fn=data.collator,
        num_workers=cfg.data.num_workers,
        # A private generator: creating the iterator draws a worker seed, which must not consume the global RNG
        # (a resumed run creates its iterator mid-epoch, the uninterrupted one at the epoch start).
        generator=torch.Generator().manual_seed(cfg.run.seed * 1_000_003 + state.epoch),
    )


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
    if accelerator.is_main_process:
        info = {**asdict(state), "metric": metric, "values": values}
        save_checkpoint(checkpoint_dir(run_dir, BEST), model=model, cfg=cfg, info=info)
    accelerator.wait_for_everyone()


def save_last(run_dir, model, cfg, state, optimizer, scheduler, objective, logger, accelerator, total: int) -> None:
    """Gather every process's RNG, objective and pending-log state; the main process writes ``checkpoints/last``."""
    from accelerate.utils import gather_object

    local = {"rng": rng_state(), "logger": logger.state_dict()}
    if hasattr(objective, "state_dict"):
        local["objective"] = objective.state_dict()
    per_process = gather_object([local]) if accelerator.num_processes > 1 else [local]
    if accelerator.is_main_process:
        trainer_state = {
            "state": asdict(state),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "processes": per_process,
        }
        info = {**asdict(state), "total_steps": total, "num_processes": accelerator.num_processes}
        save_checkpoint(checkpoint_dir(run_dir, LAST), model=model, cfg=cfg, info=info, trainer_state=trainer_state)
    accelerator.wait_for_everyone()


def restore(run_dir, optimizer, scheduler, objective, logger, accelerator) -> TrainState:
    """Load the trainer state of ``checkpoints/last`` (the model was loaded by :func:`build_model`)."""
    blob = load_trainer_state(checkpoint_dir(run_dir, LAST))
    optimizer.load_state_dict(blob["optimizer"])
    scheduler.load_state_dict(blob["scheduler"])
    processes = blob["processes"]
    rank = accelerator.process_index
    if len(processes) != accelerator.num_processes:
        accelerator.print(
            f"resume: the checkpoint was written by {len(processes)} processes, now {accelerator.num_processes}; "
            "random states are re-seeded, so the continuation is not bit-identical"
        )
        seed_everything(blob["state"]["step"] * 1000 + rank)
    else:
        set_rng_state(processes[rank]["rng"])
        logger.load_state_dict(processes[rank]["logger"])
    if hasattr(objective, "load_state_dict") and "objective" in processes[min(rank, len(processes) - 1)]:
        objective.load_state_dict(processes[min(rank, len(processes) - 1)]["objective"])
    return TrainState(**blob["state"])


def prepare_run_dir(run_dir: Path, *, resume: bool, overwrite: bool, accelerator: Accelerator) -> bool:
    """Check (and on a fresh start clear) the run directory; returns whether a checkpoint will be resumed."""
    last = checkpoint_dir(run_dir, LAST)
    has_run = (run_dir / "checkpoints").exists() or (run_dir / METRICS_FILE).exists()
    if has_run and not resume and not overwrite:
        raise ValueError(
            f"run.dir: {run_dir} already holds a run; pass --resume to continue it, or choose another run.name / "
            "run.dir"
        )
    resuming = resume and last.exists()
    if resume and not resuming:
        accelerator.print(f"resume: no checkpoint in {last}; starting from scratch")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process and not resuming:
        for old in (run_dir / "checkpoints", run_dir / METRICS_FILE):
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
    """Averages training values between log events and appends events to ``metrics.jsonl`` (main process)."""

    def __init__(self, path: Path, accelerator: Accelerator):
        self.path, self.accelerator = path, accelerator
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

    def write(self, step: int, epoch: float, split: str, values: dict[str, float]) -> None:
        if self.accelerator.is_main_process:
            record = {"step": step, "epoch": round(epoch, 4), "split": split, "values": values}
            append_jsonl(self.path, record)


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
    accelerator = make_accelerator(cfg)
    run_dir = cfg.run.path
    resuming = prepare_run_dir(run_dir, resume=resume, overwrite=overwrite, accelerator=accelerator)
    seed_everything(cfg.run.seed)  # the same initial model on every process
    model = build_model(cfg, checkpoint_dir(run_dir, LAST) if resuming else None).to(accelerator.device)
    broadcast_parameters(model, accelerator)
    objective = get_objective(cfg.train.objective, cfg)
    data = build_data(cfg, model, accelerator, per_caption=train_unit(cfg, objective) == "caption")
    all_validators = resolve_validators(cfg, validators)
    optimizer = build_optimizer(model, cfg)
    sampler = get_sampler(cfg, data.train, cfg.train.batch_size * accelerator.num_processes)
    total = total_steps(cfg, sampler)
    scheduler = build_scheduler(optimizer, warmup=cfg.train.warmup_steps, total=total, kind=cfg.train.schedule)
    optimizer = accelerator.prepare(optimizer)  # grad scaling under fp16; no-op otherwise
    if hasattr(objective, "setup"):
        ctx = TrainContext(cfg, accelerator, data.train_records, model.tokenizer, run_dir)
        objective.setup(ctx)

    seed_everything(cfg.run.seed + accelerator.process_index)  # different dropout / sampling on each process
    state = TrainState()
    logger = Logger(run_dir / METRICS_FILE, accelerator)
    if resuming:
        state = restore(run_dir, optimizer, scheduler, objective, logger, accelerator)
        accelerator.print(f"resume: continuing {run_dir} from step {state.step} of {total}")
        for change in config_changes(run_dir / "config.yaml", cfg):
            accelerator.print(f"resume: configuration changed: {change}")
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        cfg.save(run_dir / "config.yaml")
        if resuming:
            truncate_metrics(run_dir / METRICS_FILE, state.step)

    progress = tqdm(total=total, initial=state.step, desc="train", disable=not accelerator.is_main_process)
    while state.step < total:
        batches = sampler.batches(state.epoch)
        bags = sampler.bag_index(state.epoch) if hasattr(sampler, "bag_index") else None  # BagCurri bag numbers
        for batch in epoch_loader(data, batches, state, accelerator, cfg):
            if bags is not None:  # batch["bag"] (B,): bag-mates share a number (self-retrieval distractors)
                batch["bag"] = torch.tensor([bags[int(i)] for i in batch["index"]])
            values = train_step(model, to_device(batch, accelerator.device), objective, optimizer, scheduler,
                                accelerator, cfg)  # fmt: skip
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
                logger.write(state.step, epoch, "val", val_values)
                save_best(val_values, state, run_dir, model, cfg, accelerator)
            if done or (state.step % cfg.train.save_every == 0 if cfg.train.save_every else evaluated):
                save_last(run_dir, model, cfg, state, optimizer, scheduler, objective, logger, accelerator, total)
            for callback in callbacks:
                callback(state)
            if done or end_of_epoch:
                break
    progress.close()
    check_in_sync(model, accelerator)
    accelerator.end_training()
    return run_dir
