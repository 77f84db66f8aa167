"""Training bags of similar images (NDLB appendix B.2) and the BagCurri batch sampler (appendix B.3).

**Training bags.** From the exact nearest-neighbour table of the training images' multimodal embeddings (TrueMatch's
Algorithm 1 embedding, :mod:`finecap.data.truematch`), restricted to the top ``k = 200`` neighbours of each image
as in the paper, :func:`training_bags` goes through the images as queries; each query not yet in a bag opens a bag
with itself and its ``s-1`` nearest neighbours that are not yet in another bag. Bags are therefore disjoint and every
image is in exactly one bag, i.e. seen once per epoch.

Choices the paper leaves open:

- **Leftovers.** When fewer than ``s-1`` of a query's top-k neighbours are still free (late queries, dense regions),
  the paper does not say what happens. Here the bag is filled up with *random* free images (seeded), so that every
  image is still used once per epoch; :attr:`TrainingBags.filled` counts these random members (with k = 200 they
  are rare: only the last few hundred queries of an epoch run out of free neighbours), and a training run logs the
  count of each epoch's bags as ``bags/filled`` (:meth:`BagCurriSampler.epoch_values`).
- **Last bag.** When fewer than ``s`` images are left, they form one smaller last bag (at most one bag is smaller).
- **Top 200.** The paper keeps ``D[:, :200]`` of the sorted similarity matrix, which may count the query itself (its
  own cosine, 1, comes first); here the query is excluded and its 200 nearest *other* images are kept
  (``data.bag_neighbours``).
- **Query order.** The paper goes "for each row" of the similarity matrix; the row order then decides which images
  get their true nearest neighbours. Queries are visited in a seeded random order (``shuffle_queries=True``) so that
  this does not depend on the data-set file order; ``shuffle_queries=False`` visits them in index order.
- **Bags per size.** Bags are built once per bag size (seed and size fix them) and reused for every epoch of that
  size, as the paper builds them once; ``rebuild_each_epoch=True`` redraws the query order every epoch instead.

**BagCurri.** A schedule ``{end_epoch: bag_size}`` (``bag_size = 0``: random batches) gives the bag size of each
epoch: epoch ``e`` (0-based) uses the size of the smallest ``end_epoch > e``; epochs after the last ``end_epoch`` keep
the last size. E.g. ``{1: 0, 2: 3, 3: 5, 4: 7}`` trains one epoch each with random batches, bags of 3, 5 and 7. A run
that ends before a size's first epoch warns at its start (:meth:`BagCurriSampler.short_run_note`).

**Batches.** A batch is made of whole bags (``batch_size // s`` of them; e.g. 33 bags of 3 = 99 images for a batch
size of 100), so the distractors of an image in an in-batch self-retrieval reward are its bag-mates plus the other
bags. The bag order is shuffled every epoch from ``(seed, epoch)``; everything is deterministic given
``(seed, epoch)``.

**Several processes (accelerate).** :class:`BagCurriSampler` follows :mod:`finecap.data.samplers`: ``batches(epoch)``
returns the *global* batches, and each process takes a contiguous slice of each (the training loop's
``StepBatches``, or this sampler's own ``__iter__`` when built with ``num_processes``/``process_index``; the
DataLoader is then *not* passed through ``accelerator.prepare``, which would shard a second time). In the training
loop (:func:`bagcurri_sampler`) the global batches depend on the global batch size alone, never on how it is split
over processes and accumulation steps, so a step is that of one big batch (docs/training.md): a micro-batch may cut
a bag, whose other members the self-retrieval reward still sees, as it reads the step's whole global batch and its
bag numbers (:class:`~finecap.contract.StepInfo`). Built with ``num_processes`` for its own ``__iter__`` (no engine,
no StepInfo), the number of bags per global batch is rounded down to a multiple of ``num_processes`` (at least one
bag a process: bags larger than a process's share of ``batch_size`` make batches of ``num_processes`` bags, more
images than ``batch_size``), so that each process's slice holds whole bags when the bags are of one size; the one
smaller bag of an epoch (``n`` not a multiple of ``s``) may fall in any batch and shift the slices there.

Example::

    >>> import torch
    >>> nbrs = torch.tensor([[1, 2, 3], [0, 2, 3], [3, 1, 0], [2, 1, 0]])   # neighbour indices, best first
    >>> training_bags(nbrs, 2, shuffle_queries=False).bags
    [[0, 1], [2, 3]]
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from finecap.data.features import cached_tensor, data_changed_ns, fingerprint_data
from finecap.data.samplers import GlobalBatchSampler, RandomBatches, shard
from finecap.data.truematch import nearest_neighbours, record_embeddings
from finecap.home import cache_dir
from finecap.models.retriever import load_retriever
from finecap.registry import requires
from finecap.utils.rng import epoch_seed

if TYPE_CHECKING:
    from finecap.config import Config

TOP_K = 200
"""Neighbours per image considered for training bags (NDLB appendix B.2: ``D[:, :200]``)."""


@dataclass
class TrainingBags:
    """Disjoint bags covering every image once: ``bags`` (lists of image indices, query first) and ``filled``, the
    number of bag members drawn at random because the query's top-k neighbours were all taken."""

    bags: list[list[int]]
    filled: int
    size: int


def training_bags(neighbours: Any, size: int, *, seed: int = 0, shuffle_queries: bool = True) -> TrainingBags:
    """NDLB B.2 training bags of ``size`` from a neighbour table ``(N, k)`` (indices, best first, self excluded).

    Args:
        neighbours: :func:`finecap.data.truematch.nearest_neighbours` indices, or any ``(N, k)`` integer array.
        size: bag size ``s >= 2``.
        seed: seeds the query order and the random fill.
        shuffle_queries: visit queries in a seeded random order (else in index order); see the module docstring.
    """
    nbrs = np.asarray(neighbours.tolist() if hasattr(neighbours, "tolist") else neighbours, dtype=np.int64)
    if nbrs.ndim != 2:
        raise ValueError(f"neighbour table must be (N, k), got shape {nbrs.shape}")
    n = len(nbrs)
    if size < 2:
        raise ValueError(f"training bag size must be >= 2, got {size}")
    rng = np.random.default_rng((seed % 2**64, size))  # any int seed, as run.seed takes
    queries = rng.permutation(n) if shuffle_queries else np.arange(n)
    fill_order = rng.permutation(n)  # random free images are taken in this order
    fill_pos = 0
    used = np.zeros(n, dtype=bool)
    bags: list[list[int]] = []
    filled = 0
    for q in queries.tolist():
        if used[q]:
            continue
        used[q] = True
        row = nbrs[q]
        mates = row[~used[row]][: size - 1].tolist()  # the s-1 nearest free neighbours, best first
        used[mates] = True
        while len(mates) < size - 1 and fill_pos < n:  # top-k exhausted: fill with random free images
            c = int(fill_order[fill_pos])
            fill_pos += 1
            if not used[c]:
                used[c] = True
                mates.append(c)
                filled += 1
        bags.append([q, *mates])
    return TrainingBags(bags, filled, size)


def parse_schedule(schedule: Mapping[Any, Any]) -> list[tuple[int, int]]:
    """Validate ``{end_epoch: bag_size}`` and return it as ``[(end_epoch, size)]`` sorted by end epoch."""
    if not schedule:
        raise ValueError("BagCurri schedule is empty; expected {end_epoch: bag_size}, e.g. {1: 0, 2: 3, 3: 5}")
    out = []
    for end, size in schedule.items():
        try:
            end_i, size_i = int(end), int(size)
        except (TypeError, ValueError):
            raise ValueError(f"BagCurri schedule entry {end!r}: {size!r} is not integer end_epoch: bag_size") from None
        if end_i < 1:
            raise ValueError(f"BagCurri schedule: end epoch must be >= 1, got {end_i}")
        if size_i < 0 or size_i == 1:
            raise ValueError(f"BagCurri schedule: bag size must be 0 (random batches) or >= 2, got {size_i}")
        out.append((end_i, size_i))
    return sorted(out)


class BagCurriSampler(GlobalBatchSampler):
    """Batches of whole training bags whose size follows a BagCurri schedule (module docstring).

    Args:
        neighbours: ``(N, k)`` neighbour indices of the N training images (best first, self excluded); a schedule's
            bag size ``s`` with ``s - 1 > k`` is refused (its bags could not be nearest neighbours).
        batch_size: images per *global* batch (all processes together).
        schedule: ``{end_epoch: bag_size}``; 0 = random batches. ``{1: 3}`` = bags of 3 throughout.
        seed: seeds bags, bag order and random batches.
        num_processes, process_index: this process's share, for :meth:`__iter__` and the bag alignment.
        groups: dataset indices of each image when the dataset has several examples per image (one per reference
            caption); every epoch one of them is drawn per image (seeded), so each image is still seen once.
            Default: dataset index = image index.
        shuffle_queries, rebuild_each_epoch: see :func:`training_bags` and the module docstring.
    """

    def __init__(
        self,
        neighbours: Any,
        batch_size: int,
        schedule: Mapping[Any, Any],
        *,
        seed: int = 0,
        num_processes: int = 1,
        process_index: int = 0,
        groups: Sequence[Sequence[int]] | None = None,
        shuffle_queries: bool = True,
        rebuild_each_epoch: bool = False,
    ) -> None:
        self.neighbours = np.asarray(neighbours.tolist() if hasattr(neighbours, "tolist") else neighbours, np.int64)
        self.n = len(self.neighbours)
        if self.n == 0:
            raise ValueError("BagCurriSampler: no training images")
        if batch_size < 1:
            raise ValueError(f"BagCurriSampler: batch_size must be >= 1, got {batch_size}")
        if not 0 <= process_index < num_processes:
            raise ValueError(f"process_index {process_index} outside [0, {num_processes})")
        self.schedule = parse_schedule(schedule)
        too_big = [s for _, s in self.schedule if s > self.n]
        if too_big:
            raise ValueError(f"BagCurri bag size {too_big[0]} exceeds the {self.n} training images")
        k = self.neighbours.shape[1] if self.neighbours.ndim == 2 else 0
        too_wide = [s for _, s in self.schedule if s - 1 > k]
        if too_wide:  # every bag would hold random images beside the neighbours: not NDLB's bags of nearest ones
            raise ValueError(f"BagCurri bag size {too_wide[0]} needs {too_wide[0] - 1} nearest neighbours per image, "
                             f"the table has {k} (raise data.bag_neighbours)")  # fmt: skip
        if groups is not None and (len(groups) != self.n or any(len(g) == 0 for g in groups)):
            raise ValueError(f"groups must give >= 1 dataset index for each of the {self.n} images")
        self.batch_size, self.seed = batch_size, seed
        self.num_processes, self.process_index = num_processes, process_index
        self.groups = [list(g) for g in groups] if groups is not None else None
        self.shuffle_queries, self.rebuild_each_epoch = shuffle_queries, rebuild_each_epoch
        self.epoch = 0
        self._bags: dict[int, TrainingBags] = {}

    # ---------------------------------------------------------------------------------------------------------------

    def bag_size(self, epoch: int) -> int:
        """Bag size of ``epoch`` (0 = random batches)."""
        for end, size in self.schedule:
            if epoch < end:
                return size
        return self.schedule[-1][1]

    def bags_for(self, size: int, epoch: int = 0) -> TrainingBags:
        """The training bags of ``size`` (image indices), built once per size (or per epoch, see the docstring)."""
        if self.rebuild_each_epoch:
            return training_bags(self.neighbours, size, seed=epoch_seed(self.seed, epoch),
                                 shuffle_queries=self.shuffle_queries)  # fmt: skip
        if size not in self._bags:
            self._bags[size] = training_bags(self.neighbours, size, seed=self.seed,
                                             shuffle_queries=self.shuffle_queries)  # fmt: skip
        return self._bags[size]

    def bags_per_batch(self, size: int) -> int:
        """Whole bags per global batch: ``batch_size // size`` rounded down to a multiple of ``num_processes``, and
        at least one a process: with bags larger than a process's share of the batch, a batch holds ``num_processes``
        bags, more images than ``batch_size`` (module docstring)."""
        per_process = max(1, (self.batch_size // self.num_processes) // size)
        return per_process * self.num_processes

    def image_batches(self, epoch: int) -> list[list[list[int]]]:
        """Global batches of ``epoch`` as lists of bags of *image* indices (random batches: one bag per image)."""
        size = self.bag_size(epoch)
        if size == 0:
            batches = RandomBatches(self.n, self.batch_size, seed=self.seed).batches(epoch)
            return [[[i] for i in b] for b in batches]
        bags = self.bags_for(size, epoch).bags
        order = np.random.default_rng((self.seed % 2**64, epoch)).permutation(len(bags)).tolist()
        per = self.bags_per_batch(size)
        return [[bags[j] for j in order[i : i + per]] for i in range(0, len(order), per)]

    def _example(self, epoch: int) -> list[int] | None:
        if self.groups is None:
            return None
        rng = np.random.default_rng((self.seed % 2**64, epoch, 1))
        return [g[int(rng.integers(len(g)))] for g in self.groups]

    def batches(self, epoch: int) -> list[list[int]]:
        """Global batches of ``epoch`` as flat lists of dataset indices (bag by bag, query first)."""
        example = self._example(epoch)
        out = []
        for batch in self.image_batches(epoch):
            flat = [i for bag in batch for i in bag]
            out.append(flat if example is None else [example[i] for i in flat])
        return out

    def num_batches(self, epoch: int) -> int:
        size = self.bag_size(epoch)
        if size == 0:
            return -(-self.n // self.batch_size)
        return -(-len(self.bags_for(size, epoch).bags) // self.bags_per_batch(size))

    def example_fields(self, epoch: int) -> dict[str, dict[int, int]]:
        """``{"bag": bag_index(epoch)}``: the engine attaches every example's bag number (``batch["bag"]``)."""
        return {"bag": self.bag_index(epoch)}

    def epoch_values(self, epoch: int) -> dict[str, float]:
        """``bags/size`` (0: random batches) and ``bags/filled``, the bag-mates of ``epoch``'s bags drawn at random
        because their query's nearest neighbours were all in other bags (:attr:`TrainingBags.filled`): logged with
        every training step, so a run shows how much of its bags is random (docs/training.md)."""
        size = self.bag_size(epoch)
        return {"bags/size": float(size), "bags/filled": float(self.bags_for(size, epoch).filled if size else 0)}

    def short_run_note(self, steps: int, ends: str) -> str | None:
        """A warning naming the bag sizes of the schedule that a run of ``steps`` optimizer steps never reaches (it
        ends, by ``ends``, before their first epoch); ``None`` when it reaches every one.

        Example::

            >>> s = BagCurriSampler([[1], [0], [3], [2]], 2, {1: 0, 2: 2})   # 2 batches an epoch
            >>> note = s.short_run_note(2, "train.max_steps=2")
            >>> note[note.index("this run") : note.index(": train longer")]
            'this run ends in epoch 1 (train.max_steps=2) and never uses bags of 2 (from epoch 2)'
            >>> s.short_run_note(3, "train.max_steps=3") is None
            True
        """
        last = self.schedule[-1][0]  # from this epoch (0-based) on, the last size is kept: nothing left to reach
        begun, done = 0, 0
        while done < steps and begun < last:
            done += self.num_batches(begun)
            begun += 1
        starts = [0, *(end for end, _ in self.schedule[:-1])]  # stage i's first epoch (0-based)
        used = {size for start, (_, size) in zip(starts, self.schedule, strict=True) if start < begun}
        unused: dict[int, int] = {}  # size: its first epoch (0-based)
        for start, (_, size) in zip(starts, self.schedule, strict=True):
            if size not in used:
                unused.setdefault(size, start)
        if not unused:
            return None
        sizes = ", ".join(("random batches" if size == 0 else f"bags of {size}") + f" (from epoch {start + 1})"
                          for size, start in unused.items())  # fmt: skip
        schedule = "{" + ", ".join(f"{end}: {size}" for end, size in self.schedule) + "}"
        return (f"data.bag_schedule={schedule}: this run ends in epoch {begun} ({ends}) and never uses {sizes}: "
                "train longer or shorten data.bag_schedule")  # fmt: skip

    def bag_index(self, epoch: int) -> dict[int, int]:
        """``{dataset index: bag number}`` of ``epoch`` (bag-mates share a number; random batches: one per image),
        for rewards that take distractors from the bag-mates only."""
        example = self._example(epoch)
        out: dict[int, int] = {}
        b = 0
        for batch in self.image_batches(epoch):
            for bag in batch:
                for i in bag:
                    out[i if example is None else example[i]] = b
                b += 1
        return out

    # torch-style sampler interface (per-process batches) ------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.batches(self.epoch):
            yield shard(batch, self.process_index, self.num_processes)

    def __len__(self) -> int:
        return self.num_batches(self.epoch)


# --------------------------------------------------------------------------------------------------------------------
# Factory for the training loop (data.sampler)
# --------------------------------------------------------------------------------------------------------------------


def neighbour_table(cfg: Config, records: Sequence[Any], k: int = TOP_K) -> torch.Tensor:
    """``(N, min(k, N-1))`` exact neighbour indices of ``records`` under the configured retriever's multimodal
    embeddings (TrueMatch's Algorithm 1), cached in ``<cache>/train_bags/`` (:func:`finecap.home.cache_dir`) by
    model and text settings (:meth:`~finecap.models.retriever.Retriever.text_identity`: tokenizer, text window,
    ``retriever.long_text``), images and captions (the embedding holds the mean of the captions' text embeddings:
    ``data.captions=holistic`` on the same images is another table)."""
    retriever = load_retriever(cfg)
    k = min(k, len(records) - 1)
    captions = hashlib.sha256(json.dumps([list(r.captions) for r in records]).encode()).hexdigest()[:16]
    # the text side's key, not only the model's: the captions' embeddings (tokenizer, text window, long_text) are in it
    key = f"{retriever.text_identity()}-{fingerprint_data(records)}-{captions}-k{k}"
    path = cache_dir(cfg.run) / "train_bags" / f"{key}.safetensors"  # never a pickle: nothing there is unpickled

    def search() -> torch.Tensor:
        emb = record_embeddings(retriever, records, cache_dir(cfg.run))
        return nearest_neighbours(emb, k, device=retriever.device, ids=[r.image_id for r in records])[1]

    return cached_tensor(path, {"key": key}, search, valid=lambda t: is_neighbour_table(t, len(records), k),
                         written_after=data_changed_ns(records))  # fmt: skip


def is_neighbour_table(table: torch.Tensor, n: int, k: int) -> bool:
    """Whether ``table`` can be an ``(n, k)`` neighbour table of :func:`neighbour_table`: integer indices of images
    ``0..n-1``, none an image's own, none twice in a row. A cached file that is not (a damaged or tampered one: all
    zeros would build every bag around image 0) is searched again, never used.

    Example::

        >>> is_neighbour_table(torch.tensor([[1, 2], [2, 0], [0, 1]]), 3, 2)
        True
        >>> is_neighbour_table(torch.tensor([[1, 1], [2, 0], [0, 1]]), 3, 2)  # image 1 twice in the first row
        False
    """
    if table.dtype != torch.long or tuple(table.shape) != (n, k):
        return False
    if n == 0 or k == 0:
        return True
    if int(table.min()) < 0 or int(table.max()) >= n:
        return False
    own = torch.arange(n).unsqueeze(1)  # (n, 1)
    ordered = table.sort(dim=1).values  # (n, k)
    return not bool((table == own).any()) and not bool((ordered[:, 1:] == ordered[:, :-1]).any())


@requires("retriever")
def bagcurri_sampler(
    cfg: Config, dataset: Any, global_batch_size: int, *, schedule: Mapping[Any, Any] | None = None
) -> BagCurriSampler:
    """``data.sampler`` factory: BagCurri over the training data set.

    The schedule is ``schedule`` or ``data.bag_schedule`` and the neighbour count ``data.bag_neighbours`` (default
    200) when the configuration has them. The data set needs ``records`` and, with several examples per image,
    ``examples`` as ``(image, caption)`` pairs (:class:`finecap.data.datasets.CaptionDataset`). A global batch holds
    ``global_batch_size // s`` whole bags whatever the number of processes and accumulation steps (module docstring;
    rounded to whole bags per micro-batch, as until 2026-11-27, 4 micro-batches of 25 took 4 bags of 15, 60 images, a
    step where one batch of 100 takes 6, 90 images).
    """
    schedule = schedule if schedule is not None else getattr(cfg.data, "bag_schedule", None)
    if not schedule:
        raise ValueError("BagCurri sampler needs data.bag_schedule ({end_epoch: bag_size}, 0 = random batches)")
    k = int(getattr(cfg.data, "bag_neighbours", TOP_K))
    records = getattr(dataset, "records", None)
    if records is None:
        raise ValueError(f"BagCurri: the training data set {type(dataset).__name__} has no 'records'")
    groups = None
    if len(dataset) != len(records):
        examples = getattr(dataset, "examples", None)
        if examples is None:
            raise ValueError("BagCurri: the data set has several examples per image but no 'examples' list")
        groups = [[] for _ in records]
        for index, (image, _) in enumerate(examples):
            groups[image].append(index)
    return BagCurriSampler(neighbour_table(cfg, records, k), global_batch_size, schedule, seed=cfg.run.seed,
                           groups=groups)  # fmt: skip
