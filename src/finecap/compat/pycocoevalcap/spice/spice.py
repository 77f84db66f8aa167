"""pycocoevalcap's ``Spice`` on :mod:`finecap.metrics.spice` (the same jars; :mod:`finecap.compat.pycocoevalcap`)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from finecap.compat.pycocoevalcap._inputs import scorer_inputs
from finecap.metrics.meteor import MetricUnavailable
from finecap.metrics.spice import spice_float, spice_results, spice_unavailable_reason


class Spice:
    """SPICE 1.0 as pycocoevalcap's ``Spice()``: pycocoevalcap's jar run by Java.

    Building it raises :class:`~finecap.metrics.meteor.MetricUnavailable` with one line saying what is missing (Java,
    the jar, or the Stanford CoreNLP jars that pycocoevalcap's ``Spice()`` would download: finecap never does).
    """

    def __init__(self):
        reason = spice_unavailable_reason()
        if reason is not None:
            raise MetricUnavailable(f"Spice(): {reason}")

    float_convert = staticmethod(spice_float)

    def compute_score(
        self, gts: Mapping[Hashable, Sequence[str]], res: Mapping[Hashable, Sequence[str]]
    ) -> tuple[np.float64, list[dict[str, dict[str, float]]]]:
        """``(mean F-score, [{category: {"pr", "re", "f", ...}} per item])``, items in sorted id order."""
        ids, cands, refs = scorer_inputs(gts, res, "Spice")
        done_ids, order, results = spice_results(dict(zip(ids, cands)), dict(zip(ids, refs)))
        ordered = [done_ids[j] for j in order]  # sorted ids, as pycocoevalcap
        average = np.mean(np.array([self.float_convert(results[i]["All"]["f"]) for i in ordered]))
        scores = [
            {cat: {k: self.float_convert(v) for k, v in tup.items()} for cat, tup in results[i].items()}
            for i in ordered
        ]
        return average, scores

    def method(self) -> str:
        return "SPICE"
