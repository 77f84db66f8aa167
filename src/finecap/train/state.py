"""Run state: the loop's counters, resumable checkpoints without pickle, and recovery after a kill.

Layout of a run directory (its names, and the model folders: :mod:`finecap.runs`)::

    <run_dir>/
      config.yaml                the resolved configuration (secrets masked)
      metrics.jsonl              one JSON per log / evaluation event
      checkpoints/
        last/                    resumable: every train.save_every steps (or at each evaluation) and at the end
          model/  config.yaml    the captioner in its own format and the configuration
          state/                 optimizer, scheduler, grad scaler and the loop's own state (main process), every
                                 process's RNG, objective and pending-log state: JSON + safetensors, never pickle
          trainer_state.json     step/epoch/position/best: written last, so its presence marks a complete checkpoint
        best/                    the best evaluation so far on train.best_metric (no optimizer state)

**No code from a run folder.** Everything resumable is stored as JSON (structure, numbers, strings) plus one
safetensors file of tensors per state (:func:`save_tree` / :func:`load_tree`): a run folder downloaded from elsewhere
can be resumed or inspected without unpickling anything. This is why the loop does not use ``accelerator.save_state``
(its custom-state hook unpickles ``custom_checkpoint_*.pkl`` with ``weights_only=False``). The optimizer is saved
from the main process: under DDP every process holds the same optimizer state; under ``train.strategy=fsdp`` (FSDP2)
every process takes part in gathering the full state, keyed by parameter names
(:func:`finecap.models.sharding.optimizer_state`), so a sharded run resumes sharded or in one process.

**Recovery, never deletion.** A checkpoint is written as ``checkpoints/.last.tmp`` and swapped in by two renames
(``last`` -> ``last.old``, ``.last.tmp`` -> ``last``), so a kill can leave any of ``last``, ``last.old`` and a finished
or unfinished ``.last.tmp``. :func:`find_resumable` picks the newest *complete* one (``trainer_state.json`` present);
:func:`prepare_run_dir` never removes anything on ``--resume``: with nothing resumable in a folder that holds a run,
it stops with an error listing what it found. ``best`` is touched by resume only to finish its own swap (a kill
between its renames left ``best.old`` alone: renamed back, :func:`finecap.utils.folders.finish_swap`). Every rename is
durable (:func:`finecap.utils.files.replace_durably`: the data on disk before it, the folder after).

**best and last.** At a validation that improves, ``best`` is saved before ``last``; a kill between them (or before
the next ``last`` under ``train.save_every``) leaves a ``best`` newer than the checkpoint a resume continues from.
The resumed run redoes those steps and forgets the restored best value
(:meth:`finecap.train.engine.Engine.restore`): its next validation saves ``best`` anew, so ``best``, the run's best
value and step, and ``metrics.jsonl`` agree (a bit-exact redo saves the same ``best`` again).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import yaml
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from finecap.config import flat_options, migrate_moved_keys, with_added_keys
from finecap.outputs import check_output_file, check_replaceable
from finecap.runs import (
    BEST,
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    FINGERPRINTS_FILE,
    INFO_FILE,
    LAST,
    METRICS_FILE,
    MODEL_SUBDIR,
    STATE_DIR,
    TRACKERS_DIR,
    CheckpointError,
    checkpoint_dir,
    decode_event,
    encode_event,
    swap_guard,
    temporary_dir,
)
from finecap.train.fingerprint import is_fingerprints_file
from finecap.utils.files import (
    TEMPORARY_SUFFIX,
    atomic_write_text,
    is_temporary_of,
    refuse_link,
    replace_durably,
    temporary_prefix,
)
from finecap.utils.folders import (
    FOLDER_MARK,
    atomic_replace_dir,
    finish_swap,
    mark_folder,
    previous_dir,
    remove_folders,
    remove_own_folder,
)
from finecap.utils.reading import (
    DATA_FILE,
    METADATA,
    FileTooLarge,
    jsonl_rows_are,
    load_yaml,
    read_bounded,
    read_json,
    read_lines,
    read_text_bounded,
    read_yaml_mapping,
)
from finecap.utils.text import short_repr

if TYPE_CHECKING:
    from finecap.config import Config

log = logging.getLogger(__name__)

INCOMPLETE = ".last.incomplete"  # an incomplete last, set aside when resuming from last.old (promote)


RECOVER = ("copy the checkpoint again if it came from elsewhere; or move this checkpoint folder aside and resume from "
           "the previous one (checkpoints/last.old), or start a new run (--out) with train.init_from=<its "
           "checkpoints/best>")  # fmt: skip


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


# ------------------------------------------------------------------------------------------------------------------
# Pickle-free state trees: JSON + safetensors
# ------------------------------------------------------------------------------------------------------------------


def _encode(obj: Any, tensors: dict[str, torch.Tensor], path: str) -> Any:
    """JSON-able form of ``obj``; tensors (and numpy arrays) go to ``tensors`` under their path in the tree."""
    if isinstance(obj, torch.Tensor | np.ndarray):
        key = path or "root"
        t = torch.as_tensor(obj).detach().cpu().contiguous()
        tensors[key] = t
        return {"__tensor__": key, "numpy": isinstance(obj, np.ndarray)}
    if isinstance(obj, bool | int | str) or obj is None:
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {"__float__": repr(obj)}
    if isinstance(obj, np.generic):
        return _encode(obj.item(), tensors, path)
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, tensors, f"{path}.{i}") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, tensors, f"{path}.{i}") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: _encode(v, tensors, f"{path}.{k}") for k, v in obj.items()}
        items = []
        for i, (k, v) in enumerate(obj.items()):
            if not isinstance(k, bool | int | str):
                raise TypeError(f"state at {path!r}: unsupported key type {type(k).__name__}")
            items.append([k, _encode(v, tensors, f"{path}.{i}")])
        return {"__items__": items}
    raise TypeError(f"state at {path!r}: cannot store a {type(obj).__name__} without pickle")


def _decode(obj: Any, tensors: dict[str, torch.Tensor], where: Path) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors, where) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        key = obj["__tensor__"]
        if key not in tensors:
            raise CheckpointError(f"{where}: tensor {key!r} is missing from its safetensors file")
        return tensors[key].numpy() if obj.get("numpy") else tensors[key]
    if "__float__" in obj:
        return float(obj["__float__"])
    if "__tuple__" in obj:
        return tuple(_decode(v, tensors, where) for v in obj["__tuple__"])
    if "__items__" in obj:
        return {k: _decode(v, tensors, where) for k, v in obj["__items__"]}
    return {k: _decode(v, tensors, where) for k, v in obj.items()}


def unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` with no two sharing memory: a tensor whose storage an earlier one holds (a reward part that is its
    total, a view of another tensor of the tree) is stored as a copy of its own, so safetensors (which refuses shared
    memory) writes every state, and each loads back as a tensor of its own with the same values.

    >>> total = torch.tensor([1.0, 2.0])
    >>> out = unshared({"total": total, "part": total, "half": total[1:]})
    >>> out["total"] is total, out["part"].data_ptr() != total.data_ptr(), out["half"].tolist()
    (True, True, [2.0])
    """
    seen: set[int] = set()
    out = {}
    for key, t in tensors.items():
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:
            t = t.clone()
        if ptr:  # 0: an empty tensor, which holds no memory
            seen.add(ptr)
        out[key] = t
    return out


def save_tree(folder: Path, name: str, tree: Any) -> None:
    """Write ``tree`` (nested dicts/lists/tuples of numbers, strings, tensors) as ``<name>.json`` +
    ``<name>.safetensors`` in ``folder``, atomically each. Tensors of the tree may share memory (:func:`unshared`)."""
    tensors: dict[str, torch.Tensor] = {}
    encoded = _encode(tree, tensors, "")
    tensors = unshared(tensors)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"{name}.safetensors"
    refuse_link(final)
    # a new file of ours beside it: no planted link
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=temporary_prefix(final.name), suffix=TEMPORARY_SUFFIX)
    os.close(fd)
    try:
        save_file(tensors, tmp)
        replace_durably(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    atomic_write_text(folder / f"{name}.json", json.dumps(encoded) + "\n")


def load_tree(folder: Path, name: str) -> Any:
    """Read what :func:`save_tree` wrote; a missing or corrupt file is a :class:`CheckpointError` naming it."""
    meta, blob = folder / f"{name}.json", folder / f"{name}.safetensors"
    for path in (meta, blob):
        if not path.is_file():
            raise CheckpointError(f"{path}: missing from the checkpoint")
    try:
        tensors = load_file(str(blob))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{blob}: corrupt or truncated state file ({e}); {RECOVER}") from None
    try:
        encoded = json.loads(read_bounded(meta, METADATA))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise CheckpointError(f"{meta}: corrupt state file ({e}); {RECOVER}") from None
    try:
        return _decode(encoded, tensors, meta)
    except RecursionError:  # read by json, but too deep to rebuild (a few hundred levels): never a state finecap wrote
        raise CheckpointError(f"{meta}: corrupt state file (nested too deeply); {RECOVER}") from None


# ------------------------------------------------------------------------------------------------------------------
# Finding what can be resumed, preparing the run directory
# ------------------------------------------------------------------------------------------------------------------


def is_complete(folder: Path) -> bool:
    """Whether a checkpoint folder was written to the end (``trainer_state.json`` is its last file, and the first one
    removed when it is deleted: :func:`remove_checkpoints`)."""
    return (folder / INFO_FILE).is_file() and (folder / STATE_DIR).is_dir()


INFO_KEYS = frozenset({"step", "epoch", "position", "best_value", "best_step", "best_metric", "best_mode",
                       "total_steps", "num_processes", "global_batch", "trained", "sharded", "device", "metric",
                       "values"})  # fmt: skip
"""The fields of ``trainer_state.json``: the :class:`TrainState` counters, the ``best_metric`` and ``best_mode``
``best_value`` was chosen by, the run's ``total_steps``, ``num_processes``, ``global_batch`` (examples a step:
``train.batch_size × processes × train.grad_accum_steps``), ``trained`` (the :func:`trained_digest` of the epoch's
global batches done), whether it was ``sharded`` (FSDP2) and the ``device`` type it ran on (``cuda``, ``cpu``: with
``train.mixed_precision=fp16`` it says whether the run autocast, :func:`finecap.caption.autocast_dtype`) when it was
saved (``best_metric``, ``best_mode``, ``global_batch``, ``trained`` and ``device`` are absent in checkpoints of
finecap before them), and (``best`` only) the ``metric`` and the validation ``values``."""
MAX_STATE_PROCESSES = 65_536
"""The most processes a checkpoint may say wrote it (its ``state/process_<i>`` files)."""


def _state_int(info: dict[str, Any], path: Path, key: str, low: int, high: int, default: int | None) -> int | None:
    """Field ``key`` of a trainer state: an integer (never a bool, float or string) in ``[low, high]``; when absent,
    ``default`` (an older file), or an error when ``default`` is ``None`` (a required field)."""
    if key not in info:
        if default is None:
            raise CheckpointError(f"{path}: field {key!r} is missing; {RECOVER}")
        return default
    value = info[key]
    if type(value) is not int:  # bool is an int to Python; 1e18 is a float to JSON
        raise CheckpointError(f"{path}: field {key!r} must be an integer, got {short_repr(value)}; {RECOVER}")
    if not low <= value <= high:
        raise CheckpointError(f"{path}: field {key!r} must be in [{low}, {high}], got {value}; {RECOVER}")
    return value


def check_info(info: Any, path: Path) -> dict[str, Any]:
    """``info`` (read from ``trainer_state.json`` at ``path``) if every field has its type and range, else a
    :class:`CheckpointError` naming the file and the field. A resumed run trusts these counters: a tampered ``step``
    would end the run at once (``1e18``) or train and count wrongly (``-3``). Checked here: only known fields
    (:data:`INFO_KEYS`); ``0 <= step <= total_steps``; ``0 <= epoch <= step`` and ``0 <= position <= step`` (every
    epoch and every batch of one takes a step); ``best_value`` a finite number and ``best_step`` in ``[0, step]``,
    both or neither; ``1 <= num_processes``. Against the resuming run (its steps, its epoch's batches):
    :func:`check_resume`."""
    if not isinstance(info, dict):
        raise CheckpointError(f"{path}: expected a JSON object (the trainer state), got {type(info).__name__}")
    unknown = sorted(str(k) for k in info if k not in INFO_KEYS)
    if unknown:
        raise CheckpointError(
            f"{path}: unknown field {short_repr(unknown[0])} (fields: {', '.join(sorted(INFO_KEYS))}); {RECOVER}"
        )
    total = _state_int(info, path, "total_steps", 0, 2**62, default=2**62)
    step = _state_int(info, path, "step", 0, total, default=None)
    _state_int(info, path, "epoch", 0, step, default=0)
    _state_int(info, path, "position", 0, step, default=0)
    _state_int(info, path, "num_processes", 1, MAX_STATE_PROCESSES, default=1)
    _state_int(info, path, "global_batch", 1, 2**62, default=1)
    if "trained" in info and not (isinstance(info["trained"], str) and len(info["trained"]) == 64):
        raise CheckpointError(f"{path}: field 'trained' must be a SHA-256 hex digest, got "
                              f"{short_repr(info['trained'])}; {RECOVER}")  # fmt: skip
    if type(info.get("sharded", False)) is not bool:
        raise CheckpointError(f"{path}: field 'sharded' must be true or false, got {short_repr(info['sharded'])}; "
                              f"{RECOVER}")  # fmt: skip
    best_value, best_step = info.get("best_value"), info.get("best_step")
    if best_value is not None and not (
        isinstance(best_value, int | float) and not isinstance(best_value, bool) and math.isfinite(best_value)
    ):
        raise CheckpointError(f"{path}: field 'best_value' must be a finite number or null, got "
                              f"{short_repr(best_value)}; {RECOVER}")  # fmt: skip
    if best_step is not None:
        _state_int(info, path, "best_step", 0, step, default=None)
    if (best_value is None) != (best_step is None):
        raise CheckpointError(f"{path}: fields 'best_value' and 'best_step' must be set together; {RECOVER}")
    for key in ("best_metric", "best_mode", "device"):
        if key in info and not isinstance(info[key], str):
            raise CheckpointError(f"{path}: field {key!r} must be a string, got {short_repr(info[key])}; {RECOVER}")
    return info


def read_info(folder: Path) -> dict[str, Any]:
    """A checkpoint's ``trainer_state.json``, checked (:func:`check_info`); unreadable or out of range: a
    :class:`CheckpointError` naming it (and the field)."""
    path = folder / INFO_FILE
    try:
        info = decode_event(read_json(path))  # a best's non-finite values as written (finecap.runs.encode_event)
    except (ValueError, OSError, RecursionError) as e:
        raise CheckpointError(f"{path}: unreadable trainer state ({e})") from None
    return check_info(info, path)


@contextlib.contextmanager
def state_errors(path: Path, what: str) -> Iterator[None]:
    """Turn the errors of loading ``what`` (a state read from ``path``: the optimizer's, the RNG's, an objective's)
    into a :class:`CheckpointError` naming the file: a tampered or mismatched state is refused, never half-used."""
    try:
        yield
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError, AttributeError) as e:
        reason = short_repr(str(e) or type(e).__name__, 200)
        raise CheckpointError(f"{path}: {what} cannot be restored ({reason}); {RECOVER}") from None


def trained_digest(batches: list[list[int]], position: int) -> str:
    """SHA-256 of the sorted dataset indices of the first ``position`` global ``batches`` of an epoch: which examples
    a run stopped inside that epoch has trained, whatever their order."""
    done = sorted(int(i) for batch in batches[:position] for i in batch)
    return hashlib.sha256(json.dumps(done).encode()).hexdigest()


def check_resume(info: dict[str, Any], folder: Path, total: int, num_batches: Callable[[int], int],
                 global_batch: int | None = None,
                 batches: Callable[[int], list[list[int]]] | None = None) -> None:  # fmt: skip
    """The checked trainer state ``info`` of checkpoint ``folder`` (:func:`read_info`) against the run resuming
    from it: its ``step`` within the run's ``total`` steps, its ``position`` within its epoch's global batches
    (``num_batches(epoch)``), and, inside an epoch, the same ``global_batch`` (examples a step) as the checkpoint's:
    its position counts batches of that size, so another size would train again, or skip, examples of the epoch. A
    :class:`CheckpointError` naming the file and the field otherwise (a position past the end of its epoch would
    make the loop spin without training)."""
    path = folder / INFO_FILE
    step, epoch, position = info["step"], info.get("epoch", 0), info.get("position", 0)
    saved = info.get("global_batch")
    if position and global_batch is not None and saved is not None and saved != global_batch:
        raise CheckpointError(
            f"{path}: the run stopped {position} global batches of {saved} examples into epoch {epoch}; this run "
            f"takes {global_batch} a step (train.batch_size × processes × train.grad_accum_steps), so it would train "
            f"again or skip examples of the epoch: resume with settings giving {saved} examples a step (e.g. twice "
            "train.batch_size on half the processes)"
        )
    if position and batches is not None and "trained" in info:
        plan = batches(epoch)
        if position <= len(plan) and trained_digest(plan, position) != info["trained"]:
            raise CheckpointError(
                f"{path}: the run stopped {position} global batches into epoch {epoch}, but this run's first "
                f"{position} batches of that epoch hold other examples (changed data or sampler settings, such as "
                "data.bag_schedule, or a sampler whose batches depend on the process count and "
                "train.grad_accum_steps), so it would train again or skip examples of the epoch: resume with the "
                "checkpoint's data settings, processes and train.grad_accum_steps (it was saved by "
                f"{info.get('num_processes', '?')} processes)"
            )
    if step > total:
        raise CheckpointError(
            f"{path}: field 'step' is {step}, past the {total} steps of this run: resume with train.max_steps >= "
            f"{step} (or as many train.epochs), or, if the run never took that many steps, the file is damaged: "
            f"{RECOVER}"
        )
    batches = num_batches(epoch)
    if position >= batches:
        raise CheckpointError(
            f"{path}: field 'position' is {position}, but epoch {epoch} of this run has {batches} global batches "
            "(did train.batch_size, the process count or the data change since the checkpoint?); resume with the "
            f"checkpoint's settings, or {RECOVER}"
        )


def checkpoint_step(folder: Path) -> int:
    return int(read_info(folder)["step"])


def resumable_candidates(run_dir: Path) -> list[Path]:
    """Where a kill can leave a resumable checkpoint: ``last``, a finished ``.last.tmp``, ``last.old``."""
    last = checkpoint_dir(run_dir, LAST)
    return [last, temporary_dir(last), previous_dir(last)]


def find_resumable(run_dir: Path) -> Path | None:
    """The newest complete checkpoint among :func:`resumable_candidates` (by its step), or ``None``."""
    complete = [c for c in resumable_candidates(run_dir) if is_complete(c)]
    if not complete:
        return None
    return max(complete, key=checkpoint_step)


def promote(found: Path, run_dir: Path) -> Path:
    """Make ``found`` the ``last`` checkpoint (finishing an interrupted swap); returns ``last``. Older checkpoints
    beside it are superseded and removed only as a normal save would
    (:func:`finecap.utils.folders.atomic_replace_dir`). An incomplete ``last`` is set aside as ``.last.incomplete``,
    replacing the one an earlier promotion set aside (a second fault), when that is a checkpoint folder of
    finecap's; anything else there is refused, named and kept."""
    last = checkpoint_dir(run_dir, LAST)
    if found == last:
        return last
    if found == temporary_dir(last):
        replace_checkpoint(found, last)  # the interrupted save's own completion
    else:  # last.old, with no newer complete checkpoint: last is missing or incomplete
        aside = last.with_name(INCOMPLETE)
        if last.exists():
            remove_unfinished_checkpoint(aside)
        replace_durably(found, last, previous=aside)
    return last


def describe_checkpoints(run_dir: Path) -> str:
    folder = run_dir / CHECKPOINTS_DIR
    if not folder.is_dir():
        return "no checkpoints/ folder"
    found = []
    for item in sorted(folder.iterdir()):
        if item.name == BEST:
            tag = "the best model, without optimizer state: not resumable"
        else:
            tag = "complete" if is_complete(item) else "incomplete: no trainer_state.json or state/"
        found.append(f"{item.name} ({tag})")
    return ", ".join(found) or "an empty checkpoints/ folder"


def holds_run(run_dir: Path) -> bool:
    return (run_dir / CHECKPOINTS_DIR).exists() or (run_dir / METRICS_FILE).exists()


def beside_run_files(run_dir: Path) -> bool:
    """Whether a stored configuration (:func:`is_run_config`) at ``run_dir/config.yaml`` is the run's own by what
    lies beside it, which a run may replace without the finecap home's record of it (:mod:`finecap.outputs`: that
    record is lost with another ``$FINECAP_HOME`` or a cleared cache): the folder holds a run (:func:`holds_run`), or
    finecap's ``fingerprints.json`` (:func:`~finecap.train.fingerprint.is_fingerprints_file`), which training writes
    right after ``config.yaml`` and an overwrite keeps: all a run leaves when it is killed before its first log or
    checkpoint, or when its files were removed (an overwrite, a forced stage retrain) before the new run wrote any.
    A stored configuration alone in a folder is the user's (a ``--dry-run`` printout kept there)."""
    return holds_run(run_dir) or is_fingerprints_file(run_dir / FINGERPRINTS_FILE)


CHECKPOINT_FOLDERS = frozenset(
    {INCOMPLETE}
    | {p.name for name in (LAST, BEST) for p in (Path(name), temporary_dir(name), previous_dir(Path(name)))}
)
"""The folders finecap writes under ``checkpoints/``: ``last`` and ``best``, their temporary ``.<name>.tmp``
(:func:`finecap.runs.temporary_dir`), the swapped-out ``<name>.old``
(:func:`finecap.utils.folders.previous_dir`) and the set-aside ``.last.incomplete`` (:func:`promote`)."""
CHECKPOINT_ENTRIES = frozenset({MODEL_SUBDIR, CONFIG_FILE, FINGERPRINTS_FILE, INFO_FILE, STATE_DIR, FOLDER_MARK})
"""What a checkpoint folder holds (a partial one: some of it), its :data:`~finecap.utils.folders.FOLDER_MARK`
included."""


def is_checkpoint_entry(name: str) -> bool:
    """Whether ``name`` is something a checkpoint folder finecap writes may hold: one of :data:`CHECKPOINT_ENTRIES`,
    or the temporary file of one that a kill left while it was being written (``.<entry>.<random>.tmp``:
    :func:`finecap.utils.files.atomic_write_bytes`; the folder's mark is the first file a save writes, so a save
    killed then leaves only that).

    >>> is_checkpoint_entry("trainer_state.json"), is_checkpoint_entry("..finecap-folder.ht1v2ify.tmp")
    (True, True)
    >>> is_checkpoint_entry("notes.txt"), is_checkpoint_entry(".notes.txt.x1.tmp")
    (False, False)
    """
    if name in CHECKPOINT_ENTRIES:
        return True
    return any(is_temporary_of(name, entry) for entry in CHECKPOINT_ENTRIES)


CHECKPOINT_KIND = "checkpoint"
"""The folder kind of a checkpoint (:func:`finecap.utils.folders.folder_mark_text`): what its mark says it is."""


def is_checkpoint_folder(folder: Path) -> bool:
    """Whether ``folder`` reads as a checkpoint folder finecap wrote before it marked the folders it makes
    (:data:`~finecap.utils.folders.FOLDER_MARK`), or one a save was killed in before its mark was written: a real
    folder holding only :data:`CHECKPOINT_ENTRIES` and the temporary files a kill left of them
    (:func:`is_checkpoint_entry`), none a link (an empty one too: a save killed as it began; one holding only its
    mark's temporary file: a save killed while marking it). The content test beside the mark when a checkpoint is
    swapped in or an unfinished one removed (:func:`replace_checkpoint`, :func:`remove_unfinished_checkpoint`), so
    that runs from before the mark resume as they did, and a run killed at any point of a save saves again."""
    try:
        if folder.is_symlink() or not folder.is_dir():
            return False
        return all(is_checkpoint_entry(p.name) and not p.is_symlink() for p in folder.iterdir())
    except OSError:
        return False


def replace_checkpoint(tmp: Path, path: Path, *, synced: bool = False) -> None:
    """Swap the complete checkpoint folder ``tmp`` in at ``path`` (:func:`finecap.utils.folders.atomic_replace_dir`):
    only a checkpoint of finecap's (marked, or :func:`is_checkpoint_folder`) at ``path`` or ``<path>.old`` is replaced;
    anything else there is refused, named and kept. The swap holds :func:`finecap.runs.swap_guard` exclusively: it
    waits for a process loading one of the run's checkpoints (``finecap caption`` or ``eval`` of the run) to finish.
    ``synced``: as ``atomic_replace_dir``'s (a save that synced ``tmp`` itself)."""
    wait = f"train: waiting for another process to finish loading a checkpoint of the run before replacing {path}"
    with swap_guard(path, exclusive=True, log_wait=wait):
        atomic_replace_dir(
            tmp, path, kind=CHECKPOINT_KIND, ours=is_checkpoint_folder, complete_file=INFO_FILE, synced=synced
        )


def remove_unfinished_checkpoint(tmp: Path) -> None:
    """Remove ``tmp``, an unfinished checkpoint folder of the run (``checkpoints/.<name>.tmp``, the set-aside
    ``.last.incomplete``), when it is finecap's (:func:`finecap.utils.folders.remove_own_folder`), its
    ``trainer_state.json`` first (:func:`remove_checkpoints`); anything else there is refused, named and kept."""
    remove_own_folder(tmp, CHECKPOINT_KIND, ours=is_checkpoint_folder, complete_file=INFO_FILE)


def remove_checkpoints(folders: Sequence[Path], *, ignore_errors: bool = False) -> None:
    """Remove checkpoint folders of finecap's, each made incomplete (:func:`is_complete`) before anything of any of
    them is deleted: the rule of every removal of a checkpoint folder (this; and, through the same
    :func:`finecap.utils.folders.remove_folders`, a swap's ``<name>.old``, :func:`replace_checkpoint`, and
    :func:`remove_unfinished_checkpoint`). ``shutil.rmtree`` deletes in no set order: a process killed in it (a second
    Ctrl-C during a failed save's cleanup, or during an overwrite) could leave ``trainer_state.json`` and ``state/``
    beside part of ``model/``, which :func:`find_resumable` took for the newest complete checkpoint and the resume
    failed to load. ``ignore_errors``: as ``shutil.rmtree``'s (a failed save's cleanup)."""
    remove_folders(folders, complete_file=INFO_FILE, ignore_errors=ignore_errors)


def new_checkpoint_folder(tmp: Path) -> None:
    """Create the folder ``tmp`` a checkpoint is written in, marked as finecap's at once
    (:func:`finecap.utils.folders.mark_folder`): a save killed half-way leaves a folder the next one recognises."""
    tmp.mkdir(parents=True, exist_ok=True)
    mark_folder(tmp, CHECKPOINT_KIND)


def is_metrics_log(path: Path) -> bool:
    """Whether ``path`` reads as finecap's ``metrics.jsonl``: every line an event of its JSONL tracker (an integer
    ``step``, a string ``split``, a ``values`` mapping); a last line cut short by a kill (no newline) is allowed.
    Read line by line (:func:`finecap.utils.reading.jsonl_rows_are`): a log too large to read is a
    :class:`~finecap.utils.reading.FileTooLarge` naming it, not taken for someone else's file."""

    def is_event(row: Any) -> bool:
        return (isinstance(row, dict) and isinstance(row.get("step"), int) and isinstance(row.get("split"), str)
                and isinstance(row.get("values"), dict))  # fmt: skip

    try:
        return jsonl_rows_are(path, is_event)
    except OSError:
        return False


def is_run_config(path: Path) -> bool:
    """Whether ``path`` reads as the ``config.yaml`` finecap writes into a run directory: every option of every
    section written out, so at least the sections :data:`STORED_SECTIONS` and ``run``'s ``name``, ``dir`` and
    ``seed`` (a recipe of one's own names only what it changes: ``run:`` and ``train:`` alone are not enough)."""
    try:
        values = load_yaml(read_text_bounded(path, METADATA))
    except FileTooLarge:
        raise
    except (yaml.YAMLError, OSError, ValueError):
        return False
    if not isinstance(values, dict) or not all(isinstance(values.get(name), dict) for name in STORED_SECTIONS):
        return False
    return {"name", "dir", "seed"} <= set(values["run"])


STORED_SECTIONS = ("run", "data", "model", "train", "decode", "eval")
"""Sections every ``config.yaml`` finecap has written holds (those of the first version included)."""


def check_config_target(path: Path, *, inputs: dict[str, Path | None], force: bool, option: str,
                        ours: Callable[[Path], bool], force_flag: str | None = "--force") -> None:  # fmt: skip
    """The ``config.yaml`` a run (or the demo) is about to write at ``path``: never one of ``inputs`` (the recipe it
    reads); when it exists, finecap's (written through :func:`finecap.outputs.write_output`, or ``ours``: a stored
    configuration beside the run's own files), else refused unless ``force``
    (:func:`finecap.outputs.check_output_file`). ``force`` (replacing a run) replaces a finecap configuration of
    another run, never a file that does not read as one: that is the user's, and refused whatever is asked."""
    finecaps = force and path.is_file() and not path.is_symlink() and is_run_config(path)
    check_output_file(path, inputs, force=finecaps, option=option, kind="config",
                      force_flag=None if force else force_flag,
                      ours=lambda p: is_run_config(p) and ours(p))  # fmt: skip


def foreign_run_files(run_dir: Path) -> list[Path]:
    """What an overwrite would remove but finecap cannot tell for its own: in ``checkpoints/``, an entry that is not
    one of :data:`CHECKPOINT_FOLDERS` or, inside one, not one of :data:`CHECKPOINT_ENTRIES` (nor a temporary file a
    kill left of one: :func:`is_checkpoint_entry`); a ``metrics.jsonl`` that is not an event log; a ``trackers/``
    folder in a run directory without finecap's ``config.yaml`` (the trackers' files are the trackers' own format)."""
    foreign = [
        p for p in (run_dir / CHECKPOINTS_DIR, run_dir / METRICS_FILE, run_dir / TRACKERS_DIR) if p.is_symlink()
    ]
    if foreign:  # a link is never followed, deleted through, or taken for finecap's
        return foreign
    checkpoints = run_dir / CHECKPOINTS_DIR
    if checkpoints.is_dir():
        for folder in sorted(checkpoints.iterdir()):
            if not (folder.is_dir() and not folder.is_symlink() and folder.name in CHECKPOINT_FOLDERS):
                foreign.append(folder)
            else:
                foreign += [p for p in sorted(folder.iterdir()) if not is_checkpoint_entry(p.name)]
    elif checkpoints.exists():
        foreign.append(checkpoints)
    metrics = run_dir / METRICS_FILE
    if metrics.exists() and not (metrics.is_file() and is_metrics_log(metrics)):
        foreign.append(metrics)
    trackers = run_dir / TRACKERS_DIR
    if trackers.exists() and not is_run_config(run_dir / CONFIG_FILE):
        foreign.append(trackers)
    return foreign


def run_paths(run_dir: Path) -> list[Path]:
    """Every path a training run writes at the top of ``run_dir`` and of ``checkpoints/`` (checked for planted
    links before it starts; each writer checks its own path again when it writes)."""
    checkpoints = [run_dir / CHECKPOINTS_DIR / name for name in sorted(CHECKPOINT_FOLDERS)]
    return [run_dir / CHECKPOINTS_DIR, *checkpoints, run_dir / CONFIG_FILE, run_dir / FINGERPRINTS_FILE,
            run_dir / METRICS_FILE, run_dir / TRACKERS_DIR]  # fmt: skip


OVERWRITE_API = "in Python, finecap.train(..., overwrite=True) replaces finecap's own run files there"
"""How the Python API starts a run again over a run folder of finecap's (the command line has no such option)."""


def prepare_run_dir(
    run_dir: Path,
    *,
    resume: bool,
    overwrite: bool,
    reads: Mapping[str, str | Path | None] | None = None,
    option: str = "run.dir",
) -> Path | None:
    """Check the run directory (main process); returns the checkpoint to resume from, or ``None`` for a fresh start.

    - fresh start in a folder holding a run: an error, unless ``overwrite`` (then finecap's own run files
      ``checkpoints/``, ``metrics.jsonl`` and ``trackers/`` are removed, nothing else; when any of them is not
      recognisably finecap's, :func:`foreign_run_files`, an error naming it, and nothing is deleted; likewise when
      one of ``reads`` (``{option: path}``, what the new run will read: ``train.init_from``, the retriever's
      checkpoint) is one of those files or lies inside them, or holds them: the run folder itself as the start;
      :func:`check_overwrite`);
    - ``resume``: the newest complete checkpoint (:func:`find_resumable`, promoted to ``last``); a folder with a run
      but nothing resumable is an error listing what was found, and nothing is deleted; an empty folder starts fresh.

    Before either, a symbolic link where the run writes (:func:`run_paths`) is refused, naming it
    (:func:`finecap.utils.files.refuse_link`): a shared run folder keeps the links someone planted in it.

    ``option``: how the user chose the folder, which the errors name: ``run.dir`` (or ``run.name``: the default), or
    ``--out`` when the command line's ``--out`` gave it.
    """
    another = "run.name / run.dir" if option == "run.dir" else option
    for path in run_paths(run_dir):
        refuse_link(path)
    if resume:
        if finish_swap(checkpoint_dir(run_dir, BEST), CHECKPOINT_KIND, is_checkpoint_folder):
            log.info("resume: %s was left as %s by a run killed while saving it: renamed back",
                     checkpoint_dir(run_dir, BEST), previous_dir(checkpoint_dir(run_dir, BEST)).name)  # fmt: skip
        found = find_resumable(run_dir)
        if found is not None:
            return promote(found, run_dir)
        if holds_run(run_dir):
            best = checkpoint_dir(run_dir, BEST)
            folder = "run.dir" if option == "run.dir" else option
            again = (f"Start again from its best checkpoint with train.init_from={best} and another {folder}"
                     if best.is_dir() else f"Start again in another {folder}")  # fmt: skip
            raise CheckpointError(
                f"--resume: {run_dir} holds a run but no complete resumable checkpoint (found: "
                f"{describe_checkpoints(run_dir)}); nothing was deleted. {again}, or remove the folder yourself "
                f"({OVERWRITE_API})"
            )
        return None
    if holds_run(run_dir):
        if not overwrite:
            if find_resumable(run_dir) is None:  # a run that failed or stopped before its first checkpoint
                raise ValueError(
                    f"{option}: {run_dir} already holds a run, with no checkpoint to resume from (found: "
                    f"{describe_checkpoints(run_dir)}); choose another {another}, or remove its files "
                    f"yourself ({OVERWRITE_API})"
                )
            raise ValueError(
                f"{option}: {run_dir} already holds a run; pass --resume (resume=True in finecap.train) to continue "
                f"it, or choose another {another} ({OVERWRITE_API})"
            )
        check_overwrite(run_dir, reads=reads or {}, option=option)
        olds = removed_by_overwrite(run_dir)
        if olds[0].is_dir():  # every checkpoint made incomplete before any is deleted (foreign_run_files: all folders)
            remove_checkpoints(sorted(olds[0].iterdir()))
        for old in olds:
            if old.is_dir():
                shutil.rmtree(old)
            elif old.exists():
                old.unlink()
    return None


def removed_by_overwrite(run_dir: Path) -> tuple[Path, Path, Path]:
    """What overwriting the run in ``run_dir`` removes: ``checkpoints/``, ``metrics.jsonl``, ``trackers/``."""
    return run_dir / CHECKPOINTS_DIR, run_dir / METRICS_FILE, run_dir / TRACKERS_DIR


def check_overwrite(run_dir: Path, *, reads: Mapping[str, str | Path | None], option: str = "run.dir") -> None:
    """What overwriting the run in ``run_dir`` (:func:`prepare_run_dir` with ``overwrite``) refuses before it deletes
    anything, a ``ValueError`` naming it: a file finecap did not make where the run's files go
    (:func:`foreign_run_files`); a path the new run reads (``reads``, ``{option: path}``) among what it would remove
    (:func:`refuse_reading_removed`). Nothing to refuse in a folder that holds no run."""
    if not holds_run(run_dir):
        return
    another = "run.name / run.dir" if option == "run.dir" else option
    foreign = foreign_run_files(run_dir)
    if foreign:
        raise ValueError(
            f"{option}: {run_dir} holds files finecap did not make where its run files go "
            f"({', '.join(str(p) for p in foreign)}); overwriting removes only finecap's own run files, so "
            f"nothing was deleted: move them, or choose another {another}"
        )
    refuse_reading_removed(removed_by_overwrite(run_dir), reads, another=another)


def run_reads(cfg: Config) -> dict[str, str | None]:
    """``{option: path}`` of what a run of ``cfg`` reads that lies outside its configuration's data: its start
    (``train.init_from``) and its retriever (``retriever.checkpoint``), which an overwrite of its run folder must not
    delete first (:func:`check_overwrite`)."""
    return {"train.init_from": cfg.train.init_from, "retriever.checkpoint": cfg.retriever.checkpoint}


def check_run_folder(run_dir: Path, *, overwrite: bool, reads: Mapping[str, str | Path | None],
                     recipe: str | Path | None = None, option: str = "run.dir",
                     resume: bool = False) -> None:  # fmt: skip
    """What training into ``run_dir`` refuses of what is there before it changes any of it: a symbolic link where it
    writes (:func:`run_paths`); a ``config.yaml`` that is not finecap's run configuration, or is the ``recipe`` it
    reads (:func:`check_config_target`; a stored configuration is the run's beside its files,
    :func:`beside_run_files`); a ``fingerprints.json`` that is not finecap's; with ``overwrite`` and not
    ``resume``, what the overwrite may not remove (:func:`check_overwrite`; a resume removes nothing, whatever
    ``overwrite`` says, as :func:`prepare_run_dir` resumes first). :func:`finecap.train.run.train` checks it with
    the folder locked; a caller that changes files of the folder's old run before it trains there (the stage runner:
    a stage's ``DONE`` marker and ``start.json``, :meth:`finecap.stages.StageRunner.train_stage`) checks it first, so
    a refusal leaves the old run as it was."""
    for path in run_paths(run_dir):
        refuse_link(path)
    check_config_target(run_dir / CONFIG_FILE, inputs={"recipe": Path(recipe) if recipe else None}, force=overwrite,
                        option=option, force_flag=None, ours=lambda p: beside_run_files(p.parent))  # fmt: skip
    check_replaceable(run_dir / FINGERPRINTS_FILE, force=False, option=option, kind="fingerprints",
                      ours=is_fingerprints_file, force_flag=None)  # fmt: skip
    if overwrite and not resume:
        check_overwrite(run_dir, reads=reads, option=option)


def refuse_reading_removed(
    removed: Sequence[Path], reads: Mapping[str, str | Path | None], *, another: str = "run.name / run.dir"
) -> None:
    """A ``ValueError`` naming the option when a path the new run reads (``{option: path}``, empty ones skipped) is
    one of the ``removed`` files, lies inside one, or holds one (a run folder given as the start is read through its
    ``checkpoints/``): overwriting would delete it before it is read. ``another``: what the error says to choose
    another of (the run folder's option)."""
    for option, value in reads.items():
        if not value:
            continue
        read = Path(os.path.realpath(value))
        for old in removed:
            gone = Path(os.path.realpath(old))
            if old.exists() and (read.is_relative_to(gone) or gone.is_relative_to(read)):
                raise ValueError(
                    f"{option}={value}: the new run reads it from {old}, which overwriting the run in "
                    f"{old.parent} would delete first; nothing was deleted: copy it elsewhere and point {option} "
                    f"there, or choose another {another}"
                )


def continue_unfinished(run_dir: Path, *, what: str, ways_out: str) -> tuple[bool, bool]:
    """``(resume, overwrite)`` for :func:`prepare_run_dir` when a runner (the demo's stages, the paper-tables runner)
    trains ``what`` in ``run_dir`` again because it did not finish: resume from the newest complete checkpoint; a
    run stopped before it saved any checkpoint has nothing to resume and nothing to keep, so it starts again
    (``overwrite``, which still refuses files finecap did not make, :func:`foreign_run_files`); an empty or missing
    folder starts fresh. A saved but not resumable checkpoint (``best`` without ``last``) is kept: a
    :class:`CheckpointError` listing what was found, and the caller's ``ways_out``."""
    if find_resumable(run_dir) is not None:
        return True, False
    if not holds_run(run_dir):
        return False, False
    checkpoints = run_dir / CHECKPOINTS_DIR  # nothing resumable: are there saved (not temporary) checkpoints at all?
    if checkpoints.is_dir() and any(not p.name.startswith(".") for p in checkpoints.iterdir()):
        raise CheckpointError(
            f"{what}: {run_dir} holds an unfinished run with no checkpoint to resume from (found: "
            f"{describe_checkpoints(run_dir)}); nothing was deleted. To train it again from the start, {ways_out}"
        )
    log.warning("%s: its earlier run in %s stopped before saving a checkpoint; training it from the start (its "
                "partial %s is replaced)", what, run_dir, METRICS_FILE)  # fmt: skip
    return False, True


def truncate_metrics(path: Path, step: int) -> None:
    """Drop the events after ``step`` (written by a killed run after its last checkpoint). A log that is not finecap's
    (:func:`is_metrics_log`: a line that is not one of its events) is a :class:`CheckpointError` naming it. The
    events kept are written as the tracker writes them now (:func:`finecap.runs.encode_event`): those of a run
    logged before with Python's ``NaN`` / ``Infinity`` tokens become strict JSON, with the same values."""
    if path.exists():
        if not is_metrics_log(path):
            raise CheckpointError(
                f"{path}: not finecap's event log (a line is not an event with an integer step, a split and values); "
                "nothing was changed: restore the run's own metrics.jsonl, or move it aside to resume without it"
            )
        events = [json.loads(ln) for ln in read_lines(path, total=DATA_FILE)  # a last line cut by a kill: dropped
                  if ln.endswith("\n") and ln.strip()]  # fmt: skip
        kept = [json.dumps(encode_event(decode_event(e))) + "\n" for e in events if e["step"] <= step]
        atomic_write_text(path, "".join(kept))


DTYPES_KEPT = ("the checkpoint's weights and optimizer state are in the run's dtypes (the saved optimizer moments "
               "would be cast silently); resume with the run's settings, or start a new run from its checkpoint "
               "(train.init_from=<run>/checkpoints/last)")  # fmt: skip
ENCODER_KEPT = ("the checkpoint's captioner keeps the image encoder it was trained with (its captioner.json names "
                "it, and the resumed run encodes with that one), so the run's configuration would name an encoder it "
                "never used; resume with the run's model.encoder")  # fmt: skip
RESUME_FIXED: dict[str, str] = {
    "model.dtype": DTYPES_KEPT,
    "model.trainable_dtype": DTYPES_KEPT,
    "model.quantization": DTYPES_KEPT,
    "model.encoder": ENCODER_KEPT,
}
"""Options a resume may not change, with why: the checkpoint's weights and optimizer state are in the run's dtypes,
and torch would cast the saved optimizer moments to other ones silently; the captioner loaded from the checkpoint
keeps the frozen encoder its ``captioner.json`` records, so a changed ``model.encoder`` was logged as a change and
written into ``config.yaml`` while the run went on encoding with the old one (:func:`check_unchanged_on_resume`)."""


def check_unchanged_on_resume(saved: Path, changes: Sequence[str]) -> None:
    """A :class:`CheckpointError` when ``changes`` (:func:`config_changes` of the checkpoint's stored configuration
    ``saved``, :func:`trained_config`, and the resuming run's) hold an option of :data:`RESUME_FIXED`, naming each
    change, why it cannot apply and the way out."""
    fixed = [change for change in changes if change.split(":", 1)[0] in RESUME_FIXED]
    if fixed:
        reasons = dict.fromkeys(RESUME_FIXED[change.split(":", 1)[0]] for change in fixed)  # each once, in order
        raise CheckpointError(f"{saved}: resuming with {'; '.join(fixed)}: {'; and '.join(reasons)}")


def trained_config(checkpoint: Path, run_dir: Path) -> Path:
    """The configuration a resumable ``checkpoint`` was trained and saved with, which a resume is compared with
    (:func:`config_changes`, :func:`check_unchanged_on_resume`): the checkpoint's own ``config.yaml``, else (a
    checkpoint without one) the run's. Not the run's first: that file is the resume's input (``finecap train --resume
    --out RUN`` reads it, and each resume rewrites it before its first checkpoint), so an edited one compared with
    itself let a resume change ``model.trainable_dtype`` unrefused, rounding the float32 weights and optimizer
    moments to bfloat16."""
    own = checkpoint / CONFIG_FILE
    return own if own.is_file() else run_dir / CONFIG_FILE


def config_changes(saved: Path, current: dict[str, dict[str, Any]]) -> list[str]:
    """``section.key: old -> new`` for every value the saved run configuration has and ``current`` changes (a file
    stored before a key moved read with its keys where they are now: :func:`finecap.config.migrate_moved_keys`; one
    stored before a key was added, with the value it behaved by: :func:`finecap.config.with_added_keys`)."""
    if not saved.exists():
        return []
    stored = read_yaml_mapping(saved, "a stored configuration must be a mapping of sections")
    old = with_added_keys(migrate_moved_keys(stored, f"{saved}: "), saved)
    before = flat_options(old)  # a nested section's keys one by one (data.hf.image_column)
    return [f"{key}: {short_repr(before[key], 200)} -> {short_repr(v, 200)}"
            for key, v in flat_options(current).items() if key in before and before[key] != v]  # fmt: skip
