"""Retriever vs fact-based listener on the world's own captions, in the training domain and the shifted one.

    nice -n 10 python benchmarks/listener_references.py --world data/world --cache-dir runs/cache

No captioner is needed: it scores the first reference caption of each test image ("human", against the other four
references for the n-gram metrics) and the dense caption (every fact of the scene) with the world encoder (the
retriever) and the listener (:mod:`finecap.metrics.listener`), on the same RD-N draws and TrueMatch bags, for the
training world's test split and for the shifted domain's (``world.shift=domain``, made next to it; the retriever
stays the training world's). The dense row is the listener's ceiling (every fact stated); the human rows show how
much of what a person writes each scorer can use. Needs the trained world encoder of the world (``finecap retriever
train`` with the same ``world.*``; ``--cache-dir`` is ``run.cache_dir``). Prints a Markdown table; ``--json`` writes
the numbers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from finecap.app.bags import main as build_bags
from finecap.config import Config, load
from finecap.data.bags_file import read_bags
from finecap.data.references import load_references
from finecap.metrics.suite import evaluate
from finecap.models.retriever import load_retriever
from finecap.report.table import markdown_table
from finecap.utils.reading import read_json
from finecap.world.make import make_world
from finecap.world.shift import shifted_world

METRICS = ["length", "faithfulness", "retrieval", "bags", "listener", "bleu", "cider"]
COLUMNS = ["Length", "faith/recall", "RD99/R@1", "listener/RD99/R@1", "listener/RD99/tie_rate",
           "listener/RD99/exploit", "bag3/R@1", "listener/bag3/R@1", "bag5/R@1", "listener/bag5/R@1",
           "BLEU-4", "CIDEr-D"]  # fmt: skip


def rows_for(cfg: Config, world_dir: str, label: str, out_dir: Path) -> dict[str, dict[str, float]]:
    refs = load_references(cfg, world_dir, split="test", check_images=True)
    captions = refs.captions()
    records = refs.records
    human = {r.image_id: captions[r.image_id][0] for r in records}
    references = {r.image_id: captions[r.image_id][1:] for r in records}
    dense_all = read_json(Path(world_dir) / "dense.json")
    dense = {r.image_id: dense_all[str(r.image_id)] for r in records}
    bags_path = out_dir / f"bags_{label}.json"
    if not bags_path.exists():
        build_bags(cfg, data=world_dir, split="test", sizes=cfg.eval.bag_sizes, out=bags_path)
    bags = read_bags(bags_path)
    retriever = load_retriever(cfg)
    return {f"{label} {name}": evaluate(preds, references, metrics=METRICS, retriever=retriever, images=records,
                                        scenes=refs.scenes, bags=bags, cfg=cfg)  # fmt: skip
            for name, preds in (("human", human), ("dense", dense))}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", default="data/world", help="world.out of the training world")
    p.add_argument("--cache-dir", default="runs/cache", help="run.cache_dir holding its world encoder")
    p.add_argument("--out", default="runs/listener_references", help="folder for bags and results")
    p.add_argument("--json", default=None)
    p.add_argument("overrides", nargs="*", help="section.key=value overrides (world.seed=1, ...)")
    args = p.parse_args()
    cfg = load(None, [f"world.out={args.world}", f"run.cache_dir={args.cache_dir}", *args.overrides])
    make_world(cfg.world)
    shifted = make_world(shifted_world(cfg.world))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = rows_for(cfg, cfg.world.out, "training domain", out_dir)
    rows.update(rows_for(cfg, str(shifted), "shifted domain", out_dir))
    columns = [c for c in COLUMNS if any(c in r for r in rows.values())]
    print(markdown_table({k: {c: v.get(c) for c in columns} for k, v in rows.items()}, columns))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
