"""Training a captioner: the recipe around the library's training engine (:mod:`finecap.train.engine`), which the
``finecap train`` command, the Python API (:func:`finecap.api.train`) and the stage runners call.

``train(cfg)`` builds the captioner (``train.init_from`` or a fresh ``model.kind``: :mod:`finecap.models.backbones`),
the objective named by ``train.objective``, the training data (one example per reference caption, or per image for
objectives that sample captions: :func:`train_unit`), AdamW with warmup + linear/cosine/constant decay and gradient
clipping, and hands them to :class:`~finecap.train.engine.Engine`. Every ``train.eval_every`` steps (0: each epoch)
and at the end it evaluates on the validation split: the teacher-forced MLE token loss (``loss``, always, whatever
the objective, so runs are comparable; of the shifted captions under SMILE's first-token shifting, which is what
such a model emits: :func:`finecap.objectives.smile.validation_shift_token`) plus every validator's values; the
best value of ``train.best_metric`` selects ``checkpoints/best``. Events go to the trackers (``metrics.jsonl`` by
default); the resolved configuration, secrets masked, to ``config.yaml``; layout and resume in
:mod:`finecap.train.state`.

Validators are callables ``validator(model, cfg, accelerator) -> dict[str, float]`` run on every process at each
evaluation (:mod:`finecap.train.validators`). They come from ``train.validators`` (built-in names, or
``"pkg.module:factory"``) and from the ``validators`` argument.

What the run needs prepared (the world encoder as the captioner's encoder, or as the retriever of a self-retrieval
reward, validator or BagCurri's bags) is what its components declare (``needs``); this recipe prepares it before
building them (:func:`finecap.train.prepare.prepare_needs`), on the main process first.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import broadcast_object_list

from finecap.config import Config
from finecap.contract import TrainContext
from finecap.data.datasets import load_records, to_device, validation_records
from finecap.data.loading import LoaderSettings
from finecap.data.samplers import get_sampler, repeat_batches
from finecap.home import run_path
from finecap.locks import TRAIN_LOCK, output_lock
from finecap.models import sharding
from finecap.models.backbones import check_before_building, reads_world_encoder
from finecap.models.retriever import Retriever, SharedRetrievers, retriever_path
from finecap.objectives import get_objective
from finecap.objectives.base import ObjectiveBase
from finecap.objectives.smile import validation_shift_token
from finecap.outputs import write_output
from finecap.registry import SAMPLERS, VALIDATORS, declared_needs, lookup
from finecap.runs import BEST, CONFIG_FILE, METRICS_FILE, TRACKERS_DIR, checkpoint_dir, model_dir
from finecap.train.checkpoint import save_checkpoint
from finecap.train.engine import (
    Checkpoints,
    Engine,
    TrainingData,
    build_optimizer,
    make_accelerator,
    process_state,
    total_steps,
)
from finecap.train.fingerprint import check_run_dir as check_fingerprints_of_run
from finecap.train.fingerprint import write_fingerprints
from finecap.train.logging import masked_argv, placed_trackers, tracker_config
from finecap.train.preflight import check_settings
from finecap.train.prepare import prepare_needs
from finecap.train.schedule import build_scheduler, short_run_note
from finecap.train.setup import (
    CaptionData,
    build_data,
    build_model,
    build_sharded_model,
    reads_weights,
    resolve_start,
    train_unit,
)
from finecap.train.state import (
    TrainState,
    check_run_folder,
    check_unchanged_on_resume,
    config_changes,
    prepare_run_dir,
    read_info,
    run_reads,
    trained_config,
    truncate_metrics,
)
from finecap.train.validators import caption_samples, validation_loss
from finecap.utils.folders import made_folder
from finecap.utils.rng import seed_everything

log = logging.getLogger(__name__)

Validator = Callable[[torch.nn.Module, Config, Accelerator], dict[str, float]]


def summary(run_dir: Path, state: TrainState, metric: str, skipped: int = 0) -> str:
    """The one line ``finecap train`` ends with: steps, the best checkpoint and its value, the run directory, and the
    bad images ``data.skip_bad_images`` left out (when any)."""
    best = checkpoint_dir(run_dir, BEST)
    bad = f"; skipped {skipped} bad image(s) (data.skip_bad_images)" if skipped else ""
    if state.best_value is None or not best.exists():
        return f"train: {state.step} steps; run directory {run_dir} (no evaluation picked a best checkpoint){bad}"
    return (
        f"train: {state.step} steps; best {metric} {state.best_value:.4g} at step {state.best_step}: {best} "
        f"(run directory {run_dir}){bad}"
    )


def validator_factories(cfg: Config) -> list[Callable[[Config], Validator]]:
    return [lookup(name, VALIDATORS, "train.validators", "validator") for name in cfg.train.validators]


def run_needs(cfg: Config, objective: ObjectiveBase, factories: Sequence[Any], *, fresh: bool) -> frozenset[str]:
    """What the run's components declare they need, plus ``"world_encoder"`` when a fresh captioner reads images
    through the world encoder (:func:`finecap.models.backbones.reads_world_encoder`)."""
    sampler_factory = lookup(cfg.data.sampler, SAMPLERS, "data.sampler", "sampler")
    needs = set(declared_needs(objective)) | set(declared_needs(sampler_factory))
    for factory in factories:
        needs |= declared_needs(factory)
    if fresh and reads_world_encoder(cfg):
        needs.add("world_encoder")
    return frozenset(needs)


def make_evaluate(cfg: Config, data: CaptionData, validators: list[Validator], accelerator: Accelerator):
    """The engine's evaluation: validation loss, every validator's values, and sample captions as text."""

    def evaluate(model: torch.nn.Module) -> dict[str, Any]:
        loader = LoaderSettings.of(cfg.data, accelerator.device, workers=data.val.features is None)
        values: dict[str, Any] = validation_loss(model, data.val, data.collator, cfg.train.batch_size, accelerator,
                                                 loader=loader,
                                                 shift_token_id=validation_shift_token(cfg, model))  # fmt: skip
        for validator in validators:
            extra = validator(model, cfg, accelerator)
            clash = set(extra) & set(values)
            if clash:
                raise ValueError(f"train.validators: {validator!r} returned keys already used: {sorted(clash)}")
            values.update(extra)
        text = caption_samples(model, data.val, data.collator, cfg.train.log_captions, cfg.decode.max_length,
                               accelerator)  # fmt: skip
        return {**values, **({"captions": text} if text else {})}

    return evaluate


def train(
    cfg: Config,
    *,
    validators: Sequence[Validator] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    callbacks: Sequence[Callable[[TrainState], None]] = (),
    recipe: str | Path | None = None,
    run_dir_option: str = "run.dir",
) -> Path:
    """Train a captioner as configured (logs :func:`summary`); returns the run directory (``home.run_path(cfg.run)``).

    ``resume=True`` continues from the newest complete checkpoint (or starts fresh in an empty run directory);
    without it an existing run directory is an error unless ``overwrite=True``. ``callbacks(state)`` run after every
    step (tests use one to simulate a kill). ``recipe``: the file the configuration was read from, which the run's
    ``config.yaml`` may never replace. One training at a time holds the run directory (``.train.lock``, main
    process): a second stops with an error naming the first. The run is built and trained with grad mode on and
    outside inference mode, whatever the caller's (a notebook's ``no_grad`` or ``inference_mode`` cell).
    ``run_dir_option``: what the errors about the run directory name (``--out`` when the command line's gave it).
    """
    # what training refuses of its settings (a kernel, $FINECAP_FSYNC, the run folder, its start), before anything
    cfg = check_settings(cfg, resume=resume, option=run_dir_option)
    run_dir = run_path(cfg.run)
    processes = process_state(cfg.train)  # the processes, before any Accelerator: preparing may train with its own
    with contextlib.ExitStack() as held:
        if processes.is_main_process:
            held.enter_context(made_folder(run_dir))  # removed again if training fails before writing anything
            held.enter_context(output_lock(run_dir, name=TRAIN_LOCK, holder="finecap train", log=log.warning))
            check_run_folder(run_dir, overwrite=overwrite, reads=run_reads(cfg), recipe=recipe,
                             option=run_dir_option, resume=resume)  # fmt: skip
        held.enter_context(torch.inference_mode(False))  # the model built in inference mode could never train
        held.enter_context(torch.enable_grad())
        return _train(cfg, processes, validators=validators, resume=resume, overwrite=overwrite, callbacks=callbacks,
                      run_dir_option=run_dir_option)  # fmt: skip


@dataclass
class BuiltRun:
    """What a run trains with, built as :func:`train` builds it (:func:`_build_run`)."""

    accelerator: Accelerator
    model: torch.nn.Module
    data: CaptionData
    engine: Engine


def _build_run(
    cfg: Config,
    run_dir: Path,
    resume_from: Path | None,
    *,
    validators: Sequence[Validator] | None,
    callbacks: Sequence[Callable[[TrainState], None]],
    processes: PartialState,
    writes: bool = True,
) -> BuiltRun:
    """The objective, the world and encoder it needs (prepared), the accelerator, model, data, optimizer, schedule
    and engine of a run, as training and :func:`dry_run` use them; ``writes``: whether the engine saves checkpoints
    and the trackers log into ``run_dir`` (a dry run writes nothing there)."""
    objective = get_objective(cfg.train.objective, cfg)
    factories = validator_factories(cfg)
    fresh = resume_from is None and not cfg.train.init_from
    if fresh:
        check_before_building(cfg)  # before the world and its encoder are made (seconds, not minutes)
    prepare_needs(cfg, run_needs(cfg, objective, factories, fresh=fresh), processes)
    # the splits read before any model is loaded: a missing split is named in seconds, not after minutes of loading
    # (or of retrying a download of) the weights; build_data reads them again from the reader's cache, with the
    # model, and says the images data.skip_bad_images leaves out of each (with those the model refuses): these reads
    # keep theirs (left_out) so that a split is said once, with every image left out
    load_records(cfg, "train", left_out=[])
    validation_records(cfg, left_out=[])
    # After preparing: accelerate keeps one gradient-accumulation state per process, which an Accelerator made
    # while preparing (the world encoder's engine) would have set for itself.
    accelerator = make_accelerator(cfg.train, run_dir if writes else None)

    seed_everything(cfg.run.seed)  # the same initial model on every process (DDP also broadcasts rank 0's)
    per_caption = train_unit(cfg, objective) == "caption"
    if sharding.receives_weights(cfg.train.strategy, accelerator.num_processes):
        model, data = _sharded_model(cfg, resume_from, accelerator, per_caption)
    else:
        model = build_model(cfg, resume_from, accelerator.device).to(accelerator.device)  # CUDA: loaded onto it
        data = build_data(cfg, model, accelerator, per_caption=per_caption)
        if cfg.train.strategy == "fsdp" and accelerator.is_main_process:
            log.info("train.strategy=fsdp with one process: nothing to shard, training as usual")
    # one frozen retriever for the self-retrieval reward and the retrieval validator (kept_beside counts one)
    retrievers = SharedRetrievers()
    with retrievers:
        all_validators = [factory(cfg) for factory in factories] + list(validators or [])
    optimizer = build_optimizer(model, cfg.train)
    global_batch = cfg.train.batch_size * accelerator.num_processes * cfg.train.grad_accum_steps
    sampler = repeat_batches(get_sampler(cfg, data.train, global_batch), objective.batch_repeats)  # grpo.iterations
    total = total_steps(cfg.train, sampler, read_info(resume_from) if resume_from is not None else None)
    scheduler = build_scheduler(optimizer, warmup=cfg.train.warmup_steps, total=total, kind=cfg.train.schedule)
    ends = f"train.max_steps={cfg.train.max_steps}" if cfg.train.max_steps > 0 else f"train.epochs={cfg.train.epochs}"
    notes = [short_run_note(warmup=cfg.train.warmup_steps, total=total), sampler.short_run_note(total, ends)]
    for note in notes:
        if note and accelerator.is_main_process:
            log.warning(note)
    with retrievers:
        objective.setup(TrainContext(cfg, accelerator, data.train_records, model.tokenizer, run_dir, model=model))

    acc_device = accelerator.device
    engine = Engine(
        cfg.train,
        accelerator,
        model,
        objective,
        TrainingData(data.train, data.collator, sampler, LoaderSettings.of(cfg.data, acc_device, per_run=True)),
        optimizer,
        scheduler,
        seed=cfg.run.seed,
        total=total,
        evaluate=make_evaluate(cfg, data, all_validators, accelerator) if writes else None,
        checkpoints=Checkpoints(run_dir, partial(save_checkpoint, model=model, cfg=cfg)) if writes else None,
        callbacks=callbacks,
    )
    return BuiltRun(accelerator, model, data, engine)


def _sharded_model(cfg: Config, resume_from: Path | None, accelerator: Accelerator,
                   per_caption: bool) -> tuple[torch.nn.Module, CaptionData]:  # fmt: skip
    """``train.strategy=fsdp`` over several processes, before the optimizer (it shards parameters): only the main
    process reads the weights; the others build the captioner on the meta device, and every process shards it
    (:func:`finecap.models.sharding.shard_captioner`) and receives its shards from the main process
    (:func:`finecap.train.setup.build_sharded_model`). The data is built after, with the weights gathered where it
    runs the model (a frozen encoder's feature cache: :func:`finecap.train.setup.build_data`)."""
    model, layers = build_sharded_model(cfg, resume_from, accelerator.device, accelerator.is_main_process)
    if accelerator.is_main_process:
        log.info("train.strategy=fsdp: %d transformer layers and the captioner sharded over %d processes (FSDP2); "
                 "the weights read by the main process only", len(layers), accelerator.num_processes)  # fmt: skip
    with sharding.decoding(model) if reads_weights(model) else contextlib.nullcontext():
        data = build_data(cfg, model, accelerator, per_caption=per_caption)
    return model, data


def dry_run(cfg: Config) -> dict[str, Any]:
    """``finecap train ... --dry-run``: build the run as :func:`train` would (preparing the world and encoder it
    needs), print the resolved configuration, the parameters by part, role and dtype, an estimate of the memory of
    weights and training state, and run one training step on the first global batch of a throwaway model, whose
    loss, time and peak memory it prints; nothing is written to the run directory, no checkpoint is saved. Returns
    the report (also what the tests read)."""
    import time

    import yaml

    from finecap.engines.base import engine_class
    from finecap.models.forecast import forecast_of_run, forecast_text
    from finecap.models.memory import parameter_counts, training_memory

    cfg = resolve_start(cfg)
    processes = process_state(cfg.train)
    run = _build_run(cfg, run_path(cfg.run), None, validators=None, callbacks=(), processes=processes, writes=False)
    acc, engine = run.accelerator, run.engine
    counts = parameter_counts(run.model)
    memory = training_memory(run.model)
    batches = engine.data.sampler.batches(0)
    fields = engine.data.sampler.example_fields(0)
    micro: list[dict[str, Any]] = []
    for batch in engine.epoch_loader(batches):
        for name, table in fields.items():
            batch[name] = torch.tensor([table[int(i)] for i in batch["index"]])
        micro.append(batch)
        if len(micro) == cfg.train.grad_accum_steps:
            break
    info = engine.step_info(batches[0], fields)
    cuda = acc.device.type == "cuda"
    forecast = forecast_of_run(run.model, cfg, micro[0], engine.objective, acc.device.type == "cpu") if micro else None
    device_bytes = torch.cuda.get_device_properties(acc.device).total_memory if cuda else None
    # a colocated engine's own share of the device (vLLM's KV cache and weights: decode.engine), beside the step
    share = engine_class(cfg.decode).device_share(acc.unwrap_model(run.model), cfg, device_bytes, cuda)
    # RL rollouts put a sleeping engine's memory back before the step (vllm.enable_sleep_mode)
    asleep = cfg.vllm.enable_sleep_mode and getattr(engine.objective, "rollouts", None) is not None
    forecast_lines = forecast_text(memory, forecast, device_bytes, cuda, share,
                                   kept_beside(run.model, cfg, engine.objective), asleep)  # fmt: skip
    micro = [to_device({**mb, "step_info": info}, acc.device) for mb in micro]
    if acc.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(acc.device)
    rss = peak_rss_bytes()
    start = time.perf_counter()
    try:
        values = engine.train_step(micro)
        seconds = time.perf_counter() - start
    finally:
        engine.objective.close()  # e.g. the vLLM engine of decode.engine=vllm's rollouts
    engine.close_loader()
    peak = torch.cuda.max_memory_allocated(acc.device) if acc.device.type == "cuda" else peak_rss_bytes() - rss
    report = {"parameters": counts, "memory_bytes": memory, "step": {"loss": values["loss"], "seconds": seconds,
              "batch": cfg.train.batch_size, "peak_bytes": peak, "device": str(acc.device)},
              "forecast": forecast and {"activations": forecast["bytes"], "step": forecast["step"].__dict__},
              "forecast_lines": forecast_lines}  # fmt: skip
    if acc.is_main_process:
        print(yaml.safe_dump(cfg.to_dict(redact=True), sort_keys=False), end="")
        print(dry_run_text(report))
    return report


def kept_beside(model: torch.nn.Module, cfg: Config, objective: ObjectiveBase) -> dict[str, int]:
    """What a run keeps on its device beside the captioner and its training state (``--dry-run``'s forecast): a
    frozen copy of the retriever (``retriever.*``, :meth:`Retriever.weight_bytes
    <finecap.models.retriever.Retriever.weight_bytes>`) when a component declares it (the objective's reward, on the
    device from setup; a validator, from its first evaluation): one copy however many, as the run loads it once and
    they share it (:class:`~finecap.models.retriever.SharedRetrievers`); and the GRPO KL's copy of the trained
    weights (:meth:`Reference.copy_bytes <finecap.objectives.reference.Reference.copy_bytes>`)."""
    reads = "retriever" in declared_needs(objective) or any(
        "retriever" in declared_needs(factory) for factory in validator_factories(cfg))  # fmt: skip
    out = {"frozen retrievers": 0, "the KL reference's copy of the trained weights": 0}
    if reads:
        out["frozen retrievers"] = Retriever.weight_bytes(retriever_path(cfg))
    reference = getattr(objective, "reference", None)
    if reference is not None:
        out["the KL reference's copy of the trained weights"] = reference.copy_bytes(model)
    return out


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (``ru_maxrss``, kilobytes on Linux)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def dry_run_text(report: dict[str, Any]) -> str:
    """The parameter table, the memory estimate and the step of :func:`dry_run`'s report, as printed."""
    gib = 1024**3
    rows = ["dry run: nothing trained or written", "parameters (part, role, dtype: count):"]
    for part, roles in report["parameters"].items():
        for role, dtypes in roles.items():
            rows += [f"  {part:<8} {role:<9} {dtype:<9} {n:>14,}" for dtype, n in dtypes.items()]
    mem = report["memory_bytes"]
    rows.append("memory estimate per process (GiB): " + ", ".join(f"{k} {v / gib:.3f}" for k, v in mem.items())
                + " (exact; activations come on top)")  # fmt: skip
    rows += report.get("forecast_lines", [])
    step = report["step"]
    where = ("peak allocated (measured)" if step["device"].startswith("cuda")
             else "peak RSS growth (not activations: allocator reuse and AdamW's first allocation)")  # fmt: skip
    rows.append(
        f"one training step on the first batch ({step['batch']} per process, {step['device']}): loss "
        f"{step['loss']:.4f}, {step['seconds']:.2f} s, {where} {step['peak_bytes'] / gib:.3f} GiB"
    )
    return "\n".join(rows)


def _train(
    cfg: Config,
    processes: PartialState,
    *,
    validators: Sequence[Validator] | None,
    resume: bool,
    overwrite: bool,
    callbacks: Sequence[Callable[[TrainState], None]],
    run_dir_option: str = "run.dir",
) -> Path:
    """:func:`train` with the run directory's lock held (main process)."""
    run_dir = run_path(cfg.run)
    found = [""]
    if processes.is_main_process:
        found = [str(prepare_run_dir(run_dir, resume=resume, overwrite=overwrite, reads=run_reads(cfg),
                                     option=run_dir_option) or "")]  # fmt: skip
    if processes.num_processes > 1:
        found = broadcast_object_list(found)
    resume_from = Path(found[0]) if found[0] else None
    saved = cfg.saved_dict()  # absolute paths, secrets masked: what config.yaml holds and trackers receive
    changes: list[str] = []
    if resume_from is not None:  # a resumed run reads the data and retriever it started with, in its dtypes
        check_fingerprints_of_run(run_dir, cfg, parts=("data", "retriever"))
        trained = trained_config(resume_from, run_dir)
        changes = config_changes(trained, saved)
        check_unchanged_on_resume(trained, changes)

    run = _build_run(cfg, run_dir, resume_from, validators=validators, callbacks=callbacks, processes=processes)
    accelerator, engine, data = run.accelerator, run.engine, run.data
    if resume_from is not None:
        engine.restore(resume_from)
        if accelerator.is_main_process:
            log.info(
                "resume: continuing %s from %s (step %d of %d)", run_dir, resume_from, engine.state.step, engine.total
            )
            for change in changes:
                log.info("resume: configuration changed: %s", change)
    if accelerator.is_main_process:
        if resume_from is not None:  # first: a log that is not finecap's, or too large to read, changes nothing
            truncate_metrics(run_dir / METRICS_FILE, engine.state.step)
        write_output(run_dir / CONFIG_FILE, cfg.to_yaml(), "config")  # remembered as finecap's (finecap.outputs)
        # the data, captioner start and retriever this run reads (resumed: the captioner its checkpoint holds; a
        # train.init_from start's encoder from its captioner.json as read with its weights, under its run's swap
        # guard, not read again now: a run still training may have saved another best since)
        start = accelerator.unwrap_model(run.model).checkpoint_meta
        write_fingerprints(run_dir, cfg, model_dir(resume_from) if resume_from is not None else None, start)
    # trackers write under <run>/trackers, never the working directory, for the whole run (mlflow reads its tracking
    # URI at every call); wandb records the command line when it starts
    resumed_at = engine.state.step if resume_from is not None else None  # the killed run's later steps are hidden
    with placed_trackers(cfg.train.log_with, run_dir / TRACKERS_DIR, accelerator.is_main_process,
                         resumed_at) as places:  # fmt: skip
        with masked_argv():
            accelerator.init_trackers("finecap", config=tracker_config(saved), init_kwargs=places)
        try:
            state = engine.fit()
        finally:  # also when training stops with an error: an mlflow or wandb run left active fails the next one
            for tracker in accelerator.trackers:  # not end_training(): it would destroy the process group, and a
                tracker.finish()  # caller (the demo, a sweep) may train again in the same processes
    if accelerator.is_main_process:
        log.info(summary(run_dir, state, cfg.train.best_metric, data.skipped))
    return run_dir
