"""Small shared helpers: atomic writes (with the user's umask), JSON I/O, seeding, whether to show progress bars."""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

_UMASK_LOCK = threading.Lock()
PROC_STATUS = "/proc/self/status"


@functools.cache
def current_umask() -> int:
    """The process's file-mode creation mask, read once.

    On Linux it is read from :data:`PROC_STATUS` (``Umask:``), which changes nothing. Elsewhere the only way is to
    set a mask and put the old one back (``os.umask`` returns the previous value); that is done once, under a lock,
    so no thread of finecap creates a file in between.
    """
    try:
        for line in Path(PROC_STATUS).read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def file_mode() -> int:
    """Mode of a new file under the user's umask (``0o666 & ~umask``: 0644 under umask 022), what ``open`` gives."""
    return 0o666 & ~current_umask()


def dir_mode() -> int:
    """Mode of a new folder under the user's umask (``0o777 & ~umask``: 0755 under umask 022), what ``mkdir``
    gives."""
    return 0o777 & ~current_umask()


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a uniquely named temporary file in the same folder, then rename.

    The one atomic file write of the package (text, JSON and safetensors go through it): readers see the old file or
    the complete new one, never a half-written file, and an interrupted write leaves no temporary file behind. The
    temporary name is unique per call (``mkstemp``), so concurrent writers of the same file never share one; the last
    rename wins. ``mkstemp`` creates its file with mode 0600; it is given :func:`file_mode` before the rename, so the
    file ends up with the mode a plain ``open(path, "w")`` would give (0644 under umask 022, 0600 under 077).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.chmod(tmp, file_mode())
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, obj: Any, indent: int | None = 2) -> None:
    """Write ``obj`` as JSON (plus a final newline) to ``path`` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=indent) + "\n")


def read_json(path: str | Path) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deeply to read (thousands of levels)") from None


def read_yaml_mapping(path: str | Path, expected: str) -> dict[str, Any]:
    """A YAML file holding a mapping (an empty file is ``{}``); ``ValueError`` naming the file otherwise, with
    ``expected`` saying what the mapping should hold."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: invalid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: {expected}")
    return data


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def make_temporary_dir(final_dir: str | Path) -> Path:
    """A new, uniquely named, empty folder next to ``final_dir`` (``.<name>.<random>.tmp``) to build it in before
    :func:`atomic_replace_dir`; its mode is :func:`dir_mode` (``tempfile.mkdtemp`` alone gives 0700)."""
    final_dir = Path(final_dir)
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final_dir.parent, prefix=f".{final_dir.name}.", suffix=".tmp"))
    os.chmod(tmp, dir_mode())
    return tmp


def apply_umask(root: str | Path) -> None:
    """Give ``root`` and every folder under it :func:`dir_mode`, every file :func:`file_mode` (symbolic links are
    left alone). For folders finecap builds before renaming them into place: ``tempfile.mkdtemp`` makes 0700 folders,
    and safetensors (0.8) writes its files with mode 0600 whatever the umask, as do ``save_pretrained`` calls that go
    through it."""
    root = Path(root)
    os.chmod(root, dir_mode())
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            if not os.path.islink(os.path.join(folder, name)):
                os.chmod(os.path.join(folder, name), dir_mode())
        for name in files:
            if not os.path.islink(os.path.join(folder, name)):
                os.chmod(os.path.join(folder, name), file_mode())


def previous_dir(final_dir: Path) -> Path:
    """Where :func:`atomic_replace_dir` keeps the replaced version of ``final_dir`` during the swap
    (``<name>.old``)."""
    return final_dir.with_name(final_dir.name + ".old")


def atomic_replace_dir(tmp_dir: str | Path, final_dir: str | Path) -> None:
    """Move a fully written ``tmp_dir`` to ``final_dir``, replacing any previous version. The folder's modes follow
    the user's umask first (:func:`apply_umask`): what ``mkdtemp`` or safetensors created 0700 / 0600 ends up as
    readable as ``mkdir`` and ``open`` make it."""
    tmp_dir, final_dir = Path(tmp_dir), Path(final_dir)
    apply_umask(tmp_dir)
    old = previous_dir(final_dir)
    if old.exists():
        shutil.rmtree(old)
    if final_dir.exists():
        os.replace(final_dir, old)
    os.replace(tmp_dir, final_dir)
    if old.exists():
        shutil.rmtree(old)


def seed_everything(seed: int) -> None:
    # Deferred: utils is on the start-up path of text-only commands (`finecap eval` writes JSON with it), which
    # must not import torch (tests/test_cli.py checks); only training seeds.
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


PROGRESS_ENV = "TQDM_DISABLE"
"""The environment variable that turns progress bars off: ``finecap -q`` sets it (unless the user did)."""
NOT_SET = ("", "0", "false", "no", "off")


def progress_enabled(wanted: bool = True) -> bool:
    """Whether to show a progress bar the caller wants (``wanted``): not when :data:`PROGRESS_ENV` is set to
    anything but :data:`NOT_SET` (``finecap -q`` sets it, a user may too). Read at each call: tqdm reads its
    ``TQDM_*`` variables only once, when it is imported, and lets an explicit ``disable=`` win over them, so every
    finecap bar is made with ``disable=not progress_enabled(...)``."""
    return wanted and os.environ.get(PROGRESS_ENV, "").strip().lower() in NOT_SET
