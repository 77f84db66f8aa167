"""Training noise of a difference between two demo stages: stages A and B (default ``sle`` and ``scst``) trained
again from the same MLE checkpoint with other run seeds (``run.seed``: data order, dropout, the sampled rollouts),
so that the spread of ``A - B`` within one world seed can be set beside its spread across world seeds
(``benchmarks/effects.py``) and its test-split interval (``benchmarks/paired_difference.py``).

    FINECAP_HOME=<the sources' home> python benchmarks/training_noise.py runs/effects/seed0 runs/effects/seed1 \\
        --out runs/training_noise --run-seeds 1,2,3

Each source is a finished demo run directory (its ``results.json`` written by the report stage, its ``mle`` stage
done). For each source and run seed, ``<out>/<source name>-r<seed>/`` gets a copy of the source's ``mle`` stage (and
of its ``config.yaml`` and ``timings.json``, which make the folder one the demo recognises as a demo's) and
``finecap demo --out <that folder> --stages A,B <the source's settings> run.seed=<seed>`` trains A and B side by
side from it; the source's settings are those of its ``config.yaml`` that differ from the demo's defaults, as
``key=value`` overrides (:func:`source_overrides`), so its world, world encoder and cache must still be where its
configuration says, in the same finecap home. The demo resumes, so a killed run of this script continues where it
stopped. Scores are the demo table's: ``CIDEr-D`` of the captions of ``<stage>/captions_test.json`` and the sampled
``sample/Div-2`` (5 captions per test image at T = 1), both against the other four references of each image; the
source's own row (its run seed) is read from its ``results.json``. Printed: a row per run, then per source and over
all runs the mean and standard deviation of ``A - B`` and the number of runs where it is >= 0.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

METRICS = ("CIDEr-D", "sample/Div-2")


def repeat_dir(out: Path, source: Path, seed: int) -> Path:
    return out / f"{source.name}-r{seed}"


NOT_CARRIED = {("run", "dir"), ("run", "seed"), ("demo", "stages"), ("demo", "force"), ("demo", "quick")}
"""Settings of the source's configuration a repeat sets itself (``demo.quick`` through ``--quick``) or that do not
concern it."""


def source_overrides(source: Path) -> list[str]:
    """The settings of ``<source>/config.yaml`` that differ from the demo's defaults (with its ``demo.quick``), as
    ``section.key=value`` overrides (values as YAML), but for :data:`NOT_CARRIED`."""
    import yaml

    from finecap.config import load
    from finecap.recipes.settings import DEMO_BASE, DEMO_QUICK

    saved = load(str(source / "config.yaml"), []).to_dict()
    default = load(None, [], base=DEMO_BASE, over=DEMO_QUICK if saved["demo"]["quick"] else None).to_dict()

    def text(value: object) -> str:  # one line of YAML (a document end marker "..." after a scalar dropped)
        return yaml.safe_dump(value, default_flow_style=True, width=1 << 16).removesuffix("...\n").strip()

    return [f"{section}.{key}={text(value)}" for section, values in saved.items() for key, value in values.items()
            if value != default[section][key] and (section, key) not in NOT_CARRIED]  # fmt: skip


def train_repeat(source: Path, folder: Path, stages: Sequence[str], seed: int, extra: Sequence[str] = ()) -> None:
    """Train ``stages`` in ``folder`` from a copy of ``source``'s MLE stage with ``run.seed=seed`` and the overrides
    ``extra`` last (resumable)."""
    if not (source / "mle" / "DONE").exists():
        raise SystemExit(f"{source}: its mle stage has not finished (no {source / 'mle' / 'DONE'})")
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("config.yaml", "timings.json"):  # the demo's own files: the folder is then a demo's (check_demo_dir)
        if not (folder / name).exists():
            shutil.copy2(source / name, folder / name)
    if not (folder / "mle").exists():  # copied under a temporary name and renamed: a kill leaves no partial copy
        partial = folder / ".mle.copying"
        shutil.rmtree(partial, ignore_errors=True)  # this script's own leftover from a killed copy
        shutil.copytree(source / "mle", partial)
        partial.rename(folder / "mle")
    from finecap.config import load
    from finecap.utils.text import shell_command

    quick = ["--quick"] if load(str(source / "config.yaml"), []).demo.quick else []
    cmd = [sys.executable, "-m", "finecap.app.cli", "demo", "-q", *quick, "--out", str(folder), "--stages",
           ",".join(stages), *source_overrides(source), f"run.seed={seed}", *extra]  # fmt: skip
    log = folder.with_suffix(".log")
    print(f"== {folder.name}: {shell_command(cmd)} (log {log})", flush=True)
    with log.open("a") as f:
        code = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    if code:
        raise SystemExit(f"{folder.name}: the demo exited with {code}; see {log}")


def repeat_scores(folder: Path, stages: Sequence[str]) -> dict[str, dict[str, float]]:
    """The demo table's ``CIDEr-D`` and ``sample/Div-2`` of each of ``stages`` in a repeat folder."""
    from finecap.data.datasets import load_records
    from finecap.stages import finished_stages
    from finecap.stages.outputs import diversity_metrics
    from paired_difference import stage_items

    # the samples are decoded with each stage's own configuration (its config.yaml: its world, its run seed, which
    # seeds the sampled captions), the one it trained with
    demo = finished_stages(folder, stages)
    cfg = demo.cfg
    references = {r.image_id: r.captions[1:] for r in load_records(cfg, "test")}
    ciders = stage_items(folder, stages, "cider", "CIDEr-D")
    return {stage: {"CIDEr-D": statistics.fmean(items.values()),
                    "sample/Div-2": diversity_metrics(demo, stage, references)["sample/Div-2"]}
            for stage, items in zip(stages, ciders, strict=True)}  # fmt: skip


def source_scores(source: Path, stages: Sequence[str]) -> dict[str, dict[str, float]]:
    from finecap.utils.reading import read_json

    results = read_json(source / "results.json")
    missing = [s for s in stages if s not in results]
    if missing:
        raise SystemExit(f"{source / 'results.json'}: no row for {missing}; run the demo's report stage there first")
    return {s: {m: float(results[s][m]) for m in METRICS} for s in stages}


def summarise(rows: list[tuple[str, str, dict[str, dict[str, float]]]], a: str, b: str) -> str:
    """Markdown: a row per run (source, run seed, each metric of A and B and A - B), then A - B per source and overall
    as mean, sample standard deviation and how many runs have A - B >= 0."""
    head = " | ".join(f"{m} {a} | {m} {b} | {m} {a} − {b}" for m in METRICS)
    lines = [f"| source | run seed | {head} |", "| --- | --- | " + " | ".join(["---"] * 3 * len(METRICS)) + " |"]
    for source, seed, scores in rows:
        cells = " | ".join(f"{scores[a][m]:.3f} | {scores[b][m]:.3f} | {scores[a][m] - scores[b][m]:+.3f}"
                           for m in METRICS)  # fmt: skip
        lines.append(f"| {source} | {seed} | {cells} |")
    lines += ["", "| runs | n | " + " | ".join(f"{m} {a} − {b}: mean ± sd, runs >= 0" for m in METRICS) + " |",
              "| --- | --- | " + " | ".join(["---"] * len(METRICS)) + " |"]  # fmt: skip
    groups = {source: [r for r in rows if r[0] == source] for source, _, _ in rows}
    if len(groups) > 1:
        groups["all"] = rows
    for name, group in groups.items():
        cells = []
        for m in METRICS:
            d = [scores[a][m] - scores[b][m] for _, _, scores in group]
            sd = statistics.stdev(d) if len(d) > 1 else float("nan")
            cells.append(f"{statistics.fmean(d):+.3f} ± {sd:.3f}, {sum(x >= 0 for x in d)}/{len(d)}")
        lines.append(f"| {name} | {len(group)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sources", nargs="+", help="finished demo run directories (results.json, mle/DONE)")
    p.add_argument("--out", required=True, help="folder of the repeat runs (one sub-folder per source and seed)")
    p.add_argument("--stages", default="sle,scst", help="stages A,B (default sle,scst)")
    p.add_argument("--run-seeds", default="1,2,3", help="run seeds of the repeats (default 1,2,3)")
    p.add_argument("--summarise-only", action="store_true", help="score the repeats that have finished; train none")
    args = p.parse_args(argv)
    stages = args.stages.split(",")
    if len(stages) != 2:
        raise SystemExit(f"--stages: two stages A,B, got {args.stages!r}")
    seeds = [int(s) for s in args.run_seeds.split(",")]
    out = Path(args.out)
    rows: list[tuple[str, str, dict[str, dict[str, float]]]] = []
    for source in map(Path, args.sources):
        from finecap.config import load

        rows.append((source.name, str(load(str(source / "config.yaml"), []).run.seed), source_scores(source, stages)))
        for seed in seeds:
            folder = repeat_dir(out, source, seed)
            if not args.summarise_only:
                train_repeat(source, folder, stages, seed)
            if all((folder / s / "DONE").exists() for s in stages):
                rows.append((source.name, str(seed), repeat_scores(folder, stages)))
    print(summarise(rows, *stages))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
