"""The drop-in COCOEvalCap: pycocoevalcap's own example flow with both classes, every number compared with ``==``."""

from __future__ import annotations

import contextlib
import io
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from pycocotools.coco import COCO

from finecap.metrics import CaptionFile, COCOEvalCap
from helpers.coco_reference import NoSpice
from helpers.scripts import benchmark

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """60 images of seeded COCO-like raw captions (capitals, punctuation, possessives, numbers, contractions)."""
    return benchmark("coco_like").write_coco(tmp_path_factory.mktemp("cocoeval"), 60, seed=3)


def _example_flow(cls, annotation_file: Path, results_file: Path, **kwargs):
    """pycocoevalcap/example/coco_eval_example.py, with the class passed in."""
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(annotation_file))
        coco_result = coco.loadRes(str(results_file))
        coco_eval = cls(coco, coco_result, **kwargs)
        coco_eval.params["image_id"] = coco_result.getImgIds()
        coco_eval.evaluate()
    return coco_eval


@pytest.mark.slow
@pytest.mark.java
@pytest.mark.skipif(shutil.which("java") is None, reason="pycocoevalcap's tokenizer and METEOR need Java")
def test_example_flow_gives_pycocoevalcap_numbers(files, monkeypatch):
    import pycocoevalcap.eval as reference

    monkeypatch.setattr(reference, "Spice", NoSpice)
    ref = _example_flow(reference.COCOEvalCap, *files)
    ours = _example_flow(COCOEvalCap, *files, metrics=("bleu", "meteor", "rouge", "cider"))
    names = ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr"]
    assert list(ours.eval) == names
    for m in names:
        assert ours.eval[m] == ref.eval[m], m  # bit for bit
    assert list(ours.imgToEval) == list(ref.imgToEval)
    for i, scores in ref.imgToEval.items():
        assert ours.imgToEval[i]["image_id"] == i
        for m in names:
            assert ours.imgToEval[i][m] == scores[m], (i, m)
    assert ours.evalImgs == list(ours.imgToEval.values())
    assert 0.05 < ours.eval["CIDEr"] < 5  # the data make a non-trivial comparison


def test_file_paths_without_pycocotools_equal_coco_objects(files):
    # paths (no pycocotools needed) and pycocotools objects give the same numbers; default: all images of the file
    by_path = COCOEvalCap(str(files[0]), str(files[1]), metrics=("bleu", "rouge", "cider"))
    by_path.evaluate()
    objs = _example_flow(COCOEvalCap, *files, metrics=("bleu", "rouge", "cider"))
    assert by_path.eval == objs.eval and by_path.imgToEval == objs.imgToEval
    assert set(by_path.eval) == {"Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "ROUGE_L", "CIDEr"}


def test_hand_checked_scores_and_named_errors(tmp_path):
    gt = CaptionFile({"images": [{"id": 1}, {"id": 2}],
                      "annotations": [{"image_id": 1, "caption": "A red circle."},
                                      {"image_id": 2, "caption": "A blue square."}]})  # fmt: skip
    ev = COCOEvalCap(gt, gt.loadRes([{"image_id": 1, "caption": "a red circle"},
                                     {"image_id": 2, "caption": "A blue square!", "score": 3}]),
                     metrics=("bleu", "rouge"))  # fmt: skip
    ev.evaluate()
    # identical after tokenisation: every precision is (3 + 1e-15) / (3 + 1e-9) ~ 1, brevity penalty 1
    assert ev.eval["Bleu_1"] == pytest.approx(1.0) and ev.eval["ROUGE_L"] == pytest.approx(1.0)
    # a 3-word caption has no 4-gram: BLEU-4 = (1 * 1 * 1 * (0 + 1e-15) / (0 + 1e-9)) ** (1/4) = 1e-6 ** 0.25 = 0.0316
    bleu4 = (1e-15 / 1e-9) ** 0.25
    assert ev.imgToEval[2] == {"image_id": 2, "Bleu_1": pytest.approx(1.0), "Bleu_2": pytest.approx(1.0),
                               "Bleu_3": pytest.approx(1.0), "Bleu_4": pytest.approx(bleu4, rel=1e-6),
                               "ROUGE_L": pytest.approx(1.0)}  # fmt: skip
    with pytest.raises(ValueError, match=r"image 2: no result caption"):
        e = COCOEvalCap(gt, gt.loadRes([{"image_id": 1, "caption": "x"}]), metrics=("bleu",))
        e.params["image_id"] = [1, 2]
        e.evaluate()
    for caption in (None, 5, ["x"]):  # a bare TypeError from the tokenizer, naming no image, before
        with pytest.raises(ValueError, match=r"image 1: a result caption must be a string, got"):
            COCOEvalCap(gt, gt.loadRes([{"image_id": 1, "caption": caption}]), metrics=("bleu",)).evaluate()
    bad_ref = CaptionFile({"images": [{"id": 1}], "annotations": [{"image_id": 1, "caption": None}]})
    with pytest.raises(ValueError, match=r"image 1: a reference caption must be a string, got None"):
        COCOEvalCap(bad_ref, gt.loadRes([{"image_id": 1, "caption": "x"}]), metrics=("bleu",)).evaluate()
    with pytest.raises(ValueError, match=r"1 image id\(s\) are not in the reference file"):
        gt.loadRes([{"image_id": 9, "caption": "x"}])
    with pytest.raises(ValueError, match=r"unknown \['bleurt'\]"):
        COCOEvalCap(gt, gt, metrics=("bleurt",))
    with pytest.raises(TypeError, match=r"cocoRes: expected a pycocotools COCO object or a file path"):
        COCOEvalCap(gt, {1: "x"})


def test_an_image_listed_twice_in_params_is_scored_once():
    # pycocoevalcap keys gts and res by image id, so a repeated id is one image; finecap zipped the ids with the
    # captions it had tokenised once per image, shifting every later image's caption (a KeyError at the end)
    gt = CaptionFile({"images": [{"id": 1}, {"id": 2}, {"id": 3}],
                      "annotations": [{"image_id": 1, "caption": "a dog on grass"},
                                      {"image_id": 2, "caption": "a red car"},
                                      {"image_id": 3, "caption": "a blue boat"}]})  # fmt: skip
    res = gt.loadRes([{"image_id": 1, "caption": "a dog on grass"}, {"image_id": 2, "caption": "a red car"},
                      {"image_id": 3, "caption": "a boat"}])  # fmt: skip
    once = COCOEvalCap(gt, res, metrics=("bleu", "rouge", "cider"))
    once.evaluate()
    twice = COCOEvalCap(gt, res, metrics=("bleu", "rouge", "cider"))
    twice.params["image_id"] = [1, 1, 2, 3, 2]
    twice.evaluate()
    assert twice.eval == once.eval and twice.imgToEval == once.imgToEval
    assert [e["image_id"] for e in twice.evalImgs] == [1, 2, 3]


def test_unavailable_java_metric_is_skipped_with_the_reason(files, monkeypatch):
    monkeypatch.setenv("FINECAP_SPICE_DIR", "/nonexistent")
    ev = COCOEvalCap(str(files[0]), str(files[1]), metrics=("cider", "spice"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ev.evaluate()
    assert list(ev.eval) == ["CIDEr"]
    assert any("skipping SPICE" in str(w.message) and "/nonexistent" in str(w.message) for w in caught)


def test_scores_have_pycocoevalcaps_types(files, monkeypatch):
    # pycocoevalcap's Rouge and Cider return a numpy float64 mean and a numpy array (COCOEvalCap stores both as they
    # come: np.float64 in eval and imgToEval), its Bleu and Meteor Python floats, its Spice an np.mean; finecap stored
    # Python floats for all, so `eval["CIDEr"].item()` (and isinstance(..., np.floating)) failed on the drop-in only
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    from finecap.compat.pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    ev = _example_flow(COCOEvalCap, *files, metrics=("bleu", "rouge", "cider"))
    tok = PTBTokenizer()
    gts = tok.tokenize({i: ev.coco.imgToAnns[i] for i in ev.params["image_id"]})
    res = tok.tokenize({i: ev.cocoRes.imgToAnns[i] for i in ev.params["image_id"]})
    with contextlib.redirect_stdout(io.StringIO()):  # pycocoevalcap's Bleu prints its counts
        bleu, bleu_per = Bleu(4).compute_score(gts, res)
    want = {"Bleu_1": (bleu[0], bleu_per[0]), "ROUGE_L": Rouge().compute_score(gts, res),
            "CIDEr": Cider().compute_score(gts, res)}  # fmt: skip
    for m, (corpus, per) in want.items():
        assert ev.eval[m] == corpus and type(ev.eval[m]) is type(corpus), m
        for j, i in enumerate(gts):
            assert ev.imgToEval[i][m] == per[j] and type(ev.imgToEval[i][m]) is type(per[j]), (m, i)
    assert type(ev.eval["ROUGE_L"]) is np.float64 and type(ev.eval["Bleu_4"]) is float  # the comparison has teeth

    def fake_spice(res, gts):  # SPICE's jar needs Stanford CoreNLP's models: its corpus type alone, checked here
        return {"SPICE": 0.25}, {i: {"SPICE": 0.25} for i in res}

    monkeypatch.setattr("finecap.metrics.spice.spice_per_item", fake_spice)
    spice = COCOEvalCap(str(files[0]), str(files[1]), metrics=("spice",))
    spice.evaluate()
    assert spice.eval == {"SPICE": 0.25} and type(spice.eval["SPICE"]) is np.float64  # pycocoevalcap: np.mean(...)


def _subclass_evaluating_with_pycocoevalcaps_setters(base):
    """A common pattern of papers' repos, verbatim in its use of the base class: subclass pycocoevalcap's
    ``COCOEvalCap`` and override ``evaluate`` with one that fills the results through ``setEval``,
    ``setImgToEvalImgs`` and ``setEvalImgs`` (scorers: the drop-in's, so that no Java runs)."""
    from finecap.compat.pycocoevalcap.bleu.bleu import Bleu
    from finecap.compat.pycocoevalcap.cider.cider import Cider
    from finecap.compat.pycocoevalcap.rouge.rouge import Rouge
    from finecap.compat.pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    class Subclass(base):
        def evaluate(self):
            gts = {i: self.coco.imgToAnns[i] for i in self.params["image_id"]}
            res = {i: self.cocoRes.imgToAnns[i] for i in self.params["image_id"]}
            gts, res = PTBTokenizer().tokenize(gts), PTBTokenizer().tokenize(res)
            for scorer, method in [(Bleu(4), ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4"]), (Rouge(), "ROUGE_L"),
                                   (Cider(), "CIDEr")]:  # fmt: skip
                score, scores = scorer.compute_score(gts, res)
                if isinstance(method, list):
                    for sc, scs, m in zip(score, scores, method, strict=True):
                        self.setEval(sc, m)
                        self.setImgToEvalImgs(scs, gts.keys(), m)
                else:
                    self.setEval(score, method)
                    self.setImgToEvalImgs(scores, gts.keys(), method)
            self.setEvalImgs()

    return Subclass


def test_subclass_overriding_evaluate_with_pycocoevalcaps_setters(files):
    # pycocoevalcap's COCOEvalCap has public setEval / setImgToEvalImgs / setEvalImgs, which subclasses call; under
    # finecap.compat.install() such a subclass derives from finecap's class, which had none (AttributeError)
    import pycocoevalcap.eval as reference

    want = _example_flow(_subclass_evaluating_with_pycocoevalcaps_setters(reference.COCOEvalCap), *files)
    got = _example_flow(_subclass_evaluating_with_pycocoevalcaps_setters(COCOEvalCap), *files)
    assert list(got.eval) == list(want.eval) == ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "ROUGE_L", "CIDEr"]
    assert got.eval == want.eval and got.imgToEval == want.imgToEval and got.evalImgs == want.evalImgs
    assert [list(e) for e in got.evalImgs] == [list(e) for e in want.evalImgs]
    assert len(got.evalImgs) == 60 and got.evalImgs[0] is got.imgToEval[got.evalImgs[0]["image_id"]]
