"""``finecap.utils.system.hangup_as_sigterm``: within the block a hang-up (SIGHUP: an SSH session dropped) calls
what SIGTERM's handler is then, as for SIGTERM; ``nohup``'s ignored SIGHUP and a caller's own handler are left;
SIGHUP's default is put back after; with SIGTERM's default the process dies by the hang-up, as without the block."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from finecap.utils.system import hangup_as_sigterm

pytestmark = [
    pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP on this platform"),
    pytest.mark.usefixtures("hangup_default"),  # a suite run under nohup ignores SIGHUP
]
SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture
def sigterm_seen():
    """SIGTERM's handler records the signal numbers it is called with; SIGTERM's and SIGHUP's handlers are put back."""
    seen: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    hup = signal.getsignal(signal.SIGHUP)
    yield seen
    signal.signal(signal.SIGTERM, before)
    signal.signal(signal.SIGHUP, hup)


def test_a_hang_up_in_the_block_is_sigterm_and_the_default_is_back_after(sigterm_seen):
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL
    with hangup_as_sigterm():
        assert callable(signal.getsignal(signal.SIGHUP))  # else the hang-up below would end the test process
        signal.raise_signal(signal.SIGHUP)
        assert sigterm_seen == [signal.SIGTERM]  # Python runs the handler before the next line
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL


def test_nohups_ignored_hang_up_and_a_callers_own_handler_are_left(sigterm_seen):
    for kept in (signal.SIG_IGN, lambda signum, frame: None):
        signal.signal(signal.SIGHUP, kept)
        with hangup_as_sigterm():
            assert signal.getsignal(signal.SIGHUP) is kept
        assert signal.getsignal(signal.SIGHUP) is kept
    assert sigterm_seen == []


def test_with_sigterms_default_the_process_dies_by_the_hang_up():
    code = "import signal\nfrom finecap.utils.system import hangup_as_sigterm\nwith hangup_as_sigterm():\n" \
           "    signal.raise_signal(signal.SIGHUP)\nprint('alive')\n"  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(SRC)})  # fmt: skip
    assert done.returncode == -signal.SIGHUP and "alive" not in done.stdout, done.stderr
