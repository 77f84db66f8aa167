"""The demo's Visual Caption Boosting stages (NDLB Tables 2-3 on the embedded world); an optional group, not in the
default ``demo.stages``: ``finecap demo --stages vcb`` runs them all (after ``world``, ``retriever``, ``mle`` and
``discritune``, which it runs first when missing), or name single stages.

- ``visual_expert``: the VLM stand-in, a ClipCap trained on dense captions (recipe ``demo/visual_expert``);
- ``boost_holistic``: ``finecap boost`` with the world backends, mode ``holistic`` (BlendCap and VisualCap too), into
  ``<run_dir>/world_holistic`` (a world folder whose records carry every caption field), made again when the visual
  expert trained since or the ``boost.*`` settings changed (:func:`stage_boost`);
- ``captions_holistic``: the caption fields themselves on the test split (NDLB Table 2): for the first human
  caption, BlendCap, VisualCap and HolisticCap, words, faithfulness precision / recall, true and false facts per
  caption, RD99 R@1, NDLB's ClipSc and bag R@1 with the world CLIP and with the fact-based listener (which, unlike
  the CLIP, never saw the visual expert's style of caption);
- ``mle_blend`` / ``mle_holistic``: the ``demo/mle`` recipe on BlendCap / HolisticCap (``data.captions``), for as
  many optimizer steps as ``mle`` takes on the five human captions (one boosted caption per image would otherwise
  get a fifth of the steps), with captions of up to :data:`MAX_TOKENS` tokens (boosted captions are long);
- ``sr_l`` / ``sr_l_blend`` / ``sr_l_holistic``: NDLB's SR-L (recipe ``demo/sr_l``: LoRA of rank 32 on the LM's
  attention as NDLB's released code, mapper trained fully, sampling at T = 0.3) from ``mle`` and from each of them
  (NDLB Table 3 rows 4-6);
- ``discritune_blend`` / ``discritune_holistic``: the demo's ``demo/discritune`` (DiscriTune's full fine-tuning,
  greedy decoding) from each of them, beside the SR-L rows;
- ``report_vcb``: NDLB Table 3: the test-split metrics of the stages of :data:`TABLE3_STAGES`, measured as NDLB
  measures them: BLEU-4 / CIDEr-D against the references of the caption field each captioner was trained on (and
  against human captions 2-5, the main table's, under :data:`HUMAN_REFS`), ClipSc, and bags built from the
  HolisticCap captions (and the main table's human-caption bags under :data:`HUMAN_BAGS`); writes
  ``vcb_results.json`` / ``vcb_results.md`` with the caption-field table and the group's stage times
  (``vcb_timings.json``, written by the ``vcb`` stage); a quick demo's tables are titled as such
  (:data:`finecap.report.table.QUICK_TITLE`).

:mod:`finecap.app.demo` puts these stages in its table (this module must not import it: the import graph stays
acyclic).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finecap.app.bags import reuse_bags
from finecap.app.boost import boost_unless_current
from finecap.boost import training
from finecap.data.bags_file import read_bags
from finecap.data.datasets import load_records
from finecap.data.formats import read_dataset
from finecap.data.results import read_results
from finecap.home import world_path
from finecap.metrics.suite import evaluate
from finecap.models.retriever import load_retriever
from finecap.report.table import markdown_table, quick_labelled
from finecap.stages import Stage, StageRunner
from finecap.utils.files import atomic_write_text, write_json
from finecap.utils.reading import read_json
from finecap.world.facts import faithfulness
from finecap.world.make import load_scenes

log = logging.getLogger(__name__)

FIELD_OF: dict[str, str] = {
    "mle_blend": "blend",
    "mle_holistic": "holistic",
    "sr_l_blend": "blend",
    "sr_l_holistic": "holistic",
    "discritune_blend": "blend",
    "discritune_holistic": "holistic",
}
"""Training stages of the group and the boosted caption field they train on (the others: the human captions)."""
VCB_TRAIN_STAGES: dict[str, str | None] = {
    "visual_expert": None,
    "mle_blend": None,
    "mle_holistic": None,
    "sr_l": "mle",
    "sr_l_blend": "mle_blend",
    "sr_l_holistic": "mle_holistic",
    "discritune_blend": "mle_blend",
    "discritune_holistic": "mle_holistic",
}
"""Training stages and the stage each starts from (``finecap.app.demo.TRAIN_STAGES`` entries)."""
VCB_RECIPES: dict[str, tuple[str, list[str]]] = {
    "mle_blend": ("mle", []),
    "mle_holistic": ("mle", []),
    "sr_l_blend": ("sr_l", []),
    "sr_l_holistic": ("sr_l", []),
    "discritune_blend": ("discritune", []),
    "discritune_holistic": ("discritune", []),
}
"""Recipes the training stages run (``finecap.app.demo.ABLATIONS`` entries); their overrides: :func:`overrides`.
``sr_l`` runs its own recipe ``demo/sr_l``."""
MAX_TOKENS = training.MAX_TOKENS
"""Caption tokens of the boosted stages, in training and decoding (:data:`finecap.boost.training.MAX_TOKENS`)."""
BASELINES = ("world", "retriever", "mle", "discritune")
GROUP = ("visual_expert", "boost_holistic", "captions_holistic", "mle_holistic", "sr_l_holistic",
         "discritune_holistic", "mle_blend", "sr_l_blend", "discritune_blend", "sr_l", "report_vcb")  # fmt: skip
TABLE3_STAGES: dict[str, str] = {
    "mle": "MLE on the human captions",
    "mle_blend": "MLE on BlendCap",
    "mle_holistic": "MLE on HolisticCap",
    "sr_l": "SR-L (NDLB, LoRA) from mle",
    "sr_l_blend": "SR-L (NDLB, LoRA) from mle_blend",
    "sr_l_holistic": "SR-L (NDLB, LoRA) from mle_holistic",
    "discritune": "DiscriTune (full fine-tuning) from mle",
    "discritune_blend": "DiscriTune (full fine-tuning) from mle_blend",
    "discritune_holistic": "DiscriTune (full fine-tuning) from mle_holistic",
}
"""Rows of the captioner table (NDLB Table 3 rows 1-6, then DiscriTune's own setting) and what each was trained on."""
FIELD_ROWS = {"human (1st caption)": "original", "BlendCap": "blend", "VisualCap": "visual", "HolisticCap": "holistic"}
METRICS = ["length", "faithfulness", "retrieval", "clipscore", "bags", "listener"]
REPORT_METRICS = ["length", "vocab", "faithfulness", "retrieval", "clipscore", "bags", "listener", "bleu", "cider"]
HUMAN_REFS = "human refs/"
"""Key prefix of BLEU-4 / CIDEr-D against human captions 2-5 (the main results table's references)."""
HUMAN_BAGS = "human bags/"
"""Key prefix of bag R@1 (world CLIP and listener) on the bags built from the human captions (the main table's)."""
BAG_COLUMNS = ["bag3/R@1", "bag5/R@1", "bag7/R@1", "listener/bag3/R@1", "listener/bag5/R@1", "listener/bag7/R@1"]
FIELD_COLUMNS = ["Length", "true facts", "false facts", "faith/precision", "faith/recall", "faith/halluc_rate",
                 "RD/R@1", "ClipSc", "bag3/R@1", "bag5/R@1", "bag7/R@1", "listener/RD/R@1", "listener/bag3/R@1",
                 "listener/bag5/R@1", "listener/bag7/R@1"]  # fmt: skip
TABLE3_COLUMNS = ["trained on", "Length", "Lexical diversity", "faith/precision", "faith/recall", "faith/halluc_rate",
                  "BLEU-4", "CIDEr-D", f"{HUMAN_REFS}BLEU-4", f"{HUMAN_REFS}CIDEr-D", "RD/R@1", "ClipSc", "bag3/R@1",
                  "bag5/R@1", "bag7/R@1", "listener/RD/R@1", "listener/bag3/R@1", "listener/bag5/R@1",
                  "listener/bag7/R@1"]  # fmt: skip
HUMAN_BAG_COLUMNS = [HUMAN_BAGS + c for c in BAG_COLUMNS]
TABLE2_TITLE = (
    "Caption fields of the test split (NDLB Table 2). ClipSc = 100 x cos(caption, image) with the world CLIP "
    "(NDLB's ClipSc); bag R@1 on TrueMatch bags built from the HolisticCap captions, as NDLB builds them; "
    "listener = the fact-based listener on the same candidates:"
)
TABLE3_TITLE = (
    "Captioners trained on them (NDLB Table 3). BLEU-4 and CIDEr-D against the references of the caption field each "
    "captioner was trained on (the human captions, BlendCap or HolisticCap), as NDLB scores them; human refs/ = "
    "against human captions 2-5, as the main results table. SR-L = NDLB's setting (recipe demo/sr_l: LoRA of rank 32 "
    "on the LM's attention, sampling at T = 0.3); DiscriTune = the demo's discritune recipe (full fine-tuning, greedy "
    "decoding). Bags built from the HolisticCap captions:"
)
HUMAN_BAGS_TITLE = "Both tables' rows on the bags built from the human captions (the main results table's bags):"


def boosted_dir(demo: Any) -> Path:
    return demo.run_dir / training.BOOSTED_DIR


def mle_steps(demo: Any) -> int:
    """Optimizer steps of the ``mle`` stage: epochs x ceil(training captions / batch size)."""
    return training.epoch_steps(demo.stage_config("mle"))


def overrides(demo: Any, stage: str) -> list[str]:
    """Settings of a group stage beneath the user's overrides (the boosted data set, its caption field)."""
    if stage == "visual_expert" or stage not in FIELD_OF:
        return []
    steps = mle_steps(demo) if stage.startswith("mle_") and not demo.quick else None
    return training.field_overrides(boosted_dir(demo), FIELD_OF[stage], steps)


def stage_boost(demo: Any) -> None:
    """``finecap boost`` of the world into :func:`boosted_dir` with the visual expert's best checkpoint, unless the
    data set there is current (:func:`boost_unless_current`)."""
    boost_unless_current(demo, boosted_dir(demo), force=demo.cfg.demo.force)


@dataclass
class Context:
    """What both VCB tables are scored with: the test split, its scene graphs, the world CLIP, two sets of bags and
    every caption field of each test image."""

    records: list[Any]
    scenes: dict[Any, Any]
    retriever: Any
    bags: dict[int, list[list[Any]]]
    """TrueMatch bags built from the HolisticCap captions (NDLB Sec. 3.1): the tables' ``bag*`` columns."""
    human_bags: dict[int, list[list[Any]]]
    """Bags built from the human captions (the main results table's ``bags_test.json``): :data:`HUMAN_BAGS`."""
    fields: dict[Any, dict[str, list[str]]]
    """``{image_id: {caption field: captions}}`` of the boosted data set (``original`` = the human captions)."""


def holistic_bags(demo: Any) -> Path:
    """TrueMatch bags of the test split built from the HolisticCap captions of the boosted data set
    (``bags.text_from=holistic``, as NDLB builds TrueMatch), once, and again when the boosted data, the retriever or
    the bags' settings change (:func:`finecap.app.bags.reuse_bags`): ``<run_dir>/bags_test_holistic.json``."""
    cfg = dataclasses.replace(demo.cfg, bags=dataclasses.replace(demo.cfg.bags, text_from="holistic"))
    return reuse_bags(cfg, data=boosted_dir(demo) / "dataset.json", split="test",
                      out=demo.run_dir / "bags_test_holistic.json", force=demo.cfg.demo.force)  # fmt: skip


def _context(demo: Any) -> Context:
    cfg = demo.cfg
    records = load_records(cfg, "test")
    scenes_by_imgid = load_scenes(world_path(cfg.world))
    scenes = {r.image_id: scenes_by_imgid[int(r.image_id)] for r in records}
    human_path = reuse_bags(cfg, out=demo.run_dir / "bags_test.json", force=cfg.demo.force)
    boosted = {r.image_id: r.boosted for r in read_dataset("world", boosted_dir(demo), check_images=False)}
    fields = {r.image_id: boosted[r.image_id] for r in records}
    return Context(records, scenes, load_retriever(cfg), read_bags(holistic_bags(demo)), read_bags(human_path), fields)


def _score(ctx: Context, cfg: Any, predictions: dict[Any, str], metrics: list[str],
           references: dict[Any, list[str]] | None) -> dict[str, float]:  # fmt: skip
    """``metrics`` on the HolisticCap bags, and bag R@1 (world CLIP and listener) on the human-caption bags under
    :data:`HUMAN_BAGS`."""
    row = evaluate(predictions, references, metrics=metrics, retriever=ctx.retriever, images=ctx.records,
                   scenes=ctx.scenes, bags=ctx.bags, cfg=cfg)  # fmt: skip
    human = evaluate(predictions, None, metrics=["bags", "listener"], retriever=ctx.retriever, images=ctx.records,
                     scenes=ctx.scenes, bags=ctx.human_bags, cfg=cfg)  # fmt: skip
    row.update({HUMAN_BAGS + k: v for k, v in human.items() if k in BAG_COLUMNS})
    return row


def stage_captions(demo: Any, ctx: Context | None = None) -> dict[str, dict[str, float]]:
    """NDLB Table 2 in the world: the caption fields of the test split scored like model captions."""
    ctx = ctx if ctx is not None else _context(demo)
    rows: dict[str, dict[str, float]] = {}
    for label, name in FIELD_ROWS.items():
        captions = {r.image_id: ctx.fields[r.image_id][name][0] for r in ctx.records}
        row = _score(ctx, demo.cfg, captions, METRICS, None)
        faith = [faithfulness(c, ctx.scenes[i]) for i, c in captions.items()]
        row["true facts"] = sum(f.n_correct for f in faith) / len(faith)
        row["false facts"] = sum(f.n_stated - f.n_correct for f in faith) / len(faith)
        rows[label] = row
    write_json(demo.run_dir / "vcb_captions.json", rows)
    return rows


def score_stage(ctx: Context, cfg: Any, stage: str, predictions: dict[Any, str]) -> dict[str, float]:
    """One captioner row: n-gram metrics against the references of the caption field ``stage`` was trained on (all
    human captions for the stages trained on them), as NDLB Table 3, and against human captions 2-5 under
    :data:`HUMAN_REFS`; the rest as :func:`_score`."""
    field = FIELD_OF.get(stage, "original")
    own = {r.image_id: list(ctx.fields[r.image_id][field]) for r in ctx.records if r.image_id in predictions}
    row = _score(ctx, cfg, predictions, REPORT_METRICS, own)
    human = {r.image_id: r.captions[1:] for r in ctx.records if r.image_id in predictions}
    ngrams = evaluate(predictions, human, metrics=["bleu", "cider"], cfg=cfg)
    row.update({HUMAN_REFS + k: v for k, v in ngrams.items()})
    return row


def _columns(columns: list[str], cfg: Any) -> list[str]:
    return [c.replace("RD/", f"RD{cfg.eval.n_distractors}/") for c in columns]


def stage_report(demo: Any) -> dict[str, Any]:
    """NDLB Tables 3 and 2 in the world (the caption fields scored again, as the bags and columns may be newer than
    ``vcb_captions.json``), both on the human-caption bags too, and the group's stage times."""
    cfg = demo.cfg
    ctx = _context(demo)
    rows: dict[str, dict[str, float]] = {}
    for stage in TABLE3_STAGES:
        path = demo.stage_dir(stage) / "captions_test.json"
        if not path.exists():
            log.warning("report_vcb: no test captions of stage %r (%s); row left out", stage, path)
            continue
        predictions = {i: caps[0] for i, caps in read_results(path).items()}
        rows[stage] = score_stage(ctx, cfg, stage, predictions)
    fields = stage_captions(demo, ctx)
    timings = {}  # stages run one by one (`--stages mle_holistic`) are timed by the demo, the group by `vcb`
    for name in ("timings.json", "vcb_timings.json"):
        if (demo.run_dir / name).exists():
            timings.update(read_json(demo.run_dir / name))
    shown = {k: {"trained on": TABLE3_STAGES[k], **v} for k, v in rows.items()}
    table = TABLE2_TITLE + "\n\n" + markdown_table(fields, _columns(FIELD_COLUMNS, cfg), row_header="caption")
    table += "\n\n" + TABLE3_TITLE + "\n\n" + markdown_table(shown, _columns(TABLE3_COLUMNS, cfg))
    table += "\n\n" + HUMAN_BAGS_TITLE + "\n\n" + markdown_table({**fields, **rows}, HUMAN_BAG_COLUMNS, "row")
    group_times = {k: v for k, v in timings.items() if k in GROUP}
    table += "\n\nStage wall times (s): " + ", ".join(f"{k} {v}" for k, v in group_times.items())
    settings = {
        "bags": "built from the HolisticCap captions (bags_test_holistic.json); human bags/: bags_test.json",
        "references": "BLEU-4 / CIDEr-D: the trained caption field's; human refs/: human captions 2-5",
        "trained on": TABLE3_STAGES,
    }
    write_json(demo.run_dir / "vcb_results.json",
               {"captions": fields, "models": rows, "timings": group_times, "settings": settings})  # fmt: skip
    table = quick_labelled(table, demo.quick)
    atomic_write_text(demo.run_dir / "vcb_results.md", table + "\n")
    print(table)
    return rows


def run_group(demo: StageRunner) -> None:
    """The ``vcb`` stage: the baselines when missing, then every stage of :data:`GROUP`, each timed."""
    timings_file = demo.run_dir / "vcb_timings.json"
    for stage in (*BASELINES, *GROUP):
        if stage in BASELINES and stage not in ("world", "retriever") and demo.is_done(stage) and not demo.force:
            continue
        log.info("== demo stage: %s (vcb)", stage)
        start = time.perf_counter()
        demo.run_stage(stage)
        timings = read_json(timings_file) if timings_file.exists() else {}
        timings[stage] = round(time.perf_counter() - start, 1)
        write_json(timings_file, timings)


STAGES = (
    Stage("boost_holistic", run=stage_boost),
    Stage("captions_holistic", run=stage_captions),
    Stage("report_vcb", run=stage_report),
    Stage("vcb", run=run_group),
)
"""The group's tasks; its training stages (:data:`VCB_TRAIN_STAGES`) are the demo's, built as the others
(:func:`finecap.app.demo.training_stage`)."""
