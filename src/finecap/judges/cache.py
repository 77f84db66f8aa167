"""The judges' answer cache: one SQLite file, ``<finecap home>/cache/judges/answers.sqlite`` by default, keyed by
the judge's identity (name, model, ``judge.max_tokens``, prompt version:
:meth:`~finecap.judges.base.Judge.identity`), the kind of call, its inputs (caption, question, options) and the
messages asked, so that a re-run or a resumed run asks nothing twice. SQLite's locking (write-ahead log, a busy
time-out) makes it safe for several processes at once; a value is written once per key (``INSERT OR IGNORE``), only
for answers that parsed (failures are never cached). A damaged file (not a database, cut short) is a ``ValueError``
naming it (:func:`cache_error`); a file that cannot be opened or written (a full disk, a read-only home, another
process holding it past :data:`BUSY_SECONDS`) an ``OSError`` naming it (:func:`access_error`), never SQLite's bare
``OperationalError``. Nothing is ever pruned: the file grows by about 170 bytes a short answer (a QA step
of ``demo/grpo_qa``, about 4,500 calls: some 0.8 MB) until it is deleted.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from finecap.home import CACHE, JUDGES, home

FILE = "answers.sqlite"
CREATE = "CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
BUSY_SECONDS = 60
"""How long a process waits for another that holds the cache file (SQLite's busy time-out, and the retries of
opening it)."""


def default_path() -> Path:
    """``<finecap home>/cache/judges/answers.sqlite``."""
    return home() / CACHE / JUDGES / FILE


def cache_key(*parts: Any) -> str:
    """A stable key of JSON-able ``parts`` (sha256 of their canonical JSON)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def damaged(error: sqlite3.DatabaseError) -> bool:
    """Whether SQLite says the file itself is damaged (not a database, a malformed image): its plain
    ``DatabaseError``, not a subclass (a lock, a closed connection, a disk error: raised as they are)."""
    return type(error) is sqlite3.DatabaseError


def cache_error(path: Path, error: sqlite3.DatabaseError) -> ValueError:
    """The one-line error of a damaged cache file (a disk that filled, a copy cut short, not SQLite at all), naming
    it: it may be deleted, since it holds only answers the judge can be asked again."""
    return ValueError(f"judge answer cache {path} is damaged ({error}): delete it and its -wal and -shm files (the "
                      "judge is asked again), or set judge.cache=false")  # fmt: skip


def access_error(path: Path, error: sqlite3.OperationalError) -> OSError | None:
    """What SQLite's ``OperationalError`` on the cache file ``path`` means for the file, as an ``OSError`` naming it
    (one line at the command line: :func:`finecap.errors.explain`): a full disk (``ENOSPC``); a file, or its -wal and
    -shm files beside it, that cannot be opened or written: a folder in its place (``EISDIR``), a read-only file
    system (``EROFS``) or a folder or file this user may not write (``EACCES``); another process holding it past
    :data:`BUSY_SECONDS` (``TimeoutError``); a disk error (``EIO``). ``None`` for anything else (a bug: raised as
    it is)."""
    code = getattr(error, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None  # an extended code's low byte is its primary code
    shown = str(path)
    if primary == sqlite3.SQLITE_FULL:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), shown)
    if primary in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM):
        if path.is_dir():
            return IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), shown)
        code = errno.EROFS if _read_only_file_system(path.parent) else errno.EACCES
        return OSError(code, f"{os.strerror(code)} ({error})", shown)
    if primary in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        why = f"another process held the judge answer cache for more than {BUSY_SECONDS} s ({error})"
        return TimeoutError(errno.ETIMEDOUT, f"{why}; try again when it is done, or set judge.cache=false", shown)
    if primary == sqlite3.SQLITE_IOERR:
        return OSError(errno.EIO, f"disk I/O error ({error})", shown)
    return None


def _read_only_file_system(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # no such folder; no statvfs (Windows)
        return False


class AnswerCache:
    """``get(key) -> value | None`` and ``put(key, value)`` of JSON values in one SQLite file (module docstring)."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(self.path, timeout=BUSY_SECONDS, check_same_thread=False, isolation_level=None)
        except sqlite3.DatabaseError as e:
            raise self._error(e) from None
        try:
            self._open()
        except sqlite3.DatabaseError as e:
            self._db.close()
            raise self._error(e) from None

    def _error(self, error: sqlite3.DatabaseError) -> Exception:
        """What to raise for SQLite's ``error`` on the file: :func:`cache_error` for a damaged file, else
        :func:`access_error`, else ``error`` itself."""
        if damaged(error):
            return cache_error(self.path, error)
        if isinstance(error, sqlite3.OperationalError):
            return access_error(self.path, error) or error
        return error

    def _open(self) -> None:
        """The write-ahead log and the table, waiting for another process that is opening the file too."""
        opened = time.monotonic()
        for statement in ("PRAGMA journal_mode=WAL", CREATE):
            while True:
                try:
                    self._db.execute(statement)
                    break
                except sqlite3.OperationalError as e:
                    # two processes opening a new cache at once: switching to the write-ahead log answers "locked"
                    # at once, without SQLite's busy wait (2 judged evals on a fresh home: 15 of 100 failed here)
                    if "locked" not in str(e) or time.monotonic() - opened > BUSY_SECONDS:
                        raise
                    time.sleep(0.05)

    def _rows(self, *statements: tuple[str, tuple[Any, ...]]) -> list[Any]:
        """The first row of each statement, run in turn under the lock; a damaged file is :func:`cache_error`'s
        ``ValueError``, a file that cannot be written :func:`access_error`'s ``OSError``."""
        with self._lock:
            try:
                return [self._db.execute(sql, args).fetchone() for sql, args in statements]
            except sqlite3.DatabaseError as e:
                error = self._error(e)
                if error is e:
                    raise
                raise error from None

    def get(self, key: str) -> Any:
        (row,) = self._rows(("SELECT value FROM answers WHERE key = ?", (key,)))
        return None if row is None else json.loads(row[0])

    def put(self, key: str, value: Any) -> Any:
        """Keep ``value`` under ``key`` unless a value is there already; the value kept, which every writer of the key
        then uses (another process may have answered the same call first, differently)."""
        _, row = self._rows(("INSERT OR IGNORE INTO answers (key, value) VALUES (?, ?)", (key, json.dumps(value))),
                            ("SELECT value FROM answers WHERE key = ?", (key,)))  # fmt: skip
        return json.loads(row[0])

    def __len__(self) -> int:
        (row,) = self._rows(("SELECT COUNT(*) FROM answers", ()))
        return int(row[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()
