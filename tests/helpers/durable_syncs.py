"""``os.fsync`` and ``os.replace`` recorded in order, to check what a durable write syncs and when
(``tests/utils/test_durable_writes.py``, a report's plots in ``tests/report/test_plot_files.py``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest


class Recorder:
    """``os.fsync`` and ``os.replace`` calls in order: ``("fsync", inode, is_folder)``, ``("replace", src, dst)``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple] = []
        real_fsync, real_replace = os.fsync, os.replace

        def fsync(fd: int) -> None:
            st = os.fstat(fd)
            self.events.append(("fsync", (st.st_dev, st.st_ino), stat.S_ISDIR(st.st_mode)))
            real_fsync(fd)

        def replace(src, dst) -> None:
            self.events.append(("replace", Path(src), Path(dst)))
            real_replace(src, dst)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)

    def synced_at(self, path: Path) -> list[int]:
        """The indices of the events that synced ``path`` (by its inode: the same before and after a rename)."""
        st = os.stat(path)
        return [i for i, e in enumerate(self.events) if e[0] == "fsync" and e[1] == (st.st_dev, st.st_ino)]

    def replaced_at(self, dst: Path) -> int:
        (found,) = [i for i, e in enumerate(self.events) if e[0] == "replace" and e[2] == dst]
        return found
