"""Small shared helpers: atomic writes, JSON I/O, seeding."""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a uniquely named temporary file in the same folder, then rename.

    The one atomic file write of the package (text, JSON and safetensors go through it): readers see the old file or
    the complete new one, never a half-written file, and an interrupted write leaves no temporary file behind. The
    temporary name is unique per call (``mkstemp``), so concurrent writers of the same file never share one; the last
    rename wins.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
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


def atomic_replace_dir(tmp_dir: str | Path, final_dir: str | Path) -> None:
    """Move a fully written ``tmp_dir`` to ``final_dir``, replacing any previous version."""
    tmp_dir, final_dir = Path(tmp_dir), Path(final_dir)
    old = final_dir.with_name(final_dir.name + ".old")
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
