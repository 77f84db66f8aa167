"""Backends by name (``boost.llm_backend`` / ``boost.vlm_backend``): ``openai``, ``transformers``, ``world``."""

from __future__ import annotations

from typing import TYPE_CHECKING, get_args

from finecap.boost.engine import Backend
from finecap.config import BoostBackend

if TYPE_CHECKING:
    from finecap.config import Config

BACKENDS: tuple[str, ...] = get_args(BoostBackend)


def make_backend(cfg: Config, role: str) -> Backend:
    """The backend of ``role`` (``llm`` or ``vlm``) from ``boost.<role>_*``."""
    b = cfg.boost
    name, model, base_url, api_key = (getattr(b, f"{role}_{k}") for k in ("backend", "model", "base_url", "api_key"))
    key = f"boost.{role}"
    if name == "openai":
        from finecap.boost.openai_backend import OpenAIBackend

        return OpenAIBackend(model, base_url, api_key, concurrency=b.concurrency, timeout=b.timeout,
                             retries=b.retries, max_tokens=b.max_new_tokens, temperature=b.temperature,
                             key=key)  # fmt: skip
    if name == "transformers":
        from finecap.boost.hf_backend import TransformersBackend

        return TransformersBackend(model, vision=role == "vlm", batch_size=b.batch_size,
                                   max_new_tokens=b.max_new_tokens, temperature=b.temperature, key=key)  # fmt: skip
    if name == "world":
        from finecap.boost.world_backend import WorldLLM, WorldVLM

        return WorldVLM(model, cfg) if role == "vlm" else WorldLLM()
    raise ValueError(f"{key}_backend: unknown backend {name!r}; valid: {', '.join(BACKENDS)}")
