"""What writing a report costs on the disk: ``fsync`` calls, seconds spent in them, and the report's wall seconds.

    FINECAP_HOME=HOME .venv/bin/python benchmarks/report_writes.py RUN_DIR [--repeat 3] [--retrieval] [--json]

Each round copies ``RUN_DIR`` (``finecap demo --quick``'s, say) to a fresh temporary folder, never touching it, and
writes the copy's default report (``report.html`` and its ``plots/``) with ``FINECAP_FSYNC=1`` (the durable path
every user gets), counting every ``os.fsync`` and the seconds inside them. The report's own records of what it
wrote go to the finecap home ``HOME`` (the demo's, whose world the report's gallery reads); pass a copy of it.
Without ``--retrieval`` the bag outcomes (a retriever's forward passes, seconds of CPU that say nothing of the
disk) are left out. Seconds depend on the disk and the load of the machine: say on which one they were measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine, machine_line  # noqa: E402  (benchmarks/machine.py)


def measure(run_dir: Path, *, retrieval: bool) -> dict[str, Any]:
    """One report of a copy of ``run_dir``: plots written, fsync calls and seconds, wall seconds."""
    from finecap.app.cli import main as finecap  # `finecap report`, as a user runs it, in this process

    os.environ["FINECAP_FSYNC"] = "1"
    calls, spent = [0], [0.0]
    real = os.fsync

    def fsync(fd: int) -> None:
        start = time.perf_counter()
        try:
            real(fd)
        finally:
            calls[0] += 1
            spent[0] += time.perf_counter() - start

    with tempfile.TemporaryDirectory(prefix="finecap-report-writes-") as scratch:
        run = Path(shutil.copytree(run_dir, Path(scratch) / run_dir.name, symlinks=True))
        os.fsync = fsync
        try:
            start = time.perf_counter()
            code = finecap(["report", str(run), "--quiet", *([] if retrieval else ["--no-bag-outcomes"])])
            wall = time.perf_counter() - start
        finally:
            os.fsync = real
        plots = len(list((run / "plots").glob("*.png")))
    if code != 0:
        raise SystemExit(f"finecap report {run_dir} exited {code}")
    return {"plots": plots, "fsyncs": calls[0], "fsync_s": round(spent[0], 3), "wall_s": round(wall, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--retrieval", action="store_true", help="compute the bag outcomes too")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rounds = [measure(args.run_dir, retrieval=args.retrieval) for _ in range(args.repeat)]
    if args.json:
        print(json.dumps({"machine": machine(), "rounds": rounds}))
        return
    print(machine_line())
    for r in rounds:
        print(f"{r['plots']} plots: {r['fsyncs']} fsyncs ({r['fsyncs'] / max(r['plots'], 1):.1f} a plot), "
              f"{r['fsync_s']:.3f} s in fsync, report {r['wall_s']:.3f} s")  # fmt: skip


if __name__ == "__main__":
    main()
