"""What the visual expert's false facts do to retrieval: the VCB caption fields with and without them.

    nice -n 10 python benchmarks/vcb_false_facts.py --run-dir runs/demo run.cache_dir=runs/cache

Needs a finished ``finecap demo --stages vcb`` run (``<run-dir>/world_holistic``, the boosted world) and the world
encoder of its world. For the test split it scores, with the world CLIP (RD-N R@1 on the suite's own draws) and with
the fact-based listener (:mod:`finecap.metrics.listener`), each caption field of the boosted data set and two
counterfactual fields built from it: ``<field> (true facts only)`` re-renders the caption with
:func:`finecap.boost.world_facts.render_facts` keeping only the facts that hold in the scene, so the comparison with
the field itself isolates the effect of its false facts (same grammar, same true content). Prints a Markdown table;
``--json`` writes the numbers. A diagnosis of the demo's VCB tables (README), not a test.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from finecap.boost.world_facts import render_facts
from finecap.config import load
from finecap.data.bags_file import read_bags
from finecap.data.datasets import load_records
from finecap.data.formats import read_dataset
from finecap.metrics.suite import evaluate
from finecap.models.retriever import load_retriever
from finecap.report.table import markdown_table
from finecap.world.facts import facts, faithfulness, is_true
from finecap.world.make import load_scenes

FIELDS = ("original", "blend", "visual", "holistic")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", default="runs/demo", help="the demo run with the vcb group's boosted world")
    p.add_argument("--json", default=None, help="also write the numbers here")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides (world.*, run.cache_dir, eval.*)")
    args = p.parse_args()
    cfg = load(None, args.overrides)
    run_dir = Path(args.run_dir)
    records = load_records(cfg, "test")
    all_scenes = load_scenes(cfg.world.out)
    scenes = {r.image_id: all_scenes[int(r.image_id)] for r in records}
    boosted = {r.image_id: r.boosted for r in read_dataset("world", run_dir / "world_holistic", check_images=False)}
    bags = read_bags(run_dir / "bags_test.json")
    retriever = load_retriever(cfg)
    rows: dict[str, dict[str, float]] = {}
    for field in FIELDS:
        captions = {r.image_id: boosted[r.image_id][field][0] for r in records}
        variants = {field: captions}
        if field in ("visual", "holistic"):
            variants[f"{field} (true facts only)"] = {
                i: render_facts({f for f in facts(c) if is_true(f, scenes[i])}) for i, c in captions.items()
            }
        for name, caps in variants.items():
            row = evaluate(caps, None, metrics=["length", "retrieval", "bags", "listener"], retriever=retriever,
                           images=records, scenes=scenes, bags=bags, cfg=cfg)  # fmt: skip
            faith = [faithfulness(c, scenes[i]) for i, c in caps.items()]
            row["true facts"] = sum(f.n_correct for f in faith) / len(faith)
            row["false facts"] = sum(f.n_stated - f.n_correct for f in faith) / len(faith)
            rows[name] = row
    rd = f"RD{cfg.eval.n_distractors}"
    columns = ["Length", "true facts", "false facts", f"{rd}/R@1", "bag3/R@1", "bag5/R@1", "bag7/R@1",
               f"listener/{rd}/R@1", "listener/bag3/R@1", "listener/bag5/R@1", "listener/bag7/R@1"]  # fmt: skip
    print(markdown_table(rows, columns))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
