"""The judges' answer cache: one SQLite file, ``<finecap home>/cache/judges/answers.sqlite`` by default, keyed by
the judge's identity (name, model, ``judge.max_tokens``, prompt version:
:meth:`~finecap.judges.base.Judge.identity`), the kind of call, its inputs (caption, question, options) and the
messages asked, so that a re-run or a resumed run asks nothing twice. SQLite's locking (write-ahead log, a busy
time-out) makes it safe for several processes at once; a value is written once per key (``INSERT OR IGNORE``), only
for answers that parsed (failures are never cached). A damaged file (not a database, cut short) is a ``ValueError``
naming it (:func:`cache_error`). Nothing is ever pruned: the file grows by about 170 bytes a short answer (a QA step
of ``demo/grpo_qa``, about 4,500 calls: some 0.8 MB) until it is deleted.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from finecap.home import CACHE, home

FILE = "answers.sqlite"
CREATE = "CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
BUSY_SECONDS = 60
"""How long a process waits for another that holds the cache file (SQLite's busy time-out, and the retries of
opening it)."""


def default_path() -> Path:
    """``<finecap home>/cache/judges/answers.sqlite``."""
    return home() / CACHE / "judges" / FILE


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


class AnswerCache:
    """``get(key) -> value | None`` and ``put(key, value)`` of JSON values in one SQLite file (module docstring)."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, timeout=BUSY_SECONDS, check_same_thread=False, isolation_level=None)
        try:
            self._open()
        except sqlite3.DatabaseError as e:
            self._db.close()
            if not damaged(e):
                raise
            raise cache_error(self.path, e) from None

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
        ``ValueError``."""
        with self._lock:
            try:
                return [self._db.execute(sql, args).fetchone() for sql, args in statements]
            except sqlite3.DatabaseError as e:
                if not damaged(e):
                    raise
                raise cache_error(self.path, e) from None

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
