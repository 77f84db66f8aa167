"""Checkpoints of a training run, written atomically (temporary folder, then rename).

Layout of a run directory::

    <run_dir>/
      config.yaml                 the resolved configuration of the run
      metrics.jsonl               one JSON per log / evaluation event
      checkpoints/
        last/                     resumable: every train.save_every steps (or at each evaluation) and at the end
          model/                  the captioner (ClipCap.save: safetensors weights, tokenizer, model config)
          config.yaml             the resolved configuration
          accelerate/             accelerator.save_state: optimizer, scheduler, per-process RNG states, and the loop's
                                  counters with every process's objective and logger state (custom_checkpoint_0.pkl)
          trainer_state.json      step/epoch/position/best, human-readable
        best/                     the best evaluation so far on train.best_metric (no optimizer state)
          model/  config.yaml  trainer_state.json

A folder is first written as ``checkpoints/.<name>.tmp`` and then swapped in by
:func:`finecap.utils.atomic_replace_dir`, so a run killed while saving keeps its previous checkpoint.
:func:`model_dir` accepts either a checkpoint folder or a bare model folder, so both
``--checkpoint runs/x/checkpoints/best`` and ``train.init_from=runs/x/checkpoints/best`` work.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers.utils import logging as hf_logging

from finecap.utils import atomic_replace_dir, read_json, write_json

if TYPE_CHECKING:
    from finecap.config import Config

LAST, BEST = "last", "best"
MODEL_SUBDIR = "model"
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
    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def temporary_dir(path: str | Path) -> Path:
    """Where the checkpoint ``path`` is written before it is swapped in (``<parent>/.<name>.tmp``)."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp")


def save_checkpoint(
    path: str | Path,
    *,
    model: Any,
    cfg: Config,
    info: dict[str, Any],
    state_dict: dict[str, Any] | None = None,
    keep_tmp_contents: bool = False,
) -> Path:
    """Write ``model`` (via ``model.save``; with ``state_dict``, those weights, e.g. gathered from a sharded model),
    ``cfg`` and ``info`` (JSON) to ``path``, atomically: the folder replaces the previous one only once complete.
    ``keep_tmp_contents``: files already written into :func:`temporary_dir` (e.g. ``accelerate/``) are kept."""
    path = Path(path)
    tmp = temporary_dir(path)
    if tmp.exists() and not keep_tmp_contents:
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        with _quiet_transformers():
            model.save(tmp / MODEL_SUBDIR, state_dict=state_dict)
        cfg.save(tmp / "config.yaml")
        write_json(tmp / INFO_FILE, info)
        atomic_replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def load_info(path: str | Path) -> dict[str, Any]:
    return read_json(Path(path) / INFO_FILE)
