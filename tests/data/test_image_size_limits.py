"""The image budget (issue 48): small, legal images that cost gigabytes.

``data.max_image_pixels``, ``data.max_aspect_ratio`` (``finecap.data.images.ImageLimits``): a 1 x 60,000 PNG of a few
hundred bytes (2.5 GB in a 64 px CLIP image processor: docs/reliability.md), its 60,000 x 1 twin, an image just over
20:1, one just over 64 megapixels and an 81-megapixel one (under PIL's decompression-bomb limit) are refused from
their header, before any pixel is decoded, by every reader (a file, embedded bytes, a PIL image given to the API)
and every command (``caption --images``, a folder data set in training, CLIPScore in ``eval``, a Hugging Face data
set's rows), each as one line naming the file or row, its size, the limit and the option; images at the limits
decode, and raising an option admits what it refused. Files read whole (class 7): tests/utils/test_bounded_reads.py.
"""

from __future__ import annotations

import io
import json
import shutil
import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image

from finecap.config import PIL_MAX_IMAGE_PIXELS, ConfigError, DataConfig, load
from finecap.data.images import ImageLimits, check_image_file, load_image, load_record_image
from finecap.data.records import DataError, Record
from helpers.cli import error_line, run_cli, succeeds


def bilevel_png(path: Path, width: int, height: int) -> Path:
    """A real PNG of ``width`` x ``height`` 1-bit pixels, all black: PIL writes it, zlib makes it kilobytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("1", (width, height)).save(path, optimize=True)
    return path


def header_png(path: Path, width: int, height: int) -> Path:
    """A PNG of a few dozen bytes whose header declares ``width`` x ``height`` RGB pixels (and holds none)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
    )
    return path


# (size, what the one line says): every variant is refused from its header
OVER = {
    "tall 1x60000": ((1, 60000), ["(1 x 60,000 pixels, aspect ratio 60,000:1)", "data.max_aspect_ratio=20"]),
    "wide 60000x1": ((60000, 1), ["(60,000 x 1 pixels, aspect ratio 60,000:1)", "data.max_aspect_ratio=20"]),
    "just over 20:1": ((3, 61), ["(3 x 61 pixels, aspect ratio 20.3:1)", "data.max_aspect_ratio=20"]),
    "just over 64 MP": ((8001, 8000), ["(8,001 x 8,000 = 64,008,000 pixels)", "data.max_image_pixels=64,000,000"]),
    "81 MP": ((9000, 9000), ["(9,000 x 9,000 = 81,000,000 pixels)", "data.max_image_pixels=64,000,000"]),
}


def _over(path: Path, variant: str) -> tuple[Path, list[str]]:
    (width, height), said = OVER[variant]
    return bilevel_png(path, width, height), said


def _check_said(message: str, image: Path | str, said: list[str]) -> None:
    assert "\n" not in message and str(image) in message
    assert all(fragment in message for fragment in said), message
    assert "refused before decoding" in message and "damaged" not in message


@pytest.fixture
def no_decoding(monkeypatch):
    """Decoding pixels fails the test: what is refused must be refused from the header."""
    from PIL import ImageFile

    def decode(self, *args, **kwargs):
        raise AssertionError(f"pixels decoded: {self.size}")

    monkeypatch.setattr(ImageFile.ImageFile, "load", decode)


@pytest.mark.parametrize("variant", list(OVER))
def test_every_reader_refuses_an_image_over_the_budget_from_its_header(tmp_path, variant, no_decoding):
    image, said = _over(tmp_path / "x.png", variant)
    assert image.stat().st_size < 200_000  # small, legal files
    for read in (load_image, check_image_file, lambda p: load_record_image(Record(1, p, "test"))):
        with pytest.raises(DataError) as e:
            read(image)
        _check_said(str(e.value), image, said)
    embedded = Record("train/3", tmp_path / "train_3", "train", image_bytes=image.read_bytes())  # a data set's row
    with pytest.raises(DataError) as e:
        load_record_image(embedded)
    _check_said(str(e.value), "image of record 'train/3'", said)


@pytest.mark.parametrize(("size", "limits"), [
    ((1, 20), ImageLimits()),  # 20:1 exactly
    ((20, 1), ImageLimits()),
    ((10, 10), ImageLimits(max_pixels=100)),  # the pixel budget exactly
    ((1, 30), ImageLimits(max_aspect_ratio=30)),  # raised
])  # fmt: skip
def test_an_image_at_the_limits_decodes(tmp_path, size, limits):
    image = load_image(bilevel_png(tmp_path / "x.png", *size), limits=limits)
    assert image.size == size and image.mode == "RGB"
    over = (size[0] + 1, size[1]) if size[0] >= size[1] else (size[0], size[1] + 1)
    with pytest.raises(DataError, match="refused before decoding"):
        load_image(bilevel_png(tmp_path / "y.png", *over), limits=limits)


def test_64_megapixels_pass_the_budget_unread(tmp_path, no_decoding):
    # 8000 x 8000 is the default budget exactly: the header is admitted (verified, not decoded), one pixel more is not
    check_image_file(header_png(tmp_path / "ok.png", 8000, 8000))
    with pytest.raises(DataError, match="64,008,000 pixels"):
        check_image_file(header_png(tmp_path / "over.png", 8001, 8000))


def test_the_options_their_defaults_and_bounds():
    data = DataConfig()
    assert (data.max_image_pixels, data.max_aspect_ratio) == (64_000_000, 20.0)
    assert ImageLimits.of(data) == ImageLimits()
    assert PIL_MAX_IMAGE_PIXELS == Image.MAX_IMAGE_PIXELS  # the bound is PIL's own limit, which PIL enforces
    for item, said in [(f"data.max_image_pixels={PIL_MAX_IMAGE_PIXELS + 1}", "decompression-bomb limit"),
                       ("data.max_image_pixels=0", ">= 1"), ("data.max_aspect_ratio=0.5", ">= 1"),
                       ("data.max_aspect_ratio=5000", "<= 1000")]:  # fmt: skip
        with pytest.raises(ConfigError, match=said) as e:
            load(overrides=[item])
        assert item.split("=")[0] in str(e.value)


def test_a_pil_image_given_to_the_api_is_held_to_the_budget(run, shapes):
    from finecap.api import Captioner

    captioner = Captioner.from_pretrained(run, device="cpu")
    strip = Image.new("RGB", (60000, 1))
    with pytest.raises(DataError, match=r"image 1 of the list \(a PIL image\): image too elongated"):
        captioner.caption([Image.open(shapes["new"] / "red.png"), strip])


@pytest.mark.parametrize("variant", list(OVER))
def test_caption_images_names_the_image_or_skips_it(run, shapes, tmp_path, variant):
    photos = tmp_path / "photos"
    photos.mkdir()
    shutil.copy(shapes["new"] / "red.png", photos / "red.png")
    bad, said = _over(photos / "planted.png", variant)
    out = tmp_path / "out.json"
    line = error_line(["caption", "--checkpoint", run, "--out", out, "--images", photos])
    assert line.startswith(f"finecap: error: {bad}: image too ")
    _check_said(line, bad, said)
    assert not out.exists()
    succeeds(["caption", "--checkpoint", run, "--out", out, "--skip-bad-images", "--images", photos])
    assert [r["image_id"] for r in json.loads(out.read_text())] == ["red.png"]


def test_caption_images_admits_what_a_raised_option_allows(run, tmp_path):
    strip = bilevel_png(tmp_path / "photos" / "strip.png", 2, 50)  # 25:1
    out = tmp_path / "out.json"
    line = error_line(["caption", "--checkpoint", run, "--out", out, "--images", strip])
    assert "aspect ratio 25:1" in line and "raise data.max_aspect_ratio" in line
    succeeds(["caption", "--checkpoint", run, "--out", out, "data.max_aspect_ratio=25", "--images", strip])
    assert [r["image_id"] for r in json.loads(out.read_text())] == ["strip.png"]
    pixels = error_line(["caption", "--checkpoint", run, "--out", tmp_path / "o2.json", "data.max_image_pixels=99",
                         "data.max_aspect_ratio=25", "--images", strip])  # fmt: skip
    assert "(2 x 50 = 100 pixels): over the pixel budget data.max_image_pixels=99" in pixels


def _training_argv(shapes: dict, data: Path, out: Path, *more: str) -> list:
    """Train 1 step on the image folder ``data``; every image is read (train.eval_samples=0: all of val)."""
    return ["train", "data.format=folder", f"data.path={data}", "data.val_fraction=0.25",
            f"model.encoder={shapes['clip']}", "clipcap.tiny_layers=1", "clipcap.tiny_hidden=32",
            "clipcap.tiny_heads=2", "clipcap.prefix_length=2", f"run.cache_dir={out.parent / 'cache'}",
            "train.batch_size=8", "train.warmup_steps=0", "train.max_steps=1", "train.eval_samples=0",
            "decode.max_length=4", *more, "--out", str(out)]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["tall 1x60000", "wide 60000x1", "81 MP"])
@pytest.mark.parametrize("encoder", ["frozen", "trained"])  # the feature cache, or the training DataLoader
def test_training_on_a_folder_names_the_image(shapes, tmp_path, variant, encoder):
    data = tmp_path / "data"
    shutil.copytree(shapes["data"], data)
    bad, said = _over(data / "red" / "planted.png", variant)
    (data / "red" / "planted.txt").write_text("a red circle\n")
    more = ["model.train_encoder=true"] if encoder == "trained" else []
    line = error_line(_training_argv(shapes, data, tmp_path / "run", *more))
    assert line.startswith(f"finecap: error: {bad}: image too ")
    _check_said(line, bad, said)


@pytest.mark.slow
def test_training_skips_the_image_when_asked(shapes, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(shapes["data"], data)
    bad, _ = _over(data / "red" / "planted.png", "tall 1x60000")
    (data / "red" / "planted.txt").write_text("a red circle\n")
    code, _, err = run_cli(_training_argv(shapes, data, tmp_path / "run", "data.skip_bad_images=true"))
    assert code == 0, err
    assert str(bad) in err and "image too elongated" in err  # the warning names what was left out


@pytest.mark.parametrize("variant", ["tall 1x60000", "wide 60000x1", "just over 64 MP"])
def test_clipscore_in_eval_names_the_image(shapes, tmp_path, variant):
    folder = tmp_path / "refs"
    folder.mkdir()
    shutil.copy(shapes["new"] / "red.png", folder / "red.png")
    bad, said = _over(folder / "planted.png", variant)
    refs = folder / "refs.jsonl"
    refs.write_text("".join(json.dumps({"id": k, "image": name, "captions": ["a red circle"]}) + "\n"
                            for k, name in enumerate(["red.png", "planted.png"], 1)))  # fmt: skip
    predictions = tmp_path / "p.json"
    predictions.write_text(json.dumps([{"image_id": 1, "caption": "a red circle"}, {"image_id": 2, "caption": "a"}]))
    argv = ["eval", "--predictions", predictions, "--references", refs, "--metrics", "clipscore",
            f"retriever.checkpoint={shapes['clip']}", f"run.cache_dir={tmp_path / 'cache'}"]  # fmt: skip
    line = error_line(argv)
    _check_said(line, bad, said)
    bilevel_png(bad, 8, 8)  # the same data set with a normal image: scored
    assert "CLIPScore" in succeeds(argv)


@pytest.fixture
def hf_rows(tmp_path):
    """A saved Hugging Face data set whose test rows embed images as bytes: a normal one, then a planted one."""
    datasets = pytest.importorskip("datasets")

    def saved(planted: bytes) -> Path:
        red = io.BytesIO()
        Image.new("RGB", (32, 32), (220, 30, 30)).save(red, format="PNG")
        features = datasets.Features(
            {"image": datasets.Image(), "captions": datasets.Sequence(datasets.Value("string"))}
        )
        rows = {"image": [{"bytes": red.getvalue(), "path": None}, {"bytes": planted, "path": None}],
                "captions": [["a red circle"], ["a red circle"]]}  # fmt: skip
        folder = tmp_path / "hf"
        shutil.rmtree(folder, ignore_errors=True)
        datasets.DatasetDict({"test": datasets.Dataset.from_dict(rows, features=features)}).save_to_disk(str(folder))
        return folder

    return saved


@pytest.mark.parametrize("variant", ["tall 1x60000", "wide 60000x1", "81 MP"])
def test_a_hugging_face_row_over_the_budget_is_named(run, tmp_path, hf_rows, variant):
    from finecap.data.datasets import CaptionDataset, load_records

    planted, said = _over(tmp_path / "planted.png", variant)
    folder = hf_rows(planted.read_bytes())
    cfg = load(overrides=["data.format=hf", f"data.path={folder}"])
    records = load_records(cfg, "test", captioned=False)
    dataset = CaptionDataset(records, per_caption=False, limits=ImageLimits.of(cfg.data))
    assert dataset[0]["image"].size == (32, 32)
    with pytest.raises(DataError) as e:
        dataset[1]
    _check_said(str(e.value), "image of record 'test/1'", said)
    out = tmp_path / "c.json"
    line = error_line(["caption", "--checkpoint", run, "--data", folder, "--split", "test", "--out", out])
    _check_said(line, "image of record 'test/1'", said)
    assert not out.exists()
