"""The RL sections of flat options, as objectives take them: ``rl_sections(samples=3, advantage="group")`` ->
``{"rl": RLConfig(samples=3), "grpo": GRPOConfig(advantage="group")}`` (each option to the section that has it; the
``sle`` section only when one of its options is given), for tests that name options without their sections."""

from __future__ import annotations

import dataclasses
from typing import Any

from finecap.config import GRPOConfig, RLConfig, SLEConfig


def rl_sections(**options: Any) -> dict[str, Any]:
    """``{"rl": ..., "grpo": ...}`` (and ``"sle"`` when asked) of ``options``; an option no section has is a
    ``TypeError``."""
    out: dict[str, Any] = {}
    for name, cls in (("rl", RLConfig), ("grpo", GRPOConfig), ("sle", SLEConfig)):
        mine = {k: options.pop(k) for k in [f.name for f in dataclasses.fields(cls)] if k in options}
        if name != "sle" or mine:
            out[name] = cls(**mine)
    if options:
        raise TypeError(f"no RL section has {', '.join(options)}")
    return out
