"""CHAIR reward: 1 - the share of a caption's object mentions that are hallucinated (CHAIRi per caption).

The counts are the ``hallucination`` metric group's (:mod:`finecap.metrics.hallucination`): a caption's object
mentions (COCO's synonym lists and names of several words, nouns lemmatised), each hallucinated when its category is
not among the image's ground-truth objects. The reward of a caption is ``1 - hallucinated / mentions`` (1 when it
mentions no object), plus ``recall_weight`` x the share of the image's annotated objects it mentions. Parts logged
(under ``chair/``): ``CHAIRi``, ``CHAIRs`` (1 when any mention is hallucinated), ``recall`` (1 for an image with no
annotated object: nothing to miss) and ``objects`` (mentions).

A caption that names no object is never wrong: with ``recall_weight = 0`` the reward alone is highest for captions
that avoid objects, so weigh it beside a reward that pays for content (``rl.rewards: {cider: 1.0, chair: 0.5}``) or
give ``recall_weight``.

Ground truth, read in ``setup(inputs)``: ``inputs.objects`` when given (outside a run: ``objects={image_id:
categories}``); else the world's scenes (``inputs.scenes``: on the world, its shapes with the world's shape words,
:func:`finecap.metrics.hallucination.world_vocabulary`); else the instance annotations of ``eval.instances`` (a COCO
``instances_*.json``; ``instances=`` outside a run) and the objects the references (``inputs.references``: in a run
the training references) mention, as CHAIR's reference code reads them. A call's own references
(``caption_references``: the reward server's and the adapters' requests, :func:`finecap.rewards.call_batch`) replace
its image's, as the CIDEr-D and claims rewards read them: a caption's ground truth is then its image's objects and
those its call's references mention.

Example (image 1 shows a dog and a person)::

    >>> reward = ChairReward({1: frozenset({"dog", "person"})})
    >>> out = reward(["a man and his dog", "a dog chasing a cat", "a red frisbee"], {"image_ids": [1, 1, 1]})
    >>> out.total.tolist()  # no hallucination; cat: 1 of 2 mentions; frisbee: 1 of 1
    [1.0, 0.5, 0.0]
    >>> out.parts["recall"].tolist()  # dog and person; dog; neither
    [1.0, 0.5, 0.0]
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from finecap.data.records import id_key
from finecap.metrics.hallucination import (
    ObjectVocabulary,
    caption_chair,
    coco_vocabulary,
    ground_truth,
    lookup_objects,
    read_instances,
    references_of,
    world_objects,
    world_vocabulary,
)
from finecap.rewards.base import (
    CAPTION_REFERENCES,
    RewardBase,
    RewardOutput,
    caption_rows,
    keyed_table,
    number_setting,
)

if TYPE_CHECKING:
    from finecap.config import Config
    from finecap.rewards.inputs import RewardInputs


class ChairReward(RewardBase):
    """``1 - CHAIRi`` (+ ``recall_weight`` x object recall) of each caption against its image's objects (module
    docstring).

    Args:
        objects: ``{image_id: annotated categories}``; ``None``: read in :meth:`setup` (module docstring).
        references: ``{image_id: [reference captions]}`` whose mentions are ground truth too (CHAIR's reference code
            adds them); ``None``: those of :meth:`setup`'s inputs, when the objects are ``eval.instances``'.
        vocabulary: the object vocabulary (default COCO's).
        recall_weight: weight of the object recall in the total.
        instances: the COCO ``instances_*.json`` read in :meth:`setup` when no objects are given (``eval.instances``).
    Two ids of one table (the objects, the references, the scenes; given here or read in :meth:`setup`) naming one
    image (``1`` and ``"1"``) are a ``ValueError`` naming it ("chair objects: ...",
    :func:`~finecap.rewards.base.keyed_table`), as the ``chair`` metric refuses them: a caption would be checked
    against the entry its call's spelling of the id finds first.
    """

    name = "chair"
    per_caption = True  # a caption's value needs only its own image's objects
    settings = ("recall_weight",)

    def __init__(
        self,
        objects: Mapping[Hashable, frozenset[str]] | None = None,
        references: Mapping[Hashable, Sequence[str]] | None = None,
        *,
        vocabulary: ObjectVocabulary | None = None,
        recall_weight: float = 0.0,
        instances: str = "",
    ) -> None:
        self.objects = keyed_table(objects, "chair objects")
        self.references = keyed_table(references, "chair references", list) or {}
        self.vocabulary = vocabulary
        self.recall_weight = self.check_setting("recall_weight", recall_weight)
        self.instances = instances
        self._truth: dict[Hashable, frozenset[str]] = {}  # ground truth per image, computed once

    def check_setting(self, key: str, value: Any) -> Any:
        """``recall_weight``: a finite number (a ``ValueError`` naming it otherwise)."""
        return number_setting(self.name, key, value) if key == "recall_weight" else value

    def known_images(self) -> list[Hashable]:
        """The images with objects."""
        return list(self.objects or {})

    def setup(self, inputs: RewardInputs) -> None:
        """The ground truth (module docstring), once."""
        if self.objects is not None:
            return
        if inputs.objects is not None:
            if self.instances:
                raise ValueError("chair: give objects={image_id: categories} or instances=<instances_*.json> "
                                 "(eval.instances), not both")  # fmt: skip
            self.objects = keyed_table(inputs.objects, "chair objects")
        elif inputs.scenes is not None:
            self.objects = world_objects(keyed_table(inputs.scenes, "chair scenes"))
            self.vocabulary = world_vocabulary()
            return
        elif not self.instances:
            raise ValueError("chair: no object annotations: outside a training run give objects={image_id: "
                             "categories} or instances=<COCO instances_*.json>; in a run set eval.instances=<COCO "
                             "instances_*.json> (or train on the world)")  # fmt: skip
        else:
            # read_instances refuses two ids of one image itself, naming eval.instances and the file
            self.objects = read_instances(self.instances, "eval.instances")
        # one list an image, whichever way the two sides (the constructor's, the inputs') write its id
        for image_id, refs in (keyed_table(inputs.references, "chair references") or {}).items():
            key = id_key(image_id, self.references)
            self.references.setdefault(image_id if key is None else key, []).extend(refs)

    def truth(
        self, image_id: Hashable, references: Sequence[str] | None = None
    ) -> tuple[frozenset[str], frozenset[str]]:
        """(annotated categories, ground-truth objects) of ``image_id``, its objects and references found whether
        either side writes the id as an int or as its string; ``references``: a call's own, in place of the image's
        (module docstring)."""
        (annotated,) = lookup_objects([image_id], self.objects or {}, "rl.rewards.chair")
        if references is not None:
            return annotated, ground_truth(annotated, references, self._vocab())
        if image_id not in self._truth:  # the references keyed as the objects are, or by the id written the other way
            self._truth[image_id] = ground_truth(annotated, references_of(image_id, self.references), self._vocab())
        return annotated, self._truth[image_id]

    def _vocab(self) -> ObjectVocabulary:
        return self.vocabulary if self.vocabulary is not None else coco_vocabulary()

    def __call__(self, captions: Sequence[str], batch: Mapping[str, Any]) -> RewardOutput:
        if self.objects is None:
            raise RuntimeError("ChairReward: no objects; pass objects= or call setup(inputs) first")
        ids, given = batch["image_ids"], batch.get(CAPTION_REFERENCES)
        counts = []
        for n, (caption, row) in enumerate(zip(captions, caption_rows(captions, batch).tolist())):
            annotated, truth = self.truth(ids[row], None if given is None else given[n])
            counts.append(caption_chair(caption, annotated, truth, self._vocab()))
        chair_i = torch.tensor([c.chair_i for c in counts])  # (N,)
        recall = torch.tensor([1.0 if c.recall is None else c.recall for c in counts])  # (N,)
        total = 1.0 - chair_i + self.recall_weight * recall  # (N,)
        parts = {
            self.name: total,
            "CHAIRi": chair_i,
            "CHAIRs": torch.tensor([c.chair_s for c in counts]),
            "recall": recall,
            "objects": torch.tensor([float(len(c.mentions)) for c in counts]),
        }
        return RewardOutput(total, parts)


def build(cfg: Config) -> ChairReward:
    """Factory of the reward registry (``rl.rewards: {chair: w}``): the ground truth is read in ``setup(inputs)``, from
    ``eval.instances`` where the inputs bring no objects or scenes (module docstring)."""
    return ChairReward(instances=cfg.eval.instances)
