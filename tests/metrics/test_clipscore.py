"""CLIPScore / RefCLIPScore against hand-computed values."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from finecap.metrics.clipscore import HESSEL_PREFIX, CLIPScore, clip_score, ref_clip_score, resolve_prefix, with_prefix
from finecap.models.tokenizer import world_tokenizer

IMAGES = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
TEXTS = np.array([[0.6, 0.8], [0.6, 0.8], [-1.0, 0.0]])


def test_clip_score_hand_computed():
    # cosines: 0.6, 0.8, -1 -> 2.5 * max(cos, 0) = 1.5, 2.0, 0.0
    np.testing.assert_allclose(clip_score(IMAGES, TEXTS), [1.5, 2.0, 0.0])


def test_clip_score_normalises_inputs_and_takes_w():
    # [2, 0] . [3, 4] / (2 * 5) = 0.6 -> w=1: 0.6
    np.testing.assert_allclose(clip_score(torch.tensor([[2.0, 0.0]]), np.array([[3.0, 4.0]]), w=1.0), [0.6])


def test_clip_score_shape_mismatch():
    with pytest.raises(ValueError, match="must match"):
        clip_score(IMAGES, TEXTS[:2])


def test_ref_clip_score_hand_computed():
    cs = clip_score(IMAGES, TEXTS)  # [1.5, 2.0, 0.0]
    refs = [
        np.array([[1.0, 0.0], [0.0, 1.0]]),  # cos with [.6, .8]: .6, .8 -> max .8
        np.array([[-1.0, 0.0]]),  # cos -.6 -> clipped to 0
        np.array([[-2.0, 0.0]]),  # cos with [-1, 0] = 1, but CLIP-S is 0
    ]
    out = ref_clip_score(cs, TEXTS, refs)
    # item 0: 2 * 1.5 * .8 / (1.5 + .8) = 2.4 / 2.3; item 1: H-mean with 0 = 0; item 2: 2 * 0 * 1 / 1 = 0
    np.testing.assert_allclose(out, [2.4 / 2.3, 0.0, 0.0])


def test_ref_clip_score_both_parts_zero_is_zero_not_nan():
    out = ref_clip_score([0.0], [[1.0, 0.0]], [np.array([[-1.0, 0.0]])])
    assert out.tolist() == [0.0]


def test_ref_clip_score_needs_one_reference_set_per_candidate():
    with pytest.raises(ValueError, match="2 candidates but 1 reference sets"):
        ref_clip_score([1.0, 1.0], TEXTS[:2], [np.array([[1.0, 0.0]])])


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_an_embedding_that_is_not_finite_is_refused_not_scored_0(bad):
    # A NaN caption embedding (a half precision overflow gives inf, and inf / inf = NaN) has a NaN cosine: CLIP-S was
    # NaN but RefCLIP-S 0.0, since the harmonic mean's "total > 0" is False for NaN: a made-up 0 in the mean.
    texts = np.array([[bad, 1.0], [0.6, 0.8]])
    with pytest.raises(ValueError, match="caption embeddings: 1 embedding.* not finite, the first of row 0"):
        clip_score(IMAGES[:2], texts)
    with pytest.raises(ValueError, match="caption embeddings: 1 embedding.* not finite"):
        ref_clip_score([1.5, 2.0], texts, [np.array([[0.0, 1.0]]), np.array([[0.6, 0.8]])])
    with pytest.raises(ValueError, match="reference embeddings of candidate 1: 1 embedding.* not finite"):
        ref_clip_score([1.5, 2.0], TEXTS[:2], [np.array([[0.0, 1.0]]), np.array([[1.0, 0.0], [bad, 0.8]])])
    with pytest.raises(ValueError, match="image embeddings: 1 embedding.* not finite"):
        clip_score(texts[::-1], TEXTS[:2])


def test_prefix_auto_world_tokenizer_has_no_prefix_words():
    assert resolve_prefix(world_tokenizer(), None) == ""  # "photo", "depicts" are <unk> in the world vocabulary
    assert resolve_prefix(world_tokenizer(), "a") == "a"  # explicit wins


def test_prefix_auto_keeps_hessel_prefix_when_tokenizer_knows_it():
    tok = world_tokenizer(["a", "photo", "depicts", "red"])
    assert resolve_prefix(tok, None) == HESSEL_PREFIX


def test_with_prefix_adds_one_space():
    assert with_prefix(["a red circle"], HESSEL_PREFIX) == ["A photo depicts a red circle"]
    assert with_prefix(["a red circle"], "") == ["a red circle"]


@dataclass
class Rec:
    image_id: int
    path: Path


class StubRetriever:
    def __init__(self):
        self.tokenizer = world_tokenizer(["a", "photo", "depicts", "x", "y", "r"])
        self.seen: list[str] = []
        self.cache_dirs: list = []

    def image_embeddings(self, records, cache_dir=None):
        return torch.tensor(IMAGES[[r.image_id for r in records]])

    def text_embeddings(self, texts, cache_dir=None):
        self.cache_dirs.append(cache_dir)
        return self.embed_texts(texts)

    def embed_texts(self, texts):
        self.seen += list(texts)
        table = {"x": [0.6, 0.8], "y": [-1.0, 0.0], "r": [0.0, 1.0]}
        return torch.tensor([table[t.split()[-1]] for t in texts])


def test_clipscore_class_prefix_and_means():
    stub = StubRetriever()
    cs = CLIPScore(stub, [Rec(0, Path("0.png")), Rec(2, Path("2.png"))])
    assert cs.prefix == HESSEL_PREFIX  # the stub tokenizer knows every prefix word
    out = cs({0: "x", 2: "y"}, {0: ["r"], 2: ["x", "r"]})
    # CLIP-S: image 0 vs x: 2.5 * .6 = 1.5; image 2 = [1, 0] vs y = [-1, 0]: 0 -> mean 0.75
    assert out["CLIPScore"] == pytest.approx(0.75)
    # Ref part: x vs r = .8 -> 2 * 1.5 * .8 / 2.3; y vs (x, r): max(-.6, 0) = 0 -> 0. Mean = 1.2 / 2.3.
    assert out["RefCLIPScore"] == pytest.approx(1.2 / 2.3)
    assert stub.seen[:2] == ["A photo depicts x", "A photo depicts y"]
    assert "A photo depicts r" in stub.seen  # references are prefixed too (as in the authors' code)
    # NDLB's ClipSc = 100 * cos, unclipped per caption: (100 * .6 + 100 * -1) / 2 = -20, corpus mean clipped at 0.
    assert out["ClipSc"] == 0.0
    assert cs.per_item({2: "y"})[2]["ClipSc"] == pytest.approx(-100.0)
    assert cs({0: "x"})["ClipSc"] == pytest.approx(60.0)  # 100 * .6 = 40 * CLIP-S (1.5)
    assert set(cs({0: "x"})) == {"CLIPScore", "ClipSc"}
    with pytest.raises(KeyError, match="not among the CLIPScore images"):
        cs({5: "x"})
    assert stub.cache_dirs == [None]  # only the call with references: they go through the text cache (off here)
    CLIPScore(stub, [Rec(0, Path("0.png"))], cache_dir="c")({0: "x"}, {0: ["r"]})
    assert stub.cache_dirs[-1] == "c"


def test_clipscore_class_names_the_image_whose_embedding_is_not_finite():
    stub = StubRetriever()
    cs = CLIPScore(stub, [Rec(0, Path("0.png")), Rec(2, Path("2.png"))])
    embed = stub.embed_texts
    stub.embed_texts = lambda texts: torch.where(torch.tensor([t.endswith("y") for t in texts])[:, None],
                                                 torch.nan, embed(texts))  # fmt: skip
    with pytest.raises(ValueError, match="caption embeddings: 1 embedding.* the first of image 2"):
        cs({0: "x", 2: "y"})
    with pytest.raises(ValueError, match="reference embeddings: 1 embedding.* the first of image 2"):
        cs({0: "x", 2: "x"}, {0: ["r"], 2: ["x", "y"]})


def test_clipscore_of_no_caption_is_refused_not_nan():
    # The mean of no per-caption score was NaN (numpy's "Mean of empty slice" warning), and ClipSc's clip at 0 kept it
    # (max(nan, 0.0) is nan): {'CLIPScore': nan, 'ClipSc': nan} for {}; self-retrieval, faithfulness and perplexity
    # refuse no captions, and so does CLIPScore now.
    cs = CLIPScore(StubRetriever(), [Rec(0, Path("0.png"))])
    with pytest.raises(ValueError, match="CLIPScore: no captions to score"):
        cs({})
    with pytest.raises(ValueError, match="CLIPScore: no captions to score"):
        cs.per_item({}, {})
