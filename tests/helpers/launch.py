"""Launching 2 CPU processes under a hard timeout, for the multi-process tests."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest


def two_processes() -> list[str]:
    """The command prefix that starts 2 CPU processes with ``accelerate launch`` (torchrun; gloo on a CPU-only
    machine) of this venv's Python on a free local port: append ``-m finecap.app.cli train ...`` or a script."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(port)]  # fmt: skip


def launch_bounded(cmd: list[str], log: Path, timeout: float, succeed: bool = True) -> str:
    """Run ``cmd`` (``accelerate launch`` of 2 processes, one torch thread each, its output to ``log``) and return
    what it printed; fail with :func:`failure_report` when it exits non-zero (``succeed=False``: a launch meant to
    fail, when it exits 0), and past ``timeout`` seconds kill the launcher and every process under it (torchrun
    starts each worker in a session of its own, so neither its end nor a process-group kill reaches a deadlocked
    worker) and fail."""
    import psutil  # a dependency of accelerate, so always installed with finecap

    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
            proc.wait()
            tail = log.read_text()[-3000:]
            pytest.fail(f"2 sharded processes did not finish within {timeout} s (a deadlock)\n{tail}")
    err = log.read_text()
    assert (proc.returncode == 0) == succeed, failure_report(err)
    return err


LAUNCHER_TRACEBACK = 'Traceback (most recent call last):\n  File "<frozen runpy>"'
"""How the launcher's own traceback (torchrun's ``ChildFailedError``) starts in a failed launch's output."""


def failure_report(err: str) -> str:
    """What a failed launch printed, for an assertion: the end of what the processes themselves printed before the
    launcher's traceback (where a rank that aborted says why: "terminate called without an active exception", a
    Python traceback), then the launcher's summary of which rank ended how."""
    cut = err.rfind(LAUNCHER_TRACEBACK)
    own, launcher = (err[:cut], err[cut:]) if cut >= 0 else (err, "")
    return f"{own[-4000:]}\n[the launcher]\n{launcher[-1500:]}"
