"""The judges' answer cache: one SQLite file, ``<finecap home>/cache/judges/answers.sqlite`` by default, keyed by
the judge's identity (name, model, ``judge.max_tokens``, prompt version:
:meth:`~finecap.judges.base.Judge.identity`), the kind of call, its inputs (caption, question, options) and the
messages asked, so that a re-run or a resumed run asks nothing twice. SQLite's locking (write-ahead log, a busy
time-out) makes it safe for several processes at once; a value is written once per key (``INSERT OR IGNORE``), only
for answers that parsed (failures are never cached). Each answer's row records the model the server's replies named
(``served_model``, as JSON: a name, or ``null`` for a judge of no server or a reply that named none; SQL ``NULL`` on
rows an older finecap wrote, which did not record it: :attr:`Entry.recorded`), so that a later run is held to the
model that gave the answers it reuses (:mod:`finecap.judges.openai`: served model); a file of an older finecap gains
the column when opened. A damaged file (not a database, cut short) is a ``ValueError`` naming it
(:func:`cache_error`); a file that cannot be opened or written (a full disk, a read-only home, another process
holding it past :data:`BUSY_SECONDS`) an ``OSError`` naming it (:func:`access_error`), never SQLite's bare
``OperationalError``. Nothing is ever pruned: the file grows by about 185 bytes a short answer with its served model
(a QA step of ``demo/grpo_qa``, about 4,500 calls: some 0.8 MB) until it is deleted.
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
from typing import Any, NamedTuple

from finecap.home import CACHE, JUDGES, home

FILE = "answers.sqlite"
CREATE = "CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, value TEXT NOT NULL, served_model TEXT)"
ADD_SERVED_MODEL = "ALTER TABLE answers ADD COLUMN served_model TEXT"
"""What a file of an older finecap (no ``served_model`` column) gains when opened; its rows read as unrecorded."""
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


class Entry(NamedTuple):
    """A cached answer: its ``value``, the model the server's replies named for it (``served_model``; ``None``: none
    named one) and whether its row records that at all (``recorded``: ``False`` for a row of an older finecap)."""

    value: Any
    served_model: str | None
    recorded: bool


def _entry(row: tuple[str, str | None]) -> Entry:
    """The :class:`Entry` of a row ``(value, served_model)``: a ``served_model`` of SQL ``NULL`` (an older finecap's
    row), or not the JSON of a name or ``null``, is unrecorded."""
    value, served = json.loads(row[0]), row[1]
    try:
        model = json.loads(served) if served is not None else ...
    except json.JSONDecodeError:
        model = ...
    if model is None or isinstance(model, str):
        return Entry(value, model, True)
    return Entry(value, None, False)


class AnswerCache:
    """``get(key) -> value | None`` and ``put(key, value, served_model)`` of JSON values in one SQLite file, with the
    model that gave each (:meth:`entry`, :meth:`keep`; module docstring)."""

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
        """The write-ahead log and the table (with its ``served_model`` column: :data:`ADD_SERVED_MODEL` on a file of
        an older finecap), waiting for another process that is opening the file too."""
        opened = time.monotonic()
        for statement in ("PRAGMA journal_mode=WAL", CREATE, ADD_SERVED_MODEL):
            while True:
                try:
                    if statement == ADD_SERVED_MODEL and self._has_served_model():
                        break
                    self._db.execute(statement)
                    break
                except sqlite3.OperationalError as e:
                    if "duplicate column" in str(e):  # another process added it since this one looked
                        break
                    # two processes opening a new cache at once: switching to the write-ahead log answers "locked"
                    # at once, without SQLite's busy wait (2 judged evals on a fresh home: 15 of 100 failed here)
                    if "locked" not in str(e) or time.monotonic() - opened > BUSY_SECONDS:
                        raise
                    time.sleep(0.05)

    def _has_served_model(self) -> bool:
        return any(column[1] == "served_model" for column in self._db.execute("PRAGMA table_info(answers)"))

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

    def entry(self, key: str) -> Entry | None:
        """The answer kept under ``key`` with the model that gave it, or ``None``."""
        (row,) = self._rows(("SELECT value, served_model FROM answers WHERE key = ?", (key,)))
        return None if row is None else _entry(row)

    def get(self, key: str) -> Any:
        """The value kept under ``key``, or ``None``."""
        entry = self.entry(key)
        return None if entry is None else entry.value

    def keep(self, key: str, value: Any, served_model: str | None = None) -> Entry:
        """Keep ``value`` under ``key``, with the model the server's replies named for it (``served_model``; ``None``:
        none named one), unless a value is there already; the entry kept, whose value every writer of the key then
        uses (another process may have answered the same call first, differently, or as another model)."""
        insert = "INSERT OR IGNORE INTO answers (key, value, served_model) VALUES (?, ?, ?)"
        _, row = self._rows((insert, (key, json.dumps(value), json.dumps(served_model))),
                            ("SELECT value, served_model FROM answers WHERE key = ?", (key,)))  # fmt: skip
        return _entry(row)

    def put(self, key: str, value: Any, served_model: str | None = None) -> Any:
        """:meth:`keep`'s value: the value kept."""
        return self.keep(key, value, served_model).value

    def __len__(self) -> int:
        (row,) = self._rows(("SELECT COUNT(*) FROM answers", ()))
        return int(row[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()
