"""``finecap eval`` matches predicted ids to reference images by id, by path relative to the data set, or by file name
when only one image has it (issue 64): ``finecap caption --images photos/`` writes ``img000.jpg`` where a chat JSONL's
id is ``photos/img000.jpg``; its mismatch error shows both sides' first ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.cli import refused, run_cli

CAPTIONS = {"photos/img000.jpg": "a dog on a deck", "photos/img001.jpg": "a cat on a red mat",
            "more/img000.png": "an owl in a tree"}  # fmt: skip


@pytest.fixture()
def chat(tmp_path) -> Path:
    """A chat JSONL (ms-swift's messages) over three images, two of them named img000."""
    lines = []
    for image, caption in CAPTIONS.items():
        (tmp_path / image).parent.mkdir(exist_ok=True)
        (tmp_path / image).write_bytes(b"")
        turns = [{"role": "user", "content": "<image>Describe the image."}, {"role": "assistant", "content": caption}]
        lines.append(json.dumps({"messages": turns, "images": [image]}))
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def predictions(path: Path, ids: dict[str, str]) -> Path:
    path.write_text(json.dumps([{"image_id": i, "caption": c} for i, c in ids.items()]))
    return path


def scores(chat: Path, preds: Path) -> dict:
    code, out, err = run_cli(["eval", "--predictions", str(preds), "--references", str(chat), "--metrics",
                              "bleu,length", "--format", "json"])  # fmt: skip
    assert code == 0, err
    return json.loads(out)


def test_file_names_and_relative_paths_match_the_chat_jsonls_ids(chat, tmp_path):
    # img001.jpg is one image's file name; ./more/img000.png is a path relative to the data set's folder
    preds = predictions(tmp_path / "p.json", {"img001.jpg": CAPTIONS["photos/img001.jpg"],
                                              "./more/img000.png": CAPTIONS["more/img000.png"]})  # fmt: skip
    got = scores(chat, preds)
    assert got["BLEU-1"] == pytest.approx(1.0)  # each caption scored against its own image's reference
    assert got["Length"] == pytest.approx((6 + 5) / 2)  # both images scored


def test_an_ambiguous_file_name_is_refused_showing_both_sides_ids(chat, tmp_path):
    # img000.* are two images' stems, but img000.jpg only one's file name: it matches; img002.jpg names none
    preds = predictions(tmp_path / "p.json", {"img000.jpg": "a dog", "img002.jpg": "a cat"})
    theirs = "the references' ids are e.g. ['photos/img000.jpg', 'photos/img001.jpg', 'more/img000.png']"
    line = refused(["eval", "--predictions", str(preds), "--references", str(chat), "--metrics", "length"],
                   "1 predicted image id(s) are not in the references", "['img002.jpg']", theirs)  # fmt: skip
    assert "img000.jpg'" not in line.split("e.g.")[1]  # the predicted img000.jpg matched
    (tmp_path / "twin").mkdir()
    (tmp_path / "twin" / "img001.jpg").write_bytes(b"")
    with chat.open("a") as f:  # a second img001.jpg: the file name no longer says which image
        turns = [{"role": "user", "content": "<image>Describe."}, {"role": "assistant", "content": "a cat"}]
        f.write(json.dumps({"messages": turns, "images": ["twin/img001.jpg"]}) + "\n")
    refused(["eval", "--predictions", str(predictions(tmp_path / "q.json", {"img001.jpg": "a cat"})), "--references",
             str(chat), "--metrics", "length"], "e.g. ['img001.jpg']")  # fmt: skip
