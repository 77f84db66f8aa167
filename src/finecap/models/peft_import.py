"""peft, imported where adapters are first made, loaded or saved (:mod:`finecap.models.lora`), not when finecap's
models are: importing it, with bitsandbytes, which it imports when installed, takes over a second, which every
command on a model without adapters would pay otherwise. Before it is imported no ``PeftModel`` or LoRA layer
exists, so the checks below need not import it."""

from __future__ import annotations

import sys
from typing import Any


def peft_library() -> Any:
    """The ``peft`` module, imported on first use."""
    import peft

    return peft


def is_peft(module: Any) -> bool:
    """Whether ``module`` is a ``peft.PeftModel``."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(module, peft.PeftModel)


def is_lora_layer(module: Any) -> bool:
    """Whether ``module`` is one of peft's LoRA layers."""
    tuner = sys.modules.get("peft.tuners.lora")
    return tuner is not None and isinstance(module, tuner.LoraLayer)
