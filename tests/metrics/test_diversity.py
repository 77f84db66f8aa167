"""Diversity / vocabulary metrics and pairwise sentence BLEU: hand-computed values and pycocoevalcap equality."""

from __future__ import annotations

import contextlib
import io
import math
import random

import numpy as np
import pytest
from pycocoevalcap.bleu.bleu import Bleu

from finecap.metrics.diversity import (
    bleu_distance,
    caption_length,
    caption_words,
    div_n,
    lexical_diversity,
    mbleu,
    mean_length,
    pairwise_bleu,
    pairwise_bleu_groups,
    set_diversity,
    set_diversity_per_item,
    vocabulary_metrics,
    vocabulary_usage,
)


def test_length_lexical_diversity_vocab_usage():
    caps = ["a dog", "a dog runs", "a cat", "a a", ""]
    # words: 2 + 3 + 2 + 2 + 0 = 9 over 5 captions -> 1.8
    assert mean_length(caps) == pytest.approx(1.8)
    # distinct words: a, dog, runs, cat -> 4
    assert lexical_diversity(caps) == 4
    # counts: a 5, dog 2, runs 1, cat 1 -> used >= 5 times: {a}; >= 2 times: {a, dog}
    assert vocabulary_usage(caps) == 1
    assert vocabulary_usage(caps, min_count=2) == 2
    out = vocabulary_metrics({i: c for i, c in enumerate(caps)})
    assert out == {"Length": pytest.approx(1.8), "Lexical diversity": 4.0, "Vocab usage": 1.0}
    assert mean_length([]) == 0.0


def test_caption_words_are_ptb_tokens():
    # lower-cased, punctuation dropped, contractions split as pycocoevalcap's PTB tokenizer does
    assert caption_words("A man's dog can't swim, really.") == ["a", "man", "'s", "dog", "ca", "n't", "swim", "really"]
    assert caption_length("A red circle.") == 3 == caption_length("a red circle")
    assert caption_length("") == 0


def test_corpus_metrics_count_words_of_captions_as_written():
    caps = ["A dog.", "a Dog runs!", "a cat,", "A a", ""]  # the captions of the test above, as a model writes them
    assert mean_length(caps) == pytest.approx(1.8)
    assert lexical_diversity(caps) == 4 and vocabulary_usage(caps) == 1
    assert vocabulary_metrics(dict(enumerate(caps))) == {"Length": pytest.approx(1.8), "Lexical diversity": 4.0,
                                                         "Vocab usage": 1.0}  # fmt: skip


def test_div_n_hand_computed():
    samples = {"x": ["a b a", "a c"], "y": ["d d", "d d"]}
    # x: unigrams {a, b, c} = 3, bigrams {ab, ba, ac} = 3, words 3 + 2 = 5 -> 3 / (5 + 1e-6) each
    # y: unigrams {d} = 1, bigrams {dd} = 1, words 4 -> 1 / (4 + 1e-6)
    d1, per1 = div_n(samples, 1)
    d2, per2 = div_n(samples, 2)
    assert per1["x"] == pytest.approx(3 / (5 + 1e-6), abs=1e-15)
    assert per1["y"] == pytest.approx(1 / (4 + 1e-6), abs=1e-15)
    assert per2["x"] == pytest.approx(3 / (5 + 1e-6), abs=1e-15)
    assert d1 == pytest.approx((3 / (5 + 1e-6) + 1 / (4 + 1e-6)) / 2, abs=1e-15)
    assert d2 == pytest.approx((3 / (5 + 1e-6) + 1 / (4 + 1e-6)) / 2, abs=1e-15)
    assert div_n({"e": ["", ""]}, 1)[0] == 0.0  # 0 / (0 + 1e-6)


def test_mbleu_hand_computed():
    # one image, two identical 4-word captions: each is BLEU-4 = 1 against the other -> mBLEU-4 = 1
    assert mbleu({0: ["a b c d", "a b c d"]})[0] == pytest.approx(1.0, abs=1e-8)
    # "a b" vs "c d": no unigram in common -> p1 = 1e-15 / 2: BLEU-1 ~ 5e-16 both ways
    assert mbleu({0: ["a b", "c d"]}, n=1)[0] == pytest.approx(0.0, abs=1e-12)
    # three captions, n = 1: round 0 "a b" vs refs {"a c", "b c"}: clipped a 1, b 1 -> 2/2 = 1, closest ref len 2
    # round 1 "a c" vs {"a b", "b c"}: 2/2 = 1; round 2 "b c" vs {"a b", "a c"}: 2/2 = 1 -> mBLEU-1 = 1
    assert mbleu({0: ["a b", "a c", "b c"]}, n=1)[0] == pytest.approx(1.0, abs=1e-8)


def test_mbleu_4_pools_each_round_over_images_and_averages_sentences_per_image():
    samples = {"A": ["a b c d e", "a b c d f"], "B": ["a b c d", "a b c d e f"]}
    # sentence BLEU-4 (hypothesis vs the other caption; clipped matches / n-grams of the hypothesis, orders 1..4):
    #   A, either round: 4/5, 3/4, 2/3, 1/2 -> (1/5)^(1/4), equal lengths: no brevity penalty
    #   B round 0 "a b c d" vs 6 words: all 1, brevity penalty exp(1 - 6/4) -> exp(-1/2)
    #   B round 1 6 words vs "a b c d": 4/6, 3/5, 2/4, 1/3 = 1/15 -> (1/15)^(1/4), longer: no penalty
    a = 0.2**0.25
    b = (math.exp(-0.5) + (1 / 15) ** 0.25) / 2
    corpus, per = mbleu(samples)
    assert per["A"] == pytest.approx(a, abs=1e-8)
    assert per["B"] == pytest.approx(b, abs=1e-8)
    # corpus BLEU-4 per round, counts summed over images (A's and B's captions of that round):
    #   round 0: matches 4+4, 3+3, 2+2, 1+1 over n-grams 5+4, 4+3, 3+2, 2+1 -> 384/945;
    #            hypothesis words 5+4 = 9 against reference words 5+6 = 11: brevity penalty exp(1 - 11/9)
    #   round 1: the same matches over 5+6, 4+5, 3+4, 2+3 -> 384/3465; 11 words against 9: no penalty
    rounds = ((384 / 945) ** 0.25 * math.exp(1 - 11 / 9), (384 / 3465) ** 0.25)
    assert corpus == pytest.approx(sum(rounds) / 2, abs=1e-8)  # 0.60815
    assert abs(corpus - (a + b) / 2) > 4e-3  # not the mean of the sentence values (0.61304)


def reference_div_stats(samples):
    """Shetty et al. / self-critical.pytorch eval_div_stats (compute_div_n + the mBLEU loop), written out here."""

    def div(n):
        vals = []
        for caps in samples.values():
            grams, total = set(), 0.0
            for c in caps:
                t = c.split()
                total += len(t)
                grams.update(zip(*[t[i:] for i in range(n)], strict=False))
            vals.append(len(grams) / (1e-6 + total))
        return float(np.mean(vals))

    s = len(next(iter(samples.values())))
    scores = []
    for i in range(s):
        refs = {k: v[:i] + v[i + 1 :] for k, v in samples.items()}
        cands = {k: [v[i]] for k, v in samples.items()}
        with contextlib.redirect_stdout(io.StringIO()):
            scores.append(Bleu(4).compute_score(refs, cands)[0][3])
    return {"Div-1": div(1), "Div-2": div(2), "mBLEU-4": float(np.mean(scores))}


def random_groups(n_groups, s, seed, vocab="a b c d e f g"):
    rng = random.Random(seed)
    words = vocab.split()
    return [
        [" ".join(rng.choice(words) for _ in range(rng.choice([0, 1, 2, 3, 4, 5, 7, 10]))) for _ in range(s)]
        for _ in range(n_groups)
    ]


def test_set_diversity_equals_reference_implementation():
    samples = dict(enumerate(random_groups(80, 5, seed=0)))
    ours = set_diversity(samples)
    ref = reference_div_stats(samples)
    assert ours.keys() == ref.keys()
    assert all(abs(ours[k] - ref[k]) <= 1e-9 for k in ref)
    corpus, per = set_diversity_per_item(samples)
    assert set(per[0]) == {"Div-1", "Div-2", "mBLEU-4"}
    assert np.mean([p["Div-2"] for p in per.values()]) == pytest.approx(corpus["Div-2"])


def test_set_diversity_errors():
    with pytest.raises(ValueError, match=r"samples\['a'\]: needs at least 2"):
        mbleu({"a": ["one caption"]})
    with pytest.raises(TypeError, match=r"samples\['a'\]"):
        div_n({"a": "a dog"}, 1)
    with pytest.raises(ValueError, match="empty"):
        set_diversity({})


def test_pairwise_bleu_hand_computed():
    b2 = pairwise_bleu(["a red circle", "a red square"], 2)
    # unigrams: a, red shared -> p1 = 2/3; bigrams: "a red" shared -> p2 = 1/2; equal lengths: no penalty
    # BLEU-2 = sqrt(2/3 * 1/2) = 0.5773503 both ways; diagonal = 1
    assert b2[0, 1] == pytest.approx(math.sqrt(1 / 3), abs=1e-9)
    assert b2[1, 0] == pytest.approx(math.sqrt(1 / 3), abs=1e-9)
    assert np.diag(b2) == pytest.approx([1.0, 1.0], abs=1e-9)
    b1 = pairwise_bleu(["a b", "a b c d"], 1)
    # "a b" against "a b c d": p1 = 2/2, brevity penalty exp(1 - 4/2) = e^-1
    # "a b c d" against "a b": p1 = 2/4, no penalty (longer than the reference): not symmetric
    assert b1[0, 1] == pytest.approx(math.exp(-1), abs=1e-9)
    assert b1[1, 0] == pytest.approx(0.5, abs=1e-9)
    # a 2-word caption against itself: p3 = (0 + 1e-15) / (0 + 1e-9) = 1e-6 -> BLEU-3 = (1 * 1 * 1e-6)^(1/3) = 0.01
    assert pairwise_bleu(["a b"], 3)[0, 0] == pytest.approx(0.01, rel=1e-6)


def test_pairwise_bleu_equals_pycocoevalcap_sentence_bleu():
    groups = random_groups(25, 5, seed=1)
    got = pairwise_bleu_groups(groups, 4)  # (G, 4, s, s)
    gts, res = {}, {}
    for g, caps in enumerate(groups):
        for i in range(5):
            for j in range(5):
                gts[(g, i, j)], res[(g, i, j)] = [caps[j]], [caps[i]]
    with contextlib.redirect_stdout(io.StringIO()):
        _, per = Bleu(4).compute_score(gts, res)
    for idx, (g, i, j) in enumerate(gts):
        for k in range(4):
            assert abs(got[g, k, i, j] - per[k][idx]) <= 1e-9


def test_bleu_distance_and_shapes():
    groups = [["a b c d e", "a b c d f", "x y z w v"], ["p q r s", "p q r s", "p q"]]
    d = bleu_distance(groups)
    b = pairwise_bleu_groups(groups, 4)
    assert d.shape == (2, 3, 3)
    assert np.allclose(d, 1 - (b[:, 2] + b[:, 3]) / 2)
    # identical 4-word captions: BLEU-3 = BLEU-4 = 1 -> distance 0; disjoint captions -> distance ~1
    assert d[1, 0, 1] == pytest.approx(0.0, abs=1e-8)
    assert d[0, 0, 2] == pytest.approx(1.0, abs=1e-6)
    assert pairwise_bleu(["a b", "c"], 2).shape == (2, 2)
    with pytest.raises(ValueError, match="same number of captions"):
        pairwise_bleu_groups([["a"], ["a", "b"]])
    with pytest.raises(ValueError, match="n must be >= 1"):
        pairwise_bleu(["a"], 0)


def test_the_suite_refuses_captions_given_as_strings_and_scores_the_predicted_images_samples():
    # a string was split into its letters: a caption equal to its reference scored BLEU-4 ~0 and CIDEr-D 0
    from finecap.metrics.suite import evaluate, evaluate_items

    with pytest.raises(TypeError, match=r"references\[1\]: expected a list of captions, got a string"):
        evaluate({1: "a red circle"}, {1: "a red circle"}, metrics="bleu")
    with pytest.raises(TypeError, match=r"samples\[1\]: expected a list of captions, got a string"):
        evaluate({1: "a red circle"}, None, metrics="diversity", samples={1: "a red circle"})
    # samples of an image that was not predicted are not scored (they were, in the mean and as a row of their own)
    samples = {1: ["a red circle", "a red square"], 2: ["two dogs", "two cats"]}
    corpus, items = evaluate_items({1: "a red circle"}, None, metrics="diversity", samples=samples)
    alone, _ = evaluate_items({1: "a red circle"}, None, metrics="diversity", samples={1: samples[1]})
    assert corpus == alone and list(items) == [1]
    with pytest.raises(ValueError, match="samples: none is of a predicted image"):
        evaluate({3: "a dog"}, None, metrics="diversity", samples=samples)
    # a predicted image without samples was left out of the means silently: Div-1 of image 1 passed for both images'
    with pytest.raises(ValueError, match=r"samples: none for 1 of the 2 predicted images, e.g. \[3\]"):
        evaluate({1: "a red circle", 3: "a dog"}, None, metrics="diversity", samples=samples)
