"""The world's exact analogue of Visual Caption Boosting's text steps (NDLB Sec. 2): facts in, a caption out.

- :func:`render_facts` writes a set of :class:`~finecap.world.facts.Fact` s as one caption in the world's grammar
  (canonical words of :mod:`finecap.world.captions`) such that ``facts(render_facts(F)) == F`` for every set the
  parser can produce (tested on every reference and dense caption of a world and on hand-built sets).
- :func:`blend_facts`: BlendCap's content, the union of the facts the human captions state (nothing added).
- :func:`holistic_facts`: HolisticCap's content, BlendCap's facts plus the visual facts that do not conflict with a
  human-stated fact (the human version wins, as NDLB's merge prompt asks).

Conflict rules (the paper leaves "conflict" to the LLM; these are finecap's, stated exactly):

- a single-valued attribute of a named shape (``color``, ``size``, ``pattern``, ``position``) conflicts with a human
  fact of the same kind and shape and another value (``color(circle)=blue`` vs human ``color(circle)=red``);
- ``background`` and ``count`` conflict with a human fact of another value, and a ``count`` also conflicts when the
  humans name more distinct shapes than it says;
- any fact about a shape the humans do not name (its ``object``, attributes, positions and relations) conflicts
  when the humans state a count and already name that many distinct shapes: shapes are unique within a world scene,
  so there is no room for another one (humans "two shapes ... a square ... a diamond" vs a visual "star");
- ``relation(a r b)`` of two named shapes conflicts with a human ``relation(a r' b)`` of the opposite relation and
  with a human ``relation(b r a)``;
- a relation and positions conflict when ``r`` cannot hold: ``relation(a r b)`` (either side may be vague) with a
  human position of ``a`` or of ``b``, and ``position(a)`` with a human ``relation(a r b)`` or ``relation(b r a)``,
  under which no cell of the other side fits ``r`` (humans "a circle left of a square" vs a visual "circle on the
  right"; with human positions of both sides, ``r`` must hold between every pair of them); a side with no
  human-stated position may be in any cell. Conflicts are judged one visual fact at a time: two visual facts that
  each fit the humans may still contradict each other or, together, a human fact;
- otherwise ``object`` facts never conflict, and vague facts (``shape`` is ``None``) other than relations never do.
"""

from __future__ import annotations

from collections.abc import Iterable

from finecap.world.captions import (
    BACKGROUND_PHRASES,
    COLOR_WORDS,
    NUMBER_WORDS,
    PATTERN_WORDS,
    SHAPE_WORDS,
    SIZE_WORDS,
    position_phrases,
)
from finecap.world.facts import Fact, facts
from finecap.world.scene import CELLS, CONVERSE, relation_holds

_ADJECTIVES = {"size": SIZE_WORDS, "color": COLOR_WORDS, "pattern": PATTERN_WORDS}
_ATTRIBUTE_KINDS = ("size", "color", "pattern", "position")
_KIND_ORDER = {"object": 0, "size": 1, "color": 2, "pattern": 3, "position": 4}


def _position(value: str) -> str:
    return position_phrases(CELLS.index(value))[0]


def _noun(shape: str | None) -> str:
    return SHAPE_WORDS[shape][0] if shape is not None else "shape"


def _count_phrase(value: str) -> str:
    n = int(value)
    return f"{NUMBER_WORDS.get(n, 'one')} {'shapes' if n > 1 else 'shape'}"


def render_facts(stated: Iterable[Fact]) -> str:
    """One caption stating exactly ``stated``: counts, backgrounds, then each named shape with all its adjectives and
    positions, then each vague fact on its own vague noun, then relations (``the circle left of the square``).

    Example::

        >>> render_facts({Fact("object", "circle"), Fact("color", "circle", "red"), Fact("background", None, "sand"),
        ...               Fact("position", "circle", "top left"), Fact("count", None, "2")})
        'two shapes on sand a red circle at the top left'
    """
    stated = set(stated)
    parts = [_count_phrase(f.value or "1") for f in sorted(stated, key=str) if f.kind == "count"]
    parts += [BACKGROUND_PHRASES[f.value or ""][0] for f in sorted(stated, key=str) if f.kind == "background"]
    shapes = sorted({f.shape for f in stated if f.kind in _KIND_ORDER and f.shape is not None})
    phrases = []
    for shape in shapes:
        mine = sorted((f for f in stated if f.shape == shape and f.kind in _KIND_ORDER),
                      key=lambda f: (_KIND_ORDER[f.kind], f.value or ""))  # fmt: skip
        adjectives = [_ADJECTIVES[f.kind][f.value or ""][0] for f in mine if f.kind in _ADJECTIVES]
        positions = [_position(f.value or "") for f in mine if f.kind == "position"]
        phrases.append(" ".join(["a", *adjectives, _noun(shape), *positions]))
    for f in sorted(stated, key=str):
        if f.shape is None and f.kind in _ADJECTIVES:
            phrases.append(f"a {_ADJECTIVES[f.kind][f.value or ''][0]} shape")
        elif f.shape is None and f.kind == "position":
            phrases.append(f"a shape {_position(f.value or '')}")
    for f in sorted(stated, key=str):
        if f.kind == "relation":
            phrases.append(f"the {_noun(f.shape)} {f.value} the {_noun(f.other)}")
    return " ".join(parts + [" and ".join(phrases)] if phrases else parts)


def blend_facts(captions: Iterable[str]) -> set[Fact]:
    """The union of the facts the captions state (BlendCap adds nothing)."""
    out: set[Fact] = set()
    for c in captions:
        out |= facts(c)
    return out


def _named_shapes(stated: set[Fact]) -> set[str]:
    return {s for f in stated for s in (f.shape, f.other) if s is not None}


def _cells(shape: str | None, human: set[Fact]) -> list[int]:
    """The grid cells the humans state for ``shape`` (none for a vague side)."""
    if shape is None:
        return []
    return [CELLS.index(h.value or "") for h in human if h.kind == "position" and h.shape == shape]


def _impossible(rel: str, cells_a: list[int], cells_b: list[int]) -> bool:
    """Whether ``a rel b`` fails for some stated cell of ``a`` and some of ``b``; a side with no stated cell may be in
    any cell (``a`` on the right is left of nothing)."""
    anywhere = range(len(CELLS))
    options_a, options_b = [[c] for c in cells_a] or [anywhere], [[c] for c in cells_b] or [anywhere]
    return any(not any(relation_holds(rel, ca, cb) for ca in xa for cb in xb) for xa in options_a for xb in options_b)


def conflicts(fact: Fact, human: set[Fact]) -> bool:
    """Whether ``fact`` contradicts a human-stated fact (module docstring)."""
    if fact.shape is None and fact.kind not in ("count", "background", "relation"):
        return False
    named = _named_shapes(human)
    counts = [int(h.value or 0) for h in human if h.kind == "count"]
    if counts and len(named) >= min(counts) and not _named_shapes({fact}) <= named:
        return True  # a shape the humans leave no room for
    if fact.kind == "count" and int(fact.value or 0) < len(named):
        return True
    if fact.kind == "position":
        cell = CELLS.index(fact.value or "")
        relations = [h for h in human if h.kind == "relation"]
        if any(_impossible(h.value or "", [cell], _cells(h.other, human)) for h in relations if h.shape == fact.shape):
            return True
        if any(_impossible(h.value or "", _cells(h.shape, human), [cell]) for h in relations if h.other == fact.shape):
            return True
    if fact.kind in _ATTRIBUTE_KINDS:
        return any(h.kind == fact.kind and h.shape == fact.shape and h.value != fact.value for h in human)
    if fact.kind in ("background", "count"):
        return any(h.kind == fact.kind and h.value != fact.value for h in human)
    if fact.kind == "relation":
        a, rel, b = fact.shape, fact.value or "", fact.other
        if a is not None and b is not None and (Fact("relation", a, CONVERSE[rel], b) in human
                                                or Fact("relation", b, rel, a) in human):  # fmt: skip
            return True
        return _impossible(rel, _cells(a, human), _cells(b, human))
    return False


def holistic_facts(blend: set[Fact], visual: set[Fact], human: set[Fact] | None = None) -> set[Fact]:
    """``blend`` plus the facts of ``visual`` that conflict with no fact of ``human`` (default: ``blend``)."""
    human = blend if human is None else human
    return set(blend) | {f for f in visual if not conflicts(f, human)}
