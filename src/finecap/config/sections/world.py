"""The ``world`` section: the procedurally generated world of scenes and captions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from finecap.config.fields import Section, check, doc
from finecap.config.sections.limits import (
    MAX_SPLIT,
)

WorldShift = Literal["none", "domain"]


@dataclass
class WorldConfig(Section, name="world"):
    seed: int = doc(0, "Seed of the synthetic world; the same seed gives the same scenes, images and captions.")
    n_train: int = doc(
        10000, "Number of training scenes.", ge=0, le=MAX_SPLIT, why="scenes rendered per split; COCO has 123k images"
    )
    n_val: int = doc(
        500, "Number of validation scenes.", ge=0, le=MAX_SPLIT, why="scenes rendered per split; COCO has 123k images"
    )
    n_test: int = doc(
        1000, "Number of test scenes.", ge=0, le=MAX_SPLIT, why="scenes rendered per split; COCO has 123k images"
    )
    image_size: int = doc(64, "Rendered image side in pixels.", ge=16, le=1024)
    min_objects: int = doc(1, "Fewest objects in a scene.")
    max_objects: int = doc(4, "Most objects in a scene.")
    pattern_prob: float = doc(0.3, "Probability that an object carries a pattern (stripes, dots, ...).", ge=0, le=1)
    families: int = doc(0, "Scene-family size: 0 = off; k >= 2 = groups of k scenes differing in one detail.")
    shift: WorldShift = doc("none", "Domain of the world: none = training domain; domain = the shifted test domain.")
    out: str = doc("", "Folder of the world data set; empty = <finecap home>/worlds/<world key> (FINECAP_HOME).")
    overwrite: bool = doc(False, "Replace another finecap world at world.out (only files finecap made); never others.")

    def __post_init__(self) -> None:
        super().__post_init__()
        check(
            1 <= self.min_objects <= self.max_objects <= 4,
            "world.min_objects/world.max_objects",
            "need 1 <= min_objects <= max_objects <= 4",
        )
        check(self.families == 0 or self.families >= 2, "world.families", "must be 0 (off) or >= 2")
