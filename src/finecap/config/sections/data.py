"""The ``data`` section: the data set, its format, captions, splits, images and loading."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from finecap.config.fields import Section, check, check_at_most, doc, option_fields, subsection
from finecap.config.sections.choices import CaptionField
from finecap.config.sections.limits import (
    DEFAULT_MAX_ASPECT_RATIO,
    DEFAULT_MAX_IMAGE_PIXELS,
    MAX_BAG,
    MAX_PROCESSES,
    MAX_TOKENS,
    PIL_MAX_IMAGE_PIXELS,
)
from finecap.registry import DATA_FORMATS, SAMPLERS


@dataclass
class HfDataConfig(Section, name="data.hf"):
    """The options only a Hugging Face data set (``data.format=hf``, :mod:`finecap.data.formats.hf`) reads: which
    column holds what. Before they were a subsection they were ``data.image_column``, ...: those keys are read as
    these (:data:`~finecap.config.sections.moved.MOVED_KEYS`)."""

    image_column: str = doc("image", "Column of the image (Image feature or path string).")
    caption_column: str = doc("captions", "Column of the reference caption(s) (string or list).")
    split_column: str = doc("", "Column naming each row's split; empty = the named splits.")
    id_column: str = doc("", "Column of the image id; empty = the image path (or split/row).")
    questions_column: str = doc(
        "",
        "Column of each image's multiple-choice questions for the qa_utility reward (CapRL's layout, as JSONL's "
        "'questions': docs/data.md); empty = none.",
    )
    image_folder_column: str = doc(
        "",
        "Column of the folder joined before image_column's file name (Karpathy's filepath: val2014/COCO_...jpg); "
        "empty = none.",
    )


@dataclass
class DataConfig(Section, name="data"):
    format: str = doc(
        "world",
        f"Data set format of data.path: {', '.join(sorted(DATA_FORMATS))} (docs/data.md: one table of every format), "
        "or a dotted path 'pkg.module:FORMAT' to one's own Format (docs/architecture.md).",
    )
    path: str = doc(
        "", "Data set file (Karpathy JSON, COCO annotations, JSONL) or image folder; empty = the world at world.out."
    )
    images: str = doc("", "Image root for relative image paths; empty = next to data.path (folder: the folder).")
    allow_outside_paths: bool = doc(False, "Let records name image files outside the image root (real paths).")
    val_fraction: float = doc(
        0.0,
        "Share of the images that name no split (folder, JSONL lines without 'split') put in val, by id hash.",
        ge=0,
        lt=1,
    )
    test_fraction: float = doc(
        0.0,
        "Share of the images that name no split put in test, by id hash; the rest (all by default) is train.",
        ge=0,
        lt=1,
    )
    split_seed: int = doc(0, "Seed of the id hash of data.val_fraction / data.test_fraction (not run.seed).")
    skip_bad_images: bool = doc(
        False,
        "Decode every image once when read; skip and count those that fail or the model refuses (false: the first "
        "stops the run).",
    )
    max_image_pixels: int = doc(
        DEFAULT_MAX_IMAGE_PIXELS,
        "Images of more pixels (from the header) are refused before decoding; 64 MP: every camera's photo.",
        ge=1,
        le=PIL_MAX_IMAGE_PIXELS,
        why="PIL's decompression-bomb limit, PIL.Image.MAX_IMAGE_PIXELS: PIL refuses larger images itself",
    )
    max_aspect_ratio: float = doc(
        DEFAULT_MAX_ASPECT_RATIO,
        "Images whose longer side is more times their shorter are refused before decoding; 20: panoramas pass.",
        ge=1,
        le=1000,
        why="the image processor scales the shorter side to ~224-384 pixels; 1000:1 is then ~100 M pixels",
    )
    max_tokens: int = doc(
        48,
        "Captions are cut to this many tokens (EOS included; training warns when over 1 % are); dense world "
        "captions reach 41.",
        ge=1,
        le=MAX_TOKENS,
        why="tokens per caption; batches are this long; dense VLM captions reach ~1,000, GPT-2 reads 1,024",
    )
    max_unk_share: float = doc(
        0.02,
        "Training stops when more of the training captions' tokens than this are unknown to the captioner's "
        "tokenizer (a word-level vocabulary not made for them: use clipcap.lm=data-tiny or a pretrained LM).",
        ge=0,
        le=1,
    )
    num_workers: int = doc(
        0,
        "DataLoader worker processes decoding and preprocessing images (docs/data.md).",
        ge=0,
        le=MAX_PROCESSES,
        why="each worker is a process",
    )
    persistent_workers: bool = doc(True, "Keep the training DataLoader's workers between epochs (num_workers > 0).")
    pin_memory: bool = doc(True, "Page-locked batches for faster copies to a CUDA device (ignored without one).")
    jpeg_draft: bool = doc(
        True, "Decode JPEGs at 1/2-1/8 scale when still >= the image processor's size (docs/data.md: what changes)."
    )
    sampler: str = doc("random", "Training batch sampler (finecap.data.samplers.SAMPLERS) or 'pkg.module:factory'.")
    train_unit: Literal["auto", "caption", "image"] = doc(
        "auto", "Training examples: one per reference caption or per image (auto: the objective's; MLE: caption)."
    )
    bag_schedule: dict[int, int] = doc(
        {},
        "data.sampler=bagcurri: {end_epoch: bag_size} (0 = random batches), e.g. {1: 0, 2: 3, 3: 5, 4: 7}; sizes "
        f"0 or 2 to {MAX_BAG} (images per bag; the NDLB recipe grows bags from 2 to 20).",
    )
    bag_neighbours: int = doc(
        200,
        "data.sampler=bagcurri: nearest neighbours per image searched for bag-mates (>= the largest bag size - 1).",
        ge=1,
        le=10_000,
        why="an images x neighbours table; NDLB: 200",
    )
    captions: CaptionField = doc(
        "original", "Caption field trained on: original, a `finecap boost` field (blend/visual/holistic), world dense."
    )
    hf: HfDataConfig = subsection(HfDataConfig, "The options only data.format=hf reads: its columns (docs/data.md).")

    def __post_init__(self) -> None:
        super().__post_init__()
        held_out = self.val_fraction + self.test_fraction
        check(held_out < 1.0, "data.val_fraction/data.test_fraction",
              f"their sum must be < 1 (train keeps the rest), got {held_out:g}")  # fmt: skip
        for end, size in self.bag_schedule.items():
            check(end >= 1, "data.bag_schedule", f"end epochs must be >= 1, got {end}")
            check(size == 0 or size >= 2, "data.bag_schedule", f"bag sizes must be 0 (random) or >= 2, got {size}")
            check_at_most(size, "data.bag_schedule", MAX_BAG, "images per bag; the NDLB recipe: 2 to 20")

    def unread_options(self, cfg: Any) -> dict[str, tuple[str, str]]:
        """``data.hf.*`` under another registered format, BagCurri's options under another registered sampler (a
        format or sampler of one's own, named by dotted path, may read them)."""
        out = {}
        if self.format in DATA_FORMATS and self.format != "hf":
            have = f"data.format={self.format}"
            out |= {key: ("data.format=hf", have) for key, _, _ in option_fields(HfDataConfig, "data.hf.")}
        if self.sampler in SAMPLERS and self.sampler != "bagcurri":
            have = f"data.sampler={self.sampler}"
            out |= {f"data.{k}": ("data.sampler=bagcurri", have) for k in ("bag_schedule", "bag_neighbours")}
        return out
