"""Folders finecap swaps into place (checkpoints, exports, world encoders): marked as finecap's by content,
replaced only when they are."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from finecap.utils.files import (
    OutputRefused,
    apply_umask,
    atomic_write_text,
    refuse_link,
    replace_durably,
    sync_folder,
    sync_to_disk,
)

FOLDER_MARK = ".finecap-folder"


"""The file finecap writes into every folder it swaps into place (:func:`atomic_replace_dir`: checkpoints, merged
exports, world encoders) and into the temporary folders it builds them in: a folder holding it with the text
:func:`folder_mark_text` gives for its kind is finecap's (recognised by content, never by name), and only such a
folder is ever replaced or removed by :func:`atomic_replace_dir` and :func:`remove_own_folder`. Deleting the file
keeps finecap from touching the folder."""


MAX_MARK_BYTES = 4096


"""The largest :data:`FOLDER_MARK` file read (the mark is a short sentence; a larger file is not finecap's)."""


def folder_mark_text(kind: str) -> str:
    """The content of the :data:`FOLDER_MARK` of a folder finecap made as a ``kind`` (``"checkpoint"``,
    ``"export"``, ``"world-encoder"``): one folder kind is never taken for another (``export --force`` replaces an
    export, never a checkpoint)."""
    return f"finecap made this folder ({kind}) and may replace or remove it; delete this file to keep it from that\n"


def mark_folder(folder: str | Path, kind: str) -> None:
    """Write the :data:`FOLDER_MARK` of ``kind`` into ``folder`` (atomically, never through a link)."""
    atomic_write_text(Path(folder) / FOLDER_MARK, folder_mark_text(kind))


def is_finecap_folder(path: str | Path, kind: str, ours: Callable[[Path], bool] | None = None) -> bool:
    """Whether ``path`` is a real folder (not a link) that finecap made as a ``kind``: its :data:`FOLDER_MARK` is a
    regular file holding exactly :func:`folder_mark_text` of ``kind``, or the caller's content test ``ours(path)``
    says so (a checkpoint written before folders were marked: :func:`finecap.train.state.is_checkpoint_folder`)."""
    path = Path(path)
    if os.path.islink(path) or not path.is_dir():
        return False
    mark = path / FOLDER_MARK
    try:
        if (not os.path.islink(mark) and mark.is_file() and mark.stat().st_size <= MAX_MARK_BYTES
                and mark.read_text(encoding="utf-8") == folder_mark_text(kind)):  # fmt: skip
            return True
    except (OSError, UnicodeDecodeError):
        pass
    return ours is not None and ours(path)


def check_own_folder(path: str | Path, kind: str, ours: Callable[[Path], bool] | None = None) -> None:
    """:class:`OutputRefused` naming ``path`` when something is there that finecap did not make as a ``kind``
    (:func:`is_finecap_folder`): a link, a file, or a folder of the user's (or of another kind). Nothing there: no
    error."""
    refuse_link(path)
    if not os.path.lexists(path) or is_finecap_folder(path, kind, ours):
        return
    what = "a folder" if os.path.isdir(path) else "a file"
    a = "an" if kind[:1] in "aeiou" else "a"  # an export, a checkpoint
    raise OutputRefused(
        f"{path}: {what} finecap did not make (no {FOLDER_MARK} of {a} {kind}) is where finecap swaps {a} {kind} "
        "folder into place; finecap never removes what it did not make: move it away, or choose another output"
    )


def remove_folders(
    paths: Iterable[str | Path], *, complete_file: str | None = None, ignore_errors: bool = False
) -> None:
    """Remove the folders ``paths`` and all they hold (``shutil.rmtree``, ``ignore_errors`` as its). With
    ``complete_file`` (the file whose presence says a folder of their kind is complete: a checkpoint's
    ``trainer_state.json``, :func:`finecap.train.state.is_complete`), that file of every one of them is removed first,
    and the removal put on the disk (:func:`finecap.utils.files.sync_folder`), before anything else of any of them
    goes: a folder stops being complete before it starts being deleted, so a process killed while removing them (a
    second Ctrl-C) leaves folders that read as unfinished, never one that reads complete with part of its files gone
    (which a resume would pick, and fail to load). The one removal of such folders."""
    paths = [Path(p) for p in paths]
    if complete_file is not None:
        for path in paths:
            done = path / complete_file
            try:
                if not os.path.islink(path) and os.path.lexists(done):
                    done.unlink()
                    sync_folder(path)
            except OSError:
                if not ignore_errors:
                    raise
    for path in paths:
        shutil.rmtree(path, ignore_errors=ignore_errors)


def remove_own_folder(
    path: str | Path, kind: str, ours: Callable[[Path], bool] | None = None, *, complete_file: str | None = None
) -> None:
    """Remove the folder ``path`` if finecap made it as a ``kind`` (:func:`check_own_folder`; an unfinished
    temporary folder of finecap's), its ``complete_file`` first (:func:`remove_folders`); anything else there is
    refused, never removed."""
    check_own_folder(path, kind, ours)
    if os.path.lexists(path):
        remove_folders([path], complete_file=complete_file)


def previous_dir(final_dir: Path) -> Path:
    """Where :func:`atomic_replace_dir` keeps the replaced version of ``final_dir`` during the swap
    (``<name>.old``)."""
    return final_dir.with_name(final_dir.name + ".old")


def check_swap(final_dir: str | Path, kind: str, ours: Callable[[Path], bool] | None = None) -> None:
    """What :func:`atomic_replace_dir` checks before it swaps a ``kind`` folder in at ``final_dir``: ``final_dir``
    and its :func:`previous_dir` are each missing or a folder finecap made as a ``kind`` (:func:`check_own_folder`),
    never a link, a file or a folder of the user's. A command calls it before its work, to refuse early."""
    final_dir = Path(final_dir)
    for path in (final_dir, previous_dir(final_dir)):
        check_own_folder(path, kind, ours)


DEFAULT_KIND = "folder"
"""The folder kind of :func:`atomic_replace_dir` when its caller names none."""


def prepare_swap(tmp_dir: str | Path, kind: str) -> list[Path]:
    """What :func:`atomic_replace_dir` changes in ``tmp_dir`` before renaming it: its :data:`FOLDER_MARK` of a
    ``kind``, written (:func:`mark_folder`, a durable write) unless it holds that mark already, and its modes, given
    the user's umask (:func:`apply_umask`); returns the files and folders whose mode changed. A caller that syncs
    ``tmp_dir`` itself before the swap (``synced``) calls it first, so that the swap finds nothing left to change."""
    if not is_finecap_folder(tmp_dir, kind):
        mark_folder(tmp_dir, kind)
    return apply_umask(tmp_dir)


def atomic_replace_dir(
    tmp_dir: str | Path,
    final_dir: str | Path,
    *,
    kind: str = DEFAULT_KIND,
    ours: Callable[[Path], bool] | None = None,
    complete_file: str | None = None,
    synced: bool = False,
) -> None:
    """Move a fully written ``tmp_dir`` to ``final_dir``, replacing any previous version, which is first renamed
    ``<name>.old`` (:func:`previous_dir`) and removed once the new folder is in place. When the rename of
    ``tmp_dir`` fails (a disk full or turned read-only), the previous version is renamed back to ``final_dir`` before
    the error is raised: a failed swap leaves the previous folder where it was. The new folder's files are on the disk
    before the renames, and the renames after (:func:`finecap.utils.files.replace_durably`): a power loss leaves the
    previous folder or the complete new one, never one of empty files. ``synced``: the caller has put ``tmp_dir`` on
    the disk (:func:`finecap.utils.files.sync_to_disk`, after :func:`prepare_swap`) and changed it since only by
    durable writes (:func:`finecap.utils.files.atomic_write_bytes`: the file's data synced, then its folder); the swap
    then syncs only the modes it sets itself (none after :func:`prepare_swap`), not every file and folder a second
    time. That second round is redundant: an ``fsync`` puts a file's data and inode (its mode too) on the disk, a
    folder's its entries, and none of them changed since; what the renames need is all of it on the disk before them,
    and the parent folder synced after them, which is still done (:func:`finecap.utils.files.replace_durably`).

    Only finecap's own folders are replaced or removed: ``final_dir`` and ``<name>.old`` must each be missing or a
    folder finecap made as a ``kind`` (:func:`check_swap`: its :data:`FOLDER_MARK`, or ``ours``), else
    :class:`OutputRefused` names it and nothing is changed. ``tmp_dir`` is marked as a ``kind`` before the swap
    (:func:`prepare_swap`, unless it is already), so the folder swapped in is recognised as finecap's the next time.
    Its modes follow the user's umask first (:func:`apply_umask`): what ``mkdtemp`` or safetensors created 0700 / 0600
    ends up as readable as ``mkdir`` and ``open`` make it. ``complete_file``: the file that marks a ``kind`` folder
    complete, removed first when ``<name>.old`` is removed (:func:`remove_folders`)."""
    tmp_dir, final_dir = Path(tmp_dir), Path(final_dir)
    old = previous_dir(final_dir)
    check_swap(final_dir, kind, ours)
    finish_swap(final_dir, kind, ours)  # a kill's .old back first: a failed rename below then puts it back
    changed = prepare_swap(tmp_dir, kind)
    if synced:
        for path in changed:  # a mode set after the caller's sync: its inode again (a folder's: its own only)
            (sync_folder if path.is_dir() else sync_to_disk)(path)
    if old.exists():
        remove_folders([old], complete_file=complete_file)
    replace_durably(tmp_dir, final_dir, previous=old, synced=synced)
    if old.exists():
        remove_folders([old], complete_file=complete_file)


def finish_swap(final_dir: str | Path, kind: str, ours: Callable[[Path], bool] | None = None) -> bool:
    """Undo what a kill between the two renames of :func:`atomic_replace_dir` left: nothing at ``final_dir`` and the
    previous version at ``<name>.old`` (:func:`previous_dir`), a folder finecap made as a ``kind``
    (:func:`is_finecap_folder`), which is renamed back to ``final_dir`` (:func:`finecap.utils.files.replace_durably`)
    and stands again where readers look for it. Returns whether it was; anything else is left as it is."""
    final_dir = Path(final_dir)
    old = previous_dir(final_dir)
    if os.path.lexists(final_dir) or not is_finecap_folder(old, kind, ours):
        return False
    replace_durably(old, final_dir)
    return True


@contextlib.contextmanager
def made_folder(path: str | Path) -> Iterator[Path]:
    """``path`` made, with its missing parents, for the block. When the block raises, the folders made here that are
    still empty are removed again, deepest first (``rmdir``: never a folder holding anything), so a command that failed
    before writing leaves no empty output folder behind; one that wrote something leaves its folder as it is."""
    path = Path(path)
    levels = []
    level = path
    while not level.exists() and not level.is_symlink() and level != level.parent:
        levels.append(level)
        level = level.parent
    made = []  # the levels this call's own mkdir created, deepest first: never one another process made meanwhile
    for level in reversed(levels):
        try:
            level.mkdir()
        except FileExistsError:
            continue
        made.insert(0, level)
    path.mkdir(parents=True, exist_ok=True)  # what is left (e.g. a level another process removed meanwhile)
    try:
        yield path
    except BaseException:
        for folder in made:
            try:
                folder.rmdir()
            except OSError:  # it holds something (or another process made it meanwhile): kept, and its parents
                break
        raise
