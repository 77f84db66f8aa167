"""A process killed while it removes a checkpoint folder (a second Ctrl-C, a SIGKILL): ``shutil.rmtree`` deletes in
no set order, so what it leaves is any part of the folder (tests/train/test_checkpoint.py,
tests/train/test_run_safety.py)."""

from __future__ import annotations

from pathlib import Path


class Killed(BaseException):
    """The kill that ends the process in the middle of a removal."""


class KilledRmtree:
    """Stands in for ``shutil.rmtree``: its first call deletes one file of a ``model/`` in the folder (a checkpoint's,
    or the first checkpoint's in ``checkpoints/``) and the process is killed (:class:`Killed`), the rest (every
    ``trainer_state.json`` and ``state/`` too, unless removed before) left as it was. The process is dead then: a
    cleanup further up the stack removes nothing more."""

    def __init__(self) -> None:
        self.killed_in: Path | None = None

    def __call__(self, path, *args, **kwargs) -> None:
        if self.killed_in is None:
            self.killed_in = Path(path)
            inside = (p for p in sorted(self.killed_in.rglob("*")) if p.is_file())
            next(p for p in inside if "model" in p.relative_to(self.killed_in).parts[:-1]).unlink()
        raise Killed
