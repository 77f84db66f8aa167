"""CHAIR reward: 1 - the share of a caption's object mentions that are hallucinated (CHAIRi per caption).

The counts are the ``hallucination`` metric group's (:mod:`finecap.metrics.hallucination`): a caption's object
mentions (COCO's synonym lists and two-word names, nouns lemmatised), each hallucinated when its category is not among
the image's ground-truth objects. The reward of a caption is ``1 - hallucinated / mentions`` (1 when it mentions no
object), plus ``recall_weight`` x the share of the image's annotated objects it mentions. Parts logged (under
``chair/``): ``CHAIRi``, ``CHAIRs`` (1 when any mention is hallucinated), ``recall`` (1 for an image with no
annotated object: nothing to miss) and ``objects`` (mentions).

A caption that names no object is never wrong: with ``recall_weight = 0`` the reward alone is highest for captions
that avoid objects, so weigh it beside a reward that pays for content (``rl.rewards: {cider: 1.0, chair: 0.5}``) or
give ``recall_weight``.

Ground truth, in a training run (``setup(ctx)``): on the world (``data.format=world``) its scenes' shapes with the
world's shape words (:func:`finecap.metrics.hallucination.world_vocabulary`); otherwise the instance annotations of
``eval.instances`` (a COCO ``instances_*.json``) and the objects the training references mention, as CHAIR's
reference code reads them. Outside a run: ``objects={image_id: categories}`` (or ``instances=<file>``), with
optional ``references=``.

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
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from finecap.metrics.hallucination import (
    ObjectVocabulary,
    caption_chair,
    coco_vocabulary,
    ground_truth,
    lookup_objects,
    read_instances,
    world_objects,
    world_vocabulary,
)
from finecap.rewards.base import RewardOutput, caption_rows

if TYPE_CHECKING:
    from finecap.config import Config
    from finecap.contract import TrainContext


class ChairReward:
    """``1 - CHAIRi`` (+ ``recall_weight`` x object recall) of each caption against its image's objects (module
    docstring).

    Args:
        objects: ``{image_id: annotated categories}``; ``None``: read in :meth:`setup` (the world's scenes, or
            ``eval.instances``).
        references: ``{image_id: [reference captions]}`` whose mentions are ground truth too (CHAIR's reference code
            adds them); ``None``: none (in a run: the training references, on COCO).
        vocabulary: the object vocabulary (default COCO's).
        recall_weight: weight of the object recall in the total.
    """

    name = "chair"
    per_caption = True  # a caption's value needs only its own image's objects

    def __init__(
        self,
        objects: Mapping[Hashable, frozenset[str]] | None = None,
        references: Mapping[Hashable, Sequence[str]] | None = None,
        *,
        vocabulary: ObjectVocabulary | None = None,
        recall_weight: float = 0.0,
    ) -> None:
        self.objects = None if objects is None else dict(objects)
        self.references = {} if references is None else {i: list(r) for i, r in references.items()}
        self.vocabulary = vocabulary
        self.recall_weight = float(recall_weight)
        self._truth: dict[Hashable, frozenset[str]] = {}  # ground truth per image, computed once

    def known_images(self) -> list[Hashable]:
        """The images with objects (:func:`finecap.rewards.known_images`)."""
        return list(self.objects or {})

    def setup(self, ctx: TrainContext) -> None:
        """The ground truth of a training run (module docstring), once."""
        if self.objects is not None:
            return
        from finecap.data.references import world_scenes

        scenes = world_scenes(ctx.cfg)
        if scenes is not None:
            self.objects, self.vocabulary = world_objects(scenes), world_vocabulary()
            return
        if not ctx.cfg.eval.instances:
            raise ValueError(
                f"rl.rewards.chair: data.format={ctx.cfg.data.format} has no object annotations; set "
                "eval.instances=<COCO instances_*.json> (or train on the world)"
            )
        self.objects = read_instances(ctx.cfg.eval.instances, "eval.instances")
        for record in ctx.train_records:
            self.references.setdefault(record.image_id, []).extend(record.captions)

    def truth(self, image_id: Hashable) -> tuple[frozenset[str], frozenset[str]]:
        """(annotated categories, ground-truth objects) of ``image_id``."""
        (annotated,) = lookup_objects([image_id], self.objects or {}, "rl.rewards.chair")
        if image_id not in self._truth:
            self._truth[image_id] = ground_truth(annotated, self.references.get(image_id), self._vocab())
        return annotated, self._truth[image_id]

    def _vocab(self) -> ObjectVocabulary:
        return self.vocabulary if self.vocabulary is not None else coco_vocabulary()

    def __call__(self, captions: Sequence[str], batch: Mapping[str, Any]) -> RewardOutput:
        if self.objects is None:
            raise RuntimeError("ChairReward: no objects; pass objects= or call setup(ctx) first")
        ids = batch["image_ids"]
        counts = []
        for caption, row in zip(captions, caption_rows(captions, batch).tolist()):
            annotated, truth = self.truth(ids[row])
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


def build(
    cfg: Config | None = None,
    *,
    objects: Mapping[Hashable, frozenset[str]] | None = None,
    instances: str | Path | None = None,
    references: Mapping[Hashable, Sequence[str]] | None = None,
    recall_weight: float = 0.0,
) -> ChairReward:
    """Factory of the reward registry (``rl.rewards: {chair: w}``): in a training run the ground truth is read in
    ``setup(ctx)`` (module docstring); outside one (``cfg=None``: an adapter, the reward server)
    ``objects={image_id: categories}`` or ``instances=<COCO instances_*.json>``, and optionally ``references``."""
    if objects is not None and instances is not None:
        raise ValueError("chair: give objects={image_id: categories} or instances=<instances_*.json>, not both")
    if instances is not None:
        objects = read_instances(instances, "chair: instances")
    if cfg is None and objects is None:
        raise ValueError("chair: outside a training run give objects={image_id: categories} or "
                         "instances=<COCO instances_*.json>")  # fmt: skip
    return ChairReward(objects, references, recall_weight=recall_weight)
