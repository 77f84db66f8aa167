"""Launching 2 CPU processes under a hard timeout, for the multi-process tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest


def launch_bounded(cmd: list[str], log: Path, timeout: float) -> None:
    """Run ``cmd`` (``accelerate launch`` of 2 processes, its output to ``log``); past ``timeout`` seconds kill the
    launcher and every process under it (torchrun starts each worker in a session of its own, so neither its end nor
    a process-group kill reaches a deadlocked worker) and fail."""
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
    rank0 = [line for line in err.splitlines() if line.startswith("[rank0]")]
    assert proc.returncode == 0, "\n".join(rank0[-40:]) + err[-2000:]
