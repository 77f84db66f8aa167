"""Hugging Face ``datasets`` as a caption data set format (``data.format=hf``), read into :class:`Record` s.

``data.path`` is one of:

- a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (``datasets.load_from_disk``);
- a ``.parquet`` / ``.arrow`` file, or a folder of them (``datasets.load_dataset("parquet" | "arrow", ...)``, or
  ``load_dataset(folder)``, which names splits after the file names, e.g. ``data/train-00000-of-00001.parquet``);
- a Hub name such as ``yerevann/coco-karpathy`` (``datasets.load_dataset(name)``; needs a network or the local
  Hugging Face cache; nothing else in finecap downloads).

Columns (``data.*``, see :func:`read_hf`): ``image_column`` holds the image (an ``Image`` feature, embedded bytes or
a path, or a path string; relative paths are resolved against ``data.images``, by default the folder of the file or
the saved data set folder), ``caption_column`` the reference captions (a string, or a list of strings per row),
``split_column`` (optional) each row's split, else the splits are the data set's named splits (a lone unnamed split,
as a file gives, takes its split from the file name like COCO files do: ``train``/``val``/``test``, default
``test``); ``id_column`` (optional) the image id, else the image path, else ``<split>/<row>``.

Image files must lie inside the data set's image folder (:class:`finecap.data.formats.ImageFolder`, refused
otherwise unless ``data.allow_outside_paths=true``): ``data.images`` when given, else the folder of a parquet/arrow
file or the saved data set folder, else, for a Hub name, the Hugging Face caches its files were downloaded to
(``datasets``' and ``huggingface_hub``'s). Embedded images (bytes) are not files and are not checked.

``datasets`` is an optional dependency (``pip install 'finecap[hf]'``), imported only when such a data set is read:
text-only ``finecap eval`` never imports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from finecap.data.formats import MAX_LISTED, DataError, ImageFolder, Record, _captions, _infer_split

__all__ = ["HF_FILE_SUFFIXES", "is_hf_path", "read_hf"]

HF_FILE_SUFFIXES = (".parquet", ".arrow")


def is_hf_path(path: str | Path) -> bool:
    """Whether ``path`` looks like a Hugging Face data set on disk (a saved data set folder, parquet/arrow files)."""
    path = Path(path)
    if path.is_dir():
        saved = (path / "dataset_dict.json").exists() or (path / "state.json").exists()
        return saved or any(p.suffix in HF_FILE_SUFFIXES for p in path.rglob("*"))
    return path.suffix in HF_FILE_SUFFIXES


def _import_datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise ImportError(
            "data.format=hf needs the Hugging Face `datasets` package: pip install 'finecap[hf]' (or datasets)"
        ) from None
    return datasets


def _load(source: str | Path) -> dict[str, Any]:
    """``{split name: Dataset}`` of a saved folder, parquet/arrow file(s), or Hub name."""
    datasets = _import_datasets()
    path = Path(source)
    if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
        loaded = datasets.load_from_disk(str(path))
    elif path.is_file():
        if path.suffix not in HF_FILE_SUFFIXES:
            raise DataError(f"{path}: data.format=hf reads {', '.join(HF_FILE_SUFFIXES)} files or data set folders")
        builder = path.suffix.lstrip(".")
        loaded = datasets.load_dataset(builder, data_files={_infer_split(path): str(path)})
    else:
        try:
            loaded = datasets.load_dataset(str(source))
        except Exception as e:  # noqa: BLE001 (datasets raises many kinds; the message names the source)
            where = "folder" if path.is_dir() else "Hub name (no such local file or folder)"
            raise DataError(f"{source}: cannot load it as a Hugging Face data set {where}: {e}") from None
    if isinstance(loaded, datasets.Dataset):
        return {_infer_split(path): loaded}
    return dict(loaded)


def _column(ds: Any, name: str, option: str, source: Any, split: str) -> None:
    if name not in ds.column_names:
        raise DataError(
            f"{source} (split {split!r}): no column {name!r} ({option}); columns: {', '.join(ds.column_names)}"
        )


def _image_path(value: Any, root: Path | None, where: str) -> tuple[Path, bytes | None]:
    """(path, embedded bytes or None) of an image cell: ``{"path", "bytes"}`` (undecoded Image feature) or a string."""
    if isinstance(value, dict):
        data, name = value.get("bytes"), value.get("path")
        if data is None and not name:
            raise DataError(f"{where}: image has neither bytes nor a path")
        p = Path(name) if name else Path(where.replace(" ", "_"))
    elif isinstance(value, str):
        data, p = None, Path(value)
    else:
        raise DataError(f"{where}: image must be an Image feature or a path string, got {type(value).__name__}")
    if not p.is_absolute() and root is not None and data is None:
        p = root / p
    return p, data


def _hub_caches() -> tuple[str, ...]:
    """The folders a data set loaded by Hub name keeps its files in: ``datasets``' cache and the Hub's."""
    import datasets

    folders = [str(datasets.config.HF_DATASETS_CACHE)]
    try:
        from huggingface_hub import constants

        folders.append(str(constants.HF_HUB_CACHE))
    except ImportError:
        pass
    return tuple(folders)


def read_hf(
    source: str | Path,
    images: str | Path | None = None,
    check_images: bool = True,
    *,
    image_column: str = "image",
    caption_column: str = "captions",
    split_column: str = "",
    id_column: str = "",
    splits: Sequence[str] | None = None,
    allow_outside: bool = False,
) -> list[Record]:
    """Records of a Hugging Face data set (module docstring); ``splits`` keeps only those named splits (read
    faster). A row whose image is embedded (bytes, no file) carries them in :attr:`Record.image_bytes`. Image files
    outside the data set's folder are refused unless ``allow_outside`` (``data.allow_outside_paths``)."""
    datasets = _import_datasets()
    parts = _load(source)
    local = Path(source)
    if images is not None:
        root: Path | None = Path(images)
    else:
        root = local.parent if local.is_file() else local if local.is_dir() else None
    folder = ImageFolder(root if root is not None else _hub_caches(), allow_outside)
    records: list[Record] = []
    seen: dict[Any, str] = {}
    for split_name, ds in parts.items():
        if splits is not None and not split_column and split_name not in splits:
            continue
        for col, option in [(image_column, "data.image_column"), (caption_column, "data.caption_column")]:
            _column(ds, col, option, source, split_name)
        for col, option in [(split_column, "data.split_column"), (id_column, "data.id_column")]:
            if col:
                _column(ds, col, option, source, split_name)
        feature = ds.features[image_column]
        if isinstance(feature, datasets.Image) and feature.decode:
            ds = ds.cast_column(image_column, datasets.Image(decode=False))  # bytes/path, not decoded PIL images
        cols = [c for c in (image_column, caption_column, split_column, id_column) if c]
        table = ds.select_columns(list(dict.fromkeys(cols))).to_dict()
        for i in range(len(ds)):
            where = f"{source}: split {split_name!r}, row {i}"
            cell = table[image_column][i]
            path, data = _image_path(cell, root, where)
            if data is None:  # a file, not embedded bytes
                folder.check(path, where, cell.get("path") if isinstance(cell, dict) else cell)
            caps = table[caption_column][i]
            if isinstance(caps, str):
                caps = [caps]
            elif not isinstance(caps, list):
                raise DataError(f"{where}: {caption_column!r} must be a string or a list of strings")
            split = table[split_column][i] if split_column else split_name
            if not isinstance(split, str):
                raise DataError(f"{where}: {split_column!r} must be a string, got {type(split).__name__}")
            image_id = table[id_column][i] if id_column else (str(path) if data is None else f"{split_name}/{i}")
            if isinstance(image_id, bool) or not isinstance(image_id, int | str):
                raise DataError(f"{where}: {id_column!r} must be an int or a string, got {type(image_id).__name__}")
            if image_id in seen:
                raise DataError(f"{where}: duplicate image id {image_id!r} (first in {seen[image_id]})")
            seen[image_id] = where
            records.append(Record(image_id, path, split, _captions(caps, where), image_bytes=data))
    if not records:
        raise DataError(f"{source}: no rows (splits present: {', '.join(parts) or 'none'})")
    if check_images:
        missing = [r.path for r in records if r.image_bytes is None and not r.path.is_file()]
        if missing:
            shown = "\n  ".join(map(str, missing[:MAX_LISTED]))
            raise DataError(f"{source}: {len(missing)} of {len(records)} image files do not exist:\n  {shown}")
    return records
