"""The tensor allocations and frees of a call on the CPU, in time order, from torch's profiler: the one reading of its
``[memory]`` events behind ``benchmarks/memory.py``'s peaks (:func:`memory.allocation_peak`) and
``benchmarks/tower_forecast.py``'s frozen tower's phases."""

from __future__ import annotations

from collections.abc import Callable


def allocation_sizes(fn: Callable[[], object]) -> list[int]:
    """The byte counts of the allocations (positive) and frees (negative) of tensors while ``fn()`` runs on the CPU,
    in time order: the ``[memory]`` events torch's profiler records with ``profile_memory=True``. Their running sum is
    the bytes allocated since the call began."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
    )
    return [n for _, n in events]
