"""QA utility (CapRL's reward): how many of an image's multiple-choice questions a text-only judge answers right from
the caption alone.

Per image a set of questions (:class:`~finecap.judges.base.Question`), read in ``setup(inputs)`` in the order the
``qa`` metric reads them too (:func:`finecap.judges.questions.pick_questions`): ``inputs.questions`` (in a run the
data set's own; outside one ``questions={image_id: [Question]}``), else the questions file ``judge.questions``
(CapRL's layout, :mod:`finecap.judges.questions`; with questions of the data set too, refused), else made from the
world's scene graphs (``inputs.scenes``; :func:`finecap.judges.questions.scene_questions`). The judge is the
``judge`` setting (a :class:`~finecap.judges.base.Judge` or a judge name) or the run's ``judge`` section. Each
question is asked ``k`` times (``judge.shuffles``), its options in ``k`` different orders while they allow
(:func:`~finecap.judges.questions.presentations`), :data:`~finecap.judges.base.CANNOT_ANSWER` last. At set-up
every question is also asked blind (no caption) in its ``k`` orders; a question the blind judge answers right in all
``k`` is dropped (it pays for nothing the caption says), and the share dropped is reported
(:attr:`QAUtilityReward.blind`). In a run (``inputs.records``, the training images) a training image left with no
question is refused at set-up, saying how many were given none and how many lost all theirs to the blind filter.

For a caption with ``m`` asks (questions x ``k``) of which ``a`` are answered right, ``c`` "cannot answer" and ``w``
wrongly: ``reward = a / m``; parts ``answered`` = a / m, ``cannot_answer`` = c / m, ``wrong`` = w / m (they sum to
1), ``judge_cannot_answer`` = c (a count) and ``judge_failed`` (1 when any of the caption's asks failed after the
judge's retries: the caption is then marked in ``failed`` and its other values are NaN, :mod:`finecap.rewards.judged`).

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
from typing import TYPE_CHECKING, Any

import torch

from finecap.judges.base import Judge, JudgeFailed, Question
from finecap.judges.qa import drop_blind, qa_scores
from finecap.judges.questions import pick_questions
from finecap.metrics.faithfulness import scene_of
from finecap.rewards.base import caption_rows
from finecap.rewards.judged import JudgedReward, judged_output

if TYPE_CHECKING:
    from finecap.config import Config
    from finecap.rewards.base import RewardOutput
    from finecap.rewards.inputs import RewardInputs
    from finecap.world.scene import Scene


class QAUtilityReward(JudgedReward):
    """QA utility of each caption (module docstring).

    Args:
        judge: the judge (or a judge name); ``None``: the ``judge`` section of ``cfg``, made in :meth:`setup`.
        questions: ``{image_id: [Question]}``; ``None``: read in :meth:`setup` (module docstring).
        scenes: ``{image_id: Scene}`` to make the questions from (the world), when no questions are given. Two ids
            of either naming one image (``1`` and ``"1"``) are a ``ValueError``
            (:func:`~finecap.judges.questions.pick_questions`).
        shuffles: ``k``, the orders each question is asked in; ``seed`` the shuffles' seed.
        questions_file: a questions file read in :meth:`setup` when the inputs bring no questions
            (``judge.questions``).
        cfg: the configuration whose ``judge`` section builds the judge (``None``: the ``world`` judge's defaults).
    Given a judge and questions (or scenes), the reward is set up at once.
    """

    name = "qa_utility"
    per_caption = True  # a caption's value needs only its own image's questions
    settings = ("judge",)

    def __init__(
        self,
        judge: Judge | str | None = None,
        *,
        questions: Mapping[Hashable, Sequence[Question]] | None = None,
        scenes: Mapping[Hashable, Scene] | None = None,
        shuffles: int = 2,
        seed: int = 0,
        questions_file: str = "",
        cfg: Config | None = None,
    ) -> None:
        if shuffles < 1:
            raise ValueError(f"qa_utility: shuffles={shuffles} must be at least 1")
        self.judge: Judge | str | None = judge
        self.shuffles, self.seed, self.questions_file, self.cfg = shuffles, seed, questions_file, cfg
        self.questions: dict[Hashable, list[Question]] | None = None
        self.blind: dict[str, float] = {}
        if judge is not None and (questions is not None or scenes is not None):
            self.prepare(self._resolve(judge, cfg, "qa_utility"), questions, scenes)

    def prepare(
        self,
        judge: Judge,
        questions: Mapping[Hashable, Sequence[Question]] | None,
        scenes: Mapping[Hashable, Scene] | None,
    ) -> Mapping[Hashable, Sequence[Question]]:
        """The one set-up step: take the judge, make or take the questions, drop the blind-answerable ones; returns
        the questions before the drop."""
        self.judge = judge
        questions = pick_questions(questions, "", scenes, "qa_utility")
        if questions is None:
            raise ValueError("qa_utility: no questions; outside a training run give questions={image_id: "
                             "[Question]} or scenes= (world=); in a run give the data set's images questions, set "
                             "judge.questions=<questions file> or train on the world (questions from its scene "
                             "graphs)")  # fmt: skip
        self.questions, self.blind = drop_blind(judge, questions, self.shuffles, self.seed, refuse="qa_utility")
        return questions

    def configure(self, **settings: Any) -> None:
        """Set ``judge`` (:meth:`JudgedReward.check_setting`) before the questions are prepared; after, a
        ``ValueError``: the blind judge that filtered them was the earlier one (give ``judge=`` to the constructor, or
        as an adapter's option)."""
        if "judge" in settings and self.questions is not None:
            raise ValueError("qa_utility: configure(judge=...) after the questions were prepared (set up, or given "
                             "with a judge to the constructor): the earlier judge filtered out the questions it "
                             "answered blind; give judge= before setup, with the questions")  # fmt: skip
        super().configure(**settings)

    def check_covers(self, image_ids: Sequence[Hashable], asked: Mapping[Hashable, Sequence[Question]]) -> None:
        """A ``ValueError`` when an image of ``image_ids`` (a run's training images) has no question left, naming how
        many were given none and how many lost all theirs to the blind filter (``asked``: before it), before the run
        rather than at the first batch that holds one."""
        missing = [i for i in image_ids if not scene_of(i, self.questions or {})]
        if not missing:
            return
        blind = [i for i in missing if scene_of(i, asked)]
        none = [i for i in missing if i not in blind]

        def some(ids: list[Hashable]) -> str:
            return ", ".join(repr(i) for i in ids[:3]) + (", ..." if len(ids) > 3 else "")

        raise ValueError(
            f"qa_utility: {len(missing)} of {len(image_ids)} training images have no questions"
            + (f"; given none: {len(none)} ({some(none)})" if none else "")
            + (f"; all answered right by a blind judge: {len(blind)} ({some(blind)})" if blind else "")
            + ". Give questions for every training image (judge.questions, the data set's questions) or leave these "
            "images out of the training split"
        )

    def setup(self, inputs: RewardInputs) -> None:
        """The judge and the questions (module docstring), once; the blind asks are made here."""
        if self.questions is not None:
            return
        questions = pick_questions(inputs.questions, self.questions_file, inputs.scenes, "qa_utility")
        judge = self._resolve(self.judge, self.cfg, "qa_utility")
        asked = self.prepare(judge, questions, None)
        if inputs.records is not None:  # a run: its training images
            self.check_covers([r.image_id for r in inputs.records], asked)

    def known_images(self) -> list[Hashable]:
        """The images with questions (less those whose questions were all answered blind)."""
        return [i for i, qs in (self.questions or {}).items() if qs]

    def _questions_of(self, image_id: Hashable) -> list[Question]:
        qs = scene_of(image_id, self.questions or {})  # ids as ints or as their strings
        if not qs:
            raise ValueError(f"qa_utility: image {image_id!r} has no questions (none given, or all answered blind)")
        return qs  # type: ignore[return-value]

    def __call__(self, captions: Sequence[str], batch: Mapping[str, Any]) -> RewardOutput:
        if self.questions is None or not isinstance(self.judge, Judge):
            raise RuntimeError("QAUtilityReward: no questions; pass them (or scenes) and a judge, or call "
                               "setup(inputs) first")  # fmt: skip
        rows = caption_rows(captions, batch).tolist()
        ids = batch["image_ids"]
        scores = qa_scores(self.judge, captions, [self._questions_of(ids[r]) for r in rows], self.shuffles, self.seed)
        n = len(captions)
        right, cannot, wrong, cannot_count = (torch.zeros(n) for _ in range(4))
        failed = torch.zeros(n, dtype=torch.bool)
        for i, s in enumerate(scores):
            if isinstance(s, JudgeFailed):
                failed[i] = True
                continue
            right[i], cannot[i], wrong[i] = s.right / s.asks, s.cannot / s.asks, s.wrong / s.asks
            cannot_count[i] = s.cannot
        parts = {"answered": right, "cannot_answer": cannot, "wrong": wrong, "judge_cannot_answer": cannot_count}
        return judged_output(right.clone(), parts, failed)


def build(cfg: Config) -> QAUtilityReward:
    """Factory of the reward registry (``rl.rewards: {qa_utility: w}``): ``judge.shuffles`` and ``judge.seed``; the
    judge (``judge.*``, or the ``judge`` setting) and the questions (``judge.questions``, ``inputs.questions`` or the
    world's scenes) are read in ``setup(inputs)``."""
    return QAUtilityReward(shuffles=cfg.judge.shuffles, seed=cfg.judge.seed, questions_file=cfg.judge.questions,
                           cfg=cfg)  # fmt: skip
