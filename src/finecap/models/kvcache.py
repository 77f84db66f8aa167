"""The language model's KV cache under both of its names in ``transformers``.

``transformers`` 5.24 renamed the cache argument and output field from ``past_key_values`` to ``cache`` (the old name
still works there, with a deprecation warning, until 5.40); finecap needs ``transformers>=5.18`` (pyproject.toml).
The backbones' decoding steps pass and read the cache through these two functions so that they run warning-free on
either side of the rename (``tests/models/test_kvcache.py`` checks both names, ``tests/models/test_contract.py`` that
no backbone's decoding warns about them).
"""

from __future__ import annotations

import copy
import functools
import inspect
from typing import Any

import torch
from torch import nn
from transformers import Cache, DynamicCache

from finecap.models.lora import unwrapped


@functools.cache
def _argument_name(cls: type) -> str:
    """``"cache"`` when ``cls.forward`` takes ``cache`` (transformers >= 5.24), else ``"past_key_values"``."""
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def cache_kwargs(model: nn.Module, cache: Any) -> dict[str, Any]:
    """The keyword argument that hands ``cache`` to ``model``'s forward (a ``PeftModel`` passes it to its base)."""
    return {_argument_name(type(unwrapped(model))): cache}


def returned_cache(out: Any) -> Any:
    """The KV cache in a model output (``out.cache`` from transformers 5.24, ``out.past_key_values`` before)."""
    fields = getattr(out, "__dataclass_fields__", {})
    return out.cache if "cache" in fields else out.past_key_values


LAYERED = "layers" in inspect.signature(Cache.__init__).parameters
"""Whether ``transformers``' caches are lists of cache layers (:class:`PromptCache` needs them; older versions keep
lists of tensors)."""


def prompt_shareable(checkpointing: bool) -> bool:
    """Whether a prompt pass can hand its KV cache to the captions scored after it, with gradient checkpointing on
    or off: always with layered caches (:class:`PromptCache` is kept through a checkpointed layer's recomputation),
    else only without checkpointing (``transformers`` drops a checkpointed layer's cache)."""
    return LAYERED or not checkpointing


class PromptCache(DynamicCache):
    """The KV cache of a shared prompt pass (:meth:`finecap.models.vlm.Vlm.sequence_logits`), correct under gradient
    checkpointing, where the backward pass runs each layer's forward a second time
    (docs/memory.md#the-prompt-shared-under-checkpointing).

    - **Recording** (the prompt pass): a layer's first update stores its keys and values as a ``DynamicCache`` does;
      a later update of the same layer (the backward pass recomputing that checkpointed layer) returns what the
      layer's update against the cache as it was before the first one would return, and stores nothing, so the
      recomputation sees the same keys and values as the forward pass and the cache holds the prompt once.
    - **Read only**, a view from :meth:`read_rows` (the caption pass): every update returns the layer's update of
      the stored prompt's rows ``rows`` (the image of each caption) by the new keys and values, computed on a shallow
      copy of the layer (every ``transformers`` cache layer reassigns its tensors in ``update``, sliding-window ones
      included) and stored nowhere: a recomputation computes it again. The prompt is kept once per image, its rows
      picked inside the layer's call (under checkpointing never saved per caption). ``get_seq_length`` and the mask
      sizes stay the prompt's, what the mask code reads before a layer's update.

    Without checkpointing each layer updates once per pass and the values are a ``DynamicCache``'s with
    ``reorder_cache(rows)`` between the passes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._before: dict[int, Any] = {}
        self._rows: torch.Tensor | None = None

    def read_rows(self, rows: torch.Tensor) -> PromptCache:
        """A read-only view of this cache: the recorded prompt's rows ``rows (N,)`` (indices into the recorded batch)
        before each update's new keys and values ``(N, ...)``. A view of its own, not a mode of this cache, since the
        backward pass recomputes the prompt pass's layers (recording: this cache) after the captions' (the view)."""
        view = copy.copy(self)  # shares the layers, never writes them
        view._rows = rows
        return view

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        if self._rows is None and layer_idx not in self._before:  # the first update of the layer: recorded
            while self.layer_class_to_replicate is not None and len(self.layers) <= layer_idx:
                self.layers.append(self.layer_class_to_replicate())  # built without a config: layers as they come
            self._before[layer_idx] = copy.copy(self.layers[layer_idx])
            return self.layers[layer_idx].update(key_states, value_states, *args, **kwargs)
        if self._rows is None:  # recomputed: against the layer as it was before the first update
            layer = copy.copy(self._before[layer_idx])
        else:
            layer = copy.copy(self.layers[layer_idx])
            layer.reorder_cache(self._rows)
        return layer.update(key_states, value_states, *args, **kwargs)
