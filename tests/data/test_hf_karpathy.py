"""data.format=hf reading a Hub copy of Karpathy's ``dataset_coco.json`` (``yerevann/coco-karpathy``'s layout): each
image named by two columns, ``filepath`` (``val2014``) and ``filename`` (``COCO_val2014_...jpg``), joined by
``data.hf.image_folder_column`` below the COCO image folder (``data.images``). Built locally: nothing downloads."""

from __future__ import annotations

from pathlib import Path

import pytest

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
from PIL import Image  # noqa: E402

from finecap.config import load  # noqa: E402
from finecap.data.datasets import load_records  # noqa: E402
from finecap.data.formats.hf import read_hf  # noqa: E402
from finecap.data.records import DataError  # noqa: E402
from finecap.data.references import load_references  # noqa: E402
from finecap.train.fingerprint import data_fingerprint  # noqa: E402

# (Hub split file, filepath, cocoid, Karpathy's split column, sentences): Karpathy's train takes train2014 images
# and, as restval, val2014 ones; the Hub's train split holds both
ROWS = [
    ("train", "train2014", 9, "train", ["A plate of food.", "Some broccoli on a plate."]),
    ("train", "val2014", 42, "restval", ["A dog on a couch."]),
    ("validation", "val2014", 391895, "val", ["A man riding a moped.", "A man on a scooter.", "A dirt road."]),
    ("test", "val2014", 73, "test", ["A motorcycle parked by a wall."]),
]

KARPATHY = {"image_column": "filename", "image_folder_column": "filepath", "caption_column": "sentences",
            "id_column": "cocoid"}  # fmt: skip


def _write_hub_copy(tmp_path: Path, rows=ROWS) -> tuple[Path, Path]:
    """``hub/data/<split>-00000-of-00001.parquet`` in the Hub layout (every column of ``yerevann/coco-karpathy``)
    and the COCO image folder ``coco/`` (``train2014/``, ``val2014/``) holding each row's JPEG."""
    coco, hub = tmp_path / "coco", tmp_path / "hub" / "data"
    hub.mkdir(parents=True)
    by_split: dict[str, list[dict]] = {}
    for k, (hub_split, filepath, cocoid, split, sentences) in enumerate(rows):
        filename = f"COCO_{filepath}_{cocoid:012d}.jpg"
        (coco / filepath).mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (4, 4), (k * 40, 0, 0)).save(coco / filepath / filename)
        by_split.setdefault(hub_split, []).append({
            "filepath": filepath, "sentids": [10 * cocoid + j for j in range(len(sentences))], "filename": filename,
            "imgid": k, "split": split, "sentences": sentences, "cocoid": cocoid,
            "url": f"http://images.cocodataset.org/{filepath}/{filename}",
        })  # fmt: skip
    for hub_split, cells in by_split.items():
        pq.write_table(pa.Table.from_pylist(cells), hub / f"{hub_split}-00000-of-00001.parquet")
    return hub.parent, coco


def _expected(hub: Path, coco: Path, split_of) -> dict:
    """The records the files hold, read with pyarrow alone: ``{cocoid: (image path, split, sentences)}``, the image
    at ``coco/<filepath>/<filename>`` as Karpathy's own layout reads it; ``split_of(hub split, split column)``."""
    out = {}
    for file in sorted((hub / "data").glob("*.parquet")):
        hub_split = file.name.split("-")[0]
        for row in pq.read_table(file).to_pylist():
            out[row["cocoid"]] = (coco / row["filepath"] / row["filename"], split_of(hub_split, row["split"]),
                                  row["sentences"])  # fmt: skip
    return out


def test_karpathys_two_image_columns_are_joined_below_the_coco_folder(tmp_path):
    hub, coco = _write_hub_copy(tmp_path)
    records = read_hf(hub, coco, split_column="split", cache_dir=tmp_path / "cache", **KARPATHY)
    got = {r.image_id: (r.path, r.split, r.captions) for r in records}
    assert got == _expected(hub, coco, lambda hub_split, written: written)  # restval kept, as karpathy keeps it
    assert len(records) == len(ROWS) and not any(r.embedded for r in records)
    assert got[42][0] == coco / "val2014" / "COCO_val2014_000000000042.jpg"
    # the Hub's named splits instead of the column: validation is val, the restval image is in train
    named = {r.image_id: (r.path, r.split, r.captions) for r in read_hf(hub, coco, cache_dir=tmp_path / "c",
                                                                           **KARPATHY)}  # fmt: skip
    assert named == _expected(hub, coco, lambda hub_split, written: {"validation": "val"}.get(hub_split, hub_split))


def test_the_configuration_route_trains_on_restval_and_scores_test(tmp_path):
    hub, coco = _write_hub_copy(tmp_path)
    cfg = load(None, ["data.format=hf", f"data.path={hub}", f"data.images={coco}", f"run.cache_dir={tmp_path / 'c'}",
                      *(f"data.hf.{k}={v}" for k, v in KARPATHY.items()), "data.hf.split_column=split"])  # fmt: skip
    train = load_records(cfg, "train")
    assert sorted((r.image_id, r.split) for r in train) == [(9, "train"), (42, "restval")]
    assert [r.image_id for r in load_records(cfg, "val")] == [391895]
    assert load_references(cfg, split="test").captions() == {73: ["A motorcycle parked by a wall."]}
    # the option is part of the data's fingerprint when set, and absent when not (runs recorded before it match)
    options = data_fingerprint(cfg)["options"]
    assert options["image_folder_column"] == "filepath" and options["image_column"] == "filename"
    plain = load(None, ["data.format=hf", f"data.path={hub}", f"run.cache_dir={tmp_path / 'c'}"])
    assert "image_folder_column" not in data_fingerprint(plain)["options"]


def test_the_hub_name_reads_below_data_images_and_without_it_names_the_option(tmp_path, monkeypatch):
    """``data.path=yerevann/coco-karpathy``: ``datasets.load_dataset`` answers with the local files' tables (from
    memory: no network, no cache written), split by split as the Hub's; a Hub name has no folder to read
    ``filepath/filename`` against but ``data.images``."""
    hub, coco = _write_hub_copy(tmp_path)
    tables = {f.name.split("-")[0]: pq.read_table(f) for f in sorted((hub / "data").glob("*.parquet"))}
    asked = []

    def from_the_hub(name, *args, **kwargs):
        asked.append(name)
        return datasets.DatasetDict({k: datasets.Dataset(datasets.table.InMemoryTable(t)) for k, t in tables.items()})

    monkeypatch.setattr(datasets, "load_dataset", from_the_hub)
    records = read_hf("yerevann/coco-karpathy", coco, split_column="split", **KARPATHY)
    assert asked == ["yerevann/coco-karpathy"]
    got = {r.image_id: (r.path, r.split, r.captions) for r in records}
    assert got == _expected(hub, coco, lambda hub_split, written: written)
    first = r"yerevann/coco-karpathy: split 'test', row 0: image path 'val2014/COCO_val2014_000000000073\.jpg'"
    with pytest.raises(DataError, match=first + r" resolves to .*, outside the data set's image folder .*: set "
                                             r"data\.images to the folder holding the images"):  # fmt: skip
        read_hf("yerevann/coco-karpathy", split_column="split", **KARPATHY)


def _one_file(tmp_path: Path, columns: dict) -> Path:
    """``tmp_path/test.parquet`` holding ``columns`` (a lone file: its rows are the test split)."""
    pq.write_table(pa.table(columns), tmp_path / "test.parquet")
    return tmp_path / "test.parquet"


def test_a_folder_leading_out_of_the_image_folder_is_refused_as_any_image_path_is(tmp_path):
    (tmp_path / "coco").mkdir()
    (tmp_path / "secret").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "secret" / "a.jpg")
    data = _one_file(tmp_path, {"filepath": ["../secret"], "filename": ["a.jpg"], "sentences": [["A cat."]]})
    options = {**KARPATHY, "id_column": "", "cache_dir": tmp_path / "cache"}
    with pytest.raises(DataError) as caught:
        read_hf(data, tmp_path / "coco", **options)
    assert str(caught.value).startswith(
        f"{data}: split 'test', row 0: image path '../secret/a.jpg' resolves to {tmp_path / 'secret' / 'a.jpg'}, "
        f"outside the data set's image folder {tmp_path / 'coco'}; refused"
    )
    read = read_hf(data, tmp_path / "coco", allow_outside=True, **options)  # data.allow_outside_paths=true
    assert [r.path for r in read] == [tmp_path / "coco" / "../secret" / "a.jpg"]


def test_rows_the_folder_column_cannot_place_are_named(tmp_path):
    Image.new("RGB", (4, 4)).save(tmp_path / "a.jpg")
    options = {"image_column": "filename", "image_folder_column": "filepath", "caption_column": "sentences",
               "cache_dir": tmp_path / "cache"}  # fmt: skip
    data = _one_file(tmp_path, {"filepath": ["", None], "filename": ["a.jpg", "a.jpg"], "sentences": [["A."], ["B."]]})
    with pytest.raises(DataError, match=r"split 'test', row 1: the folder column 'filepath' \(data.hf."
                                        r"image_folder_column\) must be a string, got NoneType"):  # fmt: skip
        read_hf(data, **options)
    data = _one_file(tmp_path, {"filename": ["a.jpg"], "sentences": [["A."]]})
    with pytest.raises(DataError, match=r"no column 'filepath' \(data.hf.image_folder_column\); columns: filename"):
        read_hf(data, **options)
    embedded = [{"bytes": (tmp_path / "a.jpg").read_bytes(), "path": "a.jpg"}]
    data = _one_file(tmp_path, {"image": embedded, "filepath": ["val2014"], "sentences": [["A."]]})
    with pytest.raises(DataError, match=r"row 0: the image is embedded \(bytes\), and "
                                        r"data.hf.image_folder_column='filepath' joins a folder"):  # fmt: skip
        read_hf(data, **{**options, "image_column": "image"})
    # an empty folder is the file name alone, as Karpathy's Flickr30k (no filepath) is read
    data = _one_file(tmp_path, {"filepath": [""], "filename": ["a.jpg"], "sentences": [["A."]]})
    assert [r.path for r in read_hf(data, **options)] == [tmp_path / "a.jpg"]
