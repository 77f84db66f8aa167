"""What the judge-backed rewards (``qa_utility``, ``claims``) share: their judge (the ``judge`` setting or the run's
``judge`` section), the subject of each caption, and an output that marks the captions the judge failed on.

A caption whose judge calls failed (after the judge's retries) is never paid a made-up value: it is marked in the
output's ``failed`` mask (:class:`~finecap.rewards.base.RewardOutput`; the weighted sum makes its total NaN, the
reward server answers it ``null``) and counted in the part ``judge_failed`` (1 for it, 0 for the others); its other
values are NaN. What the judge did (its calls, cache hits, unparsable answers, failed calls and HTTP 429 replies) is
the reward's :meth:`~JudgedReward.tallies`, which training logs per step (``reward/<name>/judge/<tally>``).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from finecap.judges.base import TALLIES, Judge, Subject
from finecap.metrics.faithfulness import scene_of
from finecap.rewards.base import CAPTION_REFERENCES, RewardBase, RewardOutput, caption_rows

if TYPE_CHECKING:
    from finecap.config import Config
    from finecap.world.scene import Scene


def judged_output(total: torch.Tensor, parts: dict[str, torch.Tensor], failed: torch.Tensor) -> RewardOutput:
    """``RewardOutput(total, parts, failed)`` with the part ``judge_failed`` = ``failed`` as 0/1 and, at the failed
    captions, the total and every other part NaN (values that mean nothing)."""
    failed = failed.bool()
    nan = float("nan")
    out = {name: p.masked_fill(failed, nan) for name, p in parts.items()}
    out["judge_failed"] = failed.float()
    return RewardOutput(total.masked_fill(failed, nan), out, failed)


def resolve_judge(judge: Judge | str | None, cfg: Config | None, option: str) -> Judge:
    """The judge of a reward: ``judge`` itself when it is a :class:`Judge`, the judge named ``judge`` (a
    :data:`~finecap.registry.JUDGES` name or dotted path) built with ``cfg``'s ``judge`` section, or, for ``None``, the
    section's own (``judge.name``; the ``world`` judge's defaults without a configuration)."""
    from finecap.judges import get_judge

    if isinstance(judge, Judge):
        return judge
    if judge is None:
        return get_judge(cfg.judge.name if cfg is not None else "world", cfg)
    check_judge(judge, option)
    return get_judge(judge, cfg)


def check_judge(judge: Any, option: str) -> None:
    """A ``TypeError`` naming ``option`` unless ``judge`` is a :class:`Judge`, a judge name or ``None``."""
    if not (judge is None or isinstance(judge, Judge | str)):
        raise TypeError(f"{option}: judge= must be a finecap.judges.base.Judge or a judge name (e.g. 'world', "
                        f"'openai'), got {type(judge).__name__}")  # fmt: skip


class JudgedReward(RewardBase):
    """Base of the rewards that ask a judge: the judge they resolve (:func:`resolve_judge`), closed by
    :meth:`close` when the reward built it from a name or the configuration; a :class:`Judge` given to the reward
    stays its giver's to close."""

    _built: Judge | None = None
    name = "judged"
    judge: Judge | str | None = None
    """The judge asked (a name or ``None`` until it is resolved: :meth:`_resolve`)."""

    def check_setting(self, key: str, value: Any) -> Any:
        """``judge``: a :class:`Judge`, a judge name or ``None`` (the configuration's); a ``TypeError`` naming the
        reward otherwise (:func:`check_judge`)."""
        if key == "judge":
            check_judge(value, self.name)
        return value

    def _resolve(self, judge: Judge | str | None, cfg: Config | None, option: str) -> Judge:
        resolved = resolve_judge(judge, cfg, option)
        if self._built is not None and self._built is not resolved:  # a judge it built, replaced: released
            self._built.close()
            self._built = None
        if resolved is not judge:
            self._built = resolved
        return resolved

    def tallies(self) -> dict[str, float]:
        """The judge's :meth:`~finecap.judges.base.Judge.tallies` as ``judge/<key>`` (calls, cache hits, unparsable
        answers, failed calls, HTTP 429 replies); 0 each before the judge is resolved."""
        counts = self.judge.tallies() if isinstance(self.judge, Judge) else dict.fromkeys(TALLIES, 0)
        return {f"judge/{key}": float(v) for key, v in counts.items()}

    def close(self) -> None:
        if self._built is not None:
            self._built.close()
            self._built = None


def caption_subjects(
    captions: Sequence[str],
    batch: Mapping[str, Any],
    scenes: Mapping[Hashable, Scene] | None,
    references: Mapping[Hashable, Sequence[str]] | None,
) -> list[Subject]:
    """The :class:`~finecap.judges.base.Subject` of each caption: its image's references (the call's own,
    ``caption_references``, else ``references``) and its scene (when ``scenes`` has one), the image's id read as an
    int or as that int's string on either side (:func:`~finecap.metrics.faithfulness.scene_of`). An image with no
    evidence at all (no references, no scene) is a ``ValueError``: scored against nothing, its values would mean
    nothing."""
    rows = caption_rows(captions, batch).tolist()
    ids = batch["image_ids"]
    given = batch.get(CAPTION_REFERENCES)
    out = []
    for n, row in enumerate(rows):
        image_id = ids[row]
        refs = given[n] if given is not None else scene_of(image_id, references or {})
        scene = scene_of(image_id, scenes) if scenes is not None else None
        if not refs and scene is None:  # none, or an empty list
            raise ValueError(f"image {image_id!r} has no references and no scene to check claims against")
        out.append(Subject(image_id, tuple(refs or ()), scene))
    return out
