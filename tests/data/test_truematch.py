"""TrueMatch bags (NDLB Algorithms 1-2) on tiny hand-made embeddings."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from finecap.app.bags import parse_sizes
from finecap.data.truematch import (
    Bag,
    build_bags,
    candidate_bags,
    curate_bags,
    family_purity,
    mean_text_embeddings,
    multimodal_embeddings,
    nearest_neighbours,
    random_bag_purity,
)


def unit(deg: float) -> list[float]:
    return [math.cos(math.radians(deg)), math.sin(math.radians(deg))]


# Five points on the unit circle at angles 0, 10, 30, 90, 100 degrees; cosine = cos(angle difference):
#   cos 10 = 0.98481, cos 20 = 0.93969, cos 30 = 0.86603, cos 60 = 0.5, cos 70 = 0.34202, cos 80 = 0.17365
ANGLES = [0, 10, 30, 90, 100]
EMB = torch.tensor([unit(a) for a in ANGLES])
C10, C20, C30, C60, C70 = (math.cos(math.radians(a)) for a in (10, 20, 30, 60, 70))


def test_nearest_neighbours_by_hand():
    sims, idx = nearest_neighbours(EMB, 2)
    # 0: 1 (10 deg), 2 (30);  1: 0 (10), 2 (20);  2: 1 (20), 0 (30);  3: 4 (10), 2 (60);  4: 3 (10), 2 (70)
    assert idx.tolist() == [[1, 2], [0, 2], [1, 0], [4, 2], [3, 2]]
    assert sims[2].tolist() == pytest.approx([C20, C30], abs=1e-6)
    assert sims[4].tolist() == pytest.approx([C10, C70], abs=1e-6)


def test_nearest_neighbours_blocks_and_ties():
    # Duplicates tie exactly: lower index first; the query itself is never its neighbour. A block budget of 4 floats
    # per row x 4 bytes forces one row per block; results must equal the unblocked search.
    emb = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    _, idx = nearest_neighbours(emb, 2)
    assert idx.tolist() == [[1, 2], [0, 2], [0, 1], [0, 1]]  # row 3: all three cosines 0 -> indices 0, 1
    _, idx_small = nearest_neighbours(emb, 2, max_block_bytes=16)
    assert idx_small.tolist() == idx.tolist()


def test_nearest_neighbours_equal_brute_force_with_many_ties():
    # Small integer vectors give many exactly equal cosines; the result must equal a full sort by
    # (-similarity, index) with the query excluded, for every block size.
    g = torch.Generator().manual_seed(0)
    emb = torch.randint(0, 3, (60, 3), generator=g).float() + torch.tensor([1.0, 0.0, 0.0])
    e = F.normalize(emb, dim=-1)
    sims = e @ e.T
    sims.fill_diagonal_(-math.inf)
    expected = [sorted(range(60), key=lambda j, r=r: (-float(sims[r, j]), j))[:7] for r in range(60)]
    for block_bytes in (4 * 60, 4 * 60 * 7, 2**20):
        _, idx = nearest_neighbours(emb, 7, max_block_bytes=block_bytes)
        assert idx.tolist() == expected


def test_nearest_neighbours_rejects_bad_k():
    with pytest.raises(ValueError, match="1 <= k <= 4"):
        nearest_neighbours(EMB, 5)


def test_candidate_bags_query_similarity():
    bags, alpha = candidate_bags(EMB, 3)
    assert bags.tolist() == [[0, 1, 2], [1, 0, 2], [2, 1, 0], [3, 4, 2], [4, 3, 2]]
    # alpha_r = mean cosine of the query to its two bag-mates (Algorithm 1, line 14):
    # 0: (cos10 + cos30)/2; 1: (cos10 + cos20)/2; 2: (cos20 + cos30)/2; 3: (cos10 + cos60)/2; 4: (cos10 + cos70)/2
    expected = [(C10 + C30) / 2, (C10 + C20) / 2, (C20 + C30) / 2, (C10 + C60) / 2, (C10 + C70) / 2]
    assert alpha.tolist() == pytest.approx(expected, abs=1e-6)


def test_candidate_bags_pairwise_similarity():
    _, alpha = candidate_bags(EMB, 3, similarity="pairwise")
    # bag {0,1,2}: pairs (0,1)=cos10, (0,2)=cos30, (1,2)=cos20 -> mean for rows 0, 1 and 2 alike
    tri = (C10 + C30 + C20) / 3
    # bag {3,4,2}: (3,4)=cos10, (3,2)=cos60, (4,2)=cos70
    other = (C10 + C60 + C70) / 3
    assert alpha.tolist() == pytest.approx([tri, tri, tri, other, other], abs=1e-6)


def test_pairwise_similarity_ties_of_one_bag_keep_the_query_order():
    # Angles 13, 22, 27, 33, 99; differences 22-27: 5, 27-33: 6, 13-22: 9, 22-33: 11, 13-27: 14, 33-99: 66, 27-99: 72.
    # Candidate bags of 3: row 0 {0,1,2}, row 1 {1,2,0}, row 2 {2,1,3}, row 3 {3,2,1}, row 4 {4,3,2}.
    # pairwise alpha: {0,1,2} (cos9 + cos14 + cos5)/3 = 0.98473; {1,2,3} (cos5 + cos11 + cos6)/3 = 0.99078;
    # {2,3,4} (cos6 + cos66 + cos72)/3 = 0.57009. Rows 2 and 3 hold one bag, so alpha ties and the lower query (2)
    # is kept: [2, 1, 3]. Summed in each row's member order, float32 gave row 3 the larger alpha: [3, 2, 1] was kept.
    emb = torch.tensor([unit(a) for a in (13, 22, 27, 33, 99)])
    bags, alpha = candidate_bags(emb, 3, similarity="pairwise")
    assert bags.tolist() == [[0, 1, 2], [1, 2, 0], [2, 1, 3], [3, 2, 1], [4, 3, 2]]
    c = [math.cos(math.radians(a)) for a in (5, 6, 9, 11, 14, 66, 72)]
    low, high, far = (c[2] + c[4] + c[0]) / 3, (c[0] + c[3] + c[1]) / 3, (c[1] + c[5] + c[6]) / 3
    assert alpha.tolist() == pytest.approx([low, low, high, high, far], abs=1e-6)
    kept = build_bags(emb, [3], similarity="pairwise")[3]
    assert [b.images for b in kept] == [[2, 1, 3]]
    assert float(alpha[2]) == float(alpha[3]) and float(alpha[0]) == float(alpha[1])
    assert kept[0].similarity == pytest.approx(high, abs=1e-6)


def test_curate_bags_algorithm2():
    # alpha (query): 0: 0.92542, 1: 0.96225, 2: 0.90286, 3: 0.74240, 4: 0.66341 -> order 1, 0, 2, 3, 4.
    # keep bag 1 = {1,0,2}; bags 0 and 2 overlap it; bag 3 = {3,4,2} overlaps on image 2; bag 4 likewise.
    bags, alpha = candidate_bags(EMB, 3)
    assert curate_bags(bags, alpha) == [1]
    # size 2: candidates 0:{0,1} 1:{1,0} 2:{2,1} 3:{3,4} 4:{4,3}, alpha cos10, cos10, cos20, cos10, cos10.
    # sorted (stable): 0, 1, 3, 4, 2 -> keep 0 ({0,1}), skip 1, keep 3 ({3,4}), skip 4, skip 2 (image 1 used).
    bags2, alpha2 = candidate_bags(EMB, 2)
    assert curate_bags(bags2, alpha2) == [0, 3]


def test_curate_bags_equal_alpha_keeps_index_order():
    assert curate_bags([[0, 1], [2, 3], [1, 2]], [0.5, 0.5, 0.9]) == [2]
    assert curate_bags([[0, 1], [2, 3], [1, 2]], [0.5, 0.5, 0.1]) == [0, 1]


def test_build_bags_with_ids_and_sizes():
    out = build_bags(EMB, [3, 2], ids=["a", "b", "c", "d", "e"])
    assert sorted(out) == [2, 3]
    assert [b.images for b in out[2]] == [["a", "b"], ["d", "e"]]
    assert out[2][0].similarity == pytest.approx(C10, abs=1e-6)
    assert [b.images for b in out[3]] == [["b", "a", "c"]]
    # every kept bag of one size is disjoint from the others
    for bags in out.values():
        seen = [i for b in bags for i in b.images]
        assert len(seen) == len(set(seen))


def test_duplicate_images_make_the_hardest_bag_as_the_docstring_says():
    # Images 0 and 1 share one embedding: only the query itself is excluded, so they are each other's nearest
    # neighbour and their bag (cosine 1) is curated first; image 2 (cos 0.8 to them) is left to pair with 3 (cos 0.6).
    emb = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
    bags = build_bags(emb, [2])[2]
    assert [b.images for b in bags] == [[0, 1], [3, 2]]
    assert [b.similarity for b in bags] == pytest.approx([1.0, 0.6], abs=1e-6)


def test_build_bags_rejects_repeated_ids():
    # Rows 0 and 1 (both "a") are each other's nearest: the bag ["a", "a"] was written, a file read_bags refuses.
    emb = torch.tensor([[1.0, 0.0], [0.99, 0.14], [0.0, 1.0], [0.1, 0.99]])
    with pytest.raises(ValueError, match="image ids must be unique: 'a' names two embeddings"):
        build_bags(emb, [2], ids=["a", "a", "b", "c"])


def test_embeddings_that_are_not_finite_are_refused_naming_their_images():
    # torch.topk ranks NaN above every cosine: image "c"'s NaN embedding made it every image's nearest neighbour and
    # the bags [["a", "c"]] (similarity NaN), which only the JSON writer refused, after the whole search
    emb = EMB.clone()
    emb[2, 0] = math.nan
    with pytest.raises(ValueError, match=r"embeddings: 1 of 5 are not finite .*of image\(s\) \['c'\]"):
        build_bags(emb, [2, 3], ids=["a", "b", "c", "d", "e"])
    emb[4, 1] = math.inf  # an overflow: normalised, a NaN too
    with pytest.raises(ValueError, match=r"2 of 5 are not finite .*of row\(s\) \[2, 4\]"):
        nearest_neighbours(emb, 2)
    with pytest.raises(ValueError, match=r"of image\(s\) \['c', 'e'\]"):
        nearest_neighbours(emb, 2, ids=["a", "b", "c", "d", "e"])


def test_build_bags_rejects_bad_sizes():
    with pytest.raises(ValueError, match="bag sizes must lie in"):
        build_bags(EMB, [6])
    with pytest.raises(ValueError, match="bag sizes must lie in"):
        build_bags(EMB, [1])


def test_multimodal_embedding_cosine_is_mean_of_halves():
    # image halves at 0 and 60 degrees (cos 0.5), text halves at 0 and 90 degrees (cos 0): the concatenated, unit
    # normalised embeddings have cosine (0.5 + 0) / 2 = 0.25, whatever the input norms (scaled by 3 and 7 here).
    z = torch.tensor([unit(0), unit(60)]) * torch.tensor([[3.0], [7.0]])
    t = torch.tensor([unit(0), unit(90)]) * 5
    m = multimodal_embeddings(z, t)
    assert m.norm(dim=1).tolist() == pytest.approx([1.0, 1.0])
    assert float(m[0] @ m[1]) == pytest.approx(0.25, abs=1e-6)


def test_mean_text_embeddings_normalises_each_caption():
    # image 0: captions (2, 0) and (0, 4) -> unit (1, 0), (0, 1) -> mean (0.5, 0.5); image 1: (0, -3) -> (0, -1)
    caps = torch.tensor([[2.0, 0.0], [0.0, 4.0], [0.0, -3.0]])
    assert mean_text_embeddings(caps, [2, 1]).tolist() == [[0.5, 0.5], [0.0, -1.0]]
    with pytest.raises(ValueError, match="counts sum"):
        mean_text_embeddings(caps, [1, 1])


def test_family_purity():
    families = {1: 0, 2: 0, 3: 0, 4: 1, 5: 2, 6: None, 7: None}
    # [1,2,3] one family; [4,5] two families; [6,7] no family -> 1 of 3 pure
    assert family_purity([[1, 2, 3], [4, 5], [6, 7]], families) == pytest.approx(1 / 3)
    assert family_purity([Bag([1, 2], 0.9)], families) == 1.0
    with pytest.raises(ValueError, match="no bags"):
        family_purity([], families)


def test_random_bag_purity_is_chance_level():
    # 6 images in one family -> every random bag is pure; 6 images in 6 families -> none is.
    assert random_bag_purity(range(6), dict.fromkeys(range(6), 0), 3) == 1.0
    assert random_bag_purity(range(6), {i: i for i in range(6)}, 3) == 0.0


def test_family_embeddings_give_pure_bags():
    # Two families of three images, tight clusters far apart: every bag of 3 is one family.
    emb = torch.tensor([unit(a) for a in (0, 2, 4, 90, 92, 94)])
    fams = {i: i // 3 for i in range(6)}
    bags = build_bags(emb, [3])[3]
    assert len(bags) == 2 and family_purity(bags, fams) == 1.0


def test_parse_sizes():
    assert parse_sizes("7,3, 5") == [3, 5, 7]
    with pytest.raises(ValueError, match="--sizes"):
        parse_sizes("3,x")
    with pytest.raises(ValueError, match=">= 2"):
        parse_sizes([1])


@pytest.mark.parametrize("sizes", ["3,,2", "3,5,", ",3", "3, ,5", ""])
def test_parse_sizes_refuses_an_empty_item_naming_the_option(sizes):
    # "3,,2" read as [2, 3]: a size the user meant (a typo, or a lost digit) was dropped without a word.
    with pytest.raises(ValueError, match=r"^--sizes: .* has an empty item"):
        parse_sizes(sizes)
