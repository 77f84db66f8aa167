import contextlib
import csv
import io
import itertools
import json
import logging
import re
import sys
from pathlib import Path

import pytest
from pycocotools import coco as pycocotools_coco

from finecap.data.bags_file import read_bags
from finecap.data.formats import detect_format, read_dataset
from finecap.data.formats.coco import read_coco_captions
from finecap.data.formats.folder import read_folder
from finecap.data.formats.jsonl import read_jsonl
from finecap.data.formats.karpathy import read_karpathy
from finecap.data.records import NO_SPLIT, DataError, Record, needs_cleaning
from finecap.data.results import read_results, write_results
from finecap.metrics.cocoeval import CaptionFile
from finecap.utils.files import write_json
from finecap.utils.reading import read_json


def _touch(root: Path, *names: str) -> None:
    for n in names:
        p = root / n
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"")


def _write(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj))
    return path


KARPATHY = {
    "dataset": "coco",
    "images": [
        {
            "filepath": "val2014",
            "filename": "COCO_val2014_000000000042.jpg",
            "imgid": 0,
            "cocoid": 42,
            "split": "test",
            "sentids": [0, 1],
            "sentences": [
                {"raw": "A dog on a couch. ", "tokens": ["a", "dog", "on", "a", "couch"]},
                {"raw": "A brown dog sleeping.", "tokens": ["a", "brown", "dog", "sleeping"]},
            ],
        },
        {
            "filepath": "train2014",
            "filename": "COCO_train2014_000000000007.jpg",
            "imgid": 1,
            "cocoid": 7,
            "split": "restval",
            "sentences": [{"tokens": ["two", "cats"]}],
        },
    ],
}


def test_read_karpathy(tmp_path):
    path = _write(tmp_path / "dataset_coco.json", KARPATHY)
    _touch(tmp_path, "val2014/COCO_val2014_000000000042.jpg", "train2014/COCO_train2014_000000000007.jpg")
    records = read_karpathy(path)
    caps = ["A dog on a couch.", "A brown dog sleeping."]  # raw, stripped
    assert records == [
        Record(42, tmp_path / "val2014/COCO_val2014_000000000042.jpg", "test", caps),
        Record(7, tmp_path / "train2014/COCO_train2014_000000000007.jpg", "restval", ["two cats"]),
    ]
    assert read_dataset("karpathy", path) == records


def test_karpathy_splits_are_read_as_every_reader_reads_them(tmp_path, caplog):
    # "Train" was a split of its own (left out of training), "dev" too without a word: as JSONL reads them now;
    # "validation" is val (split_named), as Hugging Face's named split of that name is
    import copy

    data = copy.deepcopy(KARPATHY)
    data["images"][0]["split"], data["images"][1]["split"] = "Train", "dev"
    data["images"].append({**data["images"][1], "cocoid": 8, "filename": "b.jpg", "split": "validation"})
    path = _write(tmp_path / "dataset_coco.json", data)
    with caplog.at_level(logging.INFO, logger="finecap.data"):
        records = read_karpathy(path, check_images=False)
    assert [r.split for r in records] == ["train", "dev", "val"]
    said = [r.getMessage() for r in caplog.records]
    assert any("write their split in another case or word" in m and "'Train' as 'train' (1), 'validation' as 'val' "
               "(1)" in m for m in said), said  # fmt: skip
    assert any("name a split that is none of train, val, test: 'dev' (1)" in m for m in said), said


def test_read_karpathy_flickr_layout_and_image_root(tmp_path):
    data = {"images": [{"filename": "1000.jpg", "imgid": 5, "split": "train", "sentences": [{"raw": "a man"}]}]}
    path = _write(tmp_path / "dataset_flickr30k.json", data)
    _touch(tmp_path / "flickr30k-images", "1000.jpg")
    (rec,) = read_karpathy(path, images=tmp_path / "flickr30k-images")
    assert rec == Record(5, tmp_path / "flickr30k-images/1000.jpg", "train", ["a man"])


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("images"), r"missing key 'images'"),
        (lambda d: d["images"][1].pop("split"), r"images\[1\] \(COCO_train2014_\d+.jpg\): missing key 'split'"),
        (lambda d: d["images"][0].update(sentences=[]), r"images\[0\] \(COCO_val2014_\d+.jpg\): empty caption"),
        (lambda d: d["images"][0].update(sentences="a dog"), r"images\[0\] .*'sentences' must be list, got str"),
        (lambda d: d["images"][0]["sentences"][1].update(raw=3), r"sentences\[1\]: 'raw' must be str, got int"),
        (lambda d: d["images"][1].update(filename=None), r"images\[1\]: 'filename' must be str, got NoneType"),
        (lambda d: d["images"][0]["sentences"][0].update(raw="  "), r"images\[0\] .*caption 0 is empty"),
        (lambda d: d["images"].__setitem__(0, "x.jpg"), r"images\[0\]: expected an object, got str"),
    ],
)  # fmt: skip
def test_karpathy_errors_name_file_and_record(tmp_path, mutate, message):
    data = json.loads(json.dumps(KARPATHY))
    mutate(data)
    path = _write(tmp_path / "dataset_coco.json", data)
    with pytest.raises(DataError, match=message) as e:
        read_karpathy(path, check_images=False)
    assert str(path) in str(e.value)


def test_missing_images_reported_with_count_and_first_paths(tmp_path):
    data = {"images": [{"filename": f"{i}.jpg", "split": "train", "sentences": [{"raw": "x"}]} for i in range(8)]}
    path = _write(tmp_path / "d.json", data)
    _touch(tmp_path, "0.jpg")
    with pytest.raises(DataError) as e:
        read_karpathy(path)
    msg = str(e.value)
    assert "7 of 8 image files do not exist" in msg and str(path) in msg
    assert str(tmp_path / "1.jpg") in msg and str(tmp_path / "5.jpg") in msg
    assert str(tmp_path / "6.jpg") not in msg and "and 2 more" in msg  # first 5 listed
    assert len(read_karpathy(path, check_images=False)) == 8


def test_bad_json_and_missing_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"images": [')
    with pytest.raises(DataError, match=r"bad.json: invalid JSON at line 1"):
        read_karpathy(bad)
    with pytest.raises(DataError, match=r"nope.json: file not found"):
        read_coco_captions(tmp_path / "nope.json")
    with pytest.raises(
        DataError,
        match="unknown data set format 'csv'; valid formats: coco, folder, hf, jsonl, karpathy, messages, world",
    ):
        read_dataset("csv", bad)


@pytest.mark.parametrize("fmt", ["karpathy", "coco", "jsonl", "messages"])
def test_a_folder_given_to_a_format_that_reads_a_file_says_what_the_folder_reads_as(tmp_path, fmt):
    """``data.path=photos`` with a recipe's ``data.format=karpathy`` said only "is a directory, but a file is
    expected here": it names the format that reads a file and the one the folder reads as."""
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "a.png").write_bytes(b"")
    with pytest.raises(DataError, match=rf"photos: a folder, but data.format={fmt} reads a file; it reads as "
                                        r"data.format=folder$"):  # fmt: skip
        read_dataset(fmt, photos)
    with pytest.raises(DataError, match=rf"photos: a folder, but data.format={fmt} reads a file; it reads as "
                                        r"data.format=folder data.images=$"):  # fmt: skip
        read_dataset(fmt, photos, images=tmp_path / "coco")  # a coco/* recipe's image root: a folder is its own
    with pytest.raises(DataError, match=r"data.format=folder$"):
        read_dataset(fmt, photos, images=photos)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=rf"empty: a folder, but data.format={fmt} reads a file$"):
        read_dataset(fmt, tmp_path / "empty")


COCO = {
    "info": {},
    "images": [{"id": 42, "file_name": "COCO_val2014_000000000042.jpg"}, {"id": 7, "file_name": "b.jpg"}],
    "annotations": [
        {"image_id": 7, "id": 1, "caption": "Two cats."},
        {"image_id": 42, "id": 2, "caption": "A dog."},
        {"image_id": 7, "id": 3, "caption": "Cats on a bed"},
    ],
}


def test_read_coco_captions(tmp_path):
    path = _write(tmp_path / "captions_val2014.json", COCO)
    _touch(tmp_path / "val2014", "COCO_val2014_000000000042.jpg", "b.jpg")
    records = read_coco_captions(path, images=tmp_path / "val2014")
    assert records == [
        Record(42, tmp_path / "val2014/COCO_val2014_000000000042.jpg", "val", ["A dog."]),
        Record(7, tmp_path / "val2014/b.jpg", "val", ["Two cats.", "Cats on a bed"]),
    ]
    assert read_dataset("coco", path, images=tmp_path / "val2014") == records
    assert read_coco_captions(path, check_images=False, split="test")[0].split == "test"


def test_coco_images_naming_another_split_are_said(tmp_path, caplog):
    """A COCO file is one split, its name's; images carrying a "split" key of another (data made by hand with its
    splits in one file) are read into the file's split all the same, and were silently: `finecap caption --data
    captions_all.json` captioned the training images as "test". Now a warning names them and what keeps the
    splits; a key agreeing with the file's split (any case, restval as train) says nothing."""
    data = json.loads(json.dumps(COCO))
    data["images"][0]["split"] = "train"
    data["images"][1]["split"] = " Val "
    path = _write(tmp_path / "captions_all.json", data)
    with caplog.at_level(logging.INFO, logger="finecap"):
        records = read_coco_captions(path, check_images=False)
    assert [r.split for r in records] == ["test", "test"]  # read as before: the file name's split
    said = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and "2 of 2 images name another split than the file's in a 'split' key" in said[0].message
    assert "('train' (1), ' Val ' (1))" in said[0].message and "all are in split 'test'" in said[0].message
    caplog.clear()
    data["images"][0]["split"], data["images"][1]["split"] = "restval", "TRAIN"
    with caplog.at_level(logging.INFO, logger="finecap"):
        read_coco_captions(_write(tmp_path / "captions_train.json", data), check_images=False)
    assert [r.message for r in caplog.records if r.levelno == logging.WARNING] == []


def test_coco_variants_pycocotools_reads(tmp_path):
    # pycocotools' COCO (hence pycocoevalcap) reads reference files whose images carry only an id, with extra fields
    # everywhere, images without annotations, or no 'images' list at all: the reader takes them all for text metrics.
    data = {
        "images": [{"id": 42, "license": 3}, {"id": 7, "coco_url": "http://x"}, {"id": 9}],
        "annotations": [
            {"image_id": 7, "id": 1, "caption": "Two cats.", "score": 0.5},
            {"image_id": 42, "id": 2, "caption": "A dog."},
        ],
        "licenses": [],
        "type": "captions",
    }
    path = _write(tmp_path / "refs.json", data)
    records = read_coco_captions(path, check_images=False)
    # image 9 has no caption: dropped (nothing to score); the path of an id-only image is <root>/<id>
    assert records == [
        Record(42, tmp_path / "42", "test", ["A dog."]),
        Record(7, tmp_path / "7", "test", ["Two cats."]),
    ]
    with pytest.raises(DataError, match=r"2 image\(s\) have no 'file_name', e.g. ids \[42, 7\]"):
        read_coco_captions(path, check_images=True)
    del data["images"]
    no_images = read_coco_captions(_write(tmp_path / "anns.json", data), check_images=False)
    assert [(r.image_id, r.captions) for r in no_images] == [(7, ["Two cats."]), (42, ["A dog."])]
    with contextlib.redirect_stdout(io.StringIO()):
        gt = pycocotools_coco.COCO(str(path))
    assert {i: [a["caption"] for a in gt.imgToAnns[i]] for i in (42, 7)} == {r.image_id: r.captions for r in records}


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("annotations"), r"missing key 'annotations'"),
        (lambda d: d["annotations"][1].pop("caption"), r"annotations\[1\]: missing key 'caption'"),
        (lambda d: d["annotations"][0].update(image_id=99), r"annotations\[0\]: image_id 99 is not in 'images'"),
        (
            lambda d: d["images"][0].update(id="42"),  # an id the file writes as a string, its annotations as a number
            r"annotations\[1\]: image_id 42 is not in 'images' \(an 'images' entry has id '42', a str: write both ids",
        ),
        (lambda d: d["images"][1].update(id=42), r"images\[1\]: duplicate image id 42"),
        (lambda d: d["images"][0].update(file_name=3), r"images\[0\] \(id 42\): 'file_name' must be str"),
        (lambda d: d["annotations"].clear(), r"no image has a caption annotation"),
        (lambda d: d["annotations"][0].update(caption=" "), r"image id 7 \(b.jpg\): caption 0 is empty"),
        (lambda d: d["annotations"][2].update(caption=["x"]), r"annotations\[2\]: 'caption' must be str, got list"),
    ],
)
def test_coco_errors(tmp_path, mutate, message):
    data = json.loads(json.dumps(COCO))
    mutate(data)
    path = _write(tmp_path / "captions_val2014.json", data)
    with pytest.raises(DataError, match=message):
        read_coco_captions(path, check_images=False)


def test_read_jsonl(tmp_path):
    _touch(tmp_path, "imgs/a.png")
    _touch(tmp_path / "abs", "b.png")
    lines = [
        {"image": "imgs/a.png", "captions": ["a red circle", "a circle"]},
        {"image": str(tmp_path / "abs/b.png"), "captions": ["x"], "id": 9, "split": "train"},
    ]
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(lines[0]) + "\n\n" + json.dumps(lines[1]) + "\n")
    records = read_jsonl(path)
    assert records == [
        Record("imgs/a.png", tmp_path / "imgs/a.png", NO_SPLIT, ["a red circle", "a circle"]),  # split later
        Record(9, tmp_path / "abs/b.png", "train", ["x"]),
    ]
    assert read_dataset("jsonl", path) == records
    assert [r.split for r in read_jsonl(path, split="test")] == ["test", "train"]  # the reader's default split


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"captions": ["x"]}', r"line 2: missing key 'image'"),
        ('{"image": "b.png", "captions": []}', r"line 2: empty caption list"),
        ('{"image": "a.png", "captions": "x"}', r"line 2: 'captions' must be list, got str"),
        ('{"image": "b.png", "captions": [1]}', r"line 2: caption 0 must be a string, got int"),
        ('{"image": "a.png", "captions": ["x"], "id": 1.5}', r"line 2: 'id' must be int or str, got float"),
        ('{"image": "c.png", "captions": ["x"], "id": "a.png"}', r"line 2: duplicate image id 'a.png'"),
        ('{"image": "a.png",', r"line 2: invalid JSON"),
        # one file under other spellings of its path: a duplicate image, in another split a leak between splits
        ('{"image": "./a.png", "captions": ["x"]}', r"line 2: image './a.png' is the file of .*line 1 already"),
        ('{"image": "b/../a.png", "captions": ["x"], "id": 7}', r"line 2: image 'b/../a.png' is the file of .*line 1"),
        (
            '{"image": ".//a.png", "captions": ["x"], "split": "test"}',
            r"line 2: image './/a.png' has split 'test' here but no split at .*line 1 \(the same file\)",
        ),
        ('["a.png"]', r"line 2: expected an object, got list"),
    ],
)
def test_jsonl_errors(tmp_path, text, message):
    path = tmp_path / "data.jsonl"
    path.write_text('{"image": "a.png", "captions": ["ok"]}\n' + text + "\n")
    with pytest.raises(DataError, match=message) as e:
        read_jsonl(path, check_images=False)
    assert str(path) in str(e.value)


def test_jsonl_one_file_under_two_ids_is_kept_only_inside_one_named_split(tmp_path):
    # without a split the ids' hash may put the two lines in train and val: one photo trained on and validated on
    path = tmp_path / "data.jsonl"
    lines = ['{"image": "a.png", "captions": ["x"], "id": 1%s}', '{"image": "./a.png", "captions": ["y"], "id": 2%s}']
    path.write_text("\n".join(line % ', "split": "train"' for line in lines) + "\n")
    assert [r.image_id for r in read_jsonl(path, check_images=False)] == [1, 2]  # both in train: the user's choice
    path.write_text("\n".join(line % "" for line in lines) + "\n")
    with pytest.raises(DataError, match=r"line 2: image './a.png' is the file of .*line 1 already"):
        read_jsonl(path, check_images=False)


def test_jsonl_missing_images(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"image": "gone.png", "captions": ["x"]}\n')
    with pytest.raises(DataError, match=r"1 of 1 image files do not exist"):
        read_jsonl(path)


def test_world_format_reads_a_world_folder(tmp_path):
    from finecap.config import WorldConfig
    from finecap.world.make import make_world

    out = make_world(WorldConfig(n_train=3, n_val=1, n_test=1, image_size=32), tmp_path / "w", progress=False)
    records = read_dataset("world", out)
    assert read_dataset("world", out / "dataset.json") == records
    assert [r.split for r in records] == ["train"] * 3 + ["val", "test"]
    assert records[4].path == out / "images/test/000004.png" and len(records[4].captions) == 5
    with pytest.raises(DataError, match="finecap world make"):
        read_dataset("world", tmp_path / "nothing")


def test_results_round_trip(tmp_path):
    path = tmp_path / "sub" / "results.json"
    captions = {42: "a dog on a couch", 7: "two cats", "x-1": "a bird"}
    write_results(path, captions)
    assert json.loads(path.read_text()) == [
        {"image_id": 42, "caption": "a dog on a couch"},
        {"image_id": 7, "caption": "two cats"},
        {"image_id": "x-1", "caption": "a bird"},
    ]
    assert read_results(path) == {i: [c] for i, c in captions.items()}
    write_results(path, {})
    assert read_results(path) == {}


def test_results_with_repeated_ids_keep_every_caption_like_pycocotools(tmp_path):
    rows = [{"image_id": 1, "caption": "a"}, {"image_id": 2, "caption": "b"}, {"image_id": 1, "caption": "c"},
            {"image_id": 1, "caption": "a"}]  # fmt: skip
    path = _write(tmp_path / "results.json", rows)
    # Every entry is kept, grouped per image in file order (an exact repeat too).
    assert read_results(path) == {1: ["a", "c", "a"], 2: ["b"]}
    # pycocotools' COCO.loadRes, which pycocoevalcap's COCOEvalCap reads results with, keeps the same captions.
    gt = pycocotools_coco.COCO()
    gt.dataset = {"images": [{"id": 1}, {"id": 2}], "annotations": []}
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
        res = gt.loadRes(str(path))
    assert {i: [a["caption"] for a in res.imgToAnns[i]] for i in (1, 2)} == read_results(path)


def test_integral_float_ids_are_the_integers_pycocotools_reads_them_as(tmp_path, caplog):
    """Results written through pandas give ids as floats (``"image_id": 42.0``), and pycocotools reads them: it keys
    its indexes by the ids, and in a Python dict 42.0 is 42 (``hash(42.0) == hash(42)``). finecap refused such a file
    ("'image_id' must be int or str, got float 42.0"); now an integral float id of a COCO results or annotations
    file is that integer, said once in a warning, and any other float is still refused, naming the entry."""
    rows = [{"image_id": 1.0, "caption": "a"}, {"image_id": 2, "caption": "b"}, {"image_id": 1, "caption": "c"},
            {"image_id": -3.0, "caption": "d"}]  # fmt: skip
    path = _write(tmp_path / "results.json", rows)
    with caplog.at_level(logging.WARNING, logger="finecap"):
        read = read_results(path)
    assert read == {1: ["a", "c"], 2: ["b"], -3: ["d"]} and all(type(i) is int for i in read)
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: 2 image id(s) are written as floats (e.g. 1.0), read as the integers they are, as pycocotools "
        "reads them"
    ]
    # pycocotools reads the same captions for the integer ids of the annotations
    gt = pycocotools_coco.COCO()
    gt.dataset = {"images": [{"id": 1}, {"id": 2}, {"id": -3}], "annotations": []}
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
        res = gt.loadRes(str(path))
    assert {i: [a["caption"] for a in res.imgToAnns[i]] for i in (1, 2, -3)} == read
    # annotations: float ids in 'images', in 'annotations', and without 'images' (the images the annotations')
    anns = [{"image_id": 7.0, "caption": "a cat"}, {"image_id": 8, "caption": "a dog"},
            {"image_id": 7, "caption": "the cat"}]  # fmt: skip
    for images in ([{"id": 7}, {"id": 8.0}], None):
        data = {"annotations": anns} | ({"images": images} if images else {})
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="finecap"):
            records = read_coco_captions(_write(tmp_path / "captions_val.json", data), check_images=False)
        assert [(r.image_id, type(r.image_id), r.captions) for r in records] == [
            (7, int, ["a cat", "the cat"]), (8, int, ["a dog"])]  # fmt: skip
        assert [r.getMessage().split(": ", 2)[2] for r in caplog.records] == [
            f"{1 + (images is not None)} image id(s) are written as floats (e.g. {8.0 if images else 7.0}), read as "
            "the integers they are, as pycocotools reads them"
        ]
    # a float that is no integer, or none within 2**53 - 1, names no image; a bool is no id
    for odd in (42.5, float("nan"), float("inf"), 2.0**53):
        bad = _write(tmp_path / "bad.json", [{"image_id": 1, "caption": "a"}, {"image_id": odd, "caption": "b"}])
        with pytest.raises(DataError, match=rf"bad\.json: \[1\]: 'image_id' {re.escape(repr(odd))} names no image"):
            read_results(bad)
        data = {"images": [{"id": odd}], "annotations": [{"image_id": odd, "caption": "a"}]}
        with pytest.raises(DataError, match=rf"images\[0\]: 'id' {re.escape(repr(odd))} names no image"):
            read_coco_captions(_write(tmp_path / "captions_val.json", data), check_images=False)
    with pytest.raises(DataError, match=r"\[0\]: 'image_id' must be int or str, got bool"):
        read_results(_write(tmp_path / "bad.json", [{"image_id": True, "caption": "a"}]))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"image_id": 1, "caption": "x"}, r"must be a list of"),
        ([{"image_id": 1}], r"\[0\]: missing key 'caption'"),
        ([{"caption": "x"}], r"\[0\]: missing key 'image_id'"),
        ([{"image_id": 1, "caption": 5}], r"\[0\]: 'caption' must be str, got int"),
        ([{"image_id": True, "caption": "x"}], r"\[0\]: 'image_id' must be int or str, got bool"),
    ],
)
def test_results_errors(tmp_path, data, message):
    path = _write(tmp_path / "results.json", data)
    with pytest.raises(DataError, match=message) as e:
        read_results(path)
    assert str(path) in str(e.value)


def test_a_mapping_or_annotations_given_as_results_are_named_with_what_to_do(tmp_path, monkeypatch):
    """Two JSON objects given for COCO results (a list, as pycocotools' ``loadRes`` asserts: "results in not an array
    of objects"): a ``{image_id: caption}`` mapping, which some scripts dump, and COCO caption annotations, the
    references given in their place. Both were "must be a list ..., got dict" alone; now the error says what the file
    is, and for the mapping gives a conversion, which run on it gives results finecap reads."""
    mapping = _write(tmp_path / "captions by id.json", {"391895": "a man riding a bike", "7": "two cats"})
    with pytest.raises(DataError) as e:
        read_results(mapping)
    message = str(e.value)
    assert message.startswith(f"{mapping}: COCO results must be a list of {{'image_id', 'caption'}} objects, got "
                              "dict mapping 2 ids to captions ({image_id: caption}); write it as a list, e.g. "
                              'python -c "')  # fmt: skip
    command = message.split("e.g. ", 1)[1]
    assert command.endswith(f"'{mapping}' > results.json")  # the path quoted for the shell
    code = command.split('python -c "', 1)[1].split('" ', 1)[0]
    monkeypatch.setattr(sys, "argv", ["-c", str(mapping)])  # as python -c CODE FILE runs it
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code, {})
    converted = tmp_path / "results.json"
    converted.write_text(printed.getvalue())
    assert read_results(converted) == {"391895": ["a man riding a bike"], "7": ["two cats"]}
    annotations = _write(
        tmp_path / "captions_val2014.json",
        {"images": [{"id": 1}], "annotations": [{"image_id": 1, "caption": "a cat"}]},
    )
    with pytest.raises(DataError, match=r"got dict: this is a COCO caption annotations file \('annotations'\), the "
                                        r"references of a data set, not results$"):  # fmt: skip
        read_results(annotations)


def test_write_results_rejects_bad_values(tmp_path):
    with pytest.raises(DataError, match="caption of image 3 must be a string"):
        write_results(tmp_path / "r.json", {3: None})
    with pytest.raises(DataError, match=r"image id 1.5 must be an int or a string"):
        write_results(tmp_path / "r.json", {1.5: "x"})
    assert not (tmp_path / "r.json").exists()


def test_read_bags_roundtrip_and_errors(tmp_path):
    path = tmp_path / "bags.json"
    write_json(path, {"bags": {"3": [{"images": [1, 2, 3], "similarity": 0.9}], "2": [["a", "b"]]}})
    assert read_bags(path) == {3: [[1, 2, 3]], 2: [["a", "b"]]}
    write_json(path, {"bags": {"x": []}})
    with pytest.raises(DataError, match="not a bag size"):
        read_bags(path)
    write_json(path, {"bags": {"2": [[1]]}})
    with pytest.raises(DataError, match=r"bags\['2'\]\[0\] must hold a list of at least two image ids"):
        read_bags(path)
    # an image twice in a bag of 3: its caption competed with one other image, reported as bag3/R@1
    write_json(path, {"bags": {"3": [[1, 2, 3], {"images": [4, 4, 5]}]}})
    with pytest.raises(DataError, match=r"bags\['3'\]\[1\] names image\(s\) \[4\] more than once"):
        read_bags(path)
    with pytest.raises(FileNotFoundError, match="finecap bags build"):
        read_bags(tmp_path / "missing.json")


def test_every_registry_row_is_a_format_spec_of_that_name():
    from finecap.data.formats import FORMATS, Format, data_format
    from finecap.registry import DATA_FORMATS, HUB_DATA_FORMATS

    specs = [data_format(name) for name in DATA_FORMATS]
    assert all(isinstance(spec, Format) for spec in specs)
    assert [spec.name for spec in specs] == list(DATA_FORMATS) == list(FORMATS)
    # the configuration's copy of which formats read Hub names (it imports no format) says what the specs say
    assert {spec.name for spec in specs if spec.hub_names} == HUB_DATA_FORMATS == {"hf"}


# --------------------------------------------------------------------------------------------------------------------
# Every JSON reader reads strictly, through one parser (finecap.utils.reading.parse_json; issue 61, class 10): a key
# twice in one object, or nesting deeper than Python's parser goes, is an error naming the file and the place
# --------------------------------------------------------------------------------------------------------------------


def _dump_duplicating(obj, key: str, first) -> str:
    """``obj`` (a dict) as one line of JSON with ``key`` written twice: ``first``, then its value in ``obj``."""
    text = json.dumps(obj)
    assert text.startswith("{")
    return "{" + json.dumps(key) + ": " + json.dumps(first) + ", " + text[1:]


WHOLE_FILES = {  # a whole-file reader -> (file name, a JSON text holding a key twice on its 3rd line, the key)
    "karpathy": (lambda p: read_karpathy(p, check_images=False), "dataset_coco.json",
                 '{"dataset": "coco", "images": [\n{"filename": "a.jpg", "cocoid": 1, "split": "test", "sentences": '
                 '[{"raw": "a"}]},\n  {"filename": "b.jpg", "cocoid": 2, "split": "test", "split": "train", '
                 '"sentences": [{"raw": "b"}]}]}', "split"),
    "coco": (lambda p: read_coco_captions(p, check_images=False), "captions_val2014.json",
             '{"images": [{"id": 1}],\n"annotations": [{"image_id": 1, "caption": "a"},\n  {"image_id": 1, '
             '"caption": "a dog", "image_id": 2, "caption": "b"}]}', "image_id"),
    "coco-top-level": (lambda p: read_coco_captions(p, check_images=False), "captions_val2014.json",
                       '{"images": [{"id": 1}],\n"annotations": [],\n  {"x": 1}, "annotations": [{"image_id": 1, '
                       '"caption": "a"}]}', None),  # a syntax error here: the reader's usual message
    "results": (read_results, "results.json",
                '[{"image_id": 1, "caption": "a"},\n{"image_id": 2, "caption": "b"},\n  {"image_id": 3, '
                '"caption": "c", "caption": "d"}]', "caption"),
    "coco-eval": (lambda p: CaptionFile(p), "refs.json",
                  '{"annotations": [\n{"image_id": 1, "caption": "a"},\n  {"image_id": 3, "image_id": 4, '
                  '"caption": "c"}]}', "image_id"),
    "bags": (read_bags, "bags.json", '{"bags": {"2": [\n[1, 2],\n  {"images": [1, 2], "images": [3, 4]}]}}', "images"),
}  # fmt: skip


@pytest.mark.parametrize("reader", list(WHOLE_FILES))
def test_whole_json_files_refuse_a_key_given_twice_naming_line_and_column(tmp_path, reader):
    read, name, text, key = WHOLE_FILES[reader]
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError) as e:
        read(path)
    if key is None:
        assert str(e.value).startswith(f"{path}: invalid JSON at line 3")
        return
    assert str(e.value).startswith(f"{path}: duplicate key '{key}' in the object at line 3, column 3; ")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("reader", [r for r in WHOLE_FILES if WHOLE_FILES[r][3]])
@pytest.mark.parametrize("nesting", ["arrays", "objects"])
def test_whole_json_files_refuse_deep_nesting_naming_line_and_column(tmp_path, reader, nesting):
    read, name, _, _ = WHOLE_FILES[reader]
    path = tmp_path / name
    deep = "[" * 3_000 + "]" * 3_000 if nesting == "arrays" else '{"k": ' * 3_000 + "0" + "}" * 3_000
    path.write_text('{"images": [],\n"annotations": [],\n"x": ' + deep + "}")
    with pytest.raises(ValueError) as e:
        read(path)
    column = len('"x": ') + _opening(deep, 500)  # the top object is the first level
    assert str(e.value).startswith(f"{path}: JSON nested too deeply to read (more than 500 levels at line 3, column "
                                   f"{column}); ")  # fmt: skip


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (_dump_duplicating({"image": "a.png", "captions": ["x"]}, "image", "b.png"), "duplicate key 'image'"),
        (_dump_duplicating({"image": "b.png", "captions": ["x"], "split": "test"}, "split", "train"),
         "duplicate key 'split'"),
        ('{"image": "b.png", "captions": ["x"], "boost": {"blend": ["y"], "blend": ["z"]}}',
         "duplicate key 'blend' in the object at column 48"),  # its {
        ('{"image": "b.png", "captions": ' + "[" * 5_000 + "]" * 5_000 + "}",
         f"JSON nested too deeply to read (more than 500 levels at column {31 + 500})"),  # 31 characters, then [s
    ],
    ids=["image", "split", "nested-object", "deep"],
)  # fmt: skip
def test_jsonl_lines_are_read_strictly(tmp_path, line, message):
    path = tmp_path / "data.jsonl"
    path.write_text('{"image": "a.png", "captions": ["ok"]}\n' + line + "\n")
    with pytest.raises(DataError) as e:
        read_jsonl(path, check_images=False)
    assert str(e.value).startswith(f"{path}, line 2: {message}")


@pytest.mark.parametrize(
    ("split", "read"),
    [("TRAIN", "train"), ("Val", "val"), (" test ", "test"), ("validation", "val"), ("Valid", "val"),
     ("training", "train"), ("testing", "test"), ("dev", "dev")],
)  # fmt: skip
def test_jsonl_splits_in_another_case_or_word_are_read_as_the_split(tmp_path, caplog, split, read):
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"image": "a.png", "captions": ["x"], "split": split}) + "\n")
    with caplog.at_level(logging.INFO, logger="finecap.data.records"):
        assert [r.split for r in read_jsonl(path, check_images=False)] == [read]
    (note,) = [r.getMessage() for r in caplog.records if r.name == "finecap.data.records"]
    assert note.startswith(f"data: {path}: 1 records ") and repr(split) in note


def test_a_file_writing_one_split_as_itself_and_in_another_word_is_refused(tmp_path):
    # read as one split, "val" and "validation" could be two the file keeps apart: named, not merged unsaid
    path = _lines(
        tmp_path / "data.jsonl",
        *(
            {"image": f"{n}.png", "captions": ["x"], "split": s}
            for n, s in enumerate(["val", "validation", "Validation", "VAL"])
        ),
    )
    with pytest.raises(DataError) as caught:
        read_jsonl(path, check_images=False)
    assert str(caught.value) == (
        f"{path}: records write 'val' (1) and 'validation' (1), 'val' (1) and 'Validation' "
        "(1): finecap reads both as one split; give them one name, or, to keep them apart, "
        "one that is none of train, val, test, valid, validation, training, testing"
    )
    _lines(path, *({"image": f"{n}.png", "captions": ["x"], "split": s} for n, s in enumerate(["val", " VAL"])))
    assert [r.split for r in read_jsonl(path, check_images=False)] == ["val", "val"]  # one word in two cases: one


def _second_caption_readers(tmp_path, caption, formats=("jsonl", "karpathy", "coco")):
    """For each of ``formats``: a reader of a one-image data set (``a.png``, made here) whose captions are ``"ok"``
    and ``caption``, and the start of what an error about that second caption names."""
    _touch(tmp_path, "a.png")
    readers = {
        "jsonl": (lambda: read_jsonl(_lines(tmp_path / "d.jsonl", {"image": "a.png", "captions": ["ok", caption]})),
                  "d.jsonl, line 1: caption 1 "),
        "karpathy": (lambda: read_karpathy(_write(tmp_path / "k.json", {"images": [
            {"filename": "a.png", "cocoid": 1, "split": "test", "sentences": [{"raw": "ok"}, {"raw": caption}]}]})),
            "k.json: images[0]"),
        "coco": (lambda: read_coco_captions(_write(tmp_path / "captions_val.json", {"images": [
            {"id": 1, "file_name": "a.png"}], "annotations": [{"image_id": 1, "caption": "ok"},
                                                              {"image_id": 1, "caption": caption}]})),
            "captions_val.json: image id 1 (a.png): caption 1 "),
    }  # fmt: skip
    return {name: readers[name] for name in formats}


def test_the_fast_readers_test_of_ascii_text_is_the_control_character_classes():
    # needs_cleaning reads ASCII text by str.isprintable: every ASCII character, alone and among words, against the
    # ASCII part of what clean_text reads (control characters C0 and DEL; the bidirectional controls and the BOM are
    # not ASCII); then non-ASCII text: a C1 control, an override, a BOM, and a direction mark (kept)
    for code in range(128):
        want = code < 0x20 or code == 0x7F
        assert needs_cleaning(chr(code)) is want and needs_cleaning(f"a dog{chr(code)} runs") is want, hex(code)
    assert needs_cleaning("a caf\u00e9\u0085") and needs_cleaning("\u202ea dog") and needs_cleaning("\ufeffa dog")
    assert not needs_cleaning("a caf\u00e9 \u200e")


@pytest.mark.parametrize(
    ("caption", "outcome"),
    [("a red\ncircle", "a red circle"), ("a red\r\n\tcircle ", "a red circle"), ("a red\x00circle", "U+0000"),
     ("\x1b[31ma red circle", "U+001B"), ("a red circle\x7f", "U+007F")],
)  # fmt: skip
def test_control_characters_in_captions_of_every_reader(tmp_path, caption, outcome):
    """JSONL, Karpathy, COCO and a folder's captions.csv / .txt files: a line break or tab is a space; another
    control character is refused, naming the file and the record."""
    for name, (read, where) in _second_caption_readers(tmp_path, caption).items():
        if outcome.startswith("U+"):
            with pytest.raises(DataError) as e:
                read()
            assert where in str(e.value) and f"holds control character {outcome} at character" in str(e.value), name
        else:
            assert read()[0].captions == ["ok", outcome], name
    folder = tmp_path / "photos"
    _touch(folder, "a.png")
    with (folder / "captions.csv").open("w", newline="") as f:
        csv.writer(f).writerows([("image", "caption"), ("a.png", "ok"), ("a.png", caption)])  # quoted as needed
    (folder / "b.png").write_bytes(b"")
    if outcome.startswith("U+"):
        with pytest.raises(
            DataError, match=re.escape(f"captions.csv, line 3: the caption holds control character {outcome} ")
        ):
            read_folder(folder)
        (folder / "captions.csv").unlink()
        (folder / "a.txt").write_text(f"ok\n{caption}\n", newline="")
        with pytest.raises(
            DataError, match=re.escape(f"a.txt, line 2: the caption holds control character {outcome} ")
        ):
            read_folder(folder)
    else:
        assert read_folder(folder)[0].captions == ["ok", outcome]


@pytest.mark.parametrize("caption", ["\u200b", " \ufeff\u2060 ", "\u200e\u200f\u200b\u3000"])
def test_captions_that_show_nothing_are_refused_as_empty_by_every_reader(tmp_path, caption):
    """A caption of zero-width spaces, byte-order marks or direction marks (which ``str.strip`` keeps) is an empty
    caption that prints as nothing: JSONL, Karpathy, COCO (its fast loop too), a folder's captions.csv and .txt files
    and an ``hf`` parquet file refuse it, naming the file and the record; a caption with such a character among
    visible ones is kept as written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    _touch(tmp_path, "a.png")
    readers = {
        "jsonl": (lambda c: read_jsonl(_lines(tmp_path / "d.jsonl", {"image": "a.png", "captions": ["ok", c]})),
                  "d.jsonl, line 1: caption 1 "),
        "karpathy": (lambda c: read_karpathy(_write(tmp_path / "k.json", {"images": [
            {"filename": "a.png", "cocoid": 1, "split": "test", "sentences": [{"raw": "ok"}, {"raw": c}]}]})),
            "k.json: images[0] (a.png): caption 1 "),
        "coco": (lambda c: read_coco_captions(_write(tmp_path / "captions_val.json", {"images": [
            {"id": 1, "file_name": "a.png"}], "annotations": [{"image_id": 1, "caption": "ok"},
                                                              {"image_id": 1, "caption": c}]})),
            "captions_val.json: image id 1 (a.png): caption 1 "),
        "hf": (lambda c: read_dataset("hf", _parquet(tmp_path / "d.parquet", c), cache_dir=tmp_path / "cache"),
               "d.parquet: split 'test', row 0: caption 1 "),
    }  # fmt: skip

    def _parquet(path: Path, c: str) -> Path:
        pq.write_table(pa.table({"image": ["a.png"], "captions": [["ok", c]]}), path)
        return path

    for name, (read, where) in readers.items():
        with pytest.raises(DataError) as e:
            read(caption)
        assert where in str(e.value) and "shows no character, only invisible ones" in str(e.value), name
        assert read(f"a{caption}dog")[0].captions == ["ok", f"a{caption}dog".strip()], name
    folder = tmp_path / "photos"
    _touch(folder, "a.png")
    (folder / "captions.csv").write_text(f"image,caption\na.png,ok\na.png,{caption}\n")
    with pytest.raises(DataError, match=re.escape("captions.csv, line 3: the caption shows no character")):
        read_folder(folder)
    (folder / "captions.csv").unlink()
    (folder / "a.txt").write_text(f"ok\n{caption}\n")
    with pytest.raises(DataError, match=re.escape("a.txt, line 2: the caption shows no character")):
        read_folder(folder)


def _opening(text: str, depth: int) -> int:
    """The column (from 1) where ``text`` (no bracket in its strings) opens its ``depth``-th level."""
    levels = itertools.accumulate(1 if c in "[{" else -1 if c in "]}" else 0 for c in text)
    return next(k for k, level in enumerate(levels) if level == depth) + 1


def _lines(path: Path, *records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_finecaps_own_json_records_are_read_strictly(tmp_path):
    path = tmp_path / "info.json"
    path.write_text('{"step": 3,\n "step": 5}')
    with pytest.raises(ValueError, match=rf"^{path}: duplicate key 'step' in the object at line 1, column 1; "):
        read_json(path)
    path.write_text("[" * 10_000 + "]" * 10_000)
    with pytest.raises(ValueError, match=rf"^{path}: JSON nested too deeply to read \(more than 500 levels at line 1, "
                                         r"column 501\)"):  # fmt: skip
        read_json(path)
    for bad in (b'{"a": "\xff"}', b'{"a": "\xed\xa0\x80"}'):  # the second: an encoded surrogate (not UTF-8 either)
        path.write_bytes(bad)
        with pytest.raises(ValueError, match=rf"^{path}: not a UTF-8 text file"):
            read_json(path)
    path.write_bytes('{"a": "\U0001f642"}'.encode("utf-16"))  # JSON in UTF-16 (its surrogate pair) still reads
    assert read_json(path) == {"a": "\U0001f642"}
    path.write_text('{"a": {"b": 1}, "c": [{"b": 2}], "s": "{\\"d\\": 1, \\"d\\": 2}"}')  # the same key in two objects
    assert read_json(path) == {"a": {"b": 1}, "c": [{"b": 2}], "s": '{"d": 1, "d": 2}'}


BOM = "\ufeff"  # the byte-order mark Windows editors (Notepad, Excel's "CSV UTF-8") write at a file's start


def test_a_jsonl_file_starting_with_a_byte_order_mark_is_read_as_json_files_are(tmp_path):
    """A BOM before the first line was refused ("invalid JSON at column 1: Unexpected UTF-8 BOM") in JSONL data and
    chat files, while a JSON file (Karpathy, COCO) with one was read: it is skipped, and detection sees the file."""
    _touch(tmp_path, "a.jpg", "b.jpg")
    lines = [{"image": "a.jpg", "captions": ["a dog"]}, {"image": "b.jpg", "captions": ["a cat"], "split": "val"}]
    path = tmp_path / "data.jsonl"
    path.write_text(BOM + "\r\n".join(json.dumps(line) for line in lines) + "\r\n", encoding="utf-8")
    assert [(r.image_id, r.captions) for r in read_jsonl(path)] == [("a.jpg", ["a dog"]), ("b.jpg", ["a cat"])]
    chat = {"messages": [{"role": "user", "content": "<image>Describe."}, {"role": "assistant", "content": "a dog"}],
            "images": ["a.jpg"]}  # fmt: skip
    path = tmp_path / "chat.jsonl"
    path.write_text(BOM + json.dumps(chat) + "\n", encoding="utf-8")
    assert [(r.image_id, r.captions) for r in read_dataset("messages", path)] == [("a.jpg", ["a dog"])]
    assert detect_format(path)[0] == "messages"  # the first record is seen through the mark


def test_json_data_files_in_utf16_are_read_as_json_readers_read_them_and_line_files_are_refused(tmp_path):
    """What docs/data.md says of encodings: a JSON file (Karpathy, COCO) in UTF-16 is read as ``json.loads`` detects
    it, the same records as in UTF-8 (the page said it was refused); a JSONL file or a folder's captions.csv in
    UTF-16 is refused naming the file."""
    _touch(tmp_path, "a.jpg")
    karpathy = {"images": [{"filename": "a.jpg", "imgid": 0, "split": "test", "sentences": [{"raw": "un café"}]}]}
    utf8 = _write(tmp_path / "utf8.json", karpathy)
    (tmp_path / "utf16.json").write_bytes(json.dumps(karpathy, ensure_ascii=False).encode("utf-16"))
    assert read_dataset("karpathy", tmp_path / "utf16.json") == read_dataset("karpathy", utf8)
    assert read_dataset("karpathy", utf8)[0].captions == ["un café"]
    (tmp_path / "data.jsonl").write_bytes('{"image": "a.jpg", "captions": ["un café"]}\n'.encode("utf-16"))
    with pytest.raises(DataError, match=r"data\.jsonl: not a UTF-8 text file"):
        read_dataset("jsonl", tmp_path / "data.jsonl")
    (tmp_path / "data.jsonl").unlink()
    (tmp_path / "captions.csv").write_bytes("image,caption\na.jpg,un café\n".encode("utf-16"))
    with pytest.raises(DataError, match=r"captions\.csv: not a UTF-8 text file"):
        read_dataset("folder", tmp_path)


def test_ids_written_as_a_number_and_as_a_string_are_one_id(tmp_path):
    """``1`` and ``"1"`` on two images were two ids to every reader, while finecap eval matches a predicted "1" with
    a reference 1, per-image outputs key images by str(id) and the reward server refuses the pair: refused when
    read, in every format, naming both spellings."""
    _touch(tmp_path, "a.jpg", "b.jpg")
    path = tmp_path / "data.jsonl"
    path.write_text('{"image": "a.jpg", "captions": ["x"], "id": 1}\n{"image": "b.jpg", "captions": ["y"], "id": "1"}')
    with pytest.raises(DataError, match=r"data\.jsonl, line 2: duplicate image id '1' \(written 1 at .*line 1"):
        read_jsonl(path)
    images = [{"filename": n, "split": "train", "cocoid": i, "sentences": [{"raw": "x"}]}
              for n, i in (("a.jpg", 1), ("b.jpg", "1"))]  # fmt: skip
    path = _write(tmp_path / "dataset.json", {"images": images})
    with pytest.raises(DataError, match=r"id 1 and '1' in images\[0, 1\].*a number and as a string is one id"):
        read_dataset("karpathy", path)
    coco = {"images": [{"id": 1, "file_name": "a.jpg"}, {"id": "1", "file_name": "b.jpg"}],
            "annotations": [{"image_id": 1, "caption": "x"}, {"image_id": "1", "caption": "y"}]}  # fmt: skip
    path = _write(tmp_path / "captions_val.json", coco)
    with pytest.raises(DataError, match=r"captions_val\.json: 1 image id\(s\) .*id 1 and '1'"):
        read_dataset("coco", path)


def test_a_missing_image_whose_name_exists_in_another_unicode_normalisation_is_said_so(tmp_path):
    """A file copied from macOS keeps its NFD name ('cafe' + U+0301); a JSONL typed on Linux names it in NFC: the
    error listed a path that prints as the file `ls` shows, "does not exist", and nothing more."""
    import unicodedata

    (tmp_path / unicodedata.normalize("NFD", "café.jpg")).write_bytes(b"")
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"image": "café.jpg", "captions": ["x"]}, ensure_ascii=False) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"(?s)1 of 1 image files do not exist.*café\.jpg \(it exists with its name in "
                                        r"Unicode NFD, 'cafe\\u0301\.jpg' against 'caf\\xe9\.jpg'"):  # fmt: skip
        read_jsonl(path)


@pytest.mark.parametrize("image", ["", " ", ".", "./", "sub/", "sub/.."])
def test_a_jsonl_image_naming_no_file_is_refused_when_read_naming_the_line_and_field(tmp_path, image):
    """``"image": ""`` or ``"."`` joined to the image root is the folder itself: it was read as a record of image id
    ``""`` (or ``"."``), refused only later as a missing image file, or never with ``check_images=False``."""
    path = _lines(tmp_path / "d.jsonl", {"image": "a.png", "captions": ["ok"]}, {"image": image, "captions": ["x"]})
    for check_images in (True, False):
        with pytest.raises(DataError, match=rf"^{re.escape(str(path))}, line 2: 'image' is "):
            read_jsonl(path, check_images=check_images)


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85"])
def test_a_jsonl_line_split_by_a_unicode_line_separator_names_the_character_and_where(tmp_path, separator):
    """JSON Lines ends a line at ``\\n`` only; U+2028, U+2029 and U+0085 (which editors show as line breaks) between
    two records left one line read as ``Extra data`` and nothing more: the message now names the character and its
    column."""
    first = json.dumps({"image": "a.png", "captions": ["ok"]})
    path = tmp_path / "d.jsonl"
    path.write_text(first + separator + json.dumps({"image": "b.png", "captions": ["x"]}) + "\n", encoding="utf-8")
    with pytest.raises(DataError) as e:
        read_jsonl(path, check_images=False)
    column = len(first) + 1
    assert str(e.value).startswith(f"{path}, line 1: invalid JSON at column {column}: Extra data")
    assert f"U+{ord(separator):04X}" in str(e.value) and f"at column {column} is no line break" in str(e.value)
    # inside a string it is text, as JSON has it (a caption's separator is a space: clean_text)
    path.write_text(json.dumps({"image": "a.png", "captions": [f"a{separator}dog"]}, ensure_ascii=False) + "\n")
    assert read_jsonl(path, check_images=False)[0].captions == ["a dog"]


@pytest.mark.parametrize(
    ("caption", "outcome"),
    [("\ufeffa dog", "a dog"), ("\ufeff a dog", "a dog"), ("a\ufeffdog", "a\ufeffdog"), ("a\u200bdog", "a\u200bdog"),
     ("\u05d0\u200f dog", "\u05d0\u200f dog"), ("a\u202edog", "U+202E"), ("a\u2066dog\u2069", "U+2066"),
     ("a dog\u202a", "U+202A")],
)  # fmt: skip
def test_a_byte_order_mark_starting_a_caption_is_stripped_and_a_bidi_override_refused(tmp_path, caption, outcome):
    """A BOM at the start of a caption is an encoding artifact: stripped (it was kept, a token no reference shares).
    The bidirectional embeddings, overrides and isolates reorder the text shown (``a\\u202edog`` prints ``agod``):
    refused naming the character and its place. Other invisible format characters among visible ones are kept.
    JSONL and COCO (its fast loop) alike."""
    for name, (read, where) in _second_caption_readers(tmp_path, caption, ("jsonl", "coco")).items():
        if outcome.startswith("U+"):
            with pytest.raises(DataError) as e:
                read()
            said = f"holds the bidirectional control {outcome} ("
            assert where in str(e.value) and said in str(e.value) and "at character " in str(e.value), name
        else:
            assert read()[0].captions == ["ok", outcome], name


@pytest.mark.parametrize("name", ["", " ", ".", "./", "sub/", "sub/.."])
def test_a_karpathy_or_coco_file_name_naming_no_file_is_refused_when_read(tmp_path, name):
    """Karpathy's ``filename`` and COCO's ``file_name`` did not go through ``records.require_image`` as JSONL's
    ``image`` does: ``""`` joined to the image root was the folder itself (COCO's ``""`` fell back, undocumented, to
    the image id as its file name; its documented fallback is for an image without ``file_name``, kept below),
    refused only later as a missing image file, or never with ``check_images=False``."""
    karpathy = tmp_path / "dataset_coco.json"
    entries = [{"filename": file, "filepath": "val2014", "cocoid": k, "split": "test", "sentences": [{"raw": "a"}]}
               for k, file in ((1, "a.jpg"), (2, name))]  # fmt: skip
    karpathy.write_text(json.dumps({"images": entries}))
    coco = tmp_path / "captions_val2014.json"
    anns = [{"image_id": 1, "id": 1, "caption": "a"}, {"image_id": 2, "id": 2, "caption": "b"}]
    coco.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.jpg"}, {"id": 2, "file_name": name}],
                                "annotations": anns}))  # fmt: skip
    for check_images in (True, False):
        with pytest.raises(DataError, match=rf"^{re.escape(str(karpathy))}: images\[1\]: 'filename' is "):
            read_karpathy(karpathy, check_images=check_images)
        with pytest.raises(DataError, match=rf"^{re.escape(str(coco))}: images\[1\] \(id 2\): 'file_name' is "):
            read_coco_captions(coco, check_images=check_images)
    coco.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.jpg"}, {"id": 2}], "annotations": anns}))
    assert [r.path for r in read_coco_captions(coco, check_images=False)] == [tmp_path / "a.jpg", tmp_path / "2"]


@pytest.mark.parametrize("asked", ["validation", "Validation", " valid "])
def test_a_split_asked_for_in_the_word_its_records_wrote_reads_them(tmp_path, asked):
    # records writing "validation" are read as val (split_named); `--split validation`, which the warning of a split
    # of its own named before they were, reads them as `--split val` does, as it reads a Hugging Face set's split
    from finecap.data.references import select_split

    path = _lines(
        tmp_path / "data.jsonl",
        *({"image": f"{n}.png", "captions": ["x"], "split": s} for n, s in enumerate(["train", "validation"])),
    )
    records = read_jsonl(path, check_images=False)
    assert [r.image_id for r in select_split(records, asked, path, "jsonl")] == ["1.png"]
    assert select_split(records, asked, path, "jsonl") == select_split(records, "val", path, "jsonl")


def test_a_split_of_its_own_name_is_read_by_that_name_alone(tmp_path):
    # "dev" names no split of finecap's: `--split dev` reads it, and `--split validation` none
    from finecap.data.references import MissingSplit, select_split

    path = _lines(tmp_path / "data.jsonl", {"image": "a.png", "captions": ["x"], "split": "dev"})
    records = read_jsonl(path, check_images=False)
    assert [r.split for r in select_split(records, "dev", path, "jsonl")] == ["dev"]
    with pytest.raises(MissingSplit):
        select_split(records, "validation", path, "jsonl")
