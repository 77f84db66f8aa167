"""SPICE through its jar (finecap.metrics.spice): what finecap makes of the jar's output, with the jar's run faked
(its Stanford CoreNLP jars are a download, absent here)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np

import finecap.compat.pycocoevalcap.spice.spice as compat_spice
import finecap.metrics.spice as spice


def test_per_image_spice_is_each_images_own_whatever_the_order_of_the_ids(monkeypatch, tmp_path):
    # The jar scores the images in sorted id order (pycocoevalcap's input file, and finecap's); pycocoevalcap then
    # zips that sorted list with the unsorted ids of gts (COCOEvalCap.setImgToEvalImgs), giving an image another's
    # score whenever the references do not list their ids sorted (docs/evaluation.md#output). finecap keys each
    # score by its image. The fake jar's F-score of a caption: its number of words / 10.
    def run(cmd, cwd, capture_output, timeout):
        rows = json.loads(Path(cmd[4]).read_text())
        out = Path(cmd[cmd.index("-out") + 1])
        out.write_text(json.dumps([{"image_id": r["image_id"], "scores": {"All": {"f": len(r["test"].split()) / 10}}}
                                   for r in rows]))  # fmt: skip
        assert [r["test"] for r in rows] == ["one", "two two", "three three three"]  # sorted ids: 1, 2, 3
        return subprocess.CompletedProcess(cmd, 0, b"", b"")

    monkeypatch.setattr(spice, "spice_unavailable_reason", lambda *args: None)
    monkeypatch.setattr(spice.subprocess, "run", run)
    predictions = {3: "three three three", 1: "one", 2: "two two"}  # the references' order, ids not sorted
    references = {i: ["a reference"] for i in predictions}
    corpus, per = spice.spice_per_item(predictions, references, spice_dir=tmp_path)  # no jar read: faked
    assert list(per) == [3, 1, 2]
    assert per == {3: {"SPICE": 0.3}, 1: {"SPICE": 0.1}, 2: {"SPICE": 0.2}}
    assert corpus["SPICE"] == (0.1 + 0.2 + 0.3) / 3  # the mean in the jar's order, as pycocoevalcap sums them


def _fake_jar(cmd, *args, **kwargs):
    """The jar's run, faked for finecap's ``subprocess.run`` and pycocoevalcap's ``check_call`` alike (the input file
    is the command's 5th word): each caption's F-score is a fixed function of its words, the other fields left out."""
    rows = json.loads(Path(cmd[4]).read_text())
    out = Path(cmd[cmd.index("-out") + 1])
    out.write_text(json.dumps([{"image_id": r["image_id"], "scores": {"All": {"f": _f_score(r["test"])}}}
                               for r in rows]))  # fmt: skip
    return subprocess.CompletedProcess(cmd, 0, b"", b"")


def _f_score(caption: str) -> float:
    return ((int(caption.split()[-1]) * 0.7548776662466927) % 1) ** 3  # spread over [0, 1): the last bits vary


def test_corpus_spice_equals_pycocoevalcaps_bit_for_bit(monkeypatch, tmp_path):
    # pycocoevalcap's corpus SPICE is np.mean of the F-scores in sorted id order: numpy's pairwise summation, which a
    # running sum (sum(values) / len(values)) differs from in the last bits on most corpora of more than 8 images.
    import pycocoevalcap.spice.spice as reference

    ids = [(k * 37) % 101 for k in range(101)]  # 101 images, ids not sorted
    predictions = {i: f"a caption {i + 1}" for i in ids}
    references = {i: ["a reference"] for i in ids}
    monkeypatch.setattr(reference, "get_stanford_models", lambda: None)  # no download
    monkeypatch.setattr(reference, "__file__", str(tmp_path / "spice.py"))  # its tmp/ and cache/ under tmp_path
    monkeypatch.setattr(reference.subprocess, "check_call", _fake_jar)
    want, _ = reference.Spice().compute_score(references, {i: [c] for i, c in predictions.items()})
    values = [_f_score(predictions[i]) for i in sorted(ids)]
    assert sum(values) / len(values) != want  # the data tell a running sum from pycocoevalcap's mean

    monkeypatch.setattr(spice, "spice_unavailable_reason", lambda *args: None)
    monkeypatch.setattr(spice, "find_spice_dir", lambda *args: tmp_path)
    monkeypatch.setattr(spice.subprocess, "run", _fake_jar)
    corpus, per = spice.spice_per_item(predictions, references)
    assert corpus["SPICE"] == want and type(corpus["SPICE"]) is float
    assert per == {i: {"SPICE": _f_score(predictions[i])} for i in ids}
    monkeypatch.setattr(compat_spice, "spice_unavailable_reason", lambda *args: None)
    assert compat_spice.Spice().compute_score(references, {i: [c] for i, c in predictions.items()})[0] == want


def test_ids_of_both_types_are_scored_in_the_order_of_the_images_they_name(monkeypatch, tmp_path):
    # References keyed {0: ..., "1": ..., 2: ...}: the rest of finecap reads an int and its string as one image
    # (finecap.data.records.id_key); the jar's input was sorted by the ids as written, and an int beside a string
    # raised TypeError. Now the jar scores them in the order of the images they name, so the corpus SPICE is, bit
    # for bit, that of the same captions keyed by ints (pycocoevalcap's, tested above), and each image keeps its
    # own score under the id it was given. 101 images, so that np.mean's pairwise sum tells the orders apart.
    ids = [(k * 37) % 101 for k in range(101)]
    mixed = [str(i) if i % 2 else i for i in ids]  # odd ids as strings
    monkeypatch.setattr(spice, "spice_unavailable_reason", lambda *args: None)
    monkeypatch.setattr(spice, "find_spice_dir", lambda *args: tmp_path)
    monkeypatch.setattr(spice.subprocess, "run", _fake_jar)
    as_ints, _ = spice.spice_per_item({i: f"a caption {i + 1}" for i in ids}, {i: ["a reference"] for i in ids})
    references = {i: ["a reference"] for i in mixed}
    other_way = [i if i % 2 else str(i) for i in ids]  # the predictions' ids: each written the other way
    predictions = {i: f"a caption {int(i) + 1}" for i in other_way}
    corpus, per = spice.spice_per_item(predictions, references)
    assert corpus == as_ints
    values = [_f_score(f"a caption {i + 1}") for i in sorted(ids, key=str)]  # the ids' text order: another mean
    assert float(np.mean(np.array(values))) != as_ints["SPICE"]
    assert per == {i: {"SPICE": _f_score(predictions[i])} for i in predictions}
    # pycocoevalcap's Spice keyed the same way: the scores in the images' order, 0, 1, ..., 100
    monkeypatch.setattr(compat_spice, "spice_unavailable_reason", lambda *args: None)
    mean, scores = compat_spice.Spice().compute_score(references, {i: [f"a caption {int(i) + 1}"] for i in mixed})
    assert mean == as_ints["SPICE"]
    assert [s["All"]["f"] for s in scores] == [_f_score(f"a caption {i + 1}") for i in range(101)]
