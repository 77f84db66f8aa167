"""One seed's grid on the library's stage runner (:class:`finecap.stages.StageRunner`): a training stage per run of
:data:`~paper_tables.runs.RUNS` (its demo recipe, its overrides, its start), configured over the demo's settings
(:mod:`finecap.recipes.settings`), in ``<runs>/seed<N>/<run>/``; and what some runs train on first (the boosted data
set, the simplified corpora).

finecap is imported inside the functions, so ``--list`` and ``--page-only`` stay fast (no torch)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .corpora import simple_corpus
from .page import run_description
from .runs import FIELDS, RUNS
from .schema import Run

if TYPE_CHECKING:
    from finecap.stages import Stage, StageRunner

WHAT = "paper-tables run"
WAYS_OUT = "remove {out} to train it again, or give the runner another --runs-dir"
"""What a user can do about a run the grid will not reuse or continue."""


def grid_stages() -> dict[str, Stage]:
    """The stage table of the grid: every run of :data:`RUNS` that trains (the human references do not)."""
    from finecap.stages import TRAIN, Stage, stage_table

    return stage_table(Stage(key, TRAIN, recipe=f"demo/{run.recipe}", overrides=run.overrides, init=run.init)
                       for key, run in RUNS.items() if run.recipe is not None)  # fmt: skip


def make_grid(seed: int, runs_dir: Path, items: Sequence[str], quick: bool) -> StageRunner:
    """Seed ``seed``'s grid: its own world and run seed (``world.seed=N``, ``run.seed=N``) under the user's
    ``items``, the demo's settings beneath every run's recipe and its quick settings above them with ``quick``."""
    import finecap.train.run  # the train command's recipe; looked up now, so a test may stand in for it
    from finecap.config import load
    from finecap.recipes.settings import DEMO_BASE, DEMO_QUICK
    from finecap.stages import StageRunner

    seed_items = [f"world.seed={seed}", f"run.seed={seed}", *items]
    over = DEMO_QUICK if quick else None
    cfg = load(None, seed_items, base=DEMO_BASE, over=over)
    return StageRunner(grid_stages(), cfg, runs_dir / f"seed{seed}", train=finecap.train.run.train,
                       items=seed_items, quick=quick, base=DEMO_BASE, over=over, computed=run_overrides, what=WHAT,
                       ways_out=WAYS_OUT)  # fmt: skip


SHARED_RUNS = frozenset({"visual_expert"})
"""Runs that make a world seed's data rather than a captioner the tables compare (the boosted data set's visual
expert): a run-seed replicate reads the world seed's own, as it reads its boosted captions, simplified corpora,
fluency LM and bags (:func:`make_replicate`)."""


def replicate_dir(run_seed: int) -> str:
    """The folder of a world seed's runs under run seed ``run_seed``, inside the world seed's folder (``run<M>``)."""
    return f"run{run_seed}"


@functools.cache
def replicate_runner() -> type[StageRunner]:
    """:class:`finecap.stages.StageRunner` with its training runs in ``<seed folder>/run<M>/<run>/``
    (:attr:`run_seed`) and everything else of the world seed's folder shared (made on first use; finecap is
    imported here, not at module import)."""
    import dataclasses
    from dataclasses import dataclass

    from finecap.config import Config
    from finecap.models.backbones import recorded_encoder
    from finecap.runs import model_dir
    from finecap.stages import StageRunner

    @dataclass
    class ReplicateRunner(StageRunner):
        """A world seed's grid under another run seed: the captioners retrained in ``run<M>/``, each from its start's
        retrained copy (the whole chain of a comparison is repeated: MLE start included), the data the world seed
        made (boosted captions and their visual expert, corpora, fluency LM, bags) shared."""

        run_seed: int = 0
        shared: frozenset[str] = SHARED_RUNS  # runs read from the world seed's folder, not retrained

        def stage_dir(self, stage: str) -> Path:
            if stage in self.shared:
                return self.run_dir / stage
            return self.run_dir / replicate_dir(self.run_seed) / stage

        def stage_config(self, stage: str) -> Config:
            """A run starting from a shared start (the world seed's MLE start) encodes with the image encoder that
            start was built on, named as ``model.encoder``: ``world`` would name run seed M's world encoder
            (:func:`finecap.models.world_encoder_cache.encoder_key` holds ``run.seed``), which ``train.init_from``
            refuses, since the start's captioner keeps its own."""
            cfg = super().stage_config(stage)
            start = self.stages[stage].init
            if start is None or start not in self.shared:
                return cfg
            encoder = recorded_encoder(model_dir(cfg.train.init_from))
            if encoder is None:
                return cfg
            return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, encoder=encoder))

    return ReplicateRunner


def make_replicate(seed: int, run_seed: int, runs_dir: Path, items: Sequence[str], quick: bool,
                   starts: frozenset[str] = frozenset()) -> StageRunner:  # fmt: skip
    """World seed ``seed``'s grid under run seed ``run_seed`` (``world.seed=N``, ``run.seed=M``, the user's
    ``items`` last): the runs of :func:`make_grid` trained again in ``<runs>/seed<N>/run<M>/``, so that a cell's
    difference can be measured over run seeds (:func:`.verdicts.run_seed_interval`). The world seed's shared data
    (boosted captions, fluency LM) must be made by its own grid first (:func:`.cli.run_replicates` does), so that it
    is the one the grid's own runs used. ``starts``: runs read from the world seed's own folder as its grid trained
    them (:attr:`.schema.Paper.replicate_from_start`: the MLE start), never retrained under run seed M; a run
    starting from one loads that start's checkpoint and the world encoder it names, so run seed M's own world encoder
    is neither trained nor read."""
    import finecap.train.run
    from finecap.config import load
    from finecap.recipes.settings import DEMO_BASE, DEMO_QUICK

    if run_seed == seed:
        raise SystemExit(f"--run-seeds: run seed {run_seed} is world seed {seed}'s own run (run.seed = world.seed); "
                         "give other run seeds")  # fmt: skip
    seed_items = [f"world.seed={seed}", f"run.seed={run_seed}", *items]
    over = DEMO_QUICK if quick else None
    cfg = load(None, seed_items, base=DEMO_BASE, over=over)
    return replicate_runner()(grid_stages(), cfg, runs_dir / f"seed{seed}", train=finecap.train.run.train,
                              items=seed_items, quick=quick, base=DEMO_BASE, over=over, computed=run_overrides,
                              what=WHAT, ways_out=WAYS_OUT, run_seed=run_seed,
                              shared=SHARED_RUNS | starts)  # fmt: skip


def run_overrides(grid: StageRunner, key: str) -> list[str]:
    """The settings computed for run ``key`` when it is configured: its caption field's and its corpus's."""
    run = RUNS[key]
    return [*caption_field_overrides(grid, run), *corpus_overrides(grid, run)]


def ensure_trained(grid: StageRunner, key: str, start_grid: StageRunner | None = None) -> None:
    """Train run ``key`` (and the run it starts from, and the boosted data set it trains on) unless its ``DONE``
    marker exists; resume a killed one (:meth:`finecap.stages.StageRunner.train_stage`). A finished run trained on
    other inputs (another world encoder, world or data) is refused, naming both fingerprints. ``start_grid``: the
    runner whose run ``key``'s start is (a from-start replicate's world seed grid, :func:`make_replicate`'s
    ``starts``); default ``grid``."""
    run = RUNS[key]
    if run.recipe is None:
        return
    if run.captions != "original":
        ensure_boosted(grid)
    if run.init is not None:
        ensure_trained(start_grid or grid, run.init)
    if not grid.is_done(key):
        print(f"== train {key}: {run_description(key)}", flush=True)
    grid.train_stage(key)


def caption_field_overrides(grid: StageRunner, run: Run) -> list[str]:
    """The settings that train ``run`` on its caption field: none for the human captions; for a boosted field, the
    demo's VCB stages' (:func:`finecap.boost.training.field_overrides`: the boosted data set, its field, captions of
    up to 55 tokens, and for an MLE start, but in a quick grid, as many steps as the MLE start on the human
    captions)."""
    from finecap.boost import training

    if run.captions == "original":
        return []
    if run.captions not in FIELDS:
        raise ValueError(f"unknown caption field {run.captions!r}; valid: {', '.join(FIELDS)}")
    steps = training.epoch_steps(grid.stage_config("mle")) if run.recipe == "mle" and not grid.quick else None
    return training.field_overrides(grid.run_dir / training.BOOSTED_DIR, run.captions, steps)


def corpus_overrides(grid: StageRunner, run: Run) -> list[str]:
    """The settings that train ``run`` on its simplified corpus (:func:`simple_corpus`), none without one."""
    from finecap.home import world_path

    if not run.corpus:
        return []
    path = simple_corpus(grid, run.corpus)
    return ["data.format=karpathy", f"data.path={path}", f"data.images={world_path(grid.cfg.world) / 'images'}"]


def ensure_boosted(grid: StageRunner) -> Path:
    """The world's Visual Caption Boosting data set of this seed (every caption field), made as the demo's ``vcb``
    stages make it: the visual expert trained (a run of the grid), then ``finecap boost`` with the world backends
    (:func:`finecap.boost.training.world_boost_config`) into ``<seed folder>/world_holistic``, again when the one
    there was made before the expert last trained or with other ``boost.*`` settings
    (:func:`finecap.app.boost.boost_unless_current`, as the demo's); returns its ``dataset.json``."""
    from finecap.app.boost import boost_unless_current
    from finecap.boost import training

    path = grid.run_dir / training.BOOSTED_DIR / "dataset.json"
    if not path.exists():  # a run-seed replicate finds it made by its world seed's grid (make_replicate)
        ensure_trained(grid, "visual_expert")
        print(f"== boost: BlendCap, VisualCap and HolisticCap of every image into {path.parent}", flush=True)
    boost_unless_current(grid, path.parent, what="boost")
    return path
