"""Batches for the tiny decoder-only VLMs of tests/models/ (the ``vlm_dirs`` and ``family`` fixtures are
tests/models/conftest.py's): captions, random images of two widths and the collated batch of both; and a tiny LLaVA
whose tower has a layer its image features never reach (the multi-process tests of tests/train/)."""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image

from finecap.data.datasets import model_collator
from finecap.models.presets import tiny_vlm
from finecap.models.vlm import Vlm

CAPTIONS = ["a red circle", "two blue squares on the left", "a small green triangle", "one big yellow star"]


def images(n: int, seed: int = 0) -> list[Image.Image]:
    """Random images, every second one wider (Qwen2-VL: fewer image tokens, so the prompts differ in length)."""
    g = torch.Generator().manual_seed(seed)
    return [Image.fromarray((torch.rand(16, 16 + 8 * (i % 2), 3, generator=g) * 255).byte().numpy()) for i in range(n)]


def batch_of(model: Vlm, captions=CAPTIONS, seed: int = 0, pictures: list[Image.Image] | None = None) -> dict:
    """The model's collated training batch of ``captions``, one image each: ``pictures``, else random ones
    (:func:`images`)."""
    pictures = images(len(captions), seed) if pictures is None else pictures
    items = [{"caption": c, "image": im, "image_id": i, "references": [c], "index": i}
             for i, (c, im) in enumerate(zip(captions, pictures, strict=True))]  # fmt: skip
    return model_collator(model, 12)(items)


def save_llava_reading_a_hidden_layer(out: Path) -> Path:
    """A tiny LLaVA whose language model reads the first of its tower's 2 layers (``vision_feature_layer=-2``,
    LLaVA-1.5's choice): the last layer never reaches the captioner, so no LoRA adapters go there (under DDP a trained
    parameter that gets no gradient stops the run at its second step); in a sharded run the other process, built on
    the meta device where that cannot be probed, adapts it and then drops them
    (:func:`finecap.models.sharding.match_main`)."""
    torch.manual_seed(0)
    model, processor = tiny_vlm("llava", layers=1, vision={"num_hidden_layers": 2})
    model.config.vision_feature_layer = -2
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out
