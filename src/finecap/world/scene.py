"""Scene graphs of the synthetic world: a background and 1-4 objects on a 3x3 grid.

Choices the issue leaves open:

- Shapes are unique within a scene, so a shape word identifies one object when captions are parsed into facts.
- ``objects[0]`` is the main object: every reference caption names it. It must be recognisable in the image, as the
  object a human annotator would lead with, or no encoder could tell which object "the main object" is: in a scene
  with several objects the main object is the only large one (all others are small); alone, it is large with
  probability 0.7. (An earlier rule, main large with p = 0.7 and others with p = 0.5, made the main object
  ambiguous in most multi-object scenes, and a linear probe could not decode its shape.)
- One object per grid cell; row 0 is the top, column 0 the left. Pairwise relations (left of, right of, above,
  below) follow from the cells: A is left of B when A's column is smaller, above B when A's row is smaller.
- Colours may repeat between objects; a pattern is drawn with probability ``pattern_prob`` (no pattern = plain).

Scene families (``families = k >= 2``): a base scene and ``k - 1`` variants, each differing from the base in exactly
one detail (see :data:`VARIANTS`). That is the scene graphs'; their images also differ in the crop of the background
texture, which the renderer draws from the scene id (:mod:`finecap.world.render`) and each member has its own id, so
about two thirds of a member's pixels differ from its base's where the detail alone changes 1-9% (the first family of
the seed-0 world with families=10, 64 px, measured on 2026-11-29). No caption can state a texture crop, so every fact
that tells members apart is still the one detail.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field, replace
from typing import Any

SHAPES: list[str] = ["circle", "square", "triangle", "star", "cross", "diamond"]
COLORS: list[str] = ["red", "orange", "yellow", "green", "cyan", "blue", "purple", "pink"]
SIZES: list[str] = ["small", "large"]
BACKGROUNDS: list[str] = ["grass", "sand", "water", "snow", "brick", "wood"]
PATTERNS: list[str] = ["striped", "dotted"]
GRID = 3
CELLS: list[str] = [
    "top left", "top", "top right",
    "left", "middle", "right",
    "bottom left", "bottom", "bottom right",
]  # fmt: skip
"""Canonical names of the grid cells, indexed by ``row * 3 + col``."""

MAX_OBJECTS = 4
MAIN_LARGE_PROB = 0.7
"""Probability that the main object of a one-object scene is large (with company it is always large)."""

LABEL_SIZES: dict[str, int] = {
    "shape": len(SHAPES),
    "color": len(COLORS),
    "size": len(SIZES),
    "position": GRID * GRID,
    "background": len(BACKGROUNDS),
    "count": MAX_OBJECTS,
}
"""Number of classes of every integer label returned by :func:`scene_labels`."""

VARIANTS: list[str] = ["color", "position", "shape", "size", "pattern", "background", "add", "remove"]
"""Kinds of single-detail changes that make a family member from its base scene."""


@dataclass(frozen=True)
class Obj:
    shape: str
    color: str
    size: str
    row: int
    col: int
    pattern: str | None = None

    @property
    def cell(self) -> int:
        return self.row * GRID + self.col


RELATIONS: list[str] = ["left of", "right of", "above", "below"]
"""The pairwise relations between objects, in the order :func:`finecap.world.captions.relations` lists them."""
CONVERSE: dict[str, str] = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
"""Each relation's converse: ``a left of b`` is ``b right of a``."""


def relation_holds(rel: str, cell_a: int, cell_b: int) -> bool:
    """Whether an object in grid cell ``cell_a`` is ``rel`` (one of :data:`RELATIONS`) an object in ``cell_b``: left
    of when its column is smaller, right of when larger, above when its row is smaller, below when larger (the one
    definition; ``KeyError`` for another ``rel``)."""
    (row_a, col_a), (row_b, col_b) = divmod(cell_a, GRID), divmod(cell_b, GRID)
    return {"left of": col_a < col_b, "right of": col_a > col_b, "above": row_a < row_b, "below": row_a > row_b}[rel]


@dataclass
class Scene:
    id: int
    background: str
    objects: list[Obj] = field(default_factory=list)

    @property
    def main(self) -> Obj:
        return self.objects[0]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "background": self.background, "objects": [asdict(o) for o in self.objects]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Scene:
        """Build a scene from :meth:`to_dict` output; bad values raise ``ValueError`` naming the key."""
        try:
            objects = [Obj(**o) for o in d["objects"]]
            scene = cls(id=int(d["id"]), background=d["background"], objects=objects)
        except (KeyError, TypeError) as e:
            raise ValueError(f"invalid scene record {d!r}: {e}") from None
        validate(scene)
        return scene


def validate(scene: Scene) -> None:
    """Raise ``ValueError`` when a scene breaks the world's rules (unknown words, a row or column that is no integer
    of the grid, shared cells or shapes)."""

    def bad(msg: str) -> None:
        raise ValueError(f"scene {scene.id}: {msg}")

    if scene.background not in BACKGROUNDS:
        bad(f"background {scene.background!r} not in {BACKGROUNDS}")
    if not 1 <= len(scene.objects) <= MAX_OBJECTS:
        bad(f"needs 1..{MAX_OBJECTS} objects, has {len(scene.objects)}")
    for o in scene.objects:
        for key, value, valid in (("shape", o.shape, SHAPES), ("color", o.color, COLORS), ("size", o.size, SIZES),
                                  ("pattern", o.pattern, [None, *PATTERNS])):  # fmt: skip
            if value not in valid:
                bad(f"{key} {value!r} not in {valid}")
        if not all(type(v) is int for v in (o.row, o.col)):  # a float or a string is no grid cell (nor is a bool)
            bad(f"cell ({o.row!r}, {o.col!r}): row and col must be integers")
        if not (0 <= o.row < GRID and 0 <= o.col < GRID):
            bad(f"cell ({o.row}, {o.col}) outside the {GRID}x{GRID} grid")
    if len({o.shape for o in scene.objects}) != len(scene.objects):
        bad("shapes must be unique within a scene")
    if len({o.cell for o in scene.objects}) != len(scene.objects):
        bad("two objects share a grid cell")
    if len(scene.objects) > 1 and [o.size for o in scene.objects] != ["large"] + ["small"] * (len(scene.objects) - 1):
        bad("with several objects the main object (objects[0]) must be the only large one")


def scene_labels(scene: Scene) -> dict[str, int]:
    """Integer labels of the main object (shape, color, size, position = row*3+col), background and count-1."""
    m = scene.main
    return {
        "shape": SHAPES.index(m.shape),
        "color": COLORS.index(m.color),
        "size": SIZES.index(m.size),
        "position": m.cell,
        "background": BACKGROUNDS.index(scene.background),
        "count": len(scene.objects) - 1,
    }


def _random_obj(rng: random.Random, shape: str, cell: int, size: str, pattern_prob: float) -> Obj:
    color = rng.choice(COLORS)
    pattern = rng.choice(PATTERNS) if rng.random() < pattern_prob else None
    return Obj(shape=shape, color=color, size=size, row=cell // GRID, col=cell % GRID, pattern=pattern)


def sample_scene(
    rng: random.Random, id: int, min_objects: int = 1, max_objects: int = MAX_OBJECTS, pattern_prob: float = 0.3
) -> Scene:
    """Draw a random scene: uniform object count, distinct shapes and cells, independent colours; the main object
    is the only large one when there are several (module docstring)."""
    n = rng.randint(min_objects, max_objects)
    shapes = rng.sample(SHAPES, n)
    cells = rng.sample(range(GRID * GRID), n)
    main_size = "large" if n > 1 or rng.random() < MAIN_LARGE_PROB else "small"
    objects = [
        _random_obj(rng, s, c, main_size if i == 0 else "small", pattern_prob)
        for i, (s, c) in enumerate(zip(shapes, cells))
    ]
    return Scene(id=id, background=rng.choice(BACKGROUNDS), objects=objects)


def perturb(
    scene: Scene, rng: random.Random, kind: str, min_objects: int = 1, max_objects: int = MAX_OBJECTS,
    pattern_prob: float = 0.3,
) -> Scene | None:  # fmt: skip
    """A copy of ``scene`` changed in exactly one detail of ``kind`` (see :data:`VARIANTS`), or None if impossible.

    ``add`` appends a new object (new shape, free cell); ``remove`` drops a non-main object; ``pattern`` switches
    plain <-> patterned or one pattern for the other. The main object stays ``objects[0]``.
    """
    objs = list(scene.objects)
    i = rng.randrange(len(objs))
    o = objs[i]
    used_cells = {x.cell for x in objs}
    used_shapes = {x.shape for x in objs}
    if kind == "color":
        objs[i] = replace(o, color=rng.choice([c for c in COLORS if c != o.color]))
    elif kind == "position":
        cell = rng.choice([c for c in range(GRID * GRID) if c not in used_cells])
        objs[i] = replace(o, row=cell // GRID, col=cell % GRID)
    elif kind == "shape":
        objs[i] = replace(o, shape=rng.choice([s for s in SHAPES if s not in used_shapes]))
    elif kind == "size":  # only a lone main object may change size: with company it must stay the large one
        if len(objs) > 1:
            return None
        objs[i] = replace(o, size="small" if o.size == "large" else "large")
    elif kind == "pattern":
        objs[i] = replace(o, pattern=rng.choice([p for p in [None, *PATTERNS] if p != o.pattern]))
    elif kind == "background":
        return Scene(scene.id, rng.choice([b for b in BACKGROUNDS if b != scene.background]), objs)
    elif kind == "add":
        if len(objs) >= max_objects or objs[0].size != "large":  # a small lone main object cannot get company
            return None
        shape = rng.choice([s for s in SHAPES if s not in used_shapes])
        cell = rng.choice([c for c in range(GRID * GRID) if c not in used_cells])
        objs.append(_random_obj(rng, shape, cell, "small", pattern_prob))
    elif kind == "remove":
        if len(objs) <= max(min_objects, 1) or len(objs) < 2:
            return None
        del objs[rng.randrange(1, len(objs))]
    else:
        raise ValueError(f"unknown variant kind {kind!r}; valid kinds: {', '.join(VARIANTS)}")
    return Scene(scene.id, scene.background, objs)


def sample_family(
    rng: random.Random, k: int, first_id: int, min_objects: int = 1, max_objects: int = MAX_OBJECTS,
    pattern_prob: float = 0.3,
) -> list[tuple[Scene, str]]:  # fmt: skip
    """A base scene and ``k - 1`` distinct variants, each one detail away from the base: ``[(scene, variant)]``.

    The variant name is ``"base"`` for the first member, else the kind from :data:`VARIANTS`.
    """
    base = sample_scene(rng, first_id, min_objects, max_objects, pattern_prob)
    members = [(base, "base")]
    seen = {_signature(base)}
    tries = 0
    while len(members) < k and tries < 200:
        tries += 1
        kind = rng.choice(VARIANTS)
        new = perturb(base, rng, kind, min_objects, max_objects, pattern_prob)
        if new is None or _signature(new) in seen:
            continue
        seen.add(_signature(new))
        new.id = first_id + len(members)
        members.append((new, kind))
    if len(members) < k:  # pragma: no cover - needs k larger than the number of one-detail variants
        raise ValueError(f"world.families={k}: could not find {k - 1} distinct one-detail variants of a scene")
    return members


def _signature(scene: Scene) -> tuple:
    return scene.background, tuple(sorted((o.shape, o.color, o.size, o.cell, o.pattern or "") for o in scene.objects))


def scene_diff(a: Scene, b: Scene) -> list[str]:
    """Details in which two scenes differ, as ``kind:shape`` strings (objects matched by shape).

    Adding or removing an object is one detail (its attributes and the count come with it); a changed main object
    shape counts as ``shape``.
    """
    diffs = []
    if a.background != b.background:
        diffs.append("background")
    sa, sb = {o.shape: o for o in a.objects}, {o.shape: o for o in b.objects}
    only_a, only_b = sorted(set(sa) - set(sb)), sorted(set(sb) - set(sa))
    # A single swapped shape with everything else equal is a shape change, not remove + add.
    if len(only_a) == 1 and len(only_b) == 1:
        oa, ob = sa[only_a[0]], sb[only_b[0]]
        if replace(oa, shape=ob.shape) == ob:
            diffs.append(f"shape:{oa.shape}")
            only_a, only_b = [], []
    diffs += [f"remove:{s}" for s in only_a] + [f"add:{s}" for s in only_b]
    for s in sorted(set(sa) & set(sb)):
        oa, ob = sa[s], sb[s]
        for key in ("color", "size", "pattern"):
            if getattr(oa, key) != getattr(ob, key):
                diffs.append(f"{key}:{s}")
        if oa.cell != ob.cell:
            diffs.append(f"position:{s}")
    return diffs
