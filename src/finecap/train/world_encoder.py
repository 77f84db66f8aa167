"""Training the world encoder through the same engine as every captioner (:class:`finecap.train.engine.Engine`).

The recipe (:func:`ensure_world_encoder`, which ``finecap retriever train`` and :mod:`finecap.train.prepare` call)
loads the world's images and labels (:func:`finecap.models.world_encoder.load_split`), builds the dual encoder and
calls :func:`fit_world_encoder`. Each optimizer step takes a random batch of training images (the last, smaller batch
of an epoch is dropped: a contrastive batch needs its negatives) and :class:`WorldEncoderObjective` computes

- a symmetric InfoNCE loss between the images and one reference caption per image (drawn at random each time);
- the same loss between ``retriever.dense_fraction`` of the images (a random subset) and their dense captions, the
  dense texts scored against every image of the batch (dense captions are long, so a subset halves their cost);
- ``retriever.aux_weight`` x the mean auxiliary cross-entropy from the scene graphs on the (unnormalised) image
  embedding, through linear heads that are discarded after training (:class:`~finecap.models.world_encoder.AuxHeads`).

Optimisation (``retriever.*``): AdamW (weight decay 0.05 on every parameter but the logit scale), the engine's
cosine schedule after a linear warmup over the first 5% of the steps, gradient clipping at 1. The caption and
dense-subset draws come from the objective's own generators (saved in its state), so they do not depend on anything
else that consumes random numbers.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from finecap.config import Config, RetrieverConfig, TrainConfig
from finecap.data.samplers import RandomBatches
from finecap.locks import waiting_lock
from finecap.models.retriever import Retriever
from finecap.models.tokenizer import world_tokenizer
from finecap.models.world_encoder import (
    MAIN_LABELS,
    AuxHeads,
    WorldData,
    build_world_model,
    contrastive_loss,
    load_split,
    world_image_processor,
)
from finecap.models.world_encoder_cache import ENCODER_VERSION, encoder_dir, encoder_key, preset_of
from finecap.objectives.base import ObjectiveBase, ObjectiveOutput
from finecap.train.engine import Engine, TrainingData, make_accelerator
from finecap.train.schedule import build_scheduler
from finecap.utils.files import make_temporary_dir, write_json
from finecap.utils.folders import atomic_replace_dir, check_swap
from finecap.world.make import ensure_world
from finecap.world.scene import LABEL_SIZES

log = logging.getLogger(__name__)

WARMUP_FRACTION = 0.05
WEIGHT_DECAY = 0.05


class DualEncoderWithHeads(nn.Module):
    """What the engine trains: the dual encoder and the auxiliary heads (discarded after training)."""

    def __init__(self, model: nn.Module, aux: AuxHeads):
        super().__init__()
        self.model, self.aux = model, aux

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """Unnormalised image embeddings ``(B, D)`` of normalised ``pixels (B, 3, H, W)``."""
        return self.model.get_image_features(pixel_values=pixels).pooler_output


@dataclass
class WorldImages:
    """The training examples: image ``index`` of a :class:`WorldData` split (the engine's data set)."""

    data: WorldData

    def __len__(self) -> int:
        return len(self.data.ids)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"index": index}

    def image_id(self, index: int) -> int:
        return self.data.ids[index]


@dataclass
class WorldCollator:
    """Stacks a batch's images (normalised by the training images' channel ``mean``/``std``) and labels."""

    data: WorldData
    mean: torch.Tensor
    std: torch.Tensor

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        idx = torch.tensor([it["index"] for it in items])  # (B,)
        pixels = (self.data.images[idx].float() / 255 - self.mean[:, None, None]) / self.std[:, None, None]
        return {"index": idx, "pixels": pixels, "main": self.data.main[idx], "cell": self.data.cell[idx]}


class WorldEncoderObjective(ObjectiveBase):
    """Contrastive (reference + dense captions) + auxiliary scene-graph loss of the world encoder (module
    docstring). ``tokenizer`` is the world tokenizer; the caption draws use a ``random.Random(seed)`` and the dense
    subsets a ``torch.Generator`` seeded with ``seed``."""

    def __init__(self, data: WorldData, tokenizer: Any, rc: RetrieverConfig, seed: int):
        self.data, self.tokenizer, self.rc = data, tokenizer, rc
        self.rng = random.Random(seed)
        self.generator = torch.Generator().manual_seed(seed)

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.getstate(), "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.generator.set_state(state["generator"])

    def _text(self, model: DualEncoderWithHeads, texts: list[str], device: torch.device) -> torch.Tensor:
        enc = self.tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
        out = model.model.get_text_features(input_ids=enc["input_ids"].to(device),
                                            attention_mask=enc["attention_mask"].to(device)).pooler_output  # fmt: skip
        return F.normalize(out, dim=-1)  # (T, D)

    def __call__(self, model: DualEncoderWithHeads, batch: dict[str, Any]) -> ObjectiveOutput:
        idx = batch["index"].cpu()  # (B,)
        device = batch["pixels"].device
        img = model(batch["pixels"])  # (B, D)
        img_unit = F.normalize(img, dim=-1)
        scale = model.model.logit_scale.exp().clamp(max=100.0)
        targets = torch.arange(len(idx), device=device)
        refs = [self.rng.choice(self.data.refs[i]) for i in idx.tolist()]
        losses = {"reference": contrastive_loss(self._text(model, refs, device), img_unit, targets, scale)}
        if self.rc.dense_fraction > 0:
            n_dense = max(1, round(len(idx) * self.rc.dense_fraction))
            sub = torch.randperm(len(idx), generator=self.generator)[:n_dense]  # (Bd,)
            dense = [self.data.dense[i] for i in idx[sub].tolist()]
            losses["dense"] = contrastive_loss(self._text(model, dense, device), img_unit, sub.to(device), scale)
        if self.rc.aux_weight > 0:
            losses["aux"] = self.rc.aux_weight * model.aux(img, batch["main"], batch["cell"])
        return ObjectiveOutput(losses=losses, num_items=len(idx))


def fit_world_encoder(
    model: nn.Module, aux: AuxHeads, tokenizer: Any, data: WorldData, mean: torch.Tensor, std: torch.Tensor,
    rc: RetrieverConfig, seed: int, progress: bool = True,
) -> dict[str, float]:  # fmt: skip
    """Train the dual encoder ``model`` (and ``aux``) in place on ``data``; returns ``{"steps", "first_loss",
    "loss"}``.

    Runs on one process (a multi-process launch needs the encoder prepared first: ``finecap retriever train``).
    """
    n = len(data.ids)
    bs = min(rc.batch_size, n)
    sampler = RandomBatches(n, bs, seed=seed, drop_last=True)
    total = rc.epochs * sampler.num_batches(0)
    if total == 0:
        return {"steps": 0, "first_loss": float("nan"), "loss": float("nan")}
    settings = TrainConfig(max_steps=total, batch_size=bs, lr=rc.lr, weight_decay=WEIGHT_DECAY,
                           warmup_steps=max(1, math.floor(total * WARMUP_FRACTION)), schedule="cosine",
                           grad_clip=1.0, log_every=total, log_with=[], eval_samples=0)  # fmt: skip
    accelerator = make_accelerator(settings)
    if accelerator.num_processes > 1:
        raise ValueError(
            "the world encoder is trained on one process: run `finecap retriever train` (same world.* and "
            "retriever.* settings) before launching several processes"
        )
    wrapped = DualEncoderWithHeads(model, aux)
    logit_scale = [model.logit_scale]
    decay = [p for p in wrapped.parameters() if p is not model.logit_scale]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                                   {"params": logit_scale, "weight_decay": 0.0}], lr=rc.lr)  # fmt: skip
    scheduler = build_scheduler(optimizer, warmup=settings.warmup_steps, total=total, kind="cosine")
    objective = WorldEncoderObjective(data, tokenizer, rc, seed)
    engine = Engine(settings, accelerator, wrapped, objective,
                    TrainingData(WorldImages(data), WorldCollator(data, mean, std), sampler), optimizer, scheduler,
                    seed=seed, total=total, progress=progress, desc="world encoder")  # fmt: skip
    first: dict[str, float] = {}
    engine.callbacks.append(lambda state: first.setdefault("loss", engine.last_values["loss"]))
    engine.fit()
    last = engine.last_values.get("loss", float("nan"))
    return {"steps": engine.state.step, "first_loss": first.get("loss", float("nan")), "loss": last}


# --------------------------------------------------------------------------------------------------------------------
# The world encoder of a configuration, found or trained
# --------------------------------------------------------------------------------------------------------------------

ENCODER_KIND = "world-encoder"
"""The folder kind of a trained world encoder (:func:`finecap.utils.folders.folder_mark_text`): only such a folder (and
its ``.old``) is ever replaced in the cache."""


def ensure_world_encoder(cfg: Config, progress: bool = True, *, make: bool = True) -> Path:
    """The world encoder folder of ``cfg`` (``<cache>/world_encoder/<key>``, :func:`encoder_dir`), trained first when
    it is missing and ``make`` (the world made first when missing, :func:`finecap.world.make.ensure_world`), each
    with one logged line saying so and where; without ``make`` a missing encoder raises ``FileNotFoundError``
    naming ``finecap retriever train``. ``retriever train`` and ``probe`` call it, other commands reach it through
    :func:`finecap.train.prepare.prepare`. Call it on one process (the main one) before the others load the encoder.
    Training holds :func:`training_lock`: a second process asking for the same encoder meanwhile waits for it and
    then returns its folder.
    """
    out = encoder_dir(cfg)
    if (out / "encoder.json").exists():
        log.debug("retriever: the world encoder %s is trained: %s", out.name, out)
        return out
    if not make:
        raise FileNotFoundError(
            f"{out}: the world encoder of this configuration (world.*, retriever.*, run.seed) is not trained "
            "(finecap trains it only for a command that trains on the world); train it with `finecap retriever "
            "train` and the same world.* / retriever.* / run.seed settings, or set retriever.checkpoint (and "
            "model.encoder) to a CLIP checkpoint"
        )
    world = ensure_world(cfg, make=True, progress=progress)
    out.parent.mkdir(parents=True, exist_ok=True)
    with waiting_lock(training_lock(out), log=log.info, waiting=f"retriever: another finecap is training the world "
                      f"encoder {out.name}; waiting for it ({training_lock(out)})"):  # fmt: skip
        if (out / "encoder.json").exists():  # trained by the process this one waited for
            log.info("retriever: the world encoder %s was trained meanwhile by another finecap: %s", out.name, out)
            return out
        log.info("retriever: training the world encoder %s on the world at %s into %s", out.name, world, out)
        return train_world_encoder(cfg, world, progress=progress)


def training_lock(out: Path) -> Path:
    """The lock file (``<cache>/world_encoder/.<key>.lock``, beside the folder it guards, which is swapped whole)
    that the one process training the world encoder ``out`` holds (:func:`finecap.locks.waiting_lock`): two
    commands needing the same encoder on one home (two terminals, a job array) train it once, the second waiting
    for the first and then loading its folder, rather than training it again and swapping its own folder in under
    the first while that one loads it."""
    return out.parent / f".{out.name}.lock"


def train_world_encoder(cfg: Config, world: Path, progress: bool = True) -> Path:
    """Train the world encoder of ``cfg`` on the complete world at ``world`` into :func:`encoder_dir` (module
    docstring); returns the folder."""
    out = encoder_dir(cfg)
    check_swap(out, ENCODER_KIND)  # before the work: a folder finecap did not make there (or at .old) stops it
    rc = cfg.retriever
    t0 = time.perf_counter()
    train = load_split(world, "train", progress=progress)
    val = load_split(world, "val", progress=progress)
    if len(train.ids) < 2:
        raise ValueError(f"world.n_train={len(train.ids)}: the world encoder needs at least 2 training images")
    load_s = time.perf_counter() - t0

    threads = torch.get_num_threads()
    torch.set_num_threads(min(2, threads))  # the demo machine has 2 cores; more threads only add contention
    try:
        torch.manual_seed(cfg.run.seed)
        tokenizer = world_tokenizer()
        image_size = int(train.images.shape[-1])
        model = build_world_model(tokenizer, image_size, rc.preset)
        pixels = train.images[: min(len(train.ids), 2000)].float().div(255)  # (n, 3, H, W)
        mean, std = pixels.mean(dim=(0, 2, 3)), pixels.std(dim=(0, 2, 3)).clamp_min(1e-3)
        processor = world_image_processor(image_size, mean.tolist(), std.tolist())
        t1 = time.perf_counter()
        stats = train_dual_encoder(model, tokenizer, train, mean, std, cfg, progress=progress)
        train_s = time.perf_counter() - t1
        model.eval()
        accuracy = in_batch_accuracy(model, tokenizer, val, mean, std, rc.batch_size) if val.ids else {}
    finally:
        torch.set_num_threads(threads)

    tmp = make_temporary_dir(out)  # unique: concurrent trainers never share it, and no planted link is followed
    Retriever(model, tokenizer, processor, name="world-encoder").save(tmp)
    info = {
        "key": encoder_key(cfg),
        "version": ENCODER_VERSION,
        "preset": dataclasses.asdict(preset_of(rc.preset)),
        "world": str(world),
        "config": {"retriever": dataclasses.asdict(rc), "seed": cfg.run.seed},
        "n_train": len(train.ids),
        "image_size": image_size,
        "load_seconds": round(load_s, 1),
        "train_seconds": round(train_s, 1),
        "steps": stats["steps"],
        "final_loss": stats["loss"],
        "in_batch_accuracy": accuracy,
    }
    write_json(tmp / "encoder.json", info)
    if (out / "encoder.json").exists():  # another process finished the same encoder meanwhile: keep its folder
        shutil.rmtree(tmp)
    else:
        atomic_replace_dir(tmp, out, kind=ENCODER_KIND)
    acc = ", ".join(f"{k} {v:.3f}" for k, v in accuracy.items())
    log.info("world encoder: %d steps in %.0fs; val in-batch top-1: %s; saved %s", stats["steps"], train_s, acc, out)
    return out


def _normalise(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    return (images.float() / 255 - mean[:, None, None]) / std[:, None, None]  # (B, 3, H, W)


def _text_emb(model: Any, tokenizer: Any, texts: list[str], device: torch.device) -> torch.Tensor:
    enc = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    out = model.get_text_features(input_ids=enc["input_ids"].to(device),
                                  attention_mask=enc["attention_mask"].to(device)).pooler_output  # fmt: skip
    return F.normalize(out, dim=-1)  # (T, D)


def train_dual_encoder(
    model: Any, tokenizer: Any, data: WorldData, mean: torch.Tensor, std: torch.Tensor, cfg: Config,
    progress: bool = True,
) -> dict[str, float]:  # fmt: skip
    """Contrastive (reference + dense captions) + auxiliary scene-graph training through the library's engine
    (:func:`finecap.train.world_encoder.fit_world_encoder`; the heads are discarded afterwards)."""
    cell_sizes = [7, 9, 3, 3]  # empty + 6 shapes, empty + 8 colours, empty + 2 sizes, none + 2 patterns
    aux = AuxHeads(model.config.projection_dim, [LABEL_SIZES[k] for k in MAIN_LABELS], cell_sizes, 9)
    return fit_world_encoder(model, aux, tokenizer, data, mean, std, cfg.retriever, cfg.run.seed, progress=progress)


@torch.no_grad()
def in_batch_accuracy(
    model: Any, tokenizer: Any, data: WorldData, mean: torch.Tensor, std: torch.Tensor, batch_size: int
) -> dict[str, float]:
    """Top-1 accuracy of image->caption and caption->image retrieval within batches of ``batch_size`` images
    (reference caption = each image's first; dense caption)."""
    device = next(model.parameters()).device
    hits: dict[str, list[float]] = {}
    for start in range(0, len(data.ids), batch_size):
        sl = slice(start, start + batch_size)
        pixels = _normalise(data.images[sl], mean, std).to(device)
        img = F.normalize(model.get_image_features(pixel_values=pixels).pooler_output, dim=-1)  # (B, D)
        for kind, texts in (("ref", [r[0] for r in data.refs[sl]]), ("dense", data.dense[sl])):
            sim = _text_emb(model, tokenizer, texts, device) @ img.T  # (B, B)
            right = torch.arange(len(texts), device=device)
            hits.setdefault(f"{kind}/text_to_image", []).extend((sim.argmax(1) == right).float().tolist())
            hits.setdefault(f"{kind}/image_to_text", []).extend((sim.argmax(0) == right).float().tolist())
    return {k: float(np.mean(v)) for k, v in hits.items()}
