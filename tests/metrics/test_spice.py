"""SPICE through its jar (finecap.metrics.spice): what finecap makes of the jar's output, with the jar's run faked
(its Stanford CoreNLP jars are a download, absent here)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

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
