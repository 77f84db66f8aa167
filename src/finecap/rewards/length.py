"""Length shaping: transforms that wrap any reward and shape it by the caption's length in words (whitespace-split;
CapRL and DAPO count tokens, finecap's rewards see text). Each keeps the wrapped reward's parts and adds its own.

- :class:`PiecewiseLength` (CapRL's length reward ``R_l``): ``R_l = 1`` for ``L <= l1``, falling linearly to 0 at
  ``l2``, 0 beyond; ``total = inner + weight * R_l``; part ``length_reward`` = ``R_l``.
- :class:`SoftOverlong` (DAPO's soft overlong punishment, Eq. 13): ``R = 0`` for ``L <= L_max - L_cache``,
  ``((L_max - L_cache) - L) / L_cache`` up to ``L_max``, ``-1`` beyond; ``total = inner + R``; part ``overlong``.
- :class:`LengthMask` (BalCapRL's length-conditional mask): the wrapped reward counts only for captions whose length
  is within ``[min_length, max_length]``, 0 elsewhere (wrap the part to mask, e.g. a fluency reward, and sum it with
  the others); part ``length_mask`` (1 kept, 0 masked).

``failed`` of the wrapped output (a judge failure) is passed on (the shaped total of a failed caption is NaN, never
paid). The wrapped reward's facts (``needs``, ``per_caption``, ``compares_images``, ``known_images``) and hooks
(``setup``, ``state_dict``) are its.

The registry's ``length`` (:func:`build`) is a :class:`Shaped` reward, given what it wraps by settings
(:meth:`RewardBase.configure`): ``reward=`` (a reward name or a built reward), ``kind=`` (:data:`TRANSFORMS`) and the
transform's parameters; every other setting is the wrapped reward's, given with a reward name only (a built reward
took its settings when it was built, as :func:`finecap.rewards.reward_of` says). Adapters give them as options
(``reward_function("length", reward="qa_utility", kind="piecewise", l1=60, l2=120, scenes=...)``). ``rl.rewards``
gives a reward no settings, so a training run names a factory of its own by dotted path (docs/methods/judges.md).

Example::

    >>> import torch
    >>> from finecap.rewards.base import RewardOutput
    >>> class One:  # a plain callable reward
    ...     def __call__(self, captions, batch):
    ...         return RewardOutput(torch.ones(len(captions)))
    >>> shaped = PiecewiseLength(One(), l1=2, l2=4, weight=0.5)
    >>> shaped(["a b", "a b c", "a b c d e"], {}).total.tolist()  # R_l = 1, 0.5, 0
    [1.5, 1.25, 1.0]
"""

from __future__ import annotations

import inspect
from collections.abc import Collection, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from finecap.registry import declared_needs
from finecap.rewards.base import RewardBase, RewardOutput, as_reward, number_setting

if TYPE_CHECKING:
    from finecap.config import Config
    from finecap.rewards.base import Reward
    from finecap.rewards.inputs import RewardInputs


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


class Wrapper(RewardBase):
    """A reward around another (``inner``): its facts and hooks are the inner reward's."""

    inner: RewardBase

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        return declared_needs(self.inner)

    @property
    def per_caption(self) -> bool:  # type: ignore[override]
        return self.inner.per_caption

    @property
    def compares_images(self) -> bool:  # type: ignore[override]
        return self.inner.compares_images

    def known_images(self) -> Collection[Hashable] | None:
        return self.inner.known_images()

    def setup(self, inputs: RewardInputs) -> None:
        self.inner.setup(inputs)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.inner.load_state_dict(state)

    def tallies(self) -> dict[str, float]:
        return self.inner.tallies()

    def close(self) -> None:
        self.inner.close()


class Transform(Wrapper):
    """A length transform of a wrapped reward: the wrapped output's parts and ``failed`` kept, :meth:`shape` adds."""

    def __init__(self, inner: Reward) -> None:
        self.inner = as_reward(inner, "length: reward=")

    def shape(self, out: RewardOutput, lengths: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise NotImplementedError

    def __call__(self, captions: Sequence[str], batch: Mapping[str, Any]) -> RewardOutput:
        out = self.inner(captions, batch)
        total, extra = self.shape(out, word_lengths(captions))
        return RewardOutput(total, {**out.parts, **extra}, out.failed)


class PiecewiseLength(Transform):
    """CapRL's piecewise length reward added to the wrapped reward (module docstring)."""

    def __init__(self, inner: Reward, *, l1: float, l2: float, weight: float = 1.0) -> None:
        super().__init__(inner)
        self.l1 = number_setting("length", "l1", l1, minimum=0)
        self.l2 = number_setting("length", "l2", l2, minimum=0)
        self.weight = number_setting("length", "weight", weight)

    def shape(self, out: RewardOutput, lengths: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        r = piecewise_length(lengths, self.l1, self.l2)
        return out.total.float() + self.weight * r, {"length_reward": r}


class SoftOverlong(Transform):
    """DAPO's soft overlong punishment added to the wrapped reward (module docstring)."""

    def __init__(self, inner: Reward, *, max_length: float, cache: float) -> None:
        super().__init__(inner)
        max_length = number_setting("length", "max_length", max_length, positive=True)
        cache = number_setting("length", "cache", cache, positive=True)
        if not 0 < cache <= max_length:
            raise ValueError(f"length: cache={cache} must be in (0, max_length={max_length}]")
        self.max_length, self.cache = max_length, cache

    def shape(self, out: RewardOutput, lengths: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        r = soft_overlong(lengths, self.max_length, self.cache)
        return out.total.float() + r, {"overlong": r}


class LengthMask(Transform):
    """The wrapped reward only for captions of ``min_length`` to ``max_length`` words (module docstring)."""

    def __init__(self, inner: Reward, *, min_length: float = 0, max_length: float = float("inf")) -> None:
        super().__init__(inner)
        self.min_length = number_setting("length", "min_length", min_length, minimum=0)
        self.max_length = number_setting("length", "max_length", max_length, infinite=True)
        if self.max_length < self.min_length:  # every caption masked: the wrapped reward would never count
            raise ValueError(f"length: max_length={max_length!r} is below min_length={min_length!r}")

    def shape(self, out: RewardOutput, lengths: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        keep = ((lengths >= self.min_length) & (lengths <= self.max_length)).float()
        return out.total.float() * keep, {"length_mask": keep}


TRANSFORMS: dict[str, tuple[type[Transform], tuple[str, ...]]] = {
    "piecewise": (PiecewiseLength, ("l1", "l2", "weight")),
    "soft_overlong": (SoftOverlong, ("max_length", "cache")),
    "mask": (LengthMask, ("min_length", "max_length")),
}
"""``kind=`` names -> (transform class, its parameters)."""


class Shaped(Wrapper):
    """The registry's ``length`` reward: a :class:`Transform` of the reward it is configured with (module docstring).
    ``cfg`` builds a wrapped reward given by name."""

    settings = ("reward", "kind", "l1", "l2", "weight", "max_length", "cache", "min_length")

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.transform: Transform | None = None

    @property
    def inner(self) -> RewardBase:  # type: ignore[override]
        if self.transform is None:
            kinds = ", ".join(TRANSFORMS)
            raise ValueError(f"length: wraps another reward; give reward= (a reward or its name) and kind= (one of "
                             f"{kinds}) as settings (an adapter's options); rl.rewards gives a reward no settings: "
                             "name a factory of your own by dotted path (docs/methods/judges.md)")  # fmt: skip
        return self.transform

    def close(self) -> None:
        if self.transform is not None:  # never configured: nothing wrapped, nothing to release
            self.transform.close()

    def tallies(self) -> dict[str, float]:
        return {} if self.transform is None else self.transform.tallies()  # never configured: nothing counted

    def configure(self, **settings: Any) -> None:
        """``reward=``, ``kind=`` and the transform's parameters; the other settings are the wrapped reward's."""
        if self.transform is not None:
            raise RuntimeError("length: configured already")
        reward, kind = settings.pop("reward", None), settings.pop("kind", "")
        if reward is None:
            self.inner  # noqa: B018 - the error naming the settings
        if kind not in TRANSFORMS:
            raise ValueError(f"length: unknown kind {kind!r}; valid: {', '.join(TRANSFORMS)}")
        cls, params = TRANSFORMS[kind]
        own = {k: settings.pop(k) for k in params if k in settings}
        signature = inspect.signature(cls).parameters
        missing = [k for k in params if k not in own and signature[k].default is inspect.Parameter.empty]
        if missing:
            raise ValueError(f"length: kind={kind} needs {', '.join(f'{k}=' for k in missing)} (its parameters: "
                             f"{', '.join(params)})")  # fmt: skip
        for key in settings.keys() & set(self.settings):
            raise TypeError(f"length: {key}= is not a parameter of kind={kind} ({', '.join(params)})")
        if isinstance(reward, str):
            from finecap.rewards import get_reward

            reward = get_reward(reward, self.cfg)
            reward.configure(**settings)
        elif settings:  # a built reward is set already: configured now, a setting could be half applied
            raise TypeError(f"length: settings {sorted(settings)} are given with a built reward (reward=); give them "
                            "when building it, or give the reward by name")  # fmt: skip
        reward = as_reward(reward, "length: reward=")
        self.transform = cls(reward, **own)

    def __call__(self, captions: Sequence[str], batch: Mapping[str, Any]) -> RewardOutput:
        return self.inner(captions, batch)


def build(cfg: Config) -> Shaped:
    """Factory of the reward registry: a :class:`Shaped` reward, given what it wraps by :meth:`Shaped.configure`."""
    return Shaped(cfg)
