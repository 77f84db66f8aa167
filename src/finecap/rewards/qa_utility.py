"""QA utility (CapRL's reward): how many of an image's multiple-choice questions a text-only judge answers right from
the caption alone.

Per image a set of questions (:class:`~finecap.judges.base.Question`): read from a questions file (``judge.questions``
or ``questions=``; CapRL's layout, :mod:`finecap.judges.questions`), or on the world made from the scene graph
(:func:`finecap.judges.questions.scene_questions`). Each question is asked ``k`` times (``judge.shuffles``), its
options shuffled each time, :data:`~finecap.judges.base.CANNOT_ANSWER` last. At build time every question is also
asked blind (no caption) in its ``k`` orders; a question the blind judge answers right in all ``k`` is dropped (it
pays for nothing the caption says), and the share dropped is reported (:attr:`QAUtilityReward.blind`).

For a caption with ``m`` asks (questions x ``k``) of which ``a`` are answered right, ``c`` "cannot answer" and ``w``
wrongly: ``reward = a / m``; parts ``answered`` = a / m, ``cannot_answer`` = c / m, ``wrong`` = w / m (they sum to
1), ``judge_cannot_answer`` = c (a count) and ``judge_failed`` (1 when any of the caption's asks failed after the
judge's retries: the caption is then marked failed, :mod:`finecap.rewards.judged`).

Example (the world judge, one scene, a caption stating the circle's colour and nothing else)::

    >>> from finecap.world.scene import Obj, Scene
    >>> from finecap.judges.world import WorldJudge
    >>> scene = Scene(0, "grass", [Obj("circle", "red", "large", 1, 1)])
    >>> reward = QAUtilityReward(WorldJudge(), scenes={0: scene}, shuffles=1)
    >>> out = reward(["a red circle"], {"image_ids": [0]})
    >>> reward.blind["questions"], out.total.tolist()  # colour, size, position, background, count: 1 of 5 right
    (5, [0.20000000298023224])
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from finecap.judges.base import Judge, JudgeFailed, Question
from finecap.judges.qa import drop_blind, qa_scores
from finecap.judges.questions import read_questions, scene_questions
from finecap.metrics.faithfulness import scene_of
from finecap.rewards.base import caption_rows
from finecap.rewards.judged import judged_output, run_judge, run_scenes

if TYPE_CHECKING:
    from finecap.config import Config
    from finecap.contract import TrainContext
    from finecap.rewards.base import RewardOutput
    from finecap.world.scene import Scene


class QAUtilityReward:
    """QA utility of each caption (module docstring).

    Args:
        judge: the judge; ``None``: the run's (``judge.*``), made in :meth:`setup`.
        questions: ``{image_id: [Question]}``; ``None``: made from ``scenes`` (or the run's data in :meth:`setup`).
        scenes: ``{image_id: Scene}`` to make the questions from (the world).
        shuffles: ``k``, the orders each question is asked in; ``seed`` the shuffles' seed.
    """

    name = "qa_utility"
    per_caption = True

    def __init__(
        self,
        judge: Judge | None = None,
        *,
        questions: Mapping[Hashable, Sequence[Question]] | None = None,
        scenes: Mapping[Hashable, Scene] | None = None,
        shuffles: int = 2,
        seed: int = 0,
    ) -> None:
        if shuffles < 1:
            raise ValueError(f"qa_utility: shuffles={shuffles} must be at least 1")
        self.judge, self.shuffles, self.seed = judge, shuffles, seed
        self.questions: dict[Hashable, list[Question]] | None = None
        self.blind: dict[str, float] = {}
        if judge is not None and (questions is not None or scenes is not None):
            self.prepare(judge, questions, scenes)

    def prepare(
        self,
        judge: Judge,
        questions: Mapping[Hashable, Sequence[Question]] | None,
        scenes: Mapping[Hashable, Scene] | None,
    ) -> None:
        """The one set-up step: take the judge, make or take the questions, drop the blind-answerable ones."""
        self.judge = judge
        if questions is None:
            if scenes is None:
                raise ValueError("qa_utility: no questions; give a questions file (judge.questions) or train on the "
                                 "world (questions from its scene graphs)")  # fmt: skip
            questions = {i: scene_questions(i, s) for i, s in scenes.items()}
        self.questions, self.blind = drop_blind(judge, questions, self.shuffles, self.seed)

    def setup(self, ctx: TrainContext) -> None:
        """The run's judge and questions: ``judge.questions`` when set, else the world's scene graphs."""
        if self.questions is not None:
            return
        cfg = ctx.cfg
        path = getattr(cfg.judge, "questions", "")
        questions = read_questions(path) if path else None
        self.prepare(self.judge or run_judge(cfg), questions, None if questions is not None else run_scenes(cfg))

    def known_images(self) -> list[Hashable]:
        return list(self.questions or {})

    def _questions_of(self, image_id: Hashable) -> list[Question]:
        qs = scene_of(image_id, self.questions or {})  # ids as ints or as their strings
        if not qs:
            raise ValueError(f"qa_utility: image {image_id!r} has no questions (none given, or all answered blind)")
        return qs  # type: ignore[return-value]

    def __call__(self, captions: Sequence[str], batch: Mapping[str, Any]) -> RewardOutput:
        if self.questions is None or self.judge is None:
            raise RuntimeError("QAUtilityReward: no questions; pass them (or scenes) and a judge, or call setup first")
        rows = caption_rows(captions, batch).tolist()
        ids = batch["image_ids"]
        scores = qa_scores(self.judge, captions, [self._questions_of(ids[r]) for r in rows], self.shuffles, self.seed)
        n = len(captions)
        right, cannot, wrong, cannot_count, failed = (torch.zeros(n) for _ in range(5))
        for i, s in enumerate(scores):
            if isinstance(s, JudgeFailed):
                failed[i] = 1.0
                continue
            right[i], cannot[i], wrong[i] = s.right / s.asks, s.cannot / s.asks, s.wrong / s.asks
            cannot_count[i] = s.cannot
        parts = {"answered": right, "cannot_answer": cannot, "wrong": wrong, "judge_cannot_answer": cannot_count,
                 "judge_failed": failed}  # fmt: skip
        return judged_output(right.clone(), parts, failed.bool())


def build(cfg: Config | None = None, *, judge: Judge | str | None = None,
          questions: Mapping[Hashable, Sequence[Question]] | str | Path | None = None,
          scenes: Mapping[Hashable, Scene] | None = None, shuffles: int | None = None) -> QAUtilityReward:  # fmt: skip
    """Factory of the reward registry (``rl.rewards: {qa_utility: w}``): in a training run the judge, questions and
    shuffles are the run's (``judge.*``, the world's scenes), read in ``setup(ctx)``; outside one (``cfg=None``)
    ``judge=`` (a Judge or a judge name; default ``world``) and ``questions=`` (``{image_id: [Question]}`` or a
    questions file) or ``scenes=``."""
    k = shuffles if shuffles is not None else (cfg.judge.shuffles if cfg is not None else 2)
    seed = cfg.judge.seed if cfg is not None else 0
    reward = QAUtilityReward(shuffles=k, seed=seed)
    if cfg is None:
        if questions is None and scenes is None:
            raise ValueError("qa_utility: outside a training run give questions= (or a questions file) or scenes=")
        if isinstance(judge, str) or judge is None:
            from finecap.judges import get_judge

            judge = get_judge(judge or "world", None)
        if isinstance(questions, str | Path):
            questions = read_questions(questions)
        reward.prepare(judge, questions, scenes)
    elif judge is not None and not isinstance(judge, str):
        reward.judge = judge
    return reward
