"""What a reward is (:class:`RewardBase`), its values (:class:`RewardOutput`) and the weighted sum of named rewards
``R = sum_i w_i * r_i`` (:class:`WeightedSum`).

A reward is called ``reward(captions, batch) -> RewardOutput(total, parts, failed)``:

- ``captions``: N generated captions (strings, as decoded by the captioner).
- ``batch``: the training batch (see :mod:`finecap.data.datasets`: ``features`` or ``pixel_values``, ``image_ids``,
  ``references``, ...) plus ``image_index`` (N,): caption ``n`` describes batch row ``image_index[n]`` (rows of one
  image are contiguous when several captions are sampled per image). Without ``image_index`` caption ``n`` belongs
  to row ``n`` (:func:`caption_rows`). Outside a run the batch is :func:`call_batch`'s.
- ``total``: (N,) float tensor, one reward per caption; ``parts``: named (N,) tensors logged separately; ``failed``:
  ``None`` or (N,) bool, the captions the reward could not score (a judge that failed): their values mean nothing
  and are never paid as 0. Every other value is finite (:func:`check_finite`).

Rewards derive from :class:`RewardBase`, which declares every fact and hook its users read, with defaults, so that
nobody probes for them (a plain callable is wrapped once by :func:`as_reward`): ``needs``, ``per_caption``,
``compares_images``, ``settings``; ``setup(inputs)`` with a :class:`finecap.rewards.inputs.RewardInputs` (built from
a training context or from an adapter's options), ``known_images()``, ``state_dict()`` / ``load_state_dict()``,
``tallies()`` (running counts of the reward's work: a judge's calls and failures, which training logs per step).
docs/architecture.md ("How to add a reward") has the design.

Example::

    >>> class Length(RewardBase):
    ...     def __call__(self, captions, batch):
    ...         total = torch.tensor([float(len(c.split())) for c in captions])
    ...         return RewardOutput(total, {"length": total})
    >>> reward = WeightedSum({"length": (0.5, Length())})
    >>> reward(["a red circle", "a circle"], {}).total.tolist()
    [1.5, 1.0]
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch

from finecap.data.records import id_text, refuse_repeated_ids
from finecap.registry import declared_needs
from finecap.utils.closing import close_all

if TYPE_CHECKING:
    from finecap.rewards.inputs import RewardInputs


@dataclass
class RewardOutput:
    """One reward per caption (``total`` (N,)), named parts (each (N,)) that are logged separately, and ``failed``:
    ``None`` or an (N,) bool mask of the captions the reward could not score (e.g. a judge that failed). A failed
    caption's values mean nothing and are never paid as 0: :func:`check_finite` ignores them, :class:`WeightedSum`
    ORs its components' masks and makes the total NaN there, the reward server's ``/reward`` answers them as JSON
    ``null`` (with their count) and its ``/get_reward`` with a 502 naming them (OpenRLHF reads every reward as a
    number; its in-process ``reward_func`` raises the same error, ms-swift's adapter too: ms-swift would sum a NaN as
    0), TRL's adapter as ``None`` (TRL reads it as NaN) and verl's as NaN."""

    total: torch.Tensor
    parts: dict[str, torch.Tensor] = field(default_factory=dict)
    failed: torch.Tensor | None = None

    def failed_mask(self) -> torch.Tensor | None:
        """``failed`` as an (N,) bool tensor on the CPU (``None`` when no caption failed), checked for its shape."""
        if self.failed is None:
            return None
        mask = torch.as_tensor(self.failed).detach().cpu().bool()
        n = torch.as_tensor(self.total).numel()
        if mask.shape != (n,):
            raise ValueError(f"reward: failed has shape {tuple(mask.shape)} for {n} captions")
        return mask if bool(mask.any()) else None

    def scored(self) -> int:
        """How many captions the reward scored: all but the ``failed`` ones.

        >>> RewardOutput(torch.tensor([0.5, float("nan"), 1.0]), failed=torch.tensor([False, True, False])).scored()
        2
        """
        failed = self.failed_mask()
        return torch.as_tensor(self.total).numel() - (0 if failed is None else int(failed.sum()))

    def failed_as_nan(self) -> RewardOutput:
        """The output with the total of every ``failed`` caption NaN (itself when none failed): the one rule that a
        failed caption is never paid, whatever number its reward left in its total (only its ``failed`` flag says it
        failed; :func:`check_finite` does not read it). Every baseline and statistic of the RL objectives skips NaN,
        so such a number can reach none of them. :class:`WeightedSum` applies it to its sum, the RL objectives to the
        output of a reward given to them as is (``Reinforce(reward=...)``; until 2026-11-29 its number was the
        leave-one-out and running-mean baselines' and, for a greedy caption, the greedy baseline itself). The parts
        are left as the reward gave them (a judge's ``judge_failed`` part is 1 there).

        >>> out = RewardOutput(torch.tensor([0.5, 0.0]), failed=torch.tensor([False, True])).failed_as_nan()
        >>> out.total.tolist(), out.failed.tolist()
        ([0.5, nan], [False, True])
        """
        mask = self.failed_mask()
        if mask is None:
            return self
        total = torch.as_tensor(self.total)
        total = total if total.is_floating_point() else total.float()
        return replace(self, total=total.masked_fill(mask.to(total.device), math.nan))

    def split(self, sizes: Sequence[int]) -> list[RewardOutput]:
        """The output cut into consecutive calls of ``sizes`` captions (float32 on the CPU, detached): how a merged
        call of the reward server is answered request by request. A ``ValueError`` unless the total and every part
        hold one value per caption (``sum(sizes)``): cut otherwise, a call would be answered another's values."""
        total = torch.as_tensor(self.total).detach().float().cpu()
        parts = {name: torch.as_tensor(p).detach().float().cpu() for name, p in self.parts.items()}
        n_all = sum(sizes)
        for name, values in (("total", total), *parts.items()):
            if values.shape != (n_all,):
                where = "total" if name == "total" else f"part {name!r}"
                raise ValueError(f"reward: {where} has shape {tuple(values.shape)} for {n_all} captions (a reward "
                                 "gives one value per caption)")  # fmt: skip
        failed = self.failed_mask()
        out, at = [], 0
        for n in sizes:
            cut = slice(at, at + n)
            out.append(RewardOutput(total[cut], {k: v[cut] for k, v in parts.items()},
                                    None if failed is None else failed[cut]))  # fmt: skip
            at += n
        return out

    def values(self, failed: float | None = math.nan) -> tuple[list[float | None], dict[str, list[float | None]]]:
        """``(total, parts)`` as Python floats (of float32 values, as every front end answers them), the values of
        failed captions replaced by ``failed`` (NaN; ``None`` for JSON's ``null`` and TRL)."""
        mask = self.failed_mask()
        bad = [] if mask is None else mask.nonzero().flatten().tolist()

        def floats(values: torch.Tensor) -> list[float | None]:
            out: list[float | None] = values.detach().float().cpu().tolist()
            for i in bad:
                out[i] = failed
            return out

        return floats(self.total), {name: floats(p) for name, p in self.parts.items()}


def scored_mean(values: torch.Tensor) -> float:
    """The mean of ``values`` over its finite entries (NaN only when none is): a logged mean of a reward's total or
    part, which leaves out the captions a reward could not score (NaN there), and nothing else; the training loop's
    (``reward/<part>``: :class:`finecap.objectives.reinforce.Reinforce`) and TRL's (``rewards/<name>/<part>/mean``:
    :class:`finecap.integrations.trl.TrlReward`) alike. A judged reward's ``judge_failed`` part, 1 at the captions
    the judge failed on, so averages to the share failed.

    >>> scored_mean(torch.tensor([1.0, float("nan"), 2.0])), scored_mean(torch.tensor([0.0, 1.0, 0.0, 0.0]))
    (1.5, 0.25)
    """
    values = torch.as_tensor(values).detach().float()
    finite = values[torch.isfinite(values)]
    return float(finite.mean()) if finite.numel() else math.nan


class NonFiniteReward(ValueError):
    """A reward returned a NaN or infinite value (:func:`check_finite`); the message names the reward, its part and
    the caption."""


def _first_non_finite(values: torch.Tensor, failed: torch.Tensor | None) -> tuple[int, float, int, int] | None:
    """``(index, value, count, n)``: the first non-finite value of ``values`` (n values) outside the ``failed``
    captions, its index and how many are not finite; ``None`` when all are."""
    values = torch.as_tensor(values).detach().flatten().cpu()
    if not values.is_floating_point():
        return None  # integers and booleans are always finite
    bad = ~torch.isfinite(values)
    if failed is not None and failed.shape == bad.shape:
        bad &= ~failed
    if not bool(bad.any()):
        return None
    index = int(bad.nonzero()[0, 0])
    return index, float(values[index]), int(bad.sum()), values.numel()


def check_finite(out: RewardOutput, name: str) -> RewardOutput:
    """``out`` itself when its total and every part are finite (the values of its ``failed`` captions are not
    read), else a :class:`NonFiniteReward` naming the reward ``name``, the part (``total`` or the part's name) and
    the first caption whose value is not finite. The one check of a reward's values at a boundary: the weighted sum
    (so the training loop), the reward server, the adapters.

    >>> ok = RewardOutput(torch.tensor([0.5, 1.0]), {"hits": torch.tensor([1, 0])})
    >>> check_finite(ok, "cider") is ok
    True
    >>> judged = RewardOutput(torch.tensor([0.5, float("nan")]), failed=torch.tensor([False, True]))
    >>> check_finite(judged, "judge") is judged  # caption 1 failed: its value is not read
    True
    >>> check_finite(RewardOutput(torch.tensor([0.5, float("nan"), float("inf")])), "cider")
    Traceback (most recent call last):
    ...
    finecap.rewards.base.NonFiniteReward: reward 'cider': total is nan at caption 1 (2 of 3 captions not finite); a ...
    """
    failed = out.failed_mask()
    for part, values in (("total", out.total), *out.parts.items()):
        found = _first_non_finite(values, failed)
        if found is not None:
            index, value, count, n = found
            where = "total" if part == "total" else f"part {part!r}"
            raise NonFiniteReward(
                f"reward {name!r}: {where} is {value} at caption {index} ({count} of {n} captions not finite); a "
                "reward must be a finite number for every caption"
            )
    return out


class Reward(Protocol):
    """A reward's call signature: a :class:`RewardBase`, or a plain callable that :func:`as_reward` wraps."""

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
"""The batch key of a call's own references, one list per caption (:func:`call_batch`; read by the CIDEr-D, claims
and CHAIR rewards in place of an image's references); training batches never carry it."""


def call_batch(image_ids: Sequence[Hashable], references: Sequence[Sequence[str]] | None = None) -> dict[str, Any]:
    """The batch a reward is called with outside a training run (adapters, the reward server): caption ``n``
    describes the image ``image_ids[n]``; the batch's images are the distinct images in order of first appearance
    (``image_ids``, each as first written: ``7`` and ``"7"`` are one image, :func:`~finecap.data.records.id_text`)
    and ``image_index`` ``(N,)`` gives each caption's row among them; ``references`` (one list per caption), when
    given, are the call's own references (:data:`CAPTION_REFERENCES`).

    >>> batch = call_batch([7, 9, "7"])
    >>> batch["image_ids"], batch["image_index"].tolist()
    ([7, 9], [0, 1, 0])
    """
    texts = [id_text(i) for i in image_ids]
    first: dict[str, Hashable] = {}  # each image's id as first written
    for text, image_id in zip(texts, image_ids):
        first.setdefault(text, image_id)
    row = {text: r for r, text in enumerate(first)}
    batch = {"image_ids": list(first.values()), "image_index": torch.tensor([row[t] for t in texts], dtype=torch.long)}
    if references is not None:
        if len(references) != len(image_ids):
            raise ValueError(f"call_batch: {len(references)} reference lists for {len(image_ids)} captions")
        batch[CAPTION_REFERENCES] = [list(r) for r in references]
    return batch


def keyed_table(table: Mapping[Hashable, Any] | None, what: str, entry: Callable[[Any], Any] | None = None
                ) -> dict[Hashable, Any] | None:  # fmt: skip
    """``table``, an input a reward keys by image id (references, scenes, objects, questions), as it enters the
    reward: copied as a dict (``entry`` copies each value: ``list`` for reference lists), ``None`` as it is. Two ids
    naming one image (``1`` and ``"1"``) are a ``ValueError`` naming ``what``
    (:func:`~finecap.data.records.refuse_repeated_ids`): the reward finds an image's entry whichever way either side
    writes its id (:func:`~finecap.data.records.id_key`, the exact key first), so which of the two a caption met would
    hang on how its call spelt the id, as ``finecap eval`` and the metrics refuse such inputs.

    >>> keyed_table({1: ("a red circle",), "2": ("a blue square",)}, "claims references", list)
    {1: ['a red circle'], '2': ['a blue square']}
    """
    if table is None:
        return None
    refuse_repeated_ids(table, what)
    return {i: v if entry is None else entry(v) for i, v in table.items()}


def number_setting(reward: str, key: str, value: Any, *, minimum: float | None = None, positive: bool = False,
                   infinite: bool = False) -> float:  # fmt: skip
    """``value`` of the setting ``key`` of ``reward`` as a float: a real number (never a bool or a string), finite
    (``infinite``: ``+inf`` too), at least ``minimum``, above 0 when ``positive``; else a ``ValueError`` naming both.

    >>> number_setting("chair", "recall_weight", 1)
    1.0
    >>> number_setting("cider", "sigma", "6")
    Traceback (most recent call last):
    ...
    ValueError: cider: sigma='6' must be a number
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{reward}: {key}={value!r} must be a number")
    number = float(value)
    if math.isnan(number) or (math.isinf(number) and not (infinite and number > 0)):
        raise ValueError(f"{reward}: {key}={value!r} must be a finite number")
    if positive and number <= 0:
        raise ValueError(f"{reward}: {key}={value!r} must be above 0")
    if minimum is not None and number < minimum:
        raise ValueError(f"{reward}: {key}={value!r} must be at least {minimum:g}")
    return number


def flag_setting(reward: str, key: str, value: Any) -> bool:
    """``value`` of the setting ``key`` of ``reward``: ``True`` or ``False`` (a string such as ``"false"`` would
    read as true), else a ``ValueError`` naming both."""
    if not isinstance(value, bool):
        raise ValueError(f"{reward}: {key}={value!r} must be True or False")
    return value


class RewardBase:
    """Base of rewards: the facts and hooks every user of a reward reads (the REINFORCE objective, the reward server,
    the adapters), with defaults (module docstring)."""

    needs: frozenset[str] = frozenset()
    """What must be prepared before :meth:`setup` (``{"retriever"}``: :func:`finecap.registry.declared_needs`)."""
    per_caption: bool = False
    """A caption's value depends on the caption and its image alone, never on the call's other captions (CIDEr-D
    against fixed document frequencies): calls may be merged or split without changing a value (the reward server
    merges concurrent requests of such rewards)."""
    compares_images: bool = False
    """The reward ranks each caption's image against the call's other images (self-retrieval with in-batch
    distractors, the listener): a call of one distinct image gives meaningless values and is refused."""
    settings: ClassVar[tuple[str, ...]] = ()
    """Keyword settings a caller outside a run may give (:meth:`configure`) that no configuration key holds
    (CIDEr-D's ``sigma``)."""

    def __call__(self, captions: Sequence[str], batch: Mapping[str, Any]) -> RewardOutput:
        raise NotImplementedError

    def setup(self, inputs: RewardInputs) -> None:
        """Called once before the first call, with what the reward reads (references, images, retriever, ...)."""

    def configure(self, **settings: Any) -> None:
        """Set the declared :attr:`settings`, each checked by :meth:`check_setting` before any is set; any other name
        is a ``TypeError``. A reward whose set-up reads a setting applies it or refuses it after :meth:`setup`."""
        for key in settings:
            if key not in self.settings:
                valid = ", ".join(self.settings) or "none"
                raise TypeError(f"unexpected keyword argument {key!r} (settings: {valid}; data: the fields of "
                                "RewardInputs)")  # fmt: skip
        checked = {key: self.check_setting(key, value) for key, value in settings.items()}
        for key, value in checked.items():
            setattr(self, key, value)

    def check_setting(self, key: str, value: Any) -> Any:
        """``value`` of the setting ``key`` as the reward keeps it, or a ``ValueError`` naming the reward and the
        setting (:func:`number_setting`, :func:`flag_setting`); by default any value is kept."""
        return value

    def known_images(self) -> Collection[Hashable] | None:
        """The image ids the reward can score (its references', embeddings' or scenes'), or ``None`` when it does not
        say (any id is passed on). The adapters and the reward server refuse other ids before calling it."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """State that must survive ``--resume`` (JSON-able values and tensors)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`."""

    def tallies(self) -> dict[str, float]:
        """Running counts of the reward's work since it was built, by name, the same names at every call (a judged
        reward's judge's: ``judge/calls``, ``judge/failed``, ..., :meth:`finecap.judges.base.Judge.tallies`); a
        training run logs each step's increase, summed over the processes, as ``reward/<name>/<key>``
        (:meth:`finecap.objectives.reinforce.Reinforce.step_values`). None by default."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release what the reward opened itself (a judge it built: a server's connections, an in-process engine);
        called once when training ends (the objective's ``close``) or the reward server stops."""


class FunctionReward(RewardBase):
    """A plain callable ``fn(captions, batch) -> RewardOutput`` as a reward: no set-up, no state; its declared facts
    (``needs``, ``per_caption``, ``compares_images`` attributes of ``fn``, when it has them) are read once, here."""

    def __init__(self, fn: Callable[[Sequence[str], Mapping[str, Any]], RewardOutput]) -> None:
        self.fn = fn
        self.needs = declared_needs(fn)
        self.per_caption = bool(getattr(fn, "per_caption", False))
        self.compares_images = bool(getattr(fn, "compares_images", False))

    def __call__(self, captions: Sequence[str], batch: Mapping[str, Any]) -> RewardOutput:
        return self.fn(captions, batch)


def as_reward(obj: Any, option: str = "rl.rewards") -> RewardBase:
    """``obj`` itself when it is a :class:`RewardBase`, a plain callable wrapped in :class:`FunctionReward`; anything
    else is a ``ValueError`` naming ``option``."""
    if isinstance(obj, RewardBase):
        return obj
    if callable(obj):
        return FunctionReward(obj)
    raise ValueError(f"{option}: expected a reward (a RewardBase or a callable), got {type(obj).__name__}")


class WeightedSum(RewardBase):
    """``R = sum_i w_i * r_i`` over named rewards; ``parts`` holds every reward's *unweighted* value by its name.

    A component's own parts other than its name are kept as ``"<name>/<part>"``. Facts combine (``needs``: the union;
    ``per_caption``: all; ``compares_images``: any; ``known_images``: the intersection) and hooks are forwarded.
    Each component's output and the weighted sum are checked finite (:func:`check_finite`: a
    :class:`NonFiniteReward` naming the component and part, or ``rl.rewards`` when finite rewards times their weights
    overflow). ``failed`` is the OR of the masks of the components that weigh (a weight of 0 logs a reward's values
    without paying them, so its failures fail no caption), and the total of a failed caption is NaN.
    """

    def __init__(self, rewards: Mapping[str, tuple[float, Any]]):
        if not rewards:
            raise ValueError("rl.rewards: needs at least one reward")
        self.rewards = {name: (float(w), as_reward(r, f"rl.rewards.{name}")) for name, (w, r) in rewards.items()}

    def _components(self) -> list[RewardBase]:
        return [r for _, r in self.rewards.values()]

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset().union(*(declared_needs(r) for r in self._components()))

    @property
    def per_caption(self) -> bool:  # type: ignore[override]
        return all(r.per_caption for r in self._components())

    @property
    def compares_images(self) -> bool:  # type: ignore[override]
        return any(r.compares_images for r in self._components())

    def known_images(self) -> frozenset[Hashable] | None:
        """The images every component knows, an id written as an int by one and as its string by another one image
        (a COCO ``instances`` file keys ints, a JSONL data set strings; :func:`~finecap.data.records.id_text`, so an
        integral float is its integer), written as the first component writes it."""
        sets = [s for s in (r.known_images() for r in self._components()) if s is not None]
        if not sets:
            return None
        known = {id_text(i): i for i in sets[0]}
        for other in sets[1:]:
            texts = {id_text(i) for i in other}
            known = {text: i for text, i in known.items() if text in texts}
        return frozenset(known.values())

    def setup(self, inputs: RewardInputs) -> None:
        for reward in self._components():
            reward.setup(inputs)

    def __call__(self, captions: Sequence[str], batch: Mapping[str, Any]) -> RewardOutput:
        total: torch.Tensor | None = None
        failed: torch.Tensor | None = None
        parts: dict[str, torch.Tensor] = {}
        for name, (weight, reward) in self.rewards.items():
            out = check_finite(reward(captions, batch), name)
            value = out.total.detach().float()
            if value.shape != (len(captions),):
                raise ValueError(f"reward {name!r} returned shape {tuple(value.shape)} for {len(captions)} captions")
            parts[name] = value
            for key, part in out.parts.items():
                if key != name:
                    parts[f"{name}/{key}"] = part.detach().float()
            if weight == 0.0:  # logged only: it neither pays a caption nor, failing, leaves one unpaid
                continue
            mask = out.failed_mask()
            if mask is not None:
                failed = mask if failed is None else failed | mask
            if total is not None:
                value = value.to(total.device)
            total = weight * value if total is None else total + weight * value  # (N,)
        if total is None:  # every weight 0 (rl.rewards refuses it; an adapter's sum may hold it)
            total = torch.zeros(len(captions))
        out = RewardOutput(total, parts, failed).failed_as_nan()  # never paid: NaN, not a number that trains
        check_finite(RewardOutput(out.total, failed=failed), "rl.rewards, the weighted sum")  # values x weights: inf
        return out

    def state_dict(self) -> dict[str, Any]:
        out = {}
        for name, (_, reward) in self.rewards.items():
            state = reward.state_dict()
            if state:
                out[name] = state
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name, sub in state.items():
            if name in self.rewards:
                self.rewards[name][1].load_state_dict(sub)

    def tallies(self) -> dict[str, float]:
        """Every component's :meth:`~RewardBase.tallies` as ``"<name>/<key>"`` (a weight of 0 too: it is called)."""
        return {
            f"{name}/{key}": v for name, (_, reward) in self.rewards.items() for key, v in reward.tallies().items()
        }

    def close(self) -> None:
        """Close every component (each even when another's close fails)."""
        close_all(self._components())
