"""Helpers of the tests of data loss, links and names (tests/utils/test_folder_swaps.py,
tests/data/test_names_and_links.py): a user's folder holding a precious file, and a snapshot of a folder to show that
nothing in it changed (the command line run in this process is :mod:`helpers.cli`)."""

from __future__ import annotations

import os
from pathlib import Path

PRECIOUS = b"the user's own file: never to be deleted or overwritten\n"


def snapshot(folder: Path) -> dict[str, object]:
    """Every entry under ``folder`` (links not followed): a file's bytes, a link's target, ``None`` for a folder."""
    found: dict[str, object] = {}
    for dirpath, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            path = Path(dirpath) / name
            key = str(path.relative_to(folder))
            if path.is_symlink():
                found[key] = ("link", os.readlink(path))
            elif path.is_dir():
                found[key] = None
            else:
                found[key] = path.read_bytes()
    return found


def user_folder(path: Path) -> Path:
    """A folder of the user's at ``path`` holding one precious file."""
    path.mkdir(parents=True)
    (path / "notes.txt").write_bytes(PRECIOUS)
    return path
