"""finecap.compat.pycocoevalcap against pycocoevalcap itself: every scorer's compute_score (corpus and per item, with
``==``), the tokenizer, and ``install()`` running unmodified lmms-eval-style code on finecap."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import random
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import finecap.compat
from finecap.compat.pycocoevalcap.bleu.bleu import Bleu
from finecap.compat.pycocoevalcap.cider.cider import Cider
from finecap.compat.pycocoevalcap.meteor.meteor import Meteor
from finecap.compat.pycocoevalcap.rouge.rouge import Rouge
from finecap.compat.pycocoevalcap.spice.spice import Spice
from finecap.compat.pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer
from finecap.metrics.meteor import MetricUnavailable, meteor_unavailable_reason
from helpers.scripts import benchmark

ROOT = Path(__file__).resolve().parents[2]
needs_java = pytest.mark.skipif(shutil.which("java") is None, reason="pycocoevalcap's tokenizer and METEOR need Java")
needs_meteor_data = pytest.mark.skipif(meteor_unavailable_reason() is not None, reason="pycocoevalcap's data missing")


def _edge_cases(n: int, seed: int) -> tuple[dict, dict]:
    """Tokenised captions with pycocoevalcap's corner cases: empty and one-word captions, repeated words, 1-7
    references, words no reference has."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(30)]

    def caption():
        return " ".join(rng.choices(words, [1 / (i + 1) for i in range(30)], k=rng.choice([0, 1, 2, 3, 5, 9, 14])))

    gts = {f"img{i}": [caption() for _ in range(rng.randint(1, 7))] for i in range(n)}
    res = {i: [caption() + rng.choice(["", " novel"])] for i in gts}
    return gts, res


@pytest.fixture(scope="module")
def coco_tokenized():
    """200 images of seeded COCO-like captions, tokenised once (by finecap: both sides score the same strings)."""
    refs, preds = benchmark("coco_like").generate(200, seed=5)
    tok = PTBTokenizer()
    gts = tok.tokenize({i: [{"caption": c} for c in caps] for i, caps in refs.items()})
    res = tok.tokenize({i: [{"caption": c}] for i, c in preds.items()})
    return gts, res


def _reference(scorer, gts, res):
    with contextlib.redirect_stdout(io.StringIO()):  # pycocoevalcap's Bleu prints its counts
        return scorer.compute_score(gts, res)


@pytest.mark.parametrize("data", ["coco", "edge"])
def test_ngram_scorers_equal_pycocoevalcap_bit_for_bit(data, coco_tokenized):
    from pycocoevalcap.bleu.bleu import Bleu as RefBleu
    from pycocoevalcap.cider.cider import Cider as RefCider
    from pycocoevalcap.rouge.rouge import Rouge as RefRouge

    gts, res = coco_tokenized if data == "coco" else _edge_cases(300, seed=1)
    for ours, ref in [
        (Bleu(4), RefBleu(4)),
        (Bleu(2), RefBleu(2)),
        (Rouge(), RefRouge()),
        (Cider(), RefCider()),
        (Cider(sigma=4.0), RefCider(sigma=4.0)),
    ]:  # fmt: skip (its n != 4 fails: precook uses 4)
        got, want = ours.compute_score(gts, res), _reference(ref, gts, res)
        assert ours.method() == ref.method()
        assert type(got[0]) is type(want[0]) and type(got[1]) is type(want[1]), ours.method()
        if isinstance(want[0], list):  # Bleu: lists of floats, per item one list per order
            assert got[0] == want[0] and got[1] == want[1], ours.method()
        else:  # Rouge, Cider: numpy float64 mean and per-item array
            assert got[0] == want[0] and np.array_equal(got[1], want[1]), ours.method()
    assert 0.05 < float(Cider().compute_score(gts, res)[0]) < 10  # a non-trivial comparison


def test_empty_input_gives_pycocoevalcaps_scores():
    # no images: pycocoevalcap's Bleu gives 0.0 per order and empty per-item lists (finecap raised numpy's "zero-size
    # array" ValueError); its Rouge gives nan and an empty array
    from pycocoevalcap.bleu.bleu import Bleu as RefBleu
    from pycocoevalcap.rouge.rouge import Rouge as RefRouge

    for n in (1, 4):
        got, want = Bleu(n).compute_score({}, {}), _reference(RefBleu(n), {}, {})
        assert got == want == ([0.0] * n, [[] for _ in range(n)]), n
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's mean of an empty array, on both sides
        got, want = Rouge().compute_score({}, {}), RefRouge().compute_score({}, {})
    assert type(got[0]) is type(want[0]) and np.isnan(got[0]) and np.isnan(want[0])
    assert type(got[1]) is type(want[1]) and got[1].shape == want[1].shape == (0,)


@pytest.mark.slow
@pytest.mark.java
@needs_java
@needs_meteor_data
def test_meteor_and_tokenizer_equal_pycocoevalcap_with_java():
    from pycocoevalcap.meteor.meteor import Meteor as RefMeteor
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer as RefTokenizer

    refs, preds = benchmark("coco_like").generate(40, seed=7)  # raw text: capitals, punctuation, contractions, numbers
    raw_gts = {i: [{"caption": c} for c in caps] for i, caps in refs.items()}
    raw_res = {i: [{"caption": c}] for i, c in preds.items()}
    gts, res = RefTokenizer().tokenize(raw_gts), RefTokenizer().tokenize(raw_res)
    assert PTBTokenizer().tokenize(raw_gts) == gts and PTBTokenizer().tokenize(raw_res) == res
    got, want = Meteor().compute_score(gts, res), RefMeteor().compute_score(gts, res)
    assert Meteor().method() == "METEOR"
    assert type(got[0]) is float and type(got[1]) is list
    assert got == want  # corpus (pooled statistics) and every item, bit for bit
    assert 0.1 < got[0] < 0.9


def _run_lmms_style(results, metrics):
    """lmms-eval's aggregation (benchmarks/lmms_eval_coco_cap.py) run unmodified, once per metric."""
    namespace: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(benchmark("lmms_eval_coco_cap").SOURCE, "lmms_eval_coco_cap.py", "exec"), namespace)
        return {m: namespace["coco_aggregation_result"](results, m) for m in metrics}, namespace


@pytest.mark.slow
@pytest.mark.java
@needs_java
@needs_meteor_data
def test_install_runs_unmodified_lmms_eval_code_with_pycocoevalcaps_numbers():
    refs, preds = benchmark("coco_like").generate(25, seed=11)
    results = [{"image_id": i, "pred": preds[i], "answer": refs[i]} for i in refs]
    metrics = ["Bleu_4", "METEOR", "CIDEr"]  # each call starts 2 JVMs on pycocoevalcap (tokenizer, METEOR)
    want, ns = _run_lmms_style(results, metrics)
    assert ns["Bleu"].__module__ == "pycocoevalcap.bleu.bleu"  # the reference really ran pycocoevalcap
    with finecap.compat.installed():
        got, ns = _run_lmms_style(results, [*metrics, "ROUGE_L", "Bleu_1"])
        assert ns["Bleu"] is Bleu and ns["PTBTokenizer"] is PTBTokenizer
    for m in metrics:
        assert got[m] == want[m], m
    assert sys.modules["pycocoevalcap.bleu.bleu"].Bleu is not Bleu  # uninstalled: the real one again


def test_install_is_opt_in_reversible_and_keeps_pycocoevalcaps_data(monkeypatch):
    import pycocoevalcap.bleu.bleu as real_bleu

    from finecap.metrics.meteor.resources import pycocoevalcap_dir

    assert not finecap.compat.is_installed()
    assert sys.modules["pycocoevalcap.bleu.bleu"] is real_bleu  # importing finecap.compat changed nothing
    real_dir = pycocoevalcap_dir()
    monkeypatch.delitem(sys.modules, "pycocoevalcap.tokenizer.ptbtokenizer", raising=False)
    monkeypatch.delitem(sys.modules, "pycocoevalcap.cider.cider_scorer", raising=False)
    finecap.compat.install()
    try:
        finecap.compat.install()  # a second call does nothing
        from pycocoevalcap.bleu.bleu import Bleu as Aliased
        from pycocoevalcap.eval import COCOEvalCap
        from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer as AliasedTok

        assert Aliased is Bleu and AliasedTok is PTBTokenizer
        assert COCOEvalCap.__module__ == "finecap.metrics.cocoeval"
        assert pycocoevalcap_dir() == real_dir  # METEOR's data and SPICE's jars: still pycocoevalcap's files
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("pycocoevalcap.cider.cider_scorer")  # no drop-in for internal modules
    finally:
        finecap.compat.uninstall()
    finecap.compat.uninstall()  # a second call does nothing
    assert sys.modules["pycocoevalcap.bleu.bleu"] is real_bleu
    assert "pycocoevalcap.tokenizer.ptbtokenizer" not in sys.modules  # not imported before: removed again
    with finecap.compat.installed():
        assert sys.modules["pycocoevalcap.rouge.rouge"].Rouge is Rouge
    assert not finecap.compat.is_installed()


def test_named_errors(monkeypatch):
    with pytest.raises(ValueError, match=r"Cider.compute_score: gts and res must have the same ids.*in res: \[3\]"):
        Cider().compute_score({1: ["a"]}, {1: ["a"], 3: ["b"]})
    with pytest.raises(ValueError, match=r"Bleu.compute_score: res\[1\] must be a list of one caption string"):
        Bleu().compute_score({1: ["a"]}, {1: ["a", "b"]})
    with pytest.raises(ValueError, match=r"Rouge.compute_score: gts\[1\] must be a non-empty list"):
        Rouge().compute_score({1: []}, {1: ["a"]})
    # a string where the list of captions belongs: its characters were tokenised as captions, silently
    with pytest.raises(ValueError, match=r"tokenize: captions_for_image\[1\]: expected a list of captions, got a str"):
        PTBTokenizer().tokenize({1: "A dog.", 2: ["Two CATS!"]})
    monkeypatch.setenv("FINECAP_SPICE_DIR", "/nonexistent/spice")
    with pytest.raises(MetricUnavailable) as e:
        Spice()
    assert str(e.value).startswith("Spice(): ") and "\n" not in str(e.value)
    monkeypatch.setattr("finecap.metrics.meteor.resources.pycocoevalcap_dir", lambda: None)
    with pytest.raises(MetricUnavailable, match=r"^Meteor\(\): .*pip install pycocoevalcap"):
        Meteor()
