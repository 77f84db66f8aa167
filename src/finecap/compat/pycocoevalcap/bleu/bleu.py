"""pycocoevalcap's ``Bleu`` on :mod:`finecap.metrics.ngram` (:mod:`finecap.compat.pycocoevalcap`)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from finecap.compat.pycocoevalcap._inputs import scorer_inputs
from finecap.metrics.ngram.bleu_scorer import bleu_arrays


class Bleu:
    """BLEU-1..n as pycocoevalcap's ``Bleu(n)`` (reference length: the closest, ties to the shorter).

    >>> corpus, per = Bleu(4).compute_score({1: ["a red circle"], 2: ["a blue square"]},
    ...                                     {1: ["a red circle"], 2: ["a square"]})
    >>> [round(x, 4) for x in corpus], [round(x, 4) for x in per[0]]
    ([0.8187, 0.6685, 0.7152, 0.0234], [1.0, 0.6065])
    """

    def __init__(self, n: int = 4):
        self._n = n

    def compute_score(
        self, gts: Mapping[Hashable, Sequence[str]], res: Mapping[Hashable, Sequence[str]], verbose: int = 1
    ) -> tuple[list[float], list[list[float]]]:
        """``([BLEU-1 .. BLEU-n], [[per-item BLEU-k] for k in 1..n])``; ``verbose`` is ignored (nothing printed)."""
        _, cands, refs = scorer_inputs(gts, res, "Bleu")
        corpus, per = bleu_arrays(cands, refs, self._n)
        return corpus.tolist(), per.T.tolist()

    def method(self) -> str:
        return "Bleu"
