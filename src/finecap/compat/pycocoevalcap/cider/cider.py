"""pycocoevalcap's ``Cider`` (CIDEr-D) on :mod:`finecap.metrics.ngram` (:mod:`finecap.compat.pycocoevalcap`)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from finecap.compat.pycocoevalcap._inputs import scorer_inputs
from finecap.metrics.ngram.index import RefIndex


class Cider:
    """CIDEr-D as pycocoevalcap's ``Cider()``: document frequencies from the scored references.

    >>> score, per = Cider().compute_score({1: ["a red circle"], 2: ["a blue square"]},
    ...                                    {1: ["a red circle"], 2: ["a square"]})
    >>> round(float(score), 4), per.round(4).tolist()
    (4.6217, [7.5, 1.7434])
    """

    def __init__(self, test: Any = None, refs: Any = None, n: int = 4, sigma: float = 6.0):
        self._n = n
        self._sigma = sigma

    def compute_score(
        self, gts: Mapping[Hashable, Sequence[str]], res: Mapping[Hashable, Sequence[str]]
    ) -> tuple[np.float64, np.ndarray]:
        """``(mean CIDEr-D, per-item CIDEr-D array)``, in the order of ``gts``."""
        _, cands, refs = scorer_inputs(gts, res, "Cider")
        index = RefIndex(refs, self._n, extra=cands)
        per = index.cider(cands, np.arange(len(cands)), self._sigma)
        return np.mean(per), per

    def method(self) -> str:
        return "CIDEr"
