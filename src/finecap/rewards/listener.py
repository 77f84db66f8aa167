"""Listener reward: the world's fact-based listener (:mod:`finecap.world.listener`) picks each caption's image.

The listener reads the caption's stated facts and ranks the candidate images by their support (true facts - false
facts, :func:`finecap.world.listener.support_matrix`); the reward is its expected R@1 of the caption's own image,
ties broken uniformly: ``1 / (1 + tied)`` when no candidate has more support, else 0. The candidates are the distinct
images of the optimizer step's global batch (``batch['step_info']``, as the self-retrieval reward's distractors, so
the reward does not depend on how the batch is split over processes and accumulation steps), or of the call without
one (an adapter's call). It pays for captions that state what tells their image apart, and only what the fact parser
reads (a retriever's cues that state no fact earn nothing): the world's scene graphs are its ground truth, so it
exists on the world only (``setup(inputs)`` reads ``inputs.scenes``: in a run those of ``data.format=world``).

Example::

    >>> from finecap.world.scene import Obj, Scene
    >>> reward = ListenerReward({0: Scene(0, "grass", [Obj("circle", "red", "large", 1, 1)]),
    ...                          1: Scene(1, "sand", [Obj("circle", "red", "large", 1, 1)])})
    >>> reward(["a red circle", "a red circle on sand"], {"image_ids": [0, 1]}).total.tolist()  # a tie; then 1
    [0.5, 1.0]
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from finecap.data.records import id_text
from finecap.metrics.faithfulness import scene_of
from finecap.rewards.base import RewardBase, RewardOutput, caption_rows, keyed_table
from finecap.world.listener import rank_with_ties, support_matrix

if TYPE_CHECKING:
    from finecap.config import Config
    from finecap.rewards.inputs import RewardInputs
    from finecap.world.scene import Scene


class ListenerReward(RewardBase):
    """Expected listener R@1 of each caption's image among the batch's images (module docstring).

    Args:
        scenes: ``{image_id: Scene}`` of every image a caption may describe or compete with; ``None``: the training
            inputs', read in :meth:`setup`. Two ids naming one image (``1`` and ``"1"``) are a ``ValueError``
            ("listener scenes: ...", :func:`~finecap.rewards.base.keyed_table`): a caption's image would be read in
            the scene its call's spelling of the id finds first.
    """

    name = "listener"
    compares_images = True  # the candidates are the call's distinct images

    def __init__(self, scenes: Mapping[Hashable, Scene] | None = None) -> None:
        self.scenes = keyed_table(scenes, "listener scenes")

    def known_images(self) -> list[Hashable]:
        """The images with a scene graph."""
        return list(self.scenes or {})

    def setup(self, inputs: RewardInputs) -> None:
        """The scene graphs (``inputs.scenes``), once."""
        if self.scenes is not None:
            return
        if inputs.scenes is None:
            raise ValueError("listener: outside a training run give scenes={image_id: Scene} or world=<world folder>; "
                             "a training run reads the world's scene graphs (data.format=world), and this data has "
                             "none")  # fmt: skip
        self.scenes = keyed_table(inputs.scenes, "listener scenes")

    def scene(self, image_id: Hashable) -> Scene:
        scene = scene_of(image_id, self.scenes or {})  # ids as ints or as their strings
        if scene is None:
            raise KeyError(f"listener: no scene graph for image id {image_id!r}")
        return scene

    def __call__(self, captions: Sequence[str], batch: Mapping[str, Any]) -> RewardOutput:
        if self.scenes is None:
            raise RuntimeError("ListenerReward: no scene graphs; pass scenes= or call setup(inputs) first")
        ids = list(batch["image_ids"])
        info = batch.get("step_info")
        # (M,) the candidates: each image once, 1 and "1" one image (as first written; else its own distractor)
        column: dict[str, int] = {}
        pool = []
        for image_id in ids if info is None else info.image_ids:
            if column.setdefault(id_text(image_id), len(pool)) == len(pool):
                pool.append(image_id)
        targets = np.array(
            [column[id_text(ids[r])] for r in caption_rows(captions, batch).tolist()], dtype=np.int64
        )  # (N,)
        support = support_matrix(list(captions), [self.scene(i) for i in pool])  # (N, M)
        candidates = np.tile(np.arange(len(pool)), (len(captions), 1))  # (N, M): every image competes
        result = rank_with_ties(support, targets, candidates, np.random.default_rng(0))  # expected R@1: no draw
        total = torch.from_numpy(result.expected_r1).float()  # (N,)
        return RewardOutput(total, {self.name: total})


def build(cfg: Config) -> ListenerReward:
    """Factory of the reward registry (``rl.rewards: {listener: w}``); the scenes are read in ``setup(inputs)``."""
    return ListenerReward()
