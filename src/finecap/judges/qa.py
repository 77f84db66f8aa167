"""QA utility through a judge, the one home of the computation the ``qa_utility`` reward and the ``qa`` metric share
(docs/methods/judges.md): each question asked ``k`` times with its options shuffled
(:func:`~finecap.judges.questions.presentations`), the caption the only evidence; blind-answerable questions dropped
before (:func:`drop_blind`).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from finecap.judges.base import CANNOT_ANSWER, Ask, Judge, JudgeFailed, Question
from finecap.judges.questions import presentations

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QAScore:
    """One caption's asks: ``right``, ``cannot`` ("cannot answer") and ``wrong`` counts of ``asks``."""

    asks: int
    right: int
    cannot: int
    wrong: int

    @property
    def accuracy(self) -> float:
        """Share answered right (0 when there were no asks)."""
        return self.right / self.asks if self.asks else 0.0


def drop_blind(
    judge: Judge,
    questions: Mapping[Hashable, Sequence[Question]],
    shuffles: int,
    seed: int = 0,
    *,
    refuse: str | None = None,
) -> tuple[dict[Hashable, list[Question]], dict[str, float]]:
    """The questions a blind judge (no caption) does not answer right in all ``shuffles`` orders, and the report
    ``{"questions": n, "dropped": d, "share": d / n, "failed": f}``. A blind ask that fails keeps its question
    unfiltered: ``f`` counts those questions, warned here; with ``refuse`` (what is refused: ``finecap questions
    make``, the ``qa_utility`` reward, the ``qa`` metric) any is a ``ValueError`` naming it and the first failure, as
    a judge that never answered would pass every question as filtered."""
    asks = [(i, q, Ask(q, options, None)) for i, qs in questions.items() for q in qs
            for options in presentations(q, shuffles, seed)]  # fmt: skip
    answers = judge.answer([a for _, _, a in asks])
    right: dict[tuple[Hashable, str], int] = {}
    unasked: set[tuple[Hashable, str]] = set()
    for (i, q, _), answer in zip(asks, answers):
        right[(i, q.id)] = right.get((i, q.id), 0) + int(answer == q.answer)
        if isinstance(answer, JudgeFailed):
            unasked.add((i, q.id))
    kept = {i: [q for q in qs if right[(i, q.id)] < shuffles] for i, qs in questions.items()}
    n = sum(len(qs) for qs in questions.values())
    dropped = n - sum(len(qs) for qs in kept.values())
    report = {"questions": n, "dropped": dropped, "share": dropped / n if n else 0.0, "failed": len(unasked)}
    if dropped:
        log.info("qa: dropped %d of %d questions (%.1f %%) a blind judge answers right", dropped, n,
                 100 * report["share"])  # fmt: skip
    if unasked:
        first = next(a for a in answers if isinstance(a, JudgeFailed))
        if refuse is not None:
            raise ValueError(f"{refuse}: the {judge.name} judge could not answer the blind asks of {len(unasked)} of "
                             f"{n} questions, so they cannot be filtered; the first failure: {first}")  # fmt: skip
        log.warning("qa: the %s judge could not answer the blind asks of %d of %d questions (kept unfiltered): %s",
                    judge.name, len(unasked), n, first)  # fmt: skip
    return kept, report


def qa_scores(
    judge: Judge, captions: Sequence[str], questions: Sequence[Sequence[Question]], shuffles: int, seed: int = 0
) -> list[QAScore | JudgeFailed]:
    """:class:`QAScore` of ``captions[n]`` on ``questions[n]`` (each asked in ``shuffles`` orders), or the first
    failed ask of the caption; one batched judge call, the captions' asks taken in turn (each caption's first, then
    each one's second, ...): the asks of one caption whose prompts time out or fail are sent among the others'
    rather than all at once, so that the judge sees the others answered meanwhile and fails that caption alone
    (:class:`~finecap.judges.openai.OpenAIJudge`: ``judge.max_consecutive_failures``)."""
    if len(questions) != len(captions):
        raise ValueError(f"qa: {len(questions)} question lists for {len(captions)} captions")
    asks = [[Ask(q, options, caption) for q in qs for options in presentations(q, shuffles, seed)]
            for caption, qs in zip(captions, questions)]  # fmt: skip
    turns = [(n, k) for k in range(max(map(len, asks), default=0)) for n, mine in enumerate(asks) if k < len(mine)]
    by_caption: list[list[str | JudgeFailed]] = [[] for _ in asks]
    for (n, _), answer in zip(turns, judge.answer([asks[n][k] for n, k in turns]), strict=True):
        by_caption[n].append(answer)  # in k's order: the turns take each caption's asks in order
    out: list[QAScore | JudgeFailed] = []
    for mine, answers in zip(asks, by_caption):
        failure = next((a for a in answers if isinstance(a, JudgeFailed)), None)
        if failure is not None:
            out.append(failure)
            continue
        right = sum(a == ask.question.answer for a, ask in zip(answers, mine))
        cannot = sum(a == CANNOT_ANSWER for a in answers)
        out.append(QAScore(len(mine), right, cannot, len(mine) - right - cannot))
    return out
