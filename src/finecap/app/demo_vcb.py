"""The demo's Visual Caption Boosting stages (NDLB Tables 2-3 on the embedded world); an optional group, not in the
default ``demo.stages``: ``finecap demo --stages vcb`` runs them all (after ``world``, ``retriever``, ``mle`` and
``discritune``, which it runs first when missing), or name single stages.

- ``visual_expert``: the VLM stand-in, a ClipCap trained on dense captions (recipe ``demo/visual_expert``);
- ``boost_holistic``: ``finecap boost`` with the world backends, mode ``holistic`` (BlendCap and VisualCap too), into
  ``<run_dir>/world_holistic`` (a world folder whose records carry every caption field);
- ``captions_holistic``: the caption fields themselves on the test split (NDLB Table 2): for the first human
  caption, BlendCap, VisualCap and HolisticCap, words, faithfulness precision / recall, true and false facts per
  caption, RD99 R@1 and bag R@1 with the world CLIP and with the fact-based listener (which, unlike the CLIP, never
  saw the visual expert's style of caption);
- ``mle_blend`` / ``mle_holistic``: the ``demo/mle`` recipe on BlendCap / HolisticCap (``data.captions``), for as
  many optimizer steps as ``mle`` takes on the five human captions (one boosted caption per image would otherwise
  get a fifth of the steps), with captions of up to :data:`MAX_TOKENS` tokens (boosted captions are long);
- ``discritune_blend`` / ``discritune_holistic``: ``demo/discritune`` (SR-L) from each of them;
- ``report_vcb``: NDLB Table 3: the test-split metrics of ``mle``, ``mle_blend``, ``mle_holistic``, ``discritune``,
  ``discritune_blend`` and ``discritune_holistic``; writes ``vcb_results.json`` / ``vcb_results.md`` with the
  caption-field table and the group's stage times (``vcb_timings.json``, written by the ``vcb`` stage); a quick
  demo's tables are titled as such (:data:`finecap.report.table.QUICK_TITLE`).

:mod:`finecap.app.demo` registers these stages (this module must not import it: the import graph stays acyclic).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from finecap.app.bags import main as build_bags
from finecap.app.boost import main as boost
from finecap.config import load
from finecap.data.datasets import load_records
from finecap.data.formats import read_bags, read_dataset, read_results
from finecap.home import world_path
from finecap.metrics.suite import evaluate
from finecap.models.retriever import load_retriever
from finecap.report.table import markdown_table, quick_labelled
from finecap.utils import atomic_write_text, read_json, write_json
from finecap.world.facts import faithfulness
from finecap.world.make import load_scenes

log = logging.getLogger(__name__)

FIELD_OF: dict[str, str] = {
    "mle_blend": "blend",
    "mle_holistic": "holistic",
    "discritune_blend": "blend",
    "discritune_holistic": "holistic",
}
"""Training stages of the group and the caption field they train on."""
VCB_TRAIN_STAGES: dict[str, str | None] = {
    "visual_expert": None,
    "mle_blend": None,
    "mle_holistic": None,
    "discritune_blend": "mle_blend",
    "discritune_holistic": "mle_holistic",
}
"""Training stages and the stage each starts from (``finecap.app.demo.TRAIN_STAGES`` entries)."""
VCB_RECIPES: dict[str, tuple[str, list[str]]] = {
    "mle_blend": ("mle", []),
    "mle_holistic": ("mle", []),
    "discritune_blend": ("discritune", []),
    "discritune_holistic": ("discritune", []),
}
"""Recipes the training stages run (``finecap.app.demo.ABLATIONS`` entries); their overrides: :func:`overrides`."""
MAX_TOKENS = 55
"""Caption tokens (EOS included) of the boosted stages, in training and decoding: the most the world-tiny LM's 64
positions allow after a 10-token prefix (boosted captions are long; the longest are still cut)."""
BASELINES = ("world", "retriever", "mle", "discritune")
GROUP = ("visual_expert", "boost_holistic", "captions_holistic", "mle_holistic", "discritune_holistic", "mle_blend",
         "discritune_blend", "report_vcb")  # fmt: skip
TABLE3_STAGES = ("mle", "mle_blend", "mle_holistic", "discritune", "discritune_blend", "discritune_holistic")
FIELD_ROWS = {"human (1st caption)": "original", "BlendCap": "blend", "VisualCap": "visual", "HolisticCap": "holistic"}
METRICS = ["length", "faithfulness", "retrieval", "bags", "listener"]
REPORT_METRICS = ["length", "vocab", "faithfulness", "retrieval", "bags", "listener", "bleu", "cider"]
FIELD_COLUMNS = ["Length", "true facts", "false facts", "faith/precision", "faith/recall", "faith/halluc_rate",
                 "RD/R@1", "bag3/R@1", "bag5/R@1", "bag7/R@1", "listener/RD/R@1", "listener/bag3/R@1",
                 "listener/bag5/R@1", "listener/bag7/R@1"]  # fmt: skip
TABLE3_COLUMNS = ["Length", "Lexical diversity", "faith/precision", "faith/recall", "faith/halluc_rate", "RD/R@1",
                  "bag3/R@1", "bag5/R@1", "bag7/R@1", "listener/RD/R@1", "listener/bag3/R@1", "listener/bag5/R@1",
                  "listener/bag7/R@1", "BLEU-4", "CIDEr-D"]  # fmt: skip


def boosted_dir(demo: Any) -> Path:
    return demo.run_dir / "world_holistic"


def mle_steps(demo: Any) -> int:
    """Optimizer steps of the ``mle`` stage: epochs x ceil(training captions / batch size)."""
    cfg = demo.stage_config("mle")
    if cfg.train.max_steps > 0:
        return cfg.train.max_steps
    n = sum(len(r.captions) for r in load_records(cfg, "train"))
    return math.ceil(cfg.train.epochs * math.ceil(n / cfg.train.batch_size))


def overrides(demo: Any, stage: str) -> list[str]:
    """Settings of a group stage beneath the user's overrides (the boosted data set, its caption field)."""
    if stage == "visual_expert" or stage not in FIELD_OF:
        return []
    out = [
        f"data.path={boosted_dir(demo) / 'dataset.json'}",
        f"data.captions={FIELD_OF[stage]}",
        f"data.max_tokens={MAX_TOKENS}",
        f"decode.max_length={MAX_TOKENS}",
    ]
    if stage.startswith("mle_") and not demo.quick:
        out.append(f"train.max_steps={mle_steps(demo)}")
    return out


def stage_boost(demo: Any) -> None:
    out = boosted_dir(demo)
    if (out / "dataset.json").exists() and not demo.cfg.demo.force:
        log.info("boost_holistic: %s exists; skipping", out)
        return
    expert = demo.stage_dir("visual_expert") / "checkpoints" / "best"
    cfg = load(None, [*demo.items, "boost.mode=holistic", "boost.llm_backend=world", "boost.vlm_backend=world",
                      f"boost.vlm_model={expert}"], base=_base(demo))  # fmt: skip
    boost(cfg, out)


def _base(demo: Any) -> dict[str, dict[str, Any]]:
    """The demo's resolved sections as a base layer (world, retriever and cache settings of this demo run)."""
    return {k: v for k, v in demo.cfg.to_dict().items() if k in ("run", "world", "retriever", "eval", "decode")}


def _context(demo: Any) -> tuple[list, dict, Any, dict]:
    cfg = demo.cfg
    records = load_records(cfg, "test")
    scenes_by_imgid = load_scenes(world_path(cfg.world))
    scenes = {r.image_id: scenes_by_imgid[int(r.image_id)] for r in records}
    path = demo.run_dir / "bags_test.json"
    if not path.exists() or cfg.demo.force:
        build_bags(cfg, split="test", sizes=cfg.eval.bag_sizes, out=path)
    return records, scenes, load_retriever(cfg), read_bags(path)


def stage_captions(demo: Any) -> dict[str, dict[str, float]]:
    """NDLB Table 2 in the world: the caption fields of the test split scored like model captions."""
    records, scenes, retriever, bags = _context(demo)
    boosted = {r.image_id: r for r in read_dataset("world", boosted_dir(demo), check_images=False)}
    rows: dict[str, dict[str, float]] = {}
    for label, name in FIELD_ROWS.items():
        captions = {r.image_id: boosted[r.image_id].boosted[name][0] for r in records}
        row = evaluate(captions, None, metrics=METRICS, retriever=retriever, images=records, scenes=scenes,
                       bags=bags, cfg=demo.cfg)  # fmt: skip
        faith = [faithfulness(c, scenes[i]) for i, c in captions.items()]
        row["true facts"] = sum(f.n_correct for f in faith) / len(faith)
        row["false facts"] = sum(f.n_stated - f.n_correct for f in faith) / len(faith)
        rows[label] = row
    write_json(demo.run_dir / "vcb_captions.json", rows)
    return rows


def _columns(columns: list[str], cfg: Any) -> list[str]:
    return [c.replace("RD/", f"RD{cfg.eval.n_distractors}/") for c in columns]


def stage_report(demo: Any) -> dict[str, Any]:
    """NDLB Table 3 in the world, with the caption-field table (Table 2) and the group's stage times."""
    cfg = demo.cfg
    records, scenes, retriever, bags = _context(demo)
    references = {r.image_id: r.captions[1:] for r in records}
    rows: dict[str, dict[str, float]] = {}
    for stage in TABLE3_STAGES:
        path = demo.stage_dir(stage) / "captions_test.json"
        if not path.exists():
            log.warning("report_vcb: no test captions of stage %r (%s); row left out", stage, path)
            continue
        predictions = {i: caps[0] for i, caps in read_results(path).items()}
        rows[stage] = evaluate(predictions, references, metrics=REPORT_METRICS, retriever=retriever, images=records,
                               scenes=scenes, bags=bags, cfg=cfg)  # fmt: skip
    fields_file = demo.run_dir / "vcb_captions.json"
    fields = read_json(fields_file) if fields_file.exists() else stage_captions(demo)
    timings = {}  # stages run one by one (`--stages mle_holistic`) are timed by the demo, the group by `vcb`
    for name in ("timings.json", "vcb_timings.json"):
        if (demo.run_dir / name).exists():
            timings.update(read_json(demo.run_dir / name))
    table = "Caption fields of the test split (NDLB Table 2):\n\n"
    table += markdown_table(fields, _columns(FIELD_COLUMNS, cfg))
    table += "\n\nCaptioners trained on them (NDLB Table 3):\n\n" + markdown_table(rows, _columns(TABLE3_COLUMNS, cfg))
    group_times = {k: v for k, v in timings.items() if k in GROUP}
    table += "\n\nStage wall times (s): " + ", ".join(f"{k} {v}" for k, v in group_times.items())
    write_json(demo.run_dir / "vcb_results.json", {"captions": fields, "models": rows, "timings": group_times})
    table = quick_labelled(table, demo.quick)
    atomic_write_text(demo.run_dir / "vcb_results.md", table + "\n")
    print(table)
    return rows


def group(stages: dict[str, Callable[[Any], Any]], train_done: Callable[[Any, str], bool]) -> Callable[[Any], None]:
    """The ``vcb`` stage: the baselines when missing, then every stage of :data:`GROUP`, each timed."""

    def run(demo: Any) -> None:
        timings_file = demo.run_dir / "vcb_timings.json"
        for stage in (*BASELINES, *GROUP):
            if stage in BASELINES and stage not in ("world", "retriever") and train_done(demo, stage):
                continue
            log.info("== demo stage: %s (vcb)", stage)
            start = time.perf_counter()
            stages[stage](demo)
            timings = read_json(timings_file) if timings_file.exists() else {}
            timings[stage] = round(time.perf_counter() - start, 1)
            write_json(timings_file, timings)

    return run


def register(stages: dict[str, Callable[[Any], Any]], train_stage: Callable[[str], Callable[[Any], None]]) -> None:
    """Add the group's stages (training stages through the demo's ``train_stage``) and ``vcb`` to ``stages``."""
    stages.update({name: train_stage(name) for name in VCB_TRAIN_STAGES})
    stages.update({"boost_holistic": stage_boost, "captions_holistic": stage_captions, "report_vcb": stage_report})
    stages["vcb"] = group(stages, lambda demo, s: (demo.stage_dir(s) / "DONE").exists() and not demo.cfg.demo.force)
