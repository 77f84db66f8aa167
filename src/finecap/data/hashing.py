"""What identifies a file's content or a Hub repository's version: the hashes that fingerprints are made of
(:mod:`finecap.train.fingerprint`, and each data set format's own part,
:attr:`finecap.data.formats.Format.fingerprint`).

Files are hashed once per process and version (path and :func:`file_version`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

_FILE_HASHES: dict[tuple[str, tuple[int, ...]], str] = {}


def file_version(st: os.stat_result) -> tuple[int, ...]:
    """What tells a version of a file from another without reading it, from its ``stat``: size, modification time,
    change time and inode. The size and modification time alone kept what was read of a file replaced by another of
    the same size within one tick of the clock, or copied in keeping the old one's time (``cp -p``, ``rsync -t``): a
    notebook's second run used its first run's hash of the data, or said an image repaired since was damaged. A file
    renamed into place (an editor's save, finecap's own writes) has another inode; one rewritten in place, another
    change time, which no tool sets back."""
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def tree_version(path: str | Path) -> tuple:
    """:func:`file_version` of ``path`` and, for a folder, of every file below it (by path relative to it, in order;
    a link by what it names): a folder's own ``stat`` does not change when a file in it is rewritten in place, as
    ``datasets``' ``save_to_disk`` rewrites a saved data set's files under the same names."""
    path = Path(path)
    version: list = [file_version(path.stat())]
    if path.is_dir():
        for folder, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                file = os.path.join(folder, name)
                try:
                    version.append((os.path.relpath(file, path), file_version(os.stat(file))))
                except OSError:  # removed meanwhile, or a dangling link: no version of its own
                    continue
    return tuple(version)


def sha256_file(path: str | Path) -> str:
    """SHA-256 (hex) of a file's bytes, computed once per path and :func:`file_version` in this process."""
    path = Path(path)
    key = (str(path.resolve()), file_version(path.stat()))
    if key not in _FILE_HASHES:
        h = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _FILE_HASHES[key] = h.hexdigest()
    return _FILE_HASHES[key]


def sha256_files(root: Path, files: Iterable[Path]) -> str:
    """SHA-256 over ``(path relative to root, file hash)`` of ``files`` in sorted order."""
    h = hashlib.sha256()
    for path in sorted(files, key=lambda p: p.relative_to(root).as_posix()):
        h.update(f"{path.relative_to(root).as_posix()}\0{sha256_file(path)}\n".encode())
    return h.hexdigest()


def hub_revision(repo_id: str, repo_type: str = "model") -> str | None:
    """The commit of ``repo_id``'s ``main`` in the local Hugging Face cache (``refs/main``), or None when it is not
    cached (nothing is downloaded)."""
    from huggingface_hub import constants

    folder = Path(constants.HF_HUB_CACHE) / f"{repo_type}s--{repo_id.replace('/', '--')}"
    ref = folder / "refs" / "main"
    return ref.read_text().strip() if ref.is_file() else None
