"""Reading a run directory for the report, whatever stages and metrics it holds.

A run directory (``finecap demo`` writes one; any run with the same files works) may hold:

- ``results.json``: ``{stage: {metric: value}}`` (row and column order kept);
- ``captions/<stage>.json``: each stage's captions in COCO results format (the first caption of each image is used);
- ``<stage>/metrics.jsonl``: each training stage's log (``{"step", "split", "values"}`` per line);
- ``bags_test.json`` (or another ``bags*.json`` that is not a curation output): TrueMatch bags;
- ``config.yaml``: the resolved configuration (data set, retriever, cache).

Nothing is assumed about which stages exist: the order is that of ``results.json``, then any other stage found, by
name. A run directory with none of the first three raises ``FileNotFoundError`` naming it.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finecap.data.bags_file import read_bags
from finecap.data.results import read_results
from finecap.report.plots import read_events
from finecap.runs import CONFIG_FILE
from finecap.utils import DATA_FILE, read_json


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
        found = [run_dir / "results.json", *sorted((run_dir / "captions").glob("*.json")),
                 *sorted(run_dir.glob("*/metrics.jsonl")), self.bags_path, self.config_path]  # fmt: skip
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


def read_run(run_dir: str | Path) -> RunData:
    """Read a run directory (module docstring)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: run directory not found")
    run = RunData(run_dir)
    if (run_dir / "results.json").exists():
        results = read_json(run_dir / "results.json", DATA_FILE)
        if not isinstance(results, dict) or not all(isinstance(v, dict) for v in results.values()):
            raise ValueError(f"{run_dir / 'results.json'}: expected {{stage: {{metric: value}}}}")
        run.results = results
    order = list(run.results)
    captions = {p.stem: {i: caps[0] for i, caps in read_results(p).items()}
                for p in sorted((run_dir / "captions").glob("*.json"))}  # fmt: skip
    run.captions = _ordered(captions, order)
    events = {p.parent.name: read_events(p) for p in sorted(run_dir.glob("*/metrics.jsonl"))}
    run.events = _ordered(events, order)
    if not (run.results or run.captions or run.events):
        raise FileNotFoundError(
            f"{run_dir}: no results.json, captions/*.json or <stage>/metrics.jsonl here; is this a run directory "
            "(e.g. runs/demo after `finecap demo`)?"
        )
    run.bags_path = find_bags(run_dir)
    if run.bags_path is not None:
        run.bags = read_bags(run.bags_path)
    if (run_dir / CONFIG_FILE).exists():
        run.config_path = run_dir / CONFIG_FILE
    return run
