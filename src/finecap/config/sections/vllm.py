"""The ``vllm`` section: the vLLM engine's own options (``decode.engine=vllm``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from finecap.config.fields import Section, doc, option_fields
from finecap.config.sections.limits import (
    MAX_PROCESSES,
)
from finecap.registry import ENGINES

VllmDtype = Literal["auto", "bfloat16", "float16", "float32"]


@dataclass
class VllmConfig(Section, name="vllm"):
    """The colocated vLLM engine of ``decode.engine=vllm`` (:mod:`finecap.engines.vllm`) and of boost's ``vllm``
    backend (:mod:`finecap.boost.vllm_backend`); TRL's knob names."""

    gpu_memory_utilization: float = doc(
        0.3, "Fraction of the GPU's memory vLLM takes for weights and KV cache (TRL's colocate default).", gt=0, le=1
    )
    max_model_len: int = doc(
        0,
        "Longest prompt + caption vLLM serves (0: the model's context length).",
        ge=0,
        le=1_048_576,
        why="tokens of context; the longest VLM contexts are ~1M",
    )
    tensor_parallel_size: int = doc(
        1, "GPUs one vLLM engine shards the model over.", ge=1, le=MAX_PROCESSES, why="GPUs of one engine"
    )
    kv_cache_memory_bytes: int = doc(
        0, "Bytes of KV cache (0: sized from gpu_memory_utilization; on a CPU vLLM's default).", ge=0
    )
    enforce_eager: bool = doc(
        True, "Run vLLM eagerly: no torch.compile or CUDA graphs (faster start; false for throughput on a GPU)."
    )
    dtype: VllmDtype = doc(
        "auto",
        "Dtype the captioner's engine computes in; auto: the training step's (bfloat16 under "
        "train.mixed_precision=bf16, float16 under fp16 on a GPU, else the captioner's weights' dtype; "
        "docs/scaling.md). Boost's vllm backend serves its model in the dtype its config names.",
    )
    enable_sleep_mode: bool = doc(
        False,
        "Free the engine's GPU memory between RL rollouts (vLLM's sleep level 1: weights offloaded to the CPU, KV "
        "cache dropped; woken before the next sync or generation). GPU only: refused on the CPU (TRL's "
        "vllm_enable_sleep_mode).",
    )

    def unread_options(self, cfg: Any) -> dict[str, tuple[str, str]]:
        """Every option when neither ``decode.engine`` (a registered engine: one's own may read the section) nor a
        boost backend is vLLM."""
        engine, boost = cfg.decode.engine, cfg.boost
        if engine not in ENGINES or "vllm" in (engine, boost.llm_backend, boost.vlm_backend):
            return {}
        have = f"decode.engine={engine}"
        return {key: ("decode.engine=vllm", have) for key, _, _ in option_fields(VllmConfig, "vllm.")}


def decodes_itself(cfg: Any) -> bool:
    """Whether ``cfg`` decodes with finecap's own engine (``decode.engine=finecap``), whose log-probs are the
    trainer's: what the configuration's warnings about options of another engine (RL's vLLM corrections) ask. The
    configuration's one reading of ``decode.engine`` besides this section's own (behaviour asks
    :func:`finecap.engines.base.engine_class` for the engine's facts)."""
    return cfg.decode.engine == "finecap"
