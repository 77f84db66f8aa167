"""Sequence-level rewards for REINFORCE, chosen by name and combined with weights (``rl.rewards``).

:data:`REWARDS` maps each built-in name to the import path of its factory ``factory(cfg: Config) -> Reward``
(imported only when used); user code is plugged in with a dotted path ``"pkg.module:factory"`` as the name.
``rl.rewards: {cider: 1.0}`` gives the SCST reward; ``{retrieval: 1.0, cider: 0.5}`` gives SR + 0.5 * CIDEr (NDLB
Sec. 4.8; the self-retrieval reward is configured in the ``sr`` section, :mod:`finecap.rewards.retrieval`).
See :mod:`finecap.rewards.base` for the interface.

Example::

    >>> from finecap.config import load
    >>> reward = build_reward(load(None, ["rl.rewards={cider: 1.0}"]))
    >>> sorted(reward.rewards)
    ['cider']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from finecap.registry import REWARDS, lookup
from finecap.rewards.base import Reward, RewardOutput, WeightedSum, caption_rows

if TYPE_CHECKING:
    from finecap.config import Config

__all__ = ["REWARDS", "Reward", "RewardOutput", "WeightedSum", "build_reward", "caption_rows", "get_reward"]


def get_reward(name: str, cfg: Config) -> Reward:
    """Build the reward ``name`` (a :data:`REWARDS` name or ``"pkg.module:factory"``) from ``cfg``."""
    factory: Callable[[Config], Reward] = lookup(name, REWARDS, "rl.rewards", "reward")
    return factory(cfg)


def build_reward(cfg: Config) -> WeightedSum:
    """The weighted sum of the rewards of ``rl.rewards`` (name -> weight)."""
    return WeightedSum({name: (float(w), get_reward(name, cfg)) for name, w in cfg.rl.rewards.items()})
