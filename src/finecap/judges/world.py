"""The ``world`` judge: exact answers from the world's scene graphs and the captions' parsed facts
(:mod:`finecap.world.facts`), with an optional, seeded error rate (``judge.noise``).

What it answers, exactly:

- **a question** (:meth:`WorldJudge.answer`) asking the ``(kind, shape)`` fact of its ``fact`` field: the presented
  option whose value the caption states for that kind and shape (``color(circle)=red`` answers "red");
  :data:`CANNOT_ANSWER` when the caption states none of the options' values, when it states two or more values of
  that fact (``a red circle. a blue circle``: shapes are unique in a scene, so it contradicts itself and settles
  nothing; answered by the first stated option in the presented order, a caption listing every value would be paid
  1 / options a question for saying nothing), and always for a blind ask (no caption). A question without a
  ``fact`` field is a failure (the world judge reads no free text). With ``noise`` = p each answer is replaced, with
  probability p, by another presented option drawn uniformly; the draw is seeded by ``seed``, the caption, the
  question and the options, so a re-run flips the same answers;
- **claims**: the caption's facts (``str(Fact)``, e.g. ``color(circle)=red``); **reference claims**: the scene's
  recall facts (:func:`finecap.world.facts.scene_facts`), or without a scene the facts the references state;
- **supports**: a claim is supported by a subject with a scene when it is true in the scene
  (:func:`finecap.world.facts.is_true`), else when the subject's texts imply it (:func:`finecap.world.facts.entails`:
  they state it, a relation's converse, or a specific instance of a vague fact, as the world's grammar words one
  fact several ways);
- **rate**: 100 x the F1 of the claim precision and recall (:mod:`finecap.judges.claims`), the reason naming the
  false and the missing facts.

No answer is cached: computing one costs less than looking it up. Noise touches only the answers to questions, blind
asks included (a wrong judge guesses blind too): the blind filter then drops a question of ``n`` options asked in
``k`` distinct orders with probability ``(noise / n) ** k``
(docs/methods/judges.md#what-the-world-judge-answers-exactly).

The captions' facts are read as the world's grammar writes them: negation is not read ("no red circle" states the red
circle), nor are digits ("3 shapes" states nothing); docs/methods/judges.md lists what this judge disagrees with the
truth on.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from finecap.judges.base import CANNOT_ANSWER, Ask, Judge, JudgeFailed, Subject, refuse_unread
from finecap.world.facts import Fact, entails, facts, is_true, scene_facts

if TYPE_CHECKING:
    from finecap.config import Config


class WorldJudge(Judge):
    """The exact judge of the world (module docstring); ``noise`` in [0, 1], ``seed`` its draws'. An option only
    another judge reads (``retries=``, the ``openai`` judge's ``judge.retries``) is a ``TypeError`` saying so
    (:func:`~finecap.judges.base.refuse_unread`)."""

    name = "world"
    prompt_version = "world-1"

    def __init__(self, noise: float = 0.0, seed: int = 0, **unread: Any) -> None:
        refuse_unread(WorldJudge, unread)
        super().__init__()
        if not 0.0 <= noise <= 1.0:
            raise ValueError(f"judge.noise={noise}: must be in [0, 1]")
        self.noise, self.seed = float(noise), int(seed)
        self._facts: dict[str, Fact] = {}

    def identity(self) -> dict[str, Any]:
        return {**super().identity(), "noise": self.noise, "seed": self.seed}

    # questions ------------------------------------------------------------------------------------------------------

    def exact_answer(self, ask: Ask) -> str:
        """The error-free answer to ``ask`` (module docstring); ``ValueError`` for a question with no fact."""
        if ask.question.fact is None:
            raise ValueError(f"the world judge answers only questions with a 'fact'; {ask.question.id!r} has none")
        if ask.caption is None:
            return CANNOT_ANSWER
        kind, shape = ask.question.fact
        stated = {f.value for f in facts(ask.caption) if f.kind == kind and f.shape == shape}
        if len(stated) != 1:  # none, or a caption contradicting itself (module docstring): it settles nothing
            return CANNOT_ANSWER
        (value,) = stated
        return value if value in ask.options else CANNOT_ANSWER

    def _noisy(self, ask: Ask, exact: str) -> str:
        if self.noise == 0.0:
            return exact
        key = repr((self.seed, ask.caption, ask.question.id, ask.options)).encode()
        rng = random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))
        if rng.random() >= self.noise:
            return exact
        return rng.choice([o for o in ask.options if o != exact])

    def answer(self, asks: Sequence[Ask]) -> list[str | JudgeFailed]:
        out: list[str | JudgeFailed] = []
        for ask in asks:
            self.counts["calls"] += 1
            try:
                out.append(self._noisy(ask, self.exact_answer(ask)))
            except ValueError as e:
                self.counts["failed"] += 1
                out.append(JudgeFailed(str(e)))
        return out

    # claims ---------------------------------------------------------------------------------------------------------

    def _claims_of(self, stated: set[Fact]) -> list[str]:
        for f in stated:
            self._facts[str(f)] = f
        return sorted(str(f) for f in stated)

    def claims(self, texts: Sequence[str]) -> list[list[str] | JudgeFailed]:
        self.counts["calls"] += len(texts)
        return [self._claims_of(facts(t)) for t in texts]

    def reference_claims(self, subjects: Sequence[Subject]) -> list[list[str] | JudgeFailed]:
        self.counts["calls"] += len(subjects)
        out: list[list[str] | JudgeFailed] = []
        for s in subjects:
            stated = scene_facts(s.scene) if s.scene is not None else set().union(*(facts(r) for r in s.references))
            out.append(self._claims_of(stated))
        return out

    def supports(self, checks: Sequence[tuple[Sequence[str], Subject]]) -> list[list[bool] | JudgeFailed]:
        out: list[list[bool] | JudgeFailed] = []
        for claims, subject in checks:
            self.counts["calls"] += 1
            unknown = [c for c in claims if c not in self._facts]
            if unknown:
                self.counts["failed"] += 1
                out.append(JudgeFailed(f"the world judge checks only the claims it made; not {unknown[:3]}"))
                continue
            if subject.scene is not None:
                out.append([is_true(self._facts[c], subject.scene) for c in claims])
            else:
                stated = set().union(*(facts(r) for r in subject.references))
                out.append([entails(stated, self._facts[c]) for c in claims])
        return out

    def rate(self, pairs: Sequence[tuple[str, Subject]]) -> list[tuple[float, str] | JudgeFailed]:
        from finecap.judges.claims import claim_scores

        captions, subjects = [c for c, _ in pairs], [s for _, s in pairs]
        scores = claim_scores(self, captions, subjects)
        out: list[tuple[float, str] | JudgeFailed] = []
        for caption, subject, score in zip(captions, subjects, scores):
            if isinstance(score, JudgeFailed):
                out.append(score)
                continue
            stated = facts(caption)
            reference = {self._facts[c] for c in self.reference_claims([subject])[0]}  # type: ignore[union-attr]
            false = sorted(str(f) for f in stated if not _true(f, subject, reference))
            missing = sorted(str(f) for f in reference if not entails(stated, f))
            reason = (f"{score.n_supported} of {score.n_claims} stated facts hold, {score.n_covered} of "
                      f"{score.n_reference} reference facts stated; false: {', '.join(false) or 'none'}; missing: "
                      f"{', '.join(missing) or 'none'}")  # fmt: skip
            out.append((100.0 * score.f1, reason))
        return out


def _true(fact: Fact, subject: Subject, reference: set[Fact]) -> bool:
    """Whether ``fact`` holds by ``subject`` (:meth:`WorldJudge.supports`): true in its scene, else implied by the
    facts of its texts (``reference``, then the facts they state)."""
    return is_true(fact, subject.scene) if subject.scene is not None else entails(reference, fact)


def build(cfg: Config | None = None, *, noise: float | None = None, seed: int | None = None,
          **options: Any) -> WorldJudge:  # fmt: skip
    """Factory of the judge registry: ``judge.noise`` and ``judge.seed`` of ``cfg`` unless given; other ``options``
    go to :class:`WorldJudge`, which refuses them (another judge's saying whose)."""
    j = cfg.judge if cfg is not None else None
    return WorldJudge(noise if noise is not None else (j.noise if j else 0.0),
                      seed if seed is not None else (j.seed if j else 0), **options)  # fmt: skip
