"""METEOR and SPICE (optional Java metrics): availability messages, and METEOR on a small example."""

from __future__ import annotations

import shutil

import pytest

from finecap.metrics.meteor import (
    METEOR_ENV,
    MetricUnavailable,
    find_meteor_jar,
    meteor,
    meteor_per_item,
    meteor_unavailable_reason,
)
from finecap.metrics.spice import SPICE_ENV, spice, spice_unavailable_reason

PREDS = {1: "a man surfing on a wave", 2: "a dog running on grass"}
REFS = {
    1: ["a man riding a wave on a surfboard", "a surfer on a wave"],
    2: ["two dogs playing in the grass", "dogs running on a lawn"],
}


def test_meteor_missing_java_is_a_clear_error():
    reason = meteor_unavailable_reason(java="no-such-java-binary")
    assert "Java runtime" in reason and "no-such-java-binary" in reason
    with pytest.raises(MetricUnavailable, match="Java runtime"):
        meteor(PREDS, REFS, java="no-such-java-binary")


@pytest.mark.skipif(shutil.which("java") is None, reason="java not on PATH: the jar checks come after the Java check")
def test_meteor_missing_jar_or_data(tmp_path, monkeypatch):
    missing = tmp_path / "meteor-1.5.jar"
    assert str(missing) in meteor_unavailable_reason(jar=missing)
    missing.write_bytes(b"")  # jar present, paraphrase table absent
    assert "paraphrase" in meteor_unavailable_reason(jar=missing)
    with pytest.raises(MetricUnavailable, match="paraphrase"):
        meteor_per_item(PREDS, REFS, jar=missing)
    monkeypatch.setenv(METEOR_ENV, str(tmp_path / "elsewhere.jar"))
    assert find_meteor_jar() == tmp_path / "elsewhere.jar"


def test_spice_missing_java_or_jars(tmp_path, monkeypatch):
    assert "Java runtime" in spice_unavailable_reason(java="no-such-java-binary")
    if shutil.which("java") is None:
        return
    # an empty SPICE folder: the jar is missing
    assert "spice-1.0.jar not found" in spice_unavailable_reason(spice_dir=tmp_path)
    # the jar present but not the Stanford CoreNLP models pycocoevalcap downloads at first use
    (tmp_path / "spice-1.0.jar").write_bytes(b"")
    reason = spice_unavailable_reason(spice_dir=tmp_path)
    assert "stanford-corenlp-3.6.0.jar" in reason and "does not download" in reason
    monkeypatch.setenv(SPICE_ENV, str(tmp_path))
    with pytest.raises(MetricUnavailable, match="CoreNLP"):
        spice(PREDS, REFS)


def test_meteor_input_errors_name_the_record():
    if meteor_unavailable_reason() is not None:
        pytest.skip(f"METEOR unavailable: {meteor_unavailable_reason()}")
    with pytest.raises(ValueError, match="no entry for prediction id 3"):
        meteor({3: "a"}, REFS)


@pytest.mark.java
@pytest.mark.skipif(shutil.which("java") is None, reason="java not on PATH: METEOR needs a Java runtime")
def test_meteor_matches_pycocoevalcap_on_small_example():
    if meteor_unavailable_reason() is not None:
        pytest.skip(f"METEOR jar unavailable: {meteor_unavailable_reason()}")
    corpus, per = meteor_per_item(PREDS, REFS)
    # pycocoevalcap's Meteor().compute_score on the same input returned
    # (0.3640791704740925, [0.4448605116078899, 0.2952867001592558]); the corpus value pools the statistics,
    # it is not the mean of the two (0.3700736)
    assert corpus["METEOR"] == pytest.approx(0.3640791704740925, abs=1e-12)
    assert per[1]["METEOR"] == pytest.approx(0.4448605116078899, abs=1e-12)
    assert per[2]["METEOR"] == pytest.approx(0.2952867001592558, abs=1e-12)
