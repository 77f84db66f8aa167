"""Length shaping: transforms that wrap any reward and shape it by the caption's length in words (whitespace-split;
CapRL and DAPO count tokens, finecap's rewards see text). Each keeps the wrapped reward's parts and adds its own.

- :class:`PiecewiseLength` (CapRL's length reward ``R_l``): ``R_l = 1`` for ``L <= l1``, falling linearly to 0 at
  ``l2``, 0 beyond; ``total = inner + weight * R_l``; part ``length_reward`` = ``R_l``.
- :class:`SoftOverlong` (DAPO's soft overlong punishment, Eq. 13): ``R = 0`` for ``L <= L_max - L_cache``,
  ``((L_max - L_cache) - L) / L_cache`` up to ``L_max``, ``-1`` beyond; ``total = inner + R``; part ``overlong``.
- :class:`LengthMask` (BalCapRL's length-conditional mask): the wrapped reward counts only for captions whose length
  is within ``[min_length, max_length]``, 0 elsewhere (wrap the part to mask, e.g. a fluency reward, and sum it with
  the others); part ``length_mask`` (1 kept, 0 masked).

``failed`` of the wrapped output (a judge failure) is passed on.

Example::

    >>> import torch
    >>> from finecap.rewards.base import RewardOutput
    >>> class One:
    ...     def __call__(self, captions, batch):
    ...         return RewardOutput(torch.ones(len(captions)))
    >>> shaped = PiecewiseLength(One(), l1=2, l2=4, weight=0.5)
    >>> shaped(["a b", "a b c", "a b c d e"], {}).total.tolist()  # R_l = 1, 0.5, 0
    [1.5, 1.25, 1.0]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from finecap.rewards.base import RewardOutput, call_hook, declared_needs

if TYPE_CHECKING:
    from finecap.config import Config
    from finecap.contract import TrainContext
    from finecap.rewards.base import Reward


def word_lengths(captions: Sequence[str]) -> torch.Tensor:
    """(N,) float: the number of whitespace-separated words of each caption."""
    return torch.tensor([float(len(c.split())) for c in captions])


def piecewise_length(lengths: torch.Tensor, l1: float, l2: float) -> torch.Tensor:
    """CapRL's ``R_l`` of each length (module docstring)."""
    if l2 <= l1:
        return (lengths <= l1).float()
    return (1.0 - (lengths - l1) / (l2 - l1)).clamp(0.0, 1.0)


def soft_overlong(lengths: torch.Tensor, max_length: float, cache: float) -> torch.Tensor:
    """DAPO's soft overlong punishment of each length (module docstring)."""
    start = max_length - cache
    inside = ((start - lengths) / cache).clamp(max=0.0)
    return torch.where(lengths > max_length, torch.full_like(lengths, -1.0), inside)


class _Transform:
    """A reward wrapped: hooks and declared needs forwarded, the wrapped output's parts and ``failed`` kept."""

    def __init__(self, inner: Reward) -> None:
        self.inner = inner
        self.per_caption = bool(getattr(inner, "per_caption", False))
        self.needs = declared_needs(inner)

    def setup(self, ctx: TrainContext) -> None:
        call_hook(self.inner, "setup", ctx)

    def state_dict(self) -> Any:
        return call_hook(self.inner, "state_dict")

    def load_state_dict(self, state: Any) -> None:
        call_hook(self.inner, "load_state_dict", state)

    def shape(self, out: RewardOutput, lengths: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise NotImplementedError

    def __call__(self, captions: Sequence[str], batch: Mapping[str, Any]) -> RewardOutput:
        out = self.inner(captions, batch)
        total, extra = self.shape(out, word_lengths(captions))
        parts = {**out.parts, **extra}
        failed = getattr(out, "failed", None)
        if failed is not None:
            return dataclasses.replace(out, total=total, parts=parts)
        return RewardOutput(total, parts)


class PiecewiseLength(_Transform):
    """CapRL's piecewise length reward added to the wrapped reward (module docstring)."""

    def __init__(self, inner: Reward, *, l1: float, l2: float, weight: float = 1.0) -> None:
        super().__init__(inner)
        self.l1, self.l2, self.weight = l1, l2, weight

    def shape(self, out: RewardOutput, lengths: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        r = piecewise_length(lengths, self.l1, self.l2)
        return out.total.float() + self.weight * r, {"length_reward": r}


class SoftOverlong(_Transform):
    """DAPO's soft overlong punishment added to the wrapped reward (module docstring)."""

    def __init__(self, inner: Reward, *, max_length: float, cache: float) -> None:
        super().__init__(inner)
        if not 0 < cache <= max_length:
            raise ValueError(f"length: cache={cache} must be in (0, max_length={max_length}]")
        self.max_length, self.cache = max_length, cache

    def shape(self, out: RewardOutput, lengths: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        r = soft_overlong(lengths, self.max_length, self.cache)
        return out.total.float() + r, {"overlong": r}


class LengthMask(_Transform):
    """The wrapped reward only for captions of ``min_length`` to ``max_length`` words (module docstring)."""

    def __init__(self, inner: Reward, *, min_length: float = 0, max_length: float = float("inf")) -> None:
        super().__init__(inner)
        self.min_length, self.max_length = min_length, max_length

    def shape(self, out: RewardOutput, lengths: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        keep = ((lengths >= self.min_length) & (lengths <= self.max_length)).float()
        return out.total.float() * keep, {"length_mask": keep}


TRANSFORMS = {"piecewise": PiecewiseLength, "soft_overlong": SoftOverlong, "mask": LengthMask}
"""``build(kind=...)`` names -> transform classes."""


def build(
    cfg: Config | None = None, *, reward: Reward | str | None = None, kind: str = "", **options: Any
) -> _Transform:
    """Factory of the reward registry, outside a training run: ``reward`` (a reward, or a ``REWARDS`` name built with
    ``cfg``) wrapped by the transform ``kind`` (:data:`TRANSFORMS`) with its ``options`` (``l1``, ``l2``, ``weight``;
    ``max_length``, ``cache``; ``min_length``, ``max_length``)."""
    if reward is None:
        raise ValueError(
            "length: wraps another reward; give reward= (a reward or its name) and kind= (rl.rewards "
            "gives a reward no options, so a shaped reward is built in Python: docs/methods/judges.md)"
        )
    if kind not in TRANSFORMS:
        raise ValueError(f"length: unknown kind {kind!r}; valid: {', '.join(TRANSFORMS)}")
    if isinstance(reward, str):
        from finecap.rewards import get_reward

        reward = get_reward(reward, cfg)
    return TRANSFORMS[kind](reward, **options)
