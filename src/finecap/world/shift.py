"""The shifted test domain of the world (``world.shift=domain``), for cross-domain transfer (DiscriTune Sec. 4).

DiscriTune trains on COCO and tests on other data sets (Flickr30k, nocaps, Conceptual Captions, Concadia), whose
images and reference captions differ from COCO's: other scenes, more clutter, other annotators with other
guidelines and words. The shifted world differs from the training world in the same three ways, always within what
the fact parser reads (:mod:`finecap.world.facts`), so faithfulness and the listener stay exact:

- **Scenes**: more cluttered: 3 or 4 objects (training: 1-4, uniform), and patterns twice as frequent
  (:data:`PATTERN_FACTOR`, capped at 1). Shapes, colours, backgrounds and the renderer are the training world's:
  no new concept appears, as in DiscriTune's transfer to data sets of everyday scenes.
- **Annotators** phrase differently: where the lexicon has synonyms they use the rarer ones (``disc``, ``rhombus``,
  ``turquoise``, ``violet``, ``tiny``, ``stripy``, ``spotted``, ``on the beach``, ``on planks``, ...) with probability
  :data:`SYNONYM_PROB` (training annotators pick uniformly), and they mention every optional detail
  :data:`DETAIL_FACTOR` times as often (capped at 0.95), so references are more detailed.
- **Draws**: scenes and captions come from their own random streams (``"<seed>-domain-..."``). That makes them other
  draws, not other scenes: cluttered scenes (three or four objects at the defaults) all but never repeat a training
  scene, but with ``world.max_objects=1`` the shifted scenes are single objects again and many repeat one.

The shifted world is a world data set like any other (``finecap world make --out data/world-shifted ...
world.shift=domain``); the demo's ``transfer`` stage makes its test split only (:func:`shifted_world`).
"""

from __future__ import annotations

import dataclasses

from finecap.config import WorldConfig

MIN_OBJECTS = 3
"""Fewest objects of a shifted scene (at most ``world.max_objects``)."""
PATTERN_FACTOR = 2.0
SYNONYM_PROB = 0.7
DETAIL_FACTOR = 1.4


def scene_settings(cfg: WorldConfig) -> tuple[int, int, float, str]:
    """``(min_objects, max_objects, pattern_prob, stream tag)`` of the world's scenes under ``cfg.shift``."""
    if cfg.shift == "none":
        return cfg.min_objects, cfg.max_objects, cfg.pattern_prob, ""
    low = min(max(cfg.min_objects, MIN_OBJECTS), cfg.max_objects)
    return low, cfg.max_objects, min(1.0, cfg.pattern_prob * PATTERN_FACTOR), f"{cfg.shift}-"


def shifted_world(cfg: WorldConfig, out: str | None = None) -> WorldConfig:
    """The shifted domain's test world of the training world ``cfg``: same seed and size of test split, no train or
    val images, written to ``out`` (default ``<world.out>-shifted``; with ``world.out`` empty, empty too: the shifted
    world's own folder in the finecap home)."""
    out = out or (f"{cfg.out}-shifted" if cfg.out else "")
    return dataclasses.replace(cfg, shift="domain", n_train=0, n_val=0, out=out)
