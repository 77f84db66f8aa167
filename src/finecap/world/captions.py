"""Reference captions (five per scene, human-style) and the dense caption (every fact) of a scene.

Captions are lowercase words separated by single spaces, no punctuation. Every word any caption can contain is in
:func:`vocabulary`.

Caption length tracks information: each fact costs about the same number of words in every template and no template
has words that state nothing. The word costs are

=====================  =================================================  ======
fact                   phrase                                             words
=====================  =================================================  ======
object (shape)         ``a circle`` (article + shape word)                2
colour, size, pattern  one adjective in the noun phrase                   1
position               ``at the top left``, ``in the middle``, ...        3-4
background             ``on grass``, ``on the sand``, ...                 2-3
count                  ``three shapes`` / ``a single`` (1 object)         2 / 1
relation               ``left of``, ``above`` + the other noun phrase     1-2
=====================  =================================================  ======

plus at most one connector (``and`` / ``with``) per extra noun phrase. Templates (:data:`TEMPLATES`):

- ``describe``: the main object with some attributes, optionally its position and the background.
  ``a large red striped circle at the top left on grass``
- ``pair``: main object and one or two others joined by ``and``, each with optional attributes and position.
  ``a red circle at the top and a blue square on the left``
- ``relation``: main object, a relation and another object. ``a red circle above a small blue square on the sand``
- ``count``: the object count, the background, then the main object.
  ``three shapes on the beach with a red circle in the middle`` (one object: ``a single red circle on grass``)

Vagueness: a caption always names the main object's shape, but may state few facts (``a circle on the grass``) and
may refer to another object with a vague noun (``shape``/``object``/``thing``) carrying exactly one attribute
(``a red circle above a blue shape``); vague nouns state no fact themselves (see :mod:`finecap.world.facts`).
Complementary facets: across the five captions of a scene, facts not yet mentioned are more likely to be included,
and the templates are drawn without replacement before any repeats.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from finecap.world.scene import CELLS, RELATIONS, Obj, Scene, relation_holds
from finecap.world.shift import DETAIL_FACTOR, SYNONYM_PROB

SHAPE_WORDS: dict[str, list[str]] = {
    "circle": ["circle", "disc"],
    "square": ["square"],
    "triangle": ["triangle"],
    "star": ["star"],
    "cross": ["cross"],
    "diamond": ["diamond", "rhombus"],
}
COLOR_WORDS: dict[str, list[str]] = {
    "red": ["red"],
    "orange": ["orange"],
    "yellow": ["yellow"],
    "green": ["green"],
    "cyan": ["cyan", "turquoise"],
    "blue": ["blue"],
    "purple": ["purple", "violet"],
    "pink": ["pink"],
}
SIZE_WORDS: dict[str, list[str]] = {"small": ["small", "little", "tiny"], "large": ["large", "big"]}
PATTERN_WORDS: dict[str, list[str]] = {"striped": ["striped", "stripy"], "dotted": ["dotted", "spotted"]}
BACKGROUND_PHRASES: dict[str, list[str]] = {
    "grass": ["on grass", "on the grass", "on the lawn"],
    "sand": ["on sand", "on the sand", "on the beach"],
    "water": ["on water", "on the water", "in the water"],
    "snow": ["on snow", "on the snow", "in the snow"],
    "brick": ["on bricks", "on the bricks", "on brick"],
    "wood": ["on wood", "on the wood", "on planks"],
}
_ROW = {0: ["top", "upper"], 2: ["bottom", "lower"]}
_COL = {0: "left", 2: "right"}


def position_phrases(cell: int) -> list[str]:
    """Phrases naming grid cell ``cell`` (row * 3 + col); the first is the canonical one used by dense captions."""
    row, col = divmod(cell, 3)
    if row == 1 and col == 1:
        return ["in the middle", "in the center", "in the centre"]
    if row == 1:
        return [f"on the {_COL[col]}"]
    if col == 1:
        return [f"at the {_ROW[row][0]}"]
    return [f"at the {r} {_COL[col]}" for r in _ROW[row]] + [f"in the {_ROW[row][0]} {_COL[col]}"]


RELATION_WORDS: dict[str, list[str]] = {
    "left of": ["left of"],
    "right of": ["right of"],
    "above": ["above"],
    "below": ["below", "under"],
}
VAGUE_NOUNS: list[str] = ["shape", "object", "thing"]
PLURAL_NOUNS: list[str] = ["shapes", "objects", "things"]
NUMBER_WORDS: dict[int, str] = {2: "two", 3: "three", 4: "four"}
SINGLE_WORDS: list[str] = ["single", "one"]
"""``a single red circle`` / dense ``one shape``: the count of a one-object scene."""
FUNCTION_WORDS: list[str] = ["a", "an", "the", "and", "with", "at", "in", "on", "of"]

MIN_WORDS, MAX_WORDS = 5, 14
_VAGUE_PROB = 0.2


def vocabulary() -> list[str]:
    """Every word any caption can contain (sorted, stable)."""
    words: set[str] = set(FUNCTION_WORDS) | set(VAGUE_NOUNS) | set(PLURAL_NOUNS) | set(SINGLE_WORDS)
    words |= set(NUMBER_WORDS.values())
    for table in (SHAPE_WORDS, COLOR_WORDS, SIZE_WORDS, PATTERN_WORDS, RELATION_WORDS, BACKGROUND_PHRASES):
        for phrases in table.values():
            for p in phrases:
                words.update(p.split())
    for cell in range(len(CELLS)):
        for p in position_phrases(cell):
            words.update(p.split())
    return sorted(words)


def relations(a: Obj, b: Obj) -> list[str]:
    """Relations that hold from ``a`` to ``b`` (``a`` is <relation> ``b``), from their grid cells, in the order of
    :data:`~finecap.world.scene.RELATIONS`."""
    return [rel for rel in RELATIONS if relation_holds(rel, a.cell, b.cell)]


# ---------------------------------------------------------------------------------------------------------------------
# Phrase builders
# ---------------------------------------------------------------------------------------------------------------------


class _Writer:
    """Builds captions for one scene, remembering which facets were mentioned to favour new ones.

    ``style="domain"``: the shifted domain's annotators (:mod:`finecap.world.shift`): rarer synonyms, more detail.
    """

    def __init__(self, scene: Scene, rng: random.Random, style: str = "none") -> None:
        self.scene = scene
        self.rng = rng
        self.mentioned: set[tuple] = set()
        self.style = style

    def want(self, facet: tuple, p: float) -> bool:
        """Include ``facet`` with probability ``p`` (halved if an earlier caption already mentioned it)."""
        if facet in self.mentioned:
            p *= 0.5
        if self.style != "none":
            p = min(0.95, p * DETAIL_FACTOR)
        return self.rng.random() < p

    def pick(self, words: list[str]) -> str:
        if self.style != "none" and len(words) > 1 and self.rng.random() < SYNONYM_PROB:
            return self.rng.choice(words[1:])
        return self.rng.choice(words)

    def noun_phrase(self, o: Obj, main: bool, article: bool = True, p_attr: float = 0.5) -> tuple[str, set]:
        """``a [size] [colour] [pattern] shape``; non-main objects are sometimes vague with exactly one attribute."""
        facets: set[tuple] = set()
        attrs: list[tuple[str, str]] = []  # (kind, word) in English adjective order
        if not main and self.rng.random() < _VAGUE_PROB:
            kinds = ["color", "size"] + (["pattern"] if o.pattern else [])
            kind = self.rng.choice(kinds)
            attrs = [(kind, self._adjective(o, kind))]
            noun = self.pick(VAGUE_NOUNS)
            facets.add(("vague", o.shape, kind))
        else:
            for kind, p in (("size", 0.4 * p_attr / 0.5), ("color", 0.75 if main else p_attr + 0.15),
                            ("pattern", 0.8 if main else p_attr + 0.1)):  # fmt: skip
                if kind == "pattern" and not o.pattern:
                    continue
                if self.want((kind, o.shape), min(p, 0.95)):
                    attrs.append((kind, self._adjective(o, kind)))
                    facets.add((kind, o.shape))
            noun = self.pick(SHAPE_WORDS[o.shape])
            facets.add(("object", o.shape))
        words = [w for _, w in attrs] + [noun]
        return " ".join(([_article(words[0])] if article else []) + words), facets

    def _adjective(self, o: Obj, kind: str) -> str:
        if kind == "color":
            return self.pick(COLOR_WORDS[o.color])
        if kind == "size":
            return self.pick(SIZE_WORDS[o.size])
        assert o.pattern is not None
        return self.pick(PATTERN_WORDS[o.pattern])

    def position(self, o: Obj, p: float) -> tuple[str, set]:
        if self.want(("position", o.shape), p):
            return self.pick(position_phrases(o.cell)), {("position", o.shape)}
        return "", set()

    def background(self, p: float) -> tuple[str, set]:
        if self.want(("background",), p):
            return self.pick(BACKGROUND_PHRASES[self.scene.background]), {("background",)}
        return "", set()

    def others(self, k: int) -> list[Obj]:
        rest = list(self.scene.objects[1:])
        self.rng.shuffle(rest)
        # Prefer objects not yet mentioned at all.
        rest.sort(key=lambda o: ("object", o.shape) in self.mentioned)
        return rest[:k]


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _join(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def _describe(w: _Writer) -> tuple[str, set]:
    m = w.scene.main
    np_, f1 = w.noun_phrase(m, main=True, p_attr=0.7)
    pos, f2 = w.position(m, 0.6)
    bg, f3 = w.background(0.6)
    return _join(np_, pos, bg), f1 | f2 | f3


def _pair(w: _Writer) -> tuple[str, set]:
    objs = [w.scene.main] + w.others(2 if len(w.scene.objects) > 2 and w.rng.random() < 0.3 else 1)
    parts, facets = [], set()
    for i, o in enumerate(objs):
        np_, f1 = w.noun_phrase(o, main=i == 0, p_attr=0.4)
        pos, f2 = w.position(o, 0.35)
        parts.append(_join("and" if i > 0 else "", np_, pos))
        facets |= f1 | f2
    bg, f3 = w.background(0.3)
    return _join(*parts, bg), facets | f3


def _relation(w: _Writer) -> tuple[str, set]:
    m = w.scene.main
    (o,) = w.others(1)
    a, b = (m, o) if w.rng.random() < 0.75 else (o, m)
    rel = w.rng.choice(relations(a, b))
    np_a, f1 = w.noun_phrase(a, main=a is m, p_attr=0.45)
    np_b, f2 = w.noun_phrase(b, main=b is m, p_attr=0.45)
    bg, f3 = w.background(0.4)
    return _join(np_a, w.pick(RELATION_WORDS[rel]), np_b, bg), f1 | f2 | f3 | {("relation", a.shape, b.shape)}


def _count(w: _Writer) -> tuple[str, set]:
    m = w.scene.main
    n = len(w.scene.objects)
    bg, f3 = w.background(0.7)
    if n == 1:
        np_, f1 = w.noun_phrase(m, main=True, article=False, p_attr=0.6)
        pos, f2 = w.position(m, 0.4)
        return _join("a", w.pick(SINGLE_WORDS[:1]), np_, pos, bg), f1 | f2 | f3 | {("count",)}
    np_, f1 = w.noun_phrase(m, main=True, p_attr=0.5)
    pos, f2 = w.position(m, 0.4)
    return _join(NUMBER_WORDS[n], w.pick(PLURAL_NOUNS), bg, "with", np_, pos), f1 | f2 | f3 | {("count",)}


TEMPLATES: dict[str, Callable[[_Writer], tuple[str, set]]] = {
    "describe": _describe,
    "pair": _pair,
    "relation": _relation,
    "count": _count,
}
"""Reference-caption templates (see the module docstring); ``pair`` and ``relation`` need two objects."""


def applicable_templates(scene: Scene) -> list[str]:
    return [t for t in TEMPLATES if len(scene.objects) > 1 or t not in ("pair", "relation")]


def template_caption(name: str, scene: Scene, rng: random.Random, writer: _Writer | None = None) -> str:
    """One caption of template ``name`` with MIN_WORDS..MAX_WORDS words (retries, then a short fallback)."""
    w = writer or _Writer(scene, rng)
    for _ in range(30):
        text, facets = TEMPLATES[name](w)
        if MIN_WORDS <= len(text.split()) <= MAX_WORDS:
            w.mentioned |= facets
            return text
    m = scene.main
    w.mentioned |= {("object", m.shape), ("color", m.shape), ("background",)}
    color = COLOR_WORDS[m.color][0]
    return _join(_article(color), color, SHAPE_WORDS[m.shape][0], BACKGROUND_PHRASES[scene.background][0])


def reference_captions(scene: Scene, rng: random.Random, n: int = 5, style: str = "none") -> list[str]:
    """``n`` human-style captions naming the main object and complementary subsets of the other facts (``style``:
    the annotators, ``world.shift``)."""
    w = _Writer(scene, rng, style)
    names = applicable_templates(scene)
    order: list[str] = []
    while len(order) < n:
        batch = list(names)
        rng.shuffle(batch)
        order += batch
    return [template_caption(t, scene, rng, w) for t in order[:n]]


def dense_caption(scene: Scene) -> str:
    """Every fact of the scene in canonical words: count, background, then each object with all its attributes.

    ``two shapes on grass a large red striped circle at the top left and a small blue square in the middle``.
    Pairwise relations are implied by the positions and not spelled out (they are not recall facts).
    """
    n = len(scene.objects)
    parts = [f"{NUMBER_WORDS.get(n, 'one')} {'shapes' if n > 1 else 'shape'}"]
    parts.append(BACKGROUND_PHRASES[scene.background][0])
    for i, o in enumerate(scene.objects):
        words = ["and"] if i == n - 1 and i > 0 else []
        words += ["a", SIZE_WORDS[o.size][0], COLOR_WORDS[o.color][0]]
        if o.pattern:
            words.append(PATTERN_WORDS[o.pattern][0])
        words += [SHAPE_WORDS[o.shape][0], position_phrases(o.cell)[0]]
        parts.append(" ".join(words))
    return " ".join(parts)
