"""data.format=hf: Hugging Face data sets (saved folders, parquet files) read through the common record loaders."""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import re
from pathlib import Path

import pytest

datasets = pytest.importorskip("datasets")
from PIL import Image  # noqa: E402

from finecap.config import load  # noqa: E402
from finecap.data.datasets import CaptionDataset, load_records  # noqa: E402
from finecap.data.formats import detect_format  # noqa: E402
from finecap.data.formats.hf import read_hf  # noqa: E402
from finecap.data.images import load_record_image  # noqa: E402
from finecap.data.records import DataError, Record  # noqa: E402
from finecap.data.references import load_references  # noqa: E402


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
    cfg = load(overrides=["data.format=hf", f"data.path={saved}", "data.hf.id_column=cocoid"])
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


def _saved_splits(tmp_path, *names):
    """A DatasetDict saved to disk with one embedded image row per split name, the row's caption its split's name."""
    features = datasets.Features({"image": datasets.Image(), "captions": datasets.Sequence(datasets.Value("string"))})
    dd = datasets.DatasetDict({n: datasets.Dataset.from_dict({"image": [{"bytes": _png((k, 0, 0)), "path": None}],
                                                              "captions": [[n]]}, features=features)
                               for k, n in enumerate(names)})  # fmt: skip
    dd.save_to_disk(str(tmp_path / "-".join(names)))
    return tmp_path / "-".join(names)


def test_hugging_faces_validation_split_is_read_as_val(tmp_path):
    saved = _saved_splits(tmp_path, "train", "validation", "test")
    assert [(r.split, r.captions) for r in read_hf(saved)] == [("train", ["train"]), ("val", ["validation"]),
                                                               ("test", ["test"])]  # fmt: skip
    assert [r.captions for r in read_hf(saved, splits=["val"])] == [["validation"]]
    assert [r.split for r in read_hf(saved, splits=["validation"])] == ["validation"]  # asked by its own name
    cfg = load(overrides=["data.format=hf", f"data.path={saved}"])
    assert [r.captions for r in load_records(cfg, "val")] == [["validation"]]  # what training reads
    both = _saved_splits(tmp_path, "train", "val", "validation")  # a val split of its own: validation stays itself
    assert [r.split for r in read_hf(both)] == ["train", "val", "validation"]


def test_a_split_column_spelled_in_another_case_is_read_as_every_readers_split_key(tmp_path, caplog):
    """``data.hf.split_column`` values are read as a JSONL line's ``"split"`` (:class:`SplitKeys`): ``"Train"`` and
    ``" val "`` are train and val, said once; ``"validation"`` is val too (``split_named``), ``"dev"`` stays its own
    split, warned about. (They were kept as written: the ``"Train"`` rows of a data set that also spells ``"train"``
    were left out of training, unsaid.)"""
    for name in ("a.png", "b.png", "c.png", "d.png", "e.png"):
        Image.new("RGB", (2, 2)).save(tmp_path / name)
    ds = datasets.Dataset.from_dict({"file": ["a.png", "b.png", "c.png", "d.png", "e.png"],
                                     "caption": ["A", "B", "C", "D", "E"],
                                     "part": ["train", "Train", " val ", "validation", "dev"]})  # fmt: skip
    ds.to_parquet(str(tmp_path / "captions.parquet"))
    with caplog.at_level(logging.INFO, logger="finecap.data.records"):
        records = read_hf(tmp_path / "captions.parquet", image_column="file", caption_column="caption",
                          split_column="part", cache_dir=tmp_path / "cache")  # fmt: skip
    assert [r.split for r in records] == ["train", "train", "val", "val", "dev"]
    said = [r.getMessage() for r in caplog.records]
    assert any("3 records write their split in another case or word" in m and "'Train' as 'train' (1)" in m
               and "'validation' as 'val' (1)" in m for m in said), said  # fmt: skip
    assert any("1 records name a split that is none of train, val, test: 'dev' (1)" in m for m in said), said


def four_rows_split_by_column(tmp_path, parts: list[str]) -> dict:
    """``captions.parquet`` in ``tmp_path``: images a-d captioned A-D, their splits ``parts`` in the column ``part``;
    the options of :func:`read_hf` reading it."""
    for name in ("a.png", "b.png", "c.png", "d.png"):
        Image.new("RGB", (2, 2)).save(tmp_path / name)
    ds = datasets.Dataset.from_dict({"file": ["a.png", "b.png", "c.png", "d.png"], "caption": ["A", "B", "C", "D"],
                                     "part": parts})  # fmt: skip
    ds.to_parquet(str(tmp_path / "captions.parquet"))
    return {"image_column": "file", "caption_column": "caption", "split_column": "part", "cache_dir": tmp_path}


def test_val_asked_for_with_a_split_column_takes_the_rows_written_validation(tmp_path):
    """``read_hf(splits=["val"])`` with ``split_column`` left out the rows written ``validation`` (Hugging Face's
    name for it, which the data set's named splits were already read as), ``Valid`` too: a split of their own that
    training never read. A split's name is read in one place (:func:`split_named`); ``dev`` stays its own."""
    options = four_rows_split_by_column(tmp_path, ["train", "validation", "Valid", "dev"])
    read = read_hf(tmp_path / "captions.parquet", splits=["val"], **options)
    assert [(r.split, r.captions) for r in read] == [("val", ["B"]), ("val", ["C"])]
    assert [r.split for r in read_hf(tmp_path / "captions.parquet", splits=["dev"], **options)] == ["dev"]


def test_splits_asked_for_with_a_split_column_keep_those_rows_and_a_missing_one_is_named(tmp_path):
    """``read_hf(splits=[...])`` with ``split_column`` returned every row, whatever was asked (``--split val`` of such
    a data set scored its train rows too), and a split no row has was no error; now the rows are those of the splits
    asked for, as read (``"Train"`` is ``train``), and a split no row has is named with those the column holds."""
    options = four_rows_split_by_column(tmp_path, ["train", "val", "Train", "test"])
    read = read_hf(tmp_path / "captions.parquet", splits=["val"], **options)
    assert [(r.split, r.captions) for r in read] == [("val", ["B"])]
    read = read_hf(tmp_path / "captions.parquet", splits=["train", "test"], **options)
    assert [(r.split, r.captions) for r in read] == [("train", ["A"]), ("train", ["C"]), ("test", ["D"])]
    assert len(read_hf(tmp_path / "captions.parquet", **options)) == 4  # no splits named: every row
    (tmp_path / "d.png").unlink()  # a split not asked for is not read: its missing image is not checked
    assert [r.captions for r in read_hf(tmp_path / "captions.parquet", splits=["val"], **options)] == [["B"]]
    for asked in (["validation"], ["train", "validation"]):
        with pytest.raises(DataError) as caught:
            read_hf(tmp_path / "captions.parquet", splits=asked, **options)
        assert str(caught.value) == (f"{tmp_path / 'captions.parquet'}: no row of split 'validation' in the column "
                                     "'part' (data.hf.split_column; splits present: 'train': 2 rows, 'val': 1 rows, "
                                     "'test': 1 rows)")  # fmt: skip


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
    with pytest.raises(
        DataError, match=r"no column 'captions' \(data.hf.caption_column\); columns: file, caption, part"
    ):
        read_hf(tmp_path / "captions.parquet", image_column="file")
    (tmp_path / "b.png").unlink()
    with pytest.raises(DataError, match=r"1 of 2 image files do not exist"):
        read_hf(tmp_path / "captions.parquet", image_column="file", caption_column="caption")


def test_parquet_written_by_pyarrow_with_image_structs_and_no_paths_is_read(tmp_path):
    """{"bytes", "path": None} cells (the Image feature's storage) written by pyarrow or pandas, not by datasets:
    pyarrow types a field no row fills as null, and the reader refused the column ("field 'path' must be string,
    got null") though every row embeds its image."""
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    cells = [{"bytes": _png((255, 0, 0)), "path": None}, {"bytes": _png((0, 0, 255)), "path": None}]
    table = pa.table({"image": cells, "caption": ["A red square.", "A blue square."]})
    assert table.schema.field("image").type.field("path").type == pa.null()
    pq.write_table(table, tmp_path / "train.parquet")
    records = read_hf(tmp_path / "train.parquet", caption_column="caption", cache_dir=tmp_path / "cache")
    assert [(r.image_id, r.captions, r.embedded) for r in records] == [
        ("train/0", ["A red square."], True), ("train/1", ["A blue square."], True)
    ]  # fmt: skip
    assert load_record_image(records[1]).getpixel((0, 0)) == (0, 0, 255)


def test_parquet_written_by_pyarrow_with_image_structs_of_paths_and_no_bytes_is_read(tmp_path):
    """The mirror of the above: ``{"bytes": None, "path": ...}`` cells in every row type the bytes field null, which
    the length of an embedded image's bytes (read to compare repeated images) has no kernel for."""
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    for name in ("a.png", "b.png"):
        Image.new("RGB", (2, 2)).save(tmp_path / name)
    table = pa.table({"image": [{"bytes": None, "path": n} for n in ("a.png", "b.png")], "caption": ["A.", "B."]})
    assert table.schema.field("image").type.field("bytes").type == pa.null()
    pq.write_table(table, tmp_path / "train.parquet")
    records = read_hf(tmp_path / "train.parquet", caption_column="caption", cache_dir=tmp_path / "cache")
    assert [(r.path, r.captions, r.embedded) for r in records] == [
        (tmp_path / "a.png", ["A."], False), (tmp_path / "b.png", ["B."], False)
    ]  # fmt: skip


def test_a_data_set_saved_again_in_place_is_read_again(tmp_path):
    # save_to_disk rewrites the files of a saved data set under the same names, which leaves the folder's own stat
    # as it was: records were kept by it, so a notebook's next run trained on the captions saved before
    features = datasets.Features({"image": datasets.Image(), "captions": datasets.Sequence(datasets.Value("string"))})

    def save(caption: str) -> None:
        rows = {"image": [{"bytes": _png((255, 0, 0)), "path": None}], "captions": [[caption]]}
        datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows, features=features)}).save_to_disk(
            str(tmp_path / "saved")
        )

    save("A red square.")
    cfg = load(overrides=["data.format=hf", f"data.path={tmp_path / 'saved'}", f"run.cache_dir={tmp_path / 'c'}"])
    assert [r.captions for r in load_records(cfg, "train")] == [["A red square."]]
    save("A tan square.")
    assert [r.captions for r in load_records(cfg, "train")] == [["A tan square."]]


def test_bad_rows_are_named(tmp_path):
    ds = datasets.Dataset.from_dict({"image": ["a.png", "b.png"], "captions": [["x"], []]})
    ds.save_to_disk(str(tmp_path / "d"))
    with pytest.raises(DataError, match=r"split 'test', row 1: empty caption list"):
        read_hf(tmp_path / "d", check_images=False)


def _embedded_rows(tmp_path, name: str, cells: list[tuple[str, bytes]], **columns: list) -> Path:
    """A saved data set ``name`` of one split, ``train``: per row an embedded image (its file name, its bytes)."""
    typed = {k: datasets.Value("int64" if isinstance(v[0], int) else "string") for k, v in columns.items()}
    features = {"image": datasets.Image(), "caption": datasets.Value("string"), **typed}
    rows = {"image": [{"bytes": data, "path": file} for file, data in cells],
            "caption": [f"caption {i}" for i in range(len(cells))], **columns}  # fmt: skip
    ds = datasets.Dataset.from_dict(rows, features=datasets.Features(features))
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / name))
    return tmp_path / name


def test_a_data_set_of_one_row_per_caption_is_refused_not_read_as_an_image_per_caption(tmp_path):
    """The Hub's COCO copies of one row per caption (an embedded image and one caption string a row, the image
    repeated) were read as a record per row, ids ``train/<row>``: each image five times, each with one reference, so
    CIDEr scored against one reference and training saw the image once per caption, unsaid (a JSONL naming one image
    on two lines is refused; embedded images escaped the one-image checks)."""
    red, blue = _png((255, 0, 0)), _png((0, 0, 255))
    cells = [("COCO_val2014_000000000001.jpg", red)] * 3 + [("COCO_val2014_000000000002.jpg", blue)] * 2
    saved = _embedded_rows(tmp_path, "percap", cells, ann_id=[11, 12, 13, 21, 22])
    table = datasets.load_from_disk(str(saved))["train"].data.column("image")  # read independently: 5 rows, 2 images
    distinct = {(c["path"], c["bytes"]) for c in table.to_pylist()}
    assert len(table) == 5 and len(distinct) == 2
    with pytest.raises(DataError, match=r"split 'train', row 1: the image of split 'train', row 0 again \(the same "
                       r"bytes and file name 'COCO_val2014_000000000001.jpg'\): .* one row per caption"):  # fmt: skip
        read_hf(saved, caption_column="caption")
    # rows given ids of their own are the data set's records of one image, as JSONL lines with ids are
    records = read_hf(saved, caption_column="caption", id_column="ann_id")
    assert [(r.image_id, r.captions) for r in records] == [(11 + k, [f"caption {k}"]) for k in range(3)] + [
        (21 + k, [f"caption {3 + k}"]) for k in range(2)
    ]


def test_one_embedded_image_in_two_splits_is_refused_as_an_image_file_in_two_splits_is(tmp_path):
    red = _png((255, 0, 0))
    features = datasets.Features({"image": datasets.Image(), "captions": datasets.Sequence(datasets.Value("string")),
                                  "cocoid": datasets.Value("int64")})  # fmt: skip
    parts = {split: {"image": [{"bytes": red, "path": "a.jpg"}], "captions": [[f"{split} caption"]], "cocoid": [k]}
             for k, split in enumerate(("train", "test"))}  # fmt: skip
    dd = datasets.DatasetDict({k: datasets.Dataset.from_dict(v, features=features) for k, v in parts.items()})
    dd.save_to_disk(str(tmp_path / "both"))
    with pytest.raises(DataError, match=r"split 'test', row 0: the image of split 'train', row 0 again .*, in split "
                       r"'test' here, 'train' there: an image in two splits"):  # fmt: skip
        read_hf(tmp_path / "both", id_column="cocoid")


def test_embedded_images_sharing_a_file_name_are_two_images_and_unique_names_read_no_bytes(tmp_path, monkeypatch):
    from finecap.data.formats.hf import ArrowImages

    # cats/001.bmp and dogs/001.bmp embedded as 001.bmp (push_to_hub keeps a file's base name), of equal sizes (an
    # uncompressed format): their bytes are compared, and differ
    def bmp(color: tuple[int, int, int]) -> bytes:
        buf = io.BytesIO()
        Image.new("RGB", (4, 4), color).save(buf, format="BMP")
        return buf.getvalue()

    red, blue = bmp((255, 0, 0)), bmp((0, 0, 255))
    assert len(red) == len(blue) and red != blue
    saved = _embedded_rows(tmp_path, "names", [("001.bmp", red), ("001.bmp", blue)])
    assert [r.image_id for r in read_hf(saved, caption_column="caption")] == ["train/0", "train/1"]
    # names all different: nothing is compared, no image byte read
    unique = _embedded_rows(tmp_path, "unique", [(f"{k:03d}.bmp", red) for k in range(4)])
    monkeypatch.setattr(ArrowImages, "read", lambda self, row: pytest.fail("reading the data set read an image"))
    assert len(read_hf(unique, caption_column="caption")) == 4


def test_many_images_of_one_name_and_size_are_each_read_once_not_against_every_earlier_one(tmp_path, monkeypatch):
    """The repeat check compared each row's bytes with every earlier row of its name and length, reading both each
    time: a data set of n distinct fixed-size images under one name (uncompressed BMPs all embedded as image.bmp)
    read n*(n-1) images to load. Each row's bytes are read once now (their digests compared); and with ids of their
    own in one split, rows are not read at all."""
    from finecap.data.formats.hf import ArrowImages

    def bmp(k: int) -> bytes:
        buf = io.BytesIO()
        Image.new("RGB", (4, 4), (k, 255 - k, 7)).save(buf, format="BMP")
        return buf.getvalue()

    n = 24
    saved = _embedded_rows(tmp_path, "same", [("image.bmp", bmp(k)) for k in range(n)])
    reads: list[int] = []
    read = ArrowImages.read
    monkeypatch.setattr(ArrowImages, "read", lambda self, row: reads.append(row) or read(self, row))
    assert len(read_hf(saved, caption_column="caption")) == n  # distinct bytes: n images
    assert sorted(reads) == list(range(n))  # each once (pairwise: 2 * (1 + 2 + ... + 23) = 552 reads)
    reads.clear()
    ids = _embedded_rows(tmp_path, "ids", [("image.bmp", bmp(k)) for k in range(n)], cocoid=list(range(n)))
    assert len(read_hf(ids, caption_column="caption", id_column="cocoid")) == n
    assert reads == []  # one split, ids of their own: records of one image are the data set's, nothing to compare


# ---------------------------------------------------------------------------------------------------------------------
# Lazy: the data set stays memory-mapped, images are read per item
# ---------------------------------------------------------------------------------------------------------------------


def _noise_png(seed: int, side: int = 48) -> bytes:
    import numpy as np

    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)  # incompressible
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def embedded(tmp_path):
    """A saved Dataset of 12 rows with embedded noise PNGs (about 7 kB each) and a caption column."""
    features = datasets.Features({"image": datasets.Image(), "captions": datasets.Sequence(datasets.Value("string"))})
    rows = {"image": [{"bytes": _noise_png(i), "path": None} for i in range(12)],
            "captions": [[f"noise {i}"] for i in range(12)]}  # fmt: skip
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path / "train"))
    return tmp_path / "train", rows


def test_records_hold_no_image_bytes_and_read_each_on_demand(embedded):
    from finecap.data.formats.hf import ArrowImage

    path, rows = embedded
    records = read_hf(path)
    assert [r.image_id for r in records] == [f"train/{i}" for i in range(12)]
    assert all(r.image_bytes is None and isinstance(r.image_ref, ArrowImage) and r.embedded for r in records)
    images = records[0].image_ref.images
    assert all(r.image_ref.images is images for r in records)  # one memory-mapped column shared by every record
    assert isinstance(images.dataset.data, datasets.table.MemoryMappedTable)
    # what the records weigh: pickled (as DataLoader workers under spawn receive them), far below the images
    size = sum(len(cell["bytes"]) for cell in rows["image"])
    assert len(pickle.dumps(records)) < size / 10
    # items equal the eager reading of the same rows: the bytes, and the decoded pixels
    for record, cell in zip(records, rows["image"], strict=True):
        assert record.encoded_image() == cell["bytes"]
        eager = Image.open(io.BytesIO(cell["bytes"])).convert("RGB")
        assert load_record_image(record).tobytes() == eager.tobytes()
    copies = pickle.loads(pickle.dumps(records))  # what a spawned worker reads: the same images, from the file
    assert [c.encoded_image() for c in copies] == [cell["bytes"] for cell in rows["image"]]


def test_caption_dataset_items_from_workers_equal_the_eager_reading(embedded):
    from finecap.data.loading import LoaderSettings, chunks

    path, rows = embedded
    cfg = load(overrides=["data.format=hf", f"data.path={path}"])
    dataset = CaptionDataset(load_records(cfg, "train"), per_caption=True)
    loader = LoaderSettings(num_workers=2).loader(dataset, chunks(range(12), 5), lambda items: items)
    items = [item for batch in loader for item in batch]
    assert [it["caption"] for it in items] == [f"noise {i}" for i in range(12)]
    for item, cell in zip(items, rows["image"], strict=True):
        assert item["image"].tobytes() == Image.open(io.BytesIO(cell["bytes"])).convert("RGB").tobytes()


def test_feature_cache_key_of_embedded_images_reads_no_bytes(embedded, tmp_path, monkeypatch):
    from finecap.data.features import fingerprint_data
    from finecap.data.formats.hf import ArrowImages

    path, rows = embedded
    records = read_hf(path)
    monkeypatch.setattr(ArrowImages, "read", lambda self, row: pytest.fail("the key read an image"))
    key = fingerprint_data(records)
    assert key == fingerprint_data(read_hf(path)) and key != fingerprint_data(records[::-1])
    monkeypatch.undo()
    # the data set saved again (other images, same rows): its files change, so does the key
    rows["image"][3] = {"bytes": _noise_png(99), "path": None}
    features = datasets.Features({"image": datasets.Image(), "captions": datasets.Sequence(datasets.Value("string"))})
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path / "again"))
    assert fingerprint_data(read_hf(tmp_path / "again")) != key
    # embedded bytes given in memory (no file) are hashed, as before
    eager = [Record(r.image_id, r.path, r.split, r.captions, image_bytes=r.encoded_image()) for r in records]
    assert fingerprint_data(eager) == fingerprint_data(eager) != key


def test_features_of_an_arrow_file_replaced_with_the_same_size_and_time_are_computed_again(tmp_path):
    # the feature cache keys an embedded image by its Arrow files' paths, sizes and modification times: a file
    # replaced by another of the same size with the old time (cp -p, rsync -t) kept the key, and the cache served
    # the replaced images' features. The key is kept (users' caches); a file written before the change is not used.
    import numpy as np
    import torch

    from finecap.data.features import cached_features, fingerprint_data

    def stored_png(value: int) -> bytes:  # uncompressed: every 8x8 image has the same size
        buf = io.BytesIO()
        Image.new("RGB", (8, 8), (value, value, value)).save(buf, format="PNG", compress_level=0)
        return buf.getvalue()

    features = datasets.Features({"image": datasets.Image(), "captions": datasets.Sequence(datasets.Value("string"))})
    for name, value in (("old", 10), ("new", 200)):
        rows = {"image": [{"bytes": stored_png(value), "path": None}], "captions": [["a square"]]}
        datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path / name))
    arrow, new = tmp_path / "old" / "data-00000-of-00001.arrow", tmp_path / "new" / "data-00000-of-00001.arrow"

    encoded = []

    def brightness(images: list) -> torch.Tensor:
        encoded.append(len(images))
        return torch.tensor([[float(np.asarray(image).mean())] for image in images])  # (b, 1)

    def cached(records: list) -> torch.Tensor:
        return cached_features(records, brightness, cache_dir=tmp_path / "cache", encoder_key="mean", split="train")

    records = read_hf(tmp_path / "old")
    assert cached(records).tolist() == [[10.0]]
    st = arrow.stat()
    assert new.stat().st_size == st.st_size
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(new, arrow)  # cp -p's result: the same name, size and modification time
    again = read_hf(tmp_path / "old")
    assert fingerprint_data(again) == fingerprint_data(records)  # the key users' caches have, kept
    assert cached(again).tolist() == [[200.0]] and encoded == [1, 1]
    assert cached(again).tolist() == [[200.0]] and encoded == [1, 1]  # the file written then is used from then on


def test_a_column_of_raw_image_bytes_is_refused_with_the_cast_that_reads_it(tmp_path):
    # pandas writes an image's file bytes as a plain binary column: the error said only "got bytes"; the cast it
    # names makes a file the reader takes
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    table = pa.table({"image": [_png((255, 0, 0)), _png((0, 0, 255))], "caption": ["A red one.", "A blue one."]})
    pq.write_table(table, tmp_path / "train.parquet")
    with pytest.raises(DataError, match=r"holds raw bytes, not an Image feature; cast it once") as e:
        read_hf(tmp_path / "train.parquet", caption_column="caption", cache_dir=tmp_path / "cache")
    assert "ds.cast_column('image', datasets.Image())" in str(e.value)
    ds = datasets.Dataset.from_parquet(str(tmp_path / "train.parquet"), cache_dir=str(tmp_path / "cache2"))
    (tmp_path / "cast").mkdir()
    ds.cast_column("image", datasets.Image()).to_parquet(str(tmp_path / "cast" / "train.parquet"))
    records = read_hf(tmp_path / "cast" / "train.parquet", caption_column="caption", cache_dir=tmp_path / "cache3")
    assert load_record_image(records[1]).getpixel((0, 0)) == (0, 0, 255)


def test_a_split_asked_for_that_the_data_set_lacks_is_named_with_those_present(tmp_path):
    """``read_hf(splits=["val"])`` of a data set without one said "no rows: an empty data set" (and with ``train``
    too read train alone, unsaid); it now says the split is missing and lists the splits there (one asked for as
    it is read, ``val`` for ``validation``, is there: test_hugging_faces_validation_split_is_read_as_val)."""
    saved = _saved_splits(tmp_path, "train", "test")
    for asked in (["val"], ["train", "val"]):  # the second read train alone, unsaid
        with pytest.raises(DataError, match=rf"^{re.escape(str(saved))}: no split 'val' in the data set \(splits "
                           r"present: split 'train' \(.*\): 1 rows, split 'test' \(.*\): 1 rows\)$"):  # fmt: skip
            read_hf(saved, splits=asked)
    assert [r.split for r in read_hf(saved, splits=["test"])] == ["test"]
