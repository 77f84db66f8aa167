"""The tiny worlds the boost tests read. A world folder answers only to its own settings, so every configuration
that reads one names them: ``load(None, [*world_items(path), ...])``."""

from pathlib import Path

from finecap.config import load
from finecap.world.make import make_world

SETTINGS = ("world.n_train=24", "world.n_val=4", "world.n_test=4")
"""32 images."""


def world_items(path: Path, settings: tuple[str, ...] = SETTINGS) -> list[str]:
    return [f"world.out={path}", *settings]


def make_tiny_world(path: Path, settings: tuple[str, ...] = SETTINGS) -> Path:
    make_world(load(None, world_items(path, settings)).world, progress=False)
    return path
