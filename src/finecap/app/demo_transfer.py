"""The demo's ``transfer`` stage: every trained stage captions the shifted domain's test split (cross-domain
transfer, DiscriTune Sec. 4, Tables 1 and 3-5).

``finecap demo --stages transfer`` (after the training stages; not in the default list) makes the shifted test world
(:mod:`finecap.world.shift`, ``world.shift=domain``: ``<world.out>-shifted``, or its own folder in the finecap home
when ``world.out`` is empty), captions its test images
with each trained stage's best checkpoint (beam search as in the report, ``<stage>/captions_shifted_test.json``),
builds TrueMatch bags on it with the training world's retriever, and scores every stage and the shifted domain's
own first reference ("human") against the shifted references: BLEU-4, CIDEr-D, faithfulness, the retriever's RD-N
and bag R@1, and the listener's (:mod:`finecap.metrics.listener`). Nothing is retrained: the captioners and the
retriever are the training world's, as DiscriTune evaluates its COCO-trained models on other data sets.

Writes ``<run_dir>/transfer/results.json`` (stage -> metric -> number) and ``results.md`` (a quick demo's titled as
such, :data:`finecap.report.table.QUICK_TITLE`); the DiscriTune effect is read from the ``discritune`` and ``mle``
rows (their CIDEr-D / BLEU-4 against the shifted references).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from finecap.app.bags import reuse_bags
from finecap.data.bags_file import read_bags
from finecap.data.references import load_references
from finecap.data.results import write_results
from finecap.metrics.suite import evaluate
from finecap.models.retriever import load_retriever
from finecap.report.table import markdown_table, quick_labelled
from finecap.stages.outputs import caption_world
from finecap.train.prepare import prepare
from finecap.utils.files import atomic_write_text, write_json
from finecap.world.shift import shifted_world

METRICS = ["length", "bleu", "cider", "faithfulness", "retrieval", "bags", "listener"]
COLUMNS = ["Length", "BLEU-4", "CIDEr-D", "faith/precision", "faith/recall", "RD/R@1", "listener/RD/R@1",
           "listener/RD/exploit", "bag3/R@1", "listener/bag3/R@1", "bag5/R@1", "listener/bag5/R@1"]  # fmt: skip


def stage_transfer(demo: Any, stages: Sequence[str]) -> dict[str, Any]:
    """Caption and score the shifted test split for every trained stage of ``stages`` (module docstring). ``demo``
    is the demo's :class:`finecap.stages.StageRunner` (:mod:`finecap.app.demo` is not imported here: the two
    modules form no import cycle)."""
    cfg = demo.cfg
    world = shifted_world(cfg.world)
    world_dir = prepare(dataclasses.replace(cfg, world=world), {"world"}, make=True).world
    out_dir = demo.run_dir / "transfer"
    out_dir.mkdir(parents=True, exist_ok=True)
    refs = load_references(cfg, world_dir, split="test", check_images=True)
    records = refs.records
    captions = refs.captions()
    human = {r.image_id: captions[r.image_id][0] for r in records}
    references = {r.image_id: captions[r.image_id][1:] for r in records}  # as the report: the other four
    bags = read_bags(reuse_bags(cfg, data=world_dir, out=out_dir / "bags_test.json", force=cfg.demo.force))
    retriever = load_retriever(cfg)  # the training world's retriever: the shifted world is only a test domain

    def score(predictions: dict[Any, str]) -> dict[str, float]:
        return evaluate(predictions, references, metrics=METRICS, retriever=retriever, images=records,
                        scenes=refs.scenes, bags=bags, cfg=cfg)  # fmt: skip

    rows: dict[str, dict[str, float]] = {"human": score(human)}
    for stage in stages:
        if not (demo.stage_dir(stage) / "DONE").exists():
            continue
        predictions = caption_world(demo, stage, world, "shifted")  # <stage>/captions_shifted_test.json
        write_results(out_dir / "captions" / f"{stage}.json", predictions)
        rows[stage] = score(predictions)
    write_tables(demo, rows, f"Shifted domain ({world_dir}, test split of {len(records)} images):")
    return rows


def write_tables(demo: Any, rows: dict[str, dict[str, float]], heading: str) -> str:
    """``transfer/results.json`` and ``transfer/results.md`` (the columns of :data:`COLUMNS` that some row has,
    titled as quick in a quick demo), printed under ``heading``; returns the table."""
    rd = f"RD{demo.cfg.eval.n_distractors}/"
    columns = [c.replace("RD/", rd) for c in COLUMNS]
    columns = [c for c in columns if any(c in r for r in rows.values())]
    table = markdown_table({k: {c: v.get(c) for c in columns} for k, v in rows.items()}, columns)
    table = quick_labelled(table, demo.quick)
    out_dir = demo.run_dir / "transfer"
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "results.json", rows)
    atomic_write_text(out_dir / "results.md", table + "\n")
    print(f"{heading}\n")
    print(table)
    return table
