"""What a reward is, and the weighted sum of named rewards ``R = sum_i w_i * r_i``.

A reward is a callable ``reward(captions, batch) -> RewardOutput(total, parts)``:

- ``captions``: N generated captions (strings, as decoded by the captioner).
- ``batch``: the training batch (see :mod:`finecap.data.datasets`: ``features`` or ``pixel_values``, ``image_ids``,
  ``references``, ...) plus ``image_index`` (N,): caption ``n`` describes batch row ``image_index[n]`` (rows of one
  image are contiguous when several captions are sampled per image). Without ``image_index`` caption ``n`` belongs
  to row ``n``. :func:`caption_rows` reads it.
- ``total``: (N,) float tensor, one reward per caption; ``parts``: named (N,) tensors that are logged separately
  (a plain reward returns ``{name: total}``; a reward made of pieces may return each piece). Every value is finite:
  a NaN or infinite one is an error naming the reward, the part and the caption (:func:`check_finite`, which
  :class:`WeightedSum` applies to each reward and to the weighted sum), never a reward that trains.

Rewards that need state (CIDEr-D document frequencies, a frozen retriever, image embeddings) are classes with the
optional hooks of objectives (:mod:`finecap.objectives.base`), which the REINFORCE objective forwards:

- ``setup(ctx: TrainContext)``: once before training, with the accelerator (``ctx.accelerator.gather`` lets a reward
  score against the *global* batch, e.g. in-batch distractors across processes), the training records, the
  tokenizer and the run directory;
- ``state_dict()`` / ``load_state_dict(state)``: state that must survive ``--resume``.

A reward that needs every process's captions (retrieval against the global batch) must be called by every process
at the same time, which the objective does: it scores sampled captions and, for the greedy baseline, greedy
captions, in the same order on every process.

Example::

    >>> import torch
    >>> class Length:
    ...     def __call__(self, captions, batch):
    ...         total = torch.tensor([float(len(c.split())) for c in captions])
    ...         return RewardOutput(total, {"length": total})
    >>> reward = WeightedSum({"length": (0.5, Length())})
    >>> reward(["a red circle", "a circle"], {}).total.tolist()
    [1.5, 1.0]
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from finecap.registry import declared_needs

if TYPE_CHECKING:
    from finecap.contract import TrainContext


@dataclass
class RewardOutput:
    """One reward per caption (``total`` (N,)) and named parts (each (N,)) that are logged separately."""

    total: torch.Tensor
    parts: dict[str, torch.Tensor] = field(default_factory=dict)


class NonFiniteReward(ValueError):
    """A reward returned a NaN or infinite value (:func:`check_finite`); the message names the reward, its part and
    the caption."""


def _first_non_finite(values: torch.Tensor) -> tuple[int, float, int, int] | None:
    """``(index, value, count, n)``: the first non-finite value of ``values`` (n values), its index and how many are
    not finite; ``None`` when all are."""
    values = torch.as_tensor(values).detach().flatten()
    if not values.is_floating_point():
        return None  # integers and booleans are always finite
    bad = ~torch.isfinite(values)
    if not bool(bad.any()):
        return None
    index = int(bad.nonzero()[0, 0])
    return index, float(values[index]), int(bad.sum()), values.numel()


def check_finite(out: RewardOutput, name: str) -> RewardOutput:
    """``out`` itself when its total and every part are finite, else a :class:`NonFiniteReward` naming the reward
    ``name``, the part (``total`` or the part's name) and the first caption whose value is not finite. The one check
    of a reward's values at a boundary: the weighted sum (so the training loop), the reward server, the adapters.

    >>> ok = RewardOutput(torch.tensor([0.5, 1.0]), {"hits": torch.tensor([1, 0])})
    >>> check_finite(ok, "cider") is ok
    True
    >>> check_finite(RewardOutput(torch.tensor([0.5, float("nan"), float("inf")])), "cider")
    Traceback (most recent call last):
    ...
    finecap.rewards.base.NonFiniteReward: reward 'cider': total is nan at caption 1 (2 of 3 captions not finite); a ...
    """
    for part, values in (("total", out.total), *out.parts.items()):
        found = _first_non_finite(values)
        if found is not None:
            index, value, count, n = found
            where = "total" if part == "total" else f"part {part!r}"
            raise NonFiniteReward(
                f"reward {name!r}: {where} is {value} at caption {index} ({count} of {n} captions not finite); a "
                "reward must be a finite number for every caption"
            )
    return out


class Reward(Protocol):
    def __call__(self, captions: Sequence[str], batch: Mapping[str, Any]) -> RewardOutput: ...


def caption_rows(captions: Sequence[str], batch: Mapping[str, Any]) -> torch.Tensor:
    """(N,) long: the batch row each caption describes (``batch['image_index']``, else ``arange(N)``)."""
    index = batch.get("image_index")
    n = len(captions)
    if index is None:
        return torch.arange(n)
    index = torch.as_tensor(index).long().cpu()
    if index.shape != (n,):
        raise ValueError(f"reward: batch['image_index'] has shape {tuple(index.shape)} for {n} captions")
    return index


CAPTION_REFERENCES = "caption_references"
"""The batch key of a call's own references, one list per caption (:func:`call_batch`; read by the CIDEr-D reward,
:mod:`finecap.rewards.cider`); training batches never carry it."""


def call_batch(image_ids: Sequence[Hashable], references: Sequence[Sequence[str]] | None = None) -> dict[str, Any]:
    """The batch a reward is called with outside a training run (adapters, the reward server): caption ``n``
    describes the image ``image_ids[n]``; the batch's images are the distinct ids in order of first appearance
    (``image_ids``) and ``image_index`` ``(N,)`` gives each caption's row among them; ``references`` (one list per
    caption), when given, are the call's own references (:data:`CAPTION_REFERENCES`).

    >>> batch = call_batch([7, 9, 7])
    >>> batch["image_ids"], batch["image_index"].tolist()
    ([7, 9], [0, 1, 0])
    """
    distinct = list(dict.fromkeys(image_ids))
    row = {image_id: r for r, image_id in enumerate(distinct)}
    batch = {"image_ids": distinct, "image_index": torch.tensor([row[i] for i in image_ids], dtype=torch.long)}
    if references is not None:
        if len(references) != len(image_ids):
            raise ValueError(f"call_batch: {len(references)} reference lists for {len(image_ids)} captions")
        batch[CAPTION_REFERENCES] = [list(r) for r in references]
    return batch


def per_caption(reward: Any) -> bool:
    """Whether ``reward`` scores each caption on its own: its value for a caption depends on the caption and its
    image alone, never on the call's other captions or images (``per_caption = True``, as CIDEr-D against fixed
    document frequencies), so that calls may be merged or split without changing a value (the reward server merges
    concurrent requests of such rewards, :mod:`finecap.serve`). Unmarked rewards are assumed not to."""
    return bool(getattr(reward, "per_caption", False))


def compares_images(reward: Any) -> bool:
    """Whether ``reward`` ranks each caption's image against the call's other images (``compares_images =
    True``: self-retrieval with in-batch distractors, the listener), so that a call holding a single distinct image
    gives every caption the same, meaningless value (nothing to tell its image from)."""
    return bool(getattr(reward, "compares_images", False))


def known_images(reward: Any) -> frozenset[Hashable] | None:
    """The image ids ``reward`` can score (``reward.known_images()``: the images of its references, embeddings or
    scenes), or ``None`` when it does not say (a reward of your own scores whatever ids it is given). The adapters
    check a call's ids against them in process as the reward server checks a request's
    (:class:`finecap.serve.service.ImageTable`)."""
    fn = getattr(reward, "known_images", None)
    return frozenset(fn()) if callable(fn) else None


def call_hook(obj: Any, hook: str, *args: Any) -> Any:
    """Call ``obj.hook(*args)`` when ``obj`` defines it (optional setup / state hooks)."""
    fn = getattr(obj, hook, None)
    return fn(*args) if callable(fn) else None


class WeightedSum:
    """``R = sum_i w_i * r_i`` over named rewards; ``parts`` holds every reward's *unweighted* value by its name.

    A component's own parts other than its name are kept as ``"<name>/<part>"``. Hooks (``setup``,
    ``state_dict``, ``load_state_dict``) are forwarded to the components that define them. Each component's output
    and the weighted sum are checked finite (:func:`check_finite`: a :class:`NonFiniteReward` naming the component
    and part, or ``rl.rewards`` when finite rewards times their weights overflow).
    """

    def __init__(self, rewards: Mapping[str, tuple[float, Reward]]):
        if not rewards:
            raise ValueError("rl.rewards: needs at least one reward")
        self.rewards = dict(rewards)

    @property
    def needs(self) -> frozenset[str]:
        """What the component rewards need prepared (:func:`finecap.registry.declared_needs`)."""
        return frozenset().union(*(declared_needs(r) for r in self._components()))

    @property
    def per_caption(self) -> bool:
        """Every component scores each caption on its own (:func:`per_caption`)."""
        return all(per_caption(r) for r in self._components())

    @property
    def compares_images(self) -> bool:
        """Some component ranks each caption's image against the call's others (:func:`compares_images`)."""
        return any(compares_images(r) for r in self._components())

    def known_images(self) -> frozenset[Hashable] | None:
        """The images every component that says which it knows can score (:func:`known_images`), or ``None``."""
        sets = [s for s in (known_images(r) for r in self._components()) if s is not None]
        return frozenset.intersection(*sets) if sets else None

    def setup(self, ctx: TrainContext) -> None:
        for reward in self._components():
            call_hook(reward, "setup", ctx)

    def _components(self) -> list[Reward]:
        return [r for _, r in self.rewards.values()]

    def __call__(self, captions: Sequence[str], batch: Mapping[str, Any]) -> RewardOutput:
        total: torch.Tensor | None = None
        parts: dict[str, torch.Tensor] = {}
        for name, (weight, reward) in self.rewards.items():
            out = check_finite(reward(captions, batch), name)
            value = out.total.detach().float()
            if value.shape != (len(captions),):
                raise ValueError(f"reward {name!r} returned shape {tuple(value.shape)} for {len(captions)} captions")
            if total is not None:
                value = value.to(total.device)
            total = weight * value if total is None else total + weight * value  # (N,)
            parts[name] = value
            for key, part in out.parts.items():
                if key != name:
                    parts[f"{name}/{key}"] = part.detach().float()
        assert total is not None
        check_finite(RewardOutput(total), "rl.rewards, the weighted sum")  # finite values times weights may overflow
        return RewardOutput(total, parts)

    def state_dict(self) -> dict[str, Any]:
        out = {}
        for name, (_, reward) in self.rewards.items():
            state = call_hook(reward, "state_dict")
            if state is not None:
                out[name] = state
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name, sub in state.items():
            if name in self.rewards:
                call_hook(self.rewards[name][1], "load_state_dict", sub)
