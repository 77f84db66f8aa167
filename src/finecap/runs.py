"""The run-directory layout: the names of what a run writes and the folders a checkpoint is loaded from.

Layout of a run directory::

    <run_dir>/
      config.yaml                 the resolved configuration of the run (paths absolute: Config.save)
      fingerprints.json           the fingerprints of its data and encoders (finecap.train.fingerprint)
      metrics.jsonl               one JSON per log / evaluation event
      trackers/                   the other trackers' logs (train.log_with)
      checkpoints/
        last/                     resumable: every train.save_every steps (or at each evaluation) and at the end
          model/                  the captioner (its save: captioner.json, weights, tokenizer, model config) and
                                  generation_config.json: the run's decode.* as transformers' GenerationConfig
          config.yaml             the resolved configuration
          fingerprints.json       a copy of the run's
          state/                  optimizer, scheduler, the loop's counters, every process's RNG, objective and
                                  pending-log state: JSON + safetensors, never pickle (finecap.train.state)
          trainer_state.json      step/epoch/position/best, human-readable; written last (marks it complete)
        best/                     the best evaluation so far on train.best_metric (no optimizer state)
          model/  config.yaml  fingerprints.json  trainer_state.json

Why a module of its own, on the bottom floor next to :mod:`finecap.home`: every layer reads runs (a captioner finds
the checkpoint it loads, fingerprints find the run they pin, ``finecap caption`` and the report find a run's config)
while only training writes them (:mod:`finecap.train.checkpoint`, :mod:`finecap.train.state`). With the names here,
none of the readers imports the training package. Nothing here imports finecap, writes a file or creates a folder
(:func:`swap_guard` locks the ``checkpoints/`` folder itself).

:func:`model_dir` accepts either a checkpoint folder or a bare model folder, so both ``--checkpoint
runs/x/checkpoints/best`` and ``train.init_from=runs/x/checkpoints/best`` work; :func:`find_checkpoint` also takes a
run directory (its best checkpoint, else its last) and a checkpoint's ``model/`` folder (its checkpoint, so that the
configuration stored beside it is found: :func:`stored_config`), and names the folder to pass when given another one
(:func:`not_a_checkpoint`).

Example::

    >>> checkpoint_dir("runs/x", BEST).as_posix()
    'runs/x/checkpoints/best'
    >>> run_dir_of(checkpoint_dir("runs/x", LAST)).as_posix()
    'runs/x'
    >>> temporary_dir("runs/x/checkpoints/last").as_posix()
    'runs/x/checkpoints/.last.tmp'
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # Windows: checkpoint swaps unguarded (swap_guard)
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

LAST, BEST = "last", "best"
"""The two checkpoints of a run: the resumable last one and the best evaluation so far."""
CHECKPOINTS_DIR = "checkpoints"
MODEL_SUBDIR = "model"
INFO_FILE = "trainer_state.json"
CONFIG_FILE = "config.yaml"
FINGERPRINTS_FILE = "fingerprints.json"
METRICS_FILE = "metrics.jsonl"
TRACKERS_DIR = "trackers"
NONFINITE = "nonfinite"
"""The key of a ``metrics.jsonl`` event (and of a ``trainer_state.json``) naming its values that are no finite
number (:func:`encode_event`)."""
STATE_DIR = "state"
"""Inside ``checkpoints/last``: the optimizer and loop state (:mod:`finecap.train.state`)."""
CAPTIONER_FILE = "captioner.json"
GENERATION_CONFIG = "generation_config.json"
"""A model folder's decoding settings as transformers' ``GenerationConfig`` (ClipCap's ``lm/`` holds one too)."""
"""The file naming a captioner's model folder: its backbone (``"kind"``) and what the backbone records
(:mod:`finecap.models.base`)."""


_NONFINITE_WORDS = {0: "NaN", 1: "Infinity", -1: "-Infinity"}


def encode_event(event: dict[str, Any]) -> dict[str, Any]:
    """A ``metrics.jsonl`` event (``{"step", "epoch", "split", "values", "text"?}``), or a best checkpoint's
    ``trainer_state.json`` (its validation ``values``), as strict JSON takes it: a value that is no finite number is
    ``null`` in ``values`` and named in ``"nonfinite"`` (``{key: "NaN" | "Infinity" | "-Infinity"}``), so ``jq``,
    JavaScript and strict parsers read the file (Python's ``NaN`` / ``Infinity`` tokens are not JSON) and a reader
    still tells a diverged ``Infinity`` from a ``NaN`` nothing defined (docs/training.md#what-a-run-logs).
    :func:`decode_event` gives the values back.

    Example::

        >>> encode_event({"step": 3, "split": "train", "values": {"loss": float("inf"), "lr": 0.1}})
        {'step': 3, 'split': 'train', 'values': {'loss': None, 'lr': 0.1}, 'nonfinite': {'loss': 'Infinity'}}
    """
    values = event.get("values") or {}
    words = {k: _NONFINITE_WORDS[math.copysign(1, v) if math.isinf(v) else 0]
             for k, v in values.items() if isinstance(v, float) and not math.isfinite(v)}  # fmt: skip
    if not words:
        return event
    return {**event, "values": {k: None if k in words else v for k, v in values.items()}, NONFINITE: words}


def decode_event(event: Any) -> Any:
    """A ``metrics.jsonl`` event (or a ``trainer_state.json``) as read (``json.loads`` of its line or file) with its
    values as logged: those :func:`encode_event` wrote as ``null`` and named in ``"nonfinite"`` are the floats again,
    and the key is gone. One written before the encoding (Python's ``NaN`` / ``Infinity`` tokens, which
    ``json.loads`` reads) is the same already and comes back as it is, as does anything that is no such event.

    Example::

        >>> decode_event({"step": 3, "values": {"loss": None, "lr": 0.1}, "nonfinite": {"loss": "Infinity"}})
        {'step': 3, 'values': {'loss': inf, 'lr': 0.1}}
    """
    words = event.get(NONFINITE) if isinstance(event, dict) else None
    values = event.get("values") if isinstance(event, dict) else None
    if not isinstance(words, dict) or not isinstance(values, dict):
        return event
    back = {k: float(words[k]) if v is None and words.get(k) in _NONFINITE_WORDS.values() else v
            for k, v in values.items()}  # fmt: skip
    return {k: back if k == "values" else v for k, v in event.items() if k != NONFINITE}


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete or corrupt, or its weights are not what its files claim; the message names
    the file and how to recover. Here, beside the layout, because the models (strict loading:
    :mod:`finecap.models.strict`) and training (:mod:`finecap.train.state`) both raise it."""


def checkpoint_dir(run_dir: str | Path, which: str) -> Path:
    """``<run_dir>/checkpoints/<which>`` (``which`` is ``"last"`` or ``"best"``)."""
    return Path(run_dir) / CHECKPOINTS_DIR / which


def temporary_dir(path: str | Path) -> Path:
    """Where the checkpoint ``path`` is written before it is swapped in (``<parent>/.<name>.tmp``)."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp")


def run_dir_of(checkpoint: str | Path) -> Path | None:
    """The run directory of a checkpoint folder ``<run_dir>/checkpoints/<name>``, else None."""
    checkpoint = Path(checkpoint)
    return checkpoint.parent.parent if checkpoint.parent.name == CHECKPOINTS_DIR else None


def model_dir(path: str | Path) -> Path:
    """The model folder of a checkpoint (``<path>/model``), or ``path`` itself when it is a bare model folder."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: checkpoint not found")
    return path / MODEL_SUBDIR if (path / MODEL_SUBDIR).is_dir() else path


def checkpoints_folder_of(path: str | Path) -> Path | None:
    """The run's ``checkpoints/`` folder that ``path`` (a checkpoint folder, or its ``model/``) lies in, else None."""
    path = Path(path)
    for folder in (path, path.parent):
        if folder.parent.name == CHECKPOINTS_DIR:
            return folder.parent
    return None


@contextlib.contextmanager
def swap_guard(path: str | Path, *, exclusive: bool = False, log_wait: str = "") -> Iterator[None]:
    """Hold the run's ``checkpoints/`` folder (``flock`` on the folder itself: no file is made, and the kernel drops
    it when its holder dies) for the block when ``path`` lies in one (:func:`checkpoints_folder_of`); else nothing.

    A reader holds it shared while it reads a checkpoint's files (:func:`reading_checkpoint`, the one hold over
    everything a reader takes of a checkpoint; :func:`finecap.models.backbones.load_captioner` for its weights alone),
    a training run exclusively while it swaps a new ``best`` or ``last`` in (:func:`finecap.train.state.
    replace_checkpoint`): a load never reads some files of one checkpoint and the rest of the next (a ClipCap's
    LM of one save and its mapper of another). The swap waits for loads under way (logging ``log_wait`` first), a
    load for the swap. A file system that refuses ``flock`` on a folder (some network file systems) leaves the block
    unguarded, as before."""
    folder = checkpoints_folder_of(path)
    fd = None
    if folder is not None and fcntl is not None:
        with contextlib.suppress(OSError):  # gone (a run removed) or not readable: nothing to guard
            fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        if fd is not None:
            mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
            try:
                try:
                    fcntl.flock(fd, mode | fcntl.LOCK_NB)
                except BlockingIOError:
                    if log_wait:
                        log.info(log_wait)
                    fcntl.flock(fd, mode)
            except OSError as e:  # no flock on this file system (EBADF, ENOLCK, EOPNOTSUPP): unguarded
                log.debug("%s: cannot lock the folder (%s): checkpoint swaps unguarded", folder, e)
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


@contextlib.contextmanager
def reading_checkpoint(path: str | Path) -> Iterator[Path]:
    """The checkpoint ``path`` means (:func:`find_checkpoint`: a run directory's best, else its last; a checkpoint
    folder; a model folder's checkpoint), found and read under one hold of its run's :func:`swap_guard`: whatever a
    reader takes of it inside the block (its ``config.yaml``, ``fingerprints.json`` and ``trainer_state.json``, its
    ``model/`` folder's weights, tokenizer and ``generation_config.json``) is one save's, as a training run swaps its
    next ``best`` or ``last`` in only once the block ends (docs/runs-and-home.md). A reader that took the
    configuration before this hold and the weights inside another one could pair a save's ``config.yaml`` (its
    decoding, its load options) with the next save's weights. The one way finecap's readers of a checkpoint read it
    (``finecap caption``, ``finecap export``, :meth:`finecap.api.Captioner.from_pretrained`, boost's world visual
    expert); the block holds the run's next save off, so it spans the reads, not the work done with them (the
    captioning). A folder in no run's ``checkpoints/`` (an export, a bare model folder) is found and read unguarded:
    nothing swaps it."""
    path = Path(path)
    # a run directory: its checkpoints/ folder is held before best or last is chosen (no swap is under way then)
    with swap_guard(checkpoint_dir(path, BEST) if (path / CHECKPOINTS_DIR).is_dir() else path):
        yield find_checkpoint(path)


SWAP_WAIT = 5.0
"""Seconds :func:`find_checkpoint` waits for a checkpoint being swapped into place by a training run."""


def _swapped(checkpoint: Path) -> Path:
    """``checkpoint`` (``best`` or ``last``), or its ``<name>.old`` when a swap left only that: between the two renames
    of :func:`finecap.utils.folders.atomic_replace_dir` only ``<name>.old`` stands, and a reader would take another
    checkpoint (``last`` for ``best``) without a word. A swap under way (``<name>.old`` renamed within
    :data:`SWAP_WAIT` seconds) is waited for; one a killed run left is read as it stands, said in a warning."""
    from finecap.utils.folders import previous_dir

    old = previous_dir(checkpoint)
    if checkpoint.exists() or not (old / MODEL_SUBDIR).is_dir():
        return checkpoint
    with contextlib.suppress(OSError):  # a rename sets the folder's change time: a fresh one is a swap under way
        deadline = old.stat().st_ctime + SWAP_WAIT
        while not checkpoint.exists() and old.exists() and time.time() < deadline:
            time.sleep(0.01)
    if checkpoint.exists() or not (old / MODEL_SUBDIR).is_dir():
        return checkpoint
    log.warning("%s is missing and %s stands in its place (a run killed while saving it): reading %s", checkpoint,
                old.name, old)  # fmt: skip
    return old


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint meant by ``path``: a run directory gives its best checkpoint, else its last; a checkpoint's
    ``model/`` folder gives that checkpoint (``RUN/checkpoints/best/model`` -> ``RUN/checkpoints/best``); a checkpoint
    folder (holding ``model/``, or ``config.yaml``) or a bare model folder (holding ``captioner.json``) is
    returned as it is. Any other folder is a ``FileNotFoundError`` naming the folder to pass
    (:func:`not_a_checkpoint`)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: checkpoint or run directory not found")
    if (path / CHECKPOINTS_DIR).is_dir():
        for which in (BEST, LAST):
            found = _swapped(checkpoint_dir(path, which))
            if (found / MODEL_SUBDIR).is_dir():
                return found
        raise FileNotFoundError(f"{path}: a run directory without a saved checkpoint (no checkpoints/best or /last)")
    if _is_checkpoint(path):
        return path
    if (path / CONFIG_FILE).is_file():  # a damaged checkpoint (its config.yaml is read first), or a demo's folder
        below = _loadable_below(path, depth=2)
        if below:  # a demo's or a grid's folder holds a config.yaml beside its stage runs: name them
            raise FileNotFoundError(not_a_checkpoint(path))
        return path
    if _is_model(path):
        return path.parent if path.name == MODEL_SUBDIR and _is_checkpoint(path.parent) else path
    raise FileNotFoundError(not_a_checkpoint(path))


def training_folder_of(path: str | Path) -> Path | None:
    """The checkpoint folder or run ``checkpoints/`` folder that ``path`` is or lies in (real paths: links and ``..``
    followed; ``path`` need not exist), else ``None``: where only training writes, so that no other command
    (``finecap export --force``) replaces a resumable checkpoint. A checkpoint folder holds ``model/captioner.json``
    or ``trainer_state.json``; a ``checkpoints/`` folder is a run's when its parent holds the run's ``config.yaml``
    or ``metrics.jsonl``, or it holds ``last`` or ``best`` (or their unfinished ``.<name>.tmp``).

    Example::

        >>> import tempfile
        >>> run = Path(tempfile.mkdtemp())
        >>> (run / "checkpoints" / "last").mkdir(parents=True)
        >>> _ = (run / "metrics.jsonl").write_text("")
        >>> training_folder_of(run / "checkpoints" / "last" / "model") == run / "checkpoints"
        True
        >>> training_folder_of(run / "exported") is None
        True
    """
    real = Path(os.path.realpath(path))
    for folder in (real, *real.parents):
        if _is_checkpoint(folder) or (folder / INFO_FILE).is_file():
            return folder
        if folder.name == CHECKPOINTS_DIR and folder.is_dir():
            held = (folder / name for base in (LAST, BEST) for name in (base, temporary_dir(base).name))
            if any((folder.parent / name).is_file() for name in (CONFIG_FILE, METRICS_FILE)) or any(
                p.is_dir() for p in held
            ):
                return folder
    return None


def stored_config(checkpoint: str | Path) -> Path | None:
    """The ``config.yaml`` stored with the checkpoint :func:`find_checkpoint` gives (its own, else its run's), or
    ``None`` (a bare model folder: no configuration)."""
    checkpoint = Path(checkpoint)
    for folder in (checkpoint, run_dir_of(checkpoint)):
        if folder is not None and (folder / CONFIG_FILE).is_file():
            return folder / CONFIG_FILE
    return None


def _is_model(path: Path) -> bool:
    return (path / CAPTIONER_FILE).is_file()


def _is_checkpoint(path: Path) -> bool:
    return _is_model(path / MODEL_SUBDIR)


def _is_run(path: Path) -> bool:
    return any(_is_checkpoint(checkpoint_dir(path, which)) for which in (BEST, LAST))


def not_a_checkpoint(path: str | Path) -> str:
    """Why ``path`` (an existing file or folder) is none of the folders a checkpoint is loaded from, and which folder
    to pass instead: the run, checkpoint or model folder that holds it (a file of a model folder, ClipCap's ``lm/``, a
    run's ``checkpoints/``), else those below it (a folder of runs), else what each kind of folder holds."""
    path = Path(path)
    kinds = ("a run directory (holding checkpoints/best), a checkpoint folder (holding model/ and config.yaml) or "
             "a model folder (holding captioner.json)")  # fmt: skip
    held = [c for c in (BEST, LAST) if _is_checkpoint(path / c)]
    if held:  # a run's checkpoints/ folder
        return (f"{path}: a run's checkpoints folder; pass the run directory {path.parent} or one checkpoint, "
                f"{path / held[0]}")  # fmt: skip
    for up in list(path.parents)[:3]:  # the run, checkpoint or model folder holding it
        if _is_run(up) or _is_checkpoint(up) or _is_model(up):
            return f"{path}: not a checkpoint folder; pass {_loadable_name(up)}, which holds it"
    below = _loadable_below(path) if path.is_dir() else []
    if below:
        shown = ", ".join(map(str, below[:5])) + (", ..." if len(below) > 5 else "")
        return f"{path}: not a checkpoint folder, but it holds {len(below)}: pass one of {shown}"
    return f"{path}: not a checkpoint folder; pass {kinds}"


def _loadable_name(path: Path) -> str:
    """``path`` described as what it is (a run directory, a checkpoint folder, a model folder)."""
    if _is_run(path):
        return f"the run directory {path}"
    if _is_checkpoint(path):
        return f"the checkpoint folder {path}"
    return f"the model folder {path}"


def _loadable_below(path: Path, depth: int = 3, visits: int = 1000) -> list[Path]:
    """Run, checkpoint and model folders under ``path`` (the outermost of each), at most ``depth`` levels down and
    ``visits`` folders listed per level (a home folder named by mistake is not walked whole), sorted; hidden folders
    (``.last.tmp``) skipped."""
    found: list[Path] = []
    level = [path]
    for _ in range(depth):
        below = []
        for folder in level[:visits]:
            try:
                children = sorted(c for c in folder.iterdir() if c.is_dir() and not c.name.startswith("."))
            except OSError:
                continue
            for child in children:
                if _is_run(child) or _is_checkpoint(child) or _is_model(child):
                    found.append(child)
                else:
                    below.append(child)
        level = below
    return sorted(found)
