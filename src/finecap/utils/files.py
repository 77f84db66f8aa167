"""Writing files as the user expects: atomic writes with the user's umask, appends never through a link."""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import json
import math
import os
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

_UMASK_LOCK = threading.Lock()


PROC_STATUS = "/proc/self/status"


def current_umask() -> int:
    """The process's file-mode creation mask now.

    On Linux it is read from :data:`PROC_STATUS` (``Umask:``) at each call, which changes nothing: a notebook that
    changes its umask between two calls gets the new one. Elsewhere the only way is to set a mask and put the old one
    back (``os.umask`` returns the previous value); that is done once (:func:`_umask_by_setting`), under a lock, so no
    thread of finecap creates a file in between.
    """
    try:
        for line in Path(PROC_STATUS).read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return _umask_by_setting()


@functools.cache
def _umask_by_setting() -> int:
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


class OutputRefused(ValueError):
    """An output path finecap will not write (a symbolic link, one of the command's inputs, a file it did not make;
    :mod:`finecap.outputs`); a ``ValueError``: the command line prints the message and exits with code 2."""


def refuse_link(path: str | Path) -> None:
    """:class:`OutputRefused` when ``path`` is a symbolic link (dangling or not): finecap never writes through one,
    and never replaces one (a link planted in a run folder someone shared, which survives ``tar xf``, is named)."""
    if os.path.islink(path):
        raise OutputRefused(
            f"{path}: is a symbolic link (to {os.readlink(path)}); finecap never writes through a link: remove the "
            "link, or choose another output"
        )


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a uniquely named temporary file in the same folder, then rename.

    The one atomic file write of the package (text, JSON and safetensors go through it): readers see the old file or
    the complete new one, never a half-written file, and a write interrupted by an exception or a signal Python
    handles leaves no temporary file behind (a ``SIGKILL`` or a power loss can: ``.<name>.<random>.tmp``). The
    temporary name is unique per call (``mkstemp``), so concurrent writers of the same file never share one; the last
    rename wins. ``mkstemp`` creates its file with mode 0600; it is given :func:`file_mode` before the rename, so the
    file ends up with the mode a plain ``open(path, "w")`` would give (0644 under umask 022, 0600 under 077). A
    symbolic link at ``path`` is refused (:func:`refuse_link`): ``rename`` would not write through it, but a link
    where finecap writes was planted by someone else and is named, never silently replaced. The rename survives a
    power loss (:func:`replace_durably`): after one, ``path`` holds the old file or the complete new one, never an
    empty one.
    """
    path = Path(path)
    refuse_link(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=temporary_prefix(path.name), suffix=TEMPORARY_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            os.chmod(tmp, file_mode())
            f.write(data)
        replace_durably(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


FSYNC_ENV = "FINECAP_FSYNC"
"""``FINECAP_FSYNC=0`` skips every ``fsync`` of :func:`replace_durably` (the renames stay atomic, but a power loss may
undo them or leave a renamed file empty): for throwaway runs on a slow disk, as a database's ``fsync = off``;
finecap's test suite sets it (``conftest.py``), and the tests of the durable path set it back. Unset or ``1``:
synced."""


def syncing() -> bool:
    """Whether :func:`replace_durably` syncs (:data:`FSYNC_ENV`); ``ValueError`` naming the variable for a value
    other than ``0`` or ``1``."""
    value = os.environ.get(FSYNC_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"${FSYNC_ENV} must be 0 (no fsync) or 1 (the default), got {value!r}")
    return value != "0"


def check_fsync_setting() -> None:
    """``ValueError`` naming :data:`FSYNC_ENV` and the values it takes when it holds another: checked when a command
    starts (:func:`finecap.app.cli.main`) and when a training run is set up (:func:`finecap.train.run.train`), so that
    a mistyped value stops the run before its work, not at its first save, maybe hours into training."""
    syncing()


def sync_to_disk(path: str | Path) -> None:
    """Flush what ``path`` holds to the disk (``fsync``): a file's data; a folder's entries, and, all the way down,
    every file and folder in it (symbolic links are not followed). A file system that cannot sync a folder (``EINVAL``:
    some network and FUSE file systems) leaves that folder unsynced; on Windows, where a folder cannot be opened,
    folders are skipped. An error syncing a file's data (``EIO``: the disk lost it) is raised."""
    path = Path(path)
    if path.is_symlink() or not syncing():
        return
    if not path.is_dir():
        _fsync(path, folder=False)
        return
    for folder, _, files in os.walk(path):
        for name in files:
            if not os.path.islink(os.path.join(folder, name)):
                _fsync(Path(folder) / name, folder=False)
        _fsync(Path(folder), folder=True)


def sync_folder(folder: str | Path) -> None:
    """Flush ``folder``'s own entries to the disk (``fsync`` of the folder): a rename in it is then kept across a
    power loss. Skipped where folders cannot be synced (:func:`sync_to_disk`), and under ``FINECAP_FSYNC=0``."""
    if syncing():
        _fsync(Path(folder), folder=True)


def _fsync(path: Path, *, folder: bool) -> None:
    """``fsync`` of ``path`` (a file, or a ``folder``), opened read-only (Linux and macOS sync through any
    descriptor); Windows syncs a file through a writable one only, and cannot open a folder."""
    if folder and os.name == "nt":
        return
    data = os.O_RDWR if os.name == "nt" else os.O_RDONLY
    flags = (os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)) if folder else data
    fd = os.open(path, flags | getattr(os, "O_NOFOLLOW", 0))
    try:
        os.fsync(fd)
    except OSError as e:
        if not (folder and e.errno in FOLDER_SYNC_UNSUPPORTED):
            raise
    finally:
        os.close(fd)


FOLDER_SYNC_UNSUPPORTED = frozenset(
    {errno.EINVAL, errno.EBADF, errno.ENOTSUP, getattr(errno, "EOPNOTSUPP", errno.ENOTSUP)}
)
"""What ``fsync`` of a folder fails with on a file system that does not sync folders: the folder is left unsynced."""


def replace_durably(
    src: str | Path, dst: str | Path, *, previous: str | Path | None = None, synced: bool = False
) -> None:
    """``os.replace(src, dst)`` that a power loss cannot undo half-way: ``src`` (a file, or a folder and everything in
    it) is synced to the disk first (:func:`sync_to_disk`), so ``dst`` never names an empty or partly written file,
    and the folder holding ``dst`` after (:func:`sync_folder`), so the rename is not lost. With ``previous`` (a name
    in the same folder), what stands at ``dst`` is renamed there first, the way a folder swap keeps the replaced
    folder until the new one is in place; when the rename of ``src`` then fails (a disk full or turned read-only), it
    is renamed back before the error is raised. ``synced``: the caller has put ``src`` on the disk itself
    (:func:`sync_to_disk` after its last change, or only durable changes since: an atomic write into it, a synced
    mode), so it is not synced a second time; the folder holding ``dst`` still is, after the renames.

    The one durable rename of the package: every atomic write (:func:`atomic_write_bytes`, the checkpoints' state
    files), every folder swap (:func:`finecap.utils.folders.atomic_replace_dir`, a resume's promotion of a
    checkpoint) and every other rename into place (``finecap models tiny``'s folder or files, boost's link to the
    source images) goes through it."""
    src, dst = Path(src), Path(dst)
    if not synced:
        sync_to_disk(src)  # before the old one is moved aside: a reader finds dst missing for two renames only
    moved = previous is not None and os.path.lexists(dst)
    if moved:
        os.replace(dst, previous)
    try:
        os.replace(src, dst)
    except BaseException:  # e.g. ENOSPC or EROFS on the rename: the previous one goes back in its place
        if moved and not os.path.lexists(dst):
            os.replace(previous, dst)
        raise
    if not _sync_deferred(dst.parent):  # else once, when the caller's one_folder_sync ends
        sync_folder(dst.parent)  # both renames, in one folder


_DEFERRED_SYNCS: ContextVar[frozenset[str]] = ContextVar("finecap_deferred_folder_syncs", default=frozenset())
"""The folders (absolute paths) of the :func:`one_folder_sync` blocks open now."""


def _sync_deferred(folder: Path) -> bool:
    return os.path.abspath(folder) in _DEFERRED_SYNCS.get()


@contextlib.contextmanager
def one_folder_sync(folder: str | Path) -> Iterator[None]:
    """While open, a rename into ``folder`` by :func:`replace_durably` (an atomic write of a file directly in it)
    syncs the renamed file's data first as always, but not ``folder``; ``folder`` is synced once on leaving, also when
    an error leaves the block: one ``fsync`` for many files (a report's plots) instead of one each. Every rename of
    the block is on the disk when it ends, as it is after each one outside it; until then a power loss keeps, at each
    name, the old file or the complete new one, for any of them, rather than the first ones renamed. So a write that
    must be on the disk before the next one is (the list of a report's plots, before its plots:
    :func:`finecap.report.plot_files.write_plots`) is made before the block opens, never in it."""
    key = os.path.abspath(folder)
    token = _DEFERRED_SYNCS.set(_DEFERRED_SYNCS.get() | {key})
    try:
        yield
    finally:
        _DEFERRED_SYNCS.reset(token)
        sync_folder(key)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, obj: Any, indent: int | None = 2) -> None:
    """Write ``obj`` as strict JSON (:func:`strict_json`, plus a final newline) to ``path`` atomically."""
    atomic_write_text(path, strict_json(obj, indent=indent) + "\n")


def strict_json(obj: Any, indent: int | None = 2) -> str:
    """``obj`` as JSON that every reader takes: a float that is no number (SPICE's ``NaN`` for an image, the
    perplexity of an empty caption, ``inf``) is ``null``, never Python's ``NaN`` or ``Infinity`` tokens, which
    ``jq``, JavaScript's ``JSON.parse`` and strict parsers refuse. Every JSON file finecap writes goes through it
    (:func:`write_json`, :func:`append_jsonl`, :func:`finecap.outputs.write_output_json`); a run's records that must
    keep a value's kind (``metrics.jsonl``, ``trainer_state.json``) name it first (:func:`finecap.runs.encode_event`).

    >>> strict_json({"SPICE": float("nan"), "rows": [1.5, float("inf")]}, indent=None)
    '{"SPICE": null, "rows": [1.5, null]}'
    """
    return json.dumps(_finite_or_none(obj), indent=indent, allow_nan=False)


def _finite_or_none(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {k: _finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite_or_none(v) for v in obj]
    return obj


def open_append(path: str | Path) -> io.TextIOWrapper:
    """``path`` opened for appending text (created with the umask's mode when missing), never through a symbolic
    link: ``O_NOFOLLOW`` makes the kernel refuse a link at ``path`` even if one is planted after the check."""
    path = Path(path)
    refuse_link(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            refuse_link(path)  # the link appeared after the check: name it
        raise
    return open(fd, "a", encoding="utf-8")  # noqa: SIM115 (the caller closes it)


def png_bytes(image: Any, **options: Any) -> bytes:
    """A PIL image encoded as PNG (``options``: PIL's, e.g. ``compress_level``), to write with
    :func:`atomic_write_bytes` or send."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", **options)
    return buffer.getvalue()


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """Append ``record`` to the JSONL file ``path`` as one line of strict JSON (:func:`strict_json`)."""
    with open_append(path) as f:
        f.write(strict_json(record, indent=None) + "\n")


TEMPORARY_SUFFIX = ".tmp"
"""The suffix of the temporary file or folder a write builds beside its target (:func:`temporary_prefix`)."""


def temporary_prefix(name: str) -> str:
    """The prefix of the temporary file or folder an atomic write of ``name`` builds beside it before the rename
    (:func:`atomic_write_bytes`, :func:`make_temporary_dir`): ``.<name>.``, a random part and :data:`TEMPORARY_SUFFIX`
    follow."""
    return f".{name}."


def is_temporary_of(entry: str, name: str) -> bool:
    """Whether the folder entry ``entry`` is a temporary file or folder that an atomic write of ``name`` left (a kill
    before its rename).

    >>> is_temporary_of(".trainer_state.json.k2x9a1.tmp", "trainer_state.json"), is_temporary_of("a.tmp", "a")
    (True, False)
    """
    return entry.startswith(temporary_prefix(name)) and entry.endswith(TEMPORARY_SUFFIX)


def remove_temporaries_of(folder: str | Path, ours: Callable[[str], bool]) -> None:
    """Remove from ``folder`` the temporary files that an atomic write (:func:`atomic_write_bytes`) of a name
    ``ours`` accepts left when its process was killed before the rename (``SIGKILL``, a job's time limit, a power
    cut): ``.<name>.<random>.tmp``, which no rename will ever claim. Only with the lock held under which every writer
    of those names writes (no other process is writing them then); any other file, a folder and a link stay, and a
    ``folder`` that is a link or no folder is left alone.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     for name in (".a.json.k2x9a1zq.tmp", ".b.json.k2x9a1zq.tmp", "a.json.tmp", "notes.txt"):
    ...         _ = (Path(d) / name).write_text("x")
    ...     remove_temporaries_of(d, lambda name: name == "a.json")
    ...     sorted(os.listdir(d))
    ['.b.json.k2x9a1zq.tmp', 'a.json.tmp', 'notes.txt']
    """
    folder = Path(folder)
    if folder.is_symlink() or not folder.is_dir():
        return
    for entry in os.listdir(folder):
        target = entry[1 : -len(TEMPORARY_SUFFIX)].rpartition(".")[0]
        path = folder / entry
        if ours(target) and is_temporary_of(entry, target) and path.is_file() and not path.is_symlink():
            path.unlink(missing_ok=True)


def make_temporary_dir(final_dir: str | Path) -> Path:
    """A new, uniquely named, empty folder next to ``final_dir`` (``.<name>.<random>.tmp``) to build it in before
    :func:`atomic_replace_dir`; its mode is :func:`dir_mode` (``tempfile.mkdtemp`` alone gives 0700)."""
    final_dir = Path(final_dir)
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(
        tempfile.mkdtemp(dir=final_dir.parent, prefix=temporary_prefix(final_dir.name), suffix=TEMPORARY_SUFFIX)
    )
    os.chmod(tmp, dir_mode())
    return tmp


def apply_umask(root: str | Path) -> list[Path]:
    """Give ``root`` and every folder under it :func:`dir_mode`, every file :func:`file_mode` (symbolic links are
    left alone); returns the files and folders whose mode changed (one already right is not touched). For folders
    finecap builds before renaming them into place: ``tempfile.mkdtemp`` makes 0700 folders, and safetensors (0.8)
    writes its files with mode 0600 whatever the umask, as do ``save_pretrained`` calls that go through it."""
    root = Path(root)
    folder_mode, plain_mode = dir_mode(), file_mode()
    changed = []

    def give(path: Path, mode: int, st: os.stat_result) -> None:
        if not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) != mode:
            os.chmod(path, mode)
            changed.append(path)

    give(root, folder_mode, os.stat(root))
    for folder, dirs, files in os.walk(root):
        for names, mode in ((dirs, folder_mode), (files, plain_mode)):
            for name in names:
                path = Path(folder) / name
                give(path, mode, os.lstat(path))
    return changed
