"""Retrieval among the members of a scene family (the ImageCoDe analogue) against hand-computed ranks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from finecap.config import WorldConfig
from finecap.metrics.families import (
    family_retrieval,
    family_retrieval_items,
    family_self_retrieval,
    family_self_retrieval_items,
    family_sets,
    family_test_world,
)
from finecap.world.make import generate_scenes
from finecap.world.scene import scene_diff

# Images 0-2: family "A", 3-5: family "B", 6: family "C" (one member, incomplete), 7: no family.
FAMILIES = {0: "A", 1: "A", 2: "A", 3: "B", 4: "B", 5: "B", 6: "C", 7: None}
O = 0.99  # scores of images outside the caption's family: high, and never counted
SCORES = np.array(
    [
        [0.9, 0.5, 0.1, O, O, O, O, O],  # caption of 0: 0.9 beats 0.5, 0.1 -> rank 1
        [0.7, 0.6, 0.2, O, O, O, O, O],  # caption of 1: 0.7 >= 0.6 -> rank 2
        [0.3, 0.3, 0.3, O, O, O, O, O],  # caption of 2: all tied -> rank 3 (ties count against it)
        [O, O, O, 0.5, 0.4, 0.1, O, O],  # caption of 3: rank 1
        [O, O, O, 0.2, 0.8, 0.1, O, O],  # caption of 4: rank 1
        [O, O, O, 0.6, 0.1, 0.5, O, O],  # caption of 5: 0.6 >= 0.5 -> rank 2
        [O, O, O, O, O, O, 0.0, O],  # caption of 6: its family is incomplete -> not ranked
        [O, O, O, O, O, O, O, 0.0],  # caption of 7: no family -> not ranked
    ]
)


def test_family_sets_keeps_complete_families_in_order():
    assert family_sets(FAMILIES, 3) == [[0, 1, 2], [3, 4, 5]]
    assert family_sets(FAMILIES, 1) == [[6]]
    assert family_sets({}, 3) == []


def test_family_retrieval_ranks_within_the_family_only():
    out = out_all = family_retrieval(SCORES, list(range(8)), FAMILIES, size=3)
    # ranks 1, 2, 3, 1, 1, 2: R@1 = 3/6, mean rank 10/6, median 1.5; R@5 is not below the size 3: not reported
    assert out == pytest.approx({"family/R@1": 0.5, "family/mean_rank": 10 / 6, "family/median_rank": 1.5,
                                 "family/n": 6.0, "family/size": 3.0})  # fmt: skip
    # explicit targets: only the captions of images 1 and 5, in that order
    out = family_retrieval(SCORES[[1, 5]], list(range(8)), FAMILIES, size=3, targets=[1, 5])
    assert out["family/R@1"] == 0.0 and out["family/mean_rank"] == 2.0 and out["family/n"] == 2.0
    # per caption row (captions 6 and 7 are in no complete family): ranks 1, 2, 3, 1, 1, 2; their means are the
    # corpus values
    corpus, items = family_retrieval_items(SCORES, list(range(8)), FAMILIES, size=3)
    assert corpus == out_all
    assert {q: v["family/mean_rank"] for q, v in items.items()} == {0: 1, 1: 2, 2: 3, 3: 1, 4: 1, 5: 2}
    assert [v["family/R@1"] for v in items.values()] == [1, 0, 0, 1, 1, 0]
    assert np.mean([v["family/R@1"] for v in items.values()]) == corpus["family/R@1"]
    with pytest.raises(ValueError, match="no family of 4 scored images"):
        family_retrieval(SCORES, list(range(8)), FAMILIES, size=4)
    with pytest.raises(ValueError, match="no caption belongs to a complete family"):  # captions of 6 and 7 only
        family_retrieval(SCORES[[6, 7]], list(range(8)), FAMILIES, size=3, targets=[6, 7])


@dataclass
class Image:
    image_id: int


class FakeRetriever:
    """Unit-norm embeddings by hand: images 0 -> (1, 0), 1 -> (0, 1); text 'a' -> (1, 0), 'b' -> (0.6, 0.8)."""

    def image_embeddings(self, records, cache_dir=None):
        table = {0: [1.0, 0.0], 1: [0.0, 1.0]}
        return torch.tensor([table[r.image_id] for r in records])

    def embed_texts(self, texts):
        table = {"a": [1.0, 0.0], "b": [0.6, 0.8]}
        return torch.tensor([table[t] for t in texts])


def test_family_self_retrieval_embeds_captions_and_images():
    records = [Image(0), Image(1)]
    families = {0: 7, 1: 7}
    # 'a' for image 0: cosines (1, 0) -> rank 1; 'b' for image 1: (0.6, 0.8) -> rank 1
    out = family_self_retrieval({0: "a", 1: "b"}, FakeRetriever(), records, families, size=2)
    assert out["family/R@1"] == 1.0 and out["family/n"] == 2.0
    # 'a' for image 1: cosines (1, 0), its own 0 -> rank 2
    out = family_self_retrieval({0: "a", 1: "a"}, FakeRetriever(), records, families, size=2)
    assert out["family/R@1"] == 0.5 and out["family/mean_rank"] == 1.5
    corpus, items = family_self_retrieval_items({0: "a", 1: "a"}, FakeRetriever(), records, families, size=2)
    assert corpus == out and items == {0: {"family/R@1": 1.0, "family/mean_rank": 1.0},
                                       1: {"family/R@1": 0.0, "family/mean_rank": 2.0}}  # fmt: skip
    with pytest.raises(KeyError, match="not among the records"):
        family_self_retrieval({2: "a"}, FakeRetriever(), records, families, size=2)


def test_family_test_world_is_whole_families_of_one_detail_variants():
    cfg = WorldConfig(n_train=50, n_val=10, n_test=23, seed=3, out="w")
    world = family_test_world(cfg, size=5)
    assert (world.families, world.n_train, world.n_val, world.n_test, world.out) == (5, 0, 0, 20, "w-families5")
    assert world.seed == 3 and world.max_objects == cfg.max_objects
    assert family_test_world(WorldConfig(out=""), size=10).out == ""  # the finecap home keys it
    with pytest.raises(ValueError, match="no whole family"):
        family_test_world(WorldConfig(n_test=4), size=5)
    records = generate_scenes(world)
    assert {r["split"] for r in records} == {"test"} and len(records) == 20
    sets = family_sets({r["imgid"]: r["family"] for r in records}, 5)
    assert len(sets) == 4
    scenes = {r["imgid"]: r["scene"] for r in records}
    for members in sets:  # every member is one detail away from its family's base scene
        base = scenes[members[0]]
        assert all(len(scene_diff(base, scenes[i])) == 1 for i in members[1:])
