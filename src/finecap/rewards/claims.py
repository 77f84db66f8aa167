"""Claim precision and recall (BalCapRL's, CCCaption's and ClaimDiff-RL's decomposition): the judge splits the caption
and the references into atomic claims; precision = caption claims the image's evidence supports, recall = reference
claims the caption covers (:mod:`finecap.judges.claims`). On the world with the ``world`` judge the claims are the
parsed facts and the evidence the scene graph, so precision and recall are the faithfulness metric's exactly.

``reward`` = F1 (``score="f1"``, the default), or ``precision`` / ``recall``; parts ``precision``, ``recall``,
``f1`` and ``judge_failed`` (1 when a judge call for the caption failed: the caption is marked failed,
:mod:`finecap.rewards.judged`). To pay the two parts each normalised on its own (BalCapRL, GDPO-style), sum two of
these rewards, ``score="precision"`` and ``score="recall"``, under GDPO's per-reward normalisation.

Example::

    >>> from finecap.world.scene import Obj, Scene
    >>> from finecap.judges.world import WorldJudge
    >>> scene = Scene(0, "grass", [Obj("circle", "red", "large", 1, 1)])
    >>> out = ClaimsReward(WorldJudge(), scenes={0: scene})(["a blue circle"], {"image_ids": [0]})
    >>> out.parts["precision"].tolist(), out.parts["recall"].tolist()  # object true, colour false; 1 of 6 facts
    ([0.5], [0.1666666716337204])
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch

from finecap.judges.base import Judge, JudgeFailed
from finecap.judges.claims import claim_scores
from finecap.rewards.judged import caption_subjects, judged_output, run_judge, run_scenes

if TYPE_CHECKING:
    from finecap.config import Config
    from finecap.contract import TrainContext
    from finecap.rewards.base import RewardOutput
    from finecap.world.scene import Scene

Score = Literal["f1", "precision", "recall"]


class ClaimsReward:
    """Claim F1 (or precision, recall) of each caption (module docstring). ``references`` ``{image_id: [captions]}``
    and ``scenes`` ``{image_id: Scene}`` are the evidence; ``None`` for both: the run's, read in :meth:`setup`."""

    name = "claims"
    per_caption = True

    def __init__(
        self,
        judge: Judge | None = None,
        *,
        references: Mapping[Hashable, Sequence[str]] | None = None,
        scenes: Mapping[Hashable, Scene] | None = None,
        score: Score = "f1",
    ) -> None:
        if score not in ("f1", "precision", "recall"):
            raise ValueError(f"claims: score={score!r}; valid: f1, precision, recall")
        self.judge, self.score = judge, score
        self.references = None if references is None else {i: list(r) for i, r in references.items()}
        self.scenes = None if scenes is None else dict(scenes)

    def prepare(self, judge: Judge, references: Mapping[Hashable, Sequence[str]] | None,
                scenes: Mapping[Hashable, Scene] | None) -> None:  # fmt: skip
        """The one set-up step: the judge and the evidence."""
        self.judge = judge
        self.references = None if references is None else {i: list(r) for i, r in references.items()}
        self.scenes = None if scenes is None else dict(scenes)

    def setup(self, ctx: TrainContext) -> None:
        """The run's judge, the training references and, on the world, its scene graphs."""
        if self.judge is not None and (self.references is not None or self.scenes is not None):
            return
        refs: dict[Hashable, list[str]] = {}
        for record in ctx.train_records:
            refs.setdefault(record.image_id, []).extend(record.captions)
        self.prepare(self.judge or run_judge(ctx.cfg), refs, run_scenes(ctx.cfg))

    def __call__(self, captions: Sequence[str], batch: Mapping[str, Any]) -> RewardOutput:
        if self.judge is None:
            raise RuntimeError("ClaimsReward: no judge; pass one or call setup(ctx) first")
        subjects = caption_subjects(captions, batch, self.scenes, self.references)
        scores = claim_scores(self.judge, list(captions), subjects)
        n = len(captions)
        precision, recall, f1, failed = (torch.zeros(n) for _ in range(4))
        for i, s in enumerate(scores):
            if isinstance(s, JudgeFailed):
                failed[i] = 1.0
            else:
                precision[i], recall[i], f1[i] = s.precision, s.recall, s.f1
        parts = {"precision": precision, "recall": recall, "f1": f1, "judge_failed": failed}
        return judged_output(parts[self.score].clone(), parts, failed.bool())


def build(cfg: Config | None = None, *, judge: Judge | str | None = None,
          references: Mapping[Hashable, Sequence[str]] | None = None,
          scenes: Mapping[Hashable, Scene] | None = None, score: Score = "f1") -> ClaimsReward:  # fmt: skip
    """Factory of the reward registry (``rl.rewards: {claims: w}``): in a training run the judge and evidence are the
    run's, read in ``setup(ctx)``; outside one (``cfg=None``) ``judge=`` (a Judge or name; default ``world``) and
    ``references=`` and/or ``scenes=``."""
    if isinstance(judge, str) or (judge is None and cfg is None):
        from finecap.judges import get_judge

        judge = get_judge(judge or "world", None)
    if cfg is None and references is None and scenes is None:
        raise ValueError("claims: outside a training run give references={image_id: [captions]} and/or scenes=")
    return ClaimsReward(judge, references=references, scenes=scenes, score=score)
