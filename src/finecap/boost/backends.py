"""Backends by name (``boost.llm_backend`` / ``boost.vlm_backend``): ``openai``, ``transformers``, ``vllm``,
``world``."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, get_args

from finecap.boost.engine import Backend
from finecap.config import BoostBackend, BoostConfig

if TYPE_CHECKING:
    from finecap.config import Config

BACKENDS: tuple[str, ...] = get_args(BoostBackend)
DEFAULT_KEY_ENV = next(f.default for f in dataclasses.fields(BoostConfig) if f.name == "llm_api_key_env")


def api_key(cfg: Config, role: str) -> str:
    """The API key of ``role``: the deprecated ``boost.<role>_api_key`` if set, else the environment variable named by
    ``boost.<role>_api_key_env`` (``""`` when the default variable is unset: local servers need none)."""
    from finecap.boost.openai_backend import api_key_from_env

    b = cfg.boost
    variable = getattr(b, f"{role}_api_key_env")
    return getattr(b, f"{role}_api_key") or api_key_from_env(
        variable, f"boost.{role}_api_key_env", explicit=variable != DEFAULT_KEY_ENV
    )


def make_backend(cfg: Config, role: str) -> Backend:
    """The backend of ``role`` (``llm`` or ``vlm``) from ``boost.<role>_*``."""
    b = cfg.boost
    name, model, base_url = (getattr(b, f"{role}_{k}") for k in ("backend", "model", "base_url"))
    key = f"boost.{role}"
    if name == "openai":
        from finecap.boost.openai_backend import OpenAIBackend

        return OpenAIBackend(model, base_url, api_key(cfg, role), concurrency=b.concurrency, timeout=b.timeout,
                             retries=b.retries, max_tokens=b.max_new_tokens, temperature=b.temperature,
                             seed=cfg.run.seed, max_wait=b.retry_max_wait, key=key)  # fmt: skip
    if name == "transformers":
        from finecap.boost.hf_backend import TransformersBackend
        from finecap.models.memory import eval_device

        return TransformersBackend(model, vision=role == "vlm", batch_size=b.batch_size,
                                   max_new_tokens=b.max_new_tokens, temperature=b.temperature, seed=cfg.run.seed,
                                   key=key, device=eval_device(cfg))  # fmt: skip
    if name == "vllm":
        from finecap.boost.vllm_backend import VllmBackend

        return VllmBackend(model, vision=role == "vlm", section=cfg.vllm, batch_size=b.batch_size,
                           max_new_tokens=b.max_new_tokens, temperature=b.temperature, seed=cfg.run.seed,
                           key=key)  # fmt: skip
    if name == "world":
        from finecap.boost.world_backend import WorldLLM, WorldVLM

        return WorldVLM(model, cfg) if role == "vlm" else WorldLLM()
    raise ValueError(f"{key}_backend: unknown backend {name!r}; valid: {', '.join(BACKENDS)}")
