"""``finecap demo``: the whole pipeline on the embedded world, ending in one results table.

Stages (``demo.stages``, run in order; each skips work whose outputs exist unless ``demo.force``). Training stages
that no other listed stage starts from (every objective after ``mle`` / ``blip_mle``) run side by side, ``demo.jobs``
at a time (default: the cores divided by ``demo.stage_threads``), each in its own process with
``demo.stage_threads`` torch threads (default 1) whatever the job count, so their results do not depend on it
(``tests/app/test_demo_stages.py``); every other stage waits for them and runs alone with all threads. The default list
starts the longest side stages first.

- ``world``: generate the synthetic world (``world.*``), or reuse it: in ``world.out``, by default in the finecap home
  (``<home>/worlds/<world key>``, :mod:`finecap.home`), so every demo run on the same settings shares it.
- ``retriever``: train the world encoder / CLIP retriever, or reuse it from the cache (``run.cache_dir``, by default
  ``<home>/cache``). Both go through :func:`finecap.train.prepare.prepare`, which says what it makes and where.
- training stages (:data:`TRAIN_STAGES`): train a captioner with the packaged recipe ``demo/<stage>`` into
  ``<run_dir>/<stage>/`` (starting from the MLE checkpoint where the stage says so), then caption the test split.
  A killed stage resumes from its last checkpoint when re-run (checked as a finished stage's reuse is:
  :meth:`finecap.stages.StageRunner.check_continue`), or, killed before it saved one, trains again from the start
  (:func:`finecap.train.state.continue_unfinished`). A finished stage is reused only when the inputs its
  run recorded (``<stage>/fingerprints.json``: the data, the captioner's encoder, the retriever) are those of its
  configuration now, its configuration is the one it saved (``<stage>/config.yaml``: an override or an edited recipe
  changes it; ``demo.*`` and where folders are do not) and the stage it starts from was not trained again since
  (``<stage>/start.json``); else it is refused with an error naming what differs
  (:meth:`finecap.stages.StageRunner.check_reuse`), and ``--force`` (``demo.force``) trains it again.
- ``grpo_sr_cider`` (in the default list): GRPO (GDPO) on self-retrieval + CIDEr-D with a KL to the MLE start, the
  recipe ``demo/grpo_sr_cider``; the report draws its RL panels (each reward part, KL, clip fraction, ratio range,
  advantage spread, the monitors) and the captions its evaluations logged.
- world-VLM stages (:data:`VLM_STAGES`): ``vlm_mle`` and ``vlm_smile`` (in the default ``demo.stages``) and
  ``vlm_discritune`` (optional) train the world VLM (a tiny LLaVA-architecture model reading the frozen world
  encoder's image tokens, ``vlm.name=world-tiny``) with the recipes ``demo/vlm_*``, as the world BLIP's ``blip_*``
  stages; e.g. ``finecap demo --stages world,retriever,vlm_mle,vlm_discritune,report``. Their rows join the tables
  of the report stage when they have run (docs/vlm.md).
- optional controls and extras (not in the default list): ``mle_continued`` (MLE trained for as many more steps as
  SMILE: is a gain over ``mle`` only more training?), ``scst_me``, ``blip_discritune``, ``smile_random`` /
  ``smile_reverse``, the ``vcb`` group and ``transfer``; ``benchmarks/effects.py`` runs ``mle_continued`` too.
- ``report``: evaluate every trained stage and the human reference captions on the test split and write
  ``results.json`` (stage -> metric -> number), ``results.md`` and the captions (COCO results format), then the
  HTML report ``report.html`` (:mod:`finecap.app.report`: tables, plots, caption and bag galleries). Next to the
  retriever's self-retrieval, the fact-based listener's (:mod:`finecap.metrics.listener`): a second table compares
  them per stage, and ``exploit`` (captions the retriever places first but the listener does not) is in the first.
- ``transfer`` (not in the default list): every trained stage captions the shifted domain's test split
  (``world.shift=domain``), scored against its references (:mod:`finecap.app.demo_transfer`).

One demo at a time works in a run directory: it holds ``<run_dir>/.demo.lock`` (:data:`DEMO_LOCK`), and a second
stops with an error naming the first. Side stages' worker processes end with the demo process, however it ends
(:func:`finecap.stages.pool.exit_with_parent`).

The stages are data (:data:`STAGES`, :class:`finecap.stages.Stage` rows) run by the library's stage runner
(:class:`finecap.stages.StageRunner`: configuration layers, ``DONE`` markers, input checks, resume, the side-stage
pool); this module holds what the demo runs: its table, its settings and its report.

``--quick`` swaps in tiny settings (:data:`QUICK`) that finish in about two minutes; any ``section.key=value``
override still applies on top (``finecap demo world.seed=7 world.n_train=5000``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

from finecap.app import demo_vcb
from finecap.app.bags import reuse_bags
from finecap.app.demo_families import (
    caption_families,
    family_captions,
    family_scores,
    family_world,
    has_families,
    make_family_world,
)
from finecap.app.demo_transfer import stage_transfer
from finecap.app.report import main as write_report
from finecap.config import Config, did_you_mean, load
from finecap.data.bags_file import read_bags
from finecap.data.datasets import load_records
from finecap.data.results import read_results, write_results
from finecap.home import runs_root, world_path
from finecap.locks import output_lock
from finecap.metrics import families
from finecap.metrics.suite import evaluate
from finecap.models.retriever import load_retriever
from finecap.outputs import OutputRefused, write_output
from finecap.recipes import resolve_recipe
from finecap.recipes.settings import DEMO_BASE, DEMO_QUICK
from finecap.report.plots import length_curves
from finecap.report.table import markdown_table, quick_labelled
from finecap.runs import CONFIG_FILE, METRICS_FILE
from finecap.stages import TRAIN, Stage, StageRunner, stage_table
from finecap.stages.outputs import caption_stage, diversity_metrics
from finecap.train.prepare import prepare
from finecap.train.run import train
from finecap.train.state import check_config_target
from finecap.utils.files import atomic_write_text, refuse_link, write_json
from finecap.world.make import load_scenes

log = logging.getLogger(__name__)

DEFAULT = DEMO_BASE
"""Settings of the default demo beneath every recipe (:data:`finecap.recipes.settings.DEMO_BASE`)."""
QUICK = DEMO_QUICK
"""``--quick``: a tiny world and a few steps per stage (:data:`finecap.recipes.settings.DEMO_QUICK`)."""
# Stages of the world VLM (vlm.name=world-tiny, recipes demo/vlm_*), as TRAIN_STAGES below.
VLM_STAGES: dict[str, str | None] = {"vlm_mle": None, "vlm_smile": "vlm_mle", "vlm_discritune": "vlm_mle"}
# Training stages: recipe name and the stage whose best checkpoint it starts from (None = fresh model).
TRAIN_STAGES: dict[str, str | None] = {
    "mle": None,
    "mle_continued": "mle",
    "smile": "mle",
    "scst": "mle",
    "sle": "mle",
    "scst_me": "mle",
    "discritune": "mle",
    "sr_bagcurri": "mle",
    "grpo_sr_cider": "mle",  # GRPO (GDPO) on self-retrieval + CIDEr-D with a KL to the MLE start
    "smile_random": "mle",
    "smile_reverse": "mle",
    "blip_mle": None,
    "blip_smile": "blip_mle",
    "blip_discritune": "blip_mle",
    **VLM_STAGES,  # the world VLM (vlm_mle, vlm_smile in the default demo.stages)
    **demo_vcb.VCB_TRAIN_STAGES,  # Visual Caption Boosting (optional group `vcb`, finecap.app.demo_vcb)
}
# Ablation stages: the recipe they run and the overrides that make them (SMILE Sec. 3.4 subsetting ablations).
ABLATIONS: dict[str, tuple[str, list[str]]] = {
    "smile_random": ("smile", ["smile.subset=random"]),
    "smile_reverse": ("smile", ["smile.subset=reverse"]),
    **demo_vcb.VCB_RECIPES,
}
# Stages whose set-level diversity (5 captions per image, sampled and beam) is reported (exploration paper Table 4).
DIVERSITY_STAGES = ("mle", "mle_continued", "scst", "sle", "scst_me")
# Metric groups of the demo table on the test split (finecap.metrics.suite names); the bags, family R@1 and the hard
# RD come from the scene-family test world (finecap.app.demo_families).
REPORT_METRICS = ["length", "vocab", "faithfulness", "retrieval", "bleu", "cider", "clipscore", "listener"]
# Columns of the printed table, in order (keys of evaluate's output; "RD" becomes RD{eval.n_distractors}). The hard RD
# (family members among the distractors) is the headline fine-grained measure: RD99 is at its ceiling.
COLUMNS = ["Length", "Lexical diversity", "Vocab usage", "faith/precision", "faith/recall", "faith/halluc_rate",
           "hardRD/R@1", "hardRD/R@5", "family/R@1", "RD/R@1", "RD/R@5", "bag3/R@1", "bag5/R@1", "bag7/R@1",
           "CLIPScore", "BLEU-4", "CIDEr-D", "listener/RD/exploit"]  # fmt: skip
# Retriever vs fact-based listener on the same candidates (listener R@1 with ties broken at random; tie rate).
LISTENER_COLUMNS = ["RD/R@1", "listener/RD/R@1", "listener/RD/tie_rate", "listener/RD/exploit",
                    *[f"{who}bag{n}/R@1" for n in (3, 5, 7) for who in ("", "listener/")],
                    "listener/bag3/tie_rate", "listener/bag3/exploit"]  # fmt: skip
DIVERSITY_COLUMNS = [f"{mode}/{m}" for mode in ("sample", "beam") for m in ("CIDEr-D", "Div-1", "Div-2", "mBLEU-4")]


DEMO_LOCK = ".demo.lock"
"""Held in the run directory while a demo runs there (:func:`finecap.locks.output_lock`): a second demo on the same
directory stops with an error naming the first."""
WAYS_OUT = ("re-run it alone with --stages {stage} --force (demo.force=true), or give the demo another run directory "
            "(--out)")  # fmt: skip
"""What a demo user can do about a stage it will not reuse or continue (``--force`` retrains every listed stage,
hence ``--stages``)."""


def load_demo_config(recipe: str | None, items: list[str], quick: bool) -> Config:
    """The demo's configuration: demo defaults, an optional recipe, the quick settings, then the overrides."""
    return load(recipe, items, base=DEFAULT, over=QUICK if quick else None)


def demo_runner(cfg: Config, items: list[str], quick: bool, run_dir: Path,
                recipe: dict[str, dict[str, Any]] | None = None) -> StageRunner:  # fmt: skip
    """The stage runner of a demo on :data:`STAGES`: each training stage's recipe over :func:`stage_base` of the
    user's ``recipe`` (its sections, :func:`read_recipe`), the quick settings above it when ``quick``, then the
    user's ``items``; VCB stages add the boosted data set's settings (:func:`finecap.app.demo_vcb.overrides`)."""
    return StageRunner(
        STAGES, cfg, run_dir, train=train, items=list(items), quick=quick, base=stage_base(recipe or {}),
        over=QUICK if quick else None, force=cfg.demo.force, computed=demo_vcb.overrides, what="demo stage",
        ways_out=WAYS_OUT,
    )  # fmt: skip


def read_recipe(recipe: str | None) -> dict[str, dict[str, Any]]:
    """The sections of the user's recipe (``finecap demo RECIPE``), read once (:func:`main`); ``{}`` without one.
    :func:`load_demo_config` has validated it, with errors naming it."""
    if recipe is None:
        return {}
    from finecap.utils.reading import read_yaml_mapping

    loaded = read_yaml_mapping(resolve_recipe(recipe), "a recipe must be a mapping of sections")
    return {section: dict(values or {}) for section, values in loaded.items()}


def stage_base(recipe: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The settings beneath a stage's own recipe: the demo's defaults (:data:`DEFAULT`), the user's recipe on top,
    section by section. So a recipe setting ``world.seed: 1`` trains every stage on that world (as it makes the
    demo's world), while what a stage's recipe sets (its objective, its starting checkpoint, its learning rate)
    stays the stage's: the user's recipe fills in what the stage leaves open. ``key=value`` overrides apply above
    every stage's recipe."""
    return {section: {**DEFAULT.get(section, {}), **recipe.get(section, {})} for section in {*DEFAULT, *recipe}}


# --------------------------------------------------------------------------------------------------------------------
# Stages
# --------------------------------------------------------------------------------------------------------------------


def stage_world(demo: StageRunner) -> None:
    log.info("world: %s", prepare(demo.cfg, {"world"}, make=True).world)
    if has_families(demo.cfg):
        log.info("scene-family test world: %s", make_family_world(demo.cfg)[1])
    else:
        log.warning("no scene-family test world: world.n_test=%d holds no family of %d (the hard RD, family and bag "
                    "columns are left out)", demo.cfg.world.n_test, families.FAMILY_SIZE)  # fmt: skip


def caption_test_worlds(demo: StageRunner, stage: str) -> None:
    """After training: the stage's captions of the test split and of the scene-family test world."""
    caption_stage(demo, stage)
    if has_families(demo.cfg):
        caption_families(demo, stage)


def stage_retriever(demo: StageRunner) -> None:
    log.info("retriever: %s", prepare(demo.cfg, {"world", "world_encoder"}, make=True).world_encoder)


def training_stage(name: str) -> Stage:
    """Training stage ``name`` (:data:`TRAIN_STAGES`): its recipe ``demo/<recipe>`` and variant (:data:`ABLATIONS`),
    the stage it starts from; then its captions of the test split and of the scene-family test world."""
    recipe, variant = ABLATIONS.get(name, (name, []))
    return Stage(name, TRAIN, recipe=f"demo/{recipe}", overrides=tuple(variant), init=TRAIN_STAGES[name],
                 then=caption_test_worlds)  # fmt: skip


def test_bags(demo: StageRunner) -> dict[int, list[list[Any]]]:
    """TrueMatch-style bags (NDLB Algorithms 1-2) of sizes ``eval.bag_sizes`` on the test split, built once and
    again when their world, retriever or settings change (:func:`finecap.app.bags.reuse_bags`)."""
    path = reuse_bags(demo.cfg, out=demo.run_dir / "bags_test.json", force=demo.cfg.demo.force)
    return read_bags(path)


def smile_length_plot(demo: StageRunner) -> Path | None:
    """Mean validation caption length over training steps for each SMILE subset mode (SMILE Fig. 4a), when at least
    one ablation run is present next to ``smile``."""
    runs = {label: demo.stage_dir(stage) for label, stage in
            (("sequence (SMILE)", "smile"), ("random", "smile_random"), ("reverse", "smile_reverse"))}  # fmt: skip
    runs = {label: path for label, path in runs.items() if (path / METRICS_FILE).exists()}
    if len(runs) < 2:
        return None
    return length_curves(runs, demo.run_dir / "smile_length.png", start=demo.stage_dir("mle"))


def stage_report(demo: StageRunner) -> dict[str, dict[str, float]]:
    cfg = demo.cfg
    finished = [stage for stage in TRAIN_STAGES if demo.is_done(stage)]  # neither never trained nor a killed retrain
    for stage in finished:  # trained on the inputs the report scores against (before anything loads)
        demo.check_reuse(stage, demo.stage_config(stage))
    records = load_records(cfg, "test")
    scenes_by_imgid = load_scenes(world_path(cfg.world))
    scenes = {r.image_id: scenes_by_imgid[int(r.image_id)] for r in records}
    retriever = load_retriever(cfg)
    test_bags(demo)  # the test split's bags: the report's bag gallery and the VCB stages' human bags
    family = family_world(demo) if has_families(cfg) else None  # (a tiny test world holds no family)
    # The human row: the first reference caption of each image, scored against the other four (n-gram metrics)
    # and against the image (faithfulness, retrieval) exactly like a model's caption. Model rows are scored against
    # the same four references, so every row is comparable.
    human = {r.image_id: r.captions[0] for r in records}
    references = {r.image_id: r.captions[1:] for r in records}

    def score(predictions: dict[Any, str]) -> dict[str, float]:
        return evaluate(predictions, references, metrics=REPORT_METRICS, retriever=retriever, images=records,
                        scenes=scenes, cfg=cfg)  # fmt: skip

    def score_families(stage: str | None) -> dict[str, float]:
        if family is None:
            return {}
        return family_scores(demo, family, family_captions(demo, stage, family), retriever, listener=True)

    write_results(demo.run_dir / "captions" / "human.json", human)
    rows: dict[str, dict[str, Any]] = {"human": {**score(human), **score_families(None)}}
    for stage in finished:
        path = caption_stage(demo, stage)  # made again when the stage was trained again since
        predictions = {i: caps[0] for i, caps in read_results(path).items()}
        write_results(demo.run_dir / "captions" / f"{stage}.json", predictions)
        rows[stage] = {**score(predictions), **score_families(stage)}
        if stage in DIVERSITY_STAGES:
            rows[stage].update(diversity_metrics(demo, stage, references))
    columns = [c for c in (numbered(c, cfg) for c in COLUMNS) if any(c in r for r in rows.values())]
    table = markdown_table({k: {c: v.get(c) for c in columns} for k, v in rows.items()}, columns)
    if family is not None:
        table += "\n\n" + bags_note(rows["human"], cfg.bags.keep_hardest)
    diversity_rows = {k: v for k, v in rows.items() if any(c in v for c in DIVERSITY_COLUMNS)}
    listener = [c for c in (numbered(c, cfg) for c in LISTENER_COLUMNS) if any(c in r for r in rows.values())]
    if listener:
        table += "\n\nRetriever vs fact-based listener (same candidates; exploit = retriever first, listener not):\n\n"
        table += markdown_table({k: {c: v.get(c) for c in listener} for k, v in rows.items()}, listener)
    if diversity_rows:
        table += "\n\n5 captions per test image (random sampling at T = 1, CIDEr-D averaged over the 5; the top 5 of "
        table += "beam search, CIDEr-D of the top beam):\n\n"
        table += markdown_table(diversity_rows, DIVERSITY_COLUMNS)
    plot = smile_length_plot(demo)
    if plot is not None:
        log.info("wrote %s", plot)
    write_json(demo.run_dir / "results.json", rows)
    table = quick_labelled(table, demo.quick)  # wherever its numbers appear: here, results.md, the report's banner
    atomic_write_text(demo.run_dir / "results.md", table + "\n")
    print(table)
    write_demo_report(demo.run_dir)
    return rows


def write_demo_report(run_dir: Path) -> Path:
    """The report stage's ``<run_dir>/report.html`` (:func:`finecap.app.report.main`, after ``results.json``). A file
    of the user's where it writes (a page edited by hand, a figure by a plot's name) is refused naming it and what
    helps here: moving it away, or ``finecap report <run_dir> --force``; never ``--force`` alone, which for
    ``finecap demo`` trains every stage again."""
    return write_report(run_dir, advice=f"move it away and run `finecap report {run_dir}`, or replace it with "
                                        f"`finecap report {run_dir} --force` (the results are written; `finecap demo "
                                        "--force` would train every stage again)")  # fmt: skip


def numbered(column: str, cfg: Config) -> str:
    """A column of :data:`COLUMNS` with its distractor count: ``RD/R@1`` -> ``RD99/R@1``, ``hardRD/R@1`` ->
    ``hardRD99/R@1`` (``eval.n_distractors``)."""
    return column.replace("RD/", f"RD{cfg.eval.n_distractors}/")


def bags_note(row: dict[str, float], keep: float) -> str:
    """What the bag and family columns are scored on: the family world, with each size's bag count and mean
    intra-bag similarity (``row``: any row, they share the bags; ``keep``: ``bags.keep_hardest``)."""
    sizes = sorted(int(k.split("/")[0][3:]) for k in row if k.startswith("bag") and k.endswith("/bags"))
    counts = ", ".join(
        f"{row[f'bag{s}/bags']:.0f} bags of {s} (of {row.get(f'bag{s}/curated', row[f'bag{s}/bags']):.0f} curated; "
        f"mean alpha {row.get(f'bag{s}/alpha', float('nan')):.3f})"
        for s in sizes
    )
    return (f"hardRD, family and bag columns: captions of the scene-family test world ({row['family/n']:.0f} images, "
            f"families of {row['family/size']:.0f}); hardRD = the target's family members + random images of other "
            f"families; bags: NDLB's curated bags, the most similar share {keep:.3g} by intra-bag similarity alpha "
            f"kept (bags.keep_hardest), {counts}.")  # fmt: skip


def stage_transfer_all(demo: StageRunner) -> dict[str, Any]:
    """The ``transfer`` stage: every trained stage on the shifted domain (:mod:`finecap.app.demo_transfer`)."""
    return stage_transfer(demo, list(TRAIN_STAGES))


STAGES: dict[str, Stage] = stage_table([
    Stage("world", run=stage_world),
    Stage("retriever", run=stage_retriever),
    *(training_stage(name) for name in TRAIN_STAGES),
    Stage("report", run=stage_report),
    Stage("transfer", run=stage_transfer_all),
    *demo_vcb.STAGES,
])  # fmt: skip
"""What the demo runs, in the order ``demo.stages`` may name them."""


def job_count(cfg: Config) -> int:
    """``demo.jobs``, or with 0 the machine's cores divided by ``demo.stage_threads`` (at least 1)."""
    return cfg.demo.jobs or max(1, (os.cpu_count() or 1) // cfg.demo.stage_threads)


def main(
    cfg: Config, items: list[str] | None = None, quick: bool | None = None, recipe: str | None = None
) -> dict[str, dict[str, float]]:
    """Run ``cfg.demo.stages``; returns the results table (also written to ``<run_dir>/results.json``). ``cfg`` is
    :func:`load_demo_config` of the user's ``recipe`` and override ``items``; every stage applies the ``items`` above
    its own recipe and the ``recipe`` beneath it (:func:`stage_base`)."""
    if not cfg.demo.stages:
        raise ValueError(f"demo.stages (--stages): no stage given, nothing to run; valid stages: {', '.join(STAGES)}")
    unknown = [s for s in cfg.demo.stages if s not in STAGES]
    if unknown:
        raise ValueError(f"demo.stages: unknown stage(s) {unknown}{did_you_mean(unknown[0], STAGES)}; valid stages: "
                         f"{', '.join(STAGES)}")  # fmt: skip
    quick = cfg.demo.quick if quick is None else quick
    run_dir = demo_dir(cfg, quick)
    log.info("demo: run directory %s", run_dir)
    cfg = dataclasses.replace(cfg, demo=dataclasses.replace(cfg.demo, quick=quick))  # config.yaml says quick
    demo = demo_runner(cfg, list(items or []), quick, run_dir, read_recipe(recipe))
    check_demo_dir(run_dir, recipe=resolve_recipe(recipe) if recipe else None, force=cfg.demo.force)
    run_dir.mkdir(parents=True, exist_ok=True)
    with output_lock(run_dir, log=log.warning, name=DEMO_LOCK, holder="finecap demo"):
        return run_stages(demo)


def demo_dir(cfg: Config, quick: bool) -> Path:
    """The demo's run directory: ``--out`` (``run.dir``), else ``<runs root>/demo``, where the ``demo/*`` training
    recipes write and read their starts (``demo/mle``, ...); a quick demo's ``<runs root>/demo-quick``, so that its
    tiny stages never hold the folders of the full demo and of those recipes (a ``finecap train demo/grpo_cider``
    after a quick demo started from the quick demo's MLE, and ``finecap train demo/mle`` found its folder taken)."""
    if cfg.run.dir:
        return Path(cfg.run.dir)
    return runs_root(cfg.run) / ("demo-quick" if quick else "demo")


def check_demo_dir(run_dir: Path, *, recipe: Path | None, force: bool) -> None:
    """Refuse a run directory that is not the demo's: its ``config.yaml`` (the demo's first file) may not be the
    user's ``recipe``, and when it exists must be one a demo wrote (beside its ``timings.json``); a folder holding
    other files but no demo ``config.yaml`` is a folder of the user's files, except a training stage's folder holding
    a run (``finecap train demo/mle`` writes there). Both are allowed with ``--force`` (``demo.force``), except
    writing over the recipe. A symbolic link among the demo's files and folders (its stage folders, ``captions/``,
    ``plots/``) is refused, with or without ``--force``: the run directory itself may be a link the user made, nothing
    inside it."""
    config = run_dir / CONFIG_FILE
    if run_dir.is_dir():  # everything the demo writes sits in folders of its own: a link among them was planted
        for folder in (run_dir, run_dir / "captions", run_dir / "plots"):
            for entry in sorted(folder.iterdir()) if folder.is_dir() and not folder.is_symlink() else []:
                refuse_link(entry)
        refuse_link(run_dir / "captions")
        refuse_link(run_dir / "plots")
    check_config_target(config, inputs={"recipe": recipe}, force=force, option="--out",
                        ours=lambda p: (p.parent / "timings.json").is_file())  # fmt: skip
    if force or config.exists() or not run_dir.is_dir():
        return
    # `finecap train demo/<stage>` writes the demo's stage folder (<home>/runs/demo/<stage>, docs/runs-and-home.md)
    stage_run = {name for name in TRAIN_STAGES if (run_dir / name / CONFIG_FILE).is_file()}
    found = sorted(p.name for p in run_dir.iterdir() if p.name != DEMO_LOCK and p.name not in stage_run)
    if found:
        raise OutputRefused(
            f"--out: {run_dir} holds files that are not a finecap demo's ({', '.join(found[:5])}"
            f"{', ...' if len(found) > 5 else ''}); choose a new or empty folder, or pass --force to write beside them"
        )


def run_stages(demo: StageRunner) -> dict[str, dict[str, float]]:
    """The stages of :func:`main`, with the run directory's lock held; returns the report stage's rows."""
    cfg, run_dir = demo.cfg, demo.run_dir
    write_output(run_dir / CONFIG_FILE, cfg.to_yaml(), "config")  # remembered as finecap's (finecap.outputs)
    results = demo.run(cfg.demo.stages, jobs=job_count(cfg), threads=cfg.demo.stage_threads,
                       timings_file=run_dir / "timings.json")  # fmt: skip
    return results.get("report") or {}
