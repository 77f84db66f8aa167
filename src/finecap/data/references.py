"""Reference data sets for evaluation: which file the configuration means, and its records by split.

The format is ``data.format``, or detected from a data set named on the command line
(:func:`finecap.data.formats.detect_format`); a world's scene graphs are then loaded for faithfulness, and its scene
families for ``finecap bags build``.

Splits: ``"train"`` also takes Karpathy's ``restval`` images (:data:`TRAIN_SPLITS`), as most captioning code does.
Records whose data set names no split (a JSONL line without ``"split"``, a folder's images) are split by
``data.val_fraction`` / ``data.test_fraction`` (:mod:`finecap.data.splits`; all train by default), and an empty
split's error says what to add.

Nothing here imports torch (``finecap eval`` on text metrics reads its references through this module).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from finecap.data.formats import data_format, detect_format, format_options, read_dataset
from finecap.data.records import MAX_LISTED, DataError, Record, split_named
from finecap.data.splits import missing_split_advice, split_unsplit
from finecap.home import cache_dir as resolve_cache_dir
from finecap.registry import is_dotted_path

if TYPE_CHECKING:
    from finecap.config import Config
    from finecap.world.scene import Scene

TRAIN_SPLITS = ("train", "restval")
"""Splits that make up ``"train"``: Karpathy's ``restval`` images are training images."""


def data_file(cfg: Config) -> Path:
    """The data set file read for ``cfg``: ``data.path``, or its format's default (:attr:`Format.default_path
    <finecap.data.formats.Format.default_path>`: the world's ``dataset.json`` under ``world.out``, or in the world's
    folder in the finecap home)."""
    if cfg.data.path:
        return Path(cfg.data.path)
    default = data_format(cfg.data.format).default_path
    if default is None:
        raise ValueError(f"data.path: required for data.format={cfg.data.format!r} (only the world has a default)")
    return default(cfg)


def world_scenes(cfg: Config | None) -> dict[Hashable, Scene] | None:
    """The scene graphs ``{image_id: Scene}`` of the world ``cfg`` reads (``data.format=world``), or ``None`` for
    other data (or no configuration): what the world-only measures of training read (the listener reward, the
    reward-hacking monitor's fact precision)."""
    if cfg is None or cfg.data.format != "world":
        return None
    from finecap.world.make import load_scenes  # the world's modules load only for a world

    return dict(load_scenes(data_file(cfg).parent))


class MissingSplit(ValueError):
    """No record of a split (:func:`select_split`): ``found`` is the message without its ``advice`` (the file, the
    split, the splits ``present``), which a caller that knows better ways out words again."""

    def __init__(self, found: str, advice: str, present: Sequence[str] = ()) -> None:
        super().__init__(f"{found}; {advice}")
        self.found = found
        self.advice = advice
        self.present = tuple(present)


def select_split(
    records: Sequence[Record], split: str, path: str | Path, fmt: str | None = None, unsplit: int = 0
) -> list[Record]:
    """The records of ``split`` (``"train"`` = :data:`TRAIN_SPLITS`); none raises :class:`MissingSplit` listing the
    splits present in ``path`` and saying what to add (format ``fmt``'s split key; ``data.val_fraction`` /
    ``data.test_fraction`` when ``unsplit`` records named no split: :func:`finecap.data.splits.split_unsplit`).
    A ``split`` no record names that is another word for a split (``--split validation``: :func:`~finecap.data.
    records.split_named`) reads that split, as the records' own ``"validation"`` was read as ``val``; a split of
    that very name (a Hugging Face set's ``validation`` beside its ``val``) is read by its name."""
    wanted = TRAIN_SPLITS if split == "train" else (split,)
    kept = [r for r in records if r.split in wanted]
    named = split_named(split)
    if not kept and named is not None and named != split:
        return select_split(records, named, path, fmt, unsplit)
    if not kept:
        present = sorted({r.split for r in records})
        found = f"{path}: no records in split {split!r}; splits present: {', '.join(present)}"
        raise MissingSplit(found, missing_split_advice(split, fmt, records, unsplit), present)
    return kept


def require_captions(records: Sequence[Record], path: str | Path, fmt: str | None, what: str) -> None:
    """Refuse ``records`` (``what``: which, e.g. ``"split 'train'"``) with no reference caption, as training and
    evaluation must (a ``folder`` data set's images may have none): a :class:`~finecap.data.records.DataError` naming
    the count, the first images and what to add."""
    bare = [r for r in records if not r.captions]
    if not bare:
        return
    shown = ", ".join(str(r.image_id) for r in bare[:MAX_LISTED]) + (", ..." if len(bare) > MAX_LISTED else "")
    how = (data_format(fmt).caption_hint if fmt else "") or "their captions"
    raise DataError(
        f"{path}: {len(bare)} of {len(records)} images of {what} have no caption ({shown}); training and evaluation "
        f"need reference captions for every image: add {how}, or leave the images out (`finecap caption` captions "
        "images without references)"
    )


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


def missing_images(
    records: Sequence[Record], path: str | Path, first: bool = False, fmt: str | None = None
) -> str | None:
    """Why the images of ``records`` (read from ``path``, format ``fmt``) cannot be read, or ``None`` when every
    record has its image (a file, or embedded bytes). ``first``: stop at the first missing image (a quick yes/no).
    COCO annotations naming images by id only (no ``file_name``) are said so; for the other formats the image root
    is what to set (``--images`` / ``data.images``, said by the caller)."""
    missing = []
    for r in records:
        if not r.embedded and not r.path.is_file():
            missing.append(r)
            if first:
                break
    if not missing:
        return None
    how_many = f"{len(missing)} of {len(records)}" if not first else "some"
    shown = ", ".join(str(r.path) for r in missing[:MAX_LISTED])
    reason = f"{how_many} image files do not exist, e.g. {shown}"
    if fmt in ("coco", None) and all(r.path.name == str(r.image_id) for r in missing[:MAX_LISTED]):  # by id only
        reason += f" ({Path(path).name} names its images by id only, without 'file_name')"
    return reason


def check_image_folder(images: str | Path) -> Path:
    """``images``, the ``--images`` folder the references' relative image paths are read from, as a path; else a
    ``FileNotFoundError`` saying whether nothing is there (``no such folder``) or something that is not a folder
    (``not a folder``). Checked by the commands taking ``--images`` for references (``finecap eval``, ``finecap bags
    review``) whether or not they go on to read an image: a mistyped folder is refused, not passed over unsaid."""
    path = Path(images)
    if not path.is_dir():
        what = "not a folder" if path.exists() else "no such folder"
        raise FileNotFoundError(f"--images {images}: {what} (the image folder of the references' relative paths)")
    return path


def data_source(cfg: Config, data: str | Path | None = None) -> tuple[str, Path]:
    """The format and the file :func:`load_references` reads for ``cfg`` and ``data``: ``data`` (format detected;
    ``data.format`` when that is one's own format, ``pkg.module:FORMAT``, or when ``data`` is no local path and
    ``data.format`` reads Hub names: ``hf``), or the configured data set (:func:`data_file`), whose missing world is a
    ``FileNotFoundError`` naming the command that makes it."""
    if data is None:
        fmt, path = cfg.data.format, data_file(cfg)
        if fmt == "world" and not path.exists():
            raise FileNotFoundError(f"{path}: no world here; run `finecap world make` (or pass the data set file)")
        return fmt, path
    if is_dotted_path(cfg.data.format):  # one's own format, which detection does not try: it reads ``data``
        return cfg.data.format, data_format(cfg.data.format).locate(Path(data))
    if not Path(data).exists() and data_format(cfg.data.format).hub_names:  # a Hub name (data.format=hf)
        return cfg.data.format, Path(data)
    return detect_format(data)


def load_references(
    cfg: Config,
    data: str | Path | None = None,
    *,
    split: str | None = None,
    images: str | Path | None = None,
    check_images: bool = False,
) -> LoadedReferences:
    """Read a reference data set: ``data`` (format detected; read by ``data.format`` when that is one's own format,
    ``pkg.module:FORMAT``, or when ``data`` is no local path and ``data.format`` reads Hub names: ``hf``), or the
    configured one (``data.format``/``data.path``,
    default the world at ``world.out``). ``split`` keeps one split (:func:`select_split`). ``images`` (default
    ``data.images``) is the image root; ``check_images`` verifies that the image files exist. Records naming files
    outside the image root are refused unless ``data.allow_outside_paths``. Records naming no split are split by
    ``data.val_fraction`` / ``data.test_fraction`` (:func:`finecap.data.splits.split_unsplit`)."""
    fmt, path = data_source(cfg, data)
    root = images if images is not None else (cfg.data.images or None)
    records = read_dataset(fmt, path, images=root, check_images=check_images,
                           allow_outside=cfg.data.allow_outside_paths, cache_dir=resolve_cache_dir(cfg.run),
                           **format_options(fmt, cfg))  # fmt: skip
    records, unsplit = split_unsplit(cfg, records, path)
    if split is not None:
        records = select_split(records, split, path, fmt, unsplit)
    scenes = families = None
    if fmt == "world" and (Path(path).parent / "scenes.jsonl").exists():
        from finecap.world.make import load_scene_records  # the world's modules load only for a world

        scene_records = load_scene_records(Path(path).parent)
        scenes = {r["imgid"]: r["scene"] for r in scene_records}
        families = {r["imgid"]: r.get("family") for r in scene_records}
    return LoadedReferences(records, Path(path), fmt, scenes, families)
