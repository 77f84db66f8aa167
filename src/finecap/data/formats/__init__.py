"""Data set formats: each one a :class:`Format` spec in a module of its own, named in one registry row.

A format says how finecap finds, reads and identifies a data set of its kind, and nothing outside its module asks
which format it is: :func:`read_dataset` (every command's reader), :func:`detect_format` (``finecap eval
--references``, ``finecap caption --data``), :func:`finecap.train.fingerprint.dataset_fingerprint` (what pins a run to
its data), the record cache of :mod:`finecap.data.datasets` and the stored configuration's paths read the spec.

The built-in formats are the rows of :data:`finecap.registry.DATA_FORMATS` (``name -> "module:FORMAT"``), in the
order :func:`detect_format` tries them: ``world`` (:mod:`.world`), ``hf`` (:mod:`.hf`), ``folder`` (:mod:`.folder`),
``messages`` (:mod:`.messages`), ``jsonl`` (:mod:`.jsonl`), ``coco`` (:mod:`.coco`) and ``karpathy``
(:mod:`.karpathy`); docs/data.md has one table of them all. A format of one's own is a :class:`Format` in one's own
module, named by its dotted path: ``data.format=my_pkg.my_format:FORMAT`` (docs/architecture.md, "How to add a data
format").

Every reader returns :class:`~finecap.data.records.Record` s (one per image) and follows the rules every format
follows: image paths stay inside the data set's image folder (:mod:`finecap.data.containment`), image files are read
only as decoded pixels (:mod:`finecap.data.images`), data files within bounds (:mod:`finecap.data.json_files`), and
bad input is a :class:`~finecap.data.records.DataError` naming the file and the record.

Nothing here imports torch (``finecap eval`` reads its inputs through this package), nor a format's module until
that format is asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from finecap.data.hashing import sha256_file
from finecap.data.images import IMAGE_SUFFIXES
from finecap.data.json_files import forget_json
from finecap.data.records import DataError, Record, check_split_files, check_unique_ids
from finecap.registry import DATA_FORMATS, import_object, is_dotted_path

if TYPE_CHECKING:
    from finecap.config import Config

__all__ = ["FORMATS", "DataSource", "Format", "data_format", "detect_format", "file_fingerprint", "format_options",
           "read_dataset", "registered_formats"]  # fmt: skip

FORMATS = tuple(DATA_FORMATS)
"""The names of the built-in formats, in the order :func:`detect_format` tries them."""


@dataclass(frozen=True)
class DataSource:
    """What a format's reader is asked to read: ``data.*`` as a command resolved it."""

    path: Path
    """``data.path`` (a world's default resolved): a file, a folder, or for a format with ``hub_names`` a name."""
    images: Path | None = None
    """``data.images``: the image root relative image paths start from; ``None``: the format's default."""
    check_images: bool = True
    """Whether every image file named must exist (a :class:`~finecap.data.records.DataError` listing those missing)."""
    allow_outside: bool = False
    """``data.allow_outside_paths``: records may name image files outside the image root."""
    cache_dir: Path | None = None
    """``run.cache_dir`` resolved: where a format may keep what it converts (``hf``: Arrow copies of parquet)."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """The format's own options (:attr:`Format.options`: ``data.hf.*`` for ``hf``), by name."""


def file_fingerprint(path: Path, source: str) -> dict[str, Any]:
    """What identifies a data set that is one file: the SHA-256 of its bytes (the default
    :attr:`Format.fingerprint`)."""
    return {"sha256": sha256_file(path)}


def _same(path: Path) -> Path:
    return path


@dataclass(frozen=True)
class Format:
    """A data set format: the one place that knows how a data set of its kind is found, read and identified.

    Example (a format that reads ``image<TAB>caption`` lines; ``tests/helpers/toy_format.py`` is a whole one)::

        >>> def read_tsv(source: DataSource) -> list[Record]:
        ...     lines = source.path.read_text().splitlines()
        ...     root = source.images or source.path.parent
        ...     return [Record(i, root / i, "", [c]) for i, c in (line.split("\\t") for line in lines)]
        >>> TSV = Format("tsv", read_tsv, detect=lambda p: p if p.suffix == ".tsv" else None)
        >>> TSV.fingerprint is file_fingerprint and TSV.cached
        True
    """

    name: str
    """The format's name: ``data.format``'s value (the registry row's key; for one's own format, any name)."""
    read: Callable[[DataSource], list[Record]]
    """The reader: one :class:`~finecap.data.records.Record` per image, in a stable order."""
    detect: Callable[[Path], Path | None] | None = None
    """``detect(path)``: the data set file to read when ``path`` is of this format (a world folder: its
    ``dataset.json``), else ``None``; :func:`detect_format` asks the built-in formats in registry order. ``None``:
    never detected, only chosen with ``data.format``."""
    fingerprint: Callable[[Path, str], dict[str, Any]] = file_fingerprint
    """``fingerprint(file, source)``: what identifies the data set at ``file`` (:attr:`locate` d; ``source``:
    ``data.path`` as written, a Hub name for instance); merged into the run's data fingerprint
    (:func:`finecap.train.fingerprint.dataset_fingerprint`, which adds the format, the caption field, the split and
    :attr:`options`). Default: the SHA-256 of the file (:func:`file_fingerprint`). Changing what a format's
    fingerprint holds makes runs recorded before it refuse to resume: don't, for a format in use."""
    options: tuple[str, ...] = ()
    """The fields of the format's own nested section ``data.<name>`` the reader takes (:attr:`DataSource.options`;
    ``hf``: its columns, ``data.hf.*``), which are also part of its fingerprint."""
    fingerprint_if_set: tuple[str, ...] = ()
    """Those of :attr:`options` that are part of the fingerprint only when set (not empty): options added after runs
    recorded fingerprints, so that a run recorded before one was added still matches while it is unset."""
    cached: bool = True
    """Whether records read once are reused while ``data.path``'s version is unchanged (:mod:`finecap.data.datasets`:
    :func:`~finecap.data.hashing.tree_version`, a folder's with that of every file below it, as ``save_to_disk``
    rewrites a saved HF data set's files in place); ``False`` when it is read again each time (an image folder)."""
    hub_names: bool = False
    """Whether ``data.path`` may name a data set that is no local file (a Hub name): then it need not exist, and a
    stored configuration keeps a relative one that names no local file as written. A built-in format with it is
    also listed in :data:`finecap.registry.HUB_DATA_FORMATS` (read by the configuration, which imports no format)."""
    own_image_root: bool = False
    """Whether the data set is its own image root (an image folder): ``data.images`` must then be empty or itself,
    and a command given such a data set clears it."""
    locate: Callable[[Path], Path] = _same
    """``locate(path)``: the file ``data.path`` stands for (a world folder: its ``dataset.json``)."""
    default_path: Callable[[Config], Path] | None = None
    """``default_path(cfg)``: the data set read when ``data.path`` is empty (the world), or ``None``: required."""
    split_hint: str = ""
    """How the format names a record's split: what an error about a missing split tells the user to add."""
    caption_hint: str = ""
    """Where its records get captions, for a format whose records may have none (training refuses those)."""


def data_format(name: str, option: str = "data.format") -> Format:
    """The :class:`Format` called ``name``: a built-in one (:data:`finecap.registry.DATA_FORMATS`) or one's own
    ``pkg.module:FORMAT``; an unknown name or a path to something else is a :class:`~finecap.data.records.DataError`
    naming ``option`` and the valid names."""
    if not is_dotted_path(name) and name not in DATA_FORMATS:
        raise DataError(f"unknown data set format {name!r}; valid formats: {', '.join(sorted(FORMATS))} (or a dotted "
                        "path 'pkg.module:FORMAT' to one's own Format)")  # fmt: skip
    spec = import_object(DATA_FORMATS.get(name, name), option)
    if not isinstance(spec, Format):
        raise DataError(f"{option}: {name!r} is a {type(spec).__name__}, not a finecap.data.formats.Format")
    return spec


def registered_formats() -> list[Format]:
    """The built-in formats, in the order :func:`detect_format` tries them."""
    return [data_format(name) for name in DATA_FORMATS]


def format_options(fmt: str, cfg: Config) -> dict[str, Any]:
    """The options of format ``fmt`` (:attr:`Format.options`) as ``cfg`` sets them in its nested section
    ``data.<name>`` (``data.hf``)."""
    spec = data_format(fmt)
    if not spec.options:
        return {}
    section = getattr(cfg.data, spec.name, None)
    missing = [key for key in spec.options if not hasattr(section, key)] if section is not None else list(spec.options)
    if missing:
        raise DataError(f"data.format={fmt}: its options {', '.join(missing)} are no keys of a section "
                        f"data.{spec.name} (a format's options are the keys of its nested section)")  # fmt: skip
    return {key: getattr(section, key) for key in spec.options}


def read_dataset(
    fmt: str,
    path: str | Path,
    images: str | Path | None = None,
    check_images: bool = True,
    allow_outside: bool = False,
    cache_dir: str | Path | None = None,
    **options: Any,
) -> list[Record]:
    """Records of the data set ``path`` of format ``fmt`` (a name or ``pkg.module:FORMAT``): the one reader of every
    format, each image id in one record (:func:`~finecap.data.records.check_unique_ids`, ``1`` and ``"1"`` one id)
    and each image file in one split (:func:`~finecap.data.records.check_split_files`).
    ``images`` (``data.images``) is the image root (default: the format's); ``allow_outside``
    (``data.allow_outside_paths``) lets records name image files outside it (:mod:`finecap.data.containment`);
    ``cache_dir`` (``run.cache_dir`` resolved) is where a format keeps what it converts; ``options`` are the
    format's own (:func:`format_options`)."""
    spec = data_format(fmt)
    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        raise TypeError(f"data.format={fmt}: no option {', '.join(unknown)} (its options: "
                        f"{', '.join(spec.options) or 'none'})")  # fmt: skip
    source = DataSource(Path(path), Path(images) if images is not None else None, check_images, allow_outside,
                        Path(cache_dir) if cache_dir is not None else None, options)  # fmt: skip
    try:
        records = spec.read(source)
    except IsADirectoryError:
        if not source.path.is_dir():
            raise
        raise DataError(_folder_for_a_file(fmt, source)) from None
    check_unique_ids(records, Path(path))  # every format, one's own too: one record per image
    check_split_files(records, Path(path))  # and each image file in one split
    return records


def _folder_for_a_file(fmt: str, source: DataSource) -> str:
    """What to say when the format ``fmt`` reads a file and ``source.path`` is a folder: the format the folder reads
    as, when one does (a folder of images with captions is ``data.format=folder``), with ``data.images=`` emptied when
    that format's data set is its own image root and another root is given (a ``coco/*`` recipe's)."""
    path = source.path
    try:
        found, _ = detect_format(path)
    except (OSError, ValueError):
        found = None
    if found is None or found == fmt:
        return f"{path}: a folder, but data.format={fmt} reads a file"
    other_root = source.images is not None and str(source.images) and source.images.resolve() != path.resolve()
    images = " data.images=" if data_format(found).own_image_root and other_root else ""
    return f"{path}: a folder, but data.format={fmt} reads a file; it reads as data.format={found}{images}"


def detect_format(path: str | Path) -> tuple[str, Path]:
    """``(format, file)`` of a data set file or folder, as the first built-in format whose :attr:`Format.detect`
    recognises it (docs/data.md, "Format detection"); a ``FileNotFoundError`` or ``ValueError`` naming ``path``
    when none does."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: reference file not found (a Hugging Face Hub data set: data.format=hf)")
    for spec in registered_formats():
        found = spec.detect(path) if spec.detect is not None else None
        if found is not None:
            return spec.name, found
    forget_json()  # what a detector parsed is no reader's
    if path.is_dir():
        raise FileNotFoundError(
            f"{path}: a folder, but neither a world (dataset.json), a Hugging Face data set, nor image files "
            f"({', '.join(IMAGE_SUFFIXES)}) in it"
        )
    raise ValueError(
        f"{path}: unrecognised reference format; expected a world folder, Karpathy JSON ('images' with "
        "'sentences'), COCO annotations ('images' + 'annotations'), JSONL or chat JSONL ('messages')"
    )
