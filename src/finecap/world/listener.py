"""A fact-based listener: picks the image a caption describes among candidates by reading their scene graphs.

Self-retrieval is trained *and* evaluated with the same CLIP-style retriever in the papers, so a caption can score
well by exploiting that retriever rather than by being discriminative to a person (DiscriTune Sec. 4.3 and SMILE
Table 2 guard against this with human studies). The world knows every scene's facts, so it can play the person:
this listener parses the caption into facts (:func:`finecap.world.facts.facts`, the same parser faithfulness uses)
and scores each candidate scene by

    support(caption, scene) = #(stated facts true in the scene) - #(stated facts false in the scene)

then ranks the candidates by support, highest first. Ties are broken uniformly at random (the listener guesses
among the candidates the caption cannot tell apart), with a seeded generator, and the rate of such guesses is
reported: a caption that states little leaves the listener guessing.

Choices the issue leaves open (stated here):

- A true fact counts +1 and a false fact -1, whatever its kind; every stated fact weighs the same, as for
  faithfulness precision. A caption that states nothing gives every candidate support 0 (a pure guess).
- The listener reads only what the fact parser reads (:mod:`finecap.world.facts`); words it does not know (a
  retriever may still use them) give it no information. That is the point: it measures what a caption *says*.
- Ties at the top are broken by a uniformly random order of the tied candidates, drawn from
  ``numpy.random.default_rng(seed)``; the expected R@1 of a caption whose target is tied with ``t`` others at the
  top is ``1 / (t + 1)``, which :func:`rank_with_ties` also returns (``expected`` R@1 is reported next to the
  drawn one).

Example::

    >>> from finecap.world.scene import Obj, Scene
    >>> a = Scene(0, "grass", [Obj("circle", "red", "large", 1, 1)])
    >>> b = Scene(1, "grass", [Obj("circle", "blue", "large", 1, 1)])
    >>> c = Scene(2, "sand", [Obj("square", "red", "small", 0, 0)])
    >>> support_matrix(["a red circle on grass"], [a, b, c]).tolist()   # a: 3 true; b: 2 true, 1 false; c: 0 - 3
    [[3, 1, -3]]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from finecap.world.facts import Fact, facts, is_true
from finecap.world.scene import Scene

__all__ = ["RankResult", "Listener", "rank_with_ties", "support", "support_matrix"]


def support(caption: str, scene: Scene) -> int:
    """True stated facts minus false stated facts of ``caption`` in ``scene``.

    >>> from finecap.world.scene import Obj, Scene
    >>> support("a blue circle", Scene(0, "grass", [Obj("circle", "red", "large", 1, 1)]))  # object +1, colour -1
    0
    """
    return sum(1 if is_true(f, scene) else -1 for f in facts(caption))


def support_matrix(captions: Sequence[str], scenes: Sequence[Scene]) -> np.ndarray:
    """Support ``(Q, N)`` of every caption for every scene (integers; see :func:`support`).

    Each distinct stated fact is checked once against every scene (a truth table ``(K, N)``); the matrix is then one
    product ``stated (Q, K) @ (2 * truth - 1) (K, N)``, so scoring 1,000 captions against 1,000 scenes takes well
    under a second.
    """
    stated = [facts(c) for c in captions]
    index: dict[Fact, int] = {}
    for fs in stated:
        for f in fs:
            index.setdefault(f, len(index))
    truth = np.empty((len(index), len(scenes)), dtype=np.int64)  # (K, N)
    for f, k in index.items():
        truth[k] = [is_true(f, s) for s in scenes]
    said = np.zeros((len(captions), len(index)), dtype=np.int64)  # (Q, K)
    for q, fs in enumerate(stated):
        said[q, [index[f] for f in fs]] = 1
    return said @ (2 * truth - 1)  # (Q, N): +1 per true fact, -1 per false fact


@dataclass
class RankResult:
    """Ranks of each query's target among its candidates, ties broken at random.

    ``ranks``: 1-based drawn rank ``(Q,)``; ``better``: candidates with strictly higher support ``(Q,)``; ``tied``:
    other candidates with the target's support ``(Q,)``; ``expected_r1``: probability ``(Q,)`` that the random
    tie-break puts the target first (``1 / (tied + 1)`` when nothing is better, else 0).
    """

    ranks: np.ndarray
    better: np.ndarray
    tied: np.ndarray

    @property
    def expected_r1(self) -> np.ndarray:
        return np.where(self.better == 0, 1.0 / (self.tied + 1), 0.0)

    @property
    def top_tie(self) -> np.ndarray:
        """Whether the listener had to guess for the top place: the target is tied for first with another."""
        return (self.better == 0) & (self.tied > 0)


def rank_with_ties(
    scores: np.ndarray, targets: np.ndarray, candidates: np.ndarray, rng: np.random.Generator
) -> RankResult:
    """Rank of ``targets[q]`` among the columns ``candidates[q]`` of ``scores`` (higher is better), ties at random.

    Args:
        scores: ``(Q, N)`` support of each query for each column.
        targets: ``(Q,)`` the target column per query.
        candidates: ``(Q, C)`` columns competing with the target (the target itself may be listed; it never
            competes with itself).
        rng: the tie-break generator; the target's place among its ``t`` tied rivals is uniform in ``0..t``.

    >>> r = rank_with_ties(np.array([[2, 2, 1, 3]]), np.array([0]), np.array([[1, 2, 3]]), np.random.default_rng(0))
    >>> int(r.better[0]), int(r.tied[0]), float(r.expected_r1[0])   # column 3 beats it, column 1 ties
    (1, 1, 0.0)
    """
    rows = np.arange(len(targets))
    own = scores[rows, targets]  # (Q,)
    cand = scores[rows[:, None], candidates]  # (Q, C)
    rival = candidates != targets[:, None]  # (Q, C)
    better = ((cand > own[:, None]) & rival).sum(axis=1)  # (Q,)
    tied = ((cand == own[:, None]) & rival).sum(axis=1)  # (Q,)
    ahead = rng.integers(0, tied + 1)  # (Q,) tied rivals placed before the target by the random order
    return RankResult(ranks=1 + better + ahead, better=better, tied=tied)


class Listener:
    """Ranks candidate scenes for a caption by their support (module docstring).

    Args:
        seed: seed of the tie-breaking generator (:meth:`rank` draws a fresh ``default_rng(seed)`` per call, so a
            call's result depends only on its arguments).

    Example::

        >>> from finecap.world.scene import Obj, Scene
        >>> scenes = [Scene(0, "grass", [Obj("circle", "red", "large", 1, 1)]),
        ...           Scene(1, "sand", [Obj("circle", "red", "large", 1, 1)])]
        >>> Listener().rank("a red circle on sand", scenes)  # scene 1: 3 true facts; scene 0: 2 true, 1 false
        [1, 0]
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def rank(self, caption: str, scenes: Sequence[Scene]) -> list[int]:
        """Indices of ``scenes`` from the one the caption fits best to the worst; ties in random (seeded) order."""
        score = support_matrix([caption], scenes)[0]  # (N,)
        noise = np.random.default_rng(self.seed).permutation(len(scenes))  # random order within equal support
        return [int(i) for i in np.lexsort((noise, -score))]

    def choose(self, caption: str, scenes: Sequence[Scene]) -> int:
        """Index of the scene the listener picks (the first of :meth:`rank`)."""
        return self.rank(caption, scenes)[0]
