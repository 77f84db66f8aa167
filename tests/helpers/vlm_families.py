"""Tiny random VLMs of every supported family (``finecap.models.vlm.FAMILIES``) for the family contract test
(tests/models/test_vlm_families.py): :mod:`finecap.models.tiny`'s builders (2 language-model and 2 vision layers,
every weight matrix redrawn from N(0, 0.2) so that the image matters) at a language model of width 32 with 2 heads
of 16 (half the library's default, which vLLM's CPU attention takes: these tests run finecap's decoder only, and
faster). Two processors build here only with a stand-in, named in the test id (:data:`STAND_INS`, the library's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from finecap.models import tiny
from finecap.models.tiny import STAND_INS

SIZES = tiny.Sizes(hidden=32, heads=2)
"""The tests' language-model width (module docstring)."""


def family_id(family: str) -> str:
    """The test id of a family: ``family-<model_type>``, and its stand-in's name where it has one (``pytest -k
    family`` selects every family test)."""
    return f"family-{family}" + (f"-{STAND_INS[family]}" if family in STAND_INS else "")


def tiny_family(family: str, seed: int = 0, std: float = 0.2) -> tuple[Any, Any]:
    """A random tiny model of ``family`` at the tests' sizes (weights redrawn from N(0, ``std``)) and its
    processor."""
    return tiny.tiny_family(family, seed=seed, std=std, sizes=SIZES)


def save_family(out: Any, family: str, seed: int = 0) -> Path:
    """:func:`tiny_family` saved like a Hub checkpoint: a folder for ``vlm.name=<out>``."""
    return tiny.save_family(out, family, seed=seed, sizes=SIZES)


COCO_WORDS = ["a", "red", "blue", "green", "circle", "square", "on", "left", "right", "big", "little", "of"]


def write_tiny_coco(out: Any, n_train: int = 4, n_val: int = 2, n_test: int = 2, seed: int = 0) -> tuple[Any, Any]:
    """A COCO-like Karpathy split (``dataset_coco.json``: ``filepath`` / ``filename``, ``cocoid``, ``split``, five
    ``sentences`` of ``raw`` and ``tokens`` each) with random RGB JPEGs of two sizes in ``out/images``; the captions
    are drawn from words the tiny tokenizers know. Returns (the JSON file, the image root)."""
    import json
    import random
    from pathlib import Path

    from PIL import Image

    out = Path(out)
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    entries = []
    for i, split in enumerate(["train"] * n_train + ["val"] * n_val + ["test"] * n_test):
        folder = "train2014" if split == "train" else "val2014"
        name = f"COCO_{folder}_{i:012d}.jpg"
        (out / "images" / folder).mkdir(parents=True, exist_ok=True)
        pixels = (torch.rand(24 + 8 * (i % 2), 32, 3, generator=g) * 255).byte().numpy()
        Image.fromarray(pixels).save(out / "images" / folder / name)
        sentences = []
        for _ in range(5):
            tokens = [rng.choice(COCO_WORDS) for _ in range(rng.randint(3, 6))]
            sentences.append({"raw": " ".join(tokens), "tokens": tokens})
        entries.append({"filepath": folder, "filename": name, "cocoid": 1000 + i, "imgid": i, "split": split,
                        "sentences": sentences})  # fmt: skip
    (out / "dataset_coco.json").write_text(json.dumps({"dataset": "coco", "images": entries}))
    return out / "dataset_coco.json", out / "images"
