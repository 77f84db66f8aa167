"""The demo's cost model: every stage's steps, seconds per step, share of the total, and what it buys.

    .venv/bin/python benchmarks/demo_cost.py RUN_DIR [--json]

Reads a finished ``finecap demo`` run directory: ``timings.json`` (wall seconds per stage, written by the demo),
each training stage's ``checkpoints/last/trainer_state.json`` (optimizer steps) and, for the world encoder, its
``encoder.json`` in the cache (steps and training seconds). Seconds per step are the stage's wall time divided by its
steps, so they include the stage's evaluation, checkpointing and test captioning (the
training step alone is timed by ``benchmarks/train_step.py``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from finecap.runs import INFO_FILE, LAST, checkpoint_dir

# What each stage's work buys in the results table (the effect it carries, or what depends on it).
BUYS: dict[str, str] = {
    "world": "the data set every stage trains and is scored on",
    "retriever": "the frozen encoder of every ClipCap stage, the retriever of RD/bag R@1, CLIPScore and SR rewards",
    "mle": "the MLE row and the start of every ClipCap objective",
    "mle_continued": "control: MLE trained as long as SMILE (is SMILE's gain just more steps?)",
    "smile": "SMILE effect: longer captions, higher RD R@1 than MLE",
    "scst": "SCST effect: CIDEr-D up, Div-2 below MLE",
    "sle": "SLE effect: Div-2 above SCST, CIDEr-D not below it",
    "scst_me": "control: max-entropy SCST (exploration paper's SLL-ME row)",
    "discritune": "DiscriTune effect: RD R@1 above MLE",
    "sr_bagcurri": "SR-LV + BagCurri effect: bag R@1 above MLE",
    "blip_mle": "the BLIP-MLE row and the start of BLIP objectives",
    "blip_smile": "SMILE on BLIP: longer than BLIP-MLE",
    "blip_discritune": "DiscriTune on BLIP",
    "vlm_mle": "the world VLM's MLE row and the start of its objectives",
    "vlm_smile": "SMILE on the world VLM: longer and more retrievable than VLM-MLE?",
    "vlm_discritune": "DiscriTune on the world VLM",
    "report": "the tables, listener, diversity, plots and report.html",
}


def stage_steps(run_dir: Path, stage: str) -> int | None:
    info = checkpoint_dir(run_dir / stage, LAST) / INFO_FILE
    if info.is_file():
        return int(json.loads(info.read_text())["step"])
    return None


def encoder_steps(run_dir: Path) -> int | None:
    config = run_dir / "config.yaml"
    if not config.is_file():
        return None
    from finecap.config import load_stored
    from finecap.models.world_encoder_cache import encoder_dir

    info = encoder_dir(load_stored(config)) / "encoder.json"
    return int(json.loads(info.read_text())["steps"]) if info.is_file() else None


def cost_table(run_dir: Path) -> list[dict[str, object]]:
    timings = json.loads((run_dir / "timings.json").read_text())
    total = sum(timings.values())
    rows = []
    for stage, seconds in timings.items():
        steps = encoder_steps(run_dir) if stage == "retriever" else stage_steps(run_dir, stage)
        rows.append({"stage": stage, "steps": steps, "seconds": seconds,
                     "s/step": round(seconds / steps, 3) if steps else None,
                     "share": round(seconds / total, 3), "buys": BUYS.get(stage, "")})  # fmt: skip
    rows.append({"stage": "total", "steps": None, "seconds": round(total, 1), "s/step": None, "share": 1.0,
                 "buys": ""})  # fmt: skip
    return rows


def markdown(rows: list[dict[str, object]]) -> str:
    head = "| stage | steps | seconds | s/step | share | what it buys |\n|---|---|---|---|---|---|"
    lines = [head]
    for r in rows:
        steps = "" if r["steps"] is None else r["steps"]
        per = "" if r["s/step"] is None else r["s/step"]
        lines.append(f"| {r['stage']} | {steps} | {r['seconds']} | {per} | {float(r['share']):.1%} | {r['buys']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a Markdown table")
    args = parser.parse_args()
    rows = cost_table(args.run_dir)
    print(json.dumps(rows, indent=2) if args.json else markdown(rows))


if __name__ == "__main__":
    main()
