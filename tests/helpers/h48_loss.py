"""Helpers of the issue-48 round-three tests of data loss, links and names (tests/test_hostile_r3_loss.py,
tests/test_hostile_r3_names.py): the command line run in this process, a refusal checked as one named error line,
and a snapshot of a folder to show that nothing in it changed."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

from finecap.app.cli import main

PRECIOUS = b"the user's own file: never to be deleted or overwritten\n"


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``finecap ARGV`` in this process: (exit code, stdout, stderr). An exception the command line does not turn
    into a message propagates (and fails the test, as a traceback would)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def refused(argv: list[str], *expected: str) -> str:
    """Run ``finecap ARGV``; assert exit code 2 and one ``finecap: error:`` line, no traceback, holding every
    ``expected`` text; return the line."""
    code, out, err = run_cli(argv)
    lines = [line for line in err.splitlines() if line.startswith("finecap: error:")]
    assert code == 2, (code, out, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    for text in expected:
        assert text in lines[0], (text, lines[0])
    return lines[0]


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
