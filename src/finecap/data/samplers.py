"""Batch samplers: which examples form each global batch of an epoch, and which part each process takes.

A :class:`GlobalBatchSampler` returns the *global* batches of an epoch (all processes together), as a pure function
of ``(seed, epoch)``; :class:`StepBatches` hands process ``rank`` its contiguous micro-batches of each global batch,
starting at a position inside the epoch. Hence:

- the data order is the same with 1 or N processes (only how a global batch is split differs), and
- ``--resume`` continues exactly where a run stopped: the trainer state stores ``(epoch, position)`` and the
  batches of the epoch are recomputed from the seed (nothing about the sampler itself needs saving).

A global batch holds ``train.batch_size × num_processes × train.grad_accum_steps`` examples, cut into that many
contiguous micro-batches whose sizes differ by at most one (the loop weights each micro-batch's loss by its item
count, so uneven slices are fine); only when a (last) global batch has fewer examples than there are micro-batches
are examples repeated, so that no micro-batch is empty.

A sampler (or its factory) may declare ``needs`` (:func:`finecap.registry.requires`): BagCurri needs the retriever
to find bag-mates. Samplers are chosen by ``data.sampler`` from :data:`SAMPLERS` (or a dotted path
``"pkg.module:factory"``); a factory is called as ``factory(cfg, dataset, global_batch_size)``. Curricula such as
BagCurri implement ``batches(epoch)`` differently per epoch (e.g. whole bags per batch) and plug in the same way.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Sampler

from finecap.registry import SAMPLERS, lookup
from finecap.utils.rng import epoch_seed

if TYPE_CHECKING:
    from finecap.config import Config


class GlobalBatchSampler(abc.ABC):
    """Base class: ``batches(epoch)`` returns the list of global batches (lists of dataset indices) of an epoch."""

    @abc.abstractmethod
    def batches(self, epoch: int) -> list[list[int]]:
        """The global batches of ``epoch``, a pure function of the sampler's seed and ``epoch``."""

    def num_batches(self, epoch: int) -> int:
        """Number of global batches of ``epoch`` (override when it is cheaper than building them)."""
        return len(self.batches(epoch))

    def example_fields(self, epoch: int) -> dict[str, dict[int, int]]:
        """Per-example values of ``epoch`` the engine attaches to batches, ``{name: {dataset index: value}}`` (e.g.
        BagCurri's ``"bag"`` numbers); none by default. The engine puts the global batch's values in
        ``batch["step_info"].fields[name]`` and the micro-batch's own rows in ``batch[name]``."""
        return {}

    def epoch_values(self, epoch: int) -> dict[str, float]:
        """Values describing ``epoch``'s batches that the engine logs with every training step's values (e.g.
        BagCurri's ``bags/size`` and ``bags/filled``, docs/training.md's "What a run logs"); none by default."""
        return {}

    def short_run_note(self, steps: int, ends: str) -> str | None:
        """A warning when a run of ``steps`` optimizer steps from epoch 0 ends before a part of this sampler's plan
        (BagCurri: a bag size of ``data.bag_schedule`` it never reaches), ``ends`` naming the option that ends it
        (``train.epochs=2``); ``None`` by default."""
        return None


class RandomBatches(GlobalBatchSampler):
    """A fresh permutation each epoch (seeded by ``seed`` and ``epoch``), cut into batches of ``batch_size``.

    The last batch of an epoch may be smaller (no example is dropped), unless ``drop_last`` (contrastive batches
    need their negatives). With ``shuffle=False`` the order is ``0..n-1`` (evaluation).

    Example::

        >>> RandomBatches(5, 2, shuffle=False).batches(0)
        [[0, 1], [2, 3], [4]]
    """

    def __init__(self, n: int, batch_size: int, *, seed: int = 0, shuffle: bool = True, drop_last: bool = False):
        if n <= 0:
            raise ValueError("RandomBatches: the data set is empty")
        if batch_size < 1:
            raise ValueError(f"RandomBatches: batch_size must be >= 1, got {batch_size}")
        if drop_last and n < batch_size:
            raise ValueError(f"RandomBatches: drop_last with {n} examples leaves no batch of {batch_size}")
        self.n, self.batch_size, self.seed, self.shuffle, self.drop_last = n, batch_size, seed, shuffle, drop_last

    def batches(self, epoch: int) -> list[list[int]]:
        if self.shuffle:
            generator = torch.Generator().manual_seed(epoch_seed(self.seed, epoch))
            order = torch.randperm(self.n, generator=generator).tolist()
        else:
            order = list(range(self.n))
        return [order[i : i + self.batch_size] for i in range(0, self.num_batches(epoch) * self.batch_size,
                                                                 self.batch_size)]  # fmt: skip

    def num_batches(self, epoch: int) -> int:
        return self.n // self.batch_size if self.drop_last else math.ceil(self.n / self.batch_size)


class RepeatedBatches(GlobalBatchSampler):
    """Every global batch of ``inner``, ``times`` times in a row: the GRPO family's ``grpo.iterations`` (TRL's
    ``num_iterations``), whose optimizer steps 2..μ reuse the rollout of the first on the same images
    (:attr:`finecap.objectives.base.ObjectiveBase.batch_repeats`). Each repetition is an optimizer step of its own,
    so an epoch has ``times`` as many steps (``train.epochs`` and the schedule count them) and still shows each
    image once per repetition cycle; per-example fields are ``inner``'s.

    Example::

        >>> RepeatedBatches(RandomBatches(3, 2, shuffle=False), 2).batches(0)
        [[0, 1], [0, 1], [2], [2]]
    """

    def __init__(self, inner: GlobalBatchSampler, times: int):
        if times < 1:
            raise ValueError(f"grpo.iterations must be >= 1, got {times}")
        self.inner, self.times = inner, times

    def batches(self, epoch: int) -> list[list[int]]:
        return [batch for batch in self.inner.batches(epoch) for _ in range(self.times)]

    def num_batches(self, epoch: int) -> int:
        return self.inner.num_batches(epoch) * self.times

    def example_fields(self, epoch: int) -> dict[str, dict[int, int]]:
        return self.inner.example_fields(epoch)

    def epoch_values(self, epoch: int) -> dict[str, float]:
        return self.inner.epoch_values(epoch)

    def short_run_note(self, steps: int, ends: str) -> str | None:
        return self.inner.short_run_note(math.ceil(steps / self.times), ends)  # each inner batch: `times` steps


def repeat_batches(sampler: GlobalBatchSampler, times: int) -> GlobalBatchSampler:
    """``sampler`` itself when ``times`` is 1, else :class:`RepeatedBatches`."""
    return sampler if times == 1 else RepeatedBatches(sampler, times)


def shard(batch: list[int], rank: int, world: int) -> list[int]:
    """Process ``rank``'s contiguous slice of a global batch (sizes differ by at most one; never empty).

    Example::

        >>> [shard([0, 1, 2, 3, 4], r, 2) for r in range(2)]
        [[0, 1, 2], [3, 4]]
        >>> [shard([7], r, 2) for r in range(2)]
        [[7], [7]]
    """
    if len(batch) < world:
        batch = [batch[i % len(batch)] for i in range(world)]
    base, extra = divmod(len(batch), world)
    start = rank * base + min(rank, extra)
    return batch[start : start + base + (1 if rank < extra else 0)]


def step_micro_batches(batch: list[int], rank: int, world: int, accum: int) -> list[list[int]]:
    """Process ``rank``'s ``accum`` micro-batches of one global batch: the global batch is cut into ``world * accum``
    contiguous slices (:func:`shard`); process ``r`` takes slices ``r * accum ... r * accum + accum - 1``.

    Example::

        >>> [step_micro_batches(list(range(8)), r, 2, 2) for r in range(2)]
        [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    """
    return [shard(batch, rank * accum + a, world * accum) for a in range(accum)]


def repeated_micro_batches(size: int, rank: int, world: int, accum: int) -> list[bool]:
    """Which of process ``rank``'s ``accum`` micro-batches of a global batch of ``size`` examples are copies: when
    ``size`` is below ``world * accum``, :func:`shard` repeats the examples to fill every slice (one example each),
    and slice ``i = rank * accum + a`` is a copy of slice ``i - size`` exactly when ``i >= size``. The training
    engine gives the copies no weight, so the step is that of the global batch itself.

    Example::

        >>> [repeated_micro_batches(3, r, 2, 2) for r in range(2)]  # slices [a], [b], [c], [a]
        [[False, False], [False, True]]
        >>> repeated_micro_batches(8, 1, 2, 2)
        [False, False]
    """
    return [size <= rank * accum + a for a in range(accum)]


class StepBatches(Sampler[list[int]]):
    """``batch_sampler`` of a DataLoader: this process's ``accum`` micro-batches of each global batch, in order, from
    global batch ``start`` on."""

    def __init__(self, batches: list[list[int]], *, rank: int = 0, world: int = 1, accum: int = 1, start: int = 0):
        if accum < 1:
            raise ValueError(f"train.grad_accum_steps must be >= 1, got {accum}")
        self.batches, self.rank, self.world, self.accum, self.start = batches, rank, world, accum, start

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.batches[self.start :]:
            yield from step_micro_batches(batch, self.rank, self.world, self.accum)

    def __len__(self) -> int:
        return max(0, len(self.batches) - self.start) * self.accum


def random_sampler(cfg: Config, dataset: Any, global_batch_size: int) -> GlobalBatchSampler:
    return RandomBatches(len(dataset), global_batch_size, seed=cfg.run.seed)


def get_sampler(cfg: Config, dataset: Any, global_batch_size: int) -> GlobalBatchSampler:
    """The training sampler named by ``data.sampler`` (a name of :data:`SAMPLERS` or ``"pkg.module:factory"``)."""
    factory = lookup(cfg.data.sampler, SAMPLERS, "data.sampler", "sampler")
    return factory(cfg, dataset, global_batch_size)


def process_slice(n: int, rank: int, world: int) -> range:
    """Process ``rank``'s contiguous part of ``range(n)`` for evaluation (no repetition; may be empty).

    Example::

        >>> [list(process_slice(5, r, 2)) for r in range(2)]
        [[0, 1, 2], [3, 4]]
    """
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


def process_left(n: int, rank: int, world: int, done: Callable[[int], bool]) -> list[int]:
    """Process ``rank``'s contiguous part (:func:`process_slice`) of the indices of ``range(n)`` not ``done``: what
    is left of a resumed captioning run (``finecap caption``) shared evenly among the processes now, whatever
    process count made the part done (docs/caption.md#a-stopped-run-resumes).

    Example::

        >>> [process_left(6, r, 2, lambda i: i < 2) for r in range(2)]
        [[2, 3], [4, 5]]
    """
    left = [i for i in range(n) if not done(i)]
    part = process_slice(len(left), rank, world)
    return left[part.start : part.stop]
