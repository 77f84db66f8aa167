"""What the judge-backed rewards (``qa_utility``, ``claims``) share: the judge and the scene graphs they read in a
training run, the subject of each caption, and an output that marks the captions the judge failed on.

A caption whose judge calls failed (after the judge's retries) is never paid a made-up value: its output row is
marked in ``failed`` (when :class:`~finecap.rewards.base.RewardOutput` has that field, so that GRPO leaves it out of
its group's advantage) and counted in the part ``judge_failed``; its ``total`` is 0 only as a placeholder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from finecap.judges.base import Subject
from finecap.metrics.faithfulness import scene_of
from finecap.rewards.base import CAPTION_REFERENCES, RewardOutput, caption_rows

if TYPE_CHECKING:
    from finecap.config import Config
    from finecap.judges.base import Judge
    from finecap.world.scene import Scene


def judged_output(total: torch.Tensor, parts: dict[str, torch.Tensor], failed: torch.Tensor) -> RewardOutput:
    """``RewardOutput(total, parts, failed=failed)``, or without ``failed`` where the output has no such field (the
    failures are then in the ``judge_failed`` part only)."""
    if "failed" in {f.name for f in dataclasses.fields(RewardOutput)}:
        return RewardOutput(total, parts, failed=failed)  # type: ignore[call-arg]
    return RewardOutput(total, parts)


def run_judge(cfg: Config | None) -> Judge:
    """The judge of the ``judge`` section of ``cfg`` (the ``world`` judge's defaults without one)."""
    from finecap.judges import get_judge

    return get_judge(cfg.judge.name if cfg is not None else "world", cfg)


def run_scenes(cfg: Config | None) -> dict[Hashable, Scene] | None:
    """The world's scene graphs when ``cfg`` trains on the world, else ``None``."""
    from finecap.data.references import world_scenes

    return world_scenes(cfg)


def caption_subjects(
    captions: Sequence[str],
    batch: Mapping[str, Any],
    scenes: Mapping[Hashable, Scene] | None,
    references: Mapping[Hashable, Sequence[str]] | None,
) -> list[Subject]:
    """The :class:`~finecap.judges.base.Subject` of each caption: its image's references (the call's own,
    ``caption_references``, else ``references``) and its scene (when ``scenes`` has one)."""
    rows = caption_rows(captions, batch).tolist()
    ids = batch["image_ids"]
    given = batch.get(CAPTION_REFERENCES)
    out = []
    for n, row in enumerate(rows):
        image_id = ids[row]
        refs = given[n] if given is not None else (references or {}).get(image_id, ())
        scene = scene_of(image_id, scenes) if scenes is not None else None
        out.append(Subject(image_id, tuple(refs), scene))
    return out
