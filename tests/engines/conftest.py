"""Fixtures of the vLLM tests (``decode.engine=vllm``, :mod:`finecap.engines.vllm`).

They run in the vLLM venv (``.venv-vllm``, built by ``make vllm``), one process per file (``make vllm-test``): an
engine edits ``os.environ``, reseeds torch and opens a gloo process group, so each file builds at most one. In the
main venv every module skips, naming why (:data:`tests.helpers.vllm_engines.NOT_HERE`).

The captioner is a tiny random Idefics3 (SmolVLM's architecture) built from a config: a Llama language model of 2
heads of width 32 (vLLM's CPU attention needs a head size of at least 32), weights drawn from N(0, 0.1), and its EOS
row of the output head scaled up so that some captions stop before ``decode.max_length`` (stopping is compared too).
"""

from __future__ import annotations

import os

import pytest

from helpers.vllm_engines import tiny_captioner

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # vLLM's CPU worker warns at every step otherwise


@pytest.fixture(scope="module")
def captioner(tmp_path_factory):
    return tiny_captioner(tmp_path_factory.mktemp("smolvlm"))


@pytest.fixture(scope="module")
def engine(captioner):
    """The module's one engine, serving :func:`captioner` in float32."""
    from finecap.config import VllmConfig
    from finecap.engines.vllm import VllmEngine

    engine = VllmEngine.from_captioner(captioner, VllmConfig(max_model_len=128, kv_cache_memory_bytes=2**28))
    yield engine
    engine.close()
