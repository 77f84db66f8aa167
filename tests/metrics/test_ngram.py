"""BLEU / ROUGE-L / CIDEr-D: hand-computed values and equality with pycocoevalcap 1.2, bit for bit (``==``,
docs/metrics.md), corpus and per image."""

from __future__ import annotations

import contextlib
import io
import math
import random

import numpy as np
import pytest
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.cider.cider_scorer import CiderScorer
from pycocoevalcap.rouge.rouge import Rouge, my_lcs

from finecap.metrics.ngram import (
    CiderD,
    bleu,
    bleu_per_item,
    bleu_scorer,
    cider_d,
    cider_d_per_item,
    counting,
    index,
    lcs_lengths,
    ngram_metrics,
    rouge_l,
    rouge_l_per_item,
)

LOG2 = math.log(2.0)


# --------------------------------------------------------------------------------------------------------------------
# pycocoevalcap references
# --------------------------------------------------------------------------------------------------------------------


def coco(metric, preds, refs):
    """pycocoevalcap ``compute_score`` on finecap-style inputs (its Bleu prints; silenced)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return metric.compute_score(refs, {i: [c] for i, c in preds.items()})


class _CorpusLen(list):
    """A list whose len() is the corpus size: pycocoevalcap's compute_cider takes N = log(len(crefs))."""

    def __init__(self, items, n):
        super().__init__(items)
        self.n = n

    def __len__(self):
        return self.n


def coco_cider_fixed_df(corpus_refs, candidates, image_ids):
    """self-critical's CiderD(df=corpus) with pycocoevalcap's own code: df and N of ``corpus_refs``, then each
    candidate against its image's references."""
    base = CiderScorer(n=4, sigma=6.0)
    for r in corpus_refs.values():
        base += (None, r)
    base.compute_doc_freq()
    scorer = CiderScorer(n=4, sigma=6.0)
    scorer.document_frequency = base.document_frequency
    for c, i in zip(candidates, image_ids, strict=True):
        scorer += (c, corpus_refs[i])
    scorer.crefs = _CorpusLen(scorer.crefs, len(corpus_refs))
    return np.array(scorer.compute_cider())


def synthetic(n_images, seed, vocab=40):
    """Seeded captions: lengths 0..16 (empty and one-word ones included), Zipf words (repeats), 1..7 references,
    and predictions that sometimes use words no reference has."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]
    weights = [1 / (i + 1) for i in range(vocab)]
    unseen = [f"novel{i}" for i in range(5)]

    def caption(extra=()):
        k = rng.choice([0, 1, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16])
        pool = words + list(extra)
        w = weights + [0.3] * len(extra)
        return " ".join(rng.choices(pool, w, k=k))

    refs = {i: [caption() for _ in range(rng.randint(1, 7))] for i in range(n_images)}
    preds = {i: caption(unseen) for i in range(n_images)}
    return preds, refs


@pytest.fixture(scope="module")
def corpus():
    return synthetic(700, seed=0)  # ~3,500 captions


# --------------------------------------------------------------------------------------------------------------------
# equality with pycocoevalcap on a generated corpus
# --------------------------------------------------------------------------------------------------------------------


def test_bleu_equals_pycocoevalcap(corpus):
    preds, refs = corpus
    ref_corpus, ref_per = coco(Bleu(4), preds, refs)
    ours, per = bleu_per_item(preds, refs)
    for k in range(4):
        assert ours[f"BLEU-{k + 1}"] == ref_corpus[k]
        assert [per[i][f"BLEU-{k + 1}"] for i in preds] == ref_per[k]


def test_rouge_l_equals_pycocoevalcap(corpus):
    preds, refs = corpus
    ref_corpus, ref_per = coco(Rouge(), preds, refs)
    ours, per = rouge_l_per_item(preds, refs)
    assert ours["ROUGE-L"] == ref_corpus
    assert np.array_equal([per[i]["ROUGE-L"] for i in preds], ref_per)


def test_cider_d_equals_pycocoevalcap(corpus):
    preds, refs = corpus
    ref_corpus, ref_per = coco(Cider(), preds, refs)
    ours, per = cider_d_per_item(preds, refs)
    assert ours["CIDEr-D"] == ref_corpus
    assert np.array_equal([per[i]["CIDEr-D"] for i in preds], ref_per)


def test_ngram_metrics_shares_index_and_matches_single_metrics(corpus):
    preds, refs = corpus
    together, per = ngram_metrics(preds, refs)
    expected = {**bleu(preds, refs), **rouge_l(preds, refs), **cider_d(preds, refs)}
    assert together.keys() == expected.keys()
    assert all(abs(together[k] - expected[k]) <= 1e-12 for k in expected)
    first = next(iter(preds))
    assert set(per[first]) == set(expected)
    only = ngram_metrics(preds, refs, ["cider_d"])[0]
    assert list(only) == ["CIDEr-D"]


EDGE_PREDS = {
    "empty": "",
    "one": "dog",
    "repeat": "a a a a a a",
    "unseen": "zebra quokka zebra",
    "same": "a dog on a mat",
    "long": " ".join(["a", "dog", "on", "a", "mat"] * 6),
    "spaces": "a  dog  runs ",  # double spaces: ROUGE-L's split(" ") makes empty words
    "one_ref": "the cat",
    "ctrl": "a\x01b dog",  # the join sentinel inside a caption: per-sentence fallback
}
EDGE_REFS = {
    "empty": ["a dog", "", "dog"],
    "one": ["dog", "a dog runs"],
    "repeat": ["a cat and a dog"],
    "unseen": ["a cat", "a small cat", "cat on a mat", "two cats", "a cat sleeps", "a cat sits", "cat"],
    "same": ["a dog on a mat"],
    "long": ["a dog on a mat", "dog mat"],
    "spaces": ["a dog runs", "a  dog"],
    "one_ref": ["the cat sat"],
    "ctrl": ["a\x01b dog", "dog"],
}


@pytest.mark.parametrize("name", ["bleu", "rouge", "cider"])
def test_edge_cases_equal_pycocoevalcap(name):
    preds, refs = EDGE_PREDS, EDGE_REFS
    if name == "bleu":
        ref_corpus, ref_per = coco(Bleu(4), preds, refs)
        ours, per = bleu_per_item(preds, refs)
        got = [[per[i][f"BLEU-{k + 1}"] for i in preds] for k in range(4)]
        assert list(ours.values()) == ref_corpus
        assert got == ref_per
    elif name == "rouge":
        ref_corpus, ref_per = coco(Rouge(), preds, refs)
        ours, per = rouge_l_per_item(preds, refs)
        assert ours["ROUGE-L"] == ref_corpus
        assert np.array_equal([per[i]["ROUGE-L"] for i in preds], ref_per)
    else:
        ref_corpus, ref_per = coco(Cider(), preds, refs)
        ours, per = cider_d_per_item(preds, refs)
        assert ours["CIDEr-D"] == ref_corpus
        assert np.array_equal([per[i]["CIDEr-D"] for i in preds], ref_per)


def test_single_image_cider_is_zero_like_pycocoevalcap():
    # N = 1 image: idf = log(1) - log(max(1, df)) = 0 for every n-gram, so every vector is zero
    preds, refs = {7: "a dog"}, {7: ["a dog", "a cat"]}
    assert coco(Cider(), preds, refs)[0] == 0.0
    assert cider_d(preds, refs)["CIDEr-D"] == 0.0


# --------------------------------------------------------------------------------------------------------------------
# hand-computed BLEU
# --------------------------------------------------------------------------------------------------------------------


def test_bleu_hand_computed():
    preds = {1: "a red circle", 2: "a blue square"}
    refs = {1: ["a red circle", "a small red circle"], 2: ["a green square"]}
    corpus, per = bleu_per_item(preds, refs)
    # image 1: closest ref length 3 (no brevity penalty); 1..3-grams all match: p1 = p2 = p3 = 1;
    # no 4-gram: p4 = (0 + 1e-15) / (0 + 1e-9) = 1e-6 -> BLEU-4 = (1 * 1 * 1 * 1e-6) ** (1/4) = 0.0316227766
    assert per[1]["BLEU-1"] == pytest.approx(1.0, abs=1e-9)
    assert per[1]["BLEU-3"] == pytest.approx(1.0, abs=1e-9)
    assert per[1]["BLEU-4"] == pytest.approx(1e-6**0.25, rel=1e-6)
    # image 2: unigrams a, square match: p1 = 2/3; no bigram matches: p2 = 1e-15 / 2
    assert per[2]["BLEU-1"] == pytest.approx(2 / 3, abs=1e-9)
    assert per[2]["BLEU-2"] == pytest.approx((2 / 3 * 1e-15 / 2) ** 0.5, rel=1e-6)
    # corpus: correct 1-grams 3 + 2 = 5 of 6 guesses, total lengths 6 vs 6 -> BLEU-1 = 5/6
    assert corpus["BLEU-1"] == pytest.approx(5 / 6, abs=1e-9)
    # corpus 2-grams: 2 + 0 correct of 2 + 2 -> BLEU-2 = sqrt(5/6 * 2/4) = 0.6454972
    assert corpus["BLEU-2"] == pytest.approx((5 / 6 * 2 / 4) ** 0.5, abs=1e-9)


def test_bleu_brevity_penalty_clipping_and_closest_tie():
    # short candidate: testlen 2, reflen 4 -> BP = exp(1 - 4/2) = e^-1; p1 = 2/2
    assert bleu({0: "a dog"}, {0: ["a dog runs fast"]})["BLEU-1"] == pytest.approx(math.exp(-1), abs=1e-9)
    # clipping: "the" x4 but at most once in a reference -> p1 = 1/4 (testlen 4 >= reflen 2: no penalty)
    assert bleu({0: "the the the the"}, {0: ["the cat"]})["BLEU-1"] == pytest.approx(0.25, abs=1e-9)
    # 'closest' tie between reference lengths 2 and 4 for a 3-word candidate picks the shorter (2): no penalty
    # (picking 4 would give exp(1 - 4/3) = 0.7165)
    assert bleu({0: "a b c"}, {0: ["a b c d", "a b"]})["BLEU-1"] == pytest.approx(1.0, abs=1e-9)


# --------------------------------------------------------------------------------------------------------------------
# hand-computed ROUGE-L and LCS
# --------------------------------------------------------------------------------------------------------------------


def test_rouge_l_hand_computed():
    # LCS("a b c d", "a c e d f") = 3 (a c d): P = 3/4, R = 3/5,
    # F = (1 + 1.2^2) P R / (R + 1.2^2 P) = 2.44 * 0.45 / (0.6 + 1.08) = 1.098 / 1.68 = 0.6535714
    assert rouge_l({0: "a b c d"}, {0: ["a c e d f"]})["ROUGE-L"] == pytest.approx(1.098 / 1.68, abs=1e-12)
    # precision and recall are maximised separately over references:
    # ref "a b": lcs 2 -> P 2/3, R 1; ref "a x y z w": lcs 1 -> P 1/3, R 1/5; so P = 2/3, R = 1
    # F = 2.44 * (2/3) / (1 + 1.44 * 2/3) = 1.626667 / 1.96 = 0.829932
    f = rouge_l({0: "a b c"}, {0: ["a b", "a x y z w"]})["ROUGE-L"]
    assert f == pytest.approx(2.44 * (2 / 3) / (1 + 1.44 * 2 / 3), abs=1e-12)
    # quirks: "".split(" ") == [""], so an empty candidate matches an empty reference perfectly
    assert rouge_l({0: ""}, {0: [""]})["ROUGE-L"] == pytest.approx(1.0)
    assert rouge_l({0: ""}, {0: ["a b"]})["ROUGE-L"] == 0.0


def test_lcs_lengths_bitparallel_and_long_fallback():
    rng = random.Random(3)
    a, b = [], []
    for la, lb in [(0, 3), (1, 1), (5, 7), (63, 64), (64, 64), (65, 20), (20, 65), (70, 90), (130, 3)]:
        a.append([rng.choice("abcd") for _ in range(la)])
        b.append([rng.choice("abcd") for _ in range(lb)])
    got = lcs_lengths(a, b)
    assert got.tolist() == [my_lcs(x, y) for x, y in zip(a, b, strict=True)]
    # hand: LCS("abcbdab", "bdcaba") = 4 (e.g. "bcba")
    assert lcs_lengths([list("abcbdab")], [list("bdcaba")]).tolist() == [4]


# --------------------------------------------------------------------------------------------------------------------
# hand-computed CIDEr-D
# --------------------------------------------------------------------------------------------------------------------

TWO_IMAGES = {1: ["a b"], 2: ["c d"]}  # N = 2 images, every n-gram in one image: idf = log 2 - log 1 = log 2


def test_cider_d_identical_caption():
    # "a b" vs its own reference: unigram and bigram cosines are 1, no 3-/4-grams (zero norms: cosine 0);
    # score = mean(1, 1, 0, 0) / 1 reference * 10 = 5
    scores = cider_d_per_item({1: "a b", 2: "c d"}, TWO_IMAGES)[1]
    assert scores[1]["CIDEr-D"] == pytest.approx(5.0, abs=1e-12)


def test_cider_d_length_penalty():
    # "c" vs "c d": unigram vectors [l] and [l, l] (l = log 2): cosine = l*l / (l * l*sqrt 2) = 1/sqrt 2;
    # bigram counts 0 vs 1 -> delta = -1, penalty exp(-1 / (2 * 6^2)) = exp(-1/72)
    # score = 10 * (1/sqrt 2 * exp(-1/72) + 0 + 0 + 0) / 4
    score = cider_d_per_item({1: "a b", 2: "c"}, TWO_IMAGES)[1][2]["CIDEr-D"]
    assert score == pytest.approx(10 * (2**-0.5 * math.exp(-1 / 72)) / 4, abs=1e-12)


def test_cider_d_clipping_and_unseen_ngram():
    # "a a" vs "a b": unigram tf a = 2 -> v_c = [2l], v_r = [l, l]; clipped dot min(2l, l) * l = l^2;
    # cosine = l^2 / (2l * l sqrt 2) = 1 / (2 sqrt 2). Bigram "a a" is in no reference: df 0 -> weight
    # 1 * (log 2 - log max(1, 0)) = l, but it matches nothing: cosine 0. Equal bigram counts: no penalty.
    # score = 10 * (1 / (2 sqrt 2)) / 4 = 0.8838835
    score = cider_d_per_item({1: "a a", 2: "c d"}, TWO_IMAGES)[1][1]["CIDEr-D"]
    assert score == pytest.approx(10 / (2 * 2**0.5) / 4, abs=1e-12)
    assert score == coco(Cider(), {1: "a a", 2: "c d"}, TWO_IMAGES)[1][0]


def test_cider_d_divides_by_number_of_references():
    # image 1 has the same reference twice: each gives the same cosines, the sum is divided by 2 references
    refs = {1: ["a b", "a b"], 2: ["c d"]}
    assert cider_d_per_item({1: "a b", 2: "c d"}, refs)[1][1]["CIDEr-D"] == pytest.approx(5.0, abs=1e-12)


# --------------------------------------------------------------------------------------------------------------------
# document frequencies from a fixed corpus and the reward form
# --------------------------------------------------------------------------------------------------------------------


def test_df_references_equal_evaluated_references_is_default(corpus):
    preds, refs = corpus
    a = cider_d(preds, refs)["CIDEr-D"]
    b = cider_d(preds, refs, df_references=refs)["CIDEr-D"]
    assert a == pytest.approx(b, abs=1e-12)


def test_df_from_fixed_corpus_equals_pycocoevalcap_fixed_df():
    corpus_preds, corpus_refs = synthetic(300, seed=1)
    eval_ids = list(corpus_refs)[:60]
    preds = {i: corpus_preds[i] for i in eval_ids}
    refs = {i: corpus_refs[i] for i in eval_ids}
    ours = cider_d_per_item(preds, refs, df_references=corpus_refs)[1]
    ref = coco_cider_fixed_df(corpus_refs, list(preds.values()), eval_ids)
    assert np.array_equal([ours[i]["CIDEr-D"] for i in eval_ids], ref)
    # with N = 300 images the idf weights differ from evaluation-set document frequencies
    assert cider_d(preds, refs)["CIDEr-D"] != pytest.approx(float(ref.mean()), abs=1e-6)


def test_reward_scores_batches_against_precomputed_corpus():
    corpus_preds, corpus_refs = synthetic(250, seed=2)
    reward = CiderD(corpus_refs)
    rng = random.Random(5)
    other_preds, _ = synthetic(250, seed=6)
    # an SCST-like batch: 5 samples for each of 20 images, candidates drawn from other captions (unseen words too)
    ids = [i for i in rng.sample(list(corpus_refs), 20) for _ in range(5)]
    cands = [other_preds[rng.randrange(250)] for _ in ids] + ["", "novel0 novel0 novel1"]
    ids += ids[:2]
    got = reward.score(cands, ids)
    ref = coco_cider_fixed_df(corpus_refs, cands, ids)
    assert got.shape == (len(cands),)
    assert np.array_equal(got, ref)
    # scoring again (and in another batch composition) gives the same numbers: the references are not re-processed
    assert np.array_equal(reward.score(cands[:7], ids[:7]), got[:7])
    # one caption per image over the whole corpus: exactly pycocoevalcap's evaluation CIDEr-D
    ids_all = list(corpus_refs)
    full = reward.score([corpus_preds[i] for i in ids_all], ids_all)
    ref_full = coco(Cider(), corpus_preds, corpus_refs)[1]
    assert np.array_equal(full, ref_full)


def test_reward_small_batches_take_the_batch_paths():
    # a few candidates against a larger corpus: the n-gram lookups go through the hash table and the reference rows
    # are searched per image (the paths a training batch takes on a real corpus); same numbers as the big batch
    corpus_preds, corpus_refs = synthetic(250, seed=3)
    reward = CiderD(corpus_refs)
    ids = list(corpus_refs)[::25]
    cands = [corpus_preds[i] for i in ids]
    # one caption of <= 16 words has < 64 n-grams: 16 x that is below the sizes where the batch paths switch on
    assert len(reward._index.rows) > 64 * 16 and len(reward._index.grams.tables[1]) > 16 * 16
    one_by_one = np.array([reward.score([c], [i])[0] for c, i in zip(cands, ids, strict=True)])
    assert np.array_equal(one_by_one, coco_cider_fixed_df(corpus_refs, cands, ids))
    assert 2 in reward._index.grams._hashes  # the bigram table got its hash index


def test_hash_table_finds_like_searchsorted(monkeypatch):
    rng = np.random.default_rng(1)
    keys = np.unique(rng.integers(0, 10**12, 5000))
    queries = np.concatenate([rng.choice(keys, 300), rng.integers(0, 10**12, 300)])
    ref_found, ref_pos = counting.find_sorted(keys, queries)
    expected = sorted(zip(ref_found.tolist(), ref_pos.tolist(), strict=True))
    found, pos = counting.HashTable(keys).find(queries)
    assert sorted(zip(found.tolist(), pos.tolist(), strict=True)) == expected
    # every key in one bucket: 8 slots, the rest in the overflow array, still found
    monkeypatch.setattr(counting.HashTable, "_bucket", lambda self, q: np.zeros(len(q), dtype=np.int64))
    table = counting.HashTable(keys)
    assert len(table.overflow) == len(keys) - 8 and table.spilled[0]
    found, pos = table.find(queries)
    assert sorted(zip(found.tolist(), pos.tolist(), strict=True)) == expected


def test_reward_hand_computed_and_errors():
    reward = CiderD(TWO_IMAGES)
    # same numbers as the hand-computed evaluation cases (df and N = 2 from the two images)
    got = reward.score(["a b", "c", "a a"], [1, 2, 1])
    assert got == pytest.approx([5.0, 10 * (2**-0.5 * math.exp(-1 / 72)) / 4, 10 / (2 * 2**0.5) / 4], abs=1e-12)
    assert reward(["a b"], [1]) == pytest.approx([5.0])
    assert reward.score([], []).shape == (0,)
    assert 1 in reward and 3 not in reward and len(reward) == 2
    with pytest.raises(KeyError, match="image id 3"):
        reward.score(["a"], [3])
    with pytest.raises(ValueError, match="2 candidates but 1 image ids"):
        reward.score(["a", "b"], [1])
    with pytest.raises(ValueError, match=r"references\[5\]"):
        CiderD({5: []})


# --------------------------------------------------------------------------------------------------------------------
# input checks and internals
# --------------------------------------------------------------------------------------------------------------------


def test_input_errors_name_the_record():
    with pytest.raises(ValueError, match="no entry for prediction id 'x'"):
        bleu({"x": "a"}, {"y": ["a"]})
    with pytest.raises(ValueError, match=r"references\['x'\]: empty"):
        rouge_l({"x": "a"}, {"x": []})
    with pytest.raises(TypeError, match=r"predictions\['x'\]"):
        cider_d({"x": ["a"]}, {"x": ["a"]})
    with pytest.raises(TypeError, match=r"references\['x'\]"):
        bleu({"x": "a"}, {"x": "a"})
    with pytest.raises(ValueError, match="empty"):
        bleu({}, {})
    with pytest.raises(ValueError, match="valid: \\['bleu', 'rouge_l', 'cider_d'\\]"):
        ngram_metrics({"x": "a"}, {"x": ["a"]}, ["meteor"])


def test_extra_references_are_ignored():
    # like COCOEvalCap: the evaluated images are those of the predictions
    preds = {1: "a b", 2: "c d"}
    assert cider_d(preds, {**TWO_IMAGES, 3: ["e f"]}) == cider_d(preds, TWO_IMAGES)


def test_order_of_distinct_is_argsort():
    # CIDEr-D's summing orders (first occurrences: distinct positions) by a counting sort instead of np.argsort
    rng = np.random.default_rng(0)
    for size, bound in [(0, 0), (1, 1), (1000, 1000), (1000, 50_000)]:
        values = rng.choice(bound, size=size, replace=False)
        assert np.array_equal(counting.order_of_distinct(values, bound), np.argsort(values))


def test_cider_d_occurrences_sorted_packed_or_through_their_permutation_alike(corpus, monkeypatch):
    # RefIndex._order sorts CIDEr-D's occurrences with their position in the key's low bits where it fits in an
    # int64 (this corpus), else through np.argsort's permutation: the same scores, bit for bit, either way
    preds, refs = corpus
    packed = cider_d_per_item(preds, refs)
    sorts = []
    real_argsort = np.argsort
    monkeypatch.setattr(index.np, "argsort", lambda *a, **k: sorts.append(1) or real_argsort(*a, **k))
    assert cider_d_per_item(preds, refs) == packed and not sorts  # packed: no argsort
    monkeypatch.setattr(index, "_PACKED_BITS", 0)
    assert cider_d_per_item(preds, refs) == packed and len(sorts) == 4  # one per order


def test_dense_ids_and_find_fallbacks():
    rng = np.random.default_rng(0)
    small = rng.integers(0, 50, 200)
    huge = rng.integers(2**60, 2**62, 200)  # too large to pack the position: np.unique path
    for code in (small, huge):
        uniq, inv = counting.dense_ids(code)
        ref_u, ref_inv = np.unique(code, return_inverse=True)
        assert np.array_equal(uniq, ref_u) and np.array_equal(inv, ref_inv)
    table = np.array([2, 5, 9, 14])
    found, pos = counting.find_sorted(table, np.array([14, 3, 2, 9, 20]))  # unsorted queries
    assert sorted(zip(found.tolist(), pos.tolist(), strict=True)) == [(0, 3), (2, 0), (3, 2)]


def test_ngram_metrics_shared_word_ids_give_separate_rouge_scores():
    # With BLEU/CIDEr-D, ROUGE-L reuses the index's word ids when every caption's split(" ") equals its split();
    # otherwise (an empty caption, a double space) it re-encodes. Both must equal rouge_l_per_item exactly.
    import random

    rng = random.Random(0)
    words = [f"w{i}" for i in range(30)]
    preds = {i: " ".join(rng.choices(words, k=rng.randint(1, 9))) for i in range(40)}
    refs = {i: [" ".join(rng.choices(words, k=rng.randint(1, 12))) for _ in range(3)] for i in range(40)}
    for p, r in [(preds, refs), ({**preds, 3: ""}, refs), (preds, {**refs, 5: ["a  b", "c"]})]:
        corpus, per = ngram_metrics(p, r)
        alone, alone_per = rouge_l_per_item(p, r)
        assert corpus["ROUGE-L"] == alone["ROUGE-L"]
        assert {i: v["ROUGE-L"] for i, v in per.items()} == {i: v["ROUGE-L"] for i, v in alone_per.items()}
        assert ngram_metrics(p, r, per_item=False) == (corpus, {})


def test_bleu_sorted_groups_equal_reference_index_path(corpus, monkeypatch):
    """bleu_per_item's one-sort-per-order counting and RefIndex.bleu (used by ngram_metrics) agree bit for bit,
    also on the edge cases; keys that would overflow int64 take the reference-index path."""
    for preds, refs in [corpus, (EDGE_PREDS, EDGE_REFS), synthetic(300, seed=3, vocab=6)]:
        ids, p, r = counting.align(preds, refs)
        c_new, per_new = bleu_scorer.bleu_arrays(p, r, 4)
        c_old, per_old = index.RefIndex(r, 4, cider=False, extra=p).bleu(p, np.arange(len(ids)))
        assert np.array_equal(c_new, c_old) and np.array_equal(per_new, per_old)
        assert per_new[:, 0].max() > 0.5  # matches were found (not an all-zero agreement)
    expected = bleu(*corpus)  # sorted-groups path
    calls = []
    real = bleu_scorer.RefIndex
    monkeypatch.setattr(bleu_scorer, "RefIndex", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(bleu_scorer, "_BLEU_KEY_LIMIT", 0)
    assert bleu(*corpus) == expected and len(calls) == 1
