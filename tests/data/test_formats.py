import contextlib
import io
import json
from pathlib import Path

import pytest
from pycocotools import coco as pycocotools_coco

from finecap.data.bags_file import read_bags
from finecap.data.formats import read_dataset
from finecap.data.formats.coco import read_coco_captions
from finecap.data.formats.jsonl import read_jsonl
from finecap.data.formats.karpathy import read_karpathy
from finecap.data.records import NO_SPLIT, DataError, Record
from finecap.data.results import read_results, write_results
from finecap.utils import write_json


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
        ('["a.png"]', r"line 2: expected an object, got list"),
    ],
)
def test_jsonl_errors(tmp_path, text, message):
    path = tmp_path / "data.jsonl"
    path.write_text('{"image": "a.png", "captions": ["ok"]}\n' + text + "\n")
    with pytest.raises(DataError, match=message) as e:
        read_jsonl(path, check_images=False)
    assert str(path) in str(e.value)


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
