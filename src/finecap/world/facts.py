"""Facts stated by a caption, true facts of a scene, and faithfulness (precision / recall / hallucinations).

Fact types (:class:`Fact`, ``str(fact)`` in brackets):

- ``object``     a shape exists                    [``object(circle)``]
- ``color``      colour of a shape                 [``color(circle)=red``]
- ``size``       size of a shape                   [``size(circle)=large``]
- ``pattern``    pattern of a shape                [``pattern(circle)=striped``]
- ``position``   grid cell of a shape              [``position(circle)=top left``]
- ``background`` the background                    [``background=grass``]
- ``count``      number of objects                 [``count=3``]
- ``relation``   ``shape`` is left of / right of / above / below ``other`` [``relation(circle left of square)``]

Decisions the issue leaves open:

- Shapes are unique within a scene, so a shape word identifies one object and facts are keyed by shape.
- Vague nouns (``shape``, ``object``, ``thing``) state no fact themselves; attributes attached to them become facts
  with ``shape=None`` ("some object is red": ``color(*)=red``), true when any object has that attribute. A relation
  with a vague side is true when some pair of distinct objects fits it. Attributes of a vague noun are checked
  separately, not jointly.
- Recall counts the scene's facts from :func:`scene_facts`: object, colour, size, position of every object, the
  pattern of every patterned object (a plain object has no pattern fact), the background and the count. Pairwise
  relations are implied by the positions, so they are NOT recall facts, but a stated relation is checked against the
  positions and counts for precision (true or hallucinated). Vague facts also count for precision only.
- Precision is 1.0 when a caption states nothing (no claim, nothing hallucinated); recall is then 0 for any scene.
- Parsing is lenient so that ungrammatical model output still gets scored: unknown words are skipped, adjectives
  attach to the next noun (dangling adjectives are dropped), a position phrase attaches to the latest noun (or the
  next one if no noun came yet), ``left``/``right`` followed by ``of`` and ``above``/``below``/``under`` relate the
  latest noun to the next noun, and number words (``two``..``four``; ``one``/``single`` = 1) state the count.
  Repeated or contradictory statements are kept as a set: ``red blue circle`` states both colours (one is false).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NamedTuple

from finecap.world.captions import (
    BACKGROUND_PHRASES,
    COLOR_WORDS,
    NUMBER_WORDS,
    PATTERN_WORDS,
    PLURAL_NOUNS,
    SHAPE_WORDS,
    SIZE_WORDS,
    VAGUE_NOUNS,
)
from finecap.world.scene import CELLS, CONVERSE, Scene, relation_holds

FACT_KINDS = ["object", "color", "size", "pattern", "position", "background", "count", "relation"]


class Fact(NamedTuple):
    kind: str
    shape: str | None = None
    value: str | None = None
    other: str | None = None

    def __str__(self) -> str:
        s = self.shape or "*"
        if self.kind == "object":
            return f"object({s})"
        if self.kind in ("background", "count"):
            return f"{self.kind}={self.value}"
        if self.kind == "relation":
            return f"relation({s} {self.value} {self.other or '*'})"
        return f"{self.kind}({s})={self.value}"


@dataclass
class Faithfulness:
    """``precision`` = true stated facts / stated facts (1.0 when nothing is stated); ``recall`` = scene facts stated /
    scene facts; ``n_true`` = number of scene facts; ``n_correct`` = number of true stated facts."""

    precision: float
    recall: float
    n_stated: int
    n_true: int
    hallucinated: list[Fact] = field(default_factory=list)
    n_correct: int = 0
    n_recalled: int = 0


# ---------------------------------------------------------------------------------------------------------------------
# Lexicon
# ---------------------------------------------------------------------------------------------------------------------


def _invert(table: dict[str, list[str]]) -> dict[str, str]:
    return {w: k for k, ws in table.items() for w in ws}


_SHAPE = _invert(SHAPE_WORDS)
_SHAPE.update({w + ("es" if w.endswith(("s", "x")) else "s"): k for w, k in list(_SHAPE.items())})
_VAGUE = set(VAGUE_NOUNS) | set(PLURAL_NOUNS)
_ATTR: dict[str, tuple[str, str]] = {}
for _kind, _table in (("color", COLOR_WORDS), ("size", SIZE_WORDS), ("pattern", PATTERN_WORDS)):
    _ATTR.update({w: (_kind, k) for w, k in _invert(_table).items()})
_BACKGROUND: dict[str, str] = {}
for _bg, _phrases in BACKGROUND_PHRASES.items():
    for _p in _phrases:
        _BACKGROUND[_p.split()[-1]] = _bg
_BACKGROUND["brick"] = "brick"
_ROW_WORDS = {"top": 0, "upper": 0, "bottom": 2, "lower": 2}
_COL_WORDS = {"left": 0, "right": 2}
_CENTER_WORDS = {"middle", "center", "centre"}
_POSITION = set(_ROW_WORDS) | set(_COL_WORDS) | _CENTER_WORDS
_NUMBER = {w: str(n) for n, w in NUMBER_WORDS.items()} | {"one": "1", "single": "1"}
_RELATION = {"above": "above", "below": "below", "under": "below"}
_FRAME = {"image", "picture", "photo", "photograph", "scene", "frame"}
_DETERMINERS = {"the", "a", "an", "this", "that"}


def _relation_word(tokens: list[str], i: int) -> bool:
    """Whether the column word ``tokens[i]`` starts a relation ("left of the square"), not a position in the frame
    ("at the bottom right of the image": the words after "of" name the picture itself)."""
    if tokens[i] not in _COL_WORDS or i + 1 >= len(tokens) or tokens[i + 1] != "of":
        return False
    after = tokens[i + 2 : i + 4]
    if after[:1] and after[0] in _DETERMINERS:
        after = after[1:]
    return not (after[:1] and after[0] in _FRAME)


@dataclass
class _Entity:
    shape: str | None
    attrs: list[tuple[str, str]]
    cells: list[int] = field(default_factory=list)


def facts(caption: str) -> set[Fact]:
    """The facts a caption states (lenient: works on ungrammatical, repeated, truncated or shuffled output)."""
    tokens = re.findall(r"[a-z]+", caption.lower())
    entities: list[_Entity] = []
    out: set[Fact] = set()
    relations: list[tuple[_Entity, str]] = []  # (subject, relation) waiting for the next noun
    done_relations: list[tuple[_Entity, str, _Entity]] = []
    pending_attrs: list[tuple[str, str]] = []
    pending_cells: list[int] = []
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t in _ATTR:
            pending_attrs.append(_ATTR[t])
        elif t in _SHAPE or t in _VAGUE:
            e = _Entity(_SHAPE.get(t), pending_attrs, pending_cells)
            pending_attrs, pending_cells = [], []
            entities.append(e)
            done_relations += [(s, r, e) for s, r in relations]
            relations = []
        elif t in _POSITION and not _relation_word(tokens, i):
            j = i
            while j < len(tokens) and tokens[j] in _POSITION and not _relation_word(tokens, j):
                j += 1
            run = tokens[i:j]
            row = next((_ROW_WORDS[w] for w in run if w in _ROW_WORDS), 1)
            col = next((_COL_WORDS[w] for w in run if w in _COL_WORDS), 1)
            (entities[-1].cells if entities else pending_cells).append(row * 3 + col)
            pending_attrs = []
            i = j
            continue
        elif t in _RELATION or t in _COL_WORDS:  # a column word here is followed by "of"
            rel = _RELATION.get(t) or f"{t} of"
            if entities:
                relations.append((entities[-1], rel))
            pending_attrs = []
            i += 2 if t in _COL_WORDS else 1
            continue
        elif t in _BACKGROUND:
            out.add(Fact("background", None, _BACKGROUND[t]))
            pending_attrs = []
        elif t in _NUMBER:
            out.add(Fact("count", None, _NUMBER[t]))
        i += 1
    for e in entities:
        if e.shape is not None:
            out.add(Fact("object", e.shape))
        for kind, value in e.attrs:
            out.add(Fact(kind, e.shape, value))
        for cell in e.cells:
            out.add(Fact("position", e.shape, CELLS[cell]))
    for s, rel, o in done_relations:
        if s is not o:
            out.add(Fact("relation", s.shape, rel, o.shape))
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Truth
# ---------------------------------------------------------------------------------------------------------------------


def scene_facts(scene: Scene) -> set[Fact]:
    """The scene's recall facts (everything except relations, which follow from positions; see module docs)."""
    out = {Fact("background", None, scene.background), Fact("count", None, str(len(scene.objects)))}
    for o in scene.objects:
        out |= {
            Fact("object", o.shape),
            Fact("color", o.shape, o.color),
            Fact("size", o.shape, o.size),
            Fact("position", o.shape, CELLS[o.cell]),
        }
        if o.pattern:
            out.add(Fact("pattern", o.shape, o.pattern))
    return out


def is_true(fact: Fact, scene: Scene) -> bool:
    """Whether ``fact`` holds in ``scene`` (vague facts: for some object / some pair of distinct objects)."""
    objs = [o for o in scene.objects if fact.shape is None or o.shape == fact.shape]
    if fact.kind == "background":
        return scene.background == fact.value
    if fact.kind == "count":
        return str(len(scene.objects)) == fact.value
    if fact.kind == "object":
        return bool(objs)
    if fact.kind in ("color", "size", "pattern"):
        return any(getattr(o, fact.kind) == fact.value for o in objs)
    if fact.kind == "position":
        return any(CELLS[o.cell] == fact.value for o in objs)
    if fact.kind == "relation":
        others = [o for o in scene.objects if fact.other is None or o.shape == fact.other]
        return any(a is not b and relation_holds(fact.value or "", a.cell, b.cell) for a in objs for b in others)
    raise ValueError(f"unknown fact kind {fact.kind!r}; valid kinds: {', '.join(FACT_KINDS)}")


def entails(stated: set[Fact], fact: Fact) -> bool:
    """Whether facts ``stated`` (a text's, :func:`facts`) imply ``fact`` in every scene where they hold: ``fact`` is
    among them, or a relation's converse is (``square below circle`` implies ``circle above square``), or ``fact`` is
    vague (``shape``, or a relation's ``other``, ``None``) and a specific instance of it is among them (``a blue
    square`` implies ``color(*)=blue``; ``circle above square`` implies ``relation(circle above *)``).

    Example::

        >>> stated = facts("a blue square under a circle")
        >>> [entails(stated, f) for f in (Fact("relation", "circle", "above", "square"), Fact("color", None, "blue"),
        ...                               Fact("relation", "circle", "above", None), Fact("color", "circle", "blue"))]
        [True, True, True, False]
    """
    if fact in stated:
        return True

    def fits(wanted: str | None, given: str | None) -> bool:
        return wanted is None or wanted == given

    for s in stated:
        if s.kind != fact.kind:
            continue
        if fact.kind == "relation":
            forms = ((s.shape, s.value, s.other), (s.other, CONVERSE.get(s.value or ""), s.shape))
            if any(fits(fact.shape, a) and rel == fact.value and fits(fact.other, b) for a, rel, b in forms):
                return True
        elif fact.shape is None and s.value == fact.value:
            return True
    return False


def faithfulness(caption: str, scene: Scene) -> Faithfulness:
    """Precision, recall and hallucinated facts of ``caption`` against ``scene`` (see module docs for the rules)."""
    stated = facts(caption)
    truth = scene_facts(scene)
    hallucinated = sorted((f for f in stated if not is_true(f, scene)), key=str)
    n_correct = len(stated) - len(hallucinated)
    n_recalled = len(stated & truth)
    return Faithfulness(
        precision=n_correct / len(stated) if stated else 1.0,
        recall=n_recalled / len(truth),
        n_stated=len(stated),
        n_true=len(truth),
        hallucinated=hallucinated,
        n_correct=n_correct,
        n_recalled=n_recalled,
    )
