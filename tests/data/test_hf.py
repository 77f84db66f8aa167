"""data.format=hf: Hugging Face data sets (saved folders, parquet files) read through the common record loaders."""

from __future__ import annotations

import io
import json

import pytest

datasets = pytest.importorskip("datasets")
from PIL import Image  # noqa: E402

from finecap.config import load  # noqa: E402
from finecap.data.datasets import CaptionDataset, load_records  # noqa: E402
from finecap.data.formats import DataError, load_record_image  # noqa: E402
from finecap.data.hf import read_hf  # noqa: E402
from finecap.data.references import detect_format, load_references  # noqa: E402


def _png(color: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (4, 4), color).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def saved(tmp_path):
    """A DatasetDict with embedded images (Image feature), a list of captions per row and named splits."""
    features = datasets.Features({"image": datasets.Image(), "captions": datasets.Sequence(datasets.Value("string")),
                                  "cocoid": datasets.Value("int64")})  # fmt: skip
    rows = {
        "train": {"image": [{"bytes": _png((255, 0, 0)), "path": None}, {"bytes": _png((0, 255, 0)), "path": None}],
                  "captions": [["A red square.", "Red."], ["A green square."]], "cocoid": [1, 2]},
        "test": {"image": [{"bytes": _png((0, 0, 255)), "path": None}], "captions": [["A blue square."]],
                 "cocoid": [3]},
    }  # fmt: skip
    dd = datasets.DatasetDict({k: datasets.Dataset.from_dict(v, features=features) for k, v in rows.items()})
    dd.save_to_disk(str(tmp_path / "saved"))
    return tmp_path / "saved"


def test_saved_dataset_dict_named_splits_embedded_images(saved):
    records = read_hf(saved, id_column="cocoid")
    assert [(r.image_id, r.split, r.captions) for r in records] == [
        (1, "train", ["A red square.", "Red."]), (2, "train", ["A green square."]), (3, "test", ["A blue square."])
    ]  # fmt: skip
    assert load_record_image(records[2]).getpixel((0, 0)) == (0, 0, 255)  # decoded from the embedded bytes
    assert detect_format(saved) == ("hf", saved)
    # without an id column, an embedded image's id is <split>/<row>
    assert [r.image_id for r in read_hf(saved)] == ["train/0", "train/1", "test/0"]


def test_common_loaders_training_and_evaluation_read_it(saved, tmp_path):
    cfg = load(overrides=["data.format=hf", f"data.path={saved}", "data.id_column=cocoid"])
    train = load_records(cfg, "train")
    assert [r.image_id for r in train] == [1, 2]
    item = CaptionDataset(train, per_caption=True)[1]  # second caption of image 1, image from the bytes
    assert item["caption"] == "Red." and item["image"].getpixel((0, 0)) == (255, 0, 0)
    refs = load_references(cfg, split="test")
    assert refs.format == "hf" and refs.captions() == {3: ["A blue square."]}
    # finecap eval on the saved folder (format detected; columns from the configuration)
    from finecap.app.eval import main

    (tmp_path / "res.json").write_text(json.dumps([{"image_id": 3, "caption": "a blue square"}]))
    out = main(cfg, predictions=tmp_path / "res.json", references=saved, metrics="bleu", fmt="json")
    assert out["BLEU-1"] == pytest.approx(1.0)


def test_parquet_with_paths_and_split_column(tmp_path):
    for name in ("a.png", "b.png"):
        Image.new("RGB", (2, 2)).save(tmp_path / name)
    ds = datasets.Dataset.from_dict({"file": ["a.png", "b.png"], "caption": ["A dog.", "A cat."],
                                     "part": ["train", "val"]})  # fmt: skip
    ds.to_parquet(str(tmp_path / "captions.parquet"))
    records = read_hf(tmp_path / "captions.parquet", image_column="file", caption_column="caption",
                      split_column="part")  # fmt: skip
    assert [(r.image_id, r.path, r.split, r.captions) for r in records] == [
        (str(tmp_path / "a.png"), tmp_path / "a.png", "train", ["A dog."]),
        (str(tmp_path / "b.png"), tmp_path / "b.png", "val", ["A cat."]),
    ]
    with pytest.raises(DataError, match=r"no column 'captions' \(data.caption_column\); columns: file, caption, part"):
        read_hf(tmp_path / "captions.parquet", image_column="file")
    (tmp_path / "b.png").unlink()
    with pytest.raises(DataError, match=r"1 of 2 image files do not exist"):
        read_hf(tmp_path / "captions.parquet", image_column="file", caption_column="caption")


def test_bad_rows_are_named(tmp_path):
    ds = datasets.Dataset.from_dict({"image": ["a.png", "b.png"], "captions": [["x"], []]})
    ds.save_to_disk(str(tmp_path / "d"))
    with pytest.raises(DataError, match=r"split 'test', row 1: empty caption list"):
        read_hf(tmp_path / "d", check_images=False)
