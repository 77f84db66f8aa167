"""docs/architecture.md's "How to add a data format", followed: a format of one's own (tests/helpers/toy_format.py,
Flickr8k's token file) given by dotted path is accepted when the configuration loads, read by `finecap eval` and by
training's reader, fingerprinted and cached like a built-in one; a mistyped name or a path to something else is an
error naming data.format."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from finecap.app.cli import main
from finecap.config import ConfigError, load
from finecap.data.datasets import load_records
from finecap.data.formats import read_dataset
from finecap.data.records import DataError
from finecap.train.fingerprint import data_fingerprint
from helpers import toy_format
from helpers.toy_format import read_tokens

TOY = "helpers.toy_format:FORMAT"


@pytest.fixture()
def tokens(tmp_path) -> Path:
    for name in ("dog.jpg", "cat.jpg"):
        (tmp_path / name).write_bytes(b"")
    path = tmp_path / "Flickr8k.token.txt"
    path.write_text(
        "dog.jpg#0\tA black dog runs on the grass .\n"
        "dog.jpg#1\tA dog running .\n"
        "\n"
        "cat.jpg#0\tA grey cat sleeps on a sofa .\n"
    )
    return path


def test_a_format_of_ones_own_reads_like_a_built_in_one(tokens, tmp_path, capsys, monkeypatch):
    cfg = load(None, [f"data.format={TOY}", f"data.path={tokens}", "data.val_fraction=0.3"])
    reads = []  # training's reader reads the file once while it is unchanged (Format.cached, the default)
    monkeypatch.setattr(
        toy_format, "FORMAT", replace(toy_format.FORMAT, read=lambda s: reads.append(s) or read_tokens(s))
    )
    # split by data.val_fraction (the format names none)
    split = {r.image_id: s for s in ("train", "val") for r in load_records(cfg, s)}
    assert split == {"dog.jpg": "val", "cat.jpg": "train"}  # by id hash (finecap.data.splits): 0.18 < 0.3 <= 0.48
    assert len(reads) == 1
    records = read_dataset(TOY, tokens)
    assert [(r.image_id, r.path, r.captions) for r in records] == [
        ("dog.jpg", tmp_path / "dog.jpg", ["A black dog runs on the grass .", "A dog running ."]),
        ("cat.jpg", tmp_path / "cat.jpg", ["A grey cat sleeps on a sofa ."]),
    ]
    # pinned to the data: the file's SHA-256, with the format's name
    fp = data_fingerprint(cfg)
    assert (fp["format"], fp["sha256"]) == (TOY, hashlib.sha256(tokens.read_bytes()).hexdigest())
    # finecap eval reads --references with it (detection tries the built-in formats only)
    results = tmp_path / "results.json"
    results.write_text(json.dumps([{"image_id": "dog.jpg", "caption": "a dog running ."},
                                   {"image_id": "cat.jpg", "caption": "a grey cat sleeps on a sofa ."}]))  # fmt: skip
    args = ["eval", "--predictions", str(results), "--references", str(tokens), f"data.format={TOY}"]
    assert main([*args, "--metrics", "bleu", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["BLEU-1"] == pytest.approx(1.0)  # each caption is a reference


def test_a_bad_format_name_is_named(tokens, capsys):
    with pytest.raises(ConfigError, match=r"data.format: unknown data set format 'jsnol' \(did you mean 'jsonl'\?\)"):
        load(None, ["data.format=jsnol"])
    with pytest.raises(ValueError, match=r"data.format: module 'helpers.toy_format' has no attribute 'NOPE'"):
        read_dataset("helpers.toy_format:NOPE", tokens)
    with pytest.raises(DataError, match=r"data.format: 'helpers.toy_format:read_tokens' is a function, not a "):
        read_dataset("helpers.toy_format:read_tokens", tokens)
    tokens.write_text("dog.jpg#0 no tab here\n")
    assert main(["eval", "--predictions", str(tokens), "--references", str(tokens), f"data.format={TOY}"]) == 2
    assert "Flickr8k.token.txt" in capsys.readouterr().err
