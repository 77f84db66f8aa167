"""The split a data file's name says (COCO annotation files, lone Hugging Face files): its words, not its letters; and
one image file in one split, however the data set names it (its real path)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finecap.data.formats import read_dataset
from finecap.data.records import DataError, split_from_name


@pytest.mark.parametrize(
    ("name", "split"),
    [
        ("captions_train2014.json", "train"),
        ("captions_val2014.json", "val"),
        ("train-00000-of-00001.parquet", "train"),
        ("validation-00000-of-00001.parquet", "val"),
        ("test.arrow", "test"),
        ("data.parquet", "test"),
        # a split inside another word is no split: these were val, val and train
        ("coco_retrieval_test.json", "test"),
        ("captions_eval_test.json", "test"),
        ("constrained_test.json", "test"),
        # COCO's train and val images together, which Karpathy-style setups train on: read as test, a word of no split
        ("captions_trainval2014.json", "train"),
        ("trainval-00000-of-00001.parquet", "train"),
        ("captions_train_val2014.json", "train"),
    ],
)
def test_the_split_is_a_word_of_the_file_name(name, split):
    assert split_from_name(Path(name)) == split


def _karpathy(tmp_path, entries):
    from PIL import Image

    Image.new("RGB", (8, 8)).save(tmp_path / "a.jpg")
    data = tmp_path / "dataset.json"
    data.write_text(json.dumps({"images": entries}))
    return data


def _entry(cocoid, split, filepath=""):
    return {"filename": "a.jpg", "filepath": filepath, "cocoid": cocoid, "split": split, "sentences": [{"raw": "x"}]}


@pytest.mark.parametrize("filepath", ["", "."])
def test_one_image_file_in_two_karpathy_splits_is_refused(tmp_path, filepath):
    # two ids, one file: the test image was trained on (read before as two records, train and test)
    data = _karpathy(tmp_path, [_entry(1, "train"), _entry(2, "test", filepath)])
    with pytest.raises(DataError, match=r"one image file .*a\.jpg is named by two records in two splits: id 1 "
                                        r"\('train', .*\), id 2 \('test', .*\); an image in two splits"):  # fmt: skip
        read_dataset("karpathy", data)


def test_one_image_file_in_one_split_under_two_ids_and_restval_as_train_are_read(tmp_path):
    data = _karpathy(tmp_path, [_entry(1, "train"), _entry(2, "restval"), _entry(3, "train")])
    assert [r.image_id for r in read_dataset("karpathy", data)] == [1, 2, 3]


def test_two_names_linking_one_stored_file_are_two_images(tmp_path):
    # links are not followed: a Hugging Face snapshot links a data set's identical images to one stored blob, and
    # such a data set reads as it is (tests/boost/test_boost_command.py); one name in two splits is refused
    from PIL import Image

    Image.new("RGB", (8, 8)).save(tmp_path / "a.jpg")
    (tmp_path / "copy.jpg").symlink_to("a.jpg")  # the same pixels under a second name
    lines = [{"image": "a.jpg", "captions": ["x"], "split": "train"}, {"image": "copy.jpg", "captions": ["x"]}]
    data = tmp_path / "captions.jsonl"
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert [r.image_id for r in read_dataset("jsonl", data)] == ["a.jpg", "copy.jpg"]
    lines[0].pop("split")  # neither names a split
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert [r.image_id for r in read_dataset("jsonl", data)] == ["a.jpg", "copy.jpg"]
