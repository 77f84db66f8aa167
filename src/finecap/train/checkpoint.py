"""Checkpoints of a training run, written atomically (temporary folder, then rename).

Layout of a run directory::

    <run_dir>/
      config.yaml                 the resolved configuration of the run
      metrics.jsonl               one JSON per log / evaluation event
      checkpoints/
        last/                     resumable: every train.save_every steps (or at each evaluation) and at the end
          model/                  the captioner (ClipCap.save: safetensors weights, tokenizer, model config)
          config.yaml             the resolved configuration
          trainer_state.pt        optimizer, scheduler, per-process RNG and objective states, step/epoch/position, best
          trainer_state.json      the same counters, human-readable
        best/                     the best evaluation so far on train.best_metric (no optimizer state)
          model/  config.yaml  trainer_state.json

A folder is first written as ``checkpoints/.<name>.tmp`` and then swapped in by
:func:`finecap.utils.atomic_replace_dir`, so a run killed while saving keeps its previous checkpoint.
:func:`model_dir` accepts either a checkpoint folder or a bare model folder, so both
``--checkpoint runs/x/checkpoints/best`` and ``train.init_from=runs/x/checkpoints/best`` work.
"""

from __future__ import annotations

import contextlib
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from finecap.utils import atomic_replace_dir, read_json, write_json

if TYPE_CHECKING:
    from finecap.config import Config

LAST, BEST = "last", "best"
MODEL_SUBDIR = "model"
STATE_FILE = "trainer_state.pt"
INFO_FILE = "trainer_state.json"


def checkpoint_dir(run_dir: str | Path, which: str) -> Path:
    """``<run_dir>/checkpoints/<which>`` (``which`` is ``"last"`` or ``"best"``)."""
    return Path(run_dir) / "checkpoints" / which


def model_dir(path: str | Path) -> Path:
    """The model folder of a checkpoint (``<path>/model``), or ``path`` itself when it is a bare model folder."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: checkpoint not found")
    return path / MODEL_SUBDIR if (path / MODEL_SUBDIR).is_dir() else path


@contextlib.contextmanager
def _quiet_transformers():
    """Silence transformers' per-save "Writing model shards" progress bar (restored afterwards)."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def save_checkpoint(
    path: str | Path,
    *,
    model: Any,
    cfg: Config,
    info: dict[str, Any],
    trainer_state: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` (via ``model.save``), ``cfg``, ``info`` (JSON) and ``trainer_state`` (torch) to ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        with _quiet_transformers():
            model.save(tmp / MODEL_SUBDIR)
        cfg.save(tmp / "config.yaml")
        if trainer_state is not None:
            torch.save(trainer_state, tmp / STATE_FILE)
        write_json(tmp / INFO_FILE, info)
        atomic_replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def load_trainer_state(path: str | Path) -> dict[str, Any]:
    """The ``trainer_state.pt`` of a resumable checkpoint (our own file, so unpickling is allowed)."""
    file = Path(path) / STATE_FILE
    if not file.exists():
        raise FileNotFoundError(f"{file}: no trainer state (is {path} a 'last' checkpoint?)")
    return torch.load(file, map_location="cpu", weights_only=False)


def load_info(path: str | Path) -> dict[str, Any]:
    return read_json(Path(path) / INFO_FILE)


def rng_state() -> dict[str, Any]:
    """RNG states of python, numpy and torch (CPU, and CUDA when available) of this process."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the states captured by :func:`rng_state`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
