"""The Markdown page of a paper: its tables with the paper's numbers beside the world's and a verdict per row,
rendered from the result files (:func:`load_results`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .runs import RUNS
from .schema import Column, Items, Paper, Results, Row, Table, is_replicate, replicate_key
from .verdicts import (
    MIN_RUNS,
    Check,
    best_verdict,
    chance_note,
    fmt,
    fmt_width,
    length_matched,
    mean_std,
    row_checks,
    row_verdict,
    world_values,
)

ROOT = Path(__file__).resolve().parents[2]
"""The repository: pages name their data folder relative to it."""


def world_cell(results: Results, row: Row, column: Column) -> str:
    """Mean ± standard deviation over the world seeds of a row's column; ``(sat.)`` above the column's ceiling."""
    values = list(world_values(results, row, column).values())
    if not values:
        return "—"
    m, s = mean_std(values)
    saturated = " (sat.)" if column.ceiling is not None and m > column.ceiling else ""
    return fmt(m) + (f" ± {fmt_width(s)}" if len(values) > 1 else "") + saturated


def judged(table: Table) -> bool:
    """Whether a table has a row judged against another (a verdict to say how much noise it rests on)."""
    return table.runnable and any(r.run and r.vs for r in table.rows)


def render_table(table: Table, results: Results, items: Items | None = None) -> str:
    labels = [f"{c.label} {c.arrow}".strip() for c in table.columns]
    header = ["row", *labels, "world run", "verdict"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for row in table.rows:
        cells = [row.label]
        for i, column in enumerate(table.columns):
            paper = str(row.paper[i]) if row.paper and row.paper[i] is not None else "—"  # as the paper prints it
            world = world_cell(results, row, column) if table.runnable and row.run else "—"
            cells.append(f"{paper} / {world}")
        cells.append(f"`{row.run}`" if row.run and table.runnable else "—")
        cells.append(row_verdict(table, row, results, items))
        lines.append("| " + " | ".join(cells) + " |")
    out = "\n".join(lines)
    if judged(table) and results:
        out += f"\n\n{SECONDARY_NOTE}"
    verdict = best_verdict(table, results, items)
    return out + (f"\n\n{verdict}" if verdict else "")


SECONDARY_NOTE = (
    "Cells without ★ (secondary): one run: test-split noise only (one run per world seed, run seed = world seed; "
    "their per-seed intervals leave retraining noise out)."
)


def primary_table(paper: Paper, results: Results, items: Items | None = None) -> str:
    """The page's primary cells (each table's declared headline comparisons, :class:`.schema.Primary`): table, row,
    against, column, verdict and the noise it rests on; where run-seed replicates exist, also the verdict of the
    grid's own runs alone (test-split noise only) and, under the table, how many verdicts the run seeds changed."""
    own = own_runs(results), own_runs(items) if items is not None else None
    replicated = own[0] != results
    head = "| table | row | against | column | verdict | noise |" + (" one run per world seed |" if replicated else "")
    lines = [head, "| --- " * (7 if replicated else 6) + "|"]
    changed: list[str] = []
    judged_cells = 0
    for table in paper.tables:
        if not table.runnable:
            continue
        by_id = {r.id: r for r in table.rows}
        for p in table.primary:
            row, other = by_id[p.row], by_id[p.against]
            name = table.heading.split(":")[0]
            check = primary_check(table, row, other, p.column, results, items)
            verdict, noise = ("not run yet", "—") if check is None else (verdict_text(check), check.noise)
            line = f"| {name} | {row.label} | {other.label} | {p.column} | {verdict} | {noise} |"
            if replicated:
                alone = primary_check(table, row, other, p.column, *own)
                before = "—" if alone is None else verdict_text(alone)
                line += f" {before} |"
                if check is not None and alone is not None:
                    judged_cells += 1
                    if before != verdict:
                        changed.append(f"{name} {row.label} vs {other.label} {p.column}: {before} → {verdict}")
            lines.append(line)
    if len(lines) == 2:
        return ""
    out = "\n".join(lines)
    if replicated:
        out += (f"\n\nVerdicts the run seeds changed: {len(changed)} of {judged_cells} primary cells"
                + (" (" + "; ".join(changed) + ")." if changed else "."))  # fmt: skip
    return out


def primary_check(
    table: Table, row: Row, other: Row, column: str, results: Results, items: Items | None
) -> Check | None:
    """The check of primary cell ``row`` vs ``other`` on ``column``, or ``None`` before its runs."""
    return next((c for c in row_checks(table, row, results, items) if c.primary and c.against == other.id
                 and c.column.split(" vs ")[0] == column), None)  # fmt: skip


def verdict_text(check: Check) -> str:
    """A cell's verdict with what qualifies it: judged at matched length, or on a saturated column."""
    matched = " at matched length" if check.matched else ""
    return check.verdict + matched + (" (saturated)" if check.saturated else "")


def own_runs(results: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """``results`` (or items) without the run-seed replicates (:func:`.schema.is_replicate`): each world seed's own
    grid runs."""
    return {seed: {k: v for k, v in runs.items() if not is_replicate(k)} for seed, runs in results.items()}


def run_description(key: str) -> str:
    run = RUNS[key]
    if run.recipe is None:
        return "the human references: the first caption of each test image, scored against the other four"
    parts = [f"recipe `demo/{run.recipe}`"]
    if run.overrides:
        parts.append("overrides " + ", ".join(f"`{o}`" for o in run.overrides))
    parts.append(f"from `{run.init}`" if run.init else "from random weights")
    if run.captions != "original":
        steps = ", as many steps as `mle`" if run.recipe == "mle" else ""
        parts.append(f"trained on and scored against the {FIELD_NAMES[run.captions]} captions (the demo's VCB "
                     f"settings: longer captions{steps})")  # fmt: skip
    if run.corpus:
        parts.append(f"trained on the {run.corpus} corpus (SMILE Fig. 4b)")
    return "; ".join(parts)


FIELD_NAMES = {"blend": "BlendCap", "holistic": "HolisticCap"}


def render_page(paper: Paper, results: Results, meta: dict[str, Any]) -> str:
    seeds = sorted(results)
    quick = meta.get("quick", False)
    lines = []
    if quick:
        lines += [f"> {QUICK_NOTE}", ""]
    # a page without a paper's text (finecap's own check, ``source`` ""): its title alone, its signs in its data
    text = f" The paper's text: `shared/papers/{paper.source}`." if paper.source else ""
    lines += [
        f"# {paper.title}" + (": the paper's tables on the world" if paper.source else ""),
        "",
        "Generated by [`benchmarks/paper_tables.py`](../../benchmarks/paper_tables.py) "
        f"(`python benchmarks/paper_tables.py --paper {paper.key}`) from the result files under "
        f"`{meta.get('data', 'docs/reproductions/data')}/{paper.key}/`; do not edit by hand.{text}",
        "",
        *intro(paper),
        "",
        f"World seeds with results: {', '.join(map(str, seeds)) if seeds else 'none yet'}. Budget: "
        + ("the demo's quick settings (a world of 300 training scenes, 12 training steps per run)." if quick else
           "the default demo world (10,000 training scenes, 64×64 images) and the demo recipes' budgets "
           "(docs/demo.md); every run starts from the seed's MLE start unless its row says otherwise."),
        "",
    ]  # fmt: skip
    if paper.notes:
        lines += [paper.notes, ""]
    if results and (primary := primary_table(paper, results, meta.get("items"))):
        lines += ["## Primary cells", "", PRIMARY_NOTE, "", primary, ""]
    if results and (note := chance_note(paper, results, meta.get("items"))):
        lines += [note, ""]
    for table in paper.tables:
        lines += [f"## {table.heading}", ""]
        if not table.runnable:
            lines += ["Not run yet: the rows are listed with the paper's numbers; their world runs are not defined "
                      "in `benchmarks/paper_tables.py` yet.", ""]  # fmt: skip
        if table.notes:
            lines += [table.notes, ""]
        if table.rows:
            lines += [render_table(table, results, meta.get("items")), ""]
        if table.computed_note is not None and (note := table.computed_note(results)):
            lines += [note, ""]
    used = set()
    for key in {r.run for t in paper.tables if t.runnable for r in t.rows if r.run}:  # the rows' runs and starts
        while key is not None and key not in used:
            used.add(key)
            key = RUNS[key].init
    if any(RUNS[k].captions != "original" for k in used):
        used.add("visual_expert")  # makes the boosted data set
    used = sorted(used)
    if used:
        lines += ["## The world runs", "", "| run | how it is made |", "| --- | --- |"]
        lines += [f"| `{key}` | {run_description(key)} |" for key in used]
        lines.append("")
    if paper.provenance and meta.get("runs"):
        lines += [provenance_table(meta["runs"]), ""]
    if meta.get("unavailable"):
        lines += ["Metrics not computed: " + "; ".join(f"{k}: {v}" for k, v in sorted(meta["unavailable"].items())),
                  ""]  # fmt: skip
    return "\n".join(lines)


PROVENANCE = ("machine", "seconds", "finished")
"""What a result file says of where and when it was made (:func:`.cli.record_run`), kept for
:func:`provenance_table`."""


def provenance_table(runs: dict[int, dict[str, dict[str, Any]]]) -> str:
    """Where and when each result file was made: world seed, run seed, run, processor and CPUs, finecap commit,
    when it finished and the seconds it took (training and evaluation; on a shared machine, wall time under its
    load), from the result files (:data:`PROVENANCE`)."""
    lines = ["## Where and when the runs ran", "",
             "| world seed | run seed | run | machine | finecap | finished (UTC) | seconds |",
             "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for seed in sorted(runs):
        for key in sorted(runs[seed], key=lambda k: (is_replicate(k), k)):
            record = runs[seed][key]
            run, _, run_seed = key.partition("@r")
            machine = record.get("machine") or {}
            where = f"{machine.get('processor', '?')}, {machine.get('cpus', '?')} CPUs"
            seconds = "?" if record.get("seconds") is None else f"{record['seconds']:.0f}"
            lines.append(f"| {seed} | {run_seed or seed} | `{run}` | {where} | {machine.get('commit', '?')} | "
                         f"{record.get('finished') or '?'} | {seconds} |")  # fmt: skip
    return "\n".join(lines)


PRIMARY_NOTE = (
    "One per row group of each paper table, declared in the page's schema before any run: the paper's headline "
    f"comparison. With {MIN_RUNS} run seeds or more per world seed (`--run-seeds`), its interval on each world seed "
    "is over run seeds and test images (a random-effects t); with one run, over the test images alone."
)


def intro(paper: Paper) -> list[str]:
    """The page's paragraph on cells and verdicts (the rule of :mod:`.verdicts`), and what "holds" means."""
    matched = any(length_matched(r, o, c) for t in paper.tables for r in t.rows if r.run
                  for o in (x for x in t.rows if x.id in r.vs and x.run) for c in t.columns)  # fmt: skip
    ceiling = any(c.ceiling is not None for t in paper.tables for c in t.columns)
    off = any(c.sign_from for t in paper.tables for c in t.columns)
    text = (
        "Each cell is **paper / world**: the paper's number, then finecap's analogue on the embedded world (mean ± "
        "standard deviation over the world seeds run; a world seed is a different world, `world.seed`, trained with "
        "run seed `run.seed` = the world seed). The world is a stand-in for COCO: its captioners are tiny models "
        "trained from scratch, so the numbers are not comparable in size, only the direction of each effect is. "
        "**Verdict**: a row judged against another row is judged column by column. The paper's effect: ↑ / ↓, or = "
        "where the paper shows no change (numbers closer than half a point, or a row the text calls unchanged). The "
        "world's difference Δ is compared with its noise on each world seed: the 95% paired-bootstrap interval over "
        "the test images of that seed's run (*one run: test-split noise only*), or, for a primary cell (★) with "
        f"{MIN_RUNS} run seeds or more on that world seed, the 95% random-effects t interval over run seeds and test "
        "images (retraining and test-split noise). A cell *holds* when every seed's interval excludes 0 in the "
        "paper's direction (for =: covers 0), is *reversed* (for =: *changed*) when every one excludes 0 the other "
        "way, *within noise* when every one covers 0, and *mixed* otherwise (`per seed` counts the seeds' outcomes; "
        "`Δ mean ± half-width, n seeds` is the seeds' 95% t-interval, which gives the effect's spread and does not "
        "decide). Without per-image values the seeds' t-interval alone decides (*within the seeds' spread* when it "
        "covers 0). An interval of zero width (every image's difference alike, or a count that moved equally on "
        "every seed) measures no noise and decides nothing: *no noise estimate*, as for one seed without per-image "
        "values. The row's word comes from its directional cells alone: *holds* when every one holds, *partly "
        "holds* when one does, *reversed* when every one reverses, *does not hold* when none holds and one "
        "reverses, *within noise*; no-change cells are listed but never make a row hold (a row of = cells alone is "
        "*unchanged within noise* or *changed*); *reference* = a row others are judged against."
    )
    if off:
        text += (" Retrieval off the ceiling: the hard RD100 (the 99 distractors hold the image's 9 one-detail "
                 "family members) and family R@1 (among the 10 members) are judged beside RD100 with the paper's "
                 "RD100 direction, from the per-image values every result file has.")  # fmt: skip
    if ceiling:
        text += (" A cell of a column with a ceiling (RD100: 90) where either row's mean is above it is marked "
                 "saturated (`(sat.)` in the table) and left out of the row's word: RD100 differences there are "
                 "squeezed into a few points.")  # fmt: skip
    if matched:
        text += (" **Boosted-field CIDEr-D** (a run trained on BlendCap or HolisticCap, scored against its own "
                 "field's one long caption) follows caption length (the check table's correlation), so it is judged "
                 "*at matched length*: on the test images whose two captions have the same number of words, paired "
                 "(a length-stratified comparison at its finest; the cell prints how many images and the difference "
                 "over every image). Not against the human references: their CIDEr-D has no per-image values in the "
                 "result files, and their 9-word captions penalise long captions through CIDEr-D's length penalty, "
                 "the opposite bias. Between a boosted field and the human captions (other references, other "
                 "lengths) the cell is printed and not judged.")  # fmt: skip
    text += (" **What \"holds\" means**: the world's difference is past 0 in the paper's direction on every world "
             "seed, beyond the noise of that seed's interval: for a ★ cell with run seeds, beyond retraining and "
             "test-split noise; for every other cell, beyond the test split's noise only, which retraining noise "
             "(several times larger, the multiplicity note below) can still produce.")  # fmt: skip
    return [text]


QUICK_NOTE = (
    "QUICK RUN (paper_tables.py --quick): a tiny world and a few training steps per run, to check that the runner "
    "works. These numbers are not results."
)


ITEMS_SUFFIX = ".items.json"
"""A run's per-image values, beside its result file ``<run>.json``: ``<run>.items.json``."""


def load_results(data_dir: Path, paper: Paper) -> tuple[Results, dict[str, Any]]:
    """Every result file of ``paper`` under ``data_dir``: ``{seed: {run: metrics}}`` (a world seed's runs under
    other run seeds, ``seed<N>/run<M>/<run>.json``, as ``<run>@r<M>``) and what the page says about
    them (quick runs present, metrics not computed, and ``meta["items"]``: the per-image values, :data:`Items`, of
    the runs that have an items file)."""
    from finecap.utils.reading import read_json

    results: Results = {}
    items: Items = {}
    meta: dict[str, Any] = {"quick": False, "unavailable": {}, "items": items}
    folder = data_dir / paper.key
    for path in sorted([*folder.glob("seed*/*.json"), *folder.glob("seed*/run*/*.json")]):
        seed_dir = path.parent if path.parent.name.startswith("seed") else path.parent.parent
        match = re.fullmatch(r"seed(\d+)", seed_dir.name)
        replicate = re.fullmatch(r"run(\d+)", path.parent.name)
        if match is None or path.name.endswith(ITEMS_SUFFIX) or (seed_dir != path.parent and replicate is None):
            continue
        seed = int(match.group(1))
        key = path.stem if replicate is None else replicate_key(path.stem, int(replicate.group(1)))
        record = read_json(path)
        results.setdefault(seed, {})[key] = record["metrics"]
        meta.setdefault("runs", {}).setdefault(seed, {})[key] = {k: record.get(k) for k in PROVENANCE}
        meta["quick"] = meta["quick"] or bool(record.get("quick"))
        meta["unavailable"].update(record.get("unavailable", {}))
        if (per_image := path.with_name(path.stem + ITEMS_SUFFIX)).exists():
            items.setdefault(seed, {})[key] = read_items(read_json(per_image))
    return results, meta


def read_items(record: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``{metric key: {image id (as text): value}}`` of an items file (images without a value left out)."""
    out: dict[str, dict[str, float]] = {}
    for group in record["groups"]:
        ids = [str(i) for i in group["ids"]]
        for key, values in group["values"].items():
            out[key] = {i: float(v) for i, v in zip(ids, values, strict=True) if v is not None}
    return out


def write_page(paper: Paper, data_dir: Path, page_dir: Path) -> Path:
    from finecap.utils.files import atomic_write_text

    results, meta = load_results(data_dir, paper)
    data = data_dir.resolve()
    meta["data"] = str(data.relative_to(ROOT)) if data.is_relative_to(ROOT) else str(data)
    path = page_dir / f"{paper.key}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, render_page(paper, results, meta))
    return path
