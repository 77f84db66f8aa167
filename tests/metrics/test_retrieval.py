"""Self-retrieval metrics against hand-computed ranks."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from finecap.metrics import retrieval
from finecap.metrics.retrieval import (
    SelfRetrieval,
    bag_retrieval,
    bag_retrieval_items,
    pool_retrieval,
    random_distractors,
    rd_ranks,
    rd_retrieval,
    summarize_ranks,
    target_ranks,
)
from finecap.metrics.suite import evaluate
from finecap.utils.once import SaidOnce
from helpers.counted_draws import CountedGenerator

# Caption q's own image is column q.
SCORES = np.array(
    [
        [0.9, 0.1, 0.3],  # own 0.9 beats both -> rank 1
        [0.2, 0.1, 0.5],  # own 0.1, both others higher -> rank 3
        [0.4, 0.4, 0.4],  # all tied -> pessimistic rank 3 (1 + two others >= own)
    ]
)


def test_target_ranks_all_candidates_ties_pessimistic():
    assert target_ranks(SCORES).tolist() == [1, 3, 3]


def test_target_ranks_accepts_torch_and_explicit_targets():
    # Caption 1 targeted at column 2 (0.5 is its best score) -> rank 1; caption 0 at column 2: 0.9 >= 0.3 -> rank 2.
    ranks = target_ranks(torch.tensor(SCORES[:2]), targets=[2, 2])
    assert ranks.tolist() == [2, 1]


def test_target_ranks_candidate_subset_ignores_own_column():
    # Caption 1 (own 0.1) against candidates {0, 1}: only 0.2 >= 0.1 -> rank 2; the target listed among the
    # candidates does not count against itself.
    ranks = target_ranks(SCORES[1:2], targets=[1], candidates=np.array([[1, 0]]))
    assert ranks.tolist() == [2]


def test_summarize_ranks_hand_computed():
    out = summarize_ranks([1, 3, 3], ks=(1, 2, 5))
    assert out["R@1"] == pytest.approx(1 / 3)  # one of three at rank 1
    assert out["R@2"] == pytest.approx(1 / 3)  # ranks 3, 3 are > 2
    assert out["R@5"] == 1.0
    assert out["mean_rank"] == pytest.approx(7 / 3)  # (1 + 3 + 3) / 3
    assert out["median_rank"] == 3.0


def test_summarize_ranks_empty_raises():
    with pytest.raises(ValueError, match="no captions"):
        summarize_ranks([])


def test_pool_retrieval_with_extra_columns():
    # Two captions, four pool images (columns 2, 3 are extra distractors).
    scores = np.array([[0.5, 0.0, 0.6, 0.1], [0.0, 0.9, 0.2, 0.95]])
    out = pool_retrieval(scores, targets=[0, 1], ks=(1, 2))
    # caption 0: 0.6 >= 0.5 -> rank 2; caption 1: 0.95 >= 0.9 -> rank 2
    assert out["R@1"] == 0.0
    assert out["R@2"] == 1.0
    assert out["mean_rank"] == 2.0


def test_targets_needed_when_shapes_differ():
    with pytest.raises(ValueError, match="targets are needed"):
        pool_retrieval(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"targets must be image columns in \[0, 3\)"):
        pool_retrieval(np.zeros((1, 3)), targets=[3])


def test_random_distractors_exclude_target_without_replacement():
    rng = np.random.default_rng(0)
    targets = np.array([0, 3, 5, 5])
    d = random_distractors(4, 6, targets, 5, rng)
    assert d.shape == (4, 5)
    for row, t in zip(d, targets, strict=True):
        # 5 distractors out of the 5 non-target images: exactly the other images.
        assert sorted(row.tolist()) == [i for i in range(6) if i != t]


def test_random_distractors_too_few_images_names_option():
    with pytest.raises(ValueError, match="eval.n_distractors"):
        random_distractors(1, 3, np.array([0]), 3, np.random.default_rng(0))


def test_rd_ranks_match_recomputation_from_drawn_distractors():
    # One caption, own image column 0 scored 0.5; only column 1 (0.9) beats it.
    scores = np.array([[0.5, 0.9, 0.1, 0.3]])
    ranks = rd_ranks(scores, targets=[0], n_distractors=1, draws=20, seed=3)
    for d in range(20):
        drawn = random_distractors(1, 4, np.array([0]), 1, np.random.default_rng((3, d)))[0, 0]
        assert ranks[d, 0] == (2 if drawn == 1 else 1)
    # With 20 draws of one distractor among three, both outcomes occur.
    assert set(ranks[:, 0].tolist()) == {1, 2}


def _positional_draws(targets: np.ndarray, n_images: int, n_distractors: int, rng: np.random.Generator):
    """The draws as every committed result was made: caption ``q`` took row ``q`` of the stream of
    ``(captions, n_images)`` uniform keys (blocks of 1,024 rows), its target's key set to 2 and the smallest kept."""
    out = []
    for start in range(0, len(targets), 1024):
        keys = rng.random((min(1024, len(targets) - start), n_images))
        keys[np.arange(len(keys)), targets[start : start + len(keys)]] = 2.0
        out.append(np.argpartition(keys, n_distractors - 1, axis=1)[:, :n_distractors])
    return np.concatenate(out)


@pytest.mark.parametrize(
    "targets",
    [np.arange(1500), np.arange(40), np.repeat(np.arange(300), 5)],
    ids=["every image in column order (2 blocks)", "a prefix of the pool", "5 captions per image, listed together"],
)
def test_random_distractors_are_the_committed_draws_for_captions_in_column_order(targets):
    # The layouts every committed result used (finecap eval: the references' order; the probe: 5 references per
    # image) draw exactly as before captions were keyed by their image.
    got = random_distractors(len(targets), 1500, targets, 9, np.random.default_rng((0, 1)))
    assert np.array_equal(got, _positional_draws(targets, 1500, 9, np.random.default_rng((0, 1))))


def test_rd_distractors_depend_on_the_image_not_on_the_order_or_the_other_captions():
    # The same captions listed in another order, or with one image not captioned (a captioner that skipped it),
    # face the same distractors on every image: per-image ranks and the corpus R@1 are the same. Before, caption q
    # drew from row q, so a permutation moved every image to other distractors (R@1 0.117 -> 0.100 here).
    rng = np.random.default_rng(5)
    scores = rng.normal(size=(30, 30))
    ranks = rd_ranks(scores, np.arange(30), n_distractors=5, draws=2)  # (draws, 30)
    perm = rng.permutation(30)
    shuffled = rd_ranks(scores[perm], perm, n_distractors=5, draws=2)
    assert np.array_equal(shuffled, ranks[:, perm])
    assert rd_retrieval(scores[perm], perm, 5, 2) == rd_retrieval(scores, None, 5, 2)
    skipped = rd_ranks(scores[1:], np.arange(1, 30), n_distractors=5, draws=2)
    assert np.array_equal(skipped, ranks[:, 1:])
    # two captions of image 4 in either order: each keeps its place among image 4's captions (first, second)
    two = rd_ranks(scores[[4, 4, 7]], [4, 4, 7], n_distractors=5, draws=1)
    swapped = rd_ranks(scores[[7, 4, 4]], [7, 4, 4], n_distractors=5, draws=1)
    assert two[0].tolist() == [swapped[0, 1], swapped[0, 2], swapped[0, 0]]


def test_random_distractors_draw_only_the_rows_of_the_captions_scored():
    # Four captions of three images far apart in a pool of 1,000 (a few images scored against a large pool): image
    # 999's two captions take rows 2 * 999 + 0 and + 1 of the stream, image 0's row 0, image 500's row 1000 (r = 2,
    # stream_rows), and only those 4 rows of 1,000 keys are drawn, not the 2,000 rows up to the last (a pool of
    # 20,000 with 200 captions: 5 s a draw, where the captions' own rows take 0.1 s); the generator is left past the
    # whole stream, as drawing it would leave it.
    targets, n = np.array([999, 0, 500, 999]), 1000
    counted = CountedGenerator(np.random.default_rng((0, 1)))
    got = random_distractors(4, n, targets, 9, counted)
    whole = np.random.default_rng((0, 1))
    keys = whole.random((2000, n))[[1998, 0, 1000, 1999]]  # (4, N): the captions' rows of the whole stream
    keys[np.arange(4), targets] = 2.0
    assert np.array_equal(got, np.argpartition(keys, 8, axis=1)[:, :9])
    assert counted.drawn == 4 * n
    assert counted.rng.random() == whole.random()
    # a generator that cannot jump (MT19937) draws the rows between and drops them: the same distractors
    mt = random_distractors(4, n, targets, 9, np.random.Generator(np.random.MT19937(2)))
    keys = np.random.Generator(np.random.MT19937(2)).random((2000, n))[[1998, 0, 1000, 1999]]
    keys[np.arange(4), targets] = 2.0
    assert np.array_equal(mt, np.argpartition(keys, 8, axis=1)[:, :9])


def test_rd_with_all_distractors_equals_pool_and_is_seeded():
    rng = np.random.default_rng(1)
    scores = rng.normal(size=(6, 6))
    full = rd_retrieval(scores, n_distractors=5, draws=2, seed=0)
    assert full == pool_retrieval(scores)  # every other image drawn -> same ranks as the pool
    a = rd_retrieval(scores, n_distractors=2, draws=4, seed=7)
    b = rd_retrieval(scores, n_distractors=2, draws=4, seed=7)
    assert a == b


def test_rd_retrieval_averages_draws():
    scores = np.array([[0.5, 0.9, 0.1, 0.3]])
    ranks = rd_ranks(scores, targets=[0], n_distractors=1, draws=6, seed=0)
    out = rd_retrieval(scores, targets=[0], n_distractors=1, draws=6, seed=0, ks=(1,))
    # Per draw R@1 is 1 or 0 (a single caption); the average is the fraction of draws with rank 1.
    assert out["R@1"] == pytest.approx(float((ranks[:, 0] == 1).mean()))
    assert out["mean_rank"] == pytest.approx(float(ranks.mean()))


def test_a_recall_that_cannot_fail_is_left_out_with_a_note(caplog, monkeypatch):
    # RD-3 ranks a caption among 4 images, so R@5 and R@10 were reported as 1.0 even here, where every caption ranks
    # last in every draw (its own image scores lowest). NDLB and DiscriTune report R@1 alone: such a recall is left
    # out, and the log says so; R@k with k <= N can fail and is kept. The whole pool of 6 images likewise.
    monkeypatch.setattr(retrieval, "LEFT_OUT_SAID", SaidOnce())  # no note said yet in this command (said once)
    scores = -np.eye(6)
    caplog.set_level(logging.INFO, logger="finecap.metrics.retrieval")
    out = rd_retrieval(scores, n_distractors=3, draws=2)
    assert out == {"R@1": 0.0, "mean_rank": 4.0, "median_rank": 4.0}
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 1 and notes[0].startswith("RD3: R@5, R@10 left out: a caption is ranked among 4 images")
    out = rd_retrieval(scores, n_distractors=5, draws=2)
    assert out["R@5"] == 0.0 and "R@10" not in out  # rank 6 of 6: R@5 fails
    assert pool_retrieval(scores) == {"R@1": 0.0, "R@5": 0.0, "mean_rank": 6.0, "median_rank": 6.0}
    assert "pool: R@10 left out" in caplog.text


def test_the_note_of_a_recall_left_out_is_a_warning_said_once_in_a_command(caplog, monkeypatch):
    # it was INFO: below a script's default level and `finecap eval -q`'s, so R@10 vanished from a table unexplained;
    # a WARNING at every validation of a training run would repeat it, hence once for each protocol and cut-offs
    monkeypatch.setattr(retrieval, "LEFT_OUT_SAID", SaidOnce())
    caplog.set_level(logging.DEBUG, logger="finecap.metrics.retrieval")
    scores = -np.eye(6)
    for _ in range(3):  # three validations
        rd_retrieval(scores, n_distractors=3, draws=2)
        pool_retrieval(scores)
    rd_retrieval(scores, n_distractors=5, draws=2)  # other cut-offs left out: a note of their own
    said = [(r.levelname, r.getMessage().split(" left out")[0]) for r in caplog.records]
    assert [s for s in said if s[0] == "WARNING"] == [("WARNING", "RD3: R@5, R@10"), ("WARNING", "pool: R@10"),
                                                      ("WARNING", "RD5: R@10")]  # fmt: skip
    assert said.count(("DEBUG", "RD3: R@5, R@10")) == 2 and said.count(("DEBUG", "pool: R@10")) == 2


def test_bag_retrieval_per_bag_size():
    ids = ["a", "b", "c", "d", "e"]
    # Rows are captions of a..e (targets = diagonal).
    scores = np.array(
        [
            [0.9, 0.1, 0.2, 0.95, 0.0],  # a in bag {a,b,c}: 0.9 beats 0.1, 0.2 -> rank 1 (d's 0.95 is outside)
            [0.8, 0.5, 0.1, 0.0, 0.0],  # b: 0.8 >= 0.5 -> rank 2
            [0.3, 0.3, 0.3, 0.0, 0.0],  # c: ties with a and b -> rank 3
            [0.0, 0.0, 0.0, 0.4, 0.6],  # d in bag {d,e}: 0.6 >= 0.4 -> rank 2
            [0.0, 0.0, 0.0, 0.1, 0.7],  # e: rank 1
        ]
    )
    out = bag_retrieval(scores, [["a", "b", "c"], ["d", "e"]], ids, ks=(1, 5))
    assert out["bag3/R@1"] == pytest.approx(1 / 3)  # ranks 1, 2, 3
    assert out["bag3/mean_rank"] == pytest.approx(2.0)
    assert out["bag3/median_rank"] == 2.0
    assert out["bag3/n"] == 3
    assert out["bag2/R@1"] == pytest.approx(0.5)  # ranks 2, 1
    assert "bag3/R@5" not in out  # k >= bag size is trivially 1, not reported


def test_bag_retrieval_unknown_image_raises():
    with pytest.raises(ValueError, match="bag 0 names images not among the scored images"):
        bag_retrieval(np.eye(2), [["a", "zzz"]], ["a", "b"])


def test_bag_retrieval_refuses_a_bag_of_one_image():
    # A bag of 1 was scored: its caption's image is the only candidate, so bag1/R@1 was 1.0 whatever the caption
    # (here one whose own image scores lowest). The bags file refuses it; the library took it. So did the listener.
    scores = np.array([[0.1, 0.9], [0.9, 0.1]])
    with pytest.raises(ValueError, match=r"^bag 0 is a bag of size 1: a bag holds at least 2 images"):
        bag_retrieval(scores, [[0]], [0, 1])
    with pytest.raises(ValueError, match=r"^bag 1 is a bag of size 1"):  # named by its place among all bags
        bag_retrieval(scores, [[0, 1], [1]], [0, 1])
    with pytest.raises(ValueError, match=r"^bag 0 is a bag of size 0"):
        bag_retrieval(scores, [[]], [0, 1])


def test_bag_retrieval_refuses_a_bag_naming_an_image_twice():
    # Bag [0, 1, 1] holds 2 images: caption 0 (scores 0.5, 0.9 for images 0, 1) ranks 2nd of 2, but image 1 counted
    # twice made it rank 3 in a "bag3" (the bags file refuses such a bag; the function took it).
    with pytest.raises(ValueError, match=r"bag 0 names image\(s\) \[1\] more than once"):
        bag_retrieval(np.array([[0.5, 0.9, 0.1]]), [[0, 1, 1]], [0, 1, 2], targets=[0])


def test_bag_retrieval_refuses_an_image_in_two_bags_of_one_size():
    # Bags {1,2,3} and {3,4,5} share image 3. Captions score their own image highest (identity scores). Each caption
    # is ranked in the bag holding its image: 6 (caption, bag) pairs, but caption 3 was ranked in the first bag only
    # (bag3/n = 5, every R@1 1.0), so the second bag was scored as if it held 2 images. The bags of one size are
    # disjoint (NDLB Algorithm 2 keeps a bag only if none of its images is in a kept bag): an overlap is refused.
    with pytest.raises(ValueError, match=r"^bag 1 holds image 3, already in bag 0; the bags of one size are disjoint"):
        bag_retrieval(np.eye(5), [[1, 2, 3], [3, 4, 5]], [1, 2, 3, 4, 5])
    # disjoint bags of one size, and one image in bags of two sizes, are scored
    out = bag_retrieval(np.eye(5), [[1, 2, 3], [3, 4]], [1, 2, 3, 4, 5])  # image 3 in a bag of 3 and one of 2
    assert (out["bag3/n"], out["bag2/n"]) == (3.0, 2.0)


def test_an_image_in_bags_of_two_sizes_is_ranked_in_each():
    # TrueMatch builds the bags of each size on its own (NDLB Algorithm 2 curates one size's bags), so bags of 3 and
    # of 2 share images; bag_retrieval reports per size, so each caption is ranked in its bag of every size. Rows are
    # the captions of images 0..3 (targets = diagonal); bags of 2: {0, 2}, {1, 3}; bag of 3: {0, 1, 3}.
    scores = np.array(
        [
            [0.5, 0.7, 0.1, 0.6],  # 0: bag {0,2}: 0.5 > 0.1 -> rank 1; bag {0,1,3}: 0.7, 0.6 beat 0.5 -> rank 3
            [0.2, 0.4, 0.9, 0.4],  # 1: bag {1,3}: tie 0.4 = 0.4 -> rank 2 (pessimistic); bag {0,1,3}: 0.4 >= 0.4 -> 2
            [0.0, 0.0, 0.3, 0.0],  # 2: bag {0,2}: rank 1; in no bag of 3
            [0.1, 0.2, 0.0, 0.8],  # 3: bag {1,3}: rank 1; bag {0,1,3}: rank 1
        ]
    )
    bags = [[0, 2], [1, 3], [0, 1, 3]]
    out, items = bag_retrieval_items(scores, bags, [0, 1, 2, 3], ks=(1,))
    # bag2: ranks 1, 2, 1, 1 -> R@1 3/4, mean 5/4; bag3: ranks 3, 2, 1 -> R@1 1/3, mean 2, median 2
    assert out == {"bag2/R@1": 0.75, "bag2/mean_rank": 1.25, "bag2/median_rank": 1.0, "bag2/n": 4.0,
                   "bag3/R@1": pytest.approx(1 / 3), "bag3/mean_rank": 2.0, "bag3/median_rank": 2.0,
                   "bag3/n": 3.0}  # fmt: skip
    assert items[0] == {"bag2/R@1": 1.0, "bag2/mean_rank": 1.0, "bag3/R@1": 0.0, "bag3/mean_rank": 3.0}
    assert items[2] == {"bag2/R@1": 1.0, "bag2/mean_rank": 1.0}
    # the bags of one size stay disjoint, and a bag is named by its place among all the bags given
    with pytest.raises(ValueError, match=r"^bag 3 holds image 2, already in bag 0; the bags of one size"):
        bag_retrieval(scores, [[0, 2], [0, 1, 3], [1, 3], [2, 1]], [0, 1, 2, 3])


@dataclass
class Rec:
    image_id: int
    path: Path


class StubRetriever:
    """Images and captions embedded as fixed 2-D unit vectors."""

    def __init__(self, image_vecs, text_vecs):
        self.image_vecs, self.text_vecs = image_vecs, text_vecs

    def image_embeddings(self, records, cache_dir=None):
        return torch.tensor([self.image_vecs[r.image_id] for r in records], dtype=torch.float32)

    def embed_texts(self, texts):
        return torch.tensor([self.text_vecs[t] for t in texts], dtype=torch.float32)


def test_self_retrieval_end_to_end_with_stub():
    c, s = np.cos(0.3), np.sin(0.3)
    images = {0: [1.0, 0.0], 1: [0.0, 1.0], 2: [c, s], 9: [-1.0, 0.0]}
    texts = {"x": [1.0, 0.0], "y": [0.0, 1.0], "z": [1.0, 0.0]}
    recs = [Rec(0, Path("0.png")), Rec(1, Path("1.png")), Rec(2, Path("2.png"))]
    sr = SelfRetrieval(StubRetriever(images, texts), recs, extra_records=[Rec(9, Path("9.png"))],
                       n_distractors=2, draws=2, bags=[[0, 2]], ks=(1,))  # fmt: skip
    out = sr({0: "x", 1: ["y", "z"]})
    # Pool cosines: "x" vs (0, 1, 2, 9) = (1, 0, .955, -1) -> own image 0 rank 1.
    # "y" -> image 1 cos 1 -> rank 1.  "z" (= x) for image 1: cos 0 < 1 (img 0), .955 (img 2) -> rank 3.
    assert out["pool/R@1"] == pytest.approx(2 / 3)
    assert out["pool/mean_rank"] == pytest.approx(5 / 3)
    # Bag {0, 2}: only caption "x" of image 0 is in a bag: 1 >= .955 -> rank 1.
    assert out["bag2/R@1"] == 1.0 and out["bag2/n"] == 1
    assert set(out) >= {"RD2/R@1", "RD2/mean_rank", "RD2/median_rank"}
    per = sr.per_item({0: "x", 1: ["y", "z"]})
    assert per[0] == 1.0  # best score among any distractors
    with pytest.raises(KeyError, match="not among the retrieval images"):
        sr({9: "x"})  # extra images are distractors only


def test_self_retrieval_rejects_unknown_protocol():
    with pytest.raises(ValueError, match="valid: rd, pool, bags"):
        SelfRetrieval(StubRetriever({}, {}), [], protocols=["rd", "nope"])


def test_a_score_that_is_not_finite_is_refused_naming_it():
    # a NaN target score lost every >= comparison: its caption was ranked first (pool rank 0, an RD hit)
    scores = SCORES.copy()
    scores[0, 0] = np.nan
    with pytest.raises(ValueError, match=r"1 caption-image score\(s\) are not finite, the first nan \(caption 0, "):
        target_ranks(scores)
    scores[0, 0], scores[2, 1] = 0.9, np.inf
    with pytest.raises(ValueError, match=r"the first inf \(caption 2, image 1\)"):
        pool_retrieval(torch.as_tensor(scores))


def test_evaluate_refuses_a_bag_listed_under_another_size():
    # {3: [a b c], 5: [d e f]}: the second bag holds 3 images; scored per its length it wrote bag3/* over the first
    # bag's values and no bag5/* at all. Refused before any retriever is loaded.
    with pytest.raises(ValueError, match=r"bags\[5\]\[0\] holds 3 images but is listed under bag size 5"):
        evaluate({i: "x" for i in "abcdef"}, None, metrics="bags", bags={3: [list("abc")], 5: [list("def")]})
