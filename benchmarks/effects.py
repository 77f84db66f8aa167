"""The papers' headline effects across world seeds: runs ``finecap demo`` once per seed and prints each effect as
mean ± standard deviation over seeds, with the number of seeds where its sign is the one the paper reports and the
paper table (with its numbers) that gives that sign; an effect no paper reports (finecap's own expectation, e.g. the
fact-based listener's) says ``finecap (no paper)``. A world faithfulness column stands in for the paper's nearest
measure (SMILE's human accuracy rating, NDLB's hallucination examples), as its source says.

    nice -n 10 python benchmarks/effects.py                       # seeds 0,1,2 under runs/effects/seed<N>
    python benchmarks/effects.py --summarise-only --check         # the committed results: exit 0 or 1, see below
    python benchmarks/effects.py --seeds 1,0,2 --cache-dir runs/cache --json effects.json

Each seed runs in its own run directory (``<root>/seed<N>``) on its own world (``data/world-seed<N>``; world
``world.seed=N``), with only the stages the effects need (:data:`STAGES`). The demo skips finished stages, so a killed
benchmark resumes where it stopped; re-running it after a change to the report only re-runs the ``report`` stage
(and the other evaluation stages). The world encoder is cached per world under ``--cache-dir``
(``run.cache_dir``), so a seed's encoder is trained once. As each seed finishes, its ``results.json`` is copied into
the repository (``--store``, default ``benchmarks/results/effects/seed<N>.json``); ``--summarise-only`` reads a
seed's run directory when it is there and the stored copy otherwise, so a fresh clone checks the committed results.

``--check`` exits 1 unless every :data:`HEADLINE` effect holds (the paper's sign) on every seed, leaving out the
documented :data:`NON_REPRODUCTIONS`, which it lists with their 95% interval over the seeds and where they are
written up.

This is a benchmark, not a test: a seed took 624-626 s on an idle 2-core machine (2026-11-23, world encoder v3),
718-826 s with every row also captioning the scene-family world (2026-11-24, the machine shared with light jobs).
The table it prints (Markdown; ``--json`` also writes the numbers) is docs/results.md's "Effects across world seeds".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from paired_difference import mean_std, t_interval  # benchmarks/ is on sys.path, as for every benchmark script

STAGES = ["world", "retriever", "mle", "blip_mle", "vlm_mle", "sr_bagcurri", "sle", "scst", "smile", "mle_continued",
          "discritune", "blip_smile", "vlm_smile", "report"]  # fmt: skip
"""Demo stages the effects need: the default demo list and the control ``mle_continued`` (MLE trained as long as
SMILE, in the optional list of the demo), which the effects "over mle_continued" compare against."""

Rows = dict[str, dict[str, float]]

STORE = Path(__file__).parent / "results" / "effects"
"""Where each finished seed's demo ``results.json`` is kept (``seed<N>.json``): the committed demo results that
``--summarise-only --check`` reads on a fresh clone."""


@dataclass(frozen=True)
class Effect:
    """One headline effect: a number computed from a seed's demo results and the sign the paper reports."""

    name: str
    value: Callable[[Rows], float]
    sign: int  # +1: the paper's effect is an increase (or a ratio > 1 when ratio=True); -1: a decrease
    ratio: bool = False
    source: str = ""


def diff(stage: str, base: str, metric: str) -> Callable[[Rows], float]:
    return lambda rows: rows[stage][metric] - rows[base][metric]


def ratio(stage: str, base: str, metric: str) -> Callable[[Rows], float]:
    return lambda rows: rows[stage][metric] / rows[base][metric]


def bags_mean(stage: str, base: str) -> Callable[[Rows], float]:
    """Mean over bag sizes 3, 5, 7 of the R@1 difference."""
    return lambda rows: sum(rows[stage][f"bag{n}/R@1"] - rows[base][f"bag{n}/R@1"] for n in (3, 5, 7)) / 3


def headline_effects(n: int) -> list[Effect]:
    """The papers' headline effects, with RD-N retrieval for ``n`` distractors (``eval.n_distractors``).

    ``source`` names the table (or section) of the paper whose numbers give the expected sign, with those numbers;
    an empty ``source`` marks finecap's own expectation, which no paper reports.
    """
    RD = f"RD{n}/R@1"  # noqa: N806
    HARD = f"hardRD{n}/R@1"  # noqa: N806  (the target's 9 family members among the n: the headline measure)
    return [
        Effect("SMILE length ratio (smile / mle)", ratio("smile", "mle", "Length"), +1, True,
               "SMILE Table 1 (length 10.0 -> 22.3)"),
        Effect(f"SMILE RD{n} R@1 gain (smile - mle)", diff("smile", "mle", RD), +1,
               source="SMILE Table 1 (self-retrieval R@1 6.7 -> 10.0)"),
        Effect(f"SMILE RD{n} R@1 gain over mle_continued", diff("smile", "mle_continued", RD), +1,
               source="SMILE Table 3 (rows 6 -> 7: R@1 6.5 -> 10.0)"),
        Effect(f"SMILE hardRD{n} R@1 gain (smile - mle)", diff("smile", "mle", HARD), +1,
               source="SMILE Table 1 (self-retrieval R@1 6.7 -> 10.0)"),
        Effect(f"SMILE hardRD{n} R@1 gain over mle_continued", diff("smile", "mle_continued", HARD), +1,
               source="SMILE Table 3 (rows 6 -> 7: R@1 6.5 -> 10.0)"),
        Effect("SMILE faith. precision change", diff("smile", "mle", "faith/precision"), -1,
               source="SMILE Table 2 (human accuracy 4.57 -> 4.05)"),
        Effect("SMILE faith. recall change", diff("smile", "mle", "faith/recall"), +1,
               source="SMILE Table 2 (human descriptiveness 3.41 -> 4.67)"),
        Effect("SCST CIDEr-D gain (scst - mle)", diff("scst", "mle", "CIDEr-D"), +1,
               source="exploration Table 4 (bs: XE 102.5 -> SLL 115.0)"),
        Effect("SCST sample Div-2 change (collapse)", diff("scst", "mle", "sample/Div-2"), -1,
               source="exploration Table 4 (rs: XE 0.78 -> SLL 0.32)"),
        Effect("SCST sample mBLEU-4 change", diff("scst", "mle", "sample/mBLEU-4"), +1,
               source="exploration Table 4 (rs: XE 0.06 -> SLL 0.81)"),
        Effect("SLE sample Div-2 recovery (sle - scst)", diff("sle", "scst", "sample/Div-2"), +1,
               source="exploration Table 4 (rs: SLL 0.32 -> SLL-SLE 0.40)"),
        Effect("SLE sample mBLEU-4 change (sle - scst)", diff("sle", "scst", "sample/mBLEU-4"), -1,
               source="exploration Table 4 (rs: SLL 0.81 -> SLL-SLE 0.68)"),
        Effect("SLE CIDEr-D change (sle - scst)", diff("sle", "scst", "CIDEr-D"), +1,
               source="exploration Tables 2 and 4 (bs: SLL 115.0 -> SLL-SLE 117.2)"),
        Effect("SLE sample CIDEr-D change (sle - scst)", diff("sle", "scst", "sample/CIDEr-D"), +1,
               source="exploration Table 4 (rs: SLL 114.6 -> SLL-SLE 115.9)"),
        Effect("SCST faith. precision change", diff("scst", "mle", "faith/precision"), -1),
        Effect(f"DiscriTune RD{n} R@1 gain (discritune - mle)", diff("discritune", "mle", RD), +1,
               source="DiscriTune Table 1 (COCO P@1 74.2 -> 84.8)"),
        Effect(f"DiscriTune hardRD{n} R@1 gain (discritune - mle)", diff("discritune", "mle", HARD), +1,
               source="DiscriTune Table 1 (COCO P@1 74.2 -> 84.8)"),
        Effect("DiscriTune family R@1 gain (discritune - mle)", diff("discritune", "mle", "family/R@1"), +1,
               source="DiscriTune Table 11 (ImageCoDe; its text: tuning helps where distinctions are subtle)"),
        Effect("DiscriTune bag R@1 gain (mean of 3/5/7)", bags_mean("discritune", "mle"), +1,
               source="NDLB Tables 1 and 3 (rows 1 -> 4) and 7 (rows 1 -> 2): TrueMatch #3 50.8 -> 53.3"),
        Effect("DiscriTune bag R@1 gain over mle_continued", bags_mean("discritune", "mle_continued"), +1),
        Effect("DiscriTune faith. precision change", diff("discritune", "mle", "faith/precision"), -1,
               source="NDLB Sec. 4.4 and Fig. 8 (SR-L fine-tuning hallucinates)"),
        Effect("DiscriTune CIDEr-D change", diff("discritune", "mle", "CIDEr-D"), -1,
               source="DiscriTune Table 2 (COCO CIDEr 108.55 -> 105.40)"),
        Effect(f"SR-LV+BagCurri hardRD{n} R@1 gain (sr_bagcurri - mle)", diff("sr_bagcurri", "mle", HARD), +1,
               source="NDLB Table 7 (rows 1 -> 5: RD100 76.5 -> 89.0)"),
        Effect("SR-LV+BagCurri family R@1 gain (sr_bagcurri - mle)", diff("sr_bagcurri", "mle", "family/R@1"), +1,
               source="NDLB Table 8 (ImageCoDe R@1: COCO MLE 28.8 -> SR-L 30.3)"),
        Effect("SR-LV+BagCurri bag R@1 gain (mean of 3/5/7)", bags_mean("sr_bagcurri", "mle"), +1,
               source="NDLB Tables 5 (COCO SR-LV+BagCurri) and 7 (rows 1 -> 5: #3 50.8 -> 59.6)"),
        Effect("SR-LV+BagCurri bag R@1 gain over mle_continued", bags_mean("sr_bagcurri", "mle_continued"), +1),
        Effect("SR-LV+BagCurri faith. precision change", diff("sr_bagcurri", "mle", "faith/precision"), -1,
               source="NDLB Sec. 4.5-4.6 and Fig. 9 (SR-V and BagCurri: more hallucinations)"),
        Effect("SR-LV+BagCurri faith. recall change", diff("sr_bagcurri", "mle", "faith/recall"), +1,
               source="NDLB Finding 5 (Sec. 4.6: fine-grained details instilled)"),
        Effect("BLIP SMILE length ratio (blip_smile / blip_mle)", ratio("blip_smile", "blip_mle", "Length"), +1, True,
               "SMILE Table 1 (BLIP: length 10.0 -> 22.3)"),
        Effect(f"BLIP SMILE RD{n} R@1 gain (blip_smile - blip_mle)", diff("blip_smile", "blip_mle", RD), +1,
               source="SMILE Table 1 (BLIP: R@1 6.7 -> 10.0)"),
        Effect(f"BLIP SMILE hardRD{n} R@1 gain (blip_smile - blip_mle)", diff("blip_smile", "blip_mle", HARD), +1,
               source="SMILE Table 1 (BLIP: R@1 6.7 -> 10.0)"),
        Effect("VLM SMILE length ratio (vlm_smile / vlm_mle)", ratio("vlm_smile", "vlm_mle", "Length"), +1, True,
               "SMILE Table 1 (on BLIP; no paper trains a decoder-only VLM with SMILE)"),
        Effect(f"VLM SMILE RD{n} R@1 gain (vlm_smile - vlm_mle)", diff("vlm_smile", "vlm_mle", RD), +1,
               source="SMILE Table 1 (on BLIP; no paper trains a decoder-only VLM with SMILE)"),
        Effect(f"VLM SMILE hardRD{n} R@1 gain (vlm_smile - vlm_mle)", diff("vlm_smile", "vlm_mle", HARD), +1,
               source="SMILE Table 1 (on BLIP; no paper trains a decoder-only VLM with SMILE)"),
    ]  # fmt: skip


HEADLINE = (
    "SMILE length ratio (smile / mle)",
    "SMILE RD{n} R@1 gain (smile - mle)",
    "SMILE hardRD{n} R@1 gain (smile - mle)",
    "SCST sample Div-2 change (collapse)",
    "SLE sample Div-2 recovery (sle - scst)",
    "SLE CIDEr-D change (sle - scst)",
    "DiscriTune RD{n} R@1 gain (discritune - mle)",
    "DiscriTune hardRD{n} R@1 gain (discritune - mle)",
    "SR-LV+BagCurri bag R@1 gain (mean of 3/5/7)",
    "SR-LV+BagCurri hardRD{n} R@1 gain (sr_bagcurri - mle)",
    "BLIP SMILE length ratio (blip_smile / blip_mle)",
)
"""The effects the default demo must keep on every seed (issue 26; the hard RD's, issue 35), less the documented
non-reproductions
(:data:`NON_REPRODUCTIONS`): ``--check`` exits 1 when one fails on a seed."""

NON_REPRODUCTIONS = {
    "SLE CIDEr-D change (sle - scst)": (
        "the exploration paper's CIDEr gain of SLE over SCST (Table 2: +2.2 points) does not reproduce on the world: "
        "12 retrained SLE/SCST pairs (four run seeds on each of three worlds) gave a mean difference of "
        "-0.048 ± 0.091 CIDEr-D (docs/results.md#training-noise-sle-against-scst-in-12-runs); four pairs trained 400 "
        "steps and selected by validation CIDEr-D gave -0.015 ± 0.015, 95% interval [-0.039, +0.009] "
        "(docs/results.md#sle-against-scst-to-the-validation-peak-issue-35)"
    ),
}
"""Headline effects the world does not reproduce, each with where it is measured and written up: ``--check`` lists
them with their interval over the seeds instead of failing on them, and says so when one of them holds after all."""


def seed_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean of an effect over seeds and its 95% t interval (:func:`paired_difference.t_interval`); one seed gives no
    interval (``nan`` bounds).

    >>> seed_interval([1.0, 2.0, 3.0])  # sd 1, t(2) = 4.303
    (2.0, -0.48433..., 4.48433...)
    """
    return t_interval(list(values))


def headline_failures(numbers: dict[str, dict[str, object]], n: int) -> list[str]:
    """The :data:`HEADLINE` effects (RD-``n``) whose sign is not the paper's on every seed, or that are missing,
    leaving out the documented :data:`NON_REPRODUCTIONS`."""
    failed = []
    for name in (h.format(n=n) for h in HEADLINE):
        e = numbers.get(name)
        if name in NON_REPRODUCTIONS:
            continue
        if e is None or e["holds"] != e["n"]:
            failed.append(name if e is None else f"{name} ({e['holds']}/{e['n']})")
    return failed


def non_reproduction_lines(numbers: dict[str, dict[str, object]]) -> list[str]:
    """One line per documented non-reproduction: its seeds' mean, 95% interval and signs, and where it is written up
    (or that it is missing from these results, or now holds on every seed)."""
    lines = []
    for name, why in NON_REPRODUCTIONS.items():
        e = numbers.get(name)
        if e is None:
            lines.append(f"- {name}: not in these results; {why}")
            continue
        values = list(e["values"].values())  # type: ignore[union-attr]
        m, low, high = seed_interval(values)
        state = "holds on every seed here" if e["holds"] == e["n"] else f"sign holds on {e['holds']}/{e['n']} seeds"
        lines.append(f"- {name}: {m:+.3f}, 95% interval over {len(values)} seed(s) [{low:+.3f}, {high:+.3f}], "
                     f"{state}; documented non-reproduction: {why}")  # fmt: skip
    return lines


def listener_effects(rows: Rows, n: int) -> list[Effect]:
    """Listener-based effects, when the report has the ``listener`` group."""
    if f"listener/RD{n}/R@1" not in rows.get("mle", {}):
        return []
    out = []
    for stage in ("smile", "discritune", "sr_bagcurri"):
        out.append(Effect(f"{stage} listener RD{n} R@1 gain", diff(stage, "mle", f"listener/RD{n}/R@1"), +1))
        out.append(Effect(f"{stage} listener bag R@1 gain (mean of 3/5/7)", listener_bags(stage), +1))
        # The hypothesis under test, not a paper's claim: training on the retriever raises its exploitation.
        out.append(Effect(f"{stage} RD{n} exploit change (retriever-only firsts)",
                          diff(stage, "mle", f"listener/RD{n}/exploit"), +1))  # fmt: skip
    return out


def listener_bags(stage: str) -> Callable[[Rows], float]:
    return lambda rows: sum(rows[stage][f"listener/bag{n}/R@1"] - rows["mle"][f"listener/bag{n}/R@1"]
                            for n in (3, 5, 7)) / 3  # fmt: skip


def run_seed(seed: int, root: Path, cache_dir: str, extra: list[str], stages: list[str]) -> Path:
    """Run (or resume) the demo for one world seed; returns its run directory."""
    run_dir = root / f"seed{seed}"
    cmd = [sys.executable, "-m", "finecap.app.cli", "demo", "--run-dir", str(run_dir), "--stages", ",".join(stages),
           f"world.seed={seed}", f"world.out=data/world-seed{seed}", f"run.cache_dir={cache_dir}", *extra]  # fmt: skip
    print(f"== seed {seed}: {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    log = run_dir.with_suffix(".log")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f:
        code = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=os.environ.copy())
    print(f"   seed {seed}: exit {code} after {time.perf_counter() - t0:.0f} s (log {log})", flush=True)
    if code != 0:
        raise SystemExit(f"seed {seed}: the demo failed (exit {code}); see {log}")
    return run_dir


def distractor_count(results: dict[int, Rows]) -> int:
    """N of the RD-N retrieval keys (``eval.n_distractors``) in the first seed's MLE row."""
    first = next(iter(results.values()))
    return next(int(k[2:].split("/")[0]) for k in first.get("mle", {}) if re.fullmatch(r"RD\d+/R@1", k))


def summarise(results: dict[int, Rows]) -> tuple[str, dict[str, dict[str, object]]]:
    """Markdown table of every effect over the seeds' results, and the numbers as a dict."""
    first = next(iter(results.values()))
    n = distractor_count(results)
    effects = headline_effects(n) + listener_effects(first, n)
    seeds = sorted(results)
    head = " | ".join(f"seed {s}" for s in seeds)
    lines = [f"| effect | mean ± std | sign holds | {head} | expected sign from |",
             "| --- | --- | --- | " + " | ".join("---" for _ in seeds) + " | --- |"]  # fmt: skip
    out: dict[str, dict[str, object]] = {}
    for e in effects:
        try:
            values = [e.value(results[s]) for s in seeds]
        except KeyError as missing:
            print(f"   skipped {e.name}: missing {missing}")
            continue
        m, s = mean_std(values)
        holds = sum((v - 1.0 if e.ratio else v) * e.sign > 0 for v in values)
        expected = ("<>"[e.sign > 0]) + (" 1" if e.ratio else " 0")
        fmt = ".2f" if e.ratio else "+.3f"
        cells = " | ".join(f"{v:{fmt}}" for v in values)
        source = e.source or "finecap (no paper)"
        lines.append(f"| {e.name} | {m:{fmt}} ± {s:.3f} | {holds}/{len(values)} ({expected}) | {cells} | {source} |")
        out[e.name] = {"mean": m, "std": s, "holds": holds, "n": len(values), "expected": expected,
                       "values": dict(zip(seeds, values, strict=True)), "source": e.source}  # fmt: skip
    return "\n".join(lines), out


def load_results(seeds: Sequence[int], root: Path, store: Path) -> dict[int, Rows]:
    """Each seed's demo results: the run directory's ``results.json`` when the seed has run here (copied into
    ``store`` as ``seed<N>.json``, so the numbers stay in the repository), else the copy already in ``store``."""
    results: dict[int, Rows] = {}
    for seed in seeds:
        path, kept = root / f"seed{seed}" / "results.json", store / f"seed{seed}.json"
        if path.exists():
            store.mkdir(parents=True, exist_ok=True)
            kept.write_text(path.read_text())
        if kept.exists():
            results[seed] = json.loads(kept.read_text())
        else:
            print(f"   seed {seed}: no {path} and no {kept} yet")
    return results


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1,2", help="comma-separated world seeds, run in this order")
    p.add_argument("--root", default="runs/effects", help="parent of the per-seed run directories")
    p.add_argument("--store", default=str(STORE), help="where each finished seed's results.json is kept")
    p.add_argument("--cache-dir", default="runs/cache", help="run.cache_dir (world encoders, one per world)")
    p.add_argument("--stages", default=",".join(STAGES), help="demo stages per seed")
    p.add_argument("--summarise-only", action="store_true", help="do not run the demo; read finished results")
    p.add_argument("--json", default=None, help="also write the effects as JSON here")
    p.add_argument("--check", action="store_true", help="exit 1 unless every headline effect the world reproduces "
                   "holds on every seed")  # fmt: skip
    p.add_argument("overrides", nargs="*", help="extra section.key=value overrides for every seed's demo")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    root, store = Path(args.root), Path(args.store)
    for seed in seeds:
        if not args.summarise_only:
            run_seed(seed, root, args.cache_dir, args.overrides, args.stages.split(","))
            load_results([seed], root, store)  # into the store as soon as the seed is done
    results = load_results(seeds, root, store)
    if not results:
        raise SystemExit("no finished seed")
    table, numbers = summarise(results)
    print(f"\nEffects over {len(results)} world seed(s) ({', '.join(map(str, sorted(results)))}):\n")
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(numbers, indent=2) + "\n")
    failed = headline_failures(numbers, distractor_count(results))
    seeds_done = ", ".join(map(str, sorted(results)))
    checked = len(HEADLINE) - len(NON_REPRODUCTIONS)
    if failed:
        print(f"\nheadline effects failing on world seed(s) {seeds_done}: {'; '.join(failed)}")
    else:
        print(f"\nall {checked} headline effects the world reproduces hold on every world seed ({seeds_done})")
    print("\nDocumented non-reproductions (not checked):")
    print("\n".join(non_reproduction_lines(numbers)))
    return 1 if args.check and failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
