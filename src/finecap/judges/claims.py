"""Claim precision and recall of captions through a judge, the one home of the computation the ``claims`` reward
and metric share (docs/methods/judges.md):

- precision = caption claims the subject supports / caption claims (1.0 when the caption claims nothing: nothing
  claimed, nothing false, as the world's faithfulness has it; the reward pays 0 there:
  :attr:`ClaimScore.reward_precision`);
- recall = reference claims (:meth:`~finecap.judges.base.Judge.reference_claims`) the caption supports / reference
  claims (0.0 when there are none);
- F1 = 2 P R / (P + R) (0 when both are 0).

The claims are sets, as the definitions count them: a claim the judge lists twice (``"a red circle"`` again, up to
case, spacing and a final full stop: :func:`distinct_claims`) counts once, so repeating a true sentence does not
raise a caption's precision, nor a repeated reference claim weigh twice in recall. (An LLM judge returns a list; what
counts as "the same claim" beyond that normalisation is left to the judge, as the papers leave it.)

On the world with the ``world`` judge these are exactly the faithfulness metric's precision and recall
(:func:`finecap.world.facts.faithfulness`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from finecap.judges.base import Judge, JudgeFailed, Subject


@dataclass(frozen=True)
class ClaimScore:
    """One caption's claim precision, recall and F1, and the counts they come from."""

    precision: float
    recall: float
    f1: float
    n_claims: int
    n_supported: int
    n_reference: int
    n_covered: int

    @property
    def reward_precision(self) -> float:
        """:attr:`precision` as the ``claims`` reward pays it: 0 when the caption claims nothing (0 of 0 claims
        supported). The metric's 1 (nothing claimed, nothing false) read as a reward pays a policy for saying
        nothing, the most a precision reward gives (docs/methods/judges.md)."""
        return self.precision if self.n_claims else 0.0


def f1(precision: float, recall: float) -> float:
    """The harmonic mean (0 when both are 0)."""
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


def claim_key(claim: str) -> str:
    """What identifies a claim within one caption's or one image's claims: case-folded, white space folded, a final
    full stop dropped."""
    return " ".join(claim.casefold().split()).removesuffix(".").rstrip()


def distinct_claims(claims: Sequence[str]) -> list[str]:
    """``claims`` without repeats (:func:`claim_key`), each kept where it first stands."""
    seen: set[str] = set()
    out = []
    for claim in claims:
        key = claim_key(claim)
        if key not in seen:
            seen.add(key)
            out.append(claim)
    return out


def claim_scores(judge: Judge, captions: Sequence[str], subjects: Sequence[Subject]) -> list[ClaimScore | JudgeFailed]:
    """:class:`ClaimScore` of ``captions[n]`` against ``subjects[n]`` (module docstring), or the first failure of the
    judge calls it needed. Four batched judge calls in all; the reference claims are asked once per distinct subject
    (the samples of one image share them: one answer, as docs/methods/judges.md says)."""
    if len(captions) != len(subjects):
        raise ValueError(f"claims: {len(subjects)} subjects for {len(captions)} captions")
    claims = [c if isinstance(c, JudgeFailed) else distinct_claims(c) for c in judge.claims(captions)]
    distinct: dict[tuple, Subject] = {}
    for s in subjects:
        distinct.setdefault(_subject_key(s), s)
    asked = dict(zip(distinct, judge.reference_claims(list(distinct.values())), strict=True))
    references = [r if isinstance(r, JudgeFailed) else distinct_claims(r)
                  for r in (asked[_subject_key(s)] for s in subjects)]  # fmt: skip
    ok = [n for n in range(len(captions)) if not isinstance(claims[n], JudgeFailed)
          and not isinstance(references[n], JudgeFailed)]  # fmt: skip
    supported = judge.supports([(claims[n], subjects[n]) for n in ok])  # type: ignore[misc]
    covered = judge.supports([(references[n], Subject(subjects[n].image_id, (captions[n],))) for n in ok])  # type: ignore[misc]
    out: list[ClaimScore | JudgeFailed] = [c if isinstance(c, JudgeFailed) else r for c, r in zip(claims, references)]  # type: ignore[misc]
    for n, s, c in zip(ok, supported, covered):
        if isinstance(s, JudgeFailed) or isinstance(c, JudgeFailed):
            out[n] = s if isinstance(s, JudgeFailed) else c  # type: ignore[assignment]
            continue
        n_claims, n_reference = len(claims[n]), len(references[n])  # type: ignore[arg-type]
        p = sum(s) / n_claims if n_claims else 1.0
        r = sum(c) / n_reference if n_reference else 0.0
        out[n] = ClaimScore(p, r, f1(p, r), n_claims, sum(s), n_reference, sum(c))
    return out


def _subject_key(subject: Subject) -> tuple:
    """What makes two subjects one: the image, its references and its scene's id (a scene is not hashable)."""
    return subject.image_id, subject.references, None if subject.scene is None else subject.scene.id
