"""Where the world encoder of a configuration is cached, and the key that names it: what a reader of a run (its
fingerprint, ``finecap report``, ``finecap eval`` choosing a retriever) asks without building or loading one.

The key (:func:`encoder_key`) is a hash of the world's content key (:func:`finecap.world.key.world_key`), every
``retriever.*`` field that changes training, ``run.seed``, the architecture of the preset (:data:`PRESETS`) and
:data:`ENCODER_VERSION`; the folder (:func:`encoder_dir`) is ``<cache>/world_encoder/<key>``, finished once it holds
``encoder.json`` (written last). The encoder itself (its model, data and loss) is :mod:`finecap.models.world_encoder`.

**Why apart from it**: that module imports torch and ``transformers``' models (seconds), which a command that only
compares a run's recorded key with its configuration's, or looks whether the encoder is trained, never needs; this
one imports neither.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from finecap.home import cache_dir
from finecap.world.key import world_key

if TYPE_CHECKING:
    from finecap.config import Config

ENCODER_VERSION = 3
"""Bump when the architecture or training changes, so cached encoders are retrained (2: trained through the library
engine, :mod:`finecap.train.world_encoder`; 3: the smaller preset and 10 epochs of 64, module docstring of
:mod:`finecap.models.world_encoder`)."""
CACHE_SUBDIR = "world_encoder"


@dataclass(frozen=True)
class Preset:
    """Sizes of the world dual encoder (see the module docstring of :mod:`finecap.models.world_encoder`)."""

    vision_widths: tuple[int, ...] = (64, 128, 256, 256)
    vision_depths: tuple[int, ...] = (1, 1, 1, 0)
    text_width: int = 128
    text_layers: int = 2
    text_heads: int = 4
    projection_dim: int = 256
    initializer_range: float = 0.1
    layer_scale: float = 1.0


PRESETS: dict[str, Preset] = {"world-tiny": Preset()}


def preset_of(name: str) -> Preset:
    """The preset called ``name`` (``retriever.preset``); an unknown name is an error listing the known ones."""
    if name not in PRESETS:
        raise ValueError(f"retriever.preset={name!r}: unknown world encoder preset; known: {', '.join(PRESETS)}")
    return PRESETS[name]


def encoder_key(cfg: Config) -> str:
    """Cache key of the world encoder: world content, training settings, seed, code version."""
    r = dataclasses.asdict(cfg.retriever)
    for k in ("checkpoint", "batch_size_eval", "long_text"):  # do not change the trained weights
        r.pop(k, None)
    content = {"version": ENCODER_VERSION, "world": world_key(cfg.world), "retriever": r, "seed": cfg.run.seed,
               "architecture": dataclasses.asdict(preset_of(cfg.retriever.preset))}  # fmt: skip
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


def encoder_dir(cfg: Config) -> Path:
    """Where the world encoder of ``cfg`` is (or will be) cached: ``<cache>/world_encoder/<key>``, the cache being
    ``run.cache_dir`` or ``<finecap home>/cache`` (:func:`finecap.home.cache_dir`)."""
    return cache_dir(cfg.run) / CACHE_SUBDIR / encoder_key(cfg)


def world_encoder_path(cfg: Config) -> Path:
    """The folder of the trained world encoder of ``cfg`` (:func:`encoder_dir`).

    Only looks it up: a missing encoder raises ``FileNotFoundError`` naming the command that trains it (the
    application layer trains, :func:`finecap.train.world_encoder.ensure_world_encoder`; model builders only load).
    """
    out = encoder_dir(cfg)
    if not (out / "encoder.json").exists():
        raise FileNotFoundError(
            f"{out}: no trained world encoder for this configuration (world.*, retriever.*, run.seed, "
            "run.cache_dir); train it with `finecap retriever train` and the same overrides, or set "
            "retriever.checkpoint / model.encoder to a CLIP checkpoint"
        )
    return out
