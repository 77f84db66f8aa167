"""SLE against SCST trained to a plateau with validation-selected checkpoints: one world seed, four run seeds, the
paired differences with their intervals (issue 35, "SLE settled").

    FINECAP_HOME=<home of the source> nice -n 10 python benchmarks/sle_vs_scst.py runs/effects/seed2 \\
        --out runs/sle_vs_scst

The source is a finished demo run directory of the world seed (its ``mle`` stage done; the default demo's
settings). For each run seed (``--run-seeds``, default 0,1,2,3) ``<out>/<source name>-r<seed>/`` gets a copy of the
source's MLE stage and ``finecap demo --stages sle,scst`` trains both from it with the source's own settings
(``benchmarks/training_noise.py``'s :func:`~training_noise.train_repeat`), ``run.seed=<seed>`` and :data:`PLATEAU`:

- **budget**: 400 optimizer steps of 64 images (four times the demo's 100; about 2.6 epochs of the default world's
  10,000 training images), learning rate and everything else the demo's;
- **selection**: the CIDEr-D validator every 25 steps (``train.validators=[cider]``, ``train.best_metric=cider_d``:
  beam-5 captions of the 500 validation images against all their references), and the test captions come from the
  best validation checkpoint, as the exploration paper reports validation-selected models;
- **plateau**: a run counts as having reached its plateau when its best validation CIDEr-D was already reached,
  within :data:`PLATEAU_TOLERANCE` (0.01, one point on the paper's x100 scale), by step 300, i.e. the last quarter
  of the budget added nothing. Runs that did not are flagged in the table (their budget was too short), not left out.

Resumable: a killed run of this script continues where it stopped (the demo resumes its stages; a pair whose result
file exists is not retrained). Each finished pair writes ``<results>/<source name>-r<seed>.json`` at once (default
``benchmarks/results/sle_vs_scst/``, in the repository): both stages' test CIDEr-D (top beam against the other four
references, as the demo's rows) and sampled Div-2 (5 captions at T = 1), SLE − SCST with its 95% paired-bootstrap
interval over the test images (``benchmarks/paired_difference.py``), each stage's best validation step and value,
final validation value and plateau flag, both validation curves, and the validation CIDEr-D of the MLE start they
train from (:func:`start_value`), so that a run falling below its start shows when it did. The printed table (also
written to ``<results>/summary.md``) has a row per run seed, then the mean SLE − SCST over the run seeds with a 95%
t-interval (n - 1 degrees of freedom) and its standard deviation: the training noise the single pairs of
docs/results.md could not separate from the effect; then a table of the validation curves (the start, each stage's
best and last value, its evaluations below the start).

The learning rate is constant (the demo's), so each run's first 100 steps are those of the 100-step run of the same
world and run seed in docs/results.md's training-noise table (checked for run seed 0: its training rewards equal
those of the demo's own ``sle`` stage of world 2 at every logged step of the first 100): the curves of run seeds 1
and 2 on world 2 show what happened in the two runs that ended below their MLE start.

Time, measured on 2026-11-24 (the 2-core development machine, nothing else running): 27 minutes for the four run
seeds of world 2, 6-7 minutes per pair (400 steps of SLE and SCST side by side, 2 x 16 validations, test captioning
and sampling); the MLE starts' validation CIDEr-D added 10 s. Results and write-up: docs/results.md, "SLE against
SCST to the validation peak".
``--quick`` (on a ``finecap demo --quick`` source) checks the script in a few minutes and writes under ``<out>``
instead of the repository; its numbers are not results (the quick MLE start gives every image the same caption).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path

STAGES = ("sle", "scst")
EVAL_EVERY = 25
MAX_STEPS = 400
PLATEAU = (f"train.max_steps={MAX_STEPS}", f"train.eval_every={EVAL_EVERY}", "train.validators=[cider]",
           "train.best_metric=cider_d")  # fmt: skip
"""The overrides that train to a plateau and select by validation CIDEr-D (module docstring)."""
QUICK = ("train.max_steps=8", "train.eval_every=4", "train.validators=[cider]", "train.best_metric=cider_d")
"""``--quick``: the same selection on 8 steps (a check of the script, not a result)."""
PLATEAU_TOLERANCE = 0.01
"""How much the last quarter of the budget may improve the best validation CIDEr-D of a run at its plateau."""
RESULTS = Path(__file__).resolve().parent / "results" / "sle_vs_scst"


def validation_curve(stage_dir: Path) -> list[tuple[int, float]]:
    """``(step, cider_d)`` of every evaluation of a stage's run (its ``metrics.jsonl``)."""
    from finecap.report.plots import read_events  # values as logged, whichever way the run wrote them

    events = read_events(stage_dir / "metrics.jsonl")
    return [(e["step"], float(e["values"]["cider_d"])) for e in events
            if e["split"] == "val" and "cider_d" in e["values"]]  # fmt: skip


def plateau(curve: Sequence[tuple[int, float]], window: int = 0, tol: float = PLATEAU_TOLERANCE) -> dict:
    """Best validation step and value (the earliest of equal ones, as the training loop keeps it), the final value,
    and whether the best was reached (within ``tol``) before the last ``window`` steps (default: the last quarter of
    the run's steps).

    >>> plateau([(25, 1.0), (50, 1.5), (75, 1.505), (100, 1.4)], window=50)
    {'best_step': 75, 'best': 1.505, 'final': 1.4, 'plateau': True}
    >>> plateau([(25, 1.0), (50, 1.2), (75, 1.3), (100, 1.5)], window=50)['plateau']
    False
    """
    if not curve:
        raise ValueError("no validation CIDEr-D in the run's metrics.jsonl (was train.validators=[cider] set?)")
    last = curve[-1][0]
    window = window or last // 4
    best_step, best = max(curve, key=lambda sv: (sv[1], -sv[0]))
    early = [v for s, v in curve if s <= last - window]
    return {"best_step": best_step, "best": best, "final": curve[-1][1],
            "plateau": bool(early) and max(early) >= best - tol}  # fmt: skip


def start_value(folder: Path) -> float:
    """Validation CIDEr-D of the MLE checkpoint both stages start from (``train.init_from`` of the ``sle`` stage's
    configuration), measured by the stages' own validator (:func:`finecap.train.validators.cider_validator`, the
    same captions and references as every point of their curves): the level a run "below its MLE start" fell under.
    Training does not evaluate at step 0, so it is measured here, once per pair (a few seconds)."""
    import torch
    from accelerate import Accelerator

    from finecap.config import load
    from finecap.train.setup import build_model
    from finecap.train.validators import cider_validator

    cfg = load(str(folder / "sle" / "config.yaml"), [])
    model = build_model(cfg).eval()
    with torch.no_grad():
        return float(cider_validator(cfg)(model, cfg, Accelerator(cpu=True))["cider_d"])


def pair_result(folder: Path) -> dict:
    """The result of one finished pair (module docstring): test metrics, the paired bootstrap, the validation curves'
    best and plateau."""
    from paired_difference import paired_bootstrap, stage_items
    from training_noise import repeat_scores

    scores = repeat_scores(folder, STAGES)
    sle, scst = stage_items(folder, STAGES, "cider", "CIDEr-D")
    mean, low, high = paired_bootstrap([sle[i] - scst[i] for i in sle])
    curves = {stage: validation_curve(folder / stage) for stage in STAGES}
    return {
        "stages": scores,
        "cider_difference": {"mean": mean, "low": low, "high": high},
        "div2_difference": scores["sle"]["sample/Div-2"] - scores["scst"]["sample/Div-2"],
        "validation": {stage: plateau(curve) for stage, curve in curves.items()},
        "validation_start": start_value(folder),
        "curves": curves,
    }


def t_interval(values: Sequence[float]) -> tuple[float, float, float, float]:
    """Mean, sample standard deviation and the 95% t-interval of the mean (nan bounds for fewer than 2 values;
    :func:`paired_difference.t_interval`).

    >>> [round(v, 4) for v in t_interval([0.1, -0.1, 0.2, 0.0])]  # sd 0.1291, 3.182 * 0.1291 / 2 = 0.2054
    [0.05, 0.1291, -0.1554, 0.2554]
    """
    from paired_difference import t_interval as interval

    mean, low, high = interval(values)
    return mean, statistics.stdev(values) if len(values) > 1 else float("nan"), low, high


def summarise(results: dict[str, dict]) -> str:
    """Markdown: a row per run (test CIDEr-D of both, SLE − SCST with its test-image interval, sampled Div-2
    difference, best validation steps, plateau flags), then the mean over the runs with its t-interval."""
    lines = [
        "| run | CIDEr-D SLE | CIDEr-D SCST | SLE − SCST [95% over test images] | Div-2 (rs) SLE − SCST | "
        "best val step SLE / SCST | best before the last quarter SLE / SCST |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    curves = [
        "",
        "Validation CIDEr-D (the validator's: beam 5, all references): the MLE start both stages train from, each "
        "stage's best (its step), its last, and how many of its evaluations fell below the start (the first such "
        "step).",
        "",
        "| run | MLE start | SLE best (step) | SLE last | SLE below start | SCST best (step) | SCST last | "
        "SCST below start |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    header = len(curves)
    for name, r in results.items():
        c, v = r["cider_difference"], r["validation"]
        flags = " / ".join("yes" if v[s]["plateau"] else "no (budget short)" for s in STAGES)
        lines.append(f"| {name} | {r['stages']['sle']['CIDEr-D']:.3f} | {r['stages']['scst']['CIDEr-D']:.3f} | "
                     f"{c['mean']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}] | {r['div2_difference']:+.3f} | "
                     f"{v['sle']['best_step']} / {v['scst']['best_step']} | {flags} |")  # fmt: skip
        if "validation_start" in r:
            start, row = r["validation_start"], [name, f"{r['validation_start']:.3f}"]
            for stage in STAGES:
                below = [step for step, value in r["curves"][stage] if value < start]
                first = f" (from {below[0]})" if below else ""
                row += [f"{v[stage]['best']:.3f} ({v[stage]['best_step']})", f"{v[stage]['final']:.3f}",
                        f"{len(below)}/{len(r['curves'][stage])}{first}"]  # fmt: skip
            curves.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "| over run seeds | n | mean ± sd | 95% t-interval of the mean | runs ≥ 0 |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, values in (("CIDEr-D SLE − SCST", [r["cider_difference"]["mean"] for r in results.values()]),
                          ("Div-2 (rs) SLE − SCST", [r["div2_difference"] for r in results.values()])):  # fmt: skip
        if not values:
            continue
        mean, sd, low, high = t_interval(values)
        lines.append(f"| {label} | {len(values)} | {mean:+.3f} ± {sd:.3f} | [{low:+.3f}, {high:+.3f}] | "
                     f"{sum(x >= 0 for x in values)}/{len(values)} |")  # fmt: skip
    return "\n".join(lines + (curves if len(curves) > header else []))


def write_json(path: Path, data: dict) -> None:
    """Written under a temporary name and renamed: a kill leaves no partial result file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.rename(path)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="a finished demo run directory of the world seed (mle/DONE)")
    p.add_argument("--out", required=True, help="folder of the runs (one sub-folder per run seed)")
    p.add_argument("--run-seeds", default="0,1,2,3", help="run seeds (default 0,1,2,3)")
    p.add_argument("--results", default="", help=f"result files (default {RESULTS}; --quick: <out>/results)")
    p.add_argument("--quick", action="store_true", help="8 steps per stage: checks the script, no results")
    p.add_argument("--summarise-only", action="store_true", help="print the finished pairs' results; train none")
    args = p.parse_args(argv)
    from training_noise import repeat_dir, train_repeat

    source, out = Path(args.source), Path(args.out)
    results_dir = Path(args.results) if args.results else (out / "results" if args.quick else RESULTS)
    overrides = QUICK if args.quick else PLATEAU
    results: dict[str, dict] = {}
    for seed in (int(s) for s in args.run_seeds.split(",")):
        folder = repeat_dir(out, source, seed)
        path = results_dir / f"{folder.name}.json"
        if not path.exists() and not args.summarise_only:
            train_repeat(source, folder, STAGES, seed, extra=overrides)
            write_json(path, {"source": str(source), "run_seed": seed, "overrides": list(overrides),
                              **pair_result(folder)})  # fmt: skip
            print(f"== wrote {path}", flush=True)
        if path.exists():
            result = json.loads(path.read_text())
            if "validation_start" not in result and not args.summarise_only:  # a result of the first version
                result |= {"validation_start": start_value(folder),
                           "curves": {stage: validation_curve(folder / stage) for stage in STAGES}}  # fmt: skip
                write_json(path, result)
            results[folder.name] = result
    text = summarise(results)
    print(text)
    if results:
        (results_dir / "summary.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
