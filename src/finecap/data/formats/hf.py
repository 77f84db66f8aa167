"""Hugging Face ``datasets`` as a caption data set format (``data.format=hf``), read into :class:`Record` s.

``data.path`` is one of:

- a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``;
- a ``.parquet`` / ``.arrow`` file, or a folder of them (splits named after the file names as
  ``load_dataset(folder)`` names them, e.g. ``data/train-00000-of-00001.parquet``);
- a Hub name such as ``yerevann/coco-karpathy`` (``datasets.load_dataset(name)``; needs a network or the local
  Hugging Face cache, which it writes, as any ``datasets`` program does; nothing else in finecap downloads).

A local data set's files are found, contained in its folder and checked by :mod:`finecap.data.hf_files`: its Arrow
files are memory-mapped where they are, its parquet files converted once into the finecap cache; nothing else is
written (not ``~/.cache/huggingface``, not the working directory).

Columns (the ``data.hf`` section's options, see :func:`read_hf`): ``image_column`` holds the image (an ``Image``
feature, embedded bytes or a path, or a path string; relative paths are resolved against ``data.images``, by default
the folder of the file or the saved data set folder), ``image_folder_column`` (optional) a folder joined before the
image column's path (a Hub copy of Karpathy's ``dataset_coco.json``, ``yerevann/coco-karpathy``: ``filepath``
``val2014`` and ``filename`` ``COCO_val2014_...jpg``, joined as the ``karpathy`` reader joins them: docs/data.md,
"Karpathy's splits from the Hub"; an embedded image with it is refused), ``caption_column`` the reference captions (a
string, or a list of strings per row), ``split_column`` (optional) each row's split (read as every reader reads a
record's split, :class:`~finecap.data.records.SplitKeys`: ``"Train"`` and ``"validation"`` as ``train`` and ``val``
and said, Karpathy's ``restval`` kept, trained on with ``train``, ``"dev"`` kept and warned about), else the splits
are the data set's named splits (a lone unnamed split, as a file gives, takes its split from the file name like COCO
files do: ``train``/``val``/``test``, default ``test``; Hugging Face's
``validation``, and ``training``/``testing``, are read as ``val``, ``train`` and ``test`` unless the data set also has
a split of that name: :func:`split_read_as`); ``id_column`` (optional) the image id, else the image path, else
``<split>/<row>``; ``questions_column`` (optional) each image's multiple-choice questions for the ``qa_utility``
reward, a list per row in CapRL's layout as a JSONL line's ``questions``
(:attr:`~finecap.data.records.Record.questions`; a null cell: none for that image). Arrow stores a list of question
objects as structs sharing every key, a key a question lacks as null: those nulls are dropped, so each question reads
as the JSON object it was written as.

A row is one image: an embedded image a later row repeats (the same file name in its cell and the same bytes: a data
set of one row per caption) is refused in one split without ``id_column``, and in two splits (or none) always
(:class:`_RepeatedImages`), as JSONL lines naming one image file are.

Image files must lie inside the data set's image folder (:class:`finecap.data.containment.ImageFolder`, refused
otherwise unless ``data.allow_outside_paths=true``): ``data.images`` when given, else the folder of a parquet/arrow
file or the saved data set folder, else, for a Hub name, the Hugging Face caches its files were downloaded to
(``datasets``' and ``huggingface_hub``'s). Embedded images (bytes) are not files and are not checked.

**Lazy.** A data set stays memory-mapped Arrow, as ``datasets`` keeps it: :func:`read_hf` reads the caption, split and
id columns, and of the image column only each row's path and whether it holds bytes (the column's validity bitmap
and offsets, never its image bytes). A record with an embedded image carries an :class:`ArrowImage`, a reference
(the split's image column and the row) that reads the encoded image when it is decoded: in a DataLoader worker, one
item at a time. So reading COCO (about 19 GB of JPEGs) costs the memory of its captions; the pages of the Arrow file
an epoch reads are the operating system's file cache, which the kernel reclaims. ``benchmarks/data_memory.py``
measures it (docs/data.md, "Lazy Hugging Face data sets").

``datasets`` is an optional dependency (``pip install 'finecap[hf]'``), imported only when such a data set is read:
text-only ``finecap eval`` never imports it.

**Detected**: a ``save_to_disk`` folder (``dataset_dict.json`` or ``state.json``), a ``.parquet`` / ``.arrow`` file or
a folder holding some (:func:`is_hf_path`). **Fingerprint**: the ``datasets`` fingerprint of every split of a
``save_to_disk`` folder (``state.json``'s ``_fingerprint``), the SHA-256 of parquet / arrow files, or for a Hub name
the name and the revision in the local Hugging Face cache; with the column options.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finecap.config import did_you_mean
from finecap.data.containment import ImageFolder
from finecap.data.formats import DataSource, Format
from finecap.data.hashing import hub_revision, sha256_file, sha256_files
from finecap.data.hf_files import HF_FILE_SUFFIXES, SplitFiles, local_splits, open_split, saved_splits
from finecap.data.records import (
    MAX_LISTED,
    NO_SPLIT,
    DataError,
    Record,
    SplitKeys,
    check_id,
    clean_captions,
    compared_split,
    read_questions_field,
    split_from_name,
    split_named,
)
from finecap.home import CACHE, home
from finecap.utils.system import MissingExtra
from finecap.utils.text import short_repr

log = logging.getLogger(__name__)

__all__ = ["FORMAT", "HF_FILE_SUFFIXES", "ArrowImage", "ArrowImages", "is_hf_path", "read_hf"]


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
        raise MissingExtra(
            "data.format=hf needs the Hugging Face `datasets` package: pip install 'finecap[hf]' (or datasets)"
        ) from None
    return datasets


def split_read_as(name: str, names: Collection[str]) -> str:
    """The finecap split a data set's split ``name`` is read as, among its splits ``names``: Hugging Face's
    ``validation`` as ``val`` (and ``valid``, ``training``, ``testing``, or ``Train``: as a record's ``"split"`` is
    read, :func:`~finecap.data.records.split_named`), unless the data set also has a split of that name; any other
    name as written.

    Example::

        >>> split_read_as("validation", ["train", "validation", "test"]), split_read_as("validation", ["val", "validation"])
        ('val', 'validation')
    """  # noqa: E501
    read_as = split_named(name) or name
    return read_as if read_as == name or read_as not in names else name


def _load(source: str | Path, splits: Sequence[str] | None, cache: Path) -> tuple[dict[str, Any], list[SplitFiles]]:
    """``{split name: Dataset}`` of a local data set (its files checked and contained: :mod:`finecap.data.hf_files`;
    only the ``splits`` named, when given; splits of no rows left out) or of a Hub name, and the local splits read.
    Nothing is written but the Arrow copies of parquet files, in ``cache``; a Hub name is downloaded to, and read
    from, the Hugging Face caches, as ``datasets`` does."""
    datasets = _import_datasets()
    path = Path(source)
    if path.exists():
        found = local_splits(path)
        names = [s.name for s in found]
        wanted = [s for s in found if s.rows and (splits is None or s.name in splits
                                                   or split_read_as(s.name, names) in splits)]  # fmt: skip
        return {s.name: open_split(s, cache) for s in wanted}, found
    try:
        loaded = datasets.load_dataset(str(source))
    except Exception as e:  # noqa: BLE001 (datasets raises many kinds; the message names the source)
        raise DataError(f"{source}: cannot load it as a Hugging Face data set Hub name (no such local file or "
                        f"folder): {e}") from None  # fmt: skip
    if isinstance(loaded, datasets.Dataset):
        return {split_from_name(path): loaded}, []
    return dict(loaded), []


def _column(ds: Any, name: str, option: str, source: Any, split: str) -> None:
    if name not in ds.column_names:
        hint = did_you_mean(name, ds.column_names)
        raise DataError(
            f"{source} (split {split!r}): no column {short_repr(name)} ({option}); columns: "
            f"{', '.join(ds.column_names)}{hint}"
        )


def _image_cells(ds: Any, column: str, where: Any) -> tuple[list[str | None], list[int | None]]:
    """Per row of the image column of ``ds`` (a memory-mapped ``datasets.Dataset``): the path written in it (``None``
    when none) and the length of the bytes it embeds (``None`` when none: a file), read without touching the image
    bytes (the column's validity bitmap, its ``path`` strings and its bytes' offsets). ``where(i)`` names row ``i`` in
    errors."""
    import pyarrow as pa
    import pyarrow.compute as pc

    array = ds.data.column(column)  # a ChunkedArray backed by the memory-mapped file
    kind = array.type
    if pa.types.is_struct(kind):  # an Image feature, or a {"bytes", "path"} struct
        names = [kind.field(k).name for k in range(kind.num_fields)]
        # null: a field no row fills (pyarrow and pandas type {"bytes": b, "path": None} cells so)
        stored = {"bytes": (pa.binary(), pa.large_binary(), pa.null()), "path": (pa.string(), pa.large_string(),
                                                                                 pa.null())}  # fmt: skip
        for name, types in stored.items():  # a forged column's fields would reach the image decoder as other values
            if name in names and kind.field(name).type not in types:
                raise DataError(f"{where(0)}: the image column's field {name!r} must be {types[0]}, "
                                f"got {kind.field(name).type}")  # fmt: skip
        missing = pc.is_null(array).to_pylist()
        paths = pc.struct_field(array, "path").to_pylist() if "path" in names else [None] * len(array)
        filled = "bytes" in names and kind.field("bytes").type != pa.null()  # null: no row embeds bytes
        sizes = (pc.binary_length(pc.struct_field(array, "bytes")).to_pylist() if filled
                 else [None] * len(array))  # the offsets only; null: no bytes  # fmt: skip
        for i, (gone, path, size) in enumerate(zip(missing, paths, sizes, strict=True)):
            if gone:
                raise DataError(f"{where(i)}: image must be an Image feature or a path string, got NoneType")
            if size is None and not path:
                raise DataError(f"{where(i)}: image has neither bytes nor a path")
        return paths, sizes
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        paths = array.to_pylist()
        for i, path in enumerate(paths):
            if path is None:
                raise DataError(f"{where(i)}: image must be an Image feature or a path string, got NoneType")
        return paths, [None] * len(paths)
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):  # pandas' bytes: the file's bytes, untyped
        raise DataError(f"{where(0)}: the image column {column!r} holds raw bytes, not an Image feature; cast it once "
                        f"and save it: ds = ds.cast_column({column!r}, datasets.Image()); ds.to_parquet(...) (or "
                        "save_to_disk)")  # fmt: skip
    value = array[0].as_py() if len(array) else None
    raise DataError(f"{where(0)}: image must be an Image feature or a path string, got {type(value).__name__}")


def _in_folders(folders: list[Any], names: list[str | None], sizes: list[int | None], column: str,
                where: Any) -> list[str | None]:  # fmt: skip
    """The image paths of rows naming their image by a folder (``column``, ``data.hf.image_folder_column``) and a file
    name (the image column's path, ``names``): ``folder/name``, joined as the ``karpathy`` reader joins
    ``filepath`` and ``filename`` (an empty folder: the name alone). A row embedding its image (``sizes``: the length
    of its bytes) names no file to find in a folder, and a folder cell that is no string names none: both a
    :class:`DataError` naming the row (``where(i)``)."""
    paths: list[str | None] = []
    for i, (folder, name, size) in enumerate(zip(folders, names, sizes, strict=True)):
        if size is not None:
            raise DataError(f"{where(i)}: the image is embedded (bytes), and data.hf.image_folder_column="
                            f"{short_repr(column)} joins a folder to the path of an image file; leave it empty "
                            "to read the embedded image, or name a column of file names as "
                            "data.hf.image_column")  # fmt: skip
        if not isinstance(folder, str):
            raise DataError(f"{where(i)}: the folder column {short_repr(column)} (data.hf.image_folder_column) must "
                            f"be a string, got {type(folder).__name__}")  # fmt: skip
        paths.append(os.path.join(folder, str(name)))  # a file's row has a path (_image_cells refuses one without)
    return paths


def _image_path(written: str | None, embedded: bool, root: Path | None, where: str) -> Path:
    """The path of an image cell (``written`` in the data set; for embedded bytes only a name, kept as written)."""
    p = Path(written) if written else Path(where.replace(" ", "_"))
    if not p.is_absolute() and root is not None and not embedded:
        p = root / p
    return p


class ArrowImages:
    """The image column of one split, memory-mapped: :meth:`read` returns one row's encoded image.

    Holds a ``datasets.Dataset`` of that column alone (the image feature not decoded); pickling it (DataLoader
    workers started by ``spawn``) sends its file paths, not its contents, as ``datasets`` pickles memory-mapped
    tables. :meth:`key` identifies its stored version by its Arrow files (path, size, modification time), as
    :func:`finecap.data.features.fingerprint_data` identifies image files: the image-feature cache is keyed without
    reading every image. The key has no change time (it is the key of the features users have cached, which
    another key would have them all compute again); :attr:`changed_ns` holds it instead: the latest change time of
    the files, which a cached entry written before it is not trusted for (a file replaced by another of the same
    size and modification time, ``cp -p``: :func:`finecap.data.features.data_changed_ns`). ``where`` names the split
    in messages (``<data set>: split 'train'``)."""

    def __init__(self, ds: Any, column: str, where: str = "") -> None:
        self.dataset = ds.select_columns([column])
        self.column = column
        self.where = where
        files = [c["filename"] for c in ds.cache_files]
        self.identity: str | None = None
        self.changed_ns: int | None = None
        # Rows are numbered as the files store them only without an indices mapping (load_from_disk and
        # load_dataset give none); otherwise, and for a data set held in memory, images are hashed by content.
        if files and getattr(ds, "_indices", None) is None:
            stats = [os.stat(f) for f in files]
            self.identity = json.dumps([[f, st.st_size, st.st_mtime_ns] for f, st in zip(files, stats, strict=True)])
            self.changed_ns = max(st.st_ctime_ns for st in stats)

    def read(self, row: int) -> bytes:
        data = self.dataset[row][self.column]["bytes"]
        if data is None:  # only rows with bytes get an ArrowImage
            raise DataError(f"row {row} of the image column {self.column!r} holds no bytes")
        return data


@dataclass(frozen=True)
class ArrowImage:
    """An embedded image: row ``row`` of ``images`` (:class:`finecap.data.records.EmbeddedImage`)."""

    images: ArrowImages
    row: int

    def read(self) -> bytes:
        return self.images.read(self.row)

    @property
    def where(self) -> str:
        """The data set, split and row holding the image, for messages (a bad image is named by them)."""
        return f"{self.images.where or 'image column ' + repr(self.images.column)}, row {self.row}"

    def key(self) -> str | None:
        return None if self.images.identity is None else f"arrow:{self.images.identity}:{self.row}"

    def changed_ns(self) -> int | None:
        """When the files :meth:`key` names last changed (:attr:`ArrowImages.changed_ns`); ``None`` with no key."""
        return self.images.changed_ns


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


def _splits_present(found: list[SplitFiles], parts: dict[str, Any]) -> str:
    """The splits of a data set, for messages: a local one's with their files and rows, else the names loaded."""
    if found:
        return ", ".join(f"{s.shown()}: {s.rows} rows" for s in found)
    return ", ".join(parts) or "none"


def read_hf(
    source: str | Path,
    images: str | Path | None = None,
    check_images: bool = True,
    *,
    image_column: str = "image",
    image_folder_column: str = "",
    caption_column: str = "captions",
    split_column: str = "",
    id_column: str = "",
    questions_column: str = "",
    splits: Sequence[str] | None = None,
    allow_outside: bool = False,
    cache_dir: str | Path | None = None,
) -> list[Record]:
    """Records of a Hugging Face data set (module docstring); ``splits`` keeps only those named splits (read
    faster; a split is named by its name or as it is read: ``val`` names ``validation``), and a name the data set
    has no split of is a :class:`DataError` listing those present; with ``split_column``, ``splits`` keeps the rows
    whose split, as read (``"Train"`` is ``train``), is named, and a name no row has is a :class:`DataError` listing
    the splits of the column with their rows. A row whose image is embedded (bytes, no file) carries a reference to
    them (:class:`ArrowImage`, read when the image is decoded: module docstring) in :attr:`Record.image_ref`. Image
    files outside the data set's folder are refused unless ``allow_outside`` (``data.allow_outside_paths``).
    ``cache_dir`` (``run.cache_dir``; default ``<finecap home>/cache``) holds the Arrow copies of parquet files
    (:mod:`finecap.data.hf_files`)."""
    datasets = _import_datasets()
    cache = Path(cache_dir) if cache_dir is not None else home() / CACHE
    parts, found = _load(source, None if split_column else splits, cache)
    names = [s.name for s in found] if found else list(parts)
    if splits is not None and not split_column:  # a split asked for and absent is no empty data set
        present = set(names) | {split_read_as(name, names) for name in names}
        missing = [name for name in splits if name not in present]
        if missing:
            raise DataError(f"{source}: no split {', '.join(map(repr, missing))} in the data set (splits present: "
                            f"{_splits_present(found, parts)})")  # fmt: skip
    local = Path(source)
    if images is not None:
        root: Path | None = Path(images)
    else:
        root = local.parent if local.is_file() else local if local.is_dir() else None
    folder = ImageFolder(root if root is not None else _hub_caches(), allow_outside)
    records: list[Record] = []
    seen: dict[Any, str] = {}
    column_splits = SplitKeys(source)
    column_rows: dict[str, int] = {}  # rows per split of split_column, as read
    repeats = _RepeatedImages(bool(id_column))
    for split_name, ds in parts.items():
        # a split asked for by its own name (--split validation) keeps it
        read_as = split_name if splits is not None and split_name in splits else split_read_as(split_name, names)
        if splits is not None and not split_column and read_as not in splits:
            continue
        if read_as != split_name and not split_column:
            log.info("data: %s: split %r read as %r", source, split_name, read_as)
        if not len(ds):  # a Hub split of no rows (local ones are left out by _load)
            continue
        for col, option in [(image_column, "data.hf.image_column"), (caption_column, "data.hf.caption_column")]:
            _column(ds, col, option, source, split_name)
        optional = [(image_folder_column, "image_folder_column"), (split_column, "split_column"),
                    (id_column, "id_column"), (questions_column, "questions_column")]  # fmt: skip
        for col, option in optional:
            if col:
                _column(ds, col, f"data.hf.{option}", source, split_name)
        if getattr(ds, "_indices", None) is not None:  # not from load_from_disk / load_dataset; rows as stored
            ds = ds.flatten_indices()
        feature = ds.features[image_column]
        if isinstance(feature, datasets.Image) and feature.decode:
            ds = ds.cast_column(image_column, datasets.Image(decode=False))  # bytes/path, not decoded PIL images
        text = [c for c in (caption_column, image_folder_column, split_column, id_column, questions_column) if c]
        table = ds.select_columns(list(dict.fromkeys(text))).to_dict()  # no image column: its bytes stay on disk

        def where(i: int, split_name: str = split_name) -> str:
            return f"{source}: split {split_name!r}, row {i}"

        written, sizes = _image_cells(ds, image_column, where)
        if image_folder_column:  # Karpathy's filepath and filename: val2014/COCO_val2014_...jpg
            written = _in_folders(table[image_folder_column], written, sizes, image_folder_column, where)
        embedded = [size is not None for size in sizes]
        arrow = ArrowImages(ds, image_column, f"{source}: split {split_name!r}") if any(embedded) else None
        for i in range(len(ds)):
            split = table[split_column][i] if split_column else read_as
            if not isinstance(split, str):
                raise DataError(f"{where(i)}: {split_column!r} must be a string, got {type(split).__name__}")
            if split_column:  # "Train", " val ": read as train and val, and said, as every reader's split key
                split = column_splits.read({"split": split}, where(i))
                column_rows[split] = column_rows.get(split, 0) + 1
                if splits is not None and split not in splits:  # a row of a split not asked for
                    continue
            path = _image_path(written[i], embedded[i], root, where(i))
            if not embedded[i]:  # a file, not embedded bytes
                folder.check(path, where(i), written[i])
            caps = table[caption_column][i]
            if isinstance(caps, str):
                caps = [caps]
            elif not isinstance(caps, list):
                raise DataError(f"{where(i)}: {caption_column!r} must be a string or a list of strings")
            image_id = table[id_column][i] if id_column else (str(path) if not embedded[i] else f"{split_name}/{i}")
            check_id(image_id, where(i), repr(id_column) if id_column else "image id")
            if image_id in seen:
                raise DataError(f"{where(i)}: duplicate image id {image_id!r} (first in {seen[image_id]})")
            seen[image_id] = where(i)
            ref = ArrowImage(arrow, i) if embedded[i] and arrow is not None else None
            if ref is not None and written[i]:
                repeats.check(ref, written[i], sizes[i], split, where(i), f"split {split_name!r}, row {i}")
            questions = (
                _questions(table[questions_column][i], where(i), questions_column) if questions_column else None
            )
            records.append(Record(image_id, path, split, clean_captions(caps, where(i)), image_ref=ref,
                                  questions=questions))  # fmt: skip
    column_splits.say()
    if splits is not None and split_column:  # a split asked for that no row has is no empty data set either
        missing = [name for name in splits if name not in column_rows]
        if missing:
            present = ", ".join(f"{name!r}: {n} rows" for name, n in column_rows.items()) or "none"
            raise DataError(f"{source}: no row of split {', '.join(map(repr, missing))} in the column "
                            f"{split_column!r} (data.hf.split_column; splits present: {present})")  # fmt: skip
    if not records:
        raise DataError(f"{source}: no rows: an empty data set (splits present: {_splits_present(found, parts)})")
    if check_images:
        missing = [r.path for r in records if not r.embedded and not r.path.is_file()]
        if missing:
            shown = "\n  ".join(map(str, missing[:MAX_LISTED]))
            raise DataError(f"{source}: {len(missing)} of {len(records)} image files do not exist:\n  {shown}")
    return records


class _RepeatedImages:
    """The embedded images of a data set read so far, by the file name their cell writes and the length of their
    bytes, to refuse one row embedding the image of another (the same name and the same bytes) where reading them as
    two images is wrong: in two splits (``restval`` is ``train``) or in none (their ids' hash could part them), as
    :func:`~finecap.data.records.check_split_files` refuses one image file in two splits; and in one split when
    ``data.hf.id_column`` is not set, which a data set of one row per caption gives, and would be read as an image per
    caption with one reference each (scored against one reference, trained on once per caption), as a JSONL file
    naming one image on two lines without ids is refused. Only rows sharing a name and a length are read (the image
    bytes of the others stay in the file); rows without a file name (bytes alone) are not compared: images of one
    stored content under two names are two images, as the data set has them (docs/data.md)."""

    def __init__(self, ids_given: bool) -> None:
        self.ids_given = ids_given
        # by (file name, length): the rows not read yet, and those read, by their bytes' digest; each row's bytes are
        # read at most once, and only once a second row of its name and length comes (no pair is compared twice:
        # a data set of many images of one name and size, fixed-size BMPs named image.bmp, stays linear)
        self.unread: dict[tuple[str, int], list[tuple[ArrowImage, str, str]]] = {}
        self.read: dict[tuple[str, int], dict[bytes, list[tuple[str, str]]]] = {}
        self.splits: dict[tuple[str, int], set[str]] = {}  # the splits its rows are in (restval as train)

    def check(self, ref: ArrowImage, name: str, size: int, split: str, where: str, row: str) -> None:
        """Refuse ``ref`` (in split ``split``, its cell naming ``name``, ``size`` bytes; ``where`` names it in an
        error, ``row`` in a later row's) when it repeats an image read before where the class docstring says; else
        remember it."""
        key, here = (name, size), compared_split(split)
        unread, read = self.unread.setdefault(key, []), self.read.setdefault(key, {})
        splits = self.splits.setdefault(key, set())
        alone = not unread and not read  # the first of its name and length: nothing to compare
        if alone or (self.ids_given and splits == {here} and here != NO_SPLIT):  # ids of their own, one split
            unread.append((ref, split, row))
            splits.add(here)
            return
        splits.add(here)
        for other, other_split, other_row in unread:
            read.setdefault(_digest(other.read()), []).append((other_split, other_row))
        unread.clear()
        digest = _digest(ref.read())
        for other_split, other_row in read.get(digest, []):  # the same bytes under the same name: one image
            a, b = compared_split(other_split), here
            if a == b != NO_SPLIT and self.ids_given:  # ids of their own: the data set's records of one image
                continue
            same = f"{where}: the image of {other_row} again (the same bytes and file name {short_repr(name)})"
            if a != b or a == NO_SPLIT:
                said = f"split {split!r} here, {other_split!r} there" if a != b else "no split"
                raise DataError(f"{same}, in {said}: an image in two splits (or in none: the id hash may part them) "
                                "is trained on and tested on; give it one row, in one split")  # fmt: skip
            raise DataError(f"{same}: each row is read as an image of its own, so a data set of one row per caption "
                            "would give each image a record per caption, with one reference each; give each image "
                            "one row, its captions in a list (data.hf.caption_column), or each row an id of its own "
                            "(data.hf.id_column)")  # fmt: skip
        read.setdefault(digest, []).append((split, row))


def _digest(data: bytes) -> bytes:
    """The SHA-256 of an embedded image's bytes (:class:`_RepeatedImages` keeps digests, not the images)."""
    return hashlib.sha256(data).digest()


def _questions(cell: Any, where: str, column: str) -> list[Any] | None:
    """A row's questions (module docstring): a list as JSON would give it, the nulls Arrow fills into the keys a
    question lacks dropped; a cell that is no list a :class:`DataError` naming the row and the column."""
    questions = read_questions_field(cell, where, f"column {column!r} (data.hf.questions_column)")
    if questions is None:
        return None
    return [{k: v for k, v in q.items() if v is not None} if isinstance(q, dict) else q for q in questions]


OPTIONS = ("image_column", "caption_column", "split_column", "id_column", "questions_column", "image_folder_column")
"""The ``data.hf.*`` column options :func:`read_hf` takes (module docstring)."""


def _read(source: DataSource) -> list[Record]:
    return read_hf(source.path, source.images, source.check_images, allow_outside=source.allow_outside,
                   cache_dir=source.cache_dir, **source.options)  # fmt: skip


def _fingerprint(path: Path, source: str) -> dict[str, Any]:
    """What identifies a Hugging Face data set (module docstring)."""
    if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
        found = {"datasets": {split.entry: split.fingerprint for split in saved_splits(path)}}
    elif path.is_dir():
        files = [p for p in path.rglob("*") if p.is_file() and p.suffix in HF_FILE_SUFFIXES]
        found = {"sha256": sha256_files(path, files)}
    elif path.is_file():
        found = {"sha256": sha256_file(path)}
    else:
        found = {"hub": source, "revision": hub_revision(source, "dataset")}
    return {**found, "kind": "hf"}


FORMAT = Format(
    "hf",
    _read,
    detect=lambda path: path if is_hf_path(path) else None,
    fingerprint=_fingerprint,
    options=OPTIONS,
    fingerprint_if_set=("image_folder_column", "questions_column"),
    hub_names=True,
    split_hint="data.hf.split_column, or a data set with this split",
)
