"""The bytes autograd saves for the backward pass, each storage once: the one counter of ``benchmarks/memory.py``'s
*saved* column, ``benchmarks/tower_forecast.py``'s trained tower layers and the forecast's tests
(``tests/models/test_memory_forecast.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch


def saved_bytes(forward: Callable[[], Any], module: torch.nn.Module, inputs: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the distinct tensor storages that ``forward()`` saves for backward (``saved_tensors_hooks`` around
    it), but those of ``module``'s parameters and buffers and of ``inputs`` (tensors allocated before it: a batch's
    pixel values), told by data pointer: the activations in the textbook sense, what gradient checkpointing replaces
    by recomputation. Each storage is held until the count is done, so that no address is reused by a later one (a
    branch whose result is dropped, CLIP's pooled class token, frees its graph at once): storages are told apart as
    objects, not by address, since one address may hold two in turn. ``forward()``'s result is dropped (and with it
    its graph, once counted)."""
    left_out = {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers(), *inputs]}
    storages: dict[int, torch.UntypedStorage] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in left_out:
            storages[storage._cdata] = storage
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward()
    return sum(s.nbytes() for s in storages.values())
