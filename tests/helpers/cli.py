"""The command line run in this process, for the tests that check what a command prints and its exit code."""

from __future__ import annotations

import contextlib
import io
import sys

from finecap.app.cli import main


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``finecap ARGV`` in this process: (exit code, stdout, stderr). argparse's ``SystemExit`` (a usage error: 2,
    ``--help``: 0) is the exit code the process would have, as are other ``SystemExit`` codes (``None``: 0, a message:
    1, written to stderr as Python writes it). Any other exception the command line does not turn into a message
    propagates (and fails the test, as a traceback would)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
            if not isinstance(e.code, int | None):
                print(e.code, file=sys.stderr)
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


def error_line(argv: list) -> str:
    """The one ``finecap: error:`` line of ``finecap ARGV`` (paths given as they are, made text), which must fail
    with exit code 2 and no traceback nor ``MemoryError``."""
    code, _, err = run_cli([str(a) for a in argv])
    lines = [line for line in err.splitlines() if line.startswith("finecap: ")]
    assert code == 2, err
    assert "Traceback" not in err and "MemoryError" not in err, err
    assert len(lines) == 1 and lines[0].startswith("finecap: error: "), err
    return lines[0]


def succeeds(argv: list) -> str:
    """What ``finecap ARGV`` (paths made text) prints, which must succeed."""
    code, out, err = run_cli([str(a) for a in argv])
    assert code == 0, err
    return out
