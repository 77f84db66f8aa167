"""The ``demo`` section: ``finecap demo``'s stages."""

from __future__ import annotations

from dataclasses import dataclass

from finecap.config.fields import Section, doc
from finecap.config.sections.limits import (
    MAX_PROCESSES,
)


@dataclass
class DemoConfig(Section, name="demo"):
    stages: list[str] = doc(
        ["world", "retriever", "mle", "blip_mle", "vlm_mle", "sr_bagcurri", "scst", "grpo_sr_cider", "smile", "sle",
         "discritune", "blip_smile", "vlm_smile", "report"],
        "Demo stages to run, in order (optional: mle_continued, scst_me, blip_discritune, vlm_discritune, vcb, ...).",
    )  # fmt: skip
    quick: bool = doc(False, "Tiny settings that finish in about a minute (used by tests).")
    force: bool = doc(False, "Re-run stages even when their outputs exist.")
    jobs: int = doc(
        0,
        "Training stages no other stage starts from, run side by side (0 = cores // demo.stage_threads).",
        ge=0,
        le=MAX_PROCESSES,
        why="each job is a process",
    )
    stage_threads: int = doc(
        1,
        "Torch threads of each such stage, whatever demo.jobs (so results do not depend on the job count).",
        ge=1,
        le=MAX_PROCESSES,
        why="torch threads of each stage",
    )
