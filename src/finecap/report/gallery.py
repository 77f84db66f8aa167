"""What the report's galleries show: which images, how much the stages disagree on them, every stated fact checked
against the scene, and each stage's retrieval outcome inside a TrueMatch bag.

Choices the issue leaves open:

- **Disagreement** of the stages on an image is the mean, over pairs of stages, of ``1 - Jaccard`` of the two
  captions' word sets (:func:`~finecap.metrics.diversity.caption_words`): 0 when every stage says the same words,
  1 when no two captions share a word. The gallery shows the images with the highest disagreement next to a random
  sample (seeded).
- **Facts** are those :func:`finecap.world.facts.facts` parses from a caption, each marked true or false by
  :func:`finecap.world.facts.is_true` on the image's scene; they are listed (sorted, as ``str(fact)``) under the
  caption rather than mapped back onto words, since the lenient parser does not keep word positions.
- **Bag outcome** of a caption: the bag image its caption scores highest (the retrieved image) and the rank of its own
  image within the bag (:func:`finecap.metrics.retrieval.target_ranks`, ties counted against it, as the ``bags``
  metric does); the caption is correct when that rank is 1.

Example::

    >>> round(disagreement(["a red circle", "a red circle", "a blue square"]), 4)   # pairs: 0, 0.8, 0.8
    0.5333
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from finecap.metrics.diversity import caption_words
from finecap.metrics.retrieval import target_ranks
from finecap.world.facts import facts, is_true

if TYPE_CHECKING:
    from finecap.world.scene import Scene


def disagreement(captions: Sequence[str]) -> float:
    """Mean pairwise ``1 - |A ∩ B| / |A ∪ B|`` of the captions' word sets (0.0 for fewer than two captions)."""
    sets = [set(caption_words(c)) for c in captions]
    pairs = list(itertools.combinations(sets, 2))
    if not pairs:
        return 0.0
    return sum(1.0 - (len(a & b) / len(a | b) if a | b else 1.0) for a, b in pairs) / len(pairs)


def select_images(
    captions: Mapping[str, Mapping[Hashable, str]], n_sample: int, n_disagree: int, seed: int = 0
) -> tuple[list[Hashable], list[tuple[Hashable, float]]]:
    """``(random sample, [(image, disagreement), ...] most disagreed first)`` among images every stage captioned;
    the two lists do not overlap."""
    stages = [s for s, caps in captions.items() if caps]
    if not stages:
        return [], []
    common = [i for i in captions[stages[0]] if all(i in captions[s] for s in stages[1:])]
    scored = sorted(((i, disagreement([captions[s][i] for s in stages])) for i in common), key=lambda t: -t[1])
    top = scored[:n_disagree]
    chosen = {i for i, _ in top}
    rest = [i for i in common if i not in chosen]
    sample = random.Random(seed).sample(rest, min(n_sample, len(rest)))
    return sample, top


@dataclass
class FactCheck:
    """One stated fact (``str(fact)``) and whether the scene makes it true."""

    fact: str
    true: bool


def check_facts(caption: str, scene: Scene) -> list[FactCheck]:
    """Every fact the caption states, true or false on ``scene``, sorted by their text.

    Example::

        >>> from finecap.world.scene import Obj, Scene
        >>> scene = Scene(0, "grass", [Obj("circle", "red", "large", 1, 1)])
        >>> [(c.fact, c.true) for c in check_facts("a blue circle", scene)]
        [('color(circle)=blue', False), ('object(circle)', True)]
    """
    return [FactCheck(str(f), is_true(f, scene)) for f in sorted(facts(caption), key=str)]


@dataclass
class BagOutcome:
    """A caption's retrieval inside its bag: the image it describes, the bag image it scores highest, its image's rank
    within the bag (1 = retrieved)."""

    image: Hashable
    retrieved: Hashable
    rank: int

    @property
    def correct(self) -> bool:
        return self.rank == 1


def bag_outcomes(scores: Any, bag: Sequence[Hashable], columns: Mapping[Hashable, int]) -> list[BagOutcome]:
    """Outcome of each bag image's caption; ``scores`` ``(len(bag), N)`` holds the caption of ``bag[q]`` in row ``q``
    scored against every image, ``columns`` maps image ids to score columns. A tie counts against the caption (as
    ``bagN/R@1`` counts it): the image shown as retrieved is then the other one.

    Example (the caption of image 7 scores it and image 9 alike; image 8's prefers its own; image 9's prefers 8)::

        >>> out = bag_outcomes([[0.4, 0.0, 0.4], [0.1, 0.5, 0.3], [0.2, 0.9, 0.1]], [7, 8, 9], {7: 0, 8: 1, 9: 2})
        >>> [(o.image, o.retrieved, o.rank, o.correct) for o in out]
        [(7, 9, 2, False), (8, 8, 1, True), (9, 8, 3, False)]
    """
    scores = np.asarray(scores, dtype=np.float64)
    cols = np.array([columns[i] for i in bag], dtype=np.int64)  # (S,)
    if scores.shape[0] != len(bag):
        raise ValueError(f"bag_outcomes: {scores.shape[0]} score rows for a bag of {len(bag)} images")
    ranks = target_ranks(scores, cols, np.broadcast_to(cols, (len(bag), len(cols))))  # (S,)
    others = scores[:, cols]  # (S, S) each caption against the bag's images
    others[np.arange(len(bag)), np.arange(len(bag))] = -np.inf  # its own image left out
    best = np.where(ranks == 1, np.arange(len(bag)), others.argmax(axis=1))  # (S,) position in the bag retrieved
    return [BagOutcome(bag[q], bag[int(best[q])], int(ranks[q])) for q in range(len(bag))]
