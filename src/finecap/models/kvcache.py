"""The language model's KV cache under both of its names in ``transformers``.

``transformers`` 5.24 renamed the cache argument and output field from ``past_key_values`` to ``cache`` (the old name
still works there, with a deprecation warning, until 5.40); finecap supports ``transformers>=4.46``. The backbones'
decoding steps pass and read the cache through these two functions so that they run warning-free on either side of
the rename (``tests/models/test_kvcache.py`` checks both names, ``tests/models/test_contract.py`` that no backbone's
decoding warns about them).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from torch import nn

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
