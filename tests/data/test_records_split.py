"""The split a data file's name says (COCO annotation files, lone Hugging Face files): its words, not its letters."""

from __future__ import annotations

from pathlib import Path

import pytest

from finecap.data.records import split_from_name


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
    ],
)
def test_the_split_is_a_word_of_the_file_name(name, split):
    assert split_from_name(Path(name)) == split
