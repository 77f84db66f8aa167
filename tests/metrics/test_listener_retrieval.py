"""Listener retrieval: same distractor draws as the retriever's RD-N, bags, tie rate and the exploitation gap."""

from __future__ import annotations

import numpy as np
import pytest

from finecap.metrics.listener import listener_retrieval
from finecap.metrics.retrieval import bag_retrieval, random_distractors
from finecap.metrics.suite import evaluate
from finecap.world.scene import Obj, Scene

SCENES = {
    0: Scene(0, "grass", [Obj("circle", "red", "large", 1, 1)]),
    1: Scene(1, "sand", [Obj("circle", "red", "large", 1, 1)]),
    2: Scene(2, "sand", [Obj("square", "blue", "large", 1, 1)]),
    3: Scene(3, "water", [Obj("star", "green", "large", 0, 0)]),
}
POOL = [0, 1, 2, 3]


def test_rd_with_every_other_image_as_distractor() -> None:
    # n_distractors = 3: every other image competes. Supports:
    #   0 "a red circle": [2, 2, -2, -2] -> tied with 1: expected 1/2, a top tie
    #   1 "a red circle on sand": [1, 3, -1, -3] -> first, no tie
    #   2 "a square": [-1, -1, 1, -1] -> first, no tie
    #   3 "a thing": [0, 0, 0, 0] -> 4-way tie: expected 1/4
    preds = {0: "a red circle", 1: "a red circle on sand", 2: "a square", 3: "a thing"}
    out = listener_retrieval(preds, SCENES, POOL, n_distractors=3, draws=2)
    assert out["listener/RD3/R@1_expected"] == pytest.approx((0.5 + 1 + 1 + 0.25) / 4)
    assert out["listener/RD3/tie_rate"] == pytest.approx(2 / 4)
    assert "listener/RD3/R@5" not in out  # 4 candidates: always within 5, so it cannot fail and is left out
    assert "listener/RD3/exploit" not in out  # no retriever scores given


def test_same_draws_as_the_retriever_and_exploit() -> None:
    # One distractor per caption, drawn exactly as metrics.retrieval draws it for seed 0.
    preds = {0: "a red circle", 1: "a red circle on sand", 2: "a square", 3: "a star"}
    targets = np.array([0, 1, 2, 3])
    drawn = random_distractors(4, 4, targets, 1, np.random.default_rng((0, 0)))[:, 0]
    # A retriever that prefers the target everywhere: it places every caption first.
    retriever = np.eye(4)
    out = listener_retrieval(preds, SCENES, POOL, n_distractors=1, draws=1, retriever_scores=retriever)
    # Listener: caption 0 ties (support 2) only when its distractor is image 1; all other pairs are clear wins.
    expected = np.mean([0.5 if (q == 0 and drawn[0] == 1) else 1.0 for q in range(4)])
    assert out["listener/RD1/R@1_expected"] == pytest.approx(expected)
    # exploit = retriever first (always) and listener not first (expected): 1 - expected R@1.
    assert out["listener/RD1/exploit"] == pytest.approx(1 - expected)
    # A retriever that gets every caption wrong exploits nothing.
    out = listener_retrieval(preds, SCENES, POOL, n_distractors=1, draws=1, retriever_scores=-np.eye(4))
    assert out["listener/RD1/exploit"] == 0.0


def test_bags() -> None:
    # Bag {0, 1}: "a red circle" cannot tell them apart (tie), "a red circle on grass" can ([3, 1]).
    # Bag {2, 3}: "a blue square" -> [2, -2]... the star scene: object(square) false, color false -> -2.
    bags = {2: [[0, 1], [2, 3]]}
    preds = {0: "a red circle", 1: "a red circle", 2: "a blue square", 3: "a green star"}
    out = listener_retrieval(preds, SCENES, POOL, n_distractors=1, draws=1, bags=bags)
    assert out["listener/bag2/R@1_expected"] == pytest.approx((0.5 + 0.5 + 1 + 1) / 4)
    assert out["listener/bag2/tie_rate"] == pytest.approx(0.5)
    preds[0] = "a red circle on grass"
    out = listener_retrieval(preds, SCENES, POOL, n_distractors=1, draws=1, bags=bags)
    assert out["listener/bag2/R@1_expected"] == pytest.approx((1 + 0.5 + 1 + 1) / 4)


def test_metric_group_in_evaluate() -> None:
    preds = {0: "a red circle on grass", 1: "a red circle on sand", 2: "a blue square", 3: "a green star"}
    out = evaluate(preds, None, metrics=["listener"], scenes=SCENES, bags={2: [[0, 1], [2, 3]]},
                   cfg=_cfg())  # fmt: skip
    # Every caption is uniquely supported by its own scene (its facts are all true there, one false elsewhere).
    assert out["listener/RD3/R@1"] == 1.0 and out["listener/RD3/tie_rate"] == 0.0
    assert out["listener/bag2/R@1"] == 1.0
    with pytest.raises(ValueError, match="listener"):
        evaluate(preds, None, metrics=["listener"], cfg=_cfg())


def test_missing_scene_is_an_error() -> None:
    with pytest.raises(ValueError, match="no scene graph for pool image 9"):
        listener_retrieval({0: "a circle"}, SCENES, [0, 9], n_distractors=1, draws=1)


def _cfg():
    from finecap.config import load

    return load(None, ["eval.n_distractors=3", "eval.draws=2"])


def test_bags_are_read_as_the_retriever_reads_them() -> None:
    # A bag naming an image outside the pool (9): the retriever's bag metric refuses it; the listener scored the
    # first bag alone (2 captions, bag2/R@1 = 1.0 by the tie-break) and reported bags of 2 over other captions.
    preds = {0: "a red circle", 1: "a red circle", 2: "a blue square", 3: "a green star"}
    with pytest.raises(ValueError, match=r"^bag 1 names images not among the scored images: \[9\]"):
        bag_retrieval(np.eye(4), [[0, 1], [2, 9]], POOL)
    with pytest.raises(ValueError, match=r"listener: bags\[2\]\[1\] names images not among the scored images: \[9\]"):
        listener_retrieval(preds, SCENES, POOL, n_distractors=1, draws=1, bags={2: [[0, 1], [2, 9]]})
    # an image twice in a bag ([2, 2]: one image, not a bag of 2) and a bag listed under another size are refused too
    with pytest.raises(ValueError, match=r"bags\[2\]\[1\] names image\(s\) \[2\] more than once"):
        listener_retrieval(preds, SCENES, POOL, n_distractors=1, draws=1, bags={2: [[0, 1], [2, 2]]})
    with pytest.raises(ValueError, match=r"bags\[3\]\[0\] holds 2 images but is listed under bag size 3"):
        listener_retrieval(preds, SCENES, POOL, n_distractors=1, draws=1, bags={3: [[0, 1]]})


def test_no_caption_is_refused_not_nan() -> None:
    # listener_retrieval({}) returned every listener/RD{N}/* as NaN (numpy's "Mean of empty slice" warning), where the
    # retriever's metrics refuse no captions ("no captions to rank").
    with pytest.raises(ValueError, match="listener: no captions to rank"):
        listener_retrieval({}, SCENES, POOL, n_distractors=1, draws=1)
