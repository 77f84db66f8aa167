"""finecap's caption rewards as TRL reward functions (``GRPOTrainer``, ``RLOOTrainer``, any online trainer of TRL).

:func:`reward_function` turns a finecap reward into a callable with TRL's reward signature
``fn(prompts, completions, **kwargs) -> list[float]``: one float per completion, ``completions`` plain strings or
conversational (``[{"role": "assistant", "content": "..."}]``, the content a string or a list of ``{"type": "text",
"text": ...}`` blocks), and the image each completion describes read from a data-set column that TRL passes through
``kwargs`` (``image_id_column``, default ``"image_id"``; TRL repeats every column for the completions of one prompt).
The function's ``__name__`` is the reward's name, so TRL logs it as ``rewards/<name>/mean``.

Rewards (``name``):

- ``"cider"``: CIDEr-D of each completion against its image's references (:class:`finecap.rewards.cider.
  CiderReward`), with document frequencies from the ``references`` given, as SCST computes them from the training
  references; with the evaluated set as references it equals pycocoevalcap's per-image CIDEr-D. Options:
  ``references={image_id: [captions]}`` (required), ``tokenize_text=True``, ``sigma=6.0``.
- ``"retrieval"``: self-retrieval (:class:`finecap.rewards.retrieval.RetrievalReward`): a frozen retriever scores
  each completion against its own image and the other images of the call (TRL calls the function once per
  generation batch, so the distractors are the batch's other prompts' images). Options: ``retriever`` (a
  :class:`finecap.models.retriever.Retriever`, required), ``images={image_id: PIL image}`` or
  ``embeddings={image_id: tensor (D,)}`` (one of them, required), ``sr=SRConfig(reward="accuracy", ...)`` (the
  ``sr`` section's ``reward``, ``logit_scale``, ``duplicate_threshold``; default: its defaults; the distractors are
  always the call's other images).
- ``"listener"``: the world's fact-based listener (:mod:`finecap.world.listener`) reads the completion's stated facts
  and ranks the call's distinct images by support (true facts - false facts); the reward is its expected R@1 of the
  completion's own image, ties broken uniformly: ``1 / (1 + tied)`` when no image has more support, else 0. Options:
  ``scenes={image_id: Scene}`` or ``world=<folder of a finecap world>`` (one of them).

Example (plain-text completions)::

    >>> fn = reward_function("cider", references={1: ["a red circle", "a small red circle"], 2: ["a blue square"]})
    >>> [round(r, 3) for r in fn(prompts=["", ""], completions=["a red circle", "a square"], image_id=[1, 2])]
    [5.26, 1.743]
    >>> fn.__name__
    'cider'

With TRL::

    from trl import GRPOConfig, GRPOTrainer
    # dataset columns: prompt (a user turn with an image placeholder), image, image_id
    trainer = GRPOTrainer(model="HuggingFaceTB/SmolVLM-256M-Instruct", train_dataset=dataset,
                          reward_funcs=[reward_function("cider", references=train_references)], args=GRPOConfig(...))
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from finecap.config import SRConfig
from finecap.metrics.faithfulness import scene_of
from finecap.rewards.cider import CiderReward
from finecap.rewards.retrieval import RetrievalReward
from finecap.world.listener import rank_with_ties, support_matrix

REWARDS = ("cider", "retrieval", "listener")
"""The names :func:`reward_function` accepts."""


def completion_text(completion: Any) -> str:
    """The text of one completion: a string as is; a conversational completion (a list of messages) gives its last
    assistant message's content (a string, or the concatenated ``text`` blocks of a content list)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], Mapping):
        messages = [m for m in completion if m.get("role", "assistant") == "assistant"] or list(completion)
        content = messages[-1].get("content", "")
        if isinstance(content, str):
            return content
        return "".join(block.get("text", "") for block in content if block.get("type") == "text")
    raise TypeError(f"reward_function: a completion must be a string or a list of messages, got {type(completion)}")


class TrlReward:
    """A finecap reward with TRL's reward-function signature (module docstring). Subclasses score the completions'
    texts given the image ids: :meth:`score`."""

    def __init__(self, name: str, image_id_column: str = "image_id") -> None:
        self.__name__ = name
        self.image_id_column = image_id_column

    def image_ids(self, n: int, kwargs: Mapping[str, Any]) -> list[Hashable]:
        if self.image_id_column not in kwargs:
            columns = sorted(k for k in kwargs if k not in ("trainer_state", "log_extra", "log_metric"))
            raise KeyError(
                f"reward_function({self.__name__!r}): no {self.image_id_column!r} column among the data set's columns "
                f"{columns}; add the image ids as that column or pass image_id_column="
            )
        ids = list(kwargs[self.image_id_column])
        if len(ids) != n:
            raise ValueError(f"reward_function({self.__name__!r}): {len(ids)} image ids for {n} completions")
        return ids

    def score(self, texts: list[str], image_ids: list[Hashable]) -> torch.Tensor:
        raise NotImplementedError

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        texts = [completion_text(c).strip() for c in completions]
        return [float(r) for r in self.score(texts, self.image_ids(len(texts), kwargs)).tolist()]


def _rows(image_ids: list[Hashable]) -> tuple[list[Hashable], torch.Tensor]:
    """The distinct ids in order of first appearance, and each completion's row among them ``(N,)``."""
    distinct = list(dict.fromkeys(image_ids))
    row = {i: r for r, i in enumerate(distinct)}
    return distinct, torch.tensor([row[i] for i in image_ids], dtype=torch.long)


class CiderFunction(TrlReward):
    """CIDEr-D against the references of each completion's image (document frequencies from ``references``)."""

    def __init__(self, references: Mapping[Hashable, Sequence[str]], *, image_id_column: str = "image_id",
                 tokenize_text: bool = True, sigma: float = 6.0) -> None:  # fmt: skip
        super().__init__("cider", image_id_column)
        if not references:
            raise ValueError("reward_function('cider'): references={image_id: [captions]} is empty")
        self.reward = CiderReward(references, tokenize_text=tokenize_text, sigma=sigma)

    def score(self, texts: list[str], image_ids: list[Hashable]) -> torch.Tensor:
        return self.reward(texts, {"image_ids": image_ids}).total  # (N,)


class RetrievalFunction(TrlReward):
    """Self-retrieval against the call's other images (distractors = the generation batch's other images)."""

    def __init__(self, retriever: Any, *, images: Mapping[Hashable, Any] | None = None,
                 embeddings: Mapping[Hashable, torch.Tensor] | None = None, image_id_column: str = "image_id",
                 sr: SRConfig | None = None) -> None:  # fmt: skip
        super().__init__("retrieval", image_id_column)
        if (images is None) == (embeddings is None):
            raise ValueError("reward_function('retrieval'): give images={id: PIL image} or embeddings={id: tensor}")
        if images is not None:
            ids = list(images)
            table = retriever.embed_images([images[i] for i in ids]).cpu()  # (P, D)
        else:
            ids = list(embeddings)
            table = torch.stack([torch.as_tensor(embeddings[i]).float() for i in ids])  # (P, D)
        if sr is not None and sr.distractors != "batch":
            raise ValueError(f"reward_function('retrieval'): sr.distractors={sr.distractors}; TRL gives batch only")
        self.reward = RetrievalReward(retriever, sr, image_ids=ids, embeddings=table)

    def score(self, texts: list[str], image_ids: list[Hashable]) -> torch.Tensor:
        distinct, rows = _rows(image_ids)
        return self.reward(texts, {"image_ids": distinct, "image_index": rows}).total  # (N,)


class ListenerFunction(TrlReward):
    """The fact-based listener's expected R@1 of each completion's image among the call's distinct images."""

    def __init__(self, *, scenes: Mapping[Hashable, Any] | None = None, world: str | Path | None = None,
                 image_id_column: str = "image_id") -> None:  # fmt: skip
        super().__init__("listener", image_id_column)
        if (scenes is None) == (world is None):
            raise ValueError("reward_function('listener'): give scenes={image_id: Scene} or world=<world folder>")
        if world is not None:
            from finecap.world.make import load_scenes

            scenes = load_scenes(world)
        self.scenes = dict(scenes)

    def _scene(self, image_id: Hashable) -> Any:
        scene = scene_of(image_id, self.scenes)  # ids as ints or as their strings
        if scene is None:
            raise KeyError(f"reward_function('listener'): no scene for image id {image_id!r}")
        return scene

    def score(self, texts: list[str], image_ids: list[Hashable]) -> torch.Tensor:
        distinct, rows = _rows(image_ids)
        support = support_matrix(texts, [self._scene(i) for i in distinct])  # (N, M)
        targets = rows.numpy()
        candidates = np.tile(np.arange(len(distinct)), (len(texts), 1))  # (N, M): every image of the call
        result = rank_with_ties(support, targets, candidates, np.random.default_rng(0))
        return torch.from_numpy(result.expected_r1).float()  # (N,)


FACTORIES: dict[str, Callable[..., TrlReward]] = {
    "cider": CiderFunction,
    "retrieval": RetrievalFunction,
    "listener": ListenerFunction,
}
assert set(FACTORIES) == set(REWARDS)


def reward_function(name: str, **options: Any) -> TrlReward:
    """The finecap reward ``name`` (:data:`REWARDS`) as a TRL reward function; ``options`` as in the module
    docstring."""
    if name not in FACTORIES:
        raise ValueError(f"reward_function: unknown reward {name!r}; valid: {', '.join(REWARDS)}")
    try:
        return FACTORIES[name](**options)
    except TypeError as e:
        raise TypeError(f"reward_function({name!r}): {e}") from None
