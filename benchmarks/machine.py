"""The machine a benchmark's numbers come from, recorded beside them: processor, usable CPUs, torch's thread count,
Python, torch and numpy versions, and the finecap commit. Every benchmark that times or measures prints
:func:`machine_line` with its numbers and stores :func:`machine` in its ``--json`` file
(``tests/benchmarks/test_benchmark_machine.py``).

Training is deterministic on one machine but not across processors: the same code, seeds and data gave other
weights on the AMD EPYC development machine of 2026-11-23/24 than on the Intel Xeon one of 2026-11-25 (docs/results.md,
"The demo at f316498 differs from the committed results"), so a result file says where it was made.
"""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def processor() -> str:
    """The processor's model name (``/proc/cpuinfo``), or what :func:`platform.processor` says elsewhere."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), platform.processor())


def commit() -> str:
    """The finecap commit of this checkout (``+`` when files differ from it), or ``unknown`` outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+" if dirty else "")


def machine() -> dict[str, str | int]:
    """``{processor, cpus, threads, python, torch, numpy, commit}`` of this process (``cpus``: the CPUs it may use;
    ``threads``: torch's intra-op threads when called, so call it after the benchmark sets them)."""
    import numpy
    import torch

    from finecap.utils.system import usable_cpus

    return {"processor": processor(), "cpus": usable_cpus(), "threads": torch.get_num_threads(),
            "python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__,
            "commit": commit()}  # fmt: skip


def machine_line(m: dict[str, str | int] | None = None) -> str:
    """``m`` (default: :func:`machine`) in one line, for a benchmark's printout."""
    m = machine() if m is None else m
    return (
        f"{m['processor']}, {m['cpus']} CPUs, torch threads {m['threads']}, Python {m['python']}, "
        f"torch {m['torch']}, finecap {m['commit']}"
    )
