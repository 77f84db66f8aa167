"""Faithfulness metric: hand-computed precision / recall / hallucination counts over a few captions."""

from __future__ import annotations

import pytest

from finecap.metrics.faithfulness import faithfulness, faithfulness_per_item
from finecap.world.facts import FACT_KINDS
from finecap.world.scene import Obj, Scene

# One scene: grass, a large red circle in the middle (row 1, col 1) and a small blue square top left (row 0, col 0).
# Scene (recall) facts: background, count=2, and object/color/size/position of each object = 2 + 2 * 4 = 10.
SCENE = Scene(0, "grass", [Obj("circle", "red", "large", 1, 1), Obj("square", "blue", "small", 0, 0)])

# Captions, their stated facts and verdicts:
# a: object(circle), size(circle)=large, color(circle)=red, position(circle)=middle, background=grass
#    -> 5 stated, 5 true: precision 5/5 = 1, recall 5/10 = 0.5, no hallucination.
# b: object(circle) [true], color(circle)=blue [false], object(star) [false], color(star)=red [false]
#    -> 4 stated, 1 true: precision 1/4 = 0.25, recall 1/10 = 0.1; hallucinated: 2 color, 1 object.
# c: "" -> nothing stated: precision 1 (no claim), recall 0.
# d: count=2 [true], background=sand [false] -> precision 1/2, recall 1/10; hallucinated: 1 background.
CAPTIONS = {
    "a": "a large red circle in the middle on grass",
    "b": "a blue circle and a red star",
    "c": "",
    "d": "two shapes on sand",
}


def scenes_for(ids):
    return {i: SCENE for i in ids}


def test_corpus_scores_by_hand():
    out = faithfulness(CAPTIONS, scenes_for(CAPTIONS))
    # precision: (1 + 0.25 + 1 + 0.5) / 4 = 2.75 / 4 = 0.6875
    assert out["faith/precision"] == pytest.approx(0.6875)
    # recall: (0.5 + 0.1 + 0 + 0.1) / 4 = 0.7 / 4 = 0.175
    assert out["faith/recall"] == pytest.approx(0.175)
    # micro precision: true facts (5 + 1 + 0 + 1) / stated (5 + 4 + 0 + 2) = 7 / 11
    assert out["faith/precision_micro"] == pytest.approx(7 / 11)
    # facts per caption: 11 / 4; captions stating none: c -> 1 / 4
    assert out["faith/facts"] == pytest.approx(2.75)
    assert out["faith/no_facts"] == pytest.approx(0.25)
    # hallucinated facts: 0 + 3 + 0 + 1 = 4; captions with >= 1: b and d -> 2 / 4
    assert out["faith/hallucinated"] == 4.0
    assert out["faith/halluc_rate"] == pytest.approx(0.5)
    # per kind: color 2 (b), object 1 (b), background 1 (d), every other kind 0
    expected = dict.fromkeys(FACT_KINDS, 0.0) | {"color": 2.0, "object": 1.0, "background": 1.0}
    assert {k: out[f"faith/halluc/{k}"] for k in FACT_KINDS} == expected


def test_per_item_scores():
    _, items = faithfulness_per_item(CAPTIONS, scenes_for(CAPTIONS))
    assert (items["a"].precision, items["a"].recall) == (1.0, 0.5)
    assert (items["b"].precision, items["b"].recall) == (0.25, pytest.approx(0.1))
    assert sorted(str(f) for f in items["b"].hallucinated) == ["color(circle)=blue", "color(star)=red", "object(star)"]
    assert (items["c"].precision, items["c"].recall, items["c"].n_stated) == (1.0, 0.0, 0)


def test_all_silent_captions_have_micro_precision_one():
    out = faithfulness({0: "", 1: "the of"}, {0: SCENE, 1: SCENE})
    assert out["faith/precision_micro"] == 1.0
    assert out["faith/hallucinated"] == 0.0


def test_string_ids_find_integer_scenes():
    # JSON results may carry ids as strings: "7" finds scene 7.
    out = faithfulness({"7": "a red circle"}, {7: SCENE})
    assert out["faith/precision"] == 1.0


def test_missing_scene_is_named():
    with pytest.raises(ValueError, match="no scene graph.*'x'"):
        faithfulness({"x": "a red circle"}, {0: SCENE})


def test_empty_predictions_rejected():
    with pytest.raises(ValueError, match="no predictions"):
        faithfulness({}, {0: SCENE})
