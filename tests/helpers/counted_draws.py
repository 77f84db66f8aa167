"""A numpy generator that counts the uniform keys drawn from it: the distractor draws of the retrieval metrics
(:mod:`finecap.metrics.retrieval`, :mod:`finecap.metrics.families`) are checked to draw only the rows of the captions
they score, whatever the pool's size."""

from __future__ import annotations

from typing import Any

import numpy as np


class CountedGenerator:
    """``rng`` (a ``numpy.random.Generator``) whose :meth:`random` counts the floats drawn in :attr:`drawn`; its bit
    generator is ``rng``'s, so a skip (``advance``) moves both and counts nothing."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng, self.drawn = rng, 0

    @property
    def bit_generator(self) -> Any:
        return self.rng.bit_generator

    def random(self, size: Any = None) -> Any:
        self.drawn += 1 if size is None else int(np.prod(size))
        return self.rng.random(size)
