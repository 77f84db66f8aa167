"""The input pipeline (finecap.data.loading): DataLoader workers give the batches the main process gives, and the
JPEG draft rule (decode at 1/2-1/8 scale only while both sides stay >= the image processor's size)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import BlipImageProcessor, CLIPImageProcessor

from finecap.config import load
from finecap.data.datasets import CaptionCollator, CaptionDataset, load_records
from finecap.data.images import load_image, load_record_image
from finecap.data.loading import LoaderSettings, Preprocess, RecordImages, chunks, draft_size, encoder_draft
from finecap.models.tokenizer import world_tokenizer


def photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """A photo-like image: smooth colour fields (bicubic upsampling of a coarse random grid) plus mild grain."""
    rng = np.random.default_rng(seed)
    coarse = Image.fromarray(rng.integers(0, 256, (max(2, height // 16), max(2, width // 16), 3), dtype=np.uint8))
    smooth = np.asarray(coarse.resize((width, height), Image.BICUBIC)).astype(np.int16)
    grain = rng.integers(-12, 13, (height, width, 3))
    return Image.fromarray(np.clip(smooth + grain, 0, 255).astype(np.uint8))


def jpeg(path, image: Image.Image, **save) -> str:
    image.save(path, "JPEG", quality=90, **save)
    return str(path)


@pytest.fixture
def folder(tmp_path):
    """An image folder (JPEGs of three sizes and a PNG) with a captions.jsonl sidecar, all train."""
    root = tmp_path / "photos"
    root.mkdir()
    lines = []
    for i, (w, h) in enumerate([(640, 480), (480, 640), (300, 200), (640, 480), (320, 320), (500, 400), (96, 64)]):
        name = f"{i}.png" if i == 4 else f"{i}.jpg"
        if name.endswith(".png"):
            photo(w, h, i).save(root / name)
        else:
            jpeg(root / name, photo(w, h, i))
        lines.append(f'{{"image": "{name}", "captions": ["photo number {i}", "a picture {i}"]}}')
    (root / "captions.jsonl").write_text("\n".join(lines) + "\n")
    return root


def clip_preprocess(images):
    return CLIP(images=images, return_tensors="pt")["pixel_values"]


CLIP = CLIPImageProcessor(size={"shortest_edge": 64}, crop_size={"height": 64, "width": 64})


def batches_of(loader) -> list[dict]:
    return [batch for batch in loader]


def assert_same_batches(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for key in x:
            if isinstance(x[key], torch.Tensor):
                assert torch.equal(x[key], y[key]), key
            else:
                assert x[key] == y[key], key


def test_two_workers_give_the_batches_of_the_main_process(folder):
    cfg = load(None, ["data.format=folder", f"data.path={folder}"])
    records = load_records(cfg, "train")
    dataset = CaptionDataset(records, per_caption=True, draft=draft_size(CLIP))
    collate = CaptionCollator(world_tokenizer(), 8, preprocess=clip_preprocess)
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(3)).tolist()
    plan = chunks(order, 3)  # 14 examples in batches of 3: the last one shorter
    main = batches_of(LoaderSettings().loader(dataset, plan, collate))
    workers = batches_of(LoaderSettings(num_workers=2).loader(dataset, plan, collate))
    assert_same_batches(main, workers)
    assert [b["index"].tolist() for b in workers] == plan  # in the order given, whatever worker made a batch
    assert workers[0]["pixel_values"].shape == (3, 3, 64, 64)


def test_feature_images_in_workers_equal_main_process(folder):
    cfg = load(None, ["data.format=folder", f"data.path={folder}"])
    records = load_records(cfg, "train")
    plan = chunks(range(len(records)), 2)
    images = RecordImages(records, draft=64)
    main = list(LoaderSettings().loader(images, plan, Preprocess(clip_preprocess)))
    workers = list(LoaderSettings(num_workers=2).loader(images, plan, Preprocess(clip_preprocess)))
    assert all(torch.equal(a, b) for a, b in zip(main, workers, strict=True)) and len(main) == 4
    plain = list(LoaderSettings(num_workers=2).loader(images, plan, Preprocess()))  # no preprocess: the images
    assert [im.size for batch in plain for im in batch] == [load_record_image(r, 64).size for r in records]


def test_settings_from_the_configuration():
    cfg = load(None, ["data.num_workers=3"])
    assert LoaderSettings.of(cfg.data, "cpu", per_run=True) == LoaderSettings(3, False, persistent_workers=True)
    assert LoaderSettings.of(cfg.data, "cuda:0", per_run=True) == LoaderSettings(3, pin_memory=True,
                                                                                 persistent_workers=True)  # fmt: skip
    assert LoaderSettings.of(cfg.data, "cpu") == LoaderSettings(3, False, persistent_workers=False)  # iterated once
    assert LoaderSettings.of(cfg.data, "cpu", workers=False, per_run=True) == LoaderSettings(0, False, False)
    off = load(None, ["data.num_workers=3", "data.pin_memory=false", "data.persistent_workers=false"])
    assert LoaderSettings.of(off.data, "cuda", per_run=True) == LoaderSettings(3, False, persistent_workers=False)


# ---------------------------------------------------------------------------------------------------------------------
# JPEG draft
# ---------------------------------------------------------------------------------------------------------------------


def test_draft_size_per_processor_kind():
    assert draft_size(CLIPImageProcessor()) == 224  # shortest edge
    assert draft_size(BlipImageProcessor(size={"height": 384, "width": 384})) == 384
    assert draft_size(BlipImageProcessor(size={"height": 224, "width": 320})) == 320  # either orientation
    assert draft_size(CLIPImageProcessor(do_resize=False)) is None
    assert draft_size(None) is None
    from transformers import Idefics3ImageProcessor, Qwen2VLImageProcessor

    assert draft_size(Idefics3ImageProcessor(size={"longest_edge": 512})) == 512
    assert draft_size(Qwen2VLImageProcessor(min_pixels=64 * 64, max_pixels=256 * 256)) is None  # by area
    on, off = load(None, []), load(None, ["data.jpeg_draft=false"])

    class Encoder:
        image_processor = CLIPImageProcessor()

    assert encoder_draft(Encoder(), on.data) == 224 and encoder_draft(Encoder(), off.data) is None
    assert encoder_draft(object(), on.data) is None and encoder_draft(None, on.data) is None


@pytest.mark.parametrize(
    ("size", "target", "decoded"),
    [
        ((640, 480), 224, (320, 240)),  # 1/2: 240 >= 224, 1/4 would give 120
        ((640, 480), 100, (160, 120)),  # 1/4
        ((640, 480), 60, (80, 60)),  # 1/8
        ((640, 480), 384, (640, 480)),  # 480 / 2 = 240 < 384: full size
        ((447, 447), 224, (447, 447)),  # not twice the target: full size
    ],
)
def test_draft_reduces_only_while_both_sides_stay_at_least_the_target(tmp_path, size, target, decoded):
    path = jpeg(tmp_path / "a.jpg", photo(*size))
    image = load_image(path, draft=target)
    assert image.size == decoded and min(image.size) >= target
    if decoded == size:  # no reduction: bit-identical to the full decode
        assert np.array_equal(np.asarray(image), np.asarray(load_image(path)))


def test_draft_is_never_smaller_than_the_target(tmp_path):
    for w, h in [(1000, 700), (449, 1201), (225, 2000), (2400, 1800), (643, 481), (150, 100)]:
        path = jpeg(tmp_path / f"{w}x{h}.jpg", photo(w, h))
        for target in (64, 224, 384):
            got = load_image(path, draft=target).size
            k = round(w / got[0])  # the scale libjpeg used
            assert k in (1, 2, 4, 8) and got == (-(-w // k), -(-h // k)), (w, h, target, got)
            assert min(got) >= min(target, w, h), (w, h, target, got)  # never below the target
            assert k == 8 or min(w, h) // (2 * k) < target  # and reduced as far as that allows


def test_draft_follows_exif_orientation_and_ignores_other_formats(tmp_path):
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees on display
    path = jpeg(tmp_path / "rotated.jpg", photo(640, 480), exif=exif.tobytes())
    full, drafted = load_image(path), load_image(path, draft=224)
    assert full.size == (480, 640) and drafted.size == (240, 320)  # upright either way
    png = tmp_path / "a.png"
    photo(640, 480).save(png)
    assert np.array_equal(np.asarray(load_image(png, draft=224)), np.asarray(load_image(png)))


def processor_output_levels(processor, a: Image.Image, b: Image.Image) -> np.ndarray:
    """|processor(a) - processor(b)| in grey levels of the 0-255 input scale."""
    x = processor(images=[a], return_tensors="np")["pixel_values"][0]
    y = processor(images=[b], return_tensors="np")["pixel_values"][0]
    return np.abs(x - y) * np.array(processor.image_std).reshape(3, 1, 1) * 255


@pytest.mark.parametrize(
    ("processor", "size"),
    [
        (CLIPImageProcessor(), (640, 480)),
        (CLIPImageProcessor(), (1280, 960)),
        (BlipImageProcessor(size={"height": 384, "width": 384}), (1280, 960)),
    ],
)
def test_draft_changes_the_processor_output_by_about_one_grey_level_on_photos(processor, size):
    # What data.jpeg_draft costs (docs/data.md): the DCT scaling is another low-pass filter than the processor's
    # antialiased resize. On photo-like JPEGs the processor's output moves by about 1 grey level on average (measured
    # 0.8-1.2), at most a few (measured 6-8); a draft below the processor's size (which it would then upsample)
    # moves it several times more (checked below), so the bound tells the rule from a wrong one.
    buf = io.BytesIO()
    photo(*size, seed=7).save(buf, "JPEG", quality=90)
    data = buf.getvalue()

    def decode(box: int | None) -> Image.Image:
        image = Image.open(io.BytesIO(data))
        if box:
            image.draft(None, (box, box))
        return image.convert("RGB")

    target = draft_size(processor)
    assert decode(target).size[0] < size[0]  # the draft does reduce here
    diff = processor_output_levels(processor, decode(None), decode(target))
    assert diff.mean() < 2.0 and diff.max() < 16
    too_small = processor_output_levels(processor, decode(None), decode(target // 4))
    assert too_small.mean() > 3 * diff.mean()
