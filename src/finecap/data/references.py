"""Reference data sets for evaluation: which file the configuration means, its format, and its records by split.

Format detection (:func:`detect_format`) looks at the file itself:

- a folder holding ``dataset.json``, or a ``dataset.json`` with ``scenes.jsonl`` next to it, is the world (its scene
  graphs are then loaded for faithfulness, and its scene families for ``finecap bags build``);
- ``*.jsonl`` is JSONL; a ``save_to_disk`` folder or ``*.parquet`` / ``*.arrow`` is a Hugging Face data set (``hf``);
- a JSON object with ``annotations`` is COCO caption annotations; one whose ``images`` is a list is Karpathy.

Splits: ``"train"`` also takes Karpathy's ``restval`` images (:data:`TRAIN_SPLITS`), as most captioning code does.

Nothing here imports torch (``finecap eval`` on text metrics reads its references through this module).
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from finecap.data.formats import MAX_LISTED, Record, check_unique_ids, hand_over_json, hf_options, read_dataset
from finecap.data.hf import is_hf_path, read_hf

if TYPE_CHECKING:
    from finecap.config import Config
    from finecap.world.scene import Scene

TRAIN_SPLITS = ("train", "restval")
"""Splits that make up ``"train"``: Karpathy's ``restval`` images are training images."""


def data_file(cfg: Config) -> Path:
    """The data set file read for ``cfg``: ``data.path``, or the world's ``dataset.json``
    (:func:`finecap.home.world_path`: under ``world.out``, or the world's folder in the finecap home)."""
    if cfg.data.path:
        return Path(cfg.data.path)
    if cfg.data.format != "world":
        raise ValueError(f"data.path: required for data.format={cfg.data.format!r} (only the world has a default)")
    from finecap.home import world_path

    return world_path(cfg.world) / "dataset.json"


def read_records(
    fmt: str,
    path: str | Path,
    images: str | Path | None = None,
    check_images: bool = True,
    allow_outside: bool = False,
    **options: Any,
) -> list[Record]:
    """Records of a data set in any format: :func:`finecap.data.formats.read_dataset`, or for ``hf``
    :func:`finecap.data.hf.read_hf` with ``options`` (:func:`finecap.data.formats.hf_options`). Image paths outside
    the data set's image folder are refused unless ``allow_outside`` (``data.allow_outside_paths``)."""
    if fmt == "hf":
        return read_hf(path, images, check_images, allow_outside=allow_outside, **options)
    return read_dataset(fmt, path, images, check_images, allow_outside=allow_outside)


def select_split(records: Sequence[Record], split: str, path: str | Path) -> list[Record]:
    """The records of ``split`` (``"train"`` = :data:`TRAIN_SPLITS`); none raises ``ValueError`` listing the splits
    present in ``path``."""
    wanted = TRAIN_SPLITS if split == "train" else (split,)
    kept = [r for r in records if r.split in wanted]
    if not kept:
        present = sorted({r.split for r in records})
        raise ValueError(f"{path}: no records in split {split!r}; splits present: {', '.join(present)}")
    return kept


@dataclass
class LoadedReferences:
    """Records of a reference file, where they came from, and the world's scene graphs / families when present."""

    records: list[Record]
    path: Path
    format: str
    scenes: dict[Hashable, Scene] | None = None
    families: dict[Hashable, Any] | None = None

    def captions(self) -> dict[Hashable, list[str]]:
        return {r.image_id: r.captions for r in self.records}


def missing_images(records: Sequence[Record], path: str | Path, first: bool = False) -> str | None:
    """Why the images of ``records`` (read from ``path``) cannot be read, or ``None`` when every record has its
    image (a file, or embedded bytes). ``first``: stop at the first missing image (a quick yes/no)."""
    missing = []
    for r in records:
        if r.image_bytes is None and not r.path.is_file():
            missing.append(r)
            if first:
                break
    if not missing:
        return None
    how_many = f"{len(missing)} of {len(records)}" if not first else "some"
    shown = ", ".join(str(r.path) for r in missing[:MAX_LISTED])
    reason = f"{how_many} image files do not exist, e.g. {shown}"
    if all(r.path.name == str(r.image_id) for r in missing[:MAX_LISTED]):  # COCO images listed by id only
        reason += f" ({Path(path).name} names its images by id only, without 'file_name')"
    return reason


def detect_format(path: str | Path) -> tuple[str, Path]:
    """``(format, file)`` of a reference file or world folder (module docstring)."""
    path = Path(path)
    if path.is_dir():
        if (path / "dataset.json").exists():
            return "world", path / "dataset.json"
        if is_hf_path(path):
            return "hf", path
        raise FileNotFoundError(f"{path}: a folder, but no dataset.json in it (expected a world folder)")
    if not path.exists():
        raise FileNotFoundError(f"{path}: reference file not found")
    if path.suffix == ".jsonl":
        return "jsonl", path
    if is_hf_path(path):
        return "hf", path
    if (path.parent / "scenes.jsonl").exists() and path.name == "dataset.json":
        return "world", path
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a JSON reference file ({e})") from None
    if isinstance(data, dict) and "annotations" in data:
        hand_over_json(path, data)
        return "coco", path
    if isinstance(data, dict) and isinstance(data.get("images"), list):
        hand_over_json(path, data)
        return "karpathy", path
    raise ValueError(
        f"{path}: unrecognised reference format; expected a world folder, Karpathy JSON ('images' with "
        "'sentences'), COCO annotations ('images' + 'annotations') or JSONL"
    )


def load_references(
    cfg: Config,
    data: str | Path | None = None,
    *,
    split: str | None = None,
    images: str | Path | None = None,
    check_images: bool = False,
) -> LoadedReferences:
    """Read a reference data set: ``data`` (format detected), or the configured one (``data.format``/``data.path``,
    default the world at ``world.out``). ``split`` keeps one split (:func:`select_split`). ``images`` (default
    ``data.images``) is the image root; ``check_images`` verifies that the image files exist. Records naming files
    outside the image root are refused unless ``data.allow_outside_paths``."""
    if data is None:
        fmt, path = cfg.data.format, data_file(cfg)
        if fmt == "world" and not path.exists():
            raise FileNotFoundError(f"{path}: no world here; run `finecap world make` (or pass the data set file)")
    else:
        fmt, path = detect_format(data)
    root = images if images is not None else (cfg.data.images or None)
    options = hf_options(cfg) if fmt == "hf" else {}
    records = read_records(fmt, path, images=root, check_images=check_images,
                           allow_outside=cfg.data.allow_outside_paths, **options)  # fmt: skip
    check_unique_ids(records, Path(path))  # every format: one record per image, never a silent replacement
    if split is not None:
        records = select_split(records, split, path)
    scenes = families = None
    if fmt == "world" and (Path(path).parent / "scenes.jsonl").exists():
        from finecap.world.make import load_scene_records  # the world's modules load only for a world

        scene_records = load_scene_records(Path(path).parent)
        scenes = {r["imgid"]: r["scene"] for r in scene_records}
        families = {r["imgid"]: r.get("family") for r in scene_records}
    return LoadedReferences(records, Path(path), fmt, scenes, families)
