"""Shared fixtures of the training tests: a tiny generated world, a tiny random CLIP saved like a Hub checkpoint,
and a configuration for a tiny ClipCap (1-layer GPT-2 of width 32) that trains in a fraction of a second per step."""

from __future__ import annotations

from pathlib import Path

import pytest

from finecap.config import Config, WorldConfig, load

N_TRAIN, N_VAL, N_TEST = 40, 8, 8  # scenes per split of the tiny world


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory) -> Path:
    from finecap.world.make import make_world

    out = tmp_path_factory.mktemp("world")
    make_world(
        WorldConfig(n_train=N_TRAIN, n_val=N_VAL, n_test=N_TEST, image_size=32, seed=0), out=out, progress=False
    )
    return out


@pytest.fixture(scope="session")
def world_args(tiny_world) -> list[str]:
    """The tiny world as command-line overrides: its folder and its own settings (a world folder answers only to
    the settings it was made with)."""
    return [f"world.out={tiny_world}", f"world.n_train={N_TRAIN}", f"world.n_val={N_VAL}", f"world.n_test={N_TEST}",
            "world.image_size=32"]  # fmt: skip


@pytest.fixture(scope="session")
def tiny_encoder(tmp_path_factory) -> Path:
    """A random tiny ``CLIPModel`` + image processor saved with ``save_pretrained`` (what a Hub checkpoint holds).
    Its weights come from seed 0, not from whatever the global generator holds when the first test asks for it, so
    every test sees the same encoder whichever test runs first (``pytest -n``, ``-k``, another order)."""
    import torch
    from transformers import CLIPImageProcessor, CLIPModel

    from finecap.models.presets import tiny_clip_config
    from finecap.models.tokenizer import world_tokenizer

    out = tmp_path_factory.mktemp("encoder")
    tok = world_tokenizer()
    config = tiny_clip_config(len(tok), tok.eos_token_id, image_size=32, patch_size=8, hidden=32, layers=1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = CLIPModel(config)
    model.save_pretrained(out)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(out)
    return out


@pytest.fixture
def make_cfg(world_args, tiny_encoder, tmp_path):
    """``make_cfg(*overrides, run="run")``: a tiny-ClipCap configuration writing under ``tmp_path``."""

    def make(*overrides: str, run: str = "run") -> Config:
        base = [
            *world_args,
            f"model.encoder={tiny_encoder}",
            "clipcap.tiny_layers=1",
            "clipcap.tiny_hidden=32",
            "clipcap.tiny_heads=2",
            "clipcap.prefix_length=2",
            f"run.dir={tmp_path / run}",
            f"run.cache_dir={tmp_path / 'cache'}",
            "train.batch_size=16",
            "train.lr=3e-3",
            "train.warmup_steps=2",
            "train.log_every=1",
            "decode.max_length=10",
        ]
        return load(None, [*base, *overrides])

    return make


@pytest.fixture(scope="session")
def clip_dir(tmp_path_factory) -> Path:
    """A tiny random CLIP with tokenizer and image processor (captioner encoder and retriever)."""
    from finecap.models.presets import save_tiny_clip

    return save_tiny_clip(tmp_path_factory.mktemp("clip"), image_size=32, patch_size=16)


@pytest.fixture
def launch_two() -> list[str]:
    """The command prefix that starts 2 CPU processes on a free local port (:func:`helpers.launch.two_processes`):
    append ``-m finecap.app.cli train ...`` or a script."""
    from helpers.launch import two_processes

    return two_processes()


@pytest.fixture(scope="session")
def shared_launch(world_args, clip_dir, tmp_path_factory) -> Path:
    """The runs of the modules that share one launch of 2 processes (:mod:`helpers.shared_launch`), trained once for
    every xdist worker: the folder holding each module's folder and ``launch.log``."""
    from helpers.once import once_per_session
    from helpers.shared_launch import make_shared_launch

    return once_per_session(
        tmp_path_factory, "shared_launch", lambda root: make_shared_launch(root, world_args, clip_dir)
    )
