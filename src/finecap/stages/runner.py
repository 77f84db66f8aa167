"""The one stage runner: a table of stages (data, :class:`Stage`) run in order in one run directory, shared by
``finecap demo`` (:mod:`finecap.app.demo`) and the papers' grids (``benchmarks/paper_tables/``).

A stage is a training run or a task. A **training stage** trains a captioner with a recipe into
``<run_dir>/<stage>/``; its configuration is layered (:meth:`StageRunner.stage_config`): the runner's ``base``
settings, the stage's recipe, the runner's ``over`` settings (the demo's ``--quick``), the stage's own overrides and
those computed for it when configured (``computed``: e.g. the path of a data set made by an earlier stage), then the
user's overrides (``items``), above all; its run directory, and its starting checkpoint (the best of stage
``init``). It is trained once: its ``DONE`` marker says it finished. A finished stage is reused only when nothing
that makes its result changed (:meth:`StageRunner.check_reuse`): the inputs its run recorded (``fingerprints.json``)
are those of its configuration now, its configuration is the one it saved (``config.yaml``; but for
:data:`NOT_RESULT`), and the best checkpoint of the stage it starts from is the one it started from
(:data:`START_FILE`); an unfinished one resumes from its last checkpoint, or starts again when it saved none
(:func:`finecap.train.state.continue_unfinished`), and is continued only when the same holds of it
(:meth:`StageRunner.check_continue`: the checkpoint's saved configuration, and the start recorded when it started), so
that a stage finishes as it was trained throughout; ``force`` trains it again. A stage whose inputs (``init`` and
``inputs``) have not finished is refused, naming them (:class:`MissingInput`). A **task** is a function of the runner.

The stage table is passed in, never read from module globals, and so is the training function (the application's
recipe, ``finecap.train.run.train``): this library module imports nothing of the application layer.

:meth:`StageRunner.run` runs a list of stages. Training stages that no other listed stage starts from (side stages,
:meth:`StageRunner.side_stages`) run side by side in worker processes (:mod:`finecap.stages.pool`), ``jobs`` at a
time, each with ``threads`` torch threads whatever the job count, so their results do not depend on it; every other
stage waits for them and runs alone with all threads.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from finecap.config import Config, load, load_stored
from finecap.data.hashing import sha256_files
from finecap.locks import TRAIN_LOCK, output_lock
from finecap.recipes import resolve_recipe
from finecap.runs import BEST, CONFIG_FILE, checkpoint_dir
from finecap.train.fingerprint import HINTS, FingerprintMismatch, check_run, checkpoint_files
from finecap.train.preflight import check_settings
from finecap.train.state import (
    check_run_folder,
    config_changes,
    continue_unfinished,
    find_resumable,
    holds_run,
    prepare_run_dir,
    run_reads,
    trained_config,
)
from finecap.utils.files import atomic_write_text, refuse_link, write_json
from finecap.utils.reading import read_json

log = logging.getLogger(__name__)

STAGE_HINTS = {**HINTS, "data": "a stage reads the data its configuration names (on the world: that of its world.*)"}
"""What to do about each input a stage's run differs in (:func:`finecap.train.fingerprint.check_fingerprints`): as
training says, but a stage takes no --data; the runner adds its own ways out (re-run with force, another folder)."""

TRAIN = "train"
TASK = "task"
KINDS = (TRAIN, TASK)
DONE = "DONE"
"""The marker a training stage writes into its folder when it has finished training."""
MARKER_TEXT = "ok\n"
"""What a stage's :data:`DONE` marker holds: a file of that name holding anything else is not finecap's."""
START_FILE = "start.json"
"""Written by a training stage that starts from another when it starts training (a resume keeps it):
``{"stage", "sha256"}``, the digest of the weights and ``config.json`` files of the best checkpoint it started from
(:meth:`StageRunner.start_record`), which reusing the finished stage and continuing a killed one compare with. It
describes the checkpoints in the stage's folder: it is written only once no other run's are left there (a stage
trained again from the start has its old run removed first, :meth:`StageRunner.train_stage`)."""
NOT_RESULT = ("run.root", "run.dir", "run.name", "run.cache_dir", "world.out", "data.path", "retriever.checkpoint",
              "model.encoder", "train.init_from", "train.log_every", "train.log_with", "train.log_captions",
              "train.save_every", "demo.*")  # fmt: skip
"""Options (``demo.*``: the section) whose change alone a finished stage is reused across: where the run and its
caches are; the paths of inputs the stage's fingerprints compare by content instead (the data, the encoders; a run
folder or a data set copied elsewhere is the same run) or :data:`START_FILE` does (``train.init_from``); what a run
logs and how often it saves a resumable checkpoint (the weights it trains and the best it keeps are the same); the
demo's own settings (which stages run, how many at a time, ``--force``). ``data.images`` is not one: no fingerprint
reads the images of a data-set file."""


def makes_result(change: str) -> bool:
    """Whether ``change`` (``section.key: old -> new``, :func:`finecap.train.state.config_changes`) is of an option
    that may change a stage's result: not one of :data:`NOT_RESULT`."""
    key = change.split(":", 1)[0]
    return key not in NOT_RESULT and f"{key.split('.', 1)[0]}.*" not in NOT_RESULT


def is_start_record(path: Path) -> bool:
    """Whether ``path`` is a :data:`START_FILE` as finecap writes it (a regular file holding ``{"stage", "sha256"}``),
    which a stage trained again may replace."""
    try:
        raw = read_json(path)
    except (ValueError, OSError, RecursionError):
        return False
    return not path.is_symlink() and isinstance(raw, dict) and set(raw) == {"stage", "sha256"}


def is_marker(path: Path) -> bool:
    """Whether ``path`` is a stage's :data:`DONE` marker as finecap writes it: a regular file (not a link) holding
    :data:`MARKER_TEXT`, read only when it is that short."""
    try:
        return (not path.is_symlink() and path.is_file() and path.stat().st_size == len(MARKER_TEXT)
                and path.read_text(encoding="utf-8") == MARKER_TEXT)  # fmt: skip
    except (OSError, UnicodeDecodeError):
        return False


class TrainFn(Protocol):
    """The training function a runner is given: trains ``cfg`` into ``cfg.run.dir`` (``finecap.train.run.train``)."""

    def __call__(self, cfg: Config, *, resume: bool, overwrite: bool) -> Any: ...


class MissingInput(FileNotFoundError):
    """A stage's input (the stage it starts from, or another it reads) has not finished."""


@dataclass(frozen=True)
class Stage:
    """One row of a stage table.

    A training stage (``kind="train"``) names its ``recipe`` (a packaged recipe such as ``demo/mle``, or a YAML
    path), the ``overrides`` that make it from the recipe, and ``init``, the stage whose best checkpoint it starts
    from (None: a fresh model); ``then`` runs after training, or after a finished stage is reused (the demo captions
    the test split there). A task (``kind="task"``) is ``run(runner)``; its result is returned by
    :meth:`StageRunner.run`. ``inputs``: further stages whose ``DONE`` marker it needs before it runs.

    Functions in a table are module-level ones (no lambdas, no closures): a side stage's runner is pickled into its
    worker process."""

    name: str
    kind: str = TASK
    recipe: str = ""
    overrides: tuple[str, ...] = ()
    init: str | None = None
    inputs: tuple[str, ...] = ()
    run: Callable[[StageRunner], Any] | None = None
    then: Callable[[StageRunner, str], Any] | None = None
    stored: bool = False
    """``recipe`` is a configuration finecap stored (a finished stage's ``config.yaml``: :func:`finished_stages`),
    read as such (:func:`finecap.config.load_stored`: written before a key moved, migrated; options its run never
    read, dropped) with the overrides on top, the runner's ``base`` and ``over`` left out: it holds every option."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"stage {self.name!r}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.kind == TRAIN and not self.recipe:
            raise ValueError(f"stage {self.name!r}: a training stage names its recipe")
        if self.kind == TASK and (self.run is None or self.recipe or self.init or self.overrides or self.then):
            raise ValueError(f"stage {self.name!r}: a task is its run function alone (recipe, init, overrides and "
                             "then belong to training stages)")  # fmt: skip

    @property
    def needs(self) -> tuple[str, ...]:
        """The stages that must have finished before this one runs: ``init``, then ``inputs``."""
        return (self.init, *self.inputs) if self.init is not None else self.inputs


def stage_table(stages: Iterable[Stage]) -> dict[str, Stage]:
    """``{name: stage}``, refusing a name given twice and an ``init`` / ``inputs`` that names no stage of the table
    or a task as a starting checkpoint."""
    table: dict[str, Stage] = {}
    for stage in stages:
        if stage.name in table:
            raise ValueError(f"stage table: {stage.name!r} is given twice")
        table[stage.name] = stage
    for stage in table.values():
        unknown = [n for n in stage.needs if n not in table]
        if unknown:
            raise ValueError(f"stage {stage.name!r} needs {', '.join(map(repr, unknown))}, not in the stage table")
        if stage.init is not None and table[stage.init].kind != TRAIN:
            raise ValueError(f"stage {stage.name!r} starts from {stage.init!r}, which trains no captioner")
    return table


@dataclass
class StageRunner:
    """A stage table at work in one run directory (module docstring)."""

    stages: Mapping[str, Stage]
    cfg: Config
    run_dir: Path
    train: TrainFn
    items: list[str] = field(default_factory=list)
    """``section.key=value`` overrides above every stage's recipe."""
    quick: bool = False
    base: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Settings beneath every stage's recipe."""
    over: dict[str, dict[str, Any]] | None = None
    """Settings above every stage's recipe, beneath the overrides (the demo's quick settings)."""
    force: bool = False
    """Train finished stages again (and let tasks make their outputs again, which read it through the runner)."""
    computed: Callable[[StageRunner, str], list[str]] | None = None
    """Overrides of a stage computed when it is configured (between its own overrides and ``items``)."""
    what: str = "stage"
    """What a stage is called in messages (``demo stage``, ``paper-tables run``)."""
    ways_out: str = "re-run it with force, or use another run directory"
    """What a user can do about a stage that is not reused or continued; ``{stage}`` and ``{out}`` are filled in."""

    def stage_dir(self, stage: str) -> Path:
        return self.run_dir / stage

    def best_checkpoint(self, stage: str) -> Path:
        """The best checkpoint of training stage ``stage`` (where later stages start from)."""
        return checkpoint_dir(self.stage_dir(stage), BEST)

    def is_done(self, stage: str) -> bool:
        """Whether training stage ``stage`` finished (its ``DONE`` marker; a link planted there is refused)."""
        marker = self.stage_dir(stage) / DONE
        refuse_link(marker)  # never taken for a finished stage, never written through
        return marker.exists()

    def made_since_training(self, stage: str, path: Path) -> bool:
        """Whether ``path``, a file made from training stage ``stage``'s model (its captions, samples, a boosted data
        set), may be read back (unless forced): it exists and is no older than the stage's ``DONE`` marker (a stage
        trained again since, e.g. alone with ``--force``, makes it again rather than pass the old model's off as the
        new one's)."""
        if not path.exists():
            return False
        marker = self.stage_dir(stage) / DONE
        return not marker.exists() or path.stat().st_mtime_ns >= marker.stat().st_mtime_ns

    def training_stages(self) -> list[str]:
        return [name for name, stage in self.stages.items() if stage.kind == TRAIN]

    def stage_config(self, stage: str) -> Config:
        """The configuration of training stage ``stage`` (module docstring: the layers), with its run directory and
        its starting checkpoint."""
        row = self.stages[stage]
        computed = self.computed(self, stage) if self.computed is not None else []
        overrides = [*row.overrides, *computed, *self.items]
        if row.stored:
            cfg = load_stored(row.recipe, overrides)
        else:
            cfg = load(resolve_recipe(row.recipe), overrides, base=self.base, over=self.over)
        run = dataclasses.replace(cfg.run, dir=str(self.stage_dir(stage)))
        train = cfg.train
        if row.init is not None:
            train = dataclasses.replace(train, init_from=str(self.best_checkpoint(row.init)))
        return dataclasses.replace(cfg, run=run, train=train)

    def ways_out_of(self, stage: str) -> str:
        return self.ways_out.format(stage=stage, out=self.stage_dir(stage))

    def check_inputs(self, stage: str) -> None:
        """:class:`MissingInput` naming the first input of ``stage`` that has not finished."""
        row = self.stages[stage]
        for need in row.needs:
            if not self.is_done(need):
                how = "starts from" if need == row.init else "needs"
                raise MissingInput(f"{self.what} {stage!r} {how} stage {need!r}, which has not run yet")

    def start_record(self, stage: str) -> dict[str, str] | None:
        """What training stage ``stage`` starts from (:data:`START_FILE`): its ``init`` stage and the digest of that
        stage's best checkpoint (weights and ``config.json`` files, paths relative to it: a run folder copied
        elsewhere keeps it); None for a stage starting from a fresh model, or whose start has no best checkpoint."""
        init = self.stages[stage].init
        best = self.best_checkpoint(init) if init is not None else None
        if best is None or not best.is_dir():
            return None
        return {"stage": str(init), "sha256": sha256_files(best, checkpoint_files(best))}

    def check_reuse(self, stage: str, cfg: Config) -> None:
        """Refuse to reuse finished stage ``stage`` (:class:`FingerprintMismatch` naming what differs and
        :attr:`ways_out`) when something that makes its result changed since it trained:

        - the inputs its run recorded (``fingerprints.json``: data, captioner's encoder, retriever) differ from those
          of its configuration ``cfg`` now, e.g. after a change of ``world.*`` or of the world encoder
          (:func:`finecap.train.fingerprint.check_run`);
        - an option of ``cfg`` differs from the ``config.yaml`` its run saved (a recipe edited, an override given or
          dropped; :data:`NOT_RESULT` aside), read as training compares a resume
          (:func:`finecap.train.state.config_changes`);
        - the best checkpoint of the stage it starts from is not the one it started from (:data:`START_FILE`: that
          stage was trained again since). A stage that recorded none (finished before finecap recorded it), or whose
          start has no best checkpoint now, is not compared."""
        # check_run reads the captioner.json of the best of the stage this one starts from (cfg.train.init_from)
        # outside that run's swap guard, and needs none: no save swaps it meanwhile, as this runner trains that stage
        # before this one, never beside it (side_stages: no stage another listed stage starts from is one), and a demo
        # holds its folder against a second demo (.demo.lock)
        try:
            check_run(self.stage_dir(stage), cfg, hints=STAGE_HINTS)
        except FingerprintMismatch as e:
            raise FingerprintMismatch(
                f"{self.what} {stage!r} was trained on other inputs than its configuration names now, so it is not "
                f"reused: {e} | {self.ways_out_of(stage)}"
            ) from e
        subject = f"{self.what} {stage!r}"
        self._check_configuration(stage, self.stage_dir(stage) / CONFIG_FILE, cfg, subject, "reused")
        self._check_start(stage, self.start_record(stage), subject, "reused")

    def check_continue(self, stage: str, cfg: Config, start: dict[str, str] | None) -> None:
        """Refuse to continue the unfinished run in training stage ``stage``'s folder (killed, or written by
        ``finecap train``) when what :meth:`check_reuse` compares for a finished stage differs, so that the stage it
        finishes as was trained on its inputs, configuration and start throughout (:class:`FingerprintMismatch`
        naming what differs and :attr:`ways_out`): the inputs its run recorded; an option of ``cfg`` (but for
        :data:`NOT_RESULT`) against the configuration the checkpoint it resumes from was saved with
        (:func:`finecap.train.state.trained_config`: a resume would log such a change and train on with it); and
        ``start`` (:meth:`start_record`, now) against the :data:`START_FILE` the stage wrote when it started (its
        start trained again since the kill: the checkpoint holds steps taken from the old one). A run with no record
        (started before finecap wrote it at the start, or by ``finecap train``) is not compared by its start."""
        out = self.stage_dir(stage)
        subject = f"{self.what} {stage!r}: the unfinished run in {out}"
        # its start is the best of a finished stage (check_inputs), which no save swaps (check_reuse)
        try:
            check_run(out, cfg, hints=STAGE_HINTS)
        except FingerprintMismatch as e:
            raise FingerprintMismatch(
                f"{subject} was trained on other inputs than its configuration names now, so it is not continued: "
                f"{e} | {self.ways_out_of(stage)}"
            ) from e
        found = find_resumable(out)
        if found is not None:
            self._check_configuration(stage, trained_config(found, out), cfg, subject, "continued")
        self._check_start(stage, start, subject, "continued")

    def _check_configuration(self, stage: str, saved: Path, cfg: Config, subject: str, outcome: str) -> None:
        """:class:`FingerprintMismatch` when an option of ``cfg`` that makes a stage's result (:func:`makes_result`)
        differs from the stored configuration ``saved``; ``subject`` and ``outcome`` (``reused``, ``continued``) are
        what the error says."""
        changes = [c for c in config_changes(saved, cfg.saved_dict()) if makes_result(c)]
        if changes:
            raise FingerprintMismatch(
                f"{subject} was trained with another configuration than it has now ({saved}), so it is not "
                f"{outcome}: {'; '.join(changes)} | {self.ways_out_of(stage)}"
            )

    def _check_start(self, stage: str, now: dict[str, str] | None, subject: str, outcome: str) -> None:
        """:class:`FingerprintMismatch` when stage ``stage``'s :data:`START_FILE` records another start than ``now``
        (:meth:`start_record`); nothing when either is missing."""
        record = self.stage_dir(stage) / START_FILE
        if not record.is_file() or now is None:
            return
        started = read_json(record)
        if started != now:
            raise FingerprintMismatch(
                f"{subject} started from another checkpoint than stage {now['stage']!r}'s best now "
                f"({self.best_checkpoint(now['stage'])}: sha256 {started.get('sha256')} recorded in {record}, "
                f"{now['sha256']} now; trained again since), so it is not {outcome} | {self.ways_out_of(stage)}"
            )

    def train_stage(self, stage: str) -> bool:
        """Train ``stage`` unless it finished (then check that it may be reused); returns whether it trained now. What
        it refuses, and what training there would refuse of its settings
        (:func:`finecap.train.preflight.check_settings`) and of the files in the stage's folder
        (:func:`finecap.train.state.check_run_folder`), is refused before anything of the stage's old run changes
        (its :data:`DONE` marker, its :data:`START_FILE`, its checkpoints). Trained from the start (``force``, or a
        killed run that saved no checkpoint), its old run is removed (:func:`finecap.train.state.prepare_run_dir`,
        holding training's lock) before :data:`START_FILE` records the new start: a kill before then leaves the old
        run under the start it was trained from, which the next run compares (:meth:`check_continue`); a kill after,
        no old run."""
        out = self.stage_dir(stage)
        cfg = self.stage_config(stage)
        if self.is_done(stage) and not self.force:
            self.check_reuse(stage, cfg)
            log.info("%s: already trained (%s); skipping", stage, out)
            return False
        self.check_inputs(stage)
        # refused after the old run's DONE and start.json changed, a run without force resumed that finished run and
        # marked it done under the new start.json
        marker = out / DONE
        if self.force:  # not finished until trained again: a killed retrain is no finished stage (nor its old files)
            resume, overwrite = False, True
            if (marker.exists() or marker.is_symlink()) and not is_marker(marker):  # a user's file or folder: kept
                raise ValueError(f"{marker}: not the stage's {DONE} marker (finecap writes a file holding "
                                 f"{MARKER_TEXT!r}); nothing was deleted: move it out of {out}")  # fmt: skip
        else:  # a killed stage resumes, or starts again when it saved no checkpoint
            resume, overwrite = continue_unfinished(
                out, what=f"{self.what} {stage!r}", ways_out=self.ways_out_of(stage)
            )
        record = out / START_FILE
        if (record.exists() or record.is_symlink()) and not is_start_record(record):
            raise ValueError(f"{record}: not the stage's {START_FILE} (finecap writes the stage and digest of its "
                             f"start there); nothing was deleted: move it out of {out}")  # fmt: skip
        start = self.start_record(stage)  # what it starts from, before training reads it
        if resume:  # an unfinished run there (killed, or written by `finecap train`): on this stage's settings?
            self.check_continue(stage, cfg, start)
        check_settings(cfg, resume=resume)  # what training would refuse of its settings,
        check_run_folder(out, overwrite=overwrite, reads=run_reads(cfg))  # and of the files there
        if self.force and marker.exists():
            marker.unlink()
        # the old run goes before START_FILE names the new start: written first, a kill in training's start-up left
        # the old run's checkpoints under it, which a run without force then continued and marked done
        if not resume and holds_run(out):
            with output_lock(out, name=TRAIN_LOCK, holder="finecap train", log=log.warning):  # training's own lock
                prepare_run_dir(out, resume=False, overwrite=overwrite, reads=run_reads(cfg))
        if start is not None and not (resume and record.exists()):  # recorded as it starts: a resume compares
            write_json(record, start)
        self.train(cfg, resume=resume, overwrite=overwrite)
        atomic_write_text(out / DONE, MARKER_TEXT)
        return True

    def run_stage(self, stage: str) -> Any:
        """Run one stage in this process: a task's result, or a training stage's ``then`` (None without one)."""
        row = self.stages[stage]
        if row.kind == TASK:
            self.check_inputs(stage)
            assert row.run is not None  # Stage.__post_init__
            return row.run(self)
        self.train_stage(stage)
        return row.then(self, stage) if row.then is not None else None

    def side_stages(self, stages: Iterable[str]) -> set[str]:
        """The training stages of ``stages`` that no other listed stage starts from or needs: they can run side by
        side."""
        stages = list(stages)
        needed = {n for s in stages for n in self.stages[s].needs}
        return {s for s in stages if self.stages[s].kind == TRAIN and s not in needed}

    def run(self, stages: Iterable[str], *, jobs: int = 1, threads: int = 1,
            timings_file: Path | None = None) -> dict[str, Any]:  # fmt: skip
        """Run ``stages`` in order (module docstring); returns the results of the stages run in this process. Each
        stage's wall seconds go to ``timings_file`` (JSON, kept across runs) as it finishes."""
        stages = list(stages)
        unknown = [s for s in stages if s not in self.stages]
        if unknown:
            raise ValueError(f"unknown stage(s) {unknown}; valid stages: {', '.join(self.stages)}")
        timings = read_json(timings_file) if timings_file is not None and timings_file.exists() else {}

        def timed(stage: str, seconds: float) -> None:
            timings[stage] = seconds
            if timings_file is not None:
                write_json(timings_file, timings)

        side = self.side_stages(stages)
        results: dict[str, Any] = {}
        started = time.perf_counter()
        if jobs > 1 and len(side) > 1:  # one side stage alone runs here, with the same threads: the same results
            from finecap.stages.pool import SidePool

            with SidePool(jobs) as pool:
                self._run_with_pool(stages, side, pool, jobs, threads, timed, results)
        else:
            for stage in stages:
                if stage in side:
                    log.info("== %s: %s (%d threads)", self.what, stage, threads)
                    timed(stage, run_side_stage(self, stage, threads))
                else:
                    timed(stage, self._run_here(stage, results))
        log.info("stage wall times (s): %s; all stages: %.0f s", ", ".join(f"{k} {v}" for k, v in timings.items()),
                 time.perf_counter() - started)  # fmt: skip
        return results

    def _run_here(self, stage: str, results: dict[str, Any]) -> float:
        """Run a stage alone in this process with all threads; returns its wall seconds."""
        log.info("== %s: %s", self.what, stage)
        start = time.perf_counter()
        results[stage] = self.run_stage(stage)
        return round(time.perf_counter() - start, 1)

    def _run_with_pool(self, stages: list[str], side: set[str], pool: Any, jobs: int, threads: int,
                       timed: Callable[[str, float], None], results: dict[str, Any]) -> None:  # fmt: skip
        running: dict[Future, str] = {}

        def finish(futures: set[Future]) -> None:
            for future in futures:
                stage = running.pop(future)
                timed(stage, future.result())  # a failed stage raises here, naming itself in its error
                log.info("== %s %s done (%.0f s, %d still running)", self.what, stage, future.result(), len(running))

        for stage in stages:
            if stage in side:
                if len(running) >= jobs:
                    finish(wait(running, return_when=FIRST_COMPLETED).done)
                log.info("== %s: %s (beside %d others, %d threads each)", self.what, stage, len(running), threads)
                running[pool.submit(run_side_stage, self, stage, threads)] = stage
                continue
            finish(wait(running).done if running else set())  # the next stage may read theirs (report) or need cores
            timed(stage, self._run_here(stage, results))
        finish(wait(running).done if running else set())


def run_side_stage(runner: StageRunner, stage: str, threads: int) -> float:
    """Run one side stage with ``threads`` torch threads (in a worker process, or in this one); returns its wall
    seconds. The thread count is the stage's whatever the job count, so its results are too (CPU kernels sum in a
    thread-count-dependent order)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    start = time.perf_counter()
    try:
        runner.run_stage(stage)
    finally:
        torch.set_num_threads(before)
    return round(time.perf_counter() - start, 1)


def never_train(cfg: Config, *, resume: bool, overwrite: bool) -> None:
    """The training function of :func:`finished_stages`: it has none to give."""
    raise RuntimeError(f"{cfg.run.dir}: a runner over finished stages trains nothing")


def finished_stages(run_dir: Path, stages: Iterable[str]) -> StageRunner:
    """A runner over training stages that have run in ``run_dir`` (a demo's run directory, or a grid's seed folder),
    each configured by the ``config.yaml`` it saved, so what reads them (:mod:`finecap.stages.outputs`: captions,
    samples, diversity) decodes with the settings they trained with; its ``cfg`` is ``run_dir``'s own
    ``config.yaml``. It trains nothing (:func:`never_train`): a stage that has not finished is a
    :class:`MissingInput` when read."""
    stages = list(stages)
    missing = [s for s in stages if not (run_dir / s / DONE).is_file()]
    if missing:
        raise MissingInput(f"{run_dir}: stage(s) {', '.join(missing)} have not finished (no {DONE} marker)")
    for s in stages:  # stored configurations, read as such: one naming code of one's own is refused (never imported)
        load_stored(run_dir / s / CONFIG_FILE)
    table = stage_table(Stage(s, TRAIN, recipe=str(run_dir / s / CONFIG_FILE), stored=True) for s in stages)
    return StageRunner(table, load_stored(run_dir / CONFIG_FILE), run_dir, train=never_train)
