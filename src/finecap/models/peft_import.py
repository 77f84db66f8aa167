"""peft, imported where adapters are first made, loaded or saved (:mod:`finecap.models.lora`), not when finecap's
models are: importing it, with bitsandbytes, which it imports when installed, takes over a second, which every
command on a model without adapters would pay otherwise. Before it is imported no ``PeftModel`` or LoRA layer
exists, so the checks below need not import it."""

from __future__ import annotations

import sys
import warnings
from typing import Any


def peft_library() -> Any:
    """The ``peft`` module, imported on first use."""
    import peft

    return peft


def get_peft_model(module: Any, config: Any) -> Any:
    """``peft.get_peft_model(module, config)``, without the ``FutureWarning`` transformers 5 gives when peft reads the
    deprecated ``is_gradient_checkpointing`` of a transformers model (peft 0.21's ``PeftModel.__init__``): it named
    peft's use of transformers, not the user's, and came with every run that made or loaded adapters."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        return peft_library().get_peft_model(module, config)


def is_peft(module: Any) -> bool:
    """Whether ``module`` is a ``peft.PeftModel``."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(module, peft.PeftModel)


def is_lora_layer(module: Any) -> bool:
    """Whether ``module`` is one of peft's LoRA layers."""
    tuner = sys.modules.get("peft.tuners.lora")
    return tuner is not None and isinstance(module, tuner.LoraLayer)
