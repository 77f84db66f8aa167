import random

import pytest

from finecap.world.captions import (
    TEMPLATES,
    _Writer,
    applicable_templates,
    dense_caption,
    reference_captions,
    relations,
    template_caption,
)
from finecap.world.facts import Fact, facts, faithfulness, is_true, scene_facts
from finecap.world.scene import CELLS, Obj, Scene, sample_scene

# circle: top left, red, large, striped; square: middle, blue, small, plain; star: bottom right, yellow, large, dotted
SCENE = Scene(
    0,
    "grass",
    [
        Obj("circle", "red", "large", 0, 0, "striped"),
        Obj("square", "blue", "small", 1, 1, None),
        Obj("star", "yellow", "large", 2, 2, "dotted"),
    ],
)
N_TRUE = 16  # 3 objects x (object, color, size, position) = 12, + 2 patterns, + background, + count


def test_scene_facts_hand_counted():
    truth = scene_facts(SCENE)
    assert len(truth) == N_TRUE
    assert Fact("pattern", "square", None) not in truth  # plain objects have no pattern fact
    assert Fact("position", "star", "bottom right") in truth
    assert Fact("count", None, "3") in truth and Fact("background", None, "grass") in truth


def test_fact_strings():
    assert str(Fact("color", "circle", "red")) == "color(circle)=red"
    assert str(Fact("color", None, "red")) == "color(*)=red"
    assert str(Fact("relation", "circle", "left of", None)) == "relation(circle left of *)"
    assert str(Fact("object", "star")) == "object(star)"
    assert str(Fact("count", None, "2")) == "count=2"


CASES = [
    # caption, n_stated, n_correct, n_recalled, hallucinated
    ("a large red striped circle at the top left", 5, 5, 5, []),
    # circle red ok; square ok; square is blue not green; background is grass not sand
    ("a red circle and a green square on sand", 5, 3, 3, ["background=sand", "color(square)=green"]),
    # repetition collapses to object(circle), color(circle)=red, background=grass
    ("red red circle circle circle on on grass grass", 3, 3, 3, []),
    # truncated: the relation has no second noun, so it states nothing; the square is small
    ("a big blue square above a", 3, 2, 2, ["size(square)=large"]),
    # circle (row 0) is above star (row 2): true; square (col 1) is not left of circle (col 0)
    ("a circle above a star and a square left of a circle", 5, 4, 3, ["relation(square left of circle)"]),
    # vague: some object is blue (square): true, none is purple; some pair has one below the other: true
    ("a blue shape below a purple thing", 3, 2, 0, ["color(*)=purple"]),
    ("four shapes on the lawn", 2, 1, 1, ["count=4"]),
    # shuffled: the position attaches to the latest noun (circle); the dangling "red" is dropped
    ("circle the top left at red a", 2, 2, 2, []),
    # a position before any noun attaches to the next noun
    ("in the middle a small square", 3, 3, 3, []),
    ("two circles", 2, 1, 1, ["count=2"]),
    ("a star at the top", 2, 1, 1, ["position(star)=top"]),
    # contradictory adjectives are both stated; upper right = top right
    ("a red yellow star in the upper right", 4, 2, 2, ["color(star)=red", "position(star)=top right"]),
]


@pytest.mark.parametrize(("caption", "n_stated", "n_correct", "n_recalled", "hallucinated"), CASES)
def test_hand_written_captions(caption, n_stated, n_correct, n_recalled, hallucinated):
    f = faithfulness(caption, SCENE)
    assert f.n_stated == n_stated
    assert f.n_correct == n_correct
    assert f.n_recalled == n_recalled
    assert f.n_true == N_TRUE
    assert [str(h) for h in f.hallucinated] == hallucinated
    assert f.precision == pytest.approx(n_correct / n_stated)
    assert f.recall == pytest.approx(n_recalled / N_TRUE)


def test_hand_written_precision_values():
    # a red circle (2 true) and a green square (1 true, 1 false) on sand (false): 3 / 5 = 0.6; recall 3 / 16
    f = faithfulness("a red circle and a green square on sand", SCENE)
    assert (f.precision, f.recall) == (pytest.approx(0.6), pytest.approx(3 / 16))
    # a blue shape (true) below (true) a purple thing (false): 2 / 3; recall 0 (vague facts are precision-only)
    f = faithfulness("a blue shape below a purple thing", SCENE)
    assert (f.precision, f.recall) == (pytest.approx(2 / 3), 0.0)


def test_exact_fact_sets():
    assert facts("a red circle left of a big star on the beach") == {
        Fact("object", "circle"),
        Fact("color", "circle", "red"),
        Fact("object", "star"),
        Fact("size", "star", "large"),
        Fact("relation", "circle", "left of", "star"),
        Fact("background", None, "sand"),
    }
    assert facts("a single disc") == {Fact("count", None, "1"), Fact("object", "circle")}
    assert facts("a shape at the top") == {Fact("position", None, "top")}


def test_a_corner_of_the_picture_is_a_position_not_a_relation():
    """The words "right of the image" name where in the picture, not a relation to the next shape."""
    assert facts("a red circle at the bottom right of the image next to a square") == {
        Fact("object", "circle"), Fact("color", "circle", "red"), Fact("object", "square"),
        Fact("position", "circle", "bottom right"),
    }  # fmt: skip
    for frame in ("the picture", "this picture", "an image", "image"):
        assert facts(f"a star on the left of {frame}") == {Fact("object", "star"), Fact("position", "star", "left")}
    assert Fact("relation", "circle", "right of", "square") in facts("a circle right of the square at the bottom")


@pytest.mark.parametrize("caption", ["", "the and of a", "with with in at", "shape thing object"])
def test_nothing_stated_gives_precision_one(caption):
    f = faithfulness(caption, SCENE)
    assert (f.precision, f.recall, f.n_stated, f.hallucinated) == (1.0, 0.0, 0, [])


def test_punctuation_and_case_are_ignored():
    assert facts("A Red circle, on GRASS.") == facts("a red circle on grass")


def test_relation_truth_table():
    circle, square = SCENE.objects[0], SCENE.objects[1]
    assert (circle.col, square.col, circle.row, square.row) == (0, 1, 0, 1)
    assert is_true(Fact("relation", "circle", "left of", "square"), SCENE)
    assert is_true(Fact("relation", "circle", "above", "square"), SCENE)
    assert not is_true(Fact("relation", "circle", "right of", "square"), SCENE)
    assert not is_true(Fact("relation", "circle", "below", "square"), SCENE)
    assert is_true(Fact("relation", "square", "below", None), SCENE)  # the square is below the circle
    assert not is_true(Fact("relation", "circle", "above", "circle"), SCENE)  # an object is not related to itself
    assert not is_true(Fact("relation", "circle", "left of", "cross"), SCENE)  # no cross
    with pytest.raises(ValueError, match="unknown fact kind"):
        is_true(Fact("smell", "circle", "sweet"), SCENE)


def test_dense_captions_are_complete_and_exact():
    rng = random.Random(0)
    for i in range(300):
        scene = sample_scene(rng, i, 1, 4, pattern_prob=0.4)
        f = faithfulness(dense_caption(scene), scene)
        assert (f.precision, f.recall) == (1.0, 1.0), dense_caption(scene)
        assert facts(dense_caption(scene)) == scene_facts(scene)


def test_every_template_has_precision_one():
    rng = random.Random(1)
    for i in range(400):
        scene = sample_scene(rng, i, 1, 4, pattern_prob=0.4)
        captions = [template_caption(t, scene, rng) for t in applicable_templates(scene)]
        for c in captions + reference_captions(scene, rng):
            f = faithfulness(c, scene)
            assert f.precision == 1.0, (c, [str(h) for h in f.hallucinated])
            assert f.n_stated >= 2  # at least the main object and one more fact
            assert Fact("object", scene.main.shape) in facts(c)


def test_captions_of_another_scene_hallucinate():
    rng = random.Random(2)
    a = Scene(0, "snow", [Obj("circle", "red", "large", 0, 0)])
    b = Scene(1, "water", [Obj("triangle", "green", "small", 2, 2)])
    for c in reference_captions(a, rng):
        f = faithfulness(c, b)
        assert f.precision < 1.0 and Fact("object", "circle") in f.hallucinated


def test_corrupting_a_dense_caption_lowers_precision_by_the_hand_count():
    dense = dense_caption(SCENE)
    # "three shapes on grass a large red striped circle at the top left a small blue square in the middle and a
    # large yellow dotted star at the bottom right": swap one colour and one background word
    corrupted = dense.replace("blue", "pink").replace("grass", "snow")
    f = faithfulness(corrupted, SCENE)
    # 16 stated facts, 2 false -> precision 14/16; the 14 true ones are all recall facts -> recall 14/16
    assert (f.n_stated, f.n_correct, f.n_recalled) == (16, 14, 14)
    assert [str(h) for h in f.hallucinated] == ["background=snow", "color(square)=pink"]
    # truncation keeps precision, drops recall: "three shapes on grass a large red striped circle" = 6 facts
    f = faithfulness(" ".join(dense.split()[:9]), SCENE)
    assert (f.precision, f.n_recalled) == (1.0, 6)


def _stated(facets: set, scene: Scene) -> tuple[set[Fact], tuple | None]:
    """The facts a template's facets say its caption states (a vague noun's attributes and position: shape None), and
    the relation facet ``("relation", a, b)`` if any (its word is the template's draw)."""
    by = {o.shape: o for o in scene.objects}
    vague = {f[1] for f in facets if f[0] == "vague"}
    out: set[Fact] = set()
    for f in facets:
        if f[0] == "object":
            out.add(Fact("object", f[1]))
        elif f[0] in ("color", "size", "pattern"):
            out.add(Fact(f[0], f[1], getattr(by[f[1]], f[0])))
        elif f[0] == "vague":
            out.add(Fact(f[2], None, getattr(by[f[1]], f[2])))
        elif f[0] == "position":
            out.add(Fact("position", None if f[1] in vague else f[1], CELLS[by[f[1]].cell]))
        elif f[0] == "background":
            out.add(Fact("background", None, scene.background))
        elif f[0] == "count":
            out.add(Fact("count", None, str(len(scene.objects))))
    relation = next((f for f in facets if f[0] == "relation"), None)
    if relation is not None:
        relation = (None if relation[1] in vague else relation[1], None if relation[2] in vague else relation[2])
    return out, relation


@pytest.mark.parametrize("style", ["none", "domain"])
def test_the_parser_reads_back_exactly_what_every_template_states(style):
    # Round trip: the fact parser must read each caption the world writes into the facts its template put in, no more
    # and no fewer (plural counts, "a single", vague nouns, positions, relations, synonyms of either annotator style).
    rng = random.Random(3)
    for i in range(300):
        scene = sample_scene(rng, i, 1, 4, pattern_prob=0.5)
        writer = _Writer(scene, rng, style)
        for name in applicable_templates(scene) * 2:
            text, facets = TEMPLATES[name](writer)
            writer.mentioned |= facets
            want, relation = _stated(facets, scene)
            got = facts(text)
            assert {f for f in got if f.kind != "relation"} == want, (text, sorted(map(str, want)))
            said = [(f.shape, f.other) for f in got if f.kind == "relation"]
            assert said == ([relation] if relation else []), (text, said)
            a = {o.shape: o for o in scene.objects}
            for f in got:  # the relation word is one that holds between the two cells
                if f.kind == "relation" and f.shape and f.other:
                    assert f.value in relations(a[f.shape], a[f.other]), text
