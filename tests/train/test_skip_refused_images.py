"""Training and validation under ``data.skip_bad_images`` on the tiny Mistral 3 VLM, whose preprocessing refuses an
image of one image token (:func:`finecap.models.vlm.check_image_tokens`): such an image is left out of train and val
up front, counted and said with the images that do not decode (:func:`finecap.data.datasets.skipped_images` with the
model); without the option it stays the error naming the image and the option. Until session 46 a refused image
stopped training (a batch) and every validator (``finecap caption --skip-bad-images`` alone left it out)."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from PIL import Image

import finecap.train.validators as validators
from finecap.config import load
from finecap.data.datasets import skipped_images
from finecap.data.records import DataError
from finecap.models.vlm import Vlm
from finecap.train.run import train
from finecap.train.setup import build_data
from finecap.train.validators import caption_stats_validator, cider_validator, retrieval_validator, validation_loss
from helpers.image_files import corrupt_png
from helpers.refusals import REFUSED_SIZE, refuse_tiny_images
from helpers.vlm_families import COCO_WORDS, tiny_family

REFUSED = "gives Mistral Small 3.1 / 3.2 (Pixtral vision) one image token"


def write_data(folder: Path) -> Path:
    """A JSONL data set: 3 good train images, a tiny one (5 x 7 px: one image token) and a corrupt one; 2 good val
    images and a tiny one."""
    folder.mkdir()
    g = torch.Generator().manual_seed(0)
    rows = []
    for k, (name, split) in enumerate([("t0.png", "train"), ("tiny_train.png", "train"), ("t1.png", "train"),
                                       ("broken.png", "train"), ("t2.png", "train"), ("v0.png", "val"),
                                       ("tiny_val.png", "val"), ("v1.png", "val")]):  # fmt: skip
        if name == "broken.png":
            corrupt_png(folder / name)
        else:
            size = (7, 5) if name.startswith("tiny") else (24, 32)
            Image.fromarray((torch.rand(*size, 3, generator=g) * 255).byte().numpy()).save(folder / name)
        caption = " ".join(COCO_WORDS[(k + j) % len(COCO_WORDS)] for j in range(4))
        rows.append({"image": name, "captions": [caption], "split": split})
    data = folder / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return data


@pytest.fixture
def mistral3() -> Vlm:
    model, processor = tiny_family("mistral3")
    return Vlm(model, processor, source="tiny-mistral3").eval()


def config(tmp_path: Path, *overrides: str):
    data = write_data(tmp_path / "data")
    return load(None, ["data.format=jsonl", f"data.path={data}", "data.max_tokens=8", "decode.max_length=3",
                       "train.eval_samples=0", f"run.dir={tmp_path / 'run'}",
                       f"run.cache_dir={tmp_path / 'cache'}", *overrides])  # fmt: skip


def test_training_and_validation_leave_out_and_count_images_the_model_refuses(tmp_path, mistral3, caplog):
    cfg = config(tmp_path, "data.skip_bad_images=true")
    acc = Accelerator(cpu=True)
    with caplog.at_level(logging.WARNING, logger="finecap"):
        data = build_data(cfg, mistral3, acc, per_caption=True)
    assert [r.image_id for r in data.train.records] == ["t0.png", "t1.png", "t2.png"]
    assert [r.image_id for r in data.val.records] == ["v0.png", "v1.png"]
    assert data.skipped == 3  # the corrupt one and the two refused, as the run's last line counts them
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("data: skipped")]
    train_said = next(m for m in said if "split 'train'" in m)
    assert train_said.startswith("data: skipped 2 of 5 images of split 'train' (data.skip_bad_images=true)")
    assert "broken.png: damaged image" in train_said
    assert f"image of record 'tiny_train.png' ({tmp_path / 'data' / 'tiny_train.png'}): 5 x 7 pixels" in train_said
    assert REFUSED in train_said
    assert any("data: skipped 1 of 3 images of split 'val'" in m and "tiny_val.png" in m for m in said)
    left_out = skipped_images(cfg, "train", model=mistral3)
    assert [r.image_id for r, _ in left_out] == ["tiny_train.png", "broken.png"]  # the split's order
    assert [r.image_id for r, _ in skipped_images(cfg, "train")] == ["broken.png"]  # without the model: undecoded
    # every training example and the validation batches collate; the loss and the validators run on what is left
    batch = data.collator([data.train[i] for i in range(len(data.train))])
    assert batch["image_ids"] == ["t0.png", "t1.png", "t2.png"]
    loss = validation_loss(mistral3, data.val, data.collator, 4, acc)["loss"]
    assert math.isfinite(loss)
    with torch.no_grad():
        stats = caption_stats_validator(cfg)(mistral3, cfg, acc)
        cider = cider_validator(cfg)(mistral3, cfg, acc)
    assert set(stats) == {"length", "vocab"} and math.isfinite(cider["cider_d"])


@pytest.mark.parametrize("eval_samples", [0, 2])
def test_the_retrieval_validator_neither_captions_nor_draws_an_image_the_model_refuses(
    tmp_path, mistral3, clip_dir, monkeypatch, eval_samples
):
    # the retrieval validator's images were the validation records without the model: the refused tiny_val.png was
    # embedded and drawn as a distractor (RD2 over v0, tiny_val, v1), and with train.eval_samples=2 its images were
    # v0 and tiny_val while v0 and v1 were captioned: the evaluation stopped, v1's caption naming no retrieval image
    cfg = config(tmp_path, "data.skip_bad_images=true", f"retriever.checkpoint={clip_dir}",
                 f"train.eval_samples={eval_samples}")  # fmt: skip
    embedded: list[list] = []
    real_load = validators.load_retriever

    def load(cfg):
        retriever = real_load(cfg)
        real_embed = retriever.image_embeddings
        retriever.image_embeddings = lambda records, *a: (embedded.append([r.image_id for r in records]),
                                                          real_embed(records, *a))[1]  # fmt: skip
        return retriever

    monkeypatch.setattr(validators, "load_retriever", load)
    acc = Accelerator(cpu=True)
    validator = retrieval_validator(cfg)
    with torch.no_grad():
        values = validator(mistral3, cfg, acc)
    assert embedded == [["v0.png", "v1.png"]]  # the images captioned, and no other
    assert 0.0 <= values["r@1"] <= 1.0 and values["length"] > 0


def test_the_retrieval_validator_needs_two_images_the_model_takes(tmp_path, mistral3, clip_dir):
    cfg = config(tmp_path, "data.skip_bad_images=true", f"retriever.checkpoint={clip_dir}")
    data = Path(cfg.data.path)
    data.write_text("".join(line + "\n" for line in data.read_text().splitlines() if "v1.png" not in line))
    validator = retrieval_validator(cfg)  # v0 and tiny_val decode: two images before training
    with pytest.raises(ValueError, match=r"needs at least 2 validation images, got 1 .*the model refuses"):
        validator(mistral3, cfg, Accelerator(cpu=True))


def test_without_the_option_a_refused_image_is_the_error_naming_it_and_the_option(tmp_path, mistral3):
    cfg = config(tmp_path)
    acc = Accelerator(cpu=True)
    data = build_data(cfg, mistral3, acc, per_caption=True)
    assert data.skipped == 0 and "tiny_train.png" in [r.image_id for r in data.train.records]
    tiny = next(i for i in range(len(data.train)) if data.train.image_id(i) == "tiny_train.png")
    with pytest.raises(DataError, match=r"^image of record 'tiny_train.png' \(.*\): 5 x 7 pixels .*one image token.*"
                                        r"data\.skip_bad_images=true"):  # fmt: skip
        data.collator([data.train[tiny]])
    with pytest.raises(DataError, match=r"tiny_val.png.*one image token"), torch.no_grad():
        caption_stats_validator(cfg)(mistral3, cfg, acc)


def stand_in_data(folder: Path) -> Path:
    """A JSONL data set for the tiny ClipCap with the stand-in refusing 8 x 8 images
    (:func:`helpers.refusals.refuse_tiny_images`): train 3 good images, a tiny and a corrupt one; val the same."""
    folder.mkdir()
    rows = []
    for split, prefix in (("train", "t"), ("val", "v")):
        for k, color in enumerate(("red", "green", "blue")):
            Image.new("RGB", (32, 32), color).save(folder / f"{prefix}{k}.png")
            rows.append({"image": f"{prefix}{k}.png", "captions": [f"a {color} circle"], "split": split})
        Image.new("RGB", REFUSED_SIZE, "red").save(folder / f"tiny_{split}.png")
        corrupt_png(folder / f"broken_{split}.png")
        rows += [{"image": f"{name}_{split}.png", "captions": ["a red square"], "split": split}
                 for name in ("tiny", "broken")]  # fmt: skip
    data = folder / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return data


@pytest.mark.slow
def test_a_run_says_the_images_left_out_of_each_split_once(make_cfg, clip_dir, tmp_path, monkeypatch, caplog):
    # a run said each split's images twice: its reads before the model loads (the splits named early; the retrieval
    # validator's two images and clipcap.lm=data-tiny's vocabulary read them too) warned of those that do not decode
    # ('skipped 1 of 5'), then build_data's read with the model of every one left out ('skipped 2 of 5'); now only
    # the read with the model says them, and the evaluation's reads (the validator's captions and images) say nothing
    why = refuse_tiny_images(monkeypatch, declared=True)
    data = stand_in_data(tmp_path / "data")
    cfg = make_cfg("data.format=jsonl", f"data.path={data}", "data.skip_bad_images=true", "clipcap.lm=data-tiny",
                   "train.max_steps=1", "train.eval_every=1", "train.validators=[retrieval]",
                   f"retriever.checkpoint={clip_dir}")  # fmt: skip
    with caplog.at_level(logging.INFO, logger="finecap"):
        train(cfg)
    said = [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "skip_bad_images" in r.getMessage()
    ]
    assert len(said) == 2, said  # one a split, after the evaluation's reads too
    for split, message in zip(("train", "val"), said, strict=True):
        assert message.startswith(f"data: skipped 2 of 5 images of split {split!r} (data.skip_bad_images=true): ")
        assert f"tiny_{split}.png" in message and why in message and f"broken_{split}.png: damaged image" in message
    assert any("skipped 4 bad image(s)" in r.getMessage() for r in caplog.records)  # the run's last line
