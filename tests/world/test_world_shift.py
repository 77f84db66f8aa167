"""The shifted test domain (world.shift=domain): other scenes, other annotators, still fully parseable."""

from __future__ import annotations

import dataclasses
import random

from finecap.config import WorldConfig
from finecap.world.captions import reference_captions
from finecap.world.facts import faithfulness
from finecap.world.make import generate_scenes, load_scene_records, make_world, world_key
from finecap.world.shift import shifted_world

RARE = {"disc", "rhombus", "turquoise", "violet", "little", "tiny", "stripy", "spotted", "beach", "planks", "lawn"}


def test_training_world_key_is_unchanged_by_the_shift_option() -> None:
    base = WorldConfig(n_train=10, n_val=2, n_test=5)
    # "none" is the key the world had before the option existed: no "shift" entry in the hashed content.
    assert world_key(base) == world_key(dataclasses.replace(base, shift="none"))
    assert world_key(base) != world_key(dataclasses.replace(base, shift="domain"))


def test_shifted_scenes_are_cluttered_and_new() -> None:
    base = WorldConfig(n_train=0, n_val=0, n_test=300)
    train_like = generate_scenes(base)
    shifted = generate_scenes(shifted_world(base))
    assert all(len(r["scene"].objects) >= 3 for r in shifted)
    assert any(len(r["scene"].objects) < 3 for r in train_like)  # the training domain has 1-4 objects
    patterned = sum(o.pattern is not None for r in shifted for o in r["scene"].objects)
    n_objects = sum(len(r["scene"].objects) for r in shifted)
    assert 0.5 < patterned / n_objects < 0.7  # pattern_prob 0.3 * 2 = 0.6; 1,000+ objects: sd < 0.02
    same = sum(a["scene"].to_dict() == b["scene"].to_dict() for a, b in zip(train_like, shifted, strict=True))
    assert same == 0


def test_shifted_annotators_use_rarer_words_more_detail_and_stay_parseable() -> None:
    scenes = [r["scene"] for r in generate_scenes(shifted_world(WorldConfig(n_train=0, n_val=0, n_test=200)))]
    train = [c for s in scenes for c in reference_captions(s, random.Random(f"t{s.id}"))]
    shifted = [c for s in scenes for c in reference_captions(s, random.Random(f"t{s.id}"), style="domain")]

    def rare_share(caps: list[str]) -> float:
        return sum(w in RARE for c in caps for w in c.split()) / len(caps)

    def recall(caps: list[str]) -> float:
        return sum(faithfulness(c, scenes[i // 5]).recall for i, c in enumerate(caps)) / len(caps)

    # A two-synonym word is rare with p 0.5 in training, 0.7 + 0.3 * 0.5 = 0.85 shifted (1.7x); a three-synonym
    # size word 2/3 vs 0.7 + 0.3 * 2/3 = 0.9 (1.35x); more detail adds rare words too. Measured: 1.97x.
    assert rare_share(shifted) > 1.5 * rare_share(train)
    assert recall(shifted) > recall(train)
    # Every shifted reference is read by the fact parser and states only true facts.
    assert all(faithfulness(c, scenes[i // 5]).precision == 1.0 for i, c in enumerate(shifted))


def test_make_shifted_world(tmp_path) -> None:
    cfg = shifted_world(WorldConfig(n_train=0, n_val=0, n_test=6, out=str(tmp_path / "w")))
    out = make_world(cfg, progress=False)
    assert out == tmp_path / "w-shifted"
    records = load_scene_records(out)
    assert len(records) == 6 and {r["split"] for r in records} == {"test"}
