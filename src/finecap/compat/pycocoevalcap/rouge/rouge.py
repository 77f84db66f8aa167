"""pycocoevalcap's ``Rouge`` on :mod:`finecap.metrics.ngram` (:mod:`finecap.compat.pycocoevalcap`)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from finecap.compat.pycocoevalcap._inputs import scorer_inputs
from finecap.metrics.ngram.rouge_scorer import rouge_l_arrays


class Rouge:
    """ROUGE-L (beta 1.2) as pycocoevalcap's ``Rouge()``.

    >>> score, per = Rouge().compute_score({1: ["a red circle"], 2: ["a cat"]}, {1: ["a red circle"], 2: ["two dogs"]})
    >>> float(score), per.tolist()
    (0.5, [1.0, 0.0])
    """

    def __init__(self):
        self.beta = 1.2

    def compute_score(
        self, gts: Mapping[Hashable, Sequence[str]], res: Mapping[Hashable, Sequence[str]]
    ) -> tuple[np.float64, np.ndarray]:
        """``(mean ROUGE-L, per-item ROUGE-L array)``, in the order of ``gts``."""
        _, cands, refs = scorer_inputs(gts, res, "Rouge")
        per = rouge_l_arrays(cands, refs)
        return np.mean(per), per

    def method(self) -> str:
        return "Rouge"
