"""Training the world encoder through the same engine as every captioner (:class:`finecap.train.engine.Engine`).

The recipe (``finecap retriever train``, :func:`finecap.app.retriever.ensure_world_encoder`) loads the world's images
and labels (:func:`finecap.models.world_encoder.load_split`), builds the dual encoder, and calls
:func:`fit_world_encoder`. Each optimizer step takes a random batch of training images (the last, smaller batch of an
epoch is dropped: a contrastive batch needs its negatives) and :class:`WorldEncoderObjective` computes

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

import math
import random
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from finecap.config import RetrieverConfig, TrainConfig
from finecap.data.samplers import RandomBatches
from finecap.models.world_encoder import AuxHeads, WorldData, contrastive_loss
from finecap.objectives.base import ObjectiveBase, ObjectiveOutput
from finecap.train.engine import Engine, TrainingData, make_accelerator
from finecap.train.schedule import build_scheduler

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
