"""The coloured-shape captioner of tests/app/test_caption_images.py and tests/api/test_api.py: noisy solid colours,
each with its caption (``a red circle`` for red, and so on), the folder a tiny ClipCap is trained on (the ``shapes``
and ``run`` fixtures of tests/conftest.py), and ``finecap caption --images`` run on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from finecap.data.results import read_results
from helpers.cli import run_cli

COLORS = {"red": (220, 30, 30), "blue": (30, 30, 220), "green": (30, 200, 30), "yellow": (230, 220, 40)}
CAPTION = {"red": "a red circle", "blue": "a blue square", "green": "a green triangle", "yellow": "a yellow star"}


def shape_image(color: str, rng: np.random.Generator) -> Image.Image:
    """A 32 x 32 image of ``color`` with pixel noise (std 20)."""
    pixels = np.array(COLORS[color])[None, None] + rng.normal(0, 20, (32, 32, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def make_shapes(root: Path) -> dict:
    """The ``shapes`` fixture (tests/conftest.py) in ``root``: ``data``, the training folder (``<color>/<i>.png`` +
    ``.txt``, 6 per colour); ``new``, one unseen image per colour (``<color>.png``); ``clip``, the tiny random CLIP."""
    from finecap.models.presets import save_tiny_clip

    rng = np.random.default_rng(0)
    for color in COLORS:
        (root / "data" / color).mkdir(parents=True)
        for i in range(6):
            shape_image(color, rng).save(root / "data" / color / f"{i}.png")
            (root / "data" / color / f"{i}.txt").write_text(CAPTION[color] + "\n")
    (root / "new").mkdir()
    for color in COLORS:
        shape_image(color, rng).save(root / "new" / f"{color}.png")
    return {"root": root, "data": root / "data", "new": root / "new",
            "clip": save_tiny_clip(root / "clip", image_size=32, patch_size=16)}  # fmt: skip


def train_shapes_run(shapes: dict) -> Path:
    """The ``run`` fixture (tests/conftest.py): trained once per session on the folder; decode.max_length=6 in its
    stored configuration (the default is 24)."""
    out = shapes["root"] / "run"
    cache = shapes["root"] / "cache"
    code, _, err = run_cli(["train", "data.format=folder", f"data.path={shapes['data']}", "data.val_fraction=0.25",
                            f"model.encoder={shapes['clip']}", "clipcap.tiny_layers=1", "clipcap.tiny_hidden=32",
                            "clipcap.tiny_heads=2", "clipcap.prefix_length=2", f"run.cache_dir={cache}",
                            "train.batch_size=16", "train.warmup_steps=2", "train.lr=3e-3", "train.max_steps=120",
                            "train.eval_samples=8", "decode.max_length=6", "--out", str(out)])  # fmt: skip
    assert code == 0, err
    return out


def results(path: Path) -> dict:
    """A COCO results file as ``{image id: caption}``."""
    return {i: caps[0] for i, caps in read_results(path).items()}


def caption(run: Path, *images: Path | str, out: Path, more: tuple[str, ...] = ()) -> dict:
    """``finecap caption --checkpoint RUN --images IMAGES --out OUT MORE``, which must succeed; the results."""
    code, _, err = run_cli(["caption", "--checkpoint", str(run), "--out", str(out), *more, "--images",
                            *map(str, images)])  # fmt: skip
    assert code == 0, err
    return results(out)
