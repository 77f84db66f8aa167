"""Odd image shapes in users' photo folders (1 x 1 px, 1-pixel strips, panoramas, 4000 x 4000 px) against every VLM
family's tiny model (tests/helpers/vlm_families.py), under the default image budget and a small
``vlm.image_max_pixels``: each is either captioned (finite first-token logits from the model's own forward) or
refused before the processor or the model runs, with an :class:`~finecap.data.images.ImageRefused` naming its size,
the family and the shapes it takes (:func:`finecap.models.vlm.check_image_shapes`,
:func:`finecap.models.vlm.check_image_tokens`), which ``data.skip_bad_images`` leaves out. Before, Qwen2/2.5/3-VL and
GLM-4V failed inside transformers' ``smart_resize`` ("absolute aspect ratio must be smaller than 200") and Mistral 3
inside Pixtral's resize ("Size must contain 'height' and 'width'": the short side scaled to 0 pixels). ClipCap's CLIP
and BLIP's processors resize every image to one square (224 / 384 px) and take all of these shapes.

Each family is built once per module (``vlms``)."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from finecap.config import VlmBackboneConfig
from finecap.data.datasets import CaptionDataset, collate_without_refused, model_collator
from finecap.data.images import ImageLimits, ImageRefused
from finecap.data.records import DataError, Record
from finecap.models.vlm import FAMILIES, Vlm
from helpers.vlm_families import tiny_family

SHAPES = [(1, 1), (2, 2), (1, 1000), (1000, 1), (3, 700), (700, 3), (1000, 60), (4000, 4000)]
"""Image sizes (width, height)."""

SMALL = 81
"""A small ``vlm.image_max_pixels`` (the least the tiny Mistral 3 takes: a side over its 8-px merge unit)."""

SMART_RESIZE = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v")
"""The families whose image processor resizes by transformers' ``smart_resize`` (an aspect ratio over 200 fails)."""

RATIO = r"longer side is at most 200 times the shorter"
PIXTRAL = r"scales the longest side to {edge} pixels .*longer side is at most {edge} times the shorter"
ONE_TOKEN = r"one image token"


def expected(family: str, budget: int | None, width: int, height: int) -> str | None:
    """The refusal (a pattern of its message) of a ``width`` x ``height`` image, ``None``: captioned. Measured on the
    tiny models (transformers 5.24); the bounds are the processors' own (smart_resize's 200:1, Pixtral's longest
    edge: 32 px by default, 9 px under :data:`SMALL`)."""
    long, short = max(width, height), min(width, height)
    if family in SMART_RESIZE:
        return RATIO if long / short > 200 else None
    if family == "mistral3":
        edge = 9 if budget == SMALL else 32
        if short * edge < long:
            return PIXTRAL.format(edge=edge)
        return ONE_TOKEN if long <= 8 else None  # the longest side within one 8-px merge unit: one token
    return None


CASES = [(f, None) for f in sorted(FAMILIES)] + [(f, SMALL) for f in ("mistral3", "qwen2_vl", "idefics3", "internvl")]


@pytest.fixture(scope="module")
def vlms() -> dict:
    """Every family's tiny model, built once; its captioners per budget made on demand."""
    built: dict = {}

    def get(family: str, budget: int | None) -> Vlm:
        if family not in built:
            built[family] = tiny_family(family)
        model, processor = built[family]
        section = VlmBackboneConfig(image_max_pixels=budget)
        return Vlm(model, processor, section, source=f"tiny-{family}").eval()

    return get


@pytest.mark.parametrize(("family", "budget"), CASES, ids=[f"family-{f}-{b or 'default'}" for f, b in CASES])
def test_odd_image_shapes_are_captioned_or_refused_naming_the_size_the_family_takes(vlms, family, budget):
    vlm = vlms(family, budget)
    refusing = any(expected(family, budget, w, h) for w, h in SHAPES)
    assert vlm.encoder.refuses_images == (refusing or FAMILIES[family].one_token_fails)  # refused_images asks it
    for width, height in SHAPES:
        image = Image.new("RGB", (width, height), (200, 30, 30))
        refusal = expected(family, budget, width, height)
        if refusal is None:
            batch = vlm.encoder.preprocess([image])
            with torch.no_grad():
                first, _ = vlm.start(vlm.prompt_of(batch))
            assert first.shape[0] == 1 and torch.isfinite(first).all(), (width, height)
            continue
        with pytest.raises(ImageRefused, match=rf"^{width} x {height} pixels.*{refusal}") as caught:
            vlm.encoder.preprocess([image])
        assert FAMILIES[family].name in str(caught.value)
        said = str(caught.value)  # both options named, in one wording
        assert said.endswith("or leave it out (data.skip_bad_images=true; finecap caption --skip-bad-images)"), said


def test_a_refused_shape_is_named_by_the_collator_and_left_out_with_skip_bad_images(vlms, tmp_path):
    """The collator names the refused image's file and the option; :func:`collate_without_refused` (what
    ``data.skip_bad_images`` and ``finecap caption --skip-bad-images`` do) leaves it out and captions the rest."""
    vlm = vlms("qwen2_vl", None)
    Image.new("RGB", (700, 3)).save(tmp_path / "strip.png")
    Image.new("RGB", (24, 16), (30, 200, 30)).save(tmp_path / "photo.png")
    records = [Record(n, tmp_path / f"{n}.png", "train", ["a red circle"]) for n in ("strip", "photo")]
    # data.max_aspect_ratio (20 by default) raised, as a data set of such strips needs: the model's refusal is next
    data = CaptionDataset(records, per_caption=False, limits=ImageLimits(max_aspect_ratio=1000))
    collate = model_collator(vlm, 8)
    with pytest.raises(DataError, match=r"^image of record 'strip' \(.*strip\.png\): 700 x 3 pixels: Qwen2-VL .*"
                                        r"data\.skip_bad_images=true"):  # fmt: skip
        collate([data[0], data[1]])
    batch, refused = collate_without_refused(collate, [data[0], data[1]])
    assert batch["image_ids"] == ["photo"] and [item["image_id"] for item, _ in refused] == ["strip"]
    assert "aspect ratio over 200:1" in refused[0][1]


def test_clipcap_and_blip_processors_take_every_odd_shape_as_one_square():
    """ClipCap's CLIP and BLIP's image processors (the presets' classes at 224 and 384 px) resize every one of
    :data:`SHAPES` to their square: nothing to refuse (their encoders declare no refusal)."""
    from finecap.models.presets import BlipImageProcessor
    from finecap.models.processors import CLIPImageProcessor

    clip = CLIPImageProcessor(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224})
    blip = BlipImageProcessor(size={"height": 384, "width": 384})
    for processor, side in ((clip, 224), (blip, 384)):
        for width, height in SHAPES:
            pixels = processor(images=[Image.new("RGB", (width, height))], return_tensors="pt")["pixel_values"]
            assert tuple(pixels.shape) == (1, 3, side, side), (type(processor).__name__, width, height)


@pytest.mark.parametrize("family", ["qwen2_vl", "mistral3"])
def test_skip_bad_images_refuses_a_shape_up_front_without_the_processor(vlms, tmp_path, monkeypatch, family):
    """``data.skip_bad_images`` asks the model about every image of the split up front
    (:func:`finecap.data.datasets.refused_images`): a family whose refusals are shape rules alone (Qwen2-VL) is asked
    by each image's size, and its processor runs on none of them; Mistral 3, whose one-token refusal needs the
    processor's output, has the images its shape rule takes preprocessed. Either way the reason is the collator's."""
    from finecap.config import load
    from finecap.data.datasets import skipped_images

    vlm = vlms(family, SMALL if family == "mistral3" else None)
    strip, photo = (1000, 60) if family == "mistral3" else (700, 3), (24, 16)  # refused by the shape rule; taken
    folder = tmp_path / "data"
    folder.mkdir()
    Image.new("RGB", strip).save(folder / "strip.png")
    Image.new("RGB", photo, (30, 200, 30)).save(folder / "photo.png")
    rows = [{"image": f"{n}.png", "captions": ["a red circle"], "split": "train"} for n in ("photo", "strip")]
    (folder / "data.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    cfg = load(None, ["data.format=jsonl", f"data.path={folder / 'data.jsonl'}", "data.skip_bad_images=true",
                      "data.max_aspect_ratio=1000", f"run.cache_dir={tmp_path / 'cache'}"])  # fmt: skip
    processed: list[tuple[int, int]] = []
    call = type(vlm.processor).__call__

    def spy(self, *args, **kwargs):
        processed.extend(im.size for row in kwargs.get("images") or () for im in row)
        return call(self, *args, **kwargs)

    monkeypatch.setattr(type(vlm.processor), "__call__", spy)
    left_out = skipped_images(cfg, "train", model=vlm)
    assert [r.image_id for r, _ in left_out] == ["strip.png"]
    assert processed == ([] if family == "qwen2_vl" else [photo])  # the strip never reaches the processor
    # the reason names the image as the collator does when the strip is collated without the option
    data = CaptionDataset([r for r, _ in left_out], per_caption=False, limits=ImageLimits(max_aspect_ratio=1000))
    with pytest.raises(DataError) as caught:
        model_collator(vlm, 8)([data[0]])
    assert left_out[0][1] == str(caught.value) and f"{strip[0]} x {strip[1]} pixels" in left_out[0][1]
