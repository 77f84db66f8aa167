"""Reading only what the user named (issue 32): one rule for every file finecap reads as an image, and no record
naming a file outside its data set's image folder.

- Images: a file is used or sent only as the pixels PIL decodes from it (format checked, decompression-bomb limit,
  EXIF orientation): a non-image planted in a data set is never sent to a VLM server by `finecap boost` (what the
  server receives is recorded byte for byte), the bomb, damaged, truncated and empty files end in one-line errors
  naming the file in `caption`, `eval` and training, and odd but valid images (EXIF-rotated, CMYK, 16-bit, palette,
  alpha) load as upright RGB.
- Paths: a record naming `../secret.png`, an absolute path or a link leading out of the image folder is refused in
  every format (karpathy, coco, jsonl, world, hf) and by every command, unless `data.allow_outside_paths=true`.
- The round-one open case: a bags file whose similarity is a string is a named error, not an HTTP 500.
"""

from __future__ import annotations

import base64
import io
import json
import os
from pathlib import Path

import pytest
from PIL import Image

from finecap.boost.engine import BadImage, Task
from finecap.config import load
from finecap.data.bags_file import read_bags
from finecap.data.formats import read_dataset
from finecap.data.images import check_image_file, load_image, load_record_image
from finecap.data.records import DataError, Record
from helpers.chat_server import ChatServer, echo_first_caption
from helpers.cli import run_cli
from helpers.image_files import BLUE, BROKEN, GREEN, RED, SECRET, png, png_header, truncated_png

# the fixtures tiny (a tiny world, a tiny CLIP and their overrides) and secret_run (a ClipCap trained on them for 2
# steps) are tests/conftest.py's


def one_line_error(code: int, err: str) -> str:
    """The single ``finecap: error:`` line of a failed command (what tests/app/test_bad_inputs.py checks)."""
    assert "Traceback" not in err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("finecap: ")]
    assert len(lines) == 1 and lines[0].startswith("finecap: error: "), err
    return lines[0]


def jsonl(path: Path, rows: list[tuple[str, str]]) -> Path:
    """A JSONL data set of ``(image as written, split)`` rows, ids 1, 2, ..."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": k, "image": image, "captions": [f"a red square number {k}"], "split": split})
             for k, (image, split) in enumerate(rows, 1)]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


# --------------------------------------------------------------------------------------------------------------------
# One rule for every image: decoded, checked, upright, RGB
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("width", "height"), [(30000, 30000), (10000, 10000)])
def test_a_decompression_bomb_is_one_line_naming_the_file_and_the_limit(tmp_path, width, height):
    # 30000 x 30000 is over twice PIL's limit (PIL raises); 10000 x 10000 is between one and two times (PIL only
    # warns, and would then decode 300 MB): both are refused, the header alone is read
    bomb = png_header(tmp_path / "bomb.png", width, height)
    assert bomb.stat().st_size < 80
    for read in (load_image, check_image_file, lambda p: load_record_image(Record(1, p, "test"))):
        with pytest.raises(DataError) as e:
            read(bomb)
        message = str(e.value)
        assert "\n" not in message and str(bomb) in message
        assert f"{width * height:,} pixels" in message and "PIL.Image.MAX_IMAGE_PIXELS=89,478,485" in message
    embedded = Record(7, tmp_path / "x.png", "test", image_bytes=bomb.read_bytes())
    with pytest.raises(DataError, match=r"image of record 7 .*MAX_IMAGE_PIXELS"):
        load_record_image(embedded)


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_broken_files_are_named_errors(tmp_path, kind):
    make, reason = BROKEN[kind]
    path = make(tmp_path / f"{kind}.png")
    for read in (load_image, check_image_file):
        with pytest.raises(DataError) as e:
            read(path)
        assert str(e.value).startswith(f"{path}: ") and reason in str(e.value) and "\n" not in str(e.value)


def test_exif_orientation_is_applied(tmp_path):
    # stored 4 wide x 2 high, left half red, right half blue; EXIF orientation 6 = "rotate 90 clockwise to view"
    stored = Image.new("RGB", (4, 2), BLUE)
    stored.paste(Image.new("RGB", (2, 2), RED), (0, 0))
    exif = Image.Exif()
    exif[0x0112] = 6
    stored.save(tmp_path / "rotated.jpg", quality=100, exif=exif)
    image = load_image(tmp_path / "rotated.jpg")
    assert image.size == (2, 4)  # upright: 2 wide x 4 high
    top, bottom = image.getpixel((0, 0)), image.getpixel((0, 3))
    assert top[0] > 150 > top[2] and bottom[2] > 150 > bottom[0]  # red above blue once turned clockwise


def test_odd_modes_load_as_rgb(tmp_path):
    Image.new("CMYK", (4, 4), (0, 255, 255, 0)).save(tmp_path / "cmyk.jpg", quality=100)  # red in CMYK
    Image.new("I;16", (4, 4), 40000).save(tmp_path / "grey16.png")  # 16-bit grey: 40000 / 65535 -> 155
    palette = Image.new("P", (4, 4), 1)
    palette.putpalette([0, 0, 0, *GREEN] + [0] * 762)
    palette.save(tmp_path / "palette.png", transparency=0)
    Image.new("RGBA", (4, 4), (*BLUE, 128)).save(tmp_path / "alpha.png")
    Image.new("LA", (4, 4), (90, 200)).save(tmp_path / "grey_alpha.png")
    Image.new("1", (4, 4), 1).save(tmp_path / "bilevel.bmp")
    # transparency composited onto white, as transformers' convert_to_rgb: c * a / 255 + 255 * (1 - a / 255), so BLUE
    # (30, 30, 200) at alpha 128 is (142, 142, 227) and grey 90 at alpha 200 is 126
    expected = {"cmyk.jpg": (255, 0, 0), "grey16.png": (155, 155, 155), "palette.png": GREEN,
                "alpha.png": (142, 142, 227), "grey_alpha.png": (126, 126, 126),
                "bilevel.bmp": (255, 255, 255)}  # fmt: skip
    for name, color in expected.items():
        image = load_image(tmp_path / name)
        assert image.mode == "RGB" and image.size == (4, 4), name
        assert all(abs(a - b) <= 3 for a, b in zip(image.getpixel((1, 1)), color, strict=True)), (
            name,
            image.getpixel((1, 1)),
        )


def test_report_embeds_only_decoded_images(tmp_path):
    from finecap.report.html import image_uri, png_uri

    key = tmp_path / "key.png"
    key.write_bytes(SECRET)
    for embed in (image_uri, png_uri):
        with pytest.raises(DataError, match=rf"^{key}: not an image"):
            embed(key)
    uri = png_uri(png(tmp_path / "plot.png", GREEN))
    data = base64.b64decode(uri.split(",", 1)[1])
    assert uri.startswith("data:image/png;base64,") and Image.open(io.BytesIO(data)).getpixel((0, 0)) == GREEN


# --------------------------------------------------------------------------------------------------------------------
# Boost: a planted non-image is never sent
# --------------------------------------------------------------------------------------------------------------------


def _sent_images(server: ChatServer) -> list[tuple[str, bytes]]:
    """``(MIME type, bytes)`` of every image the server received."""
    out = []
    for request in server.requests:
        for message in request["payload"]["messages"]:
            if isinstance(message["content"], list):
                for part in message["content"]:
                    if part["type"] == "image_url":
                        head, data = part["image_url"]["url"].split(",", 1)
                        out.append((head.removeprefix("data:").removesuffix(";base64"), base64.b64decode(data)))
    return out


def _assert_secret_never_arrived(server: ChatServer) -> None:
    encodings = {SECRET[:40]} | {base64.b64encode(SECRET[k:])[4:40] for k in range(3)}  # any alignment in base64
    for request in server.requests:
        assert not any(e in request["body"] for e in encodings)
    assert not any(SECRET[:20] in data for _, data in _sent_images(server))


@pytest.fixture
def planted(tmp_path) -> Path:
    """A JSONL data set of four images, the third a private key named ``key.png`` in the image folder."""
    folder = tmp_path / "data"
    png(folder / "a.png", RED)
    png(folder / "b.png", GREEN)
    (folder / "key.png").write_bytes(SECRET)
    stored = Image.new("RGB", (6, 3), BLUE)
    stored.save(folder / "d.jpg", quality=95)
    return jsonl(folder / "data.jsonl", [("a.png", "test"), ("b.png", "test"), ("key.png", "test"), ("d.jpg", "test")])


def _boost_argv(data: Path, out: Path, url: str, mode: str, *extra: str) -> list[str]:
    return ["boost", "--out", str(out), "data.format=jsonl", f"data.path={data}", f"boost.mode={mode}",
            "boost.vlm_backend=openai", "boost.vlm_model=m", f"boost.vlm_base_url={url}", "boost.llm_backend=openai",
            "boost.llm_model=m", f"boost.llm_base_url={url}", "boost.concurrency=2", *extra]  # fmt: skip


@pytest.mark.parametrize("mode", ["visual", "holistic"])
def test_boost_never_sends_a_planted_key_and_fails_the_run(planted, tmp_path, mode):
    out = tmp_path / "out"
    with ChatServer(echo_first_caption) as server:
        code, _, err = run_cli(_boost_argv(planted, out, server.url, mode))
    line = one_line_error(code, err)  # 1 of 4 images failed: over the default budget (1 %), exit 2
    key = planted.parent / "key.png"
    assert f"{key}: not an image" in line and "boost.max_failure_rate" in line
    assert server.requests == []  # the images are checked before any request of any step
    failures = [json.loads(x) for x in (out / "failures.jsonl").read_text().splitlines()]
    assert [(f["image_id"], f["step"]) for f in failures] == [(3, "visual")]
    assert f"BadImage: {key}: not an image" in failures[0]["error"]
    assert json.loads((out / "boost.json").read_text())["status"] == "failed"
    assert not (out / "data.jsonl").exists()


@pytest.mark.parametrize("mode", ["visual", "holistic"])
def test_boost_within_budget_sends_only_decoded_images(planted, tmp_path, mode):
    out = tmp_path / "out"
    with ChatServer(echo_first_caption) as server:
        code, _, err = run_cli(_boost_argv(planted, out, server.url, mode, "boost.max_failure_rate=0.5"))
    assert code == 0, err
    _assert_secret_never_arrived(server)
    sent = [
        (mime, Image.open(io.BytesIO(data)).convert("RGB").getpixel((0, 0))) for mime, data in _sent_images(server)
    ]
    assert sorted(m for m, _ in sent) == ["image/jpeg", "image/png", "image/png"]  # a.png, b.png, d.jpg: never key
    assert {c for m, c in sent if m == "image/png"} == {RED, GREEN}
    assert all(abs(a - b) <= 8 for m, c in sent if m == "image/jpeg" for a, b in zip(c, BLUE, strict=True))
    summary = json.loads((out / "boost.json").read_text())
    assert (summary["status"], summary["boosted"], summary["failed"]) == ("ok", 3, 1)
    failures = [json.loads(x) for x in (out / "failures.jsonl").read_text().splitlines()]
    assert {(f["image_id"], f["step"]) for f in failures} == {(3, "visual")} | ({(3, "holistic")} if mode ==
                                                                               "holistic" else set())  # fmt: skip
    rows = [json.loads(x) for x in (out / "data.jsonl").read_text().splitlines()]
    assert rows[2]["captions"] == ["a red square number 3"]  # the failed image keeps its human caption


def test_boost_reads_images_within_the_configured_budget(tmp_path):
    """``data.max_image_pixels`` / ``data.max_aspect_ratio`` bound boost's images as training's: a 60 x 2 strip (30:1)
    within data.max_aspect_ratio=40 is sent (the default 20 refused it), a 20 x 20 image over
    data.max_image_pixels=300 is not (the default 64 MP sent it)."""
    folder = tmp_path / "data"
    png(folder / "a.png", RED)
    png(folder / "wide.png", GREEN, size=(60, 2))
    png(folder / "big.png", BLUE, size=(20, 20))
    data = jsonl(folder / "data.jsonl", [("a.png", "test"), ("wide.png", "test"), ("big.png", "test")])
    out = tmp_path / "out"
    budget = ("data.max_image_pixels=300", "data.max_aspect_ratio=40", "boost.max_failure_rate=0.5")
    with ChatServer(echo_first_caption) as server:
        code, _, err = run_cli(_boost_argv(data, out, server.url, "visual", *budget))
    assert code == 0, err
    assert sorted(Image.open(io.BytesIO(b)).size for _, b in _sent_images(server)) == [(8, 8), (60, 2)]
    failures = [json.loads(x) for x in (out / "failures.jsonl").read_text().splitlines()]
    assert [(f["image_id"], f["step"]) for f in failures] == [(3, "visual")]
    assert "data.max_image_pixels=300" in failures[0]["error"]
    # the in-process backends decode within the same budget
    from finecap.boost.hf_backend import TransformersBackend
    from finecap.data.images import ImageLimits

    backend = TransformersBackend.__new__(TransformersBackend)  # generation stubbed: no model needed
    backend.vision, backend.batch_size = True, 4
    backend.generate = lambda tasks, images: [f"{im.size}" for im in images]
    limits = ImageLimits(max_pixels=300, max_aspect_ratio=40)
    records = [Record(k, folder / n, "test", ["x"]) for k, n in enumerate(["wide.png", "big.png"], 1)]
    answers = dict(backend.run([Task(i, r, "visual", [], {}, limits) for i, r in enumerate(records)]))
    assert answers[0] == "(60, 2)" and isinstance(answers[1], BadImage) and "max_image_pixels=300" in str(answers[1])


def test_openai_backend_re_encodes_and_refuses_non_images(planted):
    from finecap.boost.openai_backend import image_data_url

    folder = planted.parent
    with pytest.raises(BadImage, match=rf"^{folder / 'key.png'}: not an image"):
        image_data_url(folder / "key.png")
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("Comment", SECRET.decode())  # a text chunk riding along in a real image
    Image.new("RGB", (5, 4), RED).save(folder / "commented.png", pnginfo=info)
    assert SECRET in (folder / "commented.png").read_bytes()
    for name, mime in (("commented.png", "image/png"), ("d.jpg", "image/jpeg")):
        head, data = image_data_url(folder / name).split(",", 1)
        assert head == f"data:{mime};base64"
        decoded = base64.b64decode(data)
        assert SECRET[:20] not in decoded  # the pixels re-encoded, not the file
        assert Image.open(io.BytesIO(decoded)).size == Image.open(folder / name).size
    # a file that turns bad after the engine's check: the backend refuses it too, and sends nothing
    (folder / "a.png").write_bytes(SECRET)
    with ChatServer(echo_first_caption) as server:
        from finecap.boost.openai_backend import OpenAIBackend

        backend = OpenAIBackend("m", server.url, concurrency=1, retries=0)
        record = Record(1, folder / "a.png", "test", ["a red square"])
        messages = [{"role": "user", "content": "describe"}]
        results = dict(backend.run([Task(0, record, "visual", messages, {})]))
        backend.close()
    assert isinstance(results[0], BadImage) and server.requests == []


def test_transformers_backend_fails_a_bad_image_alone(planted):
    from finecap.boost.hf_backend import TransformersBackend

    backend = TransformersBackend.__new__(TransformersBackend)  # the model is not needed: generation is stubbed
    backend.vision, backend.batch_size = True, 4
    seen = []

    def generate(tasks, images):
        seen.extend(images)
        return [f"described {t.record.image_id}" for t in tasks]

    backend.generate = generate
    folder = planted.parent
    records = [Record(k, folder / n, "test", ["x"]) for k, n in enumerate(["a.png", "key.png", "d.jpg"], 1)]
    answers = dict(backend.run([Task(i, r, "visual", [], {}) for i, r in enumerate(records)]))
    assert answers[0] == "described 1" and answers[2] == "described 3"
    assert isinstance(answers[1], BadImage) and str(answers[1]).startswith(f"{folder / 'key.png'}: not an image")
    assert [im.mode for im in seen] == ["RGB", "RGB"]


# --------------------------------------------------------------------------------------------------------------------
# Paths outside the data set's folder
# --------------------------------------------------------------------------------------------------------------------

FORMATS = ["karpathy", "coco", "jsonl", "world", "hf"]
RECORD = {"karpathy": "images[0]", "coco": "image id 1", "jsonl": "line 1", "world": "images[0]",
          "hf": "split 'test', row 0"}  # fmt: skip


def write_dataset(fmt: str, folder: Path, image: str) -> Path:
    """A one-image data set of ``fmt`` in ``folder`` naming ``image`` (as written, relative to its image root);
    returns the path a reader takes. The world's image root is ``folder/images``, the others' ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    caption = "a red square"
    if fmt in ("karpathy", "world"):
        path = folder / "dataset.json"
        path.write_text(json.dumps({"images": [{"filename": image, "split": "test", "imgid": 1,
                                                "sentences": [{"raw": caption}]}]}))  # fmt: skip
        (folder / "images").mkdir(exist_ok=True)
    elif fmt == "coco":
        path = folder / "captions_test.json"
        path.write_text(json.dumps({"images": [{"id": 1, "file_name": image}],
                                    "annotations": [{"id": 1, "image_id": 1, "caption": caption}]}))  # fmt: skip
    elif fmt == "jsonl":
        path = folder / "test.jsonl"
        path.write_text(json.dumps({"id": 1, "image": image, "captions": [caption]}) + "\n")
    else:
        datasets = pytest.importorskip("datasets")
        path = folder / "test.parquet"
        datasets.Dataset.from_dict({"image": [image], "captions": [[caption]]}).to_parquet(str(path))
    return path


def image_root(fmt: str, folder: Path) -> Path:
    return folder / "images" if fmt == "world" else folder


@pytest.mark.parametrize("how", ["dotdot", "absolute", "link"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_record_naming_a_file_outside_is_refused_unless_allowed(tmp_path, fmt, how):
    folder = tmp_path / "data"
    root = image_root(fmt, folder)
    root.mkdir(parents=True)
    secret = png(root.parent / "secret.png", GREEN)  # a real image, one level above the image root
    written = {"dotdot": "../secret.png", "absolute": str(secret), "link": "link.png"}[how]
    if how == "link":
        (root / "link.png").symlink_to(secret)  # inside by name, outside once resolved
    path = write_dataset(fmt, folder, written)
    with pytest.raises(DataError) as e:
        read_dataset(fmt, path)
    message = str(e.value)
    assert "\n" not in message and message.startswith(str(path)) and RECORD[fmt] in message
    assert repr(written) in message and f"resolves to {os.path.realpath(secret)}" in message
    assert f"image folder {os.path.realpath(root)}" in message
    assert "data.allow_outside_paths=true" in message
    records = read_dataset(fmt, path, allow_outside=True)  # the user's call: then read as named
    assert load_record_image(records[0]).getpixel((0, 0)) == GREEN


@pytest.mark.parametrize("fmt", FORMATS)
def test_paths_inside_are_read_however_written(tmp_path, fmt, monkeypatch):
    # `..` that stays inside, a link to a file inside, a linked image root, a relative root given by the user
    folder = tmp_path / "data"
    root = image_root(fmt, folder)
    png(root / "sub" / "a.png", RED)
    (root / "inner.png").symlink_to(root / "sub" / "a.png")
    for written in ("sub/../sub/a.png", "inner.png", str(root / "sub" / "a.png")):
        path = write_dataset(fmt, folder, written)
        assert load_record_image(read_dataset(fmt, path)[0]).getpixel((0, 0)) == RED
    elsewhere = png(tmp_path / "store" / "b.png", BLUE).parent
    (tmp_path / "linked").symlink_to(elsewhere, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    path = write_dataset(fmt, folder, "b.png")
    record = read_dataset(fmt, path, images="linked")[0]  # relative, through a link: the user's naming
    assert load_record_image(record).getpixel((0, 0)) == BLUE


def test_hf_image_feature_paths_are_checked(tmp_path):
    datasets = pytest.importorskip("datasets")
    secret = png(tmp_path / "secret.png", GREEN)
    features = datasets.Features({"image": datasets.Image(), "captions": datasets.Sequence(datasets.Value("string"))})
    rows = {"image": [{"bytes": None, "path": str(secret)}], "captions": [["a green square"]]}  # a file, not bytes
    data = tmp_path / "data" / "test.parquet"
    data.parent.mkdir()
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(data))
    with pytest.raises(DataError, match=r"test.parquet: split 'test', row 0: image path .*allow_outside_paths=true"):
        read_dataset("hf", data)
    assert load_record_image(read_dataset("hf", data, allow_outside=True)[0]).getpixel((0, 0)) == GREEN


def test_training_data_eval_and_boost_apply_the_rule(tmp_path):
    from finecap.data.datasets import load_records

    folder = tmp_path / "data"
    png(tmp_path / "secret.png", GREEN)
    png(folder / "a.png", RED)
    data = jsonl(folder / "data.jsonl", [("a.png", "train"), ("../secret.png", "train")])
    cfg = load(None, ["data.format=jsonl", f"data.path={data}"])
    with pytest.raises(DataError, match=r"data.jsonl, line 2: image path '../secret.png' .*allow_outside_paths"):
        load_records(cfg, "train")
    allowed = load(None, ["data.format=jsonl", f"data.path={data}", "data.allow_outside_paths=true"])
    assert [r.image_id for r in load_records(allowed, "train")] == [1, 2]

    predictions = tmp_path / "results.json"
    predictions.write_text(json.dumps([{"image_id": 1, "caption": "a red square"},
                                       {"image_id": 2, "caption": "a green square"}]))  # fmt: skip
    argv = ["eval", "--predictions", str(predictions), "--references", str(data), "--metrics", "bleu"]
    line = one_line_error(*run_cli(argv)[::2])
    assert f"{data}, line 2: image path '../secret.png'" in line and "data.allow_outside_paths=true" in line
    code, _, err = run_cli([*argv, "data.allow_outside_paths=true"])
    assert code == 0, err

    with ChatServer(echo_first_caption) as server:
        code, _, err = run_cli(_boost_argv(data, tmp_path / "out", server.url, "visual"))
    line = one_line_error(code, err)
    assert "line 2: image path '../secret.png'" in line and server.requests == []
    assert not (tmp_path / "out").exists()  # refused before the output folder was made


# --------------------------------------------------------------------------------------------------------------------
# The decompression bomb and broken images through the commands
# --------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def bomb_data(tmp_path) -> Path:
    """A JSONL data set (train, val and test images) whose first test image is a 30000 x 30000 PNG header."""
    folder = tmp_path / "bomb"
    for k in range(6):
        png(folder / f"{k}.png", RED if k % 2 else BLUE, size=(32, 32))
    png_header(folder / "bomb.png", 30000, 30000)
    rows = [("bomb.png", "test"), ("0.png", "test"), ("1.png", "train"), ("2.png", "train"), ("3.png", "train"),
            ("4.png", "val"), ("5.png", "val")]  # fmt: skip
    return jsonl(folder / "data.jsonl", rows)


def _bomb_named(line: str, bomb_data: Path) -> None:
    assert f"{bomb_data.parent / 'bomb.png'}: image too large (900,000,000 pixels)" in line
    assert "PIL.Image.MAX_IMAGE_PIXELS=89,478,485" in line


def test_bomb_in_caption_is_one_line(secret_run, bomb_data, tmp_path):
    checkpoint = secret_run["run"] / "checkpoints" / "best"
    argv = ["caption", "--checkpoint", str(checkpoint), "--data", str(bomb_data), "--out", str(tmp_path / "c.json")]
    _bomb_named(one_line_error(*run_cli(argv)[::2]), bomb_data)
    assert not (tmp_path / "c.json").exists()


def test_bomb_in_eval_is_one_line(tiny, bomb_data, tmp_path):
    predictions = tmp_path / "results.json"
    predictions.write_text(json.dumps([{"image_id": 1, "caption": "a square"}, {"image_id": 2, "caption": "red"}]))
    argv = [
        "eval",
        "--predictions",
        str(predictions),
        "--references",
        str(bomb_data),
        "--split",
        "test",
        "--metrics",
        "clipscore",
        f"retriever.checkpoint={tiny['clip']}",
        f"run.cache_dir={tmp_path / 'cache'}",
    ]
    _bomb_named(one_line_error(*run_cli(argv)[::2]), bomb_data)


def test_bomb_and_truncated_images_in_training_are_one_line(tiny, bomb_data, tmp_path):
    data = [f"model.encoder={tiny['clip']}", "data.format=jsonl", f"data.path={bomb_data}", "train.batch_size=2",
            "train.eval_samples=2", "clipcap.lm=data-tiny"]  # fmt: skip
    base = [o for o in tiny["base"] if not o.startswith(("train.batch_size", "train.eval_samples"))]
    rows = bomb_data.read_text().splitlines()
    bomb_data.write_text("\n".join([rows[1], rows[2].replace("1.png", "bomb.png"), *rows[3:]]) + "\n")  # trains
    code, _, err = run_cli(["train", *base, *data, "--out", str(tmp_path / "run")])
    _bomb_named(one_line_error(code, err), bomb_data)
    truncated_png(bomb_data.parent / "bomb.png")
    code, _, err = run_cli(["train", *base, *data, "--out", str(tmp_path / "run2")])
    line = one_line_error(code, err)
    assert f"{bomb_data.parent / 'bomb.png'}: damaged image" in line


# --------------------------------------------------------------------------------------------------------------------
# A bag's similarity that is not a number
# --------------------------------------------------------------------------------------------------------------------


def test_a_string_similarity_is_a_named_error_when_the_bags_are_read(tmp_path):
    from finecap.app.review import create_app

    bags = tmp_path / "bags.json"
    bags.write_text(json.dumps({"bags": {"3": [{"images": [1, 2, 3], "similarity": 0.9},
                                               {"images": [4, 5, 6], "similarity": "high"}]}}))  # fmt: skip
    expected = rf"{bags}: bags\['3'\]\[1\]: 'similarity' must be a number .*got str 'high'"
    with pytest.raises(DataError, match=expected):
        read_bags(bags)
    with pytest.raises(DataError, match=expected):
        create_app(bags, tmp_path)
    line = one_line_error(*run_cli(["bags", "review", str(bags), "--images", str(tmp_path), "--port", "0"])[::2])
    assert "'similarity' must be a number" in line and str(bags) in line
    bags.write_text(json.dumps({"bags": {"3": [{"images": [1, 2, 3], "similarity": None}, [4, 5, 6]]}}))
    assert read_bags(bags) == {3: [[1, 2, 3], [4, 5, 6]]}  # absent or null: nothing to print, still fine
