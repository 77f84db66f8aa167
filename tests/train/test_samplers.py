import pytest
import torch

from finecap.data.samplers import (
    RandomBatches,
    StepBatches,
    process_slice,
    repeated_micro_batches,
    shard,
    step_micro_batches,
)


def test_random_batches_reproducible_and_cover_each_index_once():
    s = RandomBatches(10, 4, seed=3)
    b0 = s.batches(0)
    assert b0 == RandomBatches(10, 4, seed=3).batches(0)  # a pure function of (seed, epoch)
    assert [len(b) for b in b0] == [4, 4, 2] and s.num_batches(0) == 3
    assert sorted(i for b in b0 for i in b) == list(range(10))
    assert s.batches(1) != b0  # a new permutation each epoch
    assert RandomBatches(10, 4, seed=4).batches(0) != b0


def test_random_batches_take_any_integer_seed():
    # run.seed is any integer (run.seed=$(date +%s%N) is 1.7e18): seed * 1_000_003 overflowed torch's manual_seed
    # ("Overflow when unpacking long long") at the first training step; the epoch's seed is taken modulo 2**64
    big = 1_700_000_000_000_000_000
    batches = RandomBatches(10, 4, seed=big).batches(1)
    want = torch.randperm(10, generator=torch.Generator().manual_seed((big * 1_000_003 + 1) % 2**64)).tolist()
    assert [i for b in batches for i in b] == want and sorted(want) == list(range(10))
    # a seed that worked keeps its order: torch reads -1_000_003 (run.seed=-1, epoch 0) modulo 2**64 too
    old = torch.randperm(10, generator=torch.Generator().manual_seed(-1_000_003)).tolist()
    assert [i for b in RandomBatches(10, 4, seed=-1).batches(0) for i in b] == old


def test_shard_contiguous_even_and_never_empty():
    batch = [9, 8, 7, 6, 5, 4, 3]
    parts = [shard(batch, r, 3) for r in range(3)]
    assert parts == [[9, 8, 7], [6, 5], [4, 3]]
    assert sum(parts, []) == batch  # concatenating the slices in rank order gives the global batch back
    assert [shard([1, 2], r, 3) for r in range(3)] == [[1], [2], [1]]  # too few: repeat
    assert shard(batch, 0, 1) == batch


def test_sharded_batches_start_position():
    batches = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert list(StepBatches(batches, rank=1, world=2, start=1)) == [[6, 7], [9]]
    assert len(StepBatches(batches, start=1)) == 2
    assert list(StepBatches(batches)) == batches
    # 2 accumulation steps: process 1 of 2 takes the last two of four slices of each global batch
    assert list(StepBatches([list(range(8))], rank=1, world=2, accum=2)) == [[4, 5], [6, 7]]
    assert len(StepBatches(batches, world=2, accum=2)) == 2 * len(batches)


def test_micro_batches_cover_the_global_batch_whatever_the_split():
    batch = list(range(10))
    for world, accum in ((1, 1), (2, 1), (1, 2), (2, 2), (1, 4)):
        parts = [mb for r in range(world) for mb in step_micro_batches(batch, r, world, accum)]
        assert sorted(i for mb in parts for i in mb) == batch and all(parts)


def test_the_micro_batches_not_marked_as_copies_are_the_global_batch_once():
    # a global batch smaller than world x accum is repeated to fill every slice; the slices not marked as copies hold
    # each of its examples exactly once (the engine gives the others weight 0), and larger batches have no copy
    for size in range(1, 10):
        batch = list(range(100, 100 + size))
        for world, accum in ((1, 1), (2, 1), (1, 3), (2, 2), (3, 2), (2, 4)):
            kept = [i for r in range(world) for mb, copy in zip(step_micro_batches(batch, r, world, accum),
                                                                 repeated_micro_batches(size, r, world, accum),
                                                                 strict=True) if not copy for i in mb]  # fmt: skip
            assert kept == batch, (size, world, accum)


def test_process_slice():
    assert [list(process_slice(5, r, 3)) for r in range(3)] == [[0, 1], [2, 3], [4]]
    assert [list(process_slice(1, r, 2)) for r in range(2)] == [[0], []]


def test_sampler_registry():
    from finecap.config import load
    from finecap.data.samplers import SAMPLERS, get_sampler
    from finecap.objectives import import_object

    for name, path in SAMPLERS.items():
        assert callable(import_object(path, f"SAMPLERS[{name!r}]")), name
    cfg = load(None, ["run.seed=3"])
    sampler = get_sampler(cfg, list(range(10)), 4)
    assert sampler.batches(0) == RandomBatches(10, 4, seed=3).batches(0)
    with pytest.raises(ValueError, match="data.sampler: unknown sampler 'nope'; valid names: bagcurri, random"):
        get_sampler(load(None, ["data.sampler=nope"]), list(range(10)), 4)
