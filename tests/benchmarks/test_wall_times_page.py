"""The wall times docs/benchmarks.md's "In short" and README.md quote, against the session records under "Test suite
and demo wall times" that back them: each machine's range of passing fresh-clone ``make test`` and ``make demo``
runs, so that a session's new record outside a quoted range fails here until the summary says it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MACHINES = ("AMD EPYC", "Intel Xeon")


def section() -> str:
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    return text.split("## Test suite and demo wall times\n")[1].split("\n## ")[0]


def records() -> list[tuple[int, str, str, int]]:
    """(session, machine, "test" or "demo", seconds) of every passing run (``exit 0 in M min S s``) in the session
    paragraphs; the machine is the first named in the paragraph, the command the last named before the time."""
    runs = []
    for paragraph in section().split("\n\n"):
        session = re.match(r"Session (\d+)", paragraph)
        if not session:
            continue
        flat = " ".join(paragraph.split())
        machine = min((flat.index(m), m) for m in MACHINES if m in flat)[1]
        for run in re.finditer(r"exit 0 in (\d+) min (\d+) s", flat):
            before = flat[: run.start()]
            kind = "demo" if before.rfind("make demo") > before.rfind("make test") else "test"
            runs.append((int(session.group(1)), machine, kind, 60 * int(run.group(1)) + int(run.group(2))))
    return runs


def spans() -> list[tuple[int, int, str]]:
    """Consecutive sessions on one machine: (first, last, machine)."""
    out: list[tuple[int, int, str]] = []
    for session, machine, _, _ in sorted(records()):
        if out and out[-1][2] == machine:
            out[-1] = (out[-1][0], session, machine)
        else:
            out.append((session, session, machine))
    return out


def minutes(seconds: int) -> str:
    return f"{seconds // 60} min {seconds % 60} s"


def test_the_records_are_read():
    assert {kind for _, _, kind, _ in records()} == {"test", "demo"}
    assert [machine for _, _, machine in spans()] == ["AMD EPYC", "Intel Xeon", "AMD EPYC"]


def test_in_short_gives_each_machines_range_of_passing_runs():
    short = " ".join(section().split("\n\n")[0].split())
    for first, last, machine in spans():
        for kind in ("test", "demo"):
            times = [s for n, _, k, s in records() if first <= n <= last and k == kind]
            quoted = f"{minutes(min(times))} to {minutes(max(times))}"
            assert quoted in short, (machine, first, last, kind, quoted)


def test_the_readme_rounds_the_whole_range():
    readme = " ".join((ROOT / "README.md").read_text().split())
    for kind, words in (("test", "from a fresh clone on a 2-core CPU"), ("demo", None)):
        times = [s for _, _, k, s in records() if k == kind]
        low, high = round(min(times) / 60), round(max(times) / 60)
        if kind == "test":
            assert f"; {low}-{high} minutes {words}" in readme, (low, high)
        else:
            assert f"(`finecap demo`, {low}-{high} minutes on a 2-core CPU" in readme, (low, high)
