"""The files of a Hugging Face data set on disk (``data.format=hf``), found and checked before ``datasets`` reads them.

A local source (:func:`local_splits`) is one of:

- a ``save_to_disk`` folder: ``dataset_dict.json`` names its splits, each a folder whose ``state.json`` lists the
  split's Arrow files (``_data_files[*].filename``); a lone ``Dataset`` has its ``state.json`` at the top;
- a ``.parquet`` / ``.arrow`` file: one split, named from the file name as COCO files are (train/val/test, default
  test);
- a folder of such files, split by their names as ``datasets.load_dataset(folder)`` splits them
  (``data/train-00000-of-00002.parquet``, ``test.parquet``, ``train/shard.parquet``:
  ``datasets.data_files.get_data_patterns``). Its ``README.md`` is not read: its ``configs`` may name files anywhere.

**Contained.** ``datasets`` joins the paths written in ``dataset_dict.json`` and ``state.json`` to the folder as
written, so a split ``../../elsewhere`` or a file ``/home/me/private.arrow`` would be read. Here every such path must
lie inside the data set folder once ``..`` and symbolic links are resolved (absolute paths are refused), and name a
split or file no earlier entry named, or it is one :class:`~finecap.data.records.DataError` naming the JSON file, the
entry and the path. The JSON files are read only up to :data:`MAX_METADATA_BYTES` and checked field by field (a
missing ``_data_files`` is named, not a ``KeyError``).

**Checked.** Every data file is opened before ``datasets`` reads it: a parquet file by its footer (its row count), an
Arrow file by memory-mapping its record batches (their framing, not their contents: nothing is copied). A truncated,
damaged or foreign file is one error naming the file and its split. A split of no rows is kept out of reading
(``datasets`` refuses one; :func:`finecap.data.formats.hf.read_hf` names a data set with no rows at all).

**Written nowhere but the finecap cache.** Arrow files (``save_to_disk`` shards, ``.arrow`` files) are memory-mapped
where they are (``datasets.Dataset.from_file``): nothing is written. Parquet files, and Arrow files in the IPC *file*
format (which ``datasets`` cannot memory-map in place), are converted once into memory-mapped Arrow files by
``datasets.load_dataset`` with its ``cache_dir`` in the finecap cache, ``<cache>/hf_datasets`` (:data:`HF_CACHE`;
``datasets`` would otherwise write ``~/.cache/huggingface/datasets``). Why convert rather than read parquet directly
with ``pyarrow``: parquet compresses each column by row group (``datasets`` writes 100 images a group), so reading
one row's image decodes its whole group, and a training epoch reads rows in random order, each group once per image
in it; reading the whole column instead would hold every image in memory. The memory-mapped Arrow copy reads one
image by its offsets, so reading stays lazy (records hold no image bytes, :mod:`finecap.data.formats.hf`). The copy is
made once per file version (``datasets`` keys it on the files' paths and modification times) and shared by every run,
as the feature caches are; deleting it is safe.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finecap.data.containment import ImageFolder
from finecap.data.records import MAX_LISTED, DataError, split_from_name
from finecap.utils.reading import JSONRefused, read_json
from finecap.utils.text import one_line, short_repr

__all__ = ["HF_CACHE", "HF_FILE_SUFFIXES", "MAX_METADATA_BYTES", "SplitFiles", "local_splits", "open_split"]

HF_FILE_SUFFIXES = (".parquet", ".arrow")
HF_CACHE = "hf_datasets"
"""The folder of the finecap cache (``run.cache_dir``, default ``<finecap home>/cache``) holding the Arrow copies of
parquet files."""
MAX_METADATA_BYTES = 16 * 2**20
"""Bytes of a ``dataset_dict.json`` / ``state.json`` read at most: ``datasets`` writes a few hundred bytes, plus about
fifty per Arrow shard, so 16 MiB is over 300,000 shards; a larger file is no data set's and is refused unread."""
ARROW_FILE_MAGIC = b"ARROW1"
"""The first bytes of an Arrow IPC *file* (``datasets`` writes the IPC *stream* format, which starts otherwise)."""


@dataclass(frozen=True)
class SplitFiles:
    """One split of a local Hugging Face data set: its ``name``, its data ``files`` (checked), its ``rows`` and how
    to read them (``kind``: ``"arrow"``, memory-mapped in place; ``"arrow-file"`` / ``"parquet"``, converted once
    into the finecap cache); ``fingerprint``: ``state.json``'s ``_fingerprint`` of a saved split; ``entry``: the
    split's name in ``dataset_dict.json`` (``""`` for a lone saved ``Dataset``)."""

    name: str
    kind: str
    files: tuple[Path, ...]
    rows: int
    fingerprint: str | None = None
    entry: str = ""

    def shown(self) -> str:
        """``split 'NAME' (file, ...)``, for messages."""
        files = ", ".join(map(str, self.files[:MAX_LISTED])) + (", ..." if len(self.files) > MAX_LISTED else "")
        return f"split {self.name!r} ({files or 'no files'})"


def _read_metadata(path: Path, where: str) -> Any:
    """The JSON of ``dataset_dict.json`` / ``state.json`` at ``path`` (named by ``where`` when missing), bounded."""
    if not path.is_file():
        what = "is not a file" if path.exists() else "does not exist"
        raise DataError(f"{where}: {path} {what} (the data set folder is incomplete: save the data set again)")
    size = path.stat().st_size
    if size > MAX_METADATA_BYTES:
        raise DataError(
            f"{path}: {size:,} bytes, more than the {MAX_METADATA_BYTES:,} a Hugging Face data set's {path.name} "
            "holds (finecap.data.hf_files.MAX_METADATA_BYTES); refused unread (no data set's file, or a damaged one)"
        )
    try:
        return read_json(path)
    except JSONRefused as e:
        if e.kind != "encoding":
            raise
        raise DataError(f"{path}: not UTF-8 text ({e.detail}); not a Hugging Face data set's {path.name}") from None


def _contained(folder: ImageFolder, base: Path, written: Any, where: str) -> Path:
    """``base / written``, a path read from a data set's JSON at ``where``, refused unless it is a relative path that
    resolves inside ``folder`` (the data set folder)."""
    if not isinstance(written, str) or not written or "\0" in written:
        raise DataError(f"{where}: must be a path relative to the data set folder, got {short_repr(written)}")
    root = " or ".join(folder.reals)
    if os.path.isabs(written):
        raise DataError(
            f"{where}: {short_repr(written, 300)} is an absolute path; refused (a saved data set names its files "
            f"relative to its folder {root}, and finecap reads nothing outside it)"
        )
    path = base / written
    if not folder.inside(path):
        raise DataError(
            f"{where}: {short_repr(written, 300)} resolves to {folder.real_path(path)}, outside the data set folder "
            f"{root}; refused (a data set names only files inside its folder)"
        )
    return path


def _once(seen: dict[str, str], path: Path, where: str) -> Path:
    """``path``, refused when an earlier entry (``seen``: real path -> entry) named the same file or folder: a data set
    lists each split and file once, and a file listed thousands of times would be read as many times."""
    real = os.path.realpath(path)
    if real in seen:
        raise DataError(f"{where}: names {real} again (as {seen[real]}); refused (a data set lists each split and "
                        "data file once)")  # fmt: skip
    seen[real] = where
    return path


def _arrow_format(path: Path) -> str:
    with path.open("rb") as f:
        return "arrow-file" if f.read(len(ARROW_FILE_MAGIC)) == ARROW_FILE_MAGIC else "arrow"


def _rows(path: Path, kind: str, split: str, where: str) -> int:
    """The rows of data file ``path`` (``kind``) of ``split``, opening it as :func:`open_split` will."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.is_file():
        what = "is not a file" if path.exists() else "does not exist"
        raise DataError(f"{path}: split {split!r}: the data file {what} (named by {where})")
    try:
        if kind == "parquet":
            return pq.ParquetFile(path).metadata.num_rows
        with pa.memory_map(str(path)) as source:
            reader = pa.ipc.open_file(source) if kind == "arrow-file" else pa.ipc.open_stream(source)
            return reader.read_all().num_rows  # memory-mapped: the batches' framing is checked, nothing copied
    except (pa.ArrowException, OSError) as e:
        what = "parquet" if kind == "parquet" else "Arrow"
        raise DataError(
            f"{path}: split {split!r}: not a readable {what} file ({one_line(e)}); it is damaged (truncated?) or not "
            f"{what}: copy it again from where it came from, or save the data set again"
        ) from None


def _checked(name: str, kind: str, files: Sequence[Path], where: str, **more: Any) -> SplitFiles:
    rows = sum(_rows(f, kind, name, where) for f in files)
    return SplitFiles(name, kind, tuple(files), rows, **more)


def _state_split(folder: ImageFolder, state: Path, name: str, entry: str, where: str) -> SplitFiles:
    """The split whose ``state.json`` is ``state`` (named by ``where``)."""
    meta = _read_metadata(state, where)
    listed = meta.get("_data_files") if isinstance(meta, dict) else None
    if not isinstance(listed, list):
        raise DataError(
            f"{state}: no '_data_files' list (the Arrow files of split {name!r}); not a `datasets` save_to_disk "
            "folder, or a damaged one: save the data set again"
        )
    files: list[Path] = []
    seen: dict[str, str] = {}
    for i, item in enumerate(listed):
        at = f"{state}: _data_files[{i}].filename"
        written = item.get("filename") if isinstance(item, dict) else item
        files.append(_once(seen, _contained(folder, state.parent, written, at), at))
    fingerprint = meta.get("_fingerprint")
    fingerprint = fingerprint if isinstance(fingerprint, str) else None
    return _checked(name, "arrow", files, str(state), fingerprint=fingerprint, entry=entry)


def saved_splits(path: Path) -> list[SplitFiles]:
    """The splits of the ``save_to_disk`` folder ``path`` (module docstring), every path contained and checked."""
    folder = ImageFolder(path)
    listing = path / "dataset_dict.json"
    if not listing.exists():
        return [_state_split(folder, path / "state.json", split_from_name(path), "", str(path))]
    meta = _read_metadata(listing, str(listing))
    names = meta.get("splits") if isinstance(meta, dict) else None
    if not isinstance(names, list):
        raise DataError(f'{listing}: expected {{"splits": [split names]}}, got {short_repr(meta)}')
    splits = []
    seen: dict[str, str] = {}
    for i, name in enumerate(names):
        where = f"{listing}: splits[{i}]"
        split_dir = _once(seen, _contained(folder, path, name, where), where)
        if not split_dir.is_dir():
            raise DataError(f"{where}: split {name!r} is missing (no folder {split_dir}); save the data set again")
        splits.append(_state_split(folder, split_dir / "state.json", name, name, where))
    return splits


def _folder_files(folder: Path) -> dict[str, list[Path]]:
    """``{split: data files}`` of a folder of parquet / Arrow files, split by name as ``datasets`` does."""
    from datasets.data_files import DataFilesDict, get_data_patterns

    try:
        found = DataFilesDict.from_patterns(get_data_patterns(str(folder)), base_path=str(folder))
    except FileNotFoundError:  # datasets' EmptyDatasetError and DataFilesNotFoundError: no data file found
        found = {}
    data = {str(name): [Path(f) for f in files if Path(f).suffix in HF_FILE_SUFFIXES] for name, files in found.items()}
    splits = {name: files for name, files in data.items() if files}
    if not splits:
        raise DataError(
            f"{folder}: no {' or '.join(HF_FILE_SUFFIXES)} files and no dataset_dict.json / state.json in it; "
            "data.format=hf reads a `datasets` save_to_disk folder, parquet / Arrow files or a folder of them"
        )
    suffixes = {f.suffix for files in splits.values() for f in files}
    if len(suffixes) > 1:
        raise DataError(
            f"{folder}: holds both .parquet and .arrow data files; finecap reads one kind per folder: move the others "
            "out, or name one file as data.path"
        )
    return splits


def _file_kind(path: Path) -> str:
    return "parquet" if path.suffix == ".parquet" else _arrow_format(path)


def local_splits(path: Path) -> list[SplitFiles]:
    """The splits of the local Hugging Face data set ``path`` (module docstring), every file checked."""
    if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
        return saved_splits(path)
    if path.is_dir():
        splits = []
        for name, files in _folder_files(path).items():
            kinds = {_file_kind(f) for f in files}
            kind = "arrow-file" if "arrow-file" in kinds else kinds.pop()  # converted alike when any needs it
            splits.append(_checked(name, kind, files, str(path)))
        return splits
    if path.suffix not in HF_FILE_SUFFIXES:
        raise DataError(f"{path}: data.format=hf reads {', '.join(HF_FILE_SUFFIXES)} files or data set folders")
    return [_checked(split_from_name(path), _file_kind(path), [path], str(path))]


def open_split(split: SplitFiles, cache: Path) -> Any:
    """The ``datasets.Dataset`` of ``split`` (rows as stored, no format set): its Arrow files memory-mapped in place,
    or its parquet files converted once into ``cache / HF_CACHE`` (module docstring)."""
    import datasets

    try:
        if split.kind == "arrow":
            parts = [datasets.Dataset.from_file(str(f)) for f in split.files]
            return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
        builder = "parquet" if split.kind == "parquet" else "arrow"
        files = {split.name: [str(f) for f in split.files]}
        return datasets.load_dataset(builder, data_files=files, split=split.name, cache_dir=str(cache / HF_CACHE))
    except Exception as e:  # noqa: BLE001 (datasets and pyarrow raise many kinds on a damaged file; named here)
        raise DataError(
            f"{split.shown()}: cannot read it as a Hugging Face data set ({one_line(e)}); a data file is damaged or "
            "its columns do not agree with its schema: copy it again, or save the data set again"
        ) from None
