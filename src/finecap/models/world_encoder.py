"""The world encoder: a tiny dual encoder trained on the synthetic world, standing in for a pretrained CLIP.

This module holds its pieces (architecture, image processor, auxiliary heads and loss, the world's data); its cache
key and :func:`~finecap.models.world_encoder_cache.world_encoder_path`, which *looks up* the trained encoder of a
configuration, are :mod:`finecap.models.world_encoder_cache`. Training it, and the
probe that checks its quality bar, are the ``finecap retriever train`` / ``probe`` commands of the application layer
(:mod:`finecap.app.retriever`): building a model never trains one.

Architecture (preset ``world-tiny``), a stock ``transformers.VisionTextDualEncoderModel``:

- vision tower: ``ConvNextModel`` with four stages (widths 64-128-256-256, one block each except none in the last)
  and a stem patch of ``image_size / 8`` px, so the stage maps are 8x8, 4x4, 2x2 and 1x1 (at 64 px: 8 px patches).
  The 2x2 map is as wide as the projection (256): the world BLIP and VLM read its cells as image tokens.
  The last stage is only ConvNeXt's 2x2-stride-2 downsampling conv, so the pooled output is a *learned* readout of the
  2x2 map rather than a global average over a larger map, which discards where things are. In 200-step trials
  (auxiliary loss only) towers ending in a global average pool (ConvNeXt, ResNet, MobileNet, a plain CNN) decoded the
  main object's shape at 21-52%, the same ConvNeXt with a 1x1 last map at 76-82%. A CLIP ViT (patch = grid cell)
  learned shapes but not positions in that budget (its position embeddings start 100x smaller than the patches).
- text tower: ``CLIPTextModel`` (width 128, 2 layers, 4 heads) over the world's word-level tokenizer; EOS id 4, so
  it pools at the first EOS.

A training step's time is mostly matrix products (65% of it in ``torch.profiler`` at batch 128): the ConvNeXt stages'
pointwise MLPs and the text tower's layers, the 40-token dense captions costing more than the image tower's forward.
Version 3 halved the first two stage widths (128-192 -> 64-128) and dropped one of three text layers, and trains 10
epochs of 64 instead of 12 of 128: on world seed 0 of an idle 2-core machine the training takes about 0.6 of the
version-2 time (``benchmarks/world_encoder_budget.py``, its results in ``benchmarks/results/``; docs/demo.md) for the
same quality bar.
- projections to 256 dimensions and a learned logit scale (initialised at 1/0.07, clamped at 100 as in CLIP).

The weights are initialised with ``initializer_range=0.1`` and ConvNeXt's layer scale at 1.0 (instead of 0.02 and
1e-6, made for long ImageNet schedules): with the defaults the tower barely moved in the few hundred steps the budget
allows. The checkpoint folder is an ordinary ``save_pretrained`` folder (``config.json`` records
``VisionTextDualEncoderModel``; the ConvNeXt config carries ``hidden_size`` for the projection), plus the tokenizer
and a ``CLIPImageProcessor`` with the world's size and the training images' channel mean and std, so
``AutoImageProcessor.from_pretrained(dir)`` and :meth:`finecap.models.retriever.Retriever.from_pretrained` work.

Cache: where a configuration's encoder is cached and the key naming it, with the presets the key hashes, are
:mod:`finecap.models.world_encoder_cache` (no torch: read by commands that only check a run); a finished folder
holds ``encoder.json``, written last (the folder is built in a temporary directory and renamed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm
from transformers import (
    CLIPTextConfig,
    ConvNextConfig,
    VisionTextDualEncoderConfig,
    VisionTextDualEncoderModel,
)

from finecap.data.formats.world import read_world
from finecap.data.images import load_image
from finecap.models.processors import CLIPImageProcessor
from finecap.models.world_encoder_cache import Preset, preset_of
from finecap.utils.reading import read_json
from finecap.utils.system import progress_enabled
from finecap.world.make import load_scenes
from finecap.world.scene import COLORS, PATTERNS, SHAPES, SIZES, scene_labels

MAIN_LABELS = ("shape", "color", "size", "position", "background", "count")
"""Main-object and scene labels of :func:`finecap.world.scene.scene_labels` used by the auxiliary loss."""
CELL_ATTRS = ("shape", "color", "size", "pattern")
"""Per-grid-cell attributes of the auxiliary loss (class 0 = empty cell / no pattern)."""


# --------------------------------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------------------------------


def build_world_model(
    tokenizer: Any, image_size: int, preset: str | Preset = "world-tiny"
) -> VisionTextDualEncoderModel:
    """A randomly initialised world dual encoder for ``image_size`` px images and ``tokenizer``'s vocabulary."""
    p = preset_of(preset) if isinstance(preset, str) else preset
    down = 2 ** (len(p.vision_widths) - 1)  # the stages after the stem halve the map each
    if image_size % down:
        raise ValueError(
            f"world.image_size={image_size}: the world encoder needs a multiple of {down} "
            f"(stem patch = image_size / {down}, so the last stage map is 1x1)"
        )
    vision = ConvNextConfig(
        num_channels=3,
        patch_size=image_size // down,
        num_stages=len(p.vision_widths),
        hidden_sizes=list(p.vision_widths),
        depths=list(p.vision_depths),
        image_size=image_size,
        initializer_range=p.initializer_range,
        layer_scale_init_value=p.layer_scale,
    )
    vision.hidden_size = p.vision_widths[-1]  # VisionTextDualEncoderModel sizes the projection from hidden_size
    text = CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=p.text_width,
        intermediate_size=4 * p.text_width,
        num_hidden_layers=p.text_layers,
        num_attention_heads=p.text_heads,
        max_position_embeddings=int(tokenizer.model_max_length),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        initializer_range=p.initializer_range,
    )
    if text.eos_token_id == 2:
        raise ValueError("world tokenizer EOS id must not be 2 (CLIP's text tower would use legacy argmax pooling)")
    config = VisionTextDualEncoderConfig.from_vision_text_configs(vision, text, projection_dim=p.projection_dim)
    return VisionTextDualEncoderModel(config)


def world_image_processor(image_size: int, mean: Sequence[float], std: Sequence[float]) -> CLIPImageProcessor:
    """Resize (shortest edge) + centre crop to ``image_size``, scale to [0, 1], normalise with ``mean``/``std``.

    World images already have the right size, so resizing is the identity for them (checked in the tests).
    """
    return CLIPImageProcessor(
        size={"shortest_edge": image_size},
        crop_size={"height": image_size, "width": image_size},
        image_mean=[float(m) for m in mean],
        image_std=[float(s) for s in std],
    )


class AuxHeads(nn.Module):
    """Linear heads on the image embedding predicting :data:`MAIN_LABELS` and, per grid cell, :data:`CELL_ATTRS`."""

    def __init__(self, dim: int, main_sizes: Sequence[int], cell_sizes: Sequence[int], cells: int) -> None:
        super().__init__()
        self.main_sizes, self.cell_sizes, self.cells = list(main_sizes), list(cell_sizes), cells
        self.main = nn.Linear(dim, sum(self.main_sizes))
        self.cell = nn.Linear(dim, cells * sum(self.cell_sizes))

    def forward(self, emb: torch.Tensor, main: torch.Tensor, cell: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over the main labels ``(B, M)`` and the cell attributes ``(B, cells, A)``."""
        losses = []
        logits = self.main(emb)  # (B, sum main classes)
        for j, part in enumerate(logits.split(self.main_sizes, dim=-1)):
            losses.append(F.cross_entropy(part, main[:, j]))
        logits = self.cell(emb).view(len(emb), self.cells, -1)  # (B, cells, sum cell classes)
        for j, part in enumerate(logits.split(self.cell_sizes, dim=-1)):
            losses.append(F.cross_entropy(part.reshape(-1, part.shape[-1]), cell[:, :, j].reshape(-1)))
        return torch.stack(losses).mean()


def contrastive_loss(
    text: torch.Tensor, image: torch.Tensor, targets: torch.Tensor, scale: torch.Tensor
) -> torch.Tensor:
    """Symmetric InfoNCE of unit-norm ``text (T, D)`` against ``image (B, D)``; text ``t`` belongs to image
    ``targets[t]`` (distinct targets). Text->image uses all B images, image->text the T targeted images."""
    logits = scale * text @ image.T  # (T, B)
    t2i = F.cross_entropy(logits, targets)
    i2t = F.cross_entropy(logits[:, targets].T, torch.arange(len(targets), device=text.device))  # (T, T)
    return (t2i + i2t) / 2


# --------------------------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class WorldData:
    """Images (uint8 ``(N, 3, H, W)``), captions and labels of one split of the world."""

    ids: list[int]
    images: torch.Tensor
    refs: list[list[str]]
    dense: list[str]
    main: torch.Tensor  # (N, len(MAIN_LABELS))
    cell: torch.Tensor  # (N, 9, len(CELL_ATTRS))


def load_split(world: Path, split: str, records: list[Any] | None = None, progress: bool = True) -> WorldData:
    """Read one split of the world folder ``world`` (images, reference/dense captions, scene labels)."""
    records = records if records is not None else [r for r in read_world(world) if r.split == split]
    scenes = load_scenes(world)
    dense = read_json(Path(world) / "dense.json")
    images, main, cell = [], [], torch.zeros(len(records), 9, len(CELL_ATTRS), dtype=torch.long)
    for i, r in enumerate(tqdm(records, desc=f"load {split}", disable=not progress_enabled(progress), leave=False)):
        images.append(torch.from_numpy(np.array(load_image(r.path))).permute(2, 0, 1))  # (3, H, W)
        scene = scenes[int(r.image_id)]
        labels = scene_labels(scene)
        main.append([labels[k] for k in MAIN_LABELS])
        for o in scene.objects:
            pattern = 0 if o.pattern is None else 1 + PATTERNS.index(o.pattern)
            cell[i, o.cell] = torch.tensor([1 + SHAPES.index(o.shape), 1 + COLORS.index(o.color),
                                            1 + SIZES.index(o.size), pattern])  # fmt: skip
    sizes = {tuple(im.shape) for im in images}
    if len(sizes) > 1:
        raise ValueError(f"{world}: {split} images differ in size {sorted(sizes)[:3]}")
    return WorldData(
        ids=[int(r.image_id) for r in records],
        images=torch.stack(images) if images else torch.zeros(0, 3, 1, 1, dtype=torch.uint8),
        refs=[list(r.captions) for r in records],
        dense=[dense[str(r.image_id)] for r in records],
        main=torch.tensor(main, dtype=torch.long).view(-1, len(MAIN_LABELS)),
        cell=cell,
    )
