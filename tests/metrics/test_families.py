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
    hard_rd_items,
    hard_rd_ranks,
    hard_rd_retrieval,
)
from finecap.metrics.retrieval import target_ranks
from finecap.world.make import generate_scenes
from finecap.world.scene import scene_diff
from helpers.counted_draws import CountedGenerator

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


def test_hard_rd_without_random_distractors_is_family_retrieval():
    # RD-2 with families of 3: the two family members are the only distractors -> the ranks above, 1 2 3 1 1 2
    out = hard_rd_retrieval(SCORES, list(range(8)), FAMILIES, size=3, n_distractors=2, draws=2, ks=(1, 2))
    assert out == pytest.approx({"hardRD2/R@1": 0.5, "hardRD2/R@2": 5 / 6, "hardRD2/mean_rank": 10 / 6,
                                 "hardRD2/median_rank": 1.5, "hardRD2/n": 6.0})  # fmt: skip


# Three families of 3 (images 0-2, 3-5, 6-8) and image 9 without one. Hard RD-4: 2 family members + 2 random images
# of the 6 in other families (image 9 counts as outside every family: it may be drawn).
HARD_FAMILIES = {0: "A", 1: "A", 2: "A", 3: "B", 4: "B", 5: "B", 6: "C", 7: "C", 8: "C", 9: None}
HARD = np.full((5, 10), 0.1)
HARD[0, [0, 1, 2]] = [0.5, 0.4, 0.6]  # caption of 0: mate 2 beats it, no outsider does -> rank 2 in every draw
HARD[1, [3, 4, 5]] = [0.5, 0.1, 0.1]
HARD[1, [0, 1, 2, 6, 7, 8, 9]] = 0.9  # caption of 3: every outsider beats it, mates do not -> rank 1 + 2 = 3
HARD[2, 6] = 0.9  # caption of 6: beats everything -> rank 1
HARD[3, [1, 9]] = [0.5, 0.9]  # caption of 1: only image 9 beats it -> rank 2 when 9 is drawn (2 of the 7), else 1
HARD[4, 9] = 0.5  # caption of 9: no family -> not ranked
HARD_TARGETS = [0, 3, 6, 1, 9]


def test_hard_rd_ranks_family_members_and_random_outsiders():
    ranks, keep = hard_rd_ranks(HARD, list(range(10)), HARD_FAMILIES, size=3, targets=HARD_TARGETS,
                                n_distractors=4, draws=200, seed=1)  # fmt: skip
    assert keep.tolist() == [0, 1, 2, 3] and ranks.shape == (200, 4)
    # a family member is never drawn again as a random distractor (caption 0 would rank 3), nor the target
    assert (ranks[:, 0] == 2).all() and (ranks[:, 1] == 3).all() and (ranks[:, 2] == 1).all()
    # image 9 is one of the 7 outsiders of family A; P(drawn among 2) = 1 - (6/7)(5/6) = 2/7
    drawn = (ranks[:, 3] == 2).mean()
    assert set(ranks[:, 3].tolist()) == {1, 2} and abs(drawn - 2 / 7) < 0.1
    again, _ = hard_rd_ranks(HARD * 0.5, list(range(10)), HARD_FAMILIES, size=3, targets=HARD_TARGETS,
                             n_distractors=4, draws=200, seed=1)  # fmt: skip
    assert (again == ranks).all()  # the distractors depend on the seed, never on the scores
    out = hard_rd_retrieval(HARD, list(range(10)), HARD_FAMILIES, size=3, targets=HARD_TARGETS, n_distractors=4,
                            draws=200, seed=1, ks=(1,))  # fmt: skip
    # per draw R@1 = (caption 6, and caption 1 when 9 is not drawn) / 4
    assert out["hardRD4/R@1"] == pytest.approx((1 + (1 - drawn)) / 4) and out["hardRD4/n"] == 4.0


def test_hard_rd_refuses_what_it_cannot_draw():
    with pytest.raises(ValueError, match="below the 2 family members"):
        hard_rd_retrieval(HARD, list(range(10)), HARD_FAMILIES, size=3, targets=HARD_TARGETS, n_distractors=1)
    with pytest.raises(ValueError, match="needs 8 images outside a family, the pool has 7"):
        hard_rd_retrieval(HARD, list(range(10)), HARD_FAMILIES, size=3, targets=HARD_TARGETS, n_distractors=10)
    with pytest.raises(ValueError, match="no caption belongs to a complete family"):
        hard_rd_retrieval(HARD[[4]], list(range(10)), HARD_FAMILIES, size=3, targets=[9], n_distractors=4)


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
    assert out["family/R@1"] == 0.5 and out["family/mean_rank"] == 1.5 and "hardRD1/R@1" not in out
    # the hard RD on the same scores: with 1 distractor, the family mate, it is family retrieval again
    out = family_self_retrieval({0: "a", 1: "a"}, FakeRetriever(), records, families, size=2, n_distractors=1)
    assert out["hardRD1/R@1"] == 0.5 and out["hardRD1/mean_rank"] == 1.5 and out["hardRD1/n"] == 2.0
    corpus, items = family_self_retrieval_items({0: "a", 1: "a"}, FakeRetriever(), records, families, size=2,
                                                n_distractors=1)  # fmt: skip
    # no hardRD1/R@5: among 2 images every caption ranks in the top 5, a recall that cannot fail is left out
    assert corpus == out and items == {  # fmt: skip
        0: {
            "family/R@1": 1.0,
            "family/mean_rank": 1.0,
            "hardRD1/R@1": 1.0,
            "hardRD1/mean_rank": 1.0,
        },
        1: {
            "family/R@1": 0.0,
            "family/mean_rank": 2.0,
            "hardRD1/R@1": 0.0,
            "hardRD1/mean_rank": 2.0,
        },
    }
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


def test_hard_rd_per_caption_values_average_to_the_corpus_values():
    rng = np.random.default_rng(3)
    scores = rng.random((12, 12))  # 12 captions, 12 images in 4 families of 3
    families = {i: i // 3 for i in range(12)}
    corpus, items = hard_rd_items(scores, list(range(12)), families, size=3, n_distractors=5, draws=3, ks=(1, 5))
    assert corpus == hard_rd_retrieval(scores, list(range(12)), families, size=3, n_distractors=5, draws=3, ks=(1, 5))
    for key in ("hardRD5/R@1", "hardRD5/R@5", "hardRD5/mean_rank"):
        assert np.mean([items[q][key] for q in range(12)]) == pytest.approx(corpus[key]), key
    # a caption's R@1 is its share of the three draws where it ranks first
    ranks, keep = hard_rd_ranks(scores, list(range(12)), families, size=3, n_distractors=5, draws=3)
    assert items[int(keep[0])]["hardRD5/R@1"] == pytest.approx((ranks[:, 0] == 1).mean())


def _positional_hard_rd(scores, family_of, targets, size, n_distractors, seed):
    """Draw 0 of the hard RD as every committed result was made: the ``j``-th caption of a complete family took
    row ``j`` of the stream of its block of 1,024 such captions (``default_rng((seed, 0, first))``)."""
    keep = np.flatnonzero(family_of[targets] >= 0)
    out = []
    for start in range(0, len(keep), 1024):
        own = targets[keep[start : start + 1024]]
        same = family_of[None, :] == family_of[own][:, None]
        mates = same.copy()
        mates[np.arange(len(own)), own] = False
        mates = np.nonzero(mates)[1].reshape(len(own), size - 1)
        keys = np.random.default_rng((seed, 0, start)).random(same.shape)
        keys[same] = 2.0
        n_random = n_distractors - size + 1
        randoms = np.argpartition(keys, n_random - 1, axis=1)[:, :n_random]
        out.append(target_ranks(scores[keep[start : start + 1024]], own, np.concatenate([mates, randoms], axis=1)))
    return np.concatenate(out)


def test_hard_rd_draws_are_the_committed_ones_for_captions_in_column_order():
    # 1,100 images (families of 10 but for the last 10 images, in none), one caption each in column order: the layout
    # of the demo's family world, two blocks of draws; the draws are exactly the committed results'
    rng = np.random.default_rng(7)
    scores = rng.random((1100, 1100))
    families = {i: (i // 10 if i < 1090 else None) for i in range(1100)}
    family_of = np.array([i // 10 if i < 1090 else -1 for i in range(1100)])
    ranks, keep = hard_rd_ranks(scores, list(range(1100)), families, size=10, n_distractors=19, draws=1, seed=2)
    assert len(keep) == 1090
    assert np.array_equal(ranks[0], _positional_hard_rd(scores, family_of, np.arange(1100), 10, 19, seed=2))


def test_hard_rd_distractors_depend_on_the_image_not_on_the_order_or_the_other_captions():
    # The same captions in another order, or without image 0's (a captioner that skipped it), face the same
    # distractors on every image (before, the j-th caption drew row j: a permutation moved every image's).
    rng = np.random.default_rng(4)
    scores = rng.random((30, 30))  # 30 images in 10 families of 3, one caption each
    families = {i: i // 3 for i in range(30)}
    args = dict(size=3, n_distractors=6, draws=2, seed=0)
    ranks, _ = hard_rd_ranks(scores, list(range(30)), families, **args)
    perm = rng.permutation(30)
    shuffled, keep = hard_rd_ranks(scores[perm], list(range(30)), families, targets=perm, **args)
    assert keep.tolist() == list(range(30)) and np.array_equal(shuffled, ranks[:, perm])
    skipped, _ = hard_rd_ranks(scores[1:], list(range(30)), families, targets=np.arange(1, 30), **args)
    assert np.array_equal(skipped, ranks[:, 1:])


def test_hard_rd_draws_only_the_rows_of_the_captions_scored(monkeypatch):
    # Three captions of images far apart among 1,500 (500 families of 3): they face the distractors they face among
    # all 1,500 captions (rows 1499, 0 and 700 of the blocks at 1024 and 0), and only their 3 rows of 1,500 keys are
    # drawn in each draw, not the blocks' 1,024 + 476 rows
    rng = np.random.default_rng(3)
    scores = rng.random((1500, 1500))
    families = {i: i // 3 for i in range(1500)}
    args = dict(size=3, n_distractors=8, draws=2, seed=1)
    every, _ = hard_rd_ranks(scores, list(range(1500)), families, **args)
    targets = np.array([1499, 0, 700])
    generators = []

    def counted(seed):
        generators.append(CountedGenerator(default_rng(seed)))
        return generators[-1]

    default_rng = np.random.default_rng
    monkeypatch.setattr(np.random, "default_rng", counted)
    ranks, keep = hard_rd_ranks(scores[targets], list(range(1500)), families, targets=targets, **args)
    monkeypatch.undo()
    assert keep.tolist() == [0, 1, 2] and np.array_equal(ranks, every[:, targets])
    assert sum(g.drawn for g in generators) == 2 * 3 * 1500
