"""Are the demo's TrueMatch bags harder than random distractors? The same captions, four ways.

    FINECAP_HOME=... nice -n 10 python benchmarks/bag_hardness.py RUN_DIR [--stages human,mle,...]

``RUN_DIR`` is a demo's run directory whose report stage has run (``<stage>/captions_families10_test.json`` and
``families10/bags_test.json`` exist; :mod:`finecap.app.demo_families`). For every stage (and ``human``: each image's
first reference) it scores the captions of the scene-family test world with the demo's retriever: RD-N with random
distractors, the hard RD (the family members among the N), family R@1, and TrueMatch R@1 in the demo's bags (the
hardest share ``bags.keep_hardest`` of the curated bags) and in every curated bag (``keep_hardest=1``, built into
``RUN_DIR/bag_hardness/``). NDLB's TrueMatch is harder than RD100 (its MLE: #3 50.8 against 76.5); bags that are
not harder than random distractors do not measure fine-grained detail. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from finecap.app.bags import main as build_bags
from finecap.app.demo_families import family_captions, family_scores, family_world, tag
from finecap.config import load
from finecap.data.bags_file import read_bags
from finecap.metrics.suite import evaluate
from finecap.models.retriever import load_retriever
from finecap.recipes.settings import DEMO_BASE
from finecap.report.table import markdown_table
from finecap.stages import StageRunner

COLUMNS = ["RD/R@1", "hardRD/R@1", "family/R@1", "bag3/R@1", "bag3 all/R@1", "bag5/R@1", "bag5 all/R@1",
           "bag7/R@1", "bag7 all/R@1"]  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--stages", default="", help="comma-separated stages (default: every one with family captions)")
    args = p.parse_args()
    cfg = load(args.run_dir / "config.yaml", [], base=DEMO_BASE)  # a demo's settings as it ran (older ones lack some)
    # the finished demo's folders, read only: its stages' family captions exist (the glob below), so no stage table
    # or training is needed (an absent caption file would fail on the empty table rather than train anything)
    demo = StageRunner({}, cfg, args.run_dir, train=None)  # type: ignore[arg-type]
    family = family_world(demo)
    stages = [s for s in args.stages.split(",") if s] or [
        "human",
        *sorted(p.parent.name for p in args.run_dir.glob(f"*/captions_{tag()}_test.json")),
    ]
    all_bags = args.run_dir / "bag_hardness" / f"bags_{tag()}_test_all.json"
    if not all_bags.exists():
        build_bags(dataclasses.replace(cfg, bags=dataclasses.replace(cfg.bags, keep_hardest=1.0)), data=family.path,
                   split="test", sizes=cfg.eval.bag_sizes, out=all_bags)  # fmt: skip
    retriever = load_retriever(cfg)
    records = family.references.records
    rows = {}
    for stage in stages:
        captions = family_captions(demo, None if stage == "human" else stage, family)
        row = family_scores(demo, family, captions, retriever)
        every = evaluate(captions, None, metrics=["retrieval", "bags"], retriever=retriever, images=records,
                         bags=read_bags(all_bags), cfg=cfg)  # fmt: skip
        row.update({k.replace("/", " all/", 1): v for k, v in every.items() if k.startswith("bag")})
        row.update({k: v for k, v in every.items() if k.startswith("RD")})
        rows[stage] = row
    n = cfg.eval.n_distractors
    columns = [c.replace("RD/", f"RD{n}/") for c in COLUMNS]
    print(f"Captions of the scene-family test world ({len(records)} images); bags: "
          + ", ".join(f"{s}: {rows[stages[0]].get(f'bag{s}/bags', 0):.0f} of "
                      f"{rows[stages[0]].get(f'bag{s} all/n', 0) / s:.0f} curated" for s in cfg.eval.bag_sizes)
          + "\n")  # fmt: skip
    print(markdown_table({k: {c: v.get(c) for c in columns} for k, v in rows.items()}, columns))


if __name__ == "__main__":
    main()
