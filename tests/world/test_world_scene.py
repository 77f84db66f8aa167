import random

import pytest

from finecap.world.scene import (
    BACKGROUNDS,
    CELLS,
    COLORS,
    LABEL_SIZES,
    PATTERNS,
    SHAPES,
    SIZES,
    VARIANTS,
    Obj,
    Scene,
    perturb,
    sample_family,
    sample_scene,
    scene_diff,
    scene_labels,
    validate,
)


def test_world_has_the_required_variety():
    assert len(BACKGROUNDS) >= 5 and len(SHAPES) >= 6 and len(COLORS) >= 8 and len(SIZES) >= 2
    assert len(PATTERNS) >= 1 and len(CELLS) == 9
    for words in (BACKGROUNDS, SHAPES, COLORS, SIZES, PATTERNS):
        assert len(set(words)) == len(words)


def test_sampled_scenes_follow_the_rules():
    rng = random.Random(0)
    counts = set()
    for i in range(300):
        scene = sample_scene(rng, i, 1, 4, pattern_prob=0.3)
        validate(scene)  # unique shapes and cells, known words
        counts.add(len(scene.objects))
    assert counts == {1, 2, 3, 4}
    rng = random.Random(0)
    assert all(len(sample_scene(rng, i, 2, 3).objects) in (2, 3) for i in range(50))


def test_sampling_is_deterministic():
    a = [sample_scene(random.Random("x"), i) for i in range(5)]
    b = [sample_scene(random.Random("x"), i) for i in range(5)]
    assert a == b


def test_to_dict_round_trip_and_errors():
    scene = sample_scene(random.Random(3), 7, 4, 4, pattern_prob=1.0)
    assert Scene.from_dict(scene.to_dict()) == scene
    bad = scene.to_dict()
    bad["objects"][1]["shape"] = bad["objects"][0]["shape"]
    with pytest.raises(ValueError, match="scene 7: shapes must be unique"):
        Scene.from_dict(bad)
    bad = scene.to_dict()
    bad["background"] = "lava"
    with pytest.raises(ValueError, match="background 'lava'"):
        Scene.from_dict(bad)
    with pytest.raises(ValueError, match="invalid scene record"):
        Scene.from_dict({"id": 1, "objects": []})
    for row in (True, 1.0, "1"):  # JSON true, 1.0 and "1" are no grid row (a bool is an int to Python)
        bad = scene.to_dict()
        bad["objects"][0]["row"] = row
        with pytest.raises(ValueError, match="scene 7: cell .*row and col must be integers"):
            Scene.from_dict(bad)


def test_scene_labels_are_hand_computed():
    scene = Scene(
        5, "water", [Obj("star", "blue", "small", 2, 1, "dotted"), Obj("circle", "red", "large", 0, 0, None)]
    )
    labels = scene_labels(scene)
    # star = SHAPES[3], blue = COLORS[5], small = SIZES[0], cell (2, 1) = 2*3+1 = 7, water = BACKGROUNDS[2], 2-1 = 1
    assert labels == {"shape": 3, "color": 5, "size": 0, "position": 7, "background": 2, "count": 1}
    assert set(LABEL_SIZES) == set(labels)
    assert LABEL_SIZES == {"shape": 6, "color": 8, "size": 2, "position": 9, "background": 6, "count": 4}


def test_every_variant_changes_exactly_one_detail():
    rng = random.Random(1)
    for i in range(60):
        base = sample_scene(rng, i, 1, 3, pattern_prob=0.5)
        for kind in VARIANTS:
            new = perturb(base, rng, kind, 1, 4)
            if kind == "size" and len(base.objects) > 1:
                assert new is None  # with company the main object must stay the only large one
                continue
            if kind == "remove" and len(base.objects) == 1:
                assert new is None
                continue
            if kind == "add" and base.objects[0].size == "small":
                assert new is None  # a small lone main object cannot get (small) company
                continue
            assert new is not None
            validate(new)
            diff = scene_diff(base, new)
            assert len(diff) == 1, (kind, diff)
            assert diff[0].split(":")[0] == kind
            assert new.objects[0].shape == base.objects[0].shape or kind == "shape"


def test_main_object_is_the_only_large_one_with_company():
    rng = random.Random(3)
    for i in range(300):
        scene = sample_scene(rng, i)
        sizes = [o.size for o in scene.objects]
        if len(sizes) > 1:
            assert sizes == ["large"] + ["small"] * (len(sizes) - 1)
        validate(scene)
    bad = Scene(0, "grass", [Obj("circle", "red", "small", 0, 0), Obj("star", "red", "large", 1, 1)])
    with pytest.raises(ValueError, match="only large one"):
        validate(bad)


def test_add_and_remove_respect_object_limits():
    rng = random.Random(0)
    four = sample_scene(rng, 0, 4, 4)
    one = sample_scene(rng, 1, 1, 1)
    assert perturb(four, rng, "add", 1, 4) is None
    assert perturb(one, rng, "remove", 1, 4) is None
    with pytest.raises(ValueError, match="unknown variant kind 'zoom'"):
        perturb(one, rng, "zoom")


def test_family_members_are_distinct_one_detail_variants():
    rng = random.Random(2)
    for f in range(30):
        members = sample_family(rng, 4, 100 * f, 1, 4, 0.3)
        assert [s.id for s, _ in members] == [100 * f + j for j in range(4)]
        (base, variant), rest = members[0], members[1:]
        assert variant == "base"
        sigs = {str(sorted(s.to_dict()["objects"], key=str)) + s.background for s, _ in members}
        assert len(sigs) == 4  # all different
        for scene, kind in rest:
            diff = scene_diff(base, scene)
            assert len(diff) == 1 and diff[0].split(":")[0] == kind


def test_scene_diff_hand_made():
    a = Scene(0, "grass", [Obj("circle", "red", "large", 0, 0), Obj("square", "blue", "small", 1, 1)])
    b = Scene(1, "sand", [Obj("circle", "green", "large", 0, 1), Obj("star", "blue", "small", 1, 1)])
    # background; square -> star swapped in place (shape change); circle colour and position
    assert scene_diff(a, b) == ["background", "shape:square", "color:circle", "position:circle"]
