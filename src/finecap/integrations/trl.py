"""finecap's caption rewards as TRL reward functions (``GRPOTrainer``, ``RLOOTrainer``, any online trainer of TRL).

:func:`reward_function` turns a finecap reward into a callable with TRL's reward signature
``fn(prompts, completions, **kwargs) -> list[float]``: one float per completion, ``completions`` plain strings or
conversational (``[{"role": "assistant", "content": "..."}]``, the content a string or a list of ``{"type": "text",
"text": ...}`` blocks), and the image each completion describes read from a data-set column that TRL passes through
``kwargs`` (``image_id_column``, default ``"image_id"``; TRL repeats every column for the completions of one prompt).
The function's ``__name__`` is the reward's name, so TRL logs it as ``rewards/<name>/mean``.

Rewards (``name``: a name of finecap's one reward table, :data:`finecap.registry.REWARDS`, or a dotted path
``"pkg.module:factory"`` to a reward of your own; ``options`` go to the factory with ``cfg=None``,
:mod:`finecap.rewards`):

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
- ``"listener"``: the world's fact-based listener (:mod:`finecap.rewards.listener`) reads the completion's stated
  facts and ranks the call's distinct images by support (true facts - false facts); the reward is its expected R@1 of
  the completion's own image, ties broken uniformly: ``1 / (1 + tied)`` when no image has more support, else 0.
  Options: ``scenes={image_id: Scene}`` or ``world=<folder of a finecap world>`` (one of them).
- ``"chair"``: 1 - the share of the completion's object mentions that are hallucinated (CHAIR,
  :mod:`finecap.rewards.chair`). Options: ``objects={image_id: categories}`` or ``instances=<COCO instances_*.json>``
  (one of them), ``references={image_id: [captions]}`` (their objects count as present), ``recall_weight=0.0``.

Every reward is called as in the training loop, ``reward(texts, batch)``, with the call's distinct images as the batch
(:func:`finecap.rewards.call_batch`), so its values are the training loop's on the same captions and images.

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

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from finecap.integrations.scoring import Scorer, column, completion_text, completion_texts
from finecap.registry import REWARDS, is_dotted_path
from finecap.rewards import Reward, get_reward

__all__ = ["REWARDS", "TrlReward", "completion_text", "reward_function"]


class TrlReward:
    """A finecap reward with TRL's reward-function signature (module docstring).

    Args:
        name: the reward's name; TRL logs it as ``rewards/<name>/mean``.
        reward: the finecap reward, ``reward(captions, batch) -> RewardOutput``.
        image_id_column: the data-set column of each completion's image id.
    """

    def __init__(self, name: str, reward: Reward, image_id_column: str = "image_id") -> None:
        self.__name__ = name
        self.reward = reward
        self.image_id_column = image_id_column
        self.scorer = Scorer(reward, name=name)

    def image_ids(self, n: int, kwargs: Mapping[str, Any]) -> list[Hashable]:
        return column(kwargs, self.image_id_column, n, f"reward_function({self.__name__!r})", "image_id_column")

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        """One float per completion; a call the reward server would refuse is refused alike (a ``ValueError`` with
        the server's message: :class:`finecap.integrations.scoring.Scorer`), a conversational completion without an
        assistant message too."""
        texts = [t.strip() for t in completion_texts(completions)]
        return self.scorer.score(texts, self.image_ids(len(texts), kwargs)).total


def reward_function(name: str, *, image_id_column: str = "image_id", **options: Any) -> TrlReward:
    """The finecap reward ``name`` (a :data:`REWARDS` name or ``"pkg.module:factory"``) as a TRL reward function;
    ``options`` as in the module docstring. A call of TRL holds its generation batch only: the retrieval reward's
    distractors can be no other images (``sr.distractors=batch``)."""
    if name not in REWARDS and not is_dotted_path(name):
        raise ValueError(f"reward_function: unknown reward {name!r}; valid: {', '.join(REWARDS)} (or a dotted path "
                         "'pkg.module:factory')")  # fmt: skip
    sr = options.get("sr")
    if sr is not None and sr.distractors != "batch":
        raise ValueError(f"reward_function({name!r}): sr.distractors={sr.distractors}; TRL gives batch only")
    try:
        reward = get_reward(name, None, **options)
    except TypeError as e:
        raise TypeError(f"reward_function({name!r}): {e}") from None
    return TrlReward(name, reward, image_id_column)
