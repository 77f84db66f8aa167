"""The command line: run (or resume) a paper's grid over seeds and write its page, rewrite the page alone, or list
the tables (the package docstring shows the commands)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from .evaluation import evaluate_run, unavailable_metrics
from .page import ITEMS_SUFFIX, ROOT, run_description, write_page
from .papers import PAPERS
from .runner import ensure_trained, make_grid
from .runs import RUNS
from .schema import Paper, Table


def result_path(data_dir: Path, paper: Paper, seed: int, key: str) -> Path:
    return data_dir / paper.key / f"seed{seed}" / f"{key}.json"


def items_path(result: Path) -> Path:
    """The per-image values beside a result file: ``<run>.items.json`` (:func:`.evaluation.item_group`)."""
    return result.with_name(result.stem + ITEMS_SUFFIX)


def runs_of(paper: Paper, tables: Sequence[Table]) -> list[str]:
    """The runs the tables need, in order of first use (each run's start is trained first by ensure_trained)."""
    keys: list[str] = []
    for table in tables:
        for row in table.rows:
            if table.runnable and row.run and row.run not in keys:
                keys.append(row.run)
    return keys


def run_grid(paper: Paper, tables: Sequence[Table], seeds: Sequence[int], *, quick: bool, runs_dir: Path,
             data_dir: Path, page_dir: Path, items: Sequence[str]) -> Path:  # fmt: skip
    """Run (or resume) every run the tables need on every seed, writing one result file per run and the page."""
    from finecap.app.prepare import prepare  # the world and the retriever, as every finecap command finds them
    from finecap.utils import atomic_write_text, write_json

    keys = runs_of(paper, tables)
    for seed in seeds:
        grid = make_grid(seed, runs_dir, items, quick)
        todo = [k for k in keys if not result_path(data_dir, paper, seed, k).exists()]
        print(f"== {paper.key}, seed {seed}: {len(keys) - len(todo)} of {len(keys)} runs have results; "
              f"to do: {', '.join(todo) or 'nothing'}", flush=True)  # fmt: skip
        if not todo:
            continue
        grid.run_dir.mkdir(parents=True, exist_ok=True)
        prepare(grid.cfg, {"world", "retriever"}, make=True)
        for key in todo:
            start = time.perf_counter()
            ensure_trained(grid, key)
            scores, groups = evaluate_run(grid, paper, key)
            run = RUNS[key]
            result = result_path(data_dir, paper, seed, key)
            # the items first: the result file marks the run done (write_json writes through a temporary file)
            atomic_write_text(items_path(result), json.dumps({"groups": groups}, separators=(",", ":")) + "\n")
            write_json(result, {
                "paper": paper.key, "run": key, "seed": seed, "quick": quick, "recipe": run.recipe,
                "overrides": list(run.overrides), "init": run.init, "captions": run.captions, "items": list(items),
                "unavailable": unavailable_metrics(paper),
                "finished": datetime.now(UTC).isoformat(timespec="seconds"),
                "seconds": round(time.perf_counter() - start, 1), "metrics": scores,
            })  # fmt: skip
            page = write_page(paper, data_dir, page_dir)
            print(f"== {key}: done in {time.perf_counter() - start:.0f} s; page {page}", flush=True)
    return write_page(paper, data_dir, page_dir)


def list_tables(paper: Paper) -> str:
    lines = [f"{paper.key}: {paper.title}"]
    for t in paper.tables:
        lines.append(f"  table {t.id}: {t.title}{'' if t.runnable else ' (not run yet)'}")
        for r in t.rows:
            if r.run:
                what = f"run {r.run} ({run_description(r.run)})"
            else:
                what = f"not comparable: {r.why}" if t.runnable else "not run yet"
            lines.append(f"    {r.label}: {what}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=sys.modules[__package__].__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--paper", required=True, choices=sorted(PAPERS))
    p.add_argument("--tables", default="", help="comma-separated table ids (default: every runnable table)")
    p.add_argument("--seeds", default="0,1", help="comma-separated world seeds, run in this order")
    p.add_argument("--quick", action="store_true", help="the demo's quick settings: checks the runner, no results")
    p.add_argument("--runs-dir", default="", help="run directories (default runs/paper_tables[-quick])")
    p.add_argument("--data-dir", default="", help="result files (default docs/reproductions/data; quick: in runs)")
    p.add_argument("--page-dir", default="", help="the Markdown page (default docs/reproductions; quick: in runs)")
    p.add_argument("--page-only", action="store_true", help="only rewrite the page from the result files")
    p.add_argument("--list", action="store_true", help="print the tables, their rows and runs, and exit")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides for every run")
    args = p.parse_args(argv)
    paper = PAPERS[args.paper]
    if args.list:
        print(list_tables(paper))
        return 0
    runs_dir = Path(args.runs_dir) if args.runs_dir else ROOT / "runs" / ("paper_tables-quick" if args.quick else
                                                                          "paper_tables")  # fmt: skip
    data_dir = Path(args.data_dir) if args.data_dir else (runs_dir / "data" if args.quick else
                                                          ROOT / "docs" / "reproductions" / "data")  # fmt: skip
    page_dir = Path(args.page_dir) if args.page_dir else (runs_dir if args.quick else ROOT / "docs" / "reproductions")
    if args.page_only:
        print(f"wrote {write_page(paper, data_dir, page_dir)}")
        return 0
    ids = [t for t in args.tables.split(",") if t.strip()]
    tables = [paper.table(t) for t in ids] if ids else [t for t in paper.tables if t.runnable]
    idle = [t.id for t in tables if not t.runnable]
    if idle:
        raise SystemExit(f"--tables: {', '.join(idle)} of {paper.key} are listed only (not run yet): no world runs")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    page = run_grid(paper, tables, seeds, quick=args.quick, runs_dir=runs_dir, data_dir=data_dir,
                    page_dir=page_dir, items=args.overrides)  # fmt: skip
    print(f"wrote {page}")
    return 0
