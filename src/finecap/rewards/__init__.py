"""Sequence-level rewards for REINFORCE, chosen by name and combined with weights (``rl.rewards``).

:data:`REWARDS` maps each built-in name (``cider``, ``retrieval``, ``listener``, ``chair``; the judge-backed
``qa_utility`` and ``claims`` and the ``length`` shaping of another reward, docs/methods/judges.md) to the import
path of its factory (imported only when used); user code is plugged in with a dotted path ``"pkg.module:factory"``
as the name.
``rl.rewards: {cider: 1.0}`` gives the SCST reward; ``{retrieval: 1.0, cider: 0.5}`` gives SR + 0.5 * CIDEr (NDLB
Sec. 4.8; the self-retrieval reward is configured in the ``sr`` section, :mod:`finecap.rewards.retrieval`).

A factory takes the run's configuration only, ``factory(cfg) -> reward`` (a :class:`RewardBase`, or a plain callable
that :func:`as_reward` wraps); the reward reads its data in ``setup(inputs)`` (:class:`RewardInputs`). Every front
end builds rewards through this table: the training loop (:func:`build_reward`, set up from the training context),
the reward server (the same, set up from the served records) and the adapters to other trainers
(:func:`reward_of`: a configuration for the reward's options and inputs from its data, keyword arguments both).
See :mod:`finecap.rewards.base` for the contract.

Example::

    >>> from finecap.config import load
    >>> reward = build_reward(load(None, ["rl.rewards={cider: 1.0}"]))
    >>> sorted(reward.rewards)
    ['cider']
    >>> cider = reward_of("cider", references={1: ["a red circle"], 2: ["a blue square"]})
    >>> cider.per_caption, sorted(cider.known_images())
    (True, [1, 2])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from finecap.registry import REWARDS, lookup
from finecap.rewards.base import (
    FunctionReward,
    NonFiniteReward,
    Reward,
    RewardBase,
    RewardOutput,
    WeightedSum,
    as_reward,
    call_batch,
    caption_rows,
    check_finite,
)
from finecap.rewards.inputs import RewardInputs

if TYPE_CHECKING:
    from finecap.config import Config

__all__ = ["REWARDS", "FunctionReward", "NonFiniteReward", "Reward", "RewardBase", "RewardInputs", "RewardOutput",
           "WeightedSum", "as_reward", "build_reward", "call_batch", "caption_rows", "check_finite", "get_reward",
           "reward_of"]  # fmt: skip


def get_reward(name: str, cfg: Config) -> RewardBase:
    """The reward ``name`` (a :data:`REWARDS` name or ``"pkg.module:factory"``) of the configuration ``cfg``, built
    and not yet set up."""
    factory: Callable[[Config], Any] = lookup(name, REWARDS, "rl.rewards", "reward")
    return as_reward(factory(cfg), f"rl.rewards.{name}")


def build_reward(cfg: Config) -> WeightedSum:
    """The weighted sum of the rewards of ``rl.rewards`` (name -> weight), not yet set up."""
    return WeightedSum({name: (float(w), get_reward(name, cfg)) for name, w in cfg.rl.rewards.items()})


def options_config(options: dict[str, Any]) -> Config:
    """The configuration of a reward outside a run: the defaults, with the options that are configuration taken out
    of ``options``: ``sr=SRConfig(...)`` (the ``sr`` section), ``judge=JudgeConfig(...)`` (the ``judge`` section;
    a judge or a judge name given as ``judge=`` is the judge-backed rewards' setting instead) and
    ``instances=<COCO instances_*.json>`` (``eval.instances``)."""
    from finecap.config import SRConfig, load
    from finecap.config.sections.judge import JudgeConfig

    cfg = load(None)
    sr = options.pop("sr", None)
    if sr is not None:
        if not isinstance(sr, SRConfig):
            raise TypeError(f"sr= must be a finecap.config.SRConfig, got {type(sr).__name__}")
        cfg = dataclasses.replace(cfg, sr=sr)
    if isinstance(options.get("judge"), JudgeConfig):
        cfg = dataclasses.replace(cfg, judge=options.pop("judge"))
    instances = options.pop("instances", None)
    if instances is not None:
        cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, instances=str(instances)))
    return cfg


def options_inputs(options: dict[str, Any]) -> RewardInputs:
    """The :class:`RewardInputs` of an adapter's options (their fields), taken out of ``options``;
    ``world=<folder of a finecap world>`` gives its scenes."""
    world = options.pop("world", None)
    if world is not None:
        if options.get("scenes") is not None:
            raise ValueError("give scenes={image_id: Scene} or world=<world folder>, not both")
        from finecap.world.make import load_scenes

        options["scenes"] = load_scenes(world)
    return RewardInputs(**{k: options.pop(k) for k in RewardInputs.names() if k in options})


def reward_of(name_or_reward: Any, **options: Any) -> RewardBase:
    """A reward ready to call outside a training run (an adapter, a script): a built reward as it is
    (:func:`as_reward`; no options), or the reward named ``name_or_reward`` (a :data:`REWARDS` name or
    ``"pkg.module:factory"``) built on :func:`options_config`, given its declared settings
    (:meth:`RewardBase.configure`: the other options, e.g. ``sigma=``) and set up with :func:`options_inputs`
    (``references=``, ``retriever=`` and ``images=`` or ``embeddings=``, ``scenes=`` or ``world=``, ``objects=``,
    ``questions=``)."""
    if not isinstance(name_or_reward, str):
        if options:
            raise TypeError(f"options {sorted(options)} are given with a built reward; give them when building it")
        return as_reward(name_or_reward, "reward")
    options = dict(options)
    cfg = options_config(options)
    inputs = options_inputs(options)
    reward = get_reward(name_or_reward, cfg)
    reward.configure(**options)
    reward.setup(inputs)
    return reward
