"""Stages as data and the one runner that runs them (:mod:`finecap.stages.runner`), its side-stage pool
(:mod:`finecap.stages.pool`), and what a finished training stage makes on the test split
(:mod:`finecap.stages.outputs`). ``finecap demo`` and ``benchmarks/paper_tables/`` both run on it."""

from finecap.stages.runner import (
    DONE,
    TASK,
    TRAIN,
    MissingInput,
    Stage,
    StageRunner,
    finished_stages,
    stage_table,
)

__all__ = ["DONE", "TASK", "TRAIN", "MissingInput", "Stage", "StageRunner", "finished_stages", "stage_table"]
