"""One writer per output folder: ``finecap boost`` holds ``DIR/.boost.lock`` while it works, ``finecap demo`` its run
directory's ``.demo.lock``, ``finecap train`` its run directory's ``.train.lock``.

The lock is an operating-system lock (``flock``) taken with ``filelock``, so the kernel releases it when its holder
dies, however it dies. While held, the file records the holder as JSON (``pid``, ``host``, ``started``, ``command``)
so that a second run stops with an error naming the first. The holder removes the file when it is done; a file left
behind by a run that died (a kill, a power cut) holds a record but no lock: the next run takes it over and says so.
A file under the lock's name that is no such record (the user's own) is refused and never written or removed
(:func:`refuse_foreign_lock`). What several commands share (a world in the home, a world encoder) is made under a
lock that waits instead (:func:`waiting_lock`): one makes it, the others then find it made.
The file is the user's alone (mode 0600, :data:`LOCK_MODE`) and its command line has every secret masked.

Example::

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d, output_lock(d, name=LOCK_NAME, holder="finecap boost") as holder:
    ...     sorted(holder)
    ['command', 'host', 'pid', 'started']
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from finecap.config import masked_override
from finecap.utils.files import refuse_link
from finecap.utils.reading import METADATA, read_bounded
from finecap.utils.text import shell_command

LOCK_NAME = ".boost.lock"
"""``finecap boost``'s lock file in its output folder."""
TRAIN_LOCK = ".train.lock"
"""``finecap train``'s lock file in its run directory (held by the main process while it trains)."""


LOCK_MODE = 0o600
"""Permissions of a lock file, whatever the umask: its record (the command line, the host) is the user's alone. The
command line is masked (:func:`command_line`), but a lock file is left behind by a run that died, in a folder that
may be shared; private is the safe default for a file no one else needs to read."""


class OutputLocked(ValueError):
    """Another run holds the output folder's lock (a ``ValueError``: the command line prints it, exit code 2)."""


def command_argv() -> list[str]:
    """This process's arguments with secrets masked, one by one (:func:`finecap.config.masked_override`: a secret
    override by the key it sets, however spelled; URL credentials in any argument). Started as ``python -m finecap``,
    ``sys.argv[0]`` is finecap's ``__main__.py``, which run alone is no command: it is given as this interpreter's
    ``-m finecap``, so that the command runs again when pasted."""
    argv = list(sys.argv)
    if argv and _is_finecap_main(argv[0]):
        argv[:1] = [sys.executable or "python", "-m", "finecap"]
    return [masked_override(a) for a in argv]


def _is_finecap_main(program: str) -> bool:
    """Whether ``program`` (``sys.argv[0]``) is this finecap's ``__main__.py`` (``python -m finecap``)."""
    main = Path(__file__).with_name("__main__.py")
    try:
        return bool(program) and Path(program).resolve() == main.resolve()
    except (OSError, RuntimeError):
        return False


def command_line() -> str:
    """This process's command line (:func:`command_argv`, secrets masked) as a shell command that runs those
    arguments when pasted (:func:`finecap.utils.text.shell_command`)."""
    return shell_command(command_argv())


def _describe(record: dict[str, Any]) -> str:
    if not record:
        return "a run that has not recorded itself yet"
    started = record.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, int | float) else "?"
    return f"pid {record.get('pid', '?')} on host {record.get('host', '?')}, started {when}"


def _parse(data: bytes) -> dict[str, Any]:
    try:
        record = json.loads(data.decode("utf-8", "replace")) if data.strip() else {}
    except json.JSONDecodeError:
        return {"pid": "?", "host": "?", "note": "unreadable lock record"}
    return record if isinstance(record, dict) else {}


def _other_owner(path: Path) -> str | None:
    """The name of the user owning ``path`` (its uid when the system has no name for it) when it exists and is not
    this user's; else ``None``."""
    try:
        uid = path.lstat().st_uid
    except OSError:
        return None
    if uid == os.getuid():
        return None
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return f"uid {uid}"


LOCK_KEYS = {"pid", "host", "started"}
"""What every lock record finecap writes holds (:func:`output_lock`)."""


def refuse_foreign_lock(path: Path) -> None:
    """:class:`OutputLocked` when ``path`` holds something other than a lock record finecap wrote (empty, or a JSON
    object with :data:`LOCK_KEYS`): a file of the user's that happens to bear the name is never truncated or removed.
    A file this user cannot read is left to the lock's own refusal."""
    try:
        data = read_bounded(path, METADATA)
    except ValueError:  # larger than any lock record
        data = b"x"
    except OSError:  # none there, or not readable as a file: the lock's own refusal says what it is
        return
    try:
        record = json.loads(data.decode("utf-8")) if data.strip() else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        record = {}
    if record is not None and not (isinstance(record, dict) and set(record) >= LOCK_KEYS):
        raise OutputLocked(f"{path}: a file finecap did not write holds the name of its lock file (it is never "
                           "overwritten); move it away, or choose another --out")  # fmt: skip


def read_holder(path: str | Path) -> dict[str, Any]:
    """The record in a lock file (``{}`` when it is missing or empty)."""
    try:
        return _parse(read_bounded(path, METADATA))
    except FileNotFoundError:
        return {}


@contextmanager
def output_lock(
    out: str | Path, *, name: str, holder: str, log: Callable[[str], Any] = print, guards: str | Path | None = None
) -> Iterator[dict[str, Any]]:
    """Hold ``out/<name>`` for the ``with`` block (``out`` must exist); yields this run's record.
    :class:`OutputLocked` naming the holder when another process holds it. ``holder`` names the command (``finecap
    boost``, ``finecap demo``) in messages; ``guards``: the one file of ``out`` the lock is for, named by that
    refusal instead of the folder (``finecap caption``'s results: another run may write other results there)."""
    path = Path(out) / name
    refuse_link(path)  # the lock file is written: never through a planted link
    refuse_foreign_lock(path)
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": round(time.time(), 3),
              "command": command_line()}  # fmt: skip
    previous: dict[str, Any] = {}

    def on_acquired(fd: int) -> None:  # runs with the lock held
        previous.update(_parse(os.pread(fd, 1 << 16, 0)))
        with contextlib.suppress(PermissionError):  # a file left by an older finecap, or made under another umask
            os.fchmod(fd, LOCK_MODE)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)

    lock = FileLock(path, mode=LOCK_MODE, on_acquired=on_acquired)
    try:
        lock.acquire(blocking=False)
    except Timeout:
        busy = f"{out}: another {holder} is writing to this folder" if guards is None else (
            f"{guards}: another {holder} is writing it")  # fmt: skip
        raise OutputLocked(
            f"{busy} ({_describe(read_holder(path))}); wait for it to finish or choose another --out "
            f"(lock file {path})"
        ) from None
    except PermissionError as e:
        owner = _other_owner(path)
        if owner is None:  # no lock file, or this user's: the folder is not writable by this user
            raise OutputLocked(f"{out}: not writable by this user ({e.strerror}); choose another --out") from None
        # another user's file: left by a run of theirs that died, or held by one running
        raise OutputLocked(
            f"{path}: cannot take the output folder's lock: the file is {owner}'s ({e.strerror}), left by a "
            f"run of theirs ({_describe(read_holder(path)) if os.access(path, os.R_OK) else 'record unreadable'}); "
            "once no run of theirs writes here, they (or an administrator) can remove it; or choose another --out"
        ) from None
    except OSError as e:  # a file system without flock (filelock does not fall back when on_acquired is set)
        raise OutputLocked(f"{path}: cannot take the output folder's lock ({e}); choose another --out") from None
    try:
        if previous:
            log(f"{holder}: taking over the lock of {_describe(previous)}, which ended without releasing it ({path})")
        yield record
    finally:
        path.unlink(missing_ok=True)  # while still held: a waiting run then creates a fresh file
        lock.release()


@contextmanager
def waiting_lock(path: str | Path, *, waiting: str, log: Callable[[str], Any] = print) -> Iterator[None]:
    """Hold the operating-system lock ``path`` (``flock``: released when its holder dies, however it dies) for the
    ``with`` block, waiting while another process holds it (after logging ``waiting`` once). For what several
    commands sharing a home make once (a world, a world encoder): the one that waited checks again, under the lock,
    whether the other made it. The file stays (removing a file others wait on would let a third process lock a new
    one); a planted link at ``path`` is refused, never written through."""
    path = Path(path)
    refuse_link(path)
    lock = FileLock(path)
    try:
        lock.acquire(blocking=False)
    except Timeout:
        log(waiting)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()
