"""finecap.world: a procedurally generated image world with known scene graphs.

- :mod:`finecap.world.scene`: scene graphs (:class:`Scene`, :class:`Obj`), sampling, families, integer labels.
- :mod:`finecap.world.render`: Pillow rendering.
- :mod:`finecap.world.captions`: reference and dense captions, the vocabulary.
- :mod:`finecap.world.facts`: caption -> facts, faithfulness.
- :mod:`finecap.world.make`: writing and loading the data set (``finecap world make``).
"""

from finecap.world.scene import BACKGROUNDS, COLORS, LABEL_SIZES, PATTERNS, SHAPES, SIZES, Obj, Scene, scene_labels

__all__ = ["BACKGROUNDS", "COLORS", "LABEL_SIZES", "PATTERNS", "SHAPES", "SIZES", "Obj", "Scene", "scene_labels"]
