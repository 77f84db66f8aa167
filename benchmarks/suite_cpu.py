"""The CPU time of every test of a pytest run, and where the suite's time goes: a pytest plugin that records each
test's CPU seconds and wall seconds, and a report of the records.

    PYTHONPATH=benchmarks SUITE_CPU_OUT=/tmp/cpu.jsonl .venv/bin/python -m pytest -p suite_cpu \\
        -m "slow or not slow" -n 2 --dist worksteal
    .venv/bin/python benchmarks/suite_cpu.py /tmp/cpu.jsonl [--top 40] [--json summary.json]

``make test`` must stay under 15 minutes on the 2-core development machine, and the suite is CPU-bound (both xdist
workers busy from the end of collection to the end). So a test's cost is its CPU time, not its wall time: wall time
moves with whatever runs on the other core, CPU time barely does. The plugin appends one JSON line per test to
``SUITE_CPU_OUT``: ``id``, ``worker`` (xdist's id, else ``main``), ``start``, ``wall``, ``self`` and ``child``. These
cover setup, call and teardown, so a fixture is charged to the first test that builds it. ``self`` is the process's
user+system seconds. ``child`` is that of the children it reaped meanwhile: commands run as subprocesses, launches
of several processes, the Java jars. Each record also says what threads the test ran with: ``threads``, torch's
intra-op threads in its process (``null`` where torch was not imported), and ``omp``, that process's
``OMP_NUM_THREADS``, which the processes it starts inherit (``null``: unset). The suite's root conftest.py sets one
torch thread and ``OMP_NUM_THREADS=1`` unless set; the report's header line says what the records say
(:func:`machine_as_tested`), not the threads of the process printing it.

Not counted: children still alive when a test ends (a JVM a module fixture keeps open, a server), which are charged
to the test during which they are reaped, or to none. Also left out: collection (about 20 s a worker here), xdist's
own work and the other core's idle time. Several workers append to one file, one short line per write.
Session 38's profile (docs/benchmarks.md) was made with it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine, machine_line  # noqa: E402  (benchmarks/machine.py)

OUT_VARIABLE = "SUITE_CPU_OUT"
"""The environment variable naming the file the plugin appends to (never a default: a test run writes no file of its
own unless told)."""


def _cpu() -> tuple[float, float]:
    """User+system seconds of this process and of the children it has reaped."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get(OUT_VARIABLE):
        raise pytest.UsageError(f"-p suite_cpu: set {OUT_VARIABLE} to the file to append each test's record to")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # noqa: ARG001 (pytest's signature)
    start, (own, children) = time.time(), _cpu()
    yield
    end, (own_end, children_end) = time.time(), _cpu()
    worker = getattr(item.config, "workerinput", {}).get("workerid", "main")  # xdist's worker id, else main
    torch = sys.modules.get("torch")  # never imported here: the suite's conftest.py imports it after setting threads
    record = {"id": item.nodeid, "worker": worker, "start": start,
              "wall": end - start, "self": own_end - own, "child": children_end - children,
              "threads": torch.get_num_threads() if torch is not None else None,
              "omp": os.environ.get("OMP_NUM_THREADS")}  # fmt: skip
    with open(os.environ[OUT_VARIABLE], "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``SUITE_CPU_OUT`` file (blank lines skipped)."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def cpu(record: dict[str, Any]) -> float:
    """A record's CPU seconds, its reaped children's included."""
    return record["self"] + record["child"]


def machine_as_tested(records: list[dict[str, Any]]) -> dict[str, Any]:
    """:func:`machine.machine` of this process with the threads the tests ran with, as the records say: ``threads``,
    torch's intra-op threads in the test processes, and ``omp_threads``, their ``OMP_NUM_THREADS`` (one value, or the
    values seen joined by ``/``; ``unknown`` where no record says: records of an earlier plugin, or torch never
    imported).

    >>> m = machine_as_tested([{"threads": 1, "omp": "1"}, {"threads": 1, "omp": "1"}])
    >>> m["threads"], m["omp_threads"]
    (1, '1')
    >>> m = machine_as_tested([{"threads": 1, "omp": "1"}, {"threads": 2}])
    >>> m["threads"], m["omp_threads"]
    ('1/2', '1')
    """

    def said(key: str) -> Any:
        values = sorted({r[key] for r in records if r.get(key) is not None}, key=str)
        return values[0] if len(values) == 1 else "/".join(map(str, values)) if values else "unknown"

    return {**machine(), "threads": said("threads"), "omp_threads": said("omp")}


def header(m: dict[str, Any]) -> str:
    """The report's first line: the machine, with the tests' threads (:func:`machine_as_tested`)."""
    return f"{machine_line(m)} (torch threads: the tests'; their OMP_NUM_THREADS {m['omp_threads']})"


BUCKETS = (0.2, 1.0, 5.0)
"""Upper bounds (CPU-s) of the size classes :func:`summary` sums the tests into; the last class is above the last."""


def summary(records: list[dict[str, Any]], top: int = 40) -> dict[str, Any]:
    """What a profile says: the tests' CPU in all, the ``top`` costliest tests and files, the CPU in each size class
    (tests under 0.2 s, under 1 s, under 5 s, above), and each worker's span and CPU.

    >>> rows = [{"id": "tests/a/test_x.py::t1", "worker": "gw0", "start": 0.0, "wall": 2.0, "self": 1.5, "child": 0.0},
    ...         {"id": "tests/a/test_x.py::t2", "worker": "gw1", "start": 0.0, "wall": 9.0, "self": 0.5, "child": 7.0}]
    >>> s = summary(rows, top=1)
    >>> s["cpu"], s["tests"], s["top_tests"], s["top_files"], s["classes"]["< 5"], s["classes"]["> 5"]
    (9.0, 2, [['tests/a/test_x.py::t2', 7.5, 9.0]], [['tests/a/test_x.py', 9.0, 2]], 1.5, 7.5)
    """
    files: dict[str, list[float]] = defaultdict(list)
    for r in records:
        files[r["id"].split("::")[0]].append(cpu(r))
    classes: Counter[str] = Counter()
    for r in records:
        bound = next((b for b in BUCKETS if cpu(r) < b), None)
        classes[f"< {bound:g}" if bound is not None else f"> {BUCKETS[-1]:g}"] += cpu(r)
    workers = {}
    for worker in sorted({r["worker"] for r in records}):
        mine = [r for r in records if r["worker"] == worker]
        span = max(r["start"] + r["wall"] for r in mine) - min(r["start"] for r in mine)
        workers[worker] = {"tests": len(mine), "span": round(span, 1), "cpu": round(sum(map(cpu, mine)), 1)}
    ranked = sorted(records, key=cpu, reverse=True)[:top]
    return {
        "cpu": round(sum(map(cpu, records)), 1),
        "tests": len(records),
        "top_tests": [[r["id"], round(cpu(r), 1), round(r["wall"], 1)] for r in ranked],
        "top_files": [[f, round(sum(v), 1), len(v)] for f, v in sorted(files.items(), key=lambda kv: -sum(kv[1]))][
            :top
        ],
        "classes": {k: round(v, 1) for k, v in sorted(classes.items())},
        "workers": workers,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", help=f"the file {OUT_VARIABLE} named")
    parser.add_argument("--top", type=int, default=40, help="tests and files listed (default 40)")
    parser.add_argument("--json", help="also write the summary and the machine to this file")
    args = parser.parse_args(argv)
    records = read_records(args.records)
    s, m = summary(records, args.top), machine_as_tested(records)
    print(header(m))
    print(f"{s['tests']} tests, {s['cpu']:.1f} CPU-s (their processes and reaped children); by size: "
          + ", ".join(f"{k} s: {v:.1f}" for k, v in s["classes"].items()))  # fmt: skip
    for worker, w in s["workers"].items():
        print(f"  {worker}: {w['tests']} tests over {w['span']:.1f} s, {w['cpu']:.1f} CPU-s")
    print("costliest tests (CPU-s, wall s):")
    for name, c, wall in s["top_tests"]:
        print(f"  {c:7.1f} {wall:7.1f}  {name}")
    print("costliest files (CPU-s, tests):")
    for name, c, n in s["top_files"]:
        print(f"  {c:7.1f} {n:5d}  {name}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": m, **s}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
