"""Sequence-level rewards for REINFORCE, chosen by name and combined with weights (``rl.rewards``).

:data:`REWARDS` maps each built-in name (``cider``, ``retrieval``, ``listener``, ``chair``; the judge-backed
``qa_utility`` and ``claims`` and the ``length`` shaping of another reward, docs/methods/judges.md) to the import
path of its factory (imported only when used); user code is plugged in with a dotted path ``"pkg.module:factory"``
as the name.
``rl.rewards: {cider: 1.0}`` gives the SCST reward; ``{retrieval: 1.0, cider: 0.5}`` gives SR + 0.5 * CIDEr (NDLB
Sec. 4.8; the self-retrieval reward is configured in the ``sr`` section, :mod:`finecap.rewards.retrieval`).
See :mod:`finecap.rewards.base` for the interface.

The table is the one every front end reads: the training loop (:func:`build_reward`) and the adapters to other
trainers (:mod:`finecap.integrations.trl`), through :func:`get_reward`. A factory is called
``factory(cfg, **options)``: in a training run with the run's configuration and no options (the reward then reads
what it needs of the run in ``setup(ctx)``: the training references, the retriever, the world's scenes), outside
one with ``cfg=None`` and the reward's data as ``options`` (``references=``, ``retriever=`` and ``images=``,
``scenes=``; each factory's docstring). A factory that takes no options (``def factory(cfg)``) serves the loop only.

Example::

    >>> from finecap.config import load
    >>> reward = build_reward(load(None, ["rl.rewards={cider: 1.0}"]))
    >>> sorted(reward.rewards)
    ['cider']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from finecap.registry import REWARDS, lookup
from finecap.rewards.base import (
    NonFiniteReward,
    Reward,
    RewardOutput,
    WeightedSum,
    call_batch,
    caption_rows,
    check_finite,
    compares_images,
    known_images,
    per_caption,
)

if TYPE_CHECKING:
    from finecap.config import Config

__all__ = ["REWARDS", "NonFiniteReward", "Reward", "RewardOutput", "WeightedSum", "build_reward", "call_batch",
           "caption_rows", "check_finite", "compares_images", "get_reward", "known_images", "per_caption"]  # fmt: skip


def get_reward(name: str, cfg: Config | None, **options: Any) -> Reward:
    """Build the reward ``name`` (a :data:`REWARDS` name or ``"pkg.module:factory"``) from ``cfg`` (a run's
    configuration, or ``None`` outside a run) and ``options`` (module docstring)."""
    factory: Callable[..., Reward] = lookup(name, REWARDS, "rl.rewards", "reward")
    return factory(cfg, **options)


def build_reward(cfg: Config) -> WeightedSum:
    """The weighted sum of the rewards of ``rl.rewards`` (name -> weight)."""
    return WeightedSum({name: (float(w), get_reward(name, cfg)) for name, w in cfg.rl.rewards.items()})
