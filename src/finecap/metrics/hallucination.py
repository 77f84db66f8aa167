"""Object hallucination on real images: CHAIR (Rohrbach, Hendricks et al., EMNLP 2018) over COCO's instance
annotations, and object recall.

A caption's *object mentions* are the words (and names of several words) of an :class:`ObjectVocabulary`, each read
as the object category it names (:meth:`ObjectVocabulary.mentions`): the caption is lower-cased and split into words,
each word that is not a vocabulary word already lemmatised as a noun (``dogs`` -> ``dog``, ``men`` -> ``man``:
LemmInflect, which needs no downloaded corpora; its rules for words it does not know would read ``corgi`` as a plural),
consecutive words read as one where the vocabulary says so (``hot dog`` is no dog, ``teddy bear`` no bear, ``baby
bird`` a bird and no person, ``stove top oven`` one oven), then every word the vocabulary knows is one mention of its
category. A word repeated is mentioned again (``a dog chasing another dog``: two mentions). The COCO vocabulary
(:func:`coco_vocabulary`) is the reference code's (LisaAnne/Hallucination ``utils/chair.py``): its synonym lists of
the 80 COCO categories and its names of several words, shipped as ``finecap/metrics/data/chair_coco.txt`` (source and
license in its header; where finecap reads them otherwise than the reference, it says so).

An image's *ground-truth objects* are, as in the reference, the categories of its instance annotations
(:func:`read_instances`, a COCO ``instances_*.json``) together with the categories its reference captions mention.
A mention of a category outside them is *hallucinated*. Per caption and over the corpus:

- ``CHAIRs``: the share of captions with at least one hallucinated mention (per caption 1 or 0);
- ``CHAIRi``: hallucinated mentions / mentions, pooled over the corpus (hallucinated mentions of all captions over
  their mentions; per caption its own share, 0 when it mentions nothing, so the mean of the per-caption values is
  not the corpus value);
- ``chair/recall``: the share of an image's annotated categories (its instance annotations alone) that its caption
  mentions, averaged over the images with at least one annotated object (AMBER's "Cover"; images with none have no
  value);
- ``chair/objects``: object mentions per caption (no better direction).

Lower CHAIR is better, higher recall is better. The numbers are fractions in ``[0, 1]`` (the paper prints x100).

Example (image 1 shows a dog and a person; its caption names a dog, a man and a frisbee)::

    >>> vocab = coco_vocabulary()
    >>> [c for _, c in vocab.mentions("Two men and their dogs, one with a hot dog.")]
    ['person', 'dog', 'hot dog']
    >>> corpus, items = chair({1: "a man throws a frisbee to his dog"}, {1: frozenset({"dog", "person"})})
    >>> corpus["CHAIRs"], round(corpus["CHAIRi"], 4), corpus["chair/recall"]  # frisbee: 1 of 3 mentions
    (1.0, 0.3333, 1.0)
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

from finecap.data.records import (
    MAX_LISTED,
    DataError,
    float_ids_note,
    id_key,
    is_id,
    refuse_repeated_ids,
    require_id,
    some_ids,
)

if TYPE_CHECKING:
    from finecap.world.scene import Scene

log = logging.getLogger(__name__)

COCO_VOCABULARY = "chair_coco.txt"
"""The COCO object vocabulary's file in ``finecap/metrics/data`` (package data)."""

KEYS = ("CHAIRs", "CHAIRi", "chair/recall", "chair/objects")
"""The keys of :func:`chair`, per caption and for the corpus."""

_WORD = re.compile(r"\w+(?:-\w+)*|'\w*|[^\w\s]")  # words (hyphenated ones whole), clitics ('s), punctuation


def words(caption: str) -> list[str]:
    """The lower-cased words of ``caption`` as CHAIR reads them: hyphenated words stay whole (``t-shirt``), a clitic
    and each punctuation mark are words of their own (``dog's`` -> ``dog``, ``'s``), like NLTK's Treebank tokenizer
    that the reference uses.

    >>> words("A dog's frisbee, on the t-shirt.")
    ['a', 'dog', "'s", 'frisbee', ',', 'on', 'the', 't-shirt', '.']
    """
    return _WORD.findall(caption.lower())


@functools.lru_cache(maxsize=1 << 16)
def noun_lemma(word: str) -> str:
    """``word`` lemmatised as a noun (``dogs`` -> ``dog``, ``mice`` -> ``mouse``, ``skis`` -> ``ski``; unchanged when
    it is one already or is no word), by LemmInflect's dictionary (its rules for words it does not know). Its data
    is read on the first call."""
    if not word.isalpha():
        return word
    from lemminflect import getLemma  # deferred: its tables load on first use, never at finecap's import

    lemmas = getLemma(word, upos="NOUN")
    return lemmas[0] if lemmas else word


@dataclass(frozen=True)
class ObjectVocabulary:
    """The words that name object categories (``words``: word -> category), names of two or more words read as one
    word (``phrases``: ``"hot dog"`` -> ``"hot dog"``, ``"baby bird"`` -> ``"bird"``, ``"stove top oven"``; where
    phrases overlap, the longest from the earliest word) and words that name no object
    beside another (``unless``: ``{"seat": "toilet"}``, the seat of a toilet is no chair). Built by
    :func:`read_vocabulary` (COCO's: :func:`coco_vocabulary`) or directly (the world's: :func:`world_vocabulary`)."""

    words: Mapping[str, str]
    phrases: Mapping[str, str] = field(default_factory=dict)
    unless: Mapping[str, str] = field(default_factory=dict)

    @property
    def categories(self) -> frozenset[str]:
        """The object categories the vocabulary names."""
        return frozenset(self.words.values())

    @functools.cached_property
    def phrase_lengths(self) -> tuple[int, ...]:
        """The numbers of words of the ``phrases``, longest first (``(3, 2)`` for COCO's: ``stove top oven``)."""
        return tuple(sorted({len(p.split()) for p in self.phrases}, reverse=True))

    def mentions(self, caption: str) -> list[tuple[str, str]]:
        """``[(word, category), ...]``: the object mentions of ``caption`` in order, a repeated word each time
        (module docstring)."""
        tokens = [w if w in self.words else noun_lemma(w) for w in words(caption)]  # corgi: LemmInflect -> corgus
        merged: list[str] = []
        i = 0
        while i < len(tokens):
            for n in self.phrase_lengths:  # the longest phrase first: "stove top oven" before any two of its words
                phrase = " ".join(tokens[i : i + n])
                if i + n <= len(tokens) and phrase in self.phrases:
                    merged.append(self.phrases[phrase])
                    i += n
                    break
            else:
                merged.append(tokens[i])
                i += 1
        present = set(merged)
        return [(w, self.words[w]) for w in merged if w in self.words and self.unless.get(w) not in present]


def read_vocabulary(text: str, source: str = "vocabulary") -> ObjectVocabulary:
    """An :class:`ObjectVocabulary` from the text of a vocabulary file (``chair_coco.txt``'s format: ``#`` comments;
    a ``[synonyms]`` section of lines ``category, word, word, ...``; ``[phrases]`` lines ``word word ... = word``, two
    or more words on the left; ``[unless]`` lines ``word = other``). Words are stripped and lower-cased; a word listed
    for two categories names the later one (as in the reference). Errors name ``source``."""
    sections: dict[str, list[str]] = {"synonyms": [], "phrases": [], "unless": []}
    current = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            if current not in sections:
                raise ValueError(f"{source}: line {n}: unknown section {line}; valid: {', '.join(sections)}")
            continue
        if current is None:
            raise ValueError(f"{source}: line {n}: {line!r} before any section ([synonyms], [phrases], [unless])")
        sections[current].append(line)
    vocab: dict[str, str] = {}
    for line in sections["synonyms"]:
        names = [w.strip().lower() for w in line.split(",") if w.strip()]
        vocab.update((w, names[0]) for w in names)
    pairs: dict[str, dict[str, str]] = {"phrases": {}, "unless": {}}
    for name, table in pairs.items():
        for line in sections[name]:
            left, sep, right = (s.strip().lower() for s in line.partition("="))
            if not sep or not left or not right:
                raise ValueError(f"{source}: [{name}] line {line!r} is not 'words = word'")
            if name == "phrases" and len(left.split()) < 2:  # a phrase of one word would never be read
                raise ValueError(f"{source}: [phrases] line {line!r}: a phrase has two or more words")
            left = " ".join(left.split())  # words are matched one space apart
            table[left] = right
    if not vocab:
        raise ValueError(f"{source}: no [synonyms] lines")
    return ObjectVocabulary(vocab, pairs["phrases"], pairs["unless"])


@functools.cache
def coco_vocabulary() -> ObjectVocabulary:
    """CHAIR's vocabulary of COCO's 80 categories (the reference code's synonym lists and rules for names of several
    words; package data ``finecap/metrics/data/chair_coco.txt``), read once."""
    text = files("finecap.metrics").joinpath("data", COCO_VOCABULARY).read_text(encoding="utf-8")
    return read_vocabulary(text, COCO_VOCABULARY)


# ---------------------------------------------------------------------------------------------------------------------
# Ground truth
# ---------------------------------------------------------------------------------------------------------------------


def read_instances(
    path: str | Path, option: str = "--instances", vocabulary: ObjectVocabulary | None = None
) -> dict[int, frozenset[str]]:
    """``{image id: the categories of its instance annotations}`` of a COCO ``instances_*.json`` (``images``,
    ``annotations`` with ``image_id`` and ``category_id``, ``categories`` with ``id`` and ``name``), every image of
    its ``images`` list included (an image without annotations has none). Each category name must be one of
    ``vocabulary``'s (default COCO's). An image id is an int or a string; an integral float (``1.0``, as pandas
    writes ids) is read as its integer, as pycocotools reads it (one warning), and any other value (``true``,
    ``1.5``, a list) is refused naming its entry (:func:`~finecap.data.records.require_id`). Two ids naming one image
    (``1`` and ``"1"``, in ``images`` or ``annotations``) are refused
    (:func:`~finecap.data.records.refuse_repeated_ids`). Errors are one line naming ``option`` and the file."""
    vocabulary = vocabulary or coco_vocabulary()
    where = f"{option}: {path}"
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{where}: {'is a directory' if p.is_dir() else 'no such file'} (a COCO instances_*.json)")
    try:
        data = json.loads(p.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise DataError(f"{where}: not a JSON file ({type(e).__name__}: {str(e)[:120]}); expected a COCO "
                        "instances_*.json") from None  # fmt: skip
    if not isinstance(data, dict) or not isinstance(data.get("annotations"), list):
        raise DataError(f"{where}: not a COCO instances file: no 'annotations' list (expected instances_*.json with "
                        "'images', 'annotations' and 'categories')")  # fmt: skip
    if not isinstance(data.get("categories"), list):
        raise DataError(f"{where}: no 'categories' list (a COCO captions_*.json has none; pass instances_*.json)")
    names: dict[Any, str] = {}
    for c in data["categories"]:
        if not isinstance(c, dict) or "id" not in c or not isinstance(c.get("name"), str):
            raise DataError(f"{where}: category {str(c)[:80]} has no 'id' and 'name'")
        names[c["id"]] = c["name"].strip().lower()
    unknown = sorted({n for n in names.values() if vocabulary.words.get(n) != n})
    if unknown:
        raise DataError(f"{where}: categories {unknown[:MAX_LISTED]} are not COCO's 80 object categories, which "
                        "CHAIR's synonym lists cover")  # fmt: skip
    objects: dict[int | str, set[str]] = {}
    floats: list[float] = []  # integral float ids (1.0, as pandas writes them), read as the integers they are
    images = data.get("images") or []
    for n, image in enumerate(images if isinstance(images, list) else []):
        if isinstance(image, dict) and "id" in image:
            i = image["id"]
            objects.setdefault(i if is_id(i) else require_id(image, "id", f"{where}: images[{n}]", floats), set())
    for n, a in enumerate(data["annotations"]):
        if not isinstance(a, dict) or "image_id" not in a or "category_id" not in a:
            raise DataError(f"{where}: annotation {n} has no 'image_id' and 'category_id'")
        if a["category_id"] not in names:
            raise DataError(f"{where}: annotation {n} has category_id {a['category_id']!r}, not in 'categories'")
        i = a["image_id"]
        i = i if is_id(i) else require_id(a, "image_id", f"{where}: annotation {n}", floats)
        objects.setdefault(i, set()).add(names[a["category_id"]])
    if not objects:
        raise DataError(f"{where}: no images and no annotations")
    if floats:
        log.warning("hallucination: %s", float_ids_note(where, floats))
    refuse_repeated_ids(objects, where)  # 1 and "1": one image, whose objects a prediction's spelling would choose
    return {i: frozenset(o) for i, o in objects.items()}


def lookup_objects(image_ids: Iterable[Hashable], objects: Mapping[Hashable, frozenset[str]], source: str) -> list:
    """The object sets of ``image_ids`` in ``objects``, an id given as an int or as its string either way (results
    files give ids as strings, COCO as ints: :func:`~finecap.data.records.id_key`); a ``DataError`` naming ``source``
    lists the ids it lacks and some it has."""
    out, missing = [], []
    for i in image_ids:
        key = id_key(i, objects)
        if key is None:
            missing.append(i)
        out.append(objects[key] if key is not None else None)
    if missing:
        raise DataError(f"{source}: no objects for {len(missing)} predicted image(s), e.g. {missing[:MAX_LISTED]}; "
                        f"its ids are e.g. {some_ids(objects)} (instances of another split? Karpathy's val and test "
                        "images are COCO val2014's)")  # fmt: skip
    return out


def references_of(image_id: Hashable, references: Mapping[Hashable, Sequence[str]] | None) -> Sequence[str] | None:
    """The reference captions of ``image_id`` in ``references``, an id given as an int or as its string either way
    (as :func:`lookup_objects` finds objects); ``None`` when it has none there."""
    key = None if references is None else id_key(image_id, references)
    return None if key is None else references[key]


def ground_truth(
    annotated: frozenset[str], references: Sequence[str] | None, vocabulary: ObjectVocabulary
) -> frozenset[str]:
    """An image's ground-truth objects: its ``annotated`` categories and those its ``references`` mention (the
    reference code's ``get_annotations``: segments and captions)."""
    said = {c for r in references or () for _, c in vocabulary.mentions(r)}
    return annotated | said


# ---------------------------------------------------------------------------------------------------------------------
# Counts
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaptionChair:
    """One caption's counts: its object ``mentions`` (``(word, category)``), those ``hallucinated`` and the
    annotated categories it mentions (``recalled`` of ``annotated``)."""

    mentions: tuple[tuple[str, str], ...]
    hallucinated: tuple[tuple[str, str], ...]
    recalled: int
    annotated: int

    @property
    def chair_s(self) -> float:
        return float(bool(self.hallucinated))

    @property
    def chair_i(self) -> float:
        return len(self.hallucinated) / len(self.mentions) if self.mentions else 0.0

    @property
    def recall(self) -> float | None:
        return self.recalled / self.annotated if self.annotated else None

    def scores(self) -> dict[str, float]:
        """``{CHAIRs, CHAIRi, chair/objects}`` and ``chair/recall`` when the image has annotated objects."""
        out = {"CHAIRs": self.chair_s, "CHAIRi": self.chair_i, "chair/objects": float(len(self.mentions))}
        if self.recall is not None:
            out["chair/recall"] = self.recall
        return out


def caption_chair(
    caption: str, annotated: frozenset[str], truth: frozenset[str], vocabulary: ObjectVocabulary
) -> CaptionChair:
    """The counts of ``caption`` against its image's ground-truth objects ``truth`` (hallucination) and its
    ``annotated`` categories (recall)."""
    mentions = vocabulary.mentions(caption)
    said = {c for _, c in mentions}
    return CaptionChair(tuple(mentions), tuple(m for m in mentions if m[1] not in truth), len(said & annotated),
                        len(annotated))  # fmt: skip


def chair(
    predictions: Mapping[Hashable, str],
    objects: Mapping[Hashable, frozenset[str]],
    references: Mapping[Hashable, Sequence[str]] | None = None,
    vocabulary: ObjectVocabulary | None = None,
    source: str = "instances",
) -> tuple[dict[str, float], dict[Hashable, CaptionChair]]:
    """Corpus scores (:data:`KEYS`, module docstring) and the per-caption counts of ``{image id: caption}`` against
    ``objects`` (``{image id: annotated categories}``, :func:`read_instances`) and, when given, the images'
    ``references`` (their mentions are ground truth too). ``vocabulary``: COCO's by default. Every predicted image
    needs its objects (errors name ``source``); its objects and references are found whether they write its id as an
    int or as its string; two predictions, objects or references keyed by ids naming one image (``1`` and ``"1"``)
    are a ``ValueError`` (:func:`~finecap.data.records.refuse_repeated_ids`)."""
    if not predictions:
        raise ValueError("chair: no predictions to score")
    for what, given in (("predictions", predictions), ("objects", objects), ("references", references)):
        if given is not None:
            refuse_repeated_ids(given, f"chair {what}")  # one image's two captions: counted twice in the means
    vocabulary = vocabulary or coco_vocabulary()
    ids = list(predictions)
    items: dict[Hashable, CaptionChair] = {}
    for i, annotated in zip(ids, lookup_objects(ids, objects, source)):
        truth = ground_truth(annotated, references_of(i, references), vocabulary)
        items[i] = caption_chair(predictions[i], annotated, truth, vocabulary)
    mentions = sum(len(c.mentions) for c in items.values())
    recalls = [c.recall for c in items.values() if c.recall is not None]
    corpus = {
        "CHAIRs": sum(c.chair_s for c in items.values()) / len(items),
        "CHAIRi": sum(len(c.hallucinated) for c in items.values()) / mentions if mentions else 0.0,
        "chair/objects": mentions / len(items),
    }
    if recalls:
        corpus["chair/recall"] = sum(recalls) / len(recalls)
    return corpus, items


# ---------------------------------------------------------------------------------------------------------------------
# The world
# ---------------------------------------------------------------------------------------------------------------------


def world_vocabulary() -> ObjectVocabulary:
    """The world's object vocabulary: its six shapes and their synonyms (``disc`` is a circle, ``rhombus`` a
    diamond; :data:`finecap.world.captions.SHAPE_WORDS`). Its vague nouns (``shape``, ``object``) name none."""
    from finecap.world.captions import SHAPE_WORDS

    return ObjectVocabulary({w: shape for shape, ws in SHAPE_WORDS.items() for w in ws})


def world_objects(scenes: Mapping[Hashable, Scene]) -> dict[Hashable, frozenset[str]]:
    """``{image id: the shapes of its scene}``: the world's exact instance annotations."""
    return {i: frozenset(o.shape for o in s.objects) for i, s in scenes.items()}
