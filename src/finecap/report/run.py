"""Reading a run directory for the report, whatever stages and metrics it holds.

Two kinds of run directory are read. A folder of stages (``finecap demo`` writes one; any run with the same files
works) may hold:

- ``results.json``: ``{stage: {metric: value}}`` (row and column order kept);
- ``captions/<stage>.json``: each stage's captions in COCO results format (the first caption of each image is used);
- ``<stage>/metrics.jsonl``: each training stage's log (``{"step", "split", "values"}`` per line);
- ``bags_test.json`` (or another ``bags*.json`` that is not a curation output): TrueMatch bags;
- ``config.yaml``: the resolved configuration (data set, retriever, cache).

Nothing is assumed about which stages exist: the order is that of ``results.json``, then any other stage found, by
name. A run directory with none of the first three raises ``FileNotFoundError`` naming it.

A single run (what ``finecap train`` writes: ``config.yaml``, ``metrics.jsonl``, ``checkpoints/``; see
:mod:`finecap.runs`) is one stage named after its folder: its ``metrics.jsonl`` is that stage's log; its results
are ``results.json`` when it holds one, else the last validation event's values (:attr:`RunData.results_from`
says which step); its captions are ``captions/*.json`` when it holds them (``finecap caption --out
RUN/captions/test.json``: the first file, by name), else those its last evaluation logged (``train.log_captions``
validation images). Every evaluation's logged captions are kept in :attr:`RunData.logged_captions`.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finecap.data.bags_file import read_bags
from finecap.data.results import read_results
from finecap.report.plots import read_events
from finecap.runs import CONFIG_FILE, METRICS_FILE
from finecap.utils.reading import DATA_FILE, read_json


@dataclass
class RunData:
    """What a run directory holds (module docstring); absent parts are empty or None."""

    run_dir: Path
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    captions: dict[str, dict[Hashable, str]] = field(default_factory=dict)
    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    bags: dict[int, list[list[Hashable]]] | None = None
    bags_path: Path | None = None
    config_path: Path | None = None
    single: bool = False
    """A single run's directory (``finecap train``'s), not a folder of stages."""
    results_from: int | None = None
    """The step of the validation event a single run's results row was read from (None: from ``results.json``)."""
    logged_captions: dict[str, dict[int, dict[str, str]]] = field(default_factory=dict)
    """``{stage: {step: {image id (as logged): caption}}}``: the captions each evaluation logged as text."""

    @property
    def stages(self) -> list[str]:
        """Every stage named by results, captions or logs, in the order of ``results.json`` first."""
        names = list(self.results)
        for extra in sorted({*self.captions, *self.events} - set(names)):
            names.append(extra)
        return names

    def inputs(self) -> list[Path]:
        """The files of the run that a report reads (which its output may not replace)."""
        run_dir = self.run_dir
        found = [run_dir / "results.json", *sorted((run_dir / "captions").glob("*.json")), run_dir / METRICS_FILE,
                 *sorted(run_dir.glob("*/metrics.jsonl")), self.bags_path, self.config_path,
                 run_dir / "vcb_results.json", run_dir / "transfer" / "results.json",
                 *sorted(run_dir.glob("families*/*.json")), *sorted(run_dir.glob("families*/*.jsonl"))]  # fmt: skip
        return [p for p in found if p is not None and p.exists()]


def _ordered(found: dict[str, Any], order: list[str]) -> dict[str, Any]:
    return {k: found[k] for k in [*(o for o in order if o in found), *sorted(set(found) - set(order))]}


def find_bags(run_dir: Path) -> Path | None:
    """``bags_test.json``, else the first other ``bags*.json`` that is not a curation output."""
    if (run_dir / "bags_test.json").exists():
        return run_dir / "bags_test.json"
    candidates = [
        p for p in sorted(run_dir.glob("bags*.json")) if ".curated" not in p.name and ".decisions" not in p.name
    ]
    return candidates[0] if candidates else None


def logged_captions(events: list[dict[str, Any]]) -> dict[int, dict[str, str]]:
    """``{step: {image id: caption}}`` of the validation events that logged captions as text (``"text":
    {"captions": "<image id>: <caption>"}``, one per line: :func:`finecap.train.validators.caption_samples`)."""
    out: dict[int, dict[str, str]] = {}
    for event in events:
        text = (event.get("text") or {}).get("captions") if event.get("split") == "val" else None
        if not isinstance(text, str) or event.get("step") is None:
            continue
        rows = (line.partition(": ") for line in text.splitlines())
        out[int(event["step"])] = {i: caption for i, sep, caption in rows if sep}
    return out


def _read_single(run: RunData) -> None:
    """Fill ``run`` from a single run's directory (module docstring)."""
    name = run.run_dir.resolve().name
    events = read_events(run.run_dir / METRICS_FILE)
    run.single = True
    run.events = {name: events}
    run.logged_captions = {name: logged_captions(events)}
    if not run.results:
        val = [e for e in events if e.get("split") == "val" and e.get("values") and e.get("step") is not None]
        if val:
            values = {k: v for k, v in val[-1]["values"].items() if isinstance(v, int | float)}
            run.results, run.results_from = {name: values}, int(val[-1]["step"])
    saved = sorted((run.run_dir / "captions").glob("*.json"))
    if saved:
        run.captions = {name: {i: caps[0] for i, caps in read_results(saved[0]).items()}}
    elif run.logged_captions[name]:
        run.captions = {name: dict(run.logged_captions[name][max(run.logged_captions[name])])}


def read_run(run_dir: str | Path) -> RunData:
    """Read a run directory (module docstring): a single run when it holds ``metrics.jsonl``, else a folder of
    stages."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise NotADirectoryError(f"{run_dir}: a file, not a run directory (give the folder `finecap train` or "
                                 "`finecap demo` wrote)")  # fmt: skip
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: run directory not found")
    run = RunData(run_dir)
    if (run_dir / "results.json").exists():
        results = read_json(run_dir / "results.json", DATA_FILE)
        if not isinstance(results, dict) or not all(isinstance(v, dict) for v in results.values()):
            raise ValueError(f"{run_dir / 'results.json'}: expected {{stage: {{metric: value}}}}")
        run.results = results
    if (run_dir / METRICS_FILE).is_file():
        _read_single(run)
    else:
        order = list(run.results)
        captions = {p.stem: {i: caps[0] for i, caps in read_results(p).items()}
                    for p in sorted((run_dir / "captions").glob("*.json"))}  # fmt: skip
        run.captions = _ordered(captions, order)
        events = {p.parent.name: read_events(p) for p in sorted(run_dir.glob("*/metrics.jsonl"))}
        run.events = _ordered(events, order)
        run.logged_captions = {stage: found for stage, e in run.events.items() if (found := logged_captions(e))}
    if not (run.results or run.captions or run.events):
        raise FileNotFoundError(
            f"{run_dir}: no results.json, captions/*.json, metrics.jsonl or <stage>/metrics.jsonl here; is this a run "
            "directory (`finecap train`'s, or runs/demo after `finecap demo`)?"
        )
    run.bags_path = find_bags(run_dir)
    if run.bags_path is not None:
        run.bags = read_bags(run.bags_path)
    if (run_dir / CONFIG_FILE).exists():
        run.config_path = run_dir / CONFIG_FILE
    return run
