"""``finecap demo``: the whole pipeline on the embedded world, ending in one results table.

Stages (``demo.stages``, run in order; each skips work whose outputs exist unless ``demo.force``). Training stages
that no other listed stage starts from (every objective after ``mle`` / ``blip_mle``) run side by side, ``demo.jobs``
at a time (default: the cores divided by ``demo.stage_threads``), each in its own process with
``demo.stage_threads`` torch threads (default 1) whatever the job count, so their results do not depend on it
(``tests/test_demo_stages.py``); every other stage waits for them and runs alone with all threads. The default list
starts the longest side stages first.

- ``world``: generate the synthetic world (``world.*``), or reuse it: in ``world.out``, by default in the finecap home
  (``<home>/worlds/<world key>``, :mod:`finecap.home`), so every demo run on the same settings shares it.
- ``retriever``: train the world encoder / CLIP retriever, or reuse it from the cache (``run.cache_dir``, by default
  ``<home>/cache``). Both go through :func:`finecap.app.prepare.prepare`, which says what it makes and where.
- training stages (:data:`TRAIN_STAGES`): train a captioner with the packaged recipe ``demo/<stage>`` into
  ``<run_dir>/<stage>/`` (starting from the MLE checkpoint where the stage says so), then caption the test split.
  A killed stage resumes from its last checkpoint when re-run, or, killed before it saved one, trains again from the
  start (:func:`finecap.train.state.continue_unfinished`). A finished stage is reused only when the inputs its
  run recorded (``<stage>/fingerprints.json``: the data, the captioner's encoder, the retriever) are those of its
  configuration now; after a change of ``world.*`` or of the world encoder it is refused with an error naming both
  fingerprints (:func:`check_stage_inputs`), and ``--force`` (``demo.force``) trains it again.
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
(:func:`exit_with_parent`).

``--quick`` swaps in tiny settings (:data:`QUICK`) that finish in about two minutes; any ``section.key=value``
override still applies on top (``finecap demo world.seed=7 world.n_train=5000``).
"""

from __future__ import annotations

import dataclasses
import logging
import logging.handlers
import multiprocessing
import multiprocessing.connection
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from finecap.app import demo_vcb
from finecap.app.bags import main as build_bags
from finecap.app.demo_transfer import stage_transfer
from finecap.app.prepare import prepare
from finecap.app.report import main as write_report
from finecap.app.train import train
from finecap.caption import generate_captions
from finecap.config import Config, did_you_mean, load
from finecap.data.datasets import load_records
from finecap.data.formats import read_bags, read_results, write_results
from finecap.home import runs_root, world_path
from finecap.locks import output_lock
from finecap.metrics.suite import evaluate
from finecap.models.backbones import load_captioner
from finecap.models.retriever import load_retriever
from finecap.outputs import OutputRefused, write_output
from finecap.recipes import resolve_recipe
from finecap.report.plots import length_curves
from finecap.report.table import markdown_table, quick_labelled
from finecap.runs import CONFIG_FILE, model_dir
from finecap.train.fingerprint import FingerprintMismatch, check_run
from finecap.train.state import check_config_target, continue_unfinished
from finecap.utils import atomic_write_text, read_json, refuse_link, seed_everything, write_json
from finecap.world.make import load_scenes

log = logging.getLogger(__name__)

# Settings of the default demo that differ from the library defaults (beneath recipes and user overrides).
# Test captions use beam search (beam 5), as ClipCap, DiscriTune and NDLB evaluate. The world and the world encoder
# live in the finecap home, keyed by their settings (world.out and run.cache_dir empty), as every run's do.
DEFAULT: dict[str, dict[str, Any]] = {
    "decode": {"strategy": "beam", "beam_size": 5},
}
# --quick: a tiny world and a few steps per stage (tests use it); not meant to meet the quality bars.
QUICK: dict[str, dict[str, Any]] = {
    "world": {"n_train": 300, "n_val": 40, "n_test": 100},
    "retriever": {"epochs": 2, "batch_size": 64},
    "train": {
        "max_steps": 12,
        "eval_every": 12,
        "eval_samples": 40,
        "warmup_steps": 2,
        "log_every": 4,
        "batch_size": 32,
    },
    "eval": {"n_distractors": 19, "draws": 2},
}
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
SAMPLES = 5
# Metric groups of the demo table (finecap.metrics.suite names).
REPORT_METRICS = ["length", "vocab", "faithfulness", "retrieval", "bags", "bleu", "cider", "clipscore", "listener"]
# Columns of the printed table, in order (keys of evaluate's output; "RD" becomes RD{eval.n_distractors}).
COLUMNS = ["Length", "Lexical diversity", "Vocab usage", "faith/precision", "faith/recall", "faith/halluc_rate",
           "RD/R@1", "RD/R@5", "bag3/R@1", "bag5/R@1", "bag7/R@1", "CLIPScore", "BLEU-4", "CIDEr-D",
           "listener/RD/exploit"]  # fmt: skip
# Retriever vs fact-based listener on the same candidates (listener R@1 with ties broken at random; tie rate).
LISTENER_COLUMNS = ["RD/R@1", "listener/RD/R@1", "listener/RD/tie_rate", "listener/RD/exploit",
                    *[f"{who}bag{n}/R@1" for n in (3, 5, 7) for who in ("", "listener/")],
                    "listener/bag3/tie_rate", "listener/bag3/exploit"]  # fmt: skip
DIVERSITY_COLUMNS = [f"{mode}/{m}" for mode in ("sample", "beam") for m in ("CIDEr-D", "Div-1", "Div-2", "mBLEU-4")]


@dataclass
class Demo:
    """Resolved demo configuration and paths shared by the stages."""

    cfg: Config
    items: list[str]
    quick: bool
    run_dir: Path
    timings: dict[str, float] = field(default_factory=dict)
    recipe: dict[str, dict[str, Any]] = field(default_factory=dict)  # the user's recipe's sections (stage_base)

    def stage_dir(self, stage: str) -> Path:
        return self.run_dir / stage

    def stage_config(self, stage: str) -> Config:
        """The stage's recipe over the demo base settings and the user's recipe (:func:`stage_base`); above it the
        quick settings, the stage's variant and the user's overrides; its own run directory."""
        name, variant = ABLATIONS.get(stage, (stage, []))
        recipe = resolve_recipe(f"demo/{name}")  # packaged with finecap (finecap.recipes)
        variant = [*variant, *demo_vcb.overrides(self, stage)]
        base = stage_base(self.recipe)
        cfg = load(recipe, [*variant, *self.items], base=base, over=QUICK if self.quick else None)
        init = TRAIN_STAGES[stage]
        run = dataclasses.replace(cfg.run, dir=str(self.stage_dir(stage)))
        train = cfg.train
        if init is not None:
            train = dataclasses.replace(train, init_from=str(self.stage_dir(init) / "checkpoints" / "best"))
        return dataclasses.replace(cfg, run=run, train=train)


def load_demo_config(recipe: str | None, items: list[str], quick: bool) -> Config:
    """The demo's configuration: demo defaults, an optional recipe, the quick settings, then the overrides."""
    return load(recipe, items, base=DEFAULT, over=QUICK if quick else None)


def read_recipe(recipe: str | None) -> dict[str, dict[str, Any]]:
    """The sections of the user's recipe (``finecap demo RECIPE``), read once (:func:`main`); ``{}`` without one.
    :func:`load_demo_config` has validated it, with errors naming it."""
    if recipe is None:
        return {}
    from finecap.utils import read_yaml_mapping

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


def stage_world(demo: Demo) -> None:
    log.info("world: %s", prepare(demo.cfg, {"world"}, make=True).world)


def stage_retriever(demo: Demo) -> None:
    log.info("retriever: %s", prepare(demo.cfg, {"world", "world_encoder"}, make=True).world_encoder)


def train_stage(stage: str) -> Callable[[Demo], None]:
    def run(demo: Demo) -> None:
        out = demo.stage_dir(stage)
        done = out / "DONE"
        refuse_link(done)  # a planted link: never taken for a finished stage, never written through
        cfg = demo.stage_config(stage)
        if done.exists() and not demo.cfg.demo.force:
            check_stage_inputs(stage, out, cfg)
            log.info("%s: already trained (%s); skipping", stage, out)
        else:
            init = TRAIN_STAGES[stage]
            if init is not None and not (demo.stage_dir(init) / "DONE").exists():
                raise FileNotFoundError(f"demo stage {stage!r} starts from stage {init!r}, which has not run yet")
            if demo.cfg.demo.force:
                resume, overwrite = False, True
            else:  # a killed stage resumes, or starts again when it saved no checkpoint
                resume, overwrite = continue_unfinished(out, what=f"demo stage {stage!r}",
                                                        ways_out=demo_ways_out(stage))  # fmt: skip
            train(cfg, resume=resume, overwrite=overwrite)
            atomic_write_text(done, "ok\n")
        caption_stage(demo, stage)

    return run


DEMO_LOCK = ".demo.lock"
"""Held in the run directory while a demo runs there (:func:`finecap.locks.output_lock`): a second demo on the same
directory stops with an error naming the first."""


def demo_ways_out(stage: str) -> str:
    """What a demo user can do about a stage it will not reuse or continue (``--force`` retrains every listed
    stage, hence ``--stages``)."""
    return (f"re-run it alone with --stages {stage} --force (demo.force=true), or give the demo another run "
            "directory (--out)")  # fmt: skip


def check_stage_inputs(stage: str, out: Path, cfg: Config, *, kind: str = "demo stage",
                       ways_out: str | None = None) -> None:  # fmt: skip
    """Refuse to reuse the finished ``kind`` run ``out`` (named ``stage``) when the inputs it recorded
    (``fingerprints.json``: data, captioner's encoder, retriever) differ from those of its configuration ``cfg`` now,
    e.g. after a change of ``world.*`` or of the world encoder (:func:`finecap.train.fingerprint.check_run`); the error
    names both fingerprints and the ``ways_out`` of the command that reuses it."""
    try:
        check_run(out, cfg)
    except FingerprintMismatch as e:
        raise FingerprintMismatch(
            f"{kind} {stage!r} was trained on other inputs than its configuration names now, so it is not reused: "
            f"{e} | {ways_out or demo_ways_out(stage)}"
        ) from e


def best_model(demo: Demo, stage: str) -> Any:
    """The stage's best checkpoint as a captioner in eval mode."""
    return load_captioner(model_dir(demo.stage_dir(stage) / "checkpoints" / "best")).eval()


def caption_stage(demo: Demo, stage: str) -> Path:
    """Test-split captions of the stage's best checkpoint, decoded with its ``decode.*`` (beam 5 in the demo)."""
    out = demo.stage_dir(stage) / "captions_test.json"
    if out.exists() and not demo.cfg.demo.force:
        return out
    cfg = demo.stage_config(stage)
    model = best_model(demo, stage)
    captions = generate_captions(model, cfg, "test")
    write_results(out, {i: c[0] for i, c in captions.items()})
    return out


def test_bags(demo: Demo) -> dict[int, list[list[Any]]]:
    """TrueMatch-style bags (NDLB Algorithms 1-2) of sizes ``eval.bag_sizes`` on the test split, built once."""
    path = demo.run_dir / "bags_test.json"
    if not path.exists() or demo.cfg.demo.force:
        build_bags(demo.cfg, split="test", sizes=demo.cfg.eval.bag_sizes, out=path, force=demo.cfg.demo.force)
    return read_bags(path)


def stage_samples(demo: Demo, stage: str, mode: str) -> dict[Any, list[str]]:
    """``SAMPLES`` captions per test image of the stage's best checkpoint: ``sample`` (T = 1) or ``beam`` (top 5)."""
    path = demo.stage_dir(stage) / f"samples_test_{mode}.json"
    if path.exists() and not demo.cfg.demo.force:
        return {int(k) if k.isdigit() else k: v for k, v in read_json(path).items()}
    cfg = demo.stage_config(stage)
    settings = {"sample": {"strategy": "sample", "temperature": 1.0}, "beam": {"strategy": "beam"}}[mode]
    decode = dataclasses.replace(cfg.decode, beam_size=SAMPLES, num_return_sequences=SAMPLES, **settings)
    model = best_model(demo, stage)
    seed_everything(cfg.run.seed)  # sampled captions depend on the seed only, not on what this process ran before
    samples = generate_captions(model, cfg, "test", decode=decode)
    write_json(path, {str(k): v for k, v in samples.items()})
    return samples


def diversity_metrics(demo: Demo, stage: str, references: dict[Any, list[str]]) -> dict[str, float]:
    """Div-1, Div-2, mBLEU-4 over 5 captions per image (exploration paper Sec. 3.2) and CIDEr-D: the mean over the 5
    samples for ``sample``, the top beam's for ``beam`` (the paper's beam-search numbers are top-beam scores)."""
    out: dict[str, float] = {}
    for mode in ("sample", "beam"):
        samples = stage_samples(demo, stage, mode)
        first = {i: c[0] for i, c in samples.items()}
        out.update({f"{mode}/{k}": v for k, v in evaluate(first, references, metrics=["diversity"], samples=samples,
                                                           cfg=demo.cfg).items()})  # fmt: skip
        ranks = range(1 if mode == "beam" else SAMPLES)  # beam: captions come best first, c[0] is the top beam
        ciders = [evaluate({i: c[j] for i, c in samples.items()}, references, metrics=["cider"])["CIDEr-D"]
                  for j in ranks]  # fmt: skip
        out[f"{mode}/CIDEr-D"] = sum(ciders) / len(ciders)
    return out


def smile_length_plot(demo: Demo) -> Path | None:
    """Mean validation caption length over training steps for each SMILE subset mode (SMILE Fig. 4a), when at least
    one ablation run is present next to ``smile``."""
    runs = {label: demo.stage_dir(stage) for label, stage in
            (("sequence (SMILE)", "smile"), ("random", "smile_random"), ("reverse", "smile_reverse"))}  # fmt: skip
    runs = {label: path for label, path in runs.items() if (path / "metrics.jsonl").exists()}
    if len(runs) < 2:
        return None
    return length_curves(runs, demo.run_dir / "smile_length.png", start=demo.stage_dir("mle"))


def stage_report(demo: Demo) -> dict[str, dict[str, float]]:
    cfg = demo.cfg
    records = load_records(cfg, "test")
    scenes_by_imgid = load_scenes(world_path(cfg.world))
    scenes = {r.image_id: scenes_by_imgid[int(r.image_id)] for r in records}
    retriever = load_retriever(cfg)
    bags = test_bags(demo)
    # The human row: the first reference caption of each image, scored against the other four (n-gram metrics)
    # and against the image (faithfulness, retrieval) exactly like a model's caption. Model rows are scored against
    # the same four references, so every row is comparable.
    human = {r.image_id: r.captions[0] for r in records}
    references = {r.image_id: r.captions[1:] for r in records}

    def score(predictions: dict[Any, str]) -> dict[str, float]:
        return evaluate(predictions, references, metrics=REPORT_METRICS, retriever=retriever, images=records,
                        scenes=scenes, bags=bags, cfg=cfg)  # fmt: skip

    write_results(demo.run_dir / "captions" / "human.json", human)
    rows: dict[str, dict[str, Any]] = {"human": score(human)}
    for stage in TRAIN_STAGES:
        path = demo.stage_dir(stage) / "captions_test.json"
        if not path.exists():
            continue
        predictions = {i: caps[0] for i, caps in read_results(path).items()}
        write_results(demo.run_dir / "captions" / f"{stage}.json", predictions)
        rows[stage] = score(predictions)
        if stage in DIVERSITY_STAGES:
            rows[stage].update(diversity_metrics(demo, stage, references))
    rd = f"RD{cfg.eval.n_distractors}/"
    columns = [c for c in (c.replace("RD/", rd) for c in COLUMNS) if any(c in r for r in rows.values())]
    table = markdown_table({k: {c: v.get(c) for c in columns} for k, v in rows.items()}, columns)
    diversity_rows = {k: v for k, v in rows.items() if any(c in v for c in DIVERSITY_COLUMNS)}
    listener = [c for c in (c.replace("RD/", rd) for c in LISTENER_COLUMNS) if any(c in r for r in rows.values())]
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
    write_report(demo.run_dir)
    return rows


STAGES: dict[str, Callable[[Demo], Any]] = {
    "world": stage_world,
    "retriever": stage_retriever,
    **{name: train_stage(name) for name in TRAIN_STAGES},
    "report": stage_report,
    "transfer": lambda demo: stage_transfer(demo, list(TRAIN_STAGES), best_model),
}
demo_vcb.register(STAGES, train_stage)


def side_stages(stages: list[str]) -> set[str]:
    """The training stages of ``stages`` that no other listed stage starts from: they can run side by side."""
    starts = {TRAIN_STAGES[s] for s in stages if s in TRAIN_STAGES}
    return {s for s in stages if s in TRAIN_STAGES and s not in starts}


def job_count(cfg: Config) -> int:
    """``demo.jobs``, or with 0 the machine's cores divided by ``demo.stage_threads`` (at least 1)."""
    return cfg.demo.jobs or max(1, (os.cpu_count() or 1) // cfg.demo.stage_threads)


def run_side_stage(demo: Demo, stage: str) -> float:
    """Run one side stage with ``demo.stage_threads`` torch threads (in a worker process, or in this one with
    ``demo.jobs=1``); returns its wall seconds. The thread count is the stage's whatever the job count, so its
    results are too (CPU kernels sum in a thread-count-dependent order)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(demo.cfg.demo.stage_threads)
    start = time.perf_counter()
    try:
        STAGES[stage](demo)
    finally:
        torch.set_num_threads(before)
    return round(time.perf_counter() - start, 1)


def exit_with_parent() -> None:
    """Block until this worker's parent process (the demo) ends, then end this process at once, so that no orphaned
    stage goes on training into the run directory, competing for the cores and colliding with the next run. It
    waits on the parent's sentinel (:func:`multiprocessing.parent_process`), which the operating system signals
    however the parent ends (a ``kill``, a scheduler's time limit, a crash), on every platform and also when the
    parent ended before this thread started. A stage stopped this way resumes on the next run, like any killed
    stage."""
    parent = multiprocessing.parent_process()
    if parent is None:  # not a multiprocessing child: nothing to watch
        return
    multiprocessing.connection.wait([parent.sentinel])
    sys.stderr.write(f"finecap demo: stage worker {os.getpid()} stops: the demo process {parent.pid} ended\n")
    os._exit(1)


def _worker_setup(queue: Any, level: int) -> None:
    """A worker process sends finecap's log records to the parent (``queue``), which hands them to its own loggers
    (:class:`_Redispatch`), shows no progress bars (several stages share the terminal), and ends when the parent
    does (:func:`exit_with_parent`)."""
    threading.Thread(target=exit_with_parent, name="finecap-parent-watch", daemon=True).start()
    os.environ.setdefault("TQDM_DISABLE", "1")
    logger = logging.getLogger("finecap")
    logger.handlers[:] = [logging.handlers.QueueHandler(queue)]
    logger.setLevel(level)
    logger.propagate = False


class _Redispatch(logging.Handler):
    """In the parent: a worker's log record goes through the parent's logger of the same name (its handlers, its
    level), as if the parent had logged it."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger(record.name).handle(record)


def main(
    cfg: Config, items: list[str] | None = None, quick: bool | None = None, recipe: str | None = None
) -> dict[str, dict[str, float]]:
    """Run ``cfg.demo.stages``; returns the results table (also written to ``<run_dir>/results.json``). ``cfg`` is
    :func:`load_demo_config` of the user's ``recipe`` and override ``items``; every stage applies the ``items`` above
    its own recipe and the ``recipe`` beneath it (:func:`stage_base`)."""
    unknown = [s for s in cfg.demo.stages if s not in STAGES]
    if unknown:
        raise ValueError(f"demo.stages: unknown stage(s) {unknown}{did_you_mean(unknown[0], STAGES)}; valid stages: "
                         f"{', '.join(STAGES)}")  # fmt: skip
    quick = cfg.demo.quick if quick is None else quick
    run_dir = Path(cfg.run.dir) if cfg.run.dir else runs_root(cfg.run) / "demo"
    log.info("demo: run directory %s", run_dir)
    cfg = dataclasses.replace(cfg, demo=dataclasses.replace(cfg.demo, quick=quick))  # config.yaml says quick
    demo = Demo(cfg=cfg, items=list(items or []), quick=quick, run_dir=run_dir, recipe=read_recipe(recipe))
    check_demo_dir(run_dir, recipe=resolve_recipe(recipe) if recipe else None, force=cfg.demo.force)
    run_dir.mkdir(parents=True, exist_ok=True)
    with output_lock(run_dir, log=log.warning, name=DEMO_LOCK, holder="finecap demo"):
        return run_stages(demo)


def check_demo_dir(run_dir: Path, *, recipe: Path | None, force: bool) -> None:
    """Refuse a run directory that is not the demo's: its ``config.yaml`` (the demo's first file) may not be the
    user's ``recipe``, and when it exists must be one a demo wrote (beside its ``timings.json``); a folder holding
    other files but no demo ``config.yaml`` is a folder of the user's files. Both are allowed with ``--force``
    (``demo.force``), except writing over the recipe. A symbolic link among the demo's files and folders (its stage
    folders, ``captions/``, ``plots/``) is refused, with or without ``--force``: the run directory itself may be a
    link the user made, nothing inside it."""
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
    found = sorted(p.name for p in run_dir.iterdir() if p.name != DEMO_LOCK)
    if found:
        raise OutputRefused(
            f"--out: {run_dir} holds files that are not a finecap demo's ({', '.join(found[:5])}"
            f"{', ...' if len(found) > 5 else ''}); choose a new or empty folder, or pass --force to write beside them"
        )


def run_stages(demo: Demo) -> dict[str, dict[str, float]]:
    """The stages of :func:`main`, with the run directory's lock held."""
    cfg, run_dir = demo.cfg, demo.run_dir
    write_output(run_dir / CONFIG_FILE, cfg.to_yaml(), "config")  # remembered as finecap's (finecap.outputs)
    timings_file = run_dir / "timings.json"
    timings = read_json(timings_file) if timings_file.exists() else {}
    rows: dict[str, dict[str, float]] = {}
    side, jobs = side_stages(cfg.demo.stages), job_count(cfg)
    pool, listener = None, None
    if jobs > 1 and len(side) > 1:  # one side stage alone runs here, with the same threads: the same results
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        listener = logging.handlers.QueueListener(queue, _Redispatch())
        listener.start()
        pool = ProcessPoolExecutor(jobs, mp_context=context, initializer=_worker_setup,
                                   initargs=(queue, logging.getLogger("finecap").getEffectiveLevel()))  # fmt: skip
    running: dict[Future, str] = {}

    def finish(futures: set[Future]) -> None:
        for future in futures:
            stage = running.pop(future)
            timings[stage] = future.result()  # a failed stage raises here, naming itself in its error
            write_json(timings_file, timings)
            log.info("== demo stage %s done (%.0f s, %d still running)", stage, timings[stage], len(running))

    started = time.perf_counter()
    try:
        for stage in cfg.demo.stages:
            if stage in side:
                if pool is None:
                    log.info("== demo stage: %s (%d threads)", stage, cfg.demo.stage_threads)
                    timings[stage] = run_side_stage(demo, stage)
                    write_json(timings_file, timings)
                    continue
                if len(running) >= jobs:
                    finish(wait(running, return_when=FIRST_COMPLETED).done)
                log.info("== demo stage: %s (beside %d others, %d threads each)", stage, len(running),
                         cfg.demo.stage_threads)  # fmt: skip
                running[pool.submit(run_side_stage, demo, stage)] = stage
                continue
            finish(wait(running).done if running else set())  # the next stage may read theirs (report) or need cores
            log.info("== demo stage: %s", stage)
            start = time.perf_counter()
            result = STAGES[stage](demo)
            timings[stage] = round(time.perf_counter() - start, 1)
            write_json(timings_file, timings)
            if stage == "report":
                rows = result
        finish(wait(running).done if running else set())
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        if listener is not None:
            listener.stop()
    log.info("stage wall times (s): %s; all stages: %.0f s", ", ".join(f"{k} {v}" for k, v in timings.items()),
             time.perf_counter() - started)  # fmt: skip
    return rows
