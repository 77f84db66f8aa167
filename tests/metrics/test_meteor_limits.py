"""METEOR inputs that made finecap run for ever (issue 48).

Its normaliser's handling of runs of dots is linear (the jar's loops kept here as the oracle), and a caption or
reference longer than ``eval.meteor_max_words`` is refused naming the image, its length, the limit and the option
(``finecap eval``: one line, exit 2); at the limit it is scored. Chat templates' bounds:
tests/models/test_chat_template_limits.py.
"""

from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path

import pytest

from finecap.app.cli import main as cli
from finecap.metrics.meteor import meteor_per_item
from finecap.metrics.meteor import resources as R
from finecap.metrics.meteor.inputs import MAX_WORDS, check_lengths
from finecap.metrics.meteor.normalize import Normalizer, protect_dots, restore_dots

needs_meteor_data = pytest.mark.skipif(R.data_unavailable_reason() is not None, reason="pycocoevalcap's data missing")


# -- METEOR ---------------------------------------------------------------------------------------------------------


def jar_protect_dots(s: str) -> str:
    """The jar's (Moses') loop that :func:`protect_dots` replaces: the oracle."""
    while "DOTMULTI." in s:
        s = re.sub(r"DOTMULTI\.([^.])", r"DOTDOTMULTI \1", s)
        s = s.replace("DOTMULTI.", "DOTDOTMULTI")
    return s


def jar_restore_dots(s: str) -> str:
    while "DOTDOTMULTI" in s:
        s = s.replace("DOTDOTMULTI", "DOTMULTI.")
    return s.replace("DOTMULTI", ".")


def test_the_dot_rules_equal_the_jars_loops_and_are_linear():
    rng = random.Random(48)
    pieces = ["DOTMULTI"] * 3 + ["." * k for k in range(1, 7)] + ["DOT", "D", "OT", "MULTI", "I", " ", "x", "\n"]
    for _ in range(20_000):
        s = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 20)))
        assert protect_dots(s) == jar_protect_dots(s), repr(s)
        assert restore_dots(s) == jar_restore_dots(s), repr(s)
    normalizer = Normalizer({"Mr": 1})
    for text in ["a " + "." * 100_000 + " b", "." * 100_000, "x" + "..x" * 30_000]:
        start = time.monotonic()
        words = normalizer.words(text)
        assert time.monotonic() - start < 2  # the loops took minutes on 100,000 dots
        assert "".join(words).replace(".", "") == "".join(text.split()).replace(".", "")


@needs_meteor_data
@pytest.mark.slow  # the first scoring builds the paraphrase index in the test session's finecap home
@pytest.mark.parametrize("side", ["prediction", "reference"])
def test_meteor_scores_at_the_limit_and_refuses_past_it(side):
    ref = "a man riding a wave on a surfboard"
    for n, ok in [(50, True), (51, False)]:
        long = " ".join((["surfer", "on", "a", "wave"] * 13)[:n])
        preds, refs = ({7: long}, {7: [ref]}) if side == "prediction" else ({7: ref}, {7: [ref, long]})
        if ok:
            corpus, _ = meteor_per_item(preds, refs, max_words=50, processes=1)
            assert 0 < corpus["METEOR"] <= 1
            continue
        for backend in ("python", "java"):  # checked before either runs (no JVM is started for it)
            with pytest.raises(ValueError) as caught:
                meteor_per_item(preds, refs, max_words=50, processes=1, backend=backend)
            where = "predictions[7]" if side == "prediction" else "references[7][1]"
            assert str(caught.value).startswith(
                f"{where}: 51 words, more than METEOR's limit of 50 (eval.meteor_max_words"
            )


def test_check_lengths_names_the_first_caption_past_the_limit():
    check_lengths([1, 2], ["a " * MAX_WORDS, "b"], [["c"], ["d " * MAX_WORDS]])  # at the limit: nothing
    with pytest.raises(ValueError, match=r"^references\['b'\]\[2\]: 1,001 words, more than METEOR's limit of 1,000"):
        check_lengths(["a", "b"], ["x", "y"], [["x"], ["y", "z", "w " * 1001]])


def _coco_files(tmp_path: Path, caption: str) -> tuple[Path, Path]:
    captions = [(1, "a dog runs on grass"), (1, "a dog on a lawn"), (2, "a red bus")]
    annotations = [{"image_id": i, "id": k, "caption": c} for k, (i, c) in enumerate(captions)]
    refs = {"images": [{"id": i} for i in (1, 2)], "annotations": annotations}
    res = [{"image_id": 1, "caption": "a dog running on grass"}, {"image_id": 2, "caption": caption}]
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    (tmp_path / "res.json").write_text(json.dumps(res))
    return tmp_path / "refs.json", tmp_path / "res.json"


@needs_meteor_data
@pytest.mark.slow
def test_finecap_eval_refuses_a_too_long_caption_in_one_line(tmp_path, capsys):
    long = " ".join((["red", "bus", "on", "a"] * 300)[:1001])
    refs, res = _coco_files(tmp_path, long)
    argv = ["eval", "--predictions", str(res), "--references", str(refs), "--metrics", "meteor", "--format", "json"]
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "finecap: error: predictions[2]: 1,001 words, more than METEOR's limit"
    ), err
    assert "eval.meteor_max_words" in err[0]
    assert cli([*argv, "eval.meteor_max_words=1001"]) == 0  # the option raises it
    assert 0 < json.loads(capsys.readouterr().out)["METEOR"] < 1
