"""How much compute the world encoder needs to clear its quality bar: train settings, CPU seconds, probe and R@1.

    .venv/bin/python benchmarks/world_encoder_budget.py [--trials NAME,...] [--seed 0] [--out FILE] [--list]
    .venv/bin/python benchmarks/world_encoder_budget.py --table     # the results so far, as docs/demo.md shows them

Each trial is a set of ``retriever.*`` overrides (:data:`TRIALS`); for each it trains the world encoder of the
default world (``world.seed=--seed``) through the library engine
(:func:`finecap.train.world_encoder.train_world_encoder`), timing the training, then runs the quality-bar probe
(every attribute probe >= 0.9, reference-caption R@1 against 99 distractors >= 0.6;
:func:`finecap.app.retriever.probe`). One JSON line per trial and seed is appended to ``--out``
(default ``benchmarks/results/world_encoder_budget.jsonl``, in the repository) as soon as it is done, so a killed
run resumes where it stopped: a trial already in the file is skipped. The machine's load changes the seconds, not
the probe; run it alone (the line records the torch thread count and the load average at the start).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import torch

from finecap.app.retriever import probe
from finecap.config import load
from finecap.models.world_encoder_cache import PRESETS, Preset
from finecap.train.world_encoder import train_world_encoder
from finecap.world.make import make_world

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine, machine_line  # noqa: E402  (benchmarks/machine.py)

OUT = Path(__file__).resolve().parent / "results" / "world_encoder_budget.jsonl"

ARCHITECTURES: dict[str, Preset] = {
    "v1": Preset(vision_widths=(128, 192, 256, 256), text_layers=3),  # ENCODER_VERSION 2's world-tiny
    # the trial architectures (``retriever.preset=<name>``), registered in finecap's PRESETS by this script only.
    # A step's time is mostly matrix products (65% in torch.profiler at batch 128): the ConvNeXt stages' pointwise
    # MLPs and the text tower's layers (the dense captions, 40 tokens, cost more than the image tower's forward).
    "t2": Preset(text_layers=2),
    "t2_v64": Preset(vision_widths=(64, 128, 192, 256), text_layers=2),  # 192-wide 2x2 map: see t2_w64
    # the 2x2 map must stay as wide as the projection (256): the world BLIP and VLM read its cells as image tokens
    "t2_w64": Preset(vision_widths=(64, 128, 256, 256), text_layers=2),
}

TRIALS: dict[str, list[str]] = {
    # the defaults of retriever.* (version 3: preset world-tiny = t2_w64, 10 epochs of 64, lr 2e-3, dense 0.5, aux 5)
    "default": [],
    # measured with ENCODER_VERSION 2, whose architecture is v1 and whose defaults were 12 epochs of 128
    "v1_e12_b128": ["retriever.preset=v1", "retriever.epochs=12", "retriever.batch_size=128"],
    "v1_e6": ["retriever.preset=v1", "retriever.batch_size=128", "retriever.epochs=6"],
    "v1_e6_lr4e-3": ["retriever.preset=v1", "retriever.batch_size=128", "retriever.epochs=6", "retriever.lr=4e-3"],
    "v1_e6_b64": ["retriever.preset=v1", "retriever.epochs=6", "retriever.batch_size=64"],
    "v1_e6_dense.25_lr3e-3": [
        "retriever.preset=v1",
        "retriever.batch_size=128",
        "retriever.epochs=6",
        "retriever.dense_fraction=0.25",
        "retriever.lr=3e-3",
    ],
    "v1_e8_dense.25": [
        "retriever.preset=v1",
        "retriever.batch_size=128",
        "retriever.epochs=8",
        "retriever.dense_fraction=0.25",
    ],
    "v1_e4_b64_lr3e-3_aux10": [
        "retriever.preset=v1",
        "retriever.epochs=4",
        "retriever.batch_size=64",
        "retriever.lr=3e-3",
        "retriever.aux_weight=10",
    ],
    "v1_e6_b32": ["retriever.preset=v1", "retriever.epochs=6", "retriever.batch_size=32"],
    "v1_e7_b64": ["retriever.preset=v1", "retriever.epochs=7", "retriever.batch_size=64"],
    "v1_e6_b64_lr3e-3": ["retriever.preset=v1", "retriever.epochs=6", "retriever.batch_size=64", "retriever.lr=3e-3"],
    "v1_e5_b32_dense.25": [
        "retriever.preset=v1",
        "retriever.epochs=5",
        "retriever.batch_size=32",
        "retriever.dense_fraction=0.25",
    ],
    # smaller architectures (ARCHITECTURES), then fewer steps
    "t2_v64": ["retriever.preset=t2_v64", "retriever.epochs=12", "retriever.batch_size=128"],
    "t2": ["retriever.preset=t2", "retriever.epochs=12", "retriever.batch_size=128"],
    "t2_w64_e8_b64": ["retriever.preset=t2_w64", "retriever.epochs=8", "retriever.batch_size=64"],
    "t2_w64_e6_b64": ["retriever.preset=t2_w64", "retriever.epochs=6", "retriever.batch_size=64"],
    "t2_w64_e10_b64": ["retriever.preset=t2_w64", "retriever.epochs=10", "retriever.batch_size=64"],
    "t2_w64_e8_b64_dense.25": [
        "retriever.preset=t2_w64",
        "retriever.epochs=8",
        "retriever.batch_size=64",
        "retriever.dense_fraction=0.25",
    ],
}


def read_rows(out: Path) -> list[dict]:
    """The trials of the results file ``out``, one dict per line."""
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def markdown_table(out: Path) -> str:
    """The results file as the Markdown table of docs/demo.md (one row per trial and seed, in the file's order)."""
    rows = read_rows(out)
    lines = ["| trial | seed | steps | train s (CPU s) | load at start | lowest probe | reference R@1 | bar |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        name, value = min(r["probe"].items(), key=lambda kv: kv[1])
        lines.append(f"| {r['trial']} | {r['seed']} | {r['steps']} | {r['train_seconds']} "
                     f"({r['train_cpu_seconds']:.0f}) | {r['load_average_at_start']} | {value:.3f} {name} "
                     f"| {r['reference_R@1']:.3f} "
                     f"| {'passed' if r['bar_passed'] else 'not met'} |")  # fmt: skip
    return "\n".join(lines)


def register_architectures() -> None:
    """Make the trial architectures known to ``retriever.preset`` (in this process)."""
    for name, preset in ARCHITECTURES.items():
        PRESETS.setdefault(name, preset)


def done(out: Path) -> set[tuple[str, int]]:
    if not out.exists():
        return set()
    return {(r["trial"], r["seed"]) for r in read_rows(out)}


def run_trial(name: str, overrides: list[str], seed: int, world_root: Path, cache: Path) -> dict:
    cfg = load(None, [f"world.seed={seed}", f"world.out={world_root / f'world-{seed}'}",
                      f"run.cache_dir={cache}", f"run.seed={seed}", *overrides])  # fmt: skip
    world = make_world(cfg.world, progress=False)
    load_avg = os.getloadavg()[0]
    start = time.perf_counter()
    cpu = time.process_time()
    encoder = train_world_encoder(cfg, world, progress=False)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    result = probe((encoder, world), out=encoder / "probe.json", ceiling=False, progress=False)
    steps = json.loads((encoder / "encoder.json").read_text())["steps"]
    return {
        "trial": name, "seed": seed, "overrides": overrides, "date": date.today().isoformat(),
        "threads": torch.get_num_threads(), "load_average_at_start": round(load_avg, 2), "steps": steps,
        "train_seconds": round(seconds, 1), "train_cpu_seconds": round(cpu_seconds, 1),
        "probe": {k: round(v["test"], 4) for k, v in result["probe"].items()},
        "reference_R@1": round(result["retrieval"]["reference"]["R@1"], 4),
        "dense_R@1": round(result["retrieval"]["dense"]["R@1"], 4), "bar_passed": result["bar"]["all_passed"],
        "machine": machine(),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", default=",".join(TRIALS), help="comma-separated trial names")
    parser.add_argument("--seed", type=int, default=0, help="world and run seed")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--work", type=Path, default=None, help="folder for worlds and encoders (default: a tmp dir)")
    parser.add_argument("--list", action="store_true", help="print the trials and exit")
    parser.add_argument("--table", action="store_true", help="print the results file as a Markdown table and exit")
    args = parser.parse_args()
    if args.table:
        print(markdown_table(args.out))
        return
    if args.list:
        for name, overrides in TRIALS.items():
            print(f"{name}: {' '.join(overrides) or '(defaults)'}")
        return
    register_architectures()
    print(machine_line(), flush=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="finecap-we-budget-"))
    finished = done(args.out)
    for name in args.trials.split(","):
        if name not in TRIALS:
            raise SystemExit(f"--trials: unknown trial {name!r}; known: {', '.join(TRIALS)}")
        if (name, args.seed) in finished:
            print(f"{name} (seed {args.seed}): already in {args.out}; skipped")
            continue
        row = run_trial(name, TRIALS[name], args.seed, work, work / "cache")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
