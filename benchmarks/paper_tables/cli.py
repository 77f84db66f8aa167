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
from typing import TYPE_CHECKING

from machine import machine  # benchmarks/machine.py (benchmarks/ is on sys.path, as for the package itself)

from .evaluation import evaluate_run, unavailable_metrics
from .page import ITEMS_SUFFIX, ROOT, run_description, write_page
from .papers import PAPERS
from .runner import ensure_trained, make_grid, make_replicate, replicate_dir
from .runs import RUNS
from .schema import Paper, Table

if TYPE_CHECKING:
    from finecap.stages import StageRunner


def result_path(data_dir: Path, paper: Paper, seed: int, key: str, run_seed: int | None = None) -> Path:
    """``<data>/<paper>/seed<N>/<run>.json``; a run under another run seed M in ``seed<N>/run<M>/``."""
    folder = data_dir / paper.key / f"seed{seed}"
    return (folder if run_seed is None else folder / replicate_dir(run_seed)) / f"{key}.json"


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


def primary_runs(tables: Sequence[Table]) -> list[str]:
    """The trained runs of the tables' primary cells (:class:`.schema.Primary`: both rows), in order of first use:
    what ``--run-seeds`` repeats."""
    keys: list[str] = []
    for table in tables:
        by_id = {r.id: r for r in table.rows}
        for primary in table.primary:
            for row_id in (primary.row, primary.against):
                run = by_id[row_id].run
                if table.runnable and run and RUNS[run].recipe is not None and run not in keys:
                    keys.append(run)
    return keys


def replicate_plan(paper: Paper, tables: Sequence[Table]) -> tuple[frozenset[str], list[str]]:
    """What ``--run-seeds`` trains again under each run seed, and from what: ``(starts, keys)``. By default the runs
    of the tables' primary cells (:func:`primary_runs`), each with its whole chain retrained (no shared start); for a
    paper with :attr:`.schema.Paper.replicate_from_start`, every trained run of the tables but the runs others start
    from, which are the ``starts``, read from the world seed's own grid."""
    if not paper.replicate_from_start:
        return frozenset(), primary_runs(tables)
    trained = [k for k in runs_of(paper, tables) if RUNS[k].recipe is not None]
    starts = frozenset(RUNS[k].init for k in trained if RUNS[k].init is not None)
    return starts, [k for k in trained if k not in starts]


def record_run(grid: StageRunner, paper: Paper, key: str, result: Path, *, quick: bool, items: Sequence[str],
               run_seed: int | None = None, start_grid: StageRunner | None = None) -> None:  # fmt: skip
    """Train run ``key`` of ``grid`` (and its starts, those of ``start_grid`` when given:
    :func:`.runner.ensure_trained`) unless done, evaluate it for ``paper`` and write its items file, then its result
    file (which marks the run done: a killed runner does it again)."""
    from finecap.utils.files import atomic_write_text, write_json

    start = time.perf_counter()
    ensure_trained(grid, key, start_grid)
    scores, groups = evaluate_run(grid, paper, key)
    run = RUNS[key]
    # the items first: the result file marks the run done (write_json writes through a temporary file)
    atomic_write_text(items_path(result), json.dumps({"groups": groups}, separators=(",", ":")) + "\n")
    record = {
        "paper": paper.key, "run": key, "seed": seed_of(grid), "quick": quick, "recipe": run.recipe,
        "overrides": list(run.overrides), "init": run.init, "captions": run.captions, "items": list(items),
        "unavailable": unavailable_metrics(paper),
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": round(time.perf_counter() - start, 1), "machine": machine(), "metrics": scores,
    }  # fmt: skip
    if run_seed is not None:
        record = {**record, "run_seed": run_seed}
    write_json(result, record)


def seed_of(grid: StageRunner) -> int:
    return grid.cfg.world.seed


def ensure_shared(grid: StageRunner, paper: Paper, keys: Sequence[str]) -> None:
    """Make what a world seed's runs share and its run-seed replicates read (:func:`.runner.make_replicate`) with
    the world seed's own grid ``grid``, so that it is what the grid's own runs used: the boosted data set (its
    visual expert trained with run seed = world seed), the fluency LM, the test split's and the family world's
    bags."""
    from finecap.app.demo_families import family_world, has_families

    from .evaluation import paper_bags
    from .fluency import train_fluency_lm
    from .runner import ensure_boosted

    if any(RUNS[k].captions != "original" for k in keys) or paper.bags_from != "original":
        ensure_boosted(grid)
    if paper.fluency_lm:
        train_fluency_lm(grid)
    if "bags" in paper.metrics:
        paper_bags(grid, paper)
    if paper.families and has_families(grid.cfg):
        family_world(grid)


def run_replicates(paper: Paper, tables: Sequence[Table], seeds: Sequence[int], run_seeds: Sequence[int], *,
                   quick: bool, runs_dir: Path, data_dir: Path, page_dir: Path,
                   items: Sequence[str]) -> Path:  # fmt: skip
    """Run (or resume) the runs of the tables' primary cells (or every run from the shared start:
    :func:`replicate_plan`) again under each of ``run_seeds`` on every world seed
    (:func:`.runner.make_replicate`: in ``<runs>/seed<N>/run<M>/``), one result file per run in
    ``<data>/<paper>/seed<N>/run<M>/``, the page rewritten after each. A run whose result file exists is skipped, so
    the runner can be killed and started again, a run at a time, over days."""
    from finecap.train.prepare import prepare

    starts, keys = replicate_plan(paper, tables)
    for seed in seeds:
        grid = make_grid(seed, runs_dir, items, quick)
        for run_seed in run_seeds:
            replicate = make_replicate(seed, run_seed, runs_dir, items, quick, starts)
            todo = [k for k in keys if not result_path(data_dir, paper, seed, k, run_seed).exists()]
            print(f"== {paper.key}, world seed {seed}, run seed {run_seed}: {len(keys) - len(todo)} of {len(keys)} "
                  f"primary runs have results; to do: {', '.join(todo) or 'nothing'}", flush=True)  # fmt: skip
            if not todo:
                continue
            grid.run_dir.mkdir(parents=True, exist_ok=True)
            prepare(grid.cfg, {"world", "retriever"}, make=True)
            if not starts:  # the replicate's own world encoder (its key holds run.seed): a run on boosted captions
                # does not train one; runs from a shared start read the start's
                prepare(replicate.cfg, {"world", "retriever"}, make=True)
            ensure_shared(grid, paper, todo)
            for key in todo:
                start = time.perf_counter()
                result = result_path(data_dir, paper, seed, key, run_seed)
                record_run(replicate, paper, key, result, quick=quick, items=items, run_seed=run_seed,
                           start_grid=grid if starts else None)  # fmt: skip
                page = write_page(paper, data_dir, page_dir)
                print(f"== {key} (run seed {run_seed}): done in {time.perf_counter() - start:.0f} s; page {page}",
                      flush=True)  # fmt: skip
    return write_page(paper, data_dir, page_dir)


def run_grid(paper: Paper, tables: Sequence[Table], seeds: Sequence[int], *, quick: bool, runs_dir: Path,
             data_dir: Path, page_dir: Path, items: Sequence[str]) -> Path:  # fmt: skip
    """Run (or resume) every run the tables need on every seed, writing one result file per run and the page."""
    from finecap.train.prepare import prepare  # the world and the retriever, as every finecap command finds them

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
            record_run(grid, paper, key, result_path(data_dir, paper, seed, key), quick=quick, items=items)
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
    p.add_argument("--run-seeds", default="", help="comma-separated run seeds: run the tables' primary cells' runs "
                   "(the judges page: every run, from the shared MLE start) again under each (on every world seed; "
                   "none may be a world seed's own), results in seed<N>/run<M>/")  # fmt: skip
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
    if args.run_seeds:
        run_seeds = [int(s) for s in args.run_seeds.split(",") if s.strip()]
        clash = sorted(set(run_seeds) & set(seeds))
        if clash:
            raise SystemExit(f"--run-seeds: {', '.join(map(str, clash))} is also a world seed, whose own run has that "
                             "run seed (run.seed = world.seed): give other run seeds")  # fmt: skip
        page = run_replicates(paper, tables, seeds, run_seeds, quick=args.quick, runs_dir=runs_dir,
                              data_dir=data_dir, page_dir=page_dir, items=args.overrides)  # fmt: skip
        print(f"wrote {page}")
        return 0
    page = run_grid(paper, tables, seeds, quick=args.quick, runs_dir=runs_dir, data_dir=data_dir,
                    page_dir=page_dir, items=args.overrides)  # fmt: skip
    print(f"wrote {page}")
    return 0
