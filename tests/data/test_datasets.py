import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from finecap.config import load
from finecap.data.datasets import CaptionCollator, CaptionDataset, load_records
from finecap.data.records import Record
from finecap.models.tokenizer import world_tokenizer

# world_tokenizer ids: <pad>=0 <unk>=1 <mask>=2 <bos>=3 <eos>=4, then the vocabulary in order from 5
TOK = world_tokenizer(["a", "red", "circle", "big"])
A, RED, CIRCLE, BIG, EOS, PAD = 5, 6, 7, 8, 4, 0

RECORDS = [
    Record(10, Path("x/10.png"), "train", ["a red circle", "a circle"]),
    Record(11, Path("x/11.png"), "train", ["a big red circle", "big circle", "a circle"]),
]
FEATURES = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # (N=2, D=2)


def test_training_expands_every_reference_and_evaluation_is_per_image():
    train = CaptionDataset(RECORDS, per_caption=True, features=FEATURES)
    assert len(train) == 5  # 2 + 3 references
    assert [train[i]["caption"] for i in range(5)] == [
        "a red circle", "a circle", "a big red circle", "big circle", "a circle"]  # fmt: skip
    assert train[3]["image_id"] == 11 and torch.equal(train[3]["features"], FEATURES[1])
    assert train[3]["references"] == RECORDS[1].captions
    val = CaptionDataset(RECORDS, per_caption=False, features=FEATURES)
    assert len(val) == 2 and [val[i]["caption"] for i in range(2)] == ["a red circle", "a big red circle"]
    with pytest.raises(ValueError, match="1 feature rows for 2 records"):
        CaptionDataset(RECORDS, per_caption=True, features=FEATURES[:1])


def test_collator_batch():
    data = CaptionDataset(RECORDS, per_caption=True, features=FEATURES)
    batch = CaptionCollator(TOK, max_tokens=4)([data[1], data[2]])  # "a circle", "a big red circle"
    # "a big red circle" has 4 tokens: truncated to max_tokens - 1 = 3, then EOS
    assert batch["input_ids"].tolist() == [[A, CIRCLE, EOS, PAD], [A, BIG, RED, EOS]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert batch["labels"].tolist() == [[A, CIRCLE, EOS, -100], [A, BIG, RED, EOS]]
    assert batch["image_ids"] == [10, 11] and batch["index"].tolist() == [1, 2]
    assert batch["references"] == [RECORDS[0].captions, RECORDS[1].captions]
    assert torch.equal(batch["features"], FEATURES)  # (B, D)
    assert "pixel_values" not in batch


def test_collator_preprocesses_images_without_features(tmp_path):
    for r in RECORDS:
        r_path = tmp_path / r.path
        r_path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (4, 4), (255, 0, 0)).save(r_path)
    records = [Record(r.image_id, tmp_path / r.path, r.split, r.captions) for r in RECORDS]
    data = CaptionDataset(records, per_caption=False)
    seen = []

    def preprocess(images):
        seen.append(len(images))
        return torch.zeros(len(images), 3, 4, 4)

    batch = CaptionCollator(TOK, 8, preprocess=preprocess)([data[0], data[1]])
    assert seen == [2] and batch["pixel_values"].shape == (2, 3, 4, 4) and "features" not in batch
    with pytest.raises(ValueError, match="no preprocess function"):
        CaptionCollator(TOK, 8)([data[0]])
    with pytest.raises(ValueError, match="data.max_tokens"):
        CaptionCollator(TOK, 0)


def _karpathy(tmp_path) -> Path:
    images = []
    for i, split in enumerate(["train", "restval", "val", "test"]):
        Image.new("RGB", (4, 4)).save(tmp_path / f"{i}.png")
        images.append({"filename": f"{i}.png", "split": split, "imgid": i, "sentences": [{"raw": f"caption {i}"}]})
    path = tmp_path / "dataset.json"
    path.write_text(json.dumps({"images": images}))
    return path


def test_load_records_splits(tmp_path):
    cfg = load(None, ["data.format=karpathy", f"data.path={_karpathy(tmp_path)}"])
    assert [r.image_id for r in load_records(cfg, "train")] == [0, 1]  # restval joins training
    assert [r.image_id for r in load_records(cfg, "val")] == [2]
    with pytest.raises(ValueError, match="no records in split 'dev'; splits present: restval, test, train, val"):
        load_records(cfg, "dev")
    missing = load(None, ["data.format=karpathy", f"data.path={tmp_path / 'nope.json'}"])
    with pytest.raises(FileNotFoundError, match="nope.json: data set file not found"):
        load_records(missing, "train")
    with pytest.raises(ValueError, match="data.path: required for data.format='karpathy'"):
        load_records(load(None, ["data.format=karpathy"]), "train")


def test_a_data_file_rewritten_under_the_same_time_is_read_again(tmp_path):
    # the records were kept per (file, modification time) alone: a file rewritten within one tick of a coarse clock
    # (or copied in keeping its time) gave the records of its earlier content, other captions, in the same process
    import os

    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    path = tmp_path / "data.jsonl"
    cfg = load(None, ["data.format=jsonl", f"data.path={path}"])
    path.write_text(json.dumps({"image": "a.png", "captions": ["a red circle"], "split": "train"}) + "\n")
    first = path.stat().st_mtime_ns
    assert load_records(cfg, "train")[0].captions == ["a red circle"]
    path.write_text(json.dumps({"image": "a.png", "captions": ["a big red circle"], "split": "train"}) + "\n")
    os.utime(path, ns=(first, first))  # the time the first version had
    assert load_records(cfg, "train")[0].captions == ["a big red circle"]
