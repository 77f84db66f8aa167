"""The world's exact BlendCap / HolisticCap: rendering round-trips through the fact parser; blend and merge rules on
hand-built captions."""

import random

from finecap.boost.world_facts import blend_facts, conflicts, holistic_facts, render_facts
from finecap.world.captions import dense_caption, reference_captions, relations
from finecap.world.facts import Fact, facts
from finecap.world.scene import sample_scene


def test_render_round_trips_every_world_caption():
    rng = random.Random(0)
    for i in range(300):
        scene = sample_scene(rng, i)
        caps = reference_captions(scene, rng) + [dense_caption(scene)]
        for c in caps:
            assert facts(render_facts(facts(c))) == facts(c), c
        union = blend_facts(caps[:5])
        assert facts(render_facts(union)) == union


def test_render_hand_built_sets():
    # Contradictory colours, two positions, a vague fact and relations with a vague side all survive.
    stated = {
        Fact("object", "circle"),
        Fact("color", "circle", "red"),
        Fact("color", "circle", "blue"),
        Fact("position", "circle", "top left"),
        Fact("position", "circle", "middle"),
        Fact("color", None, "green"),
        Fact("relation", "circle", "left of", None),
        Fact("relation", None, "above", "square"),
        Fact("object", "square"),
        Fact("count", None, "1"),
    }
    text = render_facts(stated)
    assert text == (
        "one shape a blue red circle in the middle at the top left and a square and a green shape "
        "and the shape above the square and the circle left of the shape"
    )
    assert facts(text) == stated
    assert render_facts(set()) == ""


def test_blend_is_the_union_of_the_human_facts():
    caps = ["a red circle on grass", "a large circle at the top left", "two shapes with a circle and a blue square"]
    # red circle + grass | large circle + position | count 2 + circle + blue square
    assert blend_facts(caps) == {
        Fact("object", "circle"), Fact("color", "circle", "red"), Fact("background", None, "grass"),
        Fact("size", "circle", "large"), Fact("position", "circle", "top left"), Fact("count", None, "2"),
        Fact("object", "square"), Fact("color", "square", "blue"),
    }  # fmt: skip
    assert (
        render_facts(blend_facts(caps)) == "two shapes on grass a large red circle at the top left and a blue square"
    )


def test_holistic_keeps_human_facts_and_adds_only_non_conflicting_visual_facts():
    human = facts("a red circle at the top left above a blue square on grass")
    # The visual expert: circle colour wrong (conflict), circle size new, square position new and consistent with
    # "circle above square" only if the square is below row 0 (bottom: fine), background wrong (conflict), a new
    # star (no human statement: kept even though the world may not have one), count new.
    visual = facts("three shapes on sand a large green circle at the top left and a blue square at the bottom "
                   "and a small star in the middle")  # fmt: skip
    merged = holistic_facts(human, visual)
    assert Fact("color", "circle", "green") not in merged and Fact("color", "circle", "red") in merged
    assert Fact("background", None, "sand") not in merged and Fact("background", None, "grass") in merged
    added = merged - human
    assert added == {
        Fact("size", "circle", "large"), Fact("position", "square", "bottom"), Fact("object", "star"),
        Fact("size", "star", "small"), Fact("position", "star", "middle"), Fact("count", None, "3"),
    }  # fmt: skip


def test_relation_conflicts():
    human = {Fact("relation", "circle", "left of", "square"), Fact("position", "star", "top left"),
             Fact("position", "cross", "bottom right")}  # fmt: skip
    assert conflicts(Fact("relation", "circle", "right of", "square"), human)  # opposite relation
    assert conflicts(Fact("relation", "square", "left of", "circle"), human)  # swapped sides
    assert not conflicts(Fact("relation", "circle", "above", "square"), human)  # not stated either way
    assert conflicts(Fact("relation", "star", "below", "cross"), human)  # positions say star is above the cross
    assert not conflicts(Fact("relation", "star", "left of", "cross"), human)
    assert not conflicts(Fact("color", None, "red"), {Fact("color", "circle", "blue")})  # vague: never


def test_a_visual_position_contradicting_a_human_relation_is_dropped():
    # The review's case: humans "a red circle left of a blue square", the expert "circle on the right": no square can
    # be right of a circle in the right column, so the human relation wins and the caption does not contradict itself.
    human = facts("a red circle left of a blue square")
    visual = facts("a large red circle on the right and a small blue square at the top left")
    merged = holistic_facts(human, visual)
    assert Fact("position", "circle", "right") not in merged
    assert Fact("position", "square", "top left") not in merged  # nothing is left of a square in the left column
    assert merged - human == {Fact("size", "circle", "large"), Fact("size", "square", "small")}
    assert render_facts(merged) == "a large red circle and a small blue square and the circle left of the square"
    # The relation stated the other way round ("square right of circle") binds the positions the same way.
    assert conflicts(Fact("position", "circle", "right"), facts("a square right of a circle"))
    # A position that fits the relation is kept, also against a human position of the other side.
    assert not conflicts(Fact("position", "circle", "left"), human)
    with_square = human | {Fact("position", "square", "top")}
    assert not conflicts(Fact("position", "circle", "bottom left"), with_square)
    assert conflicts(Fact("position", "circle", "top right"), with_square)  # the square's column is 1: 2 is not left
    assert conflicts(Fact("position", "circle", "top"), with_square)  # same column
    # Rows: a circle above a square is not in the bottom row; a vague side binds the named one too.
    assert conflicts(Fact("position", "circle", "bottom left"), facts("a circle above a square"))
    assert not conflicts(Fact("position", "circle", "middle"), facts("a circle above a square"))
    assert conflicts(Fact("position", "circle", "top"), facts("a circle below a shape"))


def test_a_visual_relation_contradicting_one_human_position_is_dropped():
    # Humans place only the circle; on the right it is left of nothing, wherever the square is.
    human = facts("a red circle on the right and a square")
    assert conflicts(Fact("relation", "circle", "left of", "square"), human)
    assert conflicts(Fact("relation", "square", "right of", "circle"), human)
    assert not conflicts(Fact("relation", "circle", "right of", "square"), human)
    assert not conflicts(Fact("relation", "circle", "above", "square"), human)  # row 1: a square below fits
    assert conflicts(Fact("relation", "circle", "left of", None), human)  # vague other side: no cell fits either
    assert not conflicts(Fact("relation", None, "left of", "circle"), human)
    merged = holistic_facts(human, facts("the circle left of the square and the square above the circle"))
    assert merged - human == {Fact("relation", "square", "above", "circle")}


def test_no_true_fact_conflicts_with_true_human_captions():
    """The world's human captions are true, so every fact the rules drop is false in its scene: a true visual fact
    (every fact of the dense caption and every relation between two objects) conflicts with none of them."""
    rng = random.Random(1)
    related = 0
    for i in range(300):
        scene = sample_scene(rng, i)
        human = blend_facts(reference_captions(scene, rng))
        pairs = [(a, b) for a in scene.objects for b in scene.objects if a is not b]
        true = facts(dense_caption(scene)) | {Fact("relation", a.shape, r, b.shape) for a, b in pairs
                                              for r in relations(a, b)}  # fmt: skip
        assert [f for f in true if conflicts(f, human)] == [], (scene, human)
        related += any(f.kind == "relation" for f in human)
    assert related > 100  # the relation rules were exercised (humans relate two shapes in most scenes)


def test_shapes_beyond_the_human_count_conflict():
    # Humans: two shapes, a square and a diamond are named; there is no room for a third shape.
    human = facts("two shapes a red diamond and a large red striped square")
    star = [Fact("object", "star"), Fact("color", "star", "red"), Fact("position", "star", "middle"),
            Fact("relation", "star", "left of", "square"), Fact("relation", "square", "left of", "star")]  # fmt: skip
    for f in star:
        assert conflicts(f, human), f
    assert not conflicts(Fact("position", "square", "middle"), human)  # a named shape: still free
    assert not conflicts(Fact("relation", "square", "left of", "diamond"), human)
    assert conflicts(Fact("count", None, "1"), human)  # fewer shapes than the humans name
    # One named shape out of two: room for one more, so a new shape does not conflict.
    one_named = facts("two shapes a red diamond")
    assert not conflicts(Fact("object", "star"), one_named)
    assert not conflicts(Fact("count", None, "3"), facts("a red diamond and a square"))  # no count stated: more fits
    assert conflicts(Fact("count", None, "1"), facts("a red diamond and a square"))
    merged = holistic_facts(human, facts("three shapes a small star and a red diamond at the top"))
    assert merged - human == {Fact("position", "diamond", "top")}  # count 3 and the star conflict


def test_world_llm_through_the_engine_with_a_given_visual_expert(tmp_path):
    from finecap.boost.engine import AnswerCache, boost_records
    from finecap.boost.prompts import Prompts
    from finecap.boost.world_backend import WorldLLM
    from finecap.data.records import Record

    class FixedVLM:  # stands in for the trained expert: answers given per image
        answers = {0: "a large green circle at the top left and a small star", 1: ""}

        def identity(self):
            return {"backend": "fixed"}

        def run(self, tasks):
            for i, t in enumerate(tasks):
                yield i, self.answers[t.record.image_id]

    from PIL import Image

    for i in range(2):  # real images (only those are sent), told apart by the cache key's hash of their bytes
        Image.new("RGB", (2, 2), (i, 0, 0)).save(tmp_path / f"{i}.png")
    records = [Record(0, tmp_path / "0.png", "test", ["a red circle on grass", "a circle at the top left"]),
               Record(1, tmp_path / "1.png", "test", ["a blue square"])]  # fmt: skip
    cache = AnswerCache(tmp_path / "cache.jsonl")
    result = boost_records(records, "holistic", WorldLLM(), FixedVLM(), cache, Prompts.load(), retries=1,
                           progress=False)  # fmt: skip
    cache.close()
    first = result.fields[0]
    assert first["blend"] == ["on grass a red circle at the top left"]
    # green conflicts with the human red; large and the star are new
    assert first["holistic"] == ["on grass a large red circle at the top left and a small star"]
    # Image 1: the expert answers nothing (twice): visual and holistic fail, the human caption is kept in both.
    assert result.fields[1]["visual"] == result.fields[1]["holistic"] == ["a blue square"]
    assert [(f.image_id, f.step) for f in result.failures] == [(1, "visual"), (1, "holistic")]


def test_holistic_answers_cached_under_the_earlier_conflict_rules_are_not_reused(tmp_path):
    """A cache of ``finecap boost`` on the world made before positions and relations conflicted (world-llm version 1)
    holds self-contradicting HolisticCaps: a rerun answers again instead of reading them back."""
    from PIL import Image

    from finecap.boost.engine import AnswerCache, boost_records
    from finecap.boost.prompts import Prompts
    from finecap.boost.world_backend import WorldLLM
    from finecap.data.records import Record

    class FixedVLM:
        def identity(self):
            return {"backend": "fixed"}

        def run(self, tasks):
            for i, _ in enumerate(tasks):
                yield i, "a circle on the right"

    class EarlierLLM(WorldLLM):  # the answers of the earlier rules, under their identity
        def identity(self):
            return {"backend": "world-llm", "version": 1}

        def answer(self, task):
            return "a circle on the right and a square and the circle left of the square"

    Image.new("RGB", (2, 2)).save(tmp_path / "0.png")
    records = [Record(0, tmp_path / "0.png", "test", ["a circle left of a square"])]
    cache = AnswerCache(tmp_path / "cache.jsonl")
    boost_records(records, "holistic", EarlierLLM(), FixedVLM(), cache, Prompts.load(), retries=1, progress=False)
    result = boost_records(records, "holistic", WorldLLM(), FixedVLM(), cache, Prompts.load(), retries=1,
                           progress=False)  # fmt: skip
    cache.close()
    assert result.fields[0]["holistic"] == ["a circle and a square and the circle left of the square"]


def test_a_missing_visual_expert_is_named_with_the_command_that_makes_it_there(tmp_path, monkeypatch):
    """The default boost.vlm_model is a run folder relative to the working directory; the recipe alone writes into
    the home's runs: the hint names the run.dir that makes the named path, and a checkpoint the recipe wrote."""
    import pytest

    from finecap.boost.world_backend import WorldVLM
    from finecap.config import load
    from finecap.home import ENV

    monkeypatch.setenv(ENV, str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    cfg = load(None, [])
    with pytest.raises(FileNotFoundError) as e:
        WorldVLM(cfg.boost.vlm_model, cfg)
    message = str(e.value)
    assert message == ("boost.vlm_model: visual expert checkpoint runs/visual_expert/checkpoints/best not found; "
                       "train one with `finecap train demo/visual_expert run.dir=runs/visual_expert` (or set "
                       "boost.vlm_backend)")  # fmt: skip
    made = tmp_path / "home" / "runs" / "demo" / "visual_expert" / "checkpoints" / "best"
    made.mkdir(parents=True)
    with pytest.raises(FileNotFoundError) as e:
        WorldVLM(cfg.boost.vlm_model, cfg)
    assert str(e.value).endswith(f"`finecap train demo/visual_expert` wrote one: boost.vlm_model={made}")


def test_the_visual_experts_identity_and_weights_are_one_saves(tmp_path, monkeypatch):
    # boost's world visual expert (boost.vlm_model) of a run still training stamped the best's weight files (the
    # identity its cached answers are keyed by), then loaded the weights, and read its shift after: a best swapped in
    # between was answered under the stamp of the save before it; the checkpoint is now held for all three reads
    import finecap.boost.world_backend as world_backend
    from finecap.boost.engine import weights_stamp
    from finecap.boost.world_backend import WorldVLM
    from finecap.config import load
    from finecap.runs import checkpoint_dir, model_dir
    from finecap.train.checkpoint import load_info
    from helpers.swaps import NextSave, clipcap_run, weight_sum

    run_dir, model, save_next = clipcap_run(tmp_path)
    best = checkpoint_dir(run_dir, "best")
    first, stamp = weight_sum(model), weights_stamp(model_dir(best), ("*.safetensors",))
    with NextSave(save_next) as next_save:  # the next best is saved once the expert has stamped this one's weights
        monkeypatch.setattr(world_backend, "weights_stamp", next_save.after(world_backend.weights_stamp))
        expert = WorldVLM(best, load(None, []))
    assert expert.weights == stamp and weight_sum(expert.model) == first  # one save's: step 7's
    assert next_save.waited and load_info(best)["step"] == 9  # the save went through after
