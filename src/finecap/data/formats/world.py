"""``data.format=world``: the world written by ``finecap world make`` (:mod:`finecap.world`), a Karpathy JSON
(:mod:`.karpathy`) with the world's scene graphs beside it.

``data.path`` is the world folder or its ``dataset.json``; empty, it is the world of ``world.*`` (under
``world.out``, or the world's folder in the finecap home). Default image root: ``<world>/images``. Detected: a folder
holding ``dataset.json``, or a ``dataset.json`` with ``scenes.jsonl`` next to it. Its fingerprint is the world's
content key (``world.json``'s ``key``, which fixes every image, caption and scene graph) and the SHA-256 of its
``dataset.json`` (a copy whose captions were edited is another data set); a ``dataset.json`` without ``world.json``
is fingerprinted as a file.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from finecap.data.formats import DataSource, Format
from finecap.data.formats.karpathy import read_karpathy
from finecap.data.hashing import sha256_file
from finecap.data.records import DataError, Record
from finecap.utils.reading import read_json
from finecap.utils.text import shell_command

if TYPE_CHECKING:
    from finecap.config import Config


def read_world(
    path: str | Path, images: str | Path | None = None, check_images: bool = True, allow_outside: bool = False
) -> list[Record]:
    """Read a world data set (``path`` = the world folder or its ``dataset.json``); its image folder is
    ``<world>/images`` (or ``images``)."""
    path = Path(path)
    if path.is_dir():
        path = path / "dataset.json"
    if not path.exists():
        make = shell_command(["finecap", "world", "make", "--out", path.parent])
        raise DataError(f"{path}: file not found; create the world with `{make}`")
    return read_karpathy(path, images if images is not None else path.parent / "images", check_images, allow_outside)


def _read(source: DataSource) -> list[Record]:
    return read_world(source.path, source.images, source.check_images, source.allow_outside)


def _detect(path: Path) -> Path | None:
    if path.is_dir():
        return path / "dataset.json" if (path / "dataset.json").exists() else None
    return path if path.name == "dataset.json" and (path.parent / "scenes.jsonl").exists() else None


def _locate(path: Path) -> Path:
    return path / "dataset.json" if path.is_dir() else path


def _fingerprint(path: Path, source: str) -> dict[str, Any]:
    if not (path.parent / "world.json").exists():
        return {"sha256": sha256_file(path)}
    return {
        "kind": "world",
        "world_key": read_json(path.parent / "world.json").get("key"),
        "sha256": sha256_file(path),
    }


def _default_path(cfg: Config) -> Path:
    from finecap.home import world_path

    return world_path(cfg.world) / "dataset.json"


FORMAT = Format("world", _read, detect=_detect, fingerprint=_fingerprint, locate=_locate, default_path=_default_path,
                split_hint="world.n_train / world.n_val / world.n_test")  # fmt: skip
