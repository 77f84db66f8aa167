"""The fact-based listener on hand-built scenes and captions: exact supports and rankings."""

from __future__ import annotations

import numpy as np
import pytest

from finecap.world.listener import Listener, rank_with_ties, support, support_matrix
from finecap.world.scene import Obj, Scene

# Four scenes that differ in one or two details each.
RED_CIRCLE_GRASS = Scene(0, "grass", [Obj("circle", "red", "large", 1, 1)])
BLUE_CIRCLE_GRASS = Scene(1, "grass", [Obj("circle", "blue", "large", 1, 1)])
RED_CIRCLE_SAND = Scene(2, "sand", [Obj("circle", "red", "large", 1, 1)])
TWO_OBJECTS = Scene(3, "grass", [Obj("circle", "red", "large", 0, 0), Obj("square", "green", "small", 2, 2)])
SCENES = [RED_CIRCLE_GRASS, BLUE_CIRCLE_GRASS, RED_CIRCLE_SAND, TWO_OBJECTS]


def test_support_counts_true_for_and_false_against() -> None:
    # "a red circle on grass": object(circle), color(circle)=red, background=grass.
    # scene 0: 3 true -> 3; scene 1: object, grass true, red false -> 2 - 1 = 1; scene 2: object, red true, grass
    # false -> 1; scene 3: all three true -> 3.
    assert support_matrix(["a red circle on grass"], SCENES).tolist() == [[3, 1, 1, 3]]
    # "a red circle on grass at the bottom right": adds position(circle)=bottom right, false everywhere (circle sits
    # in the middle or top left): 3 - 1 = 2, 1 - 1 = 0, 0, 3 - 1 = 2.
    assert support_matrix(["a red circle on grass at the bottom right"], SCENES).tolist() == [[2, 0, 0, 2]]
    # a relation: "a red circle above a green square" -> object(circle), color(circle)=red, object(square),
    # color(square)=green, relation(circle above square). Scene 3: all 5 true -> 5. Scenes 0-2 have no square:
    # object(square), color(square), relation false (-3); circle true, red true in 0 and 2 (+2), red false in 1.
    assert support_matrix(["a red circle above a green square"], SCENES).tolist() == [[-1, -3, -1, 5]]
    assert support("", RED_CIRCLE_GRASS) == 0  # states nothing: no evidence either way


def test_rank_orders_by_support_and_breaks_ties_with_the_seed() -> None:
    listener = Listener(seed=0)
    # Support [3, 1, 1, 3]: scenes 0 and 3 lead, 1 and 2 follow; order within the tied pairs is the seeded noise.
    ranking = listener.rank("a red circle on grass", SCENES)
    assert sorted(ranking[:2]) == [0, 3] and sorted(ranking[2:]) == [1, 2]
    assert listener.rank("a red circle on grass", SCENES) == ranking  # same seed, same order
    # A caption naming the square and the colours leaves no tie: [-1, -3, -1, 5] -> 3 first, 1 last.
    order = listener.rank("a red circle above a green square", SCENES)
    assert order[0] == 3 and order[-1] == 1
    # A caption that says sand separates scene 2 from everything: supports [1, -1, 3, 1].
    assert support_matrix(["a red circle on sand"], SCENES).tolist() == [[1, -1, 3, 1]]
    assert listener.choose("a red circle on sand", SCENES) == 2
    # Exact full ranking: "a blue circle on grass" -> [1, 3, -1, 1] (scene 3: circle, grass true, blue false):
    # 1 first, then 0 and 3 tied, then 2.
    order = listener.rank("a blue circle on grass", SCENES)
    assert order[0] == 1 and sorted(order[1:3]) == [0, 3] and order[3] == 2


def test_ties_are_uniform_over_seeds() -> None:
    # "a circle" is true of every scene: all four tie, so each scene is chosen first about a quarter of the time.
    firsts = [Listener(seed=s).choose("a circle", SCENES) for s in range(400)]
    shares = np.bincount(firsts, minlength=4) / 400
    assert np.all(np.abs(shares - 0.25) < 0.08), shares  # binomial sd sqrt(.25*.75/400) = 0.022; 0.08 is 3.6 sd


def test_rank_with_ties_counts_better_and_tied() -> None:
    scores = np.array([[3, 1, 1, 3], [1, -1, 3, 1]])
    targets = np.array([0, 2])
    candidates = np.array([[0, 1, 2, 3], [0, 1, 2, 3]])
    r = rank_with_ties(scores, targets, candidates, np.random.default_rng(0))
    # query 0: target 3, rival 3 ties (1 tied), none better -> expected R@1 1/2, a top tie, rank 1 or 2.
    # query 1: target 3, all rivals lower -> rank 1, expected 1, no tie.
    assert r.better.tolist() == [0, 0] and r.tied.tolist() == [1, 0]
    assert r.expected_r1.tolist() == [0.5, 1.0] and r.top_tie.tolist() == [True, False]
    assert r.ranks[0] in (1, 2) and r.ranks[1] == 1
    # Over many draws the tied target is first half of the time.
    ranks = [rank_with_ties(scores, targets, candidates, np.random.default_rng(s)).ranks[0] for s in range(400)]
    assert abs(np.mean(np.array(ranks) == 1) - 0.5) < 0.1  # sd 0.025


@pytest.mark.parametrize("caption", ["", "the thing", "zzz unknown words"])
def test_a_caption_that_states_nothing_leaves_a_pure_guess(caption: str) -> None:
    assert support_matrix([caption], SCENES).tolist() == [[0, 0, 0, 0]]
