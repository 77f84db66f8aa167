"""pycocoevalcap's ``Meteor`` on :mod:`finecap.metrics.meteor`, in Python (:mod:`finecap.compat.pycocoevalcap`)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from finecap.compat.pycocoevalcap._inputs import scorer_inputs
from finecap.metrics.meteor import MetricUnavailable, meteor_per_item, meteor_unavailable_reason


class Meteor:
    """METEOR 1.5 as pycocoevalcap's ``Meteor()`` (its jar's numbers, without Java: finecap reads the jar's data).

    Building it raises :class:`~finecap.metrics.meteor.MetricUnavailable` when pycocoevalcap's data is missing.
    """

    def __init__(self):
        reason = meteor_unavailable_reason()
        if reason is not None:
            raise MetricUnavailable(f"Meteor(): {reason}")

    def compute_score(
        self, gts: Mapping[Hashable, Sequence[str]], res: Mapping[Hashable, Sequence[str]]
    ) -> tuple[float, list[float]]:
        """``(corpus METEOR, [per-item METEOR])``, in the order of ``gts`` (the corpus score pools the statistics, as
        the jar's ``EVAL`` line: it is not the mean)."""
        _, cands, refs = scorer_inputs(gts, res, "Meteor")
        corpus, per = meteor_per_item(dict(enumerate(cands)), dict(enumerate(refs)))
        return corpus["METEOR"], [per[j]["METEOR"] for j in range(len(cands))]

    def method(self) -> str:
        return "METEOR"
