"""Faithfulness of captions to the world's scene graphs: precision, recall and hallucination counts.

Only the embedded world has scene graphs, so only there can a caption be checked fact by fact. Each caption is parsed
into facts by :func:`finecap.world.facts.faithfulness` (see that module for the parsing rules and for which facts
count for recall); this module aggregates over a set of captions.

Reported (keys of :func:`faithfulness`):

- ``faith/precision``: mean over captions of (true stated facts / stated facts); a caption that states nothing has
  precision 1 (no claim, nothing false), as in :mod:`finecap.world.facts`, and no hallucination: read it with
  ``faith/no_facts`` (docs/metrics.md#faithfulness-on-the-world).
- ``faith/recall``: mean over captions of (scene facts stated / scene facts).
- ``faith/precision_micro``: all true stated facts / all stated facts (pooled; captions stating many facts weigh
  more). 1.0 when no caption states anything.
- ``faith/facts``: mean number of facts stated per caption.
- ``faith/no_facts``: share of captions that state no fact the parser reads (each counted as precision 1 and no
  hallucination above).
- ``faith/hallucinated``: total number of hallucinated (false) facts over all captions.
- ``faith/halluc_rate``: share of captions with at least one hallucinated fact.
- ``faith/halluc/<kind>``: number of hallucinated facts of each kind of :data:`finecap.world.facts.FACT_KINDS`
  (``object``, ``color``, ..., ``relation``); every kind is reported, 0 included.

Example::

    >>> from finecap.world.scene import Obj, Scene
    >>> scene = Scene(0, "grass", [Obj("circle", "red", "large", 1, 1)])
    >>> out = faithfulness({0: "a blue circle"}, {0: scene})
    >>> out["faith/precision"], out["faith/halluc/color"]   # object(circle) true, color(circle)=blue false
    (0.5, 1.0)
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any

from finecap.data.records import id_key, refuse_repeated_ids
from finecap.world.facts import FACT_KINDS
from finecap.world.facts import faithfulness as caption_faithfulness

if TYPE_CHECKING:
    from finecap.world.facts import Faithfulness
    from finecap.world.scene import Scene

__all__ = ["SILENT_NOTE", "faithfulness", "faithfulness_per_item", "mostly_silent"]

SILENT_SHARE = 0.5
"""Above this share of captions stating no fact (``faith/no_facts``), ``finecap eval`` and the report say so."""
SILENT_NOTE = (
    "state no fact the world's parser reads; each such caption counts as faith/precision 1 and no hallucination, so "
    "faith/precision and faith/halluc_rate say little about them (docs/metrics.md#faithfulness-on-the-world)"
)
"""What the note on mostly silent captions says after its subject (:func:`mostly_silent`)."""


def faithfulness_per_item(
    predictions: Mapping[Hashable, str], scenes: Mapping[Hashable, Scene]
) -> tuple[dict[str, float], dict[Hashable, Faithfulness]]:
    """Corpus scores (see the module docstring) and the per-caption :class:`~finecap.world.facts.Faithfulness`.

    Args:
        predictions: ``{image_id: caption}``.
        scenes: ``{image_id: Scene}``; every predicted image needs its scene (extra scenes are ignored). String ids
            that spell an integer (``"12"``) also find the scene of integer id 12, since JSON keys are strings.

    Two predictions, or scenes, keyed by ids naming one image (``1`` and ``"1"``) are a ``ValueError``
    (:func:`~finecap.data.records.refuse_repeated_ids`).
    """
    if not predictions:
        raise ValueError("faithfulness: no predictions to score")
    refuse_repeated_ids(predictions, "faithfulness predictions")  # one image's two captions: counted twice
    refuse_repeated_ids(scenes, "faithfulness scenes")  # which scene is the truth: no silent choice
    items: dict[Hashable, Faithfulness] = {}
    missing = []
    for image_id, caption in predictions.items():
        scene = scene_of(image_id, scenes)
        if scene is None:
            missing.append(image_id)
            continue
        if not isinstance(caption, str):
            raise ValueError(f"faithfulness: caption of image {image_id!r} must be a string, got {type(caption)}")
        items[image_id] = caption_faithfulness(caption, scene)
    if missing:
        raise ValueError(
            f"faithfulness: no scene graph for {len(missing)} predicted image(s), e.g. {missing[:5]} "
            "(scene graphs exist only for the world's images; drop 'faithfulness' from the metrics otherwise)"
        )
    n = len(items)
    stated = sum(f.n_stated for f in items.values())
    correct = sum(f.n_correct for f in items.values())
    per_kind = dict.fromkeys(FACT_KINDS, 0)
    for f in items.values():
        for fact in f.hallucinated:
            per_kind[fact.kind] = per_kind.get(fact.kind, 0) + 1
    corpus = {
        "faith/precision": sum(f.precision for f in items.values()) / n,
        "faith/recall": sum(f.recall for f in items.values()) / n,
        "faith/precision_micro": correct / stated if stated else 1.0,
        "faith/facts": stated / n,
        "faith/no_facts": sum(1 for f in items.values() if f.n_stated == 0) / n,
        "faith/hallucinated": float(sum(len(f.hallucinated) for f in items.values())),
        "faith/halluc_rate": sum(1 for f in items.values() if f.hallucinated) / n,
    }
    corpus.update({f"faith/halluc/{kind}": float(count) for kind, count in per_kind.items()})
    return corpus, items


def faithfulness(predictions: Mapping[Hashable, str], scenes: Mapping[Hashable, Scene]) -> dict[str, float]:
    """Corpus faithfulness scores of ``{image_id: caption}`` against ``{image_id: Scene}`` (module docstring)."""
    return faithfulness_per_item(predictions, scenes)[0]


def mostly_silent(values: Mapping[str, Any]) -> float | None:
    """``faith/no_facts`` of scores ``values`` when over :data:`SILENT_SHARE` (most captions state no fact, so
    precision 1 and no hallucination are theirs by definition: :data:`SILENT_NOTE`), else ``None``.

    Example::

        >>> mostly_silent({"faith/no_facts": 0.75}), mostly_silent({"faith/no_facts": 0.5}), mostly_silent({})
        (0.75, None, None)
    """
    share = values.get("faith/no_facts")
    return float(share) if isinstance(share, int | float) and share > SILENT_SHARE else None


def scene_of(image_id: Hashable, scenes: Mapping[Hashable, Scene]) -> Scene | None:
    """The scene of ``image_id`` in ``scenes``, whether either side keys it as an int or as that int's string (data
    files give ids as strings, the world as ints); ``None`` when there is none."""
    key = id_key(image_id, scenes)
    return scenes[key] if key is not None else None
