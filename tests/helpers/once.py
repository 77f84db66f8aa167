"""Work done once per test session and shared by every pytest-xdist worker: a session-scoped fixture is made once
per *worker process*, so a slow fixture (a wheel install, a quick demo) ran once on each of `make test`'s two
workers, each slowing the other on a two-core machine. :func:`once_per_session` makes it once, in a folder below the
workers' common temporary root (``getbasetemp().parent`` under xdist: the pattern pytest-xdist documents), holding a
file lock while it works; a worker that asks meanwhile waits for it, and a worker that asks later finds it made."""

from __future__ import annotations

import fcntl
import os
import shutil
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

DONE = ".made"
FAILED = ".failed"


def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary folder every worker of this session sees: the parent of a popen worker's ``popen-<id>`` base
    (``PYTEST_XDIST_WORKER`` names the worker); one process without xdist: its own base."""
    base = tmp_path_factory.getbasetemp()
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return base
    assert base.name == f"popen-{worker}", (
        f"an xdist worker's temporary base named otherwise than pytest-xdist's: {base}"
    )
    return base.parent


def once_per_session(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], object]) -> Path:
    """``make(folder)`` run once for the whole session into the empty ``folder`` (``<shared root>/<name>``); returns
    ``folder``. When ``make`` raised, every later asker fails at once with its traceback instead of making it again
    (a slow failure would otherwise be paid once per worker)."""
    root = shared_root(tmp_path_factory)
    folder = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also when this process dies
        if (root / f"{name}{FAILED}").is_file():
            pytest.fail(f"{name}: failed in another worker:\n{(root / f'{name}{FAILED}').read_text()}")
        if not (folder / DONE).is_file():
            shutil.rmtree(folder, ignore_errors=True)  # a half-made folder of a worker that died
            folder.mkdir()
            try:
                make(folder)
            except BaseException:
                (root / f"{name}{FAILED}").write_text(traceback.format_exc())
                raise
            (folder / DONE).touch()
    return folder
