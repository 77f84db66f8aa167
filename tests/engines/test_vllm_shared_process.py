"""Several vLLM engines in one process (``.venv-vllm``): boost's two roles, a ``vllm`` judge beside vLLM rollouts or
beside a :class:`finecap.Captioner`'s engine. vLLM's shutdown of an in-process engine tears down state of the whole
process that every such engine runs on (its model-parallel groups, the default process group, its cache of the
variables it read); finecap keeps it while another engine it started lives
(:func:`finecap.engines.vllm.shutdown_llm`), and the last one tears it down. Here with two engines of a tiny Llama chat
LM (boost's in-process backend, the judge's transport); without vLLM: tests/engines/test_engine_shutdown.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from helpers.vllm_engines import NOT_HERE

pytest.importorskip("vllm", reason=NOT_HERE)

import torch.distributed as dist  # noqa: E402
from vllm.distributed import parallel_state  # noqa: E402

from finecap.boost.vllm_backend import VllmBackend  # noqa: E402
from finecap.config import VllmConfig  # noqa: E402
from helpers.chat_models import save_chat_lm  # noqa: E402

pytestmark = pytest.mark.slow

TASK = SimpleNamespace(messages=[{"role": "user", "content": "Describe the picture."}])


def test_an_engine_closed_beside_another_leaves_it_answering(tmp_path):
    folder = save_chat_lm(tmp_path / "lm", hidden=64, heads=2, kv_heads=1, std=0.1)
    section = VllmConfig(max_model_len=256, kv_cache_memory_bytes=2**26)

    def backend() -> VllmBackend:
        return VllmBackend(str(folder), section=section, max_new_tokens=4, refuse_cut_off=False)

    first, second = backend(), backend()
    try:
        (answer,) = second.generate([TASK])
        assert first.generate([TASK]) == [answer] and isinstance(answer, str) and answer
        first.close()
        # before: AssertionError: pipeline model parallel group is not initialized
        assert second.generate([TASK]) == [answer]
    finally:
        first.close()
        second.close()
    # the last engine tears vLLM's state down, and a later engine builds it again
    assert not parallel_state.model_parallel_is_initialized() and not dist.is_initialized()
    later = backend()
    try:
        assert later.generate([TASK]) == [answer]
    finally:
        later.close()
