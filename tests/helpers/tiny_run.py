"""A tiny world, a tiny random CLIP and a 1-layer ClipCap that trains in a second, and one 2-step training run with
API keys in its configuration: what the ``tiny`` and ``secret_run`` fixtures of tests/conftest.py build once per test
module for the hostile-input tests (tests/app/test_bad_inputs.py, tests/config/test_config_bounds.py,
tests/data/test_image_containment.py, tests/app/test_output_safety.py)."""

from __future__ import annotations

import os
from pathlib import Path

from helpers.cli import run_cli

KEY_IN_CONFIG = "sk-config-5ec2e7-never-in-a-file"
KEY_IN_OVERRIDE = "sk-override-77a1f0-never-in-a-file"
KEY_IN_ENV = "sk-environment-9b3d41-never-in-a-file"
KEYS = (KEY_IN_CONFIG, KEY_IN_OVERRIDE, KEY_IN_ENV)


def tiny_world_and_clip(root: Path, n_train: int, n_val: int, n_test: int) -> tuple[list[str], Path]:
    """A tiny world of ``n_train`` / ``n_val`` / ``n_test`` scenes of 32 px and a tiny random CLIP under ``root``:
    the overrides that train a 1-layer ClipCap on them (world, encoder, ClipCap sizes, feature cache), and the CLIP."""
    from finecap.config import WorldConfig
    from finecap.models.presets import save_tiny_clip
    from finecap.world.make import make_world

    world = WorldConfig(n_train=n_train, n_val=n_val, n_test=n_test, image_size=32, seed=0)
    make_world(world, out=root / "world", progress=False)
    clip = save_tiny_clip(root / "clip", image_size=32, patch_size=16)
    overrides = [f"world.out={root / 'world'}", f"world.n_train={n_train}", f"world.n_val={n_val}",
                 f"world.n_test={n_test}", "world.image_size=32", f"model.encoder={clip}", "clipcap.tiny_layers=1",
                 "clipcap.tiny_hidden=32", "clipcap.tiny_heads=2", "clipcap.prefix_length=2",
                 f"run.cache_dir={root / 'cache'}"]  # fmt: skip
    return overrides, clip


def make_tiny(root: Path) -> dict:
    """A tiny world, a tiny random CLIP and the overrides of a 1-layer ClipCap that trains in a second, under
    ``root``: ``{"root", "base" (the overrides), "clip"}``."""
    world_and_clip, clip = tiny_world_and_clip(root, 40, 8, 8)
    base = [*world_and_clip, "train.batch_size=16", "train.warmup_steps=2", "train.log_every=1",
            "train.eval_samples=8", "decode.max_length=10", "train.max_steps=2"]  # fmt: skip
    return {"root": root, "base": base, "clip": clip}


def train_with_secrets(tiny: dict) -> dict:
    """`finecap train` from a recipe holding an API key, another key as an override, a third in the environment;
    jsonl and TensorBoard trackers; 2 steps; and `finecap config` of the same. Returns the run folder (``run``), what
    training printed (``printed``) and the config command's ``(exit code, stdout, stderr)`` (``config``)."""
    root = tiny["root"]
    recipe = root / "recipe.yaml"
    recipe.write_text(f"boost:\n  llm_api_key: {KEY_IN_CONFIG}\ntrain:\n  log_with: [jsonl, tensorboard]\n")
    run = root / "run"
    saved = os.environ.get("OPENAI_API_KEY")
    os.environ["OPENAI_API_KEY"] = KEY_IN_ENV
    try:
        code, out, err = run_cli(["train", str(recipe), *tiny["base"], f"boost.vlm_api_key={KEY_IN_OVERRIDE}",
                                  "--out", str(run)])  # fmt: skip
        config = run_cli(["config", str(recipe), f"boost.vlm_api_key={KEY_IN_OVERRIDE}"])
    finally:
        if saved is None:
            os.environ.pop("OPENAI_API_KEY")
        else:
            os.environ["OPENAI_API_KEY"] = saved
    assert code == 0, err
    return {"run": run, "printed": out + err, "config": config}
