"""Batches for the tiny decoder-only VLMs of tests/models/ (the ``vlm_dirs`` and ``family`` fixtures are
tests/models/conftest.py's): captions, random images of two widths and the collated batch of both."""

from __future__ import annotations

import torch
from PIL import Image

from finecap.data.datasets import model_collator
from finecap.models.vlm import Vlm

CAPTIONS = ["a red circle", "two blue squares on the left", "a small green triangle", "one big yellow star"]


def images(n: int, seed: int = 0) -> list[Image.Image]:
    """Random images, every second one wider (Qwen2-VL: fewer image tokens, so the prompts differ in length)."""
    g = torch.Generator().manual_seed(seed)
    return [Image.fromarray((torch.rand(16, 16 + 8 * (i % 2), 3, generator=g) * 255).byte().numpy()) for i in range(n)]


def batch_of(model: Vlm, captions=CAPTIONS, seed: int = 0) -> dict:
    """The model's collated training batch of ``captions``, one random image each (:func:`images`)."""
    items = [{"caption": c, "image": im, "image_id": i, "references": [c], "index": i}
             for i, (c, im) in enumerate(zip(captions, images(len(captions), seed), strict=True))]  # fmt: skip
    return model_collator(model, 12)(items)
