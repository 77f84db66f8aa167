"""What a training run is built from, as ``finecap train`` builds it: the captioner to train (fresh, from
``train.init_from`` or from the checkpoint it resumes, with its training configuration and memory levers), the unit
of a training example, and the training and validation data. The recipe (:mod:`finecap.train.run`) and the training
benchmarks (``benchmarks/train_step.py``, ``backbone_step.py``) build runs from these, so that what they time is what
training runs."""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from finecap.config import Config
from finecap.config.sections import MAX_TOKENS
from finecap.data.datasets import (
    CaptionCollator,
    CaptionDataset,
    load_records,
    model_collator,
    skipped_images,
    validation_records,
)
from finecap.data.features import model_features
from finecap.data.images import ImageLimits
from finecap.data.loading import encoder_draft
from finecap.data.records import DataError
from finecap.data.targets import cut_captions, text_ids, unknown_tokens
from finecap.engines import engine_class
from finecap.home import run_path, runs_root, start_path
from finecap.models import memory, sharding
from finecap.models.backbones import build_model as build_captioner
from finecap.models.backbones import check_backbone, check_loaded, load_captioner
from finecap.models.first_token import unshift_as
from finecap.models.lora import configure_training
from finecap.objectives.base import ObjectiveBase
from finecap.objectives.smile import training_shift
from finecap.runs import find_checkpoint, model_dir, reading_checkpoint
from finecap.utils.system import launched_rank
from finecap.utils.text import shell_command

log = logging.getLogger(__name__)


def resolve_start(cfg: Config, must_exist: bool = True) -> Config:
    """``cfg`` with ``train.init_from`` where the run reads it (:func:`finecap.home.start_path`: from the working
    directory, else under the runs root), absolute, so that the run's stored configuration names the checkpoint it
    started from; a run directory stands for its best checkpoint, else its last (:func:`finecap.runs.find_checkpoint`,
    whose ``FileNotFoundError`` names the folder to pass for any other folder). A start that is found nowhere is a
    ``FileNotFoundError`` naming the key, where it was looked for and, when a packaged recipe writes there, the
    command that makes it (:func:`maker_of`)::

        train.init_from=demo/mle/checkpoints/best: checkpoint not found (looked in the working directory and in
        <home>/runs); make it with `finecap train demo/mle`

    ``must_exist=False`` (a run resuming from a checkpoint of its own, which never reads the start again) makes the
    path absolute without looking for it."""
    value = cfg.train.init_from
    if not value:
        return cfg
    path = start_path(value, cfg.run)
    if path.exists():  # a run directory: its best checkpoint, else its last (as `finecap caption --checkpoint RUN`)
        try:
            path = find_checkpoint(path)
        except FileNotFoundError:  # no checkpoint there, or none of the folders one is loaded from: it names them
            if must_exist:
                raise
    elif must_exist:
        looked = "" if Path(value).is_absolute() else f" (looked in the working directory and in {runs_root(cfg.run)})"
        maker = maker_of(path, cfg.run.root)
        how = (f"make it with `{maker}`" if maker else "train the run that makes it, give an existing checkpoint or "
               "run directory, or train.init_from=null for a fresh model")  # fmt: skip
        raise FileNotFoundError(f"train.init_from={value}: checkpoint not found{looked}; {how}")
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, init_from=os.path.abspath(path)))


def maker_of(path: str | Path, root: str = "") -> str | None:
    """The command that makes the run holding ``path``: ``finecap train RECIPE`` for the packaged recipe whose run
    directory (``<root or home/runs>/<run.name>``, :func:`finecap.home.run_path`) is ``path`` or holds it, with
    ``run.root=ROOT`` when ``root`` is set; ``None`` when no packaged recipe writes there.

    Example::

        >>> from finecap.home import home
        >>> maker_of(home() / "runs" / "demo" / "mle" / "checkpoints" / "best")
        'finecap train demo/mle'
        >>> maker_of("/srv/runs/coco/mle_vlm", root="/srv/runs")
        'finecap train coco/mle_vlm run.root=/srv/runs'
        >>> maker_of("/elsewhere/x") is None
        True
    """
    from finecap.config import load
    from finecap.recipes import list_recipes, resolve_recipe

    target = Path(os.path.abspath(path))
    overrides = [f"run.root={root}"] if root else []
    for name in list_recipes():
        try:
            folder = Path(os.path.abspath(run_path(load(resolve_recipe(name), overrides).run)))
        except ValueError:  # a recipe that does not load here names no folder
            continue
        if folder == target or folder in target.parents:
            return shell_command(["finecap", "train", name, *overrides])
    return None


@dataclass
class CaptionData:
    train: CaptionDataset
    val: CaptionDataset
    collator: CaptionCollator
    train_records: list
    skipped: int = 0
    """Images ``data.skip_bad_images`` left out of train and val (they do not decode, or the model refuses them:
    :func:`finecap.data.datasets.skipped_images`)."""


def build_model(
    cfg: Config, resume_from: Path | None = None, device: torch.device | str | None = None
) -> torch.nn.Module:
    """The captioner to train: ``resume_from`` (a checkpoint), else ``train.init_from``, else a fresh one; what it
    trains (``model.train_lm``, ``model.train_encoder``, LoRA adapters ``lora.*``) follows ``cfg``, also for a
    checkpoint (:func:`finecap.models.lora.configure_training`), and so do the memory levers: weights loaded in
    ``model.dtype`` (a checkpoint's float32 trained weights put back), what learns in ``model.trainable_dtype``,
    ``train.gradient_checkpointing`` (:func:`finecap.models.memory.prepare_training`). A checkpoint must be of the
    configured backbone and settings (:func:`finecap.models.backbones.check_backbone`) and is loaded strictly
    (:mod:`finecap.models.strict`: weights that do not fit, or hold NaN or infinity, are refused); its backbone
    section's other settings apply where they can (dropout) and are refused where they cannot
    (:func:`finecap.models.backbones.check_loaded`). The captioner records the first-token shift its weights emit
    (:func:`finecap.objectives.smile.training_shift`: the run's own, or its start's carried on), which its validation
    captions, rollouts and rewards are written without and its checkpoints record. Everything it takes of a checkpoint
    (``captioner.json``, weights, float32 masters, the stored configuration the shift may come from) is read under one
    hold of that run's swap guard (:func:`finecap.runs.reading_checkpoint`): a start that a run still training saves
    again meanwhile is read as one save, and the save waits for the reads, never for the training; the captioner keeps
    the ``captioner.json`` read there (:attr:`~finecap.models.base.CaptionerBase.checkpoint_meta`), which the run's
    fingerprints take its start's encoder from. ``device``: the
    process's device (``accelerator.device``); on a CUDA device pretrained weights are read straight onto it
    (:func:`finecap.models.memory.loading_onto`), not into host memory first; the caller still moves the model there
    (its parts built with random weights are on the CPU).
    ``meta``: no pretrained weight is read, those parameters are left on the meta device (a sharded run's other
    processes: :func:`finecap.models.sharding.receive_weights`).
    """
    with memory.loading_onto(device):
        return _build_model(cfg, resume_from)


def _build_model(cfg: Config, resume_from: Path | None) -> torch.nn.Module:
    start = resume_from or cfg.train.init_from
    if not start:
        return unshift_as(_prepared(build_captioner(cfg), cfg), training_shift(cfg))
    option = "--resume" if resume_from else "train.init_from"
    # one save's captioner.json, weights, float32 masters, config.yaml and shift: a start that a run still training
    # saves again is swapped only once they are read (docs/training.md#real-checkpoints-and-data)
    with reading_checkpoint(start) as found:
        folder = model_dir(found)
        check_backbone(folder, cfg, option)
        options = memory.LoadOptions.of(cfg.model)
        model = load_captioner(folder, trusted=(cfg.model.kind,), options=options)  # strict: finecap.models.strict
        check_loaded(model, folder, cfg, option)  # per key: refused when it cannot apply (tiny sizes), else applied
        if not any(p.is_meta for p in model.parameters()):  # built without weights: they come from the main process
            memory.load_float32_masters(model, folder)
        shift = training_shift(cfg, found, resumed=resume_from is not None)
    return unshift_as(_prepared(model, cfg), shift)


def _prepared(model: torch.nn.Module, cfg: Config) -> torch.nn.Module:
    """``model`` configured for training (adapters, dtypes, checkpointing), refused where its parts' dtypes would
    break its forward (:func:`finecap.models.vlm.check_merge_dtypes`)."""
    from finecap.models.vlm import check_merge_dtypes  # transformers' VLM classes: only where a model is built

    model = memory.prepare_training(configure_training(model, cfg), cfg)
    check_merge_dtypes(model)
    return model


def build_sharded_model(cfg: Config, resume_from: Path | None, device: torch.device | str,
                        main: bool) -> tuple[torch.nn.Module, list[str]]:  # fmt: skip
    """The training model of :func:`build_model` sharded over the current process group (``train.strategy=fsdp``
    with several processes, :func:`finecap.models.sharding.shard_captioner`), and the names of its sharded layers.
    Only the ``main`` process reads the weights (onto ``device``, the process's device); every other builds the
    captioner with its pretrained parameters on the meta device, and receives its shards from the main process once
    the model is sharded (:func:`finecap.models.sharding.receive_weights`): host memory holds about two copies of
    the weights in all (the main process's, for a moment with its shard, and the shards), not one per process. Every
    process must call it."""
    model = build_model(cfg, resume_from, device if main else "meta")
    if main:
        model.to(device)
    sharding.match_main(model)
    state = model.state_dict() if main else {}
    layers = sharding.shard_captioner(model, cfg.train.mixed_precision, device)
    sharding.receive_weights(model, state, device)
    return model, layers


def train_unit(cfg: Config, objective: ObjectiveBase) -> str:
    """``data.train_unit``, or with ``auto`` the objective's ``example_unit``: per-caption for likelihood objectives
    (as ClipCap), per-image for objectives that sample captions of an image (REINFORCE, self-retrieval), so that no
    image appears twice in a batch or several times per epoch."""
    unit = cfg.data.train_unit if cfg.data.train_unit != "auto" else objective.example_unit
    if unit not in ("caption", "image"):
        raise ValueError(f"train.objective: example_unit must be 'caption' or 'image', got {unit!r}")
    return unit


VOCABULARY_SAMPLE = 5000
"""Training captions :func:`check_captions` tokenises (evenly spaced over the split; a data set's share of unknown
words, or of captions too long for ``data.max_tokens``, is a property of the data set, which a few thousand captions
show)."""

CUT_SHARE_SAID = 0.01
""":func:`check_captions` warns when more than this share of the training captions is longer than ``data.max_tokens``
keeps. A few long outliers (a web alt text, a caption that lists every object) cut at 47 tokens change little of what
the captioner learns, and a warning every run of such data says would teach one to skip it; more than 1 in 100 cut is
a property of the data set (dense captions, a small ``data.max_tokens``): the captioner learns to stop where the
targets stop. Of the 5,000 captions read (:data:`VOCABULARY_SAMPLE`) that is 50 or more, not a chance few."""

CUT_KEEP = 0.99
"""The share of the training captions whose whole length the ``data.max_tokens`` that :func:`check_captions`
proposes keeps (the longest 1 % may be outliers that would double every batch's length)."""


def check_captions(tokenizer: Any, records: list, cfg: Config) -> None:
    """Read up to :data:`VOCABULARY_SAMPLE` training captions as the training targets read them, once
    (:func:`finecap.data.targets.text_ids`, without the captioner's ``caption_prefix``, white space its tokenizer
    merges into the first word), for two checks: the unknown tokens (:func:`check_vocabulary`, which stops) and the
    captions ``data.max_tokens`` cuts (:func:`note_cut_captions`, which warns)."""
    captions = [c for r in records for c in r.captions]
    sample = captions[:: max(1, len(captions) // VOCABULARY_SAMPLE)]
    rows = text_ids(tokenizer, sample) if sample else []
    check_vocabulary(tokenizer, sample, rows, cfg)
    note_cut_captions([len(r) for r in rows], cfg)


def check_vocabulary(tokenizer: Any, captions: list[str], rows: list[list[int]], cfg: Config) -> None:
    """Stop, with one line naming the share, the worst caption as tokenised and the fix, when more than
    ``data.max_unk_share`` of the training captions' tokens (``captions`` read as ``rows``) are unknown to the
    captioner's tokenizer: a word-level vocabulary made for other captions (``clipcap.lm=world-tiny`` on one's own
    photos) would otherwise train on ``a <unk> <unk> in an orange <unk>`` without a word."""
    found = unknown_tokens(tokenizer, captions, rows)
    if found.share > cfg.data.max_unk_share:
        if cfg.model.kind in ("vlm", "blip"):  # a tiny or world model of the backbone: clipcap.lm does nothing here
            key, name = f"{cfg.model.kind}.name", getattr(cfg, cfg.model.kind).name
            how = (f"a pretrained model whose tokenizer has them ({key}=...; {key}={name} knows the world's words "
                   "only), or ClipCap over these captions' words, offline: model.kind=clipcap clipcap.lm=data-tiny "
                   "(docs/data.md)")  # fmt: skip
        else:
            how = ("clipcap.lm=data-tiny (a word-level GPT-2 over the training captions' words, offline, "
                   "docs/data.md) or a pretrained LM or VLM (clipcap.lm=gpt2, vlm.name=...)")  # fmt: skip
        raise DataError(
            f"{cfg.data.path or 'the data set'}: {found.share:.0%} of the training captions' tokens are unknown to "
            f"the captioner's tokenizer ({len(tokenizer)} tokens), e.g. {found.example!r} reads as "
            f"{found.tokenised!r} (data.max_unk_share={cfg.data.max_unk_share}); train on a vocabulary made for these "
            f"captions: {how}"
        )


def note_cut_captions(lengths: list[int], cfg: Config) -> None:
    """Warn (rank 0 of a launch) when more than :data:`CUT_SHARE_SAID` of the training captions, ``lengths`` tokens
    long, are longer than ``data.max_tokens`` keeps (EOS takes a place): their targets keep the first
    ``data.max_tokens - 1`` tokens and end with EOS (:func:`finecap.data.targets.encode_captions`), so the captioner
    learns to stop there; the warning names the share, the longest caption and the ``data.max_tokens`` that keeps
    :data:`CUT_KEEP` of them whole (at most the option's own limit) (docs/data.md#captions-longer-than-datamax_tokens).
    """
    limit = cfg.data.max_tokens
    cut = cut_captions(lengths, limit, CUT_KEEP)
    if cut.share <= CUT_SHARE_SAID or launched_rank() != 0:
        return
    if cut.fits <= MAX_TOKENS:
        raise_to = f"data.max_tokens={cut.fits} keeps {CUT_KEEP:.0%} of them whole"
    else:
        raise_to = (f"data.max_tokens={MAX_TOKENS}, its most, keeps "
                    f"{1 - cut_captions(lengths, MAX_TOKENS).share:.0%} of them whole")  # fmt: skip
    log.warning("data: %s: %.0f%% of the training captions (%d read; the longest %d tokens) are longer than "
                "data.max_tokens=%d keeps (%d tokens and EOS): their training targets end after %d tokens, so the "
                "captioner learns to stop there; %s", cfg.data.path or "the data set", 100 * cut.share, len(lengths),
                cut.longest, limit, limit - 1, limit - 1, raise_to)  # fmt: skip


def reads_weights(model: Any) -> bool:
    """Whether :func:`build_data` runs ``model`` (its frozen encoder fills the feature cache), so that a sharded
    model's weights must be gathered around it (:func:`finecap.models.sharding.decoding`)."""
    return not model.train_encoder and model.cache_features


def build_data(cfg: Config, model: Any, accelerator: Accelerator, *, per_caption: bool) -> CaptionData:
    """Training examples (one per reference caption, or per image) and the first ``train.eval_samples`` validation
    images; frozen encoders read images through the feature cache, which every process builds its part of
    (:func:`finecap.data.features.model_features`); otherwise images are decoded in the DataLoader workers (JPEGs
    draft-decoded: :func:`finecap.data.loading.encoder_draft`). With an engine that reads images (its declared
    ``reads_images``: ``decode.engine=vllm``) the batches also carry the PIL images, which the RL rollouts' engine
    decodes from (:mod:`finecap.engines.rollouts`). With ``data.skip_bad_images`` the images that do not decode and
    those the model's preprocessing refuses are left out of both (:func:`finecap.data.datasets.load_records` with the
    model) and counted in ``skipped``."""
    train_records = load_records(cfg, "train", model=model)
    check_captions(model.tokenizer, train_records, cfg)  # before the feature caches: seconds, not minutes
    val_records = validation_records(cfg, model)
    feats: dict[str, torch.Tensor | None] = {"train": None, "val": None}
    draft = None
    if reads_weights(model):
        for split, records in (("train", train_records), ("val", val_records)):
            feats[split] = model_features(model, records, cfg, split, progress=accelerator.is_main_process,
                                          processes=accelerator)  # fmt: skip
    else:
        draft = encoder_draft(model.encoder, cfg.data)
    limits = ImageLimits.of(cfg.data)
    return CaptionData(
        train=CaptionDataset(
            train_records, per_caption=per_caption, features=feats["train"], draft=draft, limits=limits
        ),
        val=CaptionDataset(val_records, per_caption=False, features=feats["val"], draft=draft, limits=limits),
        collator=model_collator(model, cfg.data.max_tokens, keep_images=engine_class(cfg.decode).reads_images),
        train_records=train_records,
        skipped=sum(len(skipped_images(cfg, split, model=model)) for split in ("train", "val")),
    )
