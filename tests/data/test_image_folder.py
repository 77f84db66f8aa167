"""Your own images (issue 34, the data side): the ``folder`` format, records without a split, bad images named or
skipped.

- A folder of images (recursive, common extensions, hidden files skipped) with captions in ``captions.jsonl``,
  ``captions.csv``, per-image ``.txt`` files, or none; image ids are the relative paths; images without captions are
  read (for captioning) and refused, counted, by training and evaluation.
- Records naming no split (a folder's images, JSONL lines without ``"split"``) are split by
  ``data.val_fraction`` / ``data.test_fraction`` by image-id hash: deterministic, and adding an image moves no other;
  without the fractions all are train, and an empty split's error says what to add.
- ``data.skip_bad_images``: a corrupt and an empty image are left out and counted (log line, the run's summary);
  without it the first is a one-line error naming the file, also from a DataLoader worker.
- A test trains 2 steps (and captions) from an image folder without split keys.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import pytest
from PIL import Image

from finecap.config import ConfigError, load
from finecap.data.datasets import CaptionDataset, load_records, skipped_images
from finecap.data.formats import detect_format
from finecap.data.formats.folder import read_folder
from finecap.data.formats.jsonl import read_jsonl
from finecap.data.images import find_bad_images, load_record_image
from finecap.data.records import NO_SPLIT, DataError
from finecap.data.references import load_references, missing_images
from finecap.data.splits import assign_splits, split_value
from finecap.errors import explain
from finecap.train.fingerprint import data_fingerprint
from helpers.cli import run_cli

COLOURS = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (200, 200, 30), (30, 200, 200), (200, 30, 200)]

DATA_DOCS = Path(__file__).resolve().parents[2] / "docs" / "data.md"


def image(path: Path, k: int = 0, fmt: str | None = None, size: tuple[int, int] = (32, 32)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, COLOURS[k % len(COLOURS)]).save(path, format=fmt)
    return path


def images(folder: Path, names: list[str]) -> Path:
    for k, name in enumerate(names):
        image(folder / name, k, fmt="PNG" if name.lower().endswith(".png") else None)
    return folder


def corrupt(path: Path) -> Path:
    image(path, size=(64, 64), fmt="PNG")
    data = bytearray(path.read_bytes())
    data[60:80] = b"\x00" * 20  # inside the compressed pixels
    path.write_bytes(bytes(data))
    return path


def folder_cfg(folder: Path, *overrides: str):
    return load(None, ["data.format=folder", f"data.path={folder}", *overrides])


# --------------------------------------------------------------------------------------------------------------------
# The folder format: layouts
# --------------------------------------------------------------------------------------------------------------------


NAMES = ["cats/1.jpg", "cats/2.JPEG", "dogs/3.png", "4.webp"]


def _jsonl(folder: Path) -> None:
    lines = [{"image": "cats/1.jpg", "captions": ["a red cat", "a cat"], "split": "val"},
             {"image": "./dogs/3.png", "captions": ["a blue dog"]},
             {"image": "4.webp", "captions": []}]  # fmt: skip
    (folder / "captions.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")


def _csv(folder: Path) -> None:
    (folder / "captions.csv").write_text(
        "image,caption,split\ncats/1.jpg,a red cat,val\ncats/1.jpg,a cat,val\ndogs/3.png,a blue dog,\n4.webp,,\n",
        encoding="utf-8-sig",  # a byte-order mark, as spreadsheets write
    )


def _txt(folder: Path) -> None:
    (folder / "cats/1.txt").write_text("a red cat\n\na cat\n")
    (folder / "dogs/3.txt").write_text("a blue dog\n")
    (folder / "4.txt").write_text("")


LAYOUTS = {
    "jsonl": (_jsonl, {"cats/1.jpg": (["a red cat", "a cat"], "val"), "dogs/3.png": (["a blue dog"], NO_SPLIT)}),
    "csv": (_csv, {"cats/1.jpg": (["a red cat", "a cat"], "val"), "dogs/3.png": (["a blue dog"], NO_SPLIT)}),
    "txt": (_txt, {"cats/1.jpg": (["a red cat", "a cat"], NO_SPLIT), "dogs/3.png": (["a blue dog"], NO_SPLIT)}),
    "none": (lambda folder: None, {}),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_each_layout_is_read(tmp_path, layout):
    folder = images(tmp_path / "photos", NAMES)
    image(folder / ".hidden.jpg")  # hidden files and folders are not images of the data set
    image(folder / ".cache" / "5.jpg")
    image(folder / "__MACOSX" / "._1.jpg")
    (folder / "notes.md").write_text("not an image")
    write, expected = LAYOUTS[layout]
    write(folder)
    records = read_folder(folder)
    assert [r.image_id for r in records] == ["4.webp", "cats/1.jpg", "cats/2.JPEG", "dogs/3.png"]  # relative paths
    assert [r.path for r in records] == [folder / r.image_id for r in records]
    got = {r.image_id: (r.captions, r.split) for r in records}
    assert got == {i: expected.get(i, ([], NO_SPLIT)) for i in got}  # images without captions are read
    assert detect_format(folder) == ("folder", folder)
    assert load_references(load(None), folder).format == "folder"


def test_every_common_extension_in_any_case(tmp_path):
    names = ["a.jpg", "b.JPEG", "c.png", "d.webp", "e.bmp", "f.gif", "g.tif", "h.TIFF"]
    folder = images(tmp_path / "f", names)
    assert [r.image_id for r in read_folder(folder)] == names
    assert all(load_record_image(r).mode == "RGB" for r in read_folder(folder))


def test_every_format_finecap_decodes_is_an_image_of_a_folder(tmp_path):
    # a .jfif (a JPEG, as browsers save one), .avif, .jp2... decoded when named alone, but a folder left them out
    names = ["a.jfif", "b.jpe", "c.AVIF", "d.jp2", "e.j2k", "f.tga", "g.ppm", "h.pgm", "i.pbm", "j.pnm"]
    folder = images(tmp_path / "f", names)
    assert [r.image_id for r in read_folder(folder)] == names
    assert all(load_record_image(r).size == (32, 32) for r in read_folder(folder))


def test_images_in_formats_finecap_does_not_decode_are_named_in_a_warning(tmp_path, caplog):
    # an iPhone's HEIC photos beside JPEGs were left out of the folder silently
    folder = images(tmp_path / "f", ["a.jpg"])
    for name in ["IMG_1.HEIC", "raw/IMG_2.dng", ".hidden.heic", "notes.txt"]:
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_bytes(b"not decoded")
    caplog.set_level(logging.WARNING, logger="finecap")
    assert [r.image_id for r in read_folder(folder)] == ["a.jpg"]
    said = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert said == [f"{folder}: 2 image file(s) left out, in a format finecap does not decode (.dng .heic): "
                    "IMG_1.HEIC, raw/IMG_2.dng; convert them to JPEG or PNG to use them"]  # fmt: skip


def test_folders_that_are_not_image_folders(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.txt").write_text("x")
    with pytest.raises(
        FileNotFoundError, match=r"neither a world \(dataset.json\), a Hugging Face data set, nor image"
    ):
        detect_format(tmp_path / "empty")
    with pytest.raises(
        DataError, match=r"empty: no image files in this folder or below it \(file names ending in .jpg"
    ):
        read_folder(tmp_path / "empty")
    with pytest.raises(DataError, match=r"nope: no such folder \(data.format=folder reads a folder of images\)"):
        read_folder(tmp_path / "nope")


def test_a_data_file_given_as_a_folder_names_the_format_it_reads_as(tmp_path):
    # own/mle's data.format=folder on a captions.jsonl said "a file, not a folder" without the way out
    lines = tmp_path / "captions.jsonl"
    lines.write_text(json.dumps({"image": "a.jpg", "captions": ["a cat"]}) + "\n")
    with pytest.raises(DataError, match=r"captions.jsonl: a file, not a folder \(data.format=folder reads a folder of "
                                        r"images\); it reads as data.format=jsonl: pass that$"):  # fmt: skip
        read_folder(lines)
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "<image>"}], "images": ["a.jpg"]}) + "\n")
    with pytest.raises(DataError, match=r"it reads as data.format=messages: pass that$"):
        read_folder(chat)
    notes = tmp_path / "notes.txt"
    notes.write_text("not a data set")  # no format reads it: nothing suggested
    with pytest.raises(DataError, match=r"notes.txt: a file, not a folder \(data.format=folder reads a folder of "
                                        r"images\)$"):  # fmt: skip
        read_folder(notes)


def test_linked_folders_are_read_once_and_loops_end(tmp_path):
    folder = images(tmp_path / "f", ["a/1.png"])
    os.symlink(folder / "a", folder / "b")  # the same images twice
    os.symlink(folder, folder / "a" / "up")  # a loop
    assert [r.image_id for r in read_folder(folder)] == ["a/1.png"]


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (
            lambda f: ((f / "captions.jsonl").write_text(""), (f / "captions.csv").write_text("image,caption\n")),
            r"holds both captions.jsonl and captions.csv; keep one",
        ),
        (
            lambda f: ((f / "captions.csv").write_text("image,caption\n"), (f / "a.txt").write_text("x")),
            r"captions in both captions.csv and per-image .txt files \(e.g. a.txt\); keep one",
        ),
        (
            lambda f: (f / "captions.jsonl").write_text('{"image": "a.png", "captions": ["x"], "id": 7}\n'),
            r"captions.jsonl, line 1: 'id' is not read here: a folder's image ids are the images' relative paths",
        ),
        (
            lambda f: (f / "captions.jsonl").write_text('{"image": "a.png", "captions": ["x"]}\n' * 2),
            r"line 2: image 'a.png' is listed again \(first at .*line 1\)",
        ),
        (
            lambda f: (f / "captions.jsonl").write_text('{"image": "a.png", "captions": [""]}\n'),
            r"line 1: caption 0 is empty",
        ),
        (
            lambda f: (f / "captions.jsonl").write_text(json.dumps({"image": str(f / "a.png"), "captions": ["x"]})),
            r"line 1: image '.*a.png' must be a path relative to the folder",
        ),
        (
            lambda f: (f / "captions.csv").write_text("file,text\na.png,x\n"),
            r"captions.csv: no column 'image' or 'caption' in the header \(columns: 'file', 'text'\)",
        ),
        (
            lambda f: (f / "captions.csv").write_text("image,caption,split\na.png,x,train\na.png,y,test\n"),
            r"captions.csv, line 3: image 'a.png' has split 'test' here but 'train' at .*line 2; give each image one",
        ),
        (
            lambda f: (f / "captions.csv").write_bytes(b"image,caption\na.png,\xff\xfe\n"),
            r"captions.csv: not a UTF-8 text file",
        ),
        (  # an unquoted comma: the caption was cut to "a dog" (or its second half read as the split), silently
            lambda f: (f / "captions.csv").write_text(
                'image,caption,split\na.png,"a cat, asleep",val\na.png,a dog, running on a beach,train\n'
            ),
            r"captions.csv, line 3: 4 cells for the header's 3 \(image, caption, split\); quote a caption holding a "
            r'comma: "a dog, running on a beach"',
        ),
        (  # a column named twice: the cells of one of them were dropped ("a cat" read, "a red cat" lost), silently
            lambda f: (f / "captions.csv").write_text("image,caption,caption\na.png,a red cat,a cat\n"),
            r"captions.csv: column 'caption' is named 2 times in the header \(columns: 'image', 'caption', "
            r"'caption'\); a row's cells under it would be read from one of them",
        ),
        (
            lambda f: (image(f / "a.jpg"), (f / "a.txt").write_text("x")),
            r"a.txt: the captions of several images \(a.jpg, a.png\)",
        ),
        (
            lambda f: (f / "captions.jsonl").write_text('{"image": "gone.png", "captions": ["x"]}\n'),
            r"captions.jsonl: 1 of 2 images are not image files in the folder .*f \(gone.png\); image paths are rel",
        ),
        (
            lambda f: (f / "captions.jsonl").write_text('{"image": "../secret.png", "captions": ["x"]}\n'),
            r"line 1: image path '../secret.png' resolves to .*outside the data set's image folder",
        ),
    ],
)
def test_caption_file_errors_name_the_file_and_what_to_do(tmp_path, write, message):
    folder = images(tmp_path / "f", ["a.png"])
    image(tmp_path / "secret.png")
    write(folder)
    with pytest.raises(DataError, match=message):
        read_folder(folder)


def test_a_sidecar_naming_an_image_in_another_unicode_normalisation_is_said_so(tmp_path):
    """A folder copied from macOS keeps its NFD file names ('cafe' + U+0301); a captions file typed on Linux names
    the image in NFC: the error said only that the image is not in the folder, though ``ls`` shows a file that prints
    as its name. It gives the hint the other formats give (finecap.data.records.other_normalisation)."""
    import unicodedata

    folder = images(tmp_path / "f", [unicodedata.normalize("NFD", "café.png")])
    (folder / "captions.jsonl").write_text(json.dumps({"image": "café.png", "captions": ["x"]}, ensure_ascii=False)
                                           + "\n", encoding="utf-8")  # fmt: skip
    with pytest.raises(DataError) as e:
        read_folder(folder)
    assert str(e.value) == (
        f"{folder / 'captions.jsonl'}: 1 of 2 images are not image files in the folder {folder} (café.png (it exists "
        r"with its name in Unicode NFD, 'cafe\u0301.png' against 'caf\xe9.png' here: write the name as the file "
        "system has it, or rename the file)); image paths are relative to the folder"
    )


def test_images_are_checked_against_the_folder(tmp_path):
    folder = images(tmp_path / "f", ["a.png"])
    outside = image(tmp_path / "secret.png")
    os.symlink(outside, folder / "b.png")  # a link leading out of the folder
    with pytest.raises(DataError, match=r"f: b.png: image path 'b.png' resolves to .*secret.png, outside .*"
                                         r"data.allow_outside_paths=true"):  # fmt: skip
        read_folder(folder)
    assert [r.image_id for r in read_folder(folder, allow_outside=True)] == ["a.png", "b.png"]
    with pytest.raises(DataError, match=r"data.images \(or --images\) must be empty or the folder itself"):
        read_folder(folder, images=tmp_path)
    assert len(read_folder(folder, images=folder, allow_outside=True)) == 2


def test_an_image_name_that_is_not_utf8_is_named_not_a_crash(tmp_path):
    # os.walk gives b"caf\xe9.png" (Latin-1) as "caf\udce9.png": hashing its id for a split, fingerprinting the folder
    # or writing its id as JSON text failed on it with "f: not UTF-8 text", naming the folder, not the file
    folder = images(tmp_path / "f", ["a.png", "sub/b.png"])
    image(Path(os.fsdecode(bytes(folder / "sub") + b"/caf\xe9.png")))
    expected = f"{folder}/sub/caf\\xe9.png: the file name is not UTF-8 (its image id could not be written as JSON "
    expected += "text)"
    for read in (lambda: read_folder(folder), lambda: load_records(folder_cfg(folder), "train", captioned=False)):
        with pytest.raises(DataError) as e:
            read()
        assert str(e.value) == f"{expected}: rename it"


def test_images_without_captions_are_for_captioning_only(tmp_path):
    folder = images(tmp_path / "f", [f"{k}.png" for k in range(7)])
    (folder / "captions.csv").write_text("image,caption\n0.png,a red square\n")
    cfg = folder_cfg(folder)
    with pytest.raises(DataError) as e:
        load_records(cfg, "train")
    message = str(e.value)
    assert "6 of 7 images of split 'train' have no caption (1.png, 2.png, 3.png, 4.png, 5.png, ...)" in message
    assert "add a captions.jsonl or captions.csv row, or a .txt file next to each image" in message
    assert len(load_records(cfg, "train", captioned=False)) == 7  # captioning reads them
    predictions = tmp_path / "results.json"
    predictions.write_text(json.dumps([{"image_id": "0.png", "caption": "a square"}]))
    eval_argv = ["eval", "--predictions", str(predictions), "--references", str(folder), "--metrics", "bleu"]
    assert run_cli(eval_argv)[0] == 0  # the predicted image has references
    predictions.write_text(json.dumps([{"image_id": f"{k}.png", "caption": "a square"} for k in range(3)]))
    code, _, err = run_cli(eval_argv)
    assert code == 2 and "finecap: error: " in err and "2 of 3 images of the predictions have no caption" in err


# --------------------------------------------------------------------------------------------------------------------
# Records without a split
# --------------------------------------------------------------------------------------------------------------------


def test_split_by_id_hash_is_deterministic_and_stable_when_images_are_added(tmp_path, caplog):
    folder = images(tmp_path / "f", [f"img{k:03d}.png" for k in range(60)])
    cfg = folder_cfg(folder, "data.val_fraction=0.2", "data.test_fraction=0.1")
    with caplog.at_level(logging.INFO, logger="finecap"):
        first = {s: [r.image_id for r in load_records(cfg, s, captioned=False)] for s in ("train", "val", "test")}
    assert sorted(sum(first.values(), [])) == [f"img{k:03d}.png" for k in range(60)]  # each image in one split
    counts = {s: len(ids) for s, ids in first.items()}
    assert 0 < counts["test"] < counts["val"] < counts["train"]
    said = [r.getMessage() for r in caplog.records if "name no split" in r.getMessage()]
    assert said == [f"data: all 60 images of {folder} name no split; by image-id hash (data.val_fraction=0.2, "
                    f"data.test_fraction=0.1, data.split_seed=0): {counts['train']} train, {counts['val']} val, "
                    f"{counts['test']} test"]  # once, however often the data set is read  # fmt: skip
    for uid in first["test"]:
        assert split_value(uid, 0) < 0.1
    images(folder, [f"new{k}.png" for k in range(20)])  # more images: none of the others moves
    again = {s: [r.image_id for r in load_records(cfg, s, captioned=False)] for s in ("train", "val", "test")}
    for split, ids in first.items():
        assert [i for i in again[split] if not i.startswith("new")] == ids
    reseeded = folder_cfg(folder, "data.val_fraction=0.2", "data.test_fraction=0.1", "data.split_seed=1")
    assert [r.image_id for r in load_records(reseeded, "val", captioned=False)] != again["val"]
    everything = [r.image_id for r in load_records(folder_cfg(folder), "train", captioned=False)]
    assert len(everything) == 80  # no fractions: all train


def test_sidecar_splits_are_kept_and_only_the_rest_is_split(tmp_path):
    folder = images(tmp_path / "f", [f"{k}.png" for k in range(10)])
    rows = "".join(f"{k}.png,caption {k},{'test' if k < 2 else ''}\n" for k in range(10))
    (folder / "captions.csv").write_text("image,caption,split\n" + rows)
    cfg = folder_cfg(folder, "data.val_fraction=0.3")
    assert [r.image_id for r in load_records(cfg, "test")] == ["0.png", "1.png"]
    val = [r.image_id for r in load_records(cfg, "val")]
    train = [r.image_id for r in load_records(cfg, "train")]
    assert sorted(val + train) == [f"{k}.png" for k in range(2, 10)] and val and train


def test_a_tiny_data_set_still_gets_a_split_it_asks_for():
    from finecap.data.records import Record

    records = [Record(f"{k}.png", Path(f"{k}.png"), NO_SPLIT) for k in range(3)]
    values = sorted((split_value(r.image_id), r.image_id) for r in records)
    split = assign_splits(records, val_fraction=0.01)  # hashing alone would most likely put none in val
    assert [r.image_id for r in split if r.split == "val"] == [values[0][1]]
    assert assign_splits(records, val_fraction=0.01) == split
    assert {r.split for r in assign_splits(records)} == {"train"}


def test_a_tiny_data_set_hashed_wholly_out_of_train_keeps_one_training_image():
    """2 images with data.val_fraction=0.5 whose ids both hash below 0.5 all went to val: training stopped ("no
    records in split 'train'"), where the same data set hashed otherwise trains; the val image of highest u moves."""
    from finecap.data.records import Record

    names = [n for n in (f"{k}.png" for k in range(100)) if split_value(n) < 0.5][:3]
    records = [Record(n, Path(n), NO_SPLIT) for n in names[:2]]
    split = assign_splits(records, val_fraction=0.5)
    highest = max(names[:2], key=split_value)
    assert {r.image_id: r.split for r in split} == {n: "train" if n == highest else "val" for n in names[:2]}
    assert {r.split for r in assign_splits(records[:1], val_fraction=0.5)} == {"val"}  # one image: nothing to move
    named = [Record("t.png", Path("t.png"), "train"), *records]  # a named training image: hashing is left alone
    assert [r.split for r in assign_splits(named, val_fraction=0.5)] == ["train", "val", "val"]
    assert {r.split for r in assign_splits(records, test_fraction=0.5, val_fraction=0.5)} == {"test"}  # no share


def test_jsonl_without_split_keys_says_what_to_add(tmp_path):
    images(tmp_path, ["a.png", "b.png", "c.png"])
    data = tmp_path / "captions.jsonl"
    lines = [json.dumps({"image": n, "captions": ["a square"]}) for n in ("a.png", "b.png", "c.png")]
    data.write_text("\n".join(lines) + "\n")
    assert [r.split for r in read_jsonl(data)] == [NO_SPLIT] * 3
    cfg = load(None, ["data.format=jsonl", f"data.path={data}"])
    assert len(load_records(cfg, "train")) == 3  # no split named: all train
    with pytest.raises(ValueError) as e:
        load_records(cfg, "val")
    message = str(e.value)
    assert message.startswith(f"{data}: no records in split 'val'; splits present: train; 3 of 3 images name no split")
    assert "set data.val_fraction (e.g. data.val_fraction=0.1) to hold out a share by image-id hash" in message
    assert 'a "split" key on each line ("train", "val" or "test")' in message
    # a JSONL naming only test images (the first run): what to add for training
    data.write_text("".join(json.dumps({"image": n, "captions": ["x"], "split": "test"}) + "\n" for n in ("a.png",)))
    with pytest.raises(ValueError, match=r"no records in split 'train'; splits present: test; give some records split "
                                         r"'train' \(a \"split\" key on each line"):  # fmt: skip
        load_records(cfg, "train")
    # finecap eval on references without split keys: the error says the same
    data.write_text(json.dumps({"image": "a.png", "captions": ["x"]}) + "\n")
    with pytest.raises(ValueError, match=r"no records in split 'test'; .*set data.test_fraction"):
        load_references(load(None), data, split="test")
    # one image held out by data.val_fraction (a.png hashes to 0.64): training finds none, and the advice named no
    # fraction
    assert split_value("a.png") < 0.7
    held = load(None, ["data.format=jsonl", f"data.path={data}", "data.val_fraction=0.7"])
    advice = r"1 of 1 images name no split \(now 1 val\): lower data.val_fraction / data.test_fraction"
    with pytest.raises(ValueError, match=rf"no records in split 'train'; splits present: val; {advice}"):
        load_records(held, "train")


def test_the_missing_images_hint_names_the_image_root(tmp_path):
    data = tmp_path / "captions.jsonl"
    data.write_text(json.dumps({"image": "gone.png", "captions": ["x"]}) + "\n")
    with pytest.raises(DataError, match=r"image root .*; set the image folder with data.images=DIR, or --images DIR"):
        read_jsonl(data)
    records = read_jsonl(data, check_images=False)
    reason = missing_images(records, data, fmt="jsonl")
    assert reason.startswith("1 of 1 image files do not exist") and "file_name" not in reason
    assert "without 'file_name'" in missing_images(records, data, fmt="coco")  # COCO's id-only images: said so


def test_split_options_are_checked():
    with pytest.raises(ConfigError, match=r"data.val_fraction: must be in \[0, 1\), got 1.0"):
        load(None, ["data.val_fraction=1"])
    with pytest.raises(ConfigError, match=r"data.val_fraction/data.test_fraction: their sum must be < 1"):
        load(None, ["data.val_fraction=0.5", "data.test_fraction=0.5"])


def test_the_fingerprint_follows_the_folder(tmp_path):
    folder = images(tmp_path / "f", ["a.png", "b/c.png"])
    cfg = folder_cfg(folder)
    first = data_fingerprint(cfg)
    assert first["kind"] == "folder" and data_fingerprint(cfg) == first
    (folder / "a.txt").write_text("a red square\n")
    captioned = data_fingerprint(cfg)
    assert captioned["id"] != first["id"]
    image(folder / "d.png")
    assert data_fingerprint(cfg)["id"] != captioned["id"]
    assert data_fingerprint(folder_cfg(folder, "data.val_fraction=0.2"))["split_fractions"] == {
        "val": 0.2, "test": 0.0, "seed": 0}  # fmt: skip


# --------------------------------------------------------------------------------------------------------------------
# Bad images
# --------------------------------------------------------------------------------------------------------------------


def odd_but_valid(folder: Path) -> None:
    """Images that load as RGB (kept, never skipped): CMYK, 16-bit grey, palette, alpha."""
    Image.new("CMYK", (16, 16), (0, 255, 255, 0)).save(folder / "cmyk.jpg")
    Image.new("I;16", (16, 16), 40000).save(folder / "grey16.png")
    Image.new("RGB", (16, 16), (200, 30, 30)).convert("P").save(folder / "palette.png")
    Image.new("RGBA", (16, 16), (200, 30, 30, 0)).save(folder / "alpha.png")


def test_skip_bad_images_leaves_out_and_counts_a_corrupt_and_an_empty_image(tmp_path, caplog):
    folder = images(tmp_path / "f", [f"{k}.png" for k in range(4)])
    odd_but_valid(folder)
    corrupt(folder / "corrupt.png")
    (folder / "empty.jpg").write_bytes(b"")
    kept = load_records(folder_cfg(folder), "train", captioned=False)
    assert len(kept) == 10  # without the option: everything, and the first use names the file
    with pytest.raises(DataError, match=rf"^{folder / 'corrupt.png'}: damaged image"):
        load_record_image(next(r for r in kept if r.image_id == "corrupt.png"))
    cfg = folder_cfg(folder, "data.skip_bad_images=true")
    with caplog.at_level(logging.WARNING, logger="finecap"):
        records = load_records(cfg, "train", captioned=False)
        load_records(cfg, "train", captioned=False)
    assert sorted(r.image_id for r in records) == sorted(
        ["0.png", "1.png", "2.png", "3.png", "alpha.png", "cmyk.jpg", "grey16.png", "palette.png"]
    )
    said = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("data: skipped 2 of 10 images of split 'train' (data.skip_bad_images")
    assert f"{folder / 'corrupt.png'}: damaged image" in said[0]
    assert f"{folder / 'empty.jpg'}: not an image: the file is empty (0 bytes)" in said[0]
    assert [r.image_id for r, _ in skipped_images(cfg, "train", captioned=False)] == ["corrupt.png", "empty.jpg"]
    assert skipped_images(folder_cfg(folder), "train", captioned=False) == []  # the option off: nothing left out
    assert [r.image_id for r, _ in find_bad_images(kept, workers=1)] == ["corrupt.png", "empty.jpg"]


def test_skipped_images_are_said_once_per_launch_not_once_per_process(tmp_path, caplog, monkeypatch):
    # every process of `accelerate launch` reads the data and skips the same images: the warning came once per
    # process (twice under 2 processes, beside one summary); rank 0 alone says it, and every rank skips alike
    folder = images(tmp_path / "f", ["0.png", "1.png"])
    corrupt(folder / "corrupt.png")
    cfg = folder_cfg(folder, "data.skip_bad_images=true")
    with caplog.at_level(logging.WARNING, logger="finecap"):
        monkeypatch.setenv("RANK", "1")
        other = load_records(cfg, "train", captioned=False)
        assert not [r for r in caplog.records if "skipped" in r.getMessage()]
        monkeypatch.setenv("RANK", "0")
        first = load_records(cfg, "train", captioned=False)
    said = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("data: skipped 1 of 3 images of split 'train'")
    assert [r.image_id for r in other] == [r.image_id for r in first] == ["0.png", "1.png"]


def test_one_bad_image_under_two_records_is_named_for_each(tmp_path):
    from types import SimpleNamespace

    # the same damaged bytes in two rows of a data set, and one damaged file behind two paths (a link)
    rows = [SimpleNamespace(image_id=k, path=f"data.parquet#{k}", image_bytes=b"not an image") for k in ("a", "b")]
    folder = images(tmp_path / "f", ["0.png"])
    corrupt(folder / "0.png")
    (folder / "link.png").symlink_to(folder / "0.png")
    files = [SimpleNamespace(image_id=p.name, path=str(p)) for p in (folder / "0.png", folder / "link.png")]
    for records in (rows, files):
        reasons = [reason for _, reason in find_bad_images(records, workers=1)]
        assert len(reasons) == 2
        for record, reason in zip(records, reasons, strict=True):
            assert str(record.path) in reason, reason  # each names its own record, not the first one read


@pytest.mark.slow
def test_a_bad_image_in_a_dataloader_worker_is_one_line(tmp_path):
    from torch.utils.data import DataLoader

    folder = images(tmp_path / "f", ["a.png"])
    corrupt(folder / "b.png")
    dataset = CaptionDataset(read_folder(folder), per_caption=False)
    loader = DataLoader(dataset, batch_size=2, num_workers=1, collate_fn=lambda items: items)
    with pytest.raises(DataError) as e:
        next(iter(loader))
    assert "DataLoader worker" in str(e.value)  # torch puts the worker's traceback in the message
    assert explain(e.value).startswith(f"{folder / 'b.png'}: damaged image") and "\n" not in explain(e.value)


# --------------------------------------------------------------------------------------------------------------------
# Training and captioning from an image folder without split keys
# --------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory) -> Path:
    from finecap.models.presets import save_tiny_clip

    return save_tiny_clip(tmp_path_factory.mktemp("clip") / "clip", image_size=32, patch_size=16)


def tiny_overrides(clip: Path, cache: Path) -> list[str]:
    """A 1-layer ClipCap on a tiny random CLIP, 2 steps (tests/app/test_bad_inputs.py's ``tiny``)."""
    return [f"model.encoder={clip}", "clipcap.tiny_layers=1", "clipcap.tiny_hidden=32", "clipcap.tiny_heads=2",
            "clipcap.prefix_length=2", f"run.cache_dir={cache}", "train.batch_size=4", "train.warmup_steps=1",
            "train.log_every=1", "train.eval_samples=4", "decode.max_length=6", "train.max_steps=2"]  # fmt: skip


@pytest.mark.slow
def test_train_and_caption_from_an_image_folder_without_split_keys(tmp_path, tiny_clip):
    folder = tmp_path / "photos"
    words = ["red", "green", "blue", "yellow", "cyan", "pink"]
    for k in range(16):
        image(folder / ("indoor" if k % 2 else "outdoor") / f"{k:02d}.jpg", k)
        (folder / ("indoor" if k % 2 else "outdoor") / f"{k:02d}.txt").write_text(
            f"a {words[k % 6]} square\na square that is {words[k % 6]}\n"
        )
    corrupt(folder / "bad.png")  # no captions needed: it never gets that far
    (folder / "bad.txt").write_text("a square\n")
    (folder / "empty.jpg").write_bytes(b"")
    (folder / "empty.txt").write_text("a square\n")
    data = ["data.format=folder", f"data.path={folder}", "data.val_fraction=0.25"]
    base = [*tiny_overrides(tiny_clip, tmp_path / "cache"), "clipcap.lm=data-tiny"]  # "that is" is no world word

    run = tmp_path / "run"
    code, _, err = run_cli(["train", *base, *data, "data.skip_bad_images=true", "--out", str(run)])
    assert code == 0, err
    split_line = next(line for line in err.splitlines() if "name no split" in line)
    assert f"all 18 images of {folder} name no split; by image-id hash (data.val_fraction=0.25" in split_line
    assert int(split_line.split(", ")[-2].split()[0]) >= 1 and split_line.endswith(", 0 test")  # val, no test
    summary = next(line for line in err.splitlines() if line.startswith("train: 2 steps"))
    assert summary.endswith("; skipped 2 bad image(s) (data.skip_bad_images)")
    assert (run / "checkpoints" / "best").is_dir()
    assert json.loads((run / "fingerprints.json").read_text())["data"]["kind"] == "folder"

    out = tmp_path / "val.json"
    code, _, err = run_cli(["caption", "--checkpoint", str(run), "--split", "val", "--out", str(out)])
    assert code == 0, err
    val = load_records(folder_cfg(folder, "data.val_fraction=0.25", "data.skip_bad_images=true"), "val")
    assert sorted(row["image_id"] for row in json.loads(out.read_text())) == sorted(r.image_id for r in val)

    code, _, err = run_cli(["train", *base, *data, "--out", str(tmp_path / "refused")])  # no skip: named, one line
    lines = [line for line in err.splitlines() if line.startswith("finecap: ")]
    assert code == 2 and "Traceback" not in err and len(lines) == 1, err
    assert f"{folder / 'bad.png'}: damaged image" in lines[0] or f"{folder / 'empty.jpg'}: not an image" in lines[0]


def test_a_coco_file_missing_a_training_split_says_which_formats_can_hold_one(tmp_path):
    """A COCO file is the one split its name says: the advice for a missing split is another format, not 'another
    annotation file', which data.path could never take beside it."""
    images(tmp_path, ["a.png"])
    data = tmp_path / "captions_train.json"
    data.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.png"}],
                                "annotations": [{"image_id": 1, "caption": "a square"}]}))  # fmt: skip
    cfg = load(None, ["data.format=coco", f"data.path={data}"])
    assert len(load_records(cfg, "train")) == 1
    with pytest.raises(ValueError, match=r"no records in split 'val'; splits present: train; give some records split "
                                         r"'val' \(a COCO file holds the one split its name says .*write the split "
                                         r"files into one JSONL \(a few lines: docs/data.md, \"Training on COCO "
                                         r"caption files\"\) or the captions in the Karpathy format\)"):  # fmt: skip
        load_records(cfg, "val")
    # the section the message names is on that page, under that name
    assert '<a id="training-on-coco-caption-files"></a>**Training on COCO caption files.**' in DATA_DOCS.read_text()


def test_sidecars_starting_with_a_byte_order_mark_are_read_without_it(tmp_path):
    """A ``.txt`` caption file saved with a BOM gave its first caption an invisible U+FEFF ('\\ufeffa red cat', a
    word no reference shares); a ``captions.jsonl`` with one was refused. Both are read as the CSV sidecar was."""
    folder = images(tmp_path / "txt", ["1.png", "2.png"])
    (folder / "1.txt").write_text("\ufeffa red cat\r\na cat\r\n", encoding="utf-8")
    assert {r.image_id: r.captions for r in read_folder(folder)} == {"1.png": ["a red cat", "a cat"], "2.png": []}
    folder = images(tmp_path / "jsonl", ["1.png", "2.png"])
    (folder / "captions.jsonl").write_text('\ufeff{"image": "1.png", "captions": ["a red cat"]}\n', encoding="utf-8")
    assert {r.image_id: r.captions for r in read_folder(folder)} == {"1.png": ["a red cat"], "2.png": []}


@pytest.mark.parametrize(
    ("rows", "line", "why"),
    [
        ('a.png,"a red cat\nb.png,a blue dog\n', 2, "unexpected end of data"),  # never closed: the rest one caption
        ('a.png,a red cat\nb.png,"a blue" dog\n', 3, "',' expected after '\"'"),  # text after the closing quote
    ],
)
def test_a_captions_csv_quote_left_open_is_refused_naming_the_line_not_read_into_one_caption(
    tmp_path, rows, line, why
):
    """Python's csv module, not strict, reads every line after an unclosed quote into one caption (``b.png`` left
    uncaptioned, ``a.png`` captioned with ``b.png``'s row) and text after a closing quote into the cell: both are a
    mistake in the file, refused naming the line its row began on."""
    folder = images(tmp_path / "f", ["a.png", "b.png"])
    (folder / "captions.csv").write_text("image,caption\n" + rows)
    with pytest.raises(DataError, match=re.escape(f"captions.csv, line {line}: not CSV ({why})")):
        read_folder(folder)


def test_a_caption_txt_is_paired_whatever_the_case_of_its_suffix_and_two_of_one_image_are_refused(tmp_path):
    """``a.JPG`` beside ``a.TXT`` got no caption (only ``.txt`` was looked for, while image suffixes match in any
    case), unsaid, and a change to ``a.TXT`` left the data set's fingerprint as it was; ``a.txt`` beside ``a.TXT``
    (two caption files of one image, on a file system telling them apart) is refused naming both."""
    from finecap.data.formats.folder import FORMAT

    folder = images(tmp_path / "f", ["a.JPG", "cats/b.png", "c.png"])
    (folder / "a.TXT").write_text("a red cat\n")
    (folder / "cats" / "b.Txt").write_text("a green cat\n")
    read = {r.image_id: r.captions for r in read_folder(folder)}
    assert read == {"a.JPG": ["a red cat"], "cats/b.png": ["a green cat"], "c.png": []}
    before = FORMAT.fingerprint(folder, str(folder))
    (folder / "a.TXT").write_text("a blue cat\n")
    assert FORMAT.fingerprint(folder, str(folder)) != before
    if (folder / "a.txt").exists():  # a case-insensitive file system (macOS's default): a.txt is a.TXT
        pytest.skip("this file system does not tell a.txt from a.TXT: two caption files of one image cannot be made")
    (folder / "a.txt").write_text("a red cat\n")  # a third file on Linux's case-sensitive file systems
    with pytest.raises(DataError, match=re.escape(f"{folder}: a.TXT and a.txt are both captions of a.JPG; keep one")):
        read_folder(folder)
