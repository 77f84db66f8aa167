"""Fixtures of the vLLM tests (``decode.engine=vllm``, :mod:`finecap.engines.vllm`).

They run in the vLLM venv (``.venv-vllm``, built by ``make vllm``), one process per file (``make vllm-test``): an
engine edits ``os.environ``, reseeds torch and opens a gloo process group, so each file builds at most one. In the
main venv every module skips, naming why (:data:`NOT_HERE`).

The captioner is a tiny random Idefics3 (SmolVLM's architecture) built from a config: a Llama language model of 2
heads of width 32 (vLLM's CPU attention needs a head size of at least 32), weights drawn from N(0, 0.1), and its EOS
row of the output head scaled up so that some captions stop before ``decode.max_length`` (stopping is compared too).
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # vLLM's CPU worker warns at every step otherwise

NOT_HERE = "vLLM is not installed in this venv: the vLLM tests run in .venv-vllm (make vllm-test)"
"""The skip reason of every vLLM test module in a venv without vLLM."""


def tiny_captioner(out):
    """The tiny Idefics3 captioner (module docstring), in evaluation mode."""
    from finecap.models.presets import save_tiny_vlm
    from finecap.models.vlm import Vlm

    folder = save_tiny_vlm(out, "idefics3", std=0.1, hidden=64, heads=2, kv_heads=1)
    captioner = Vlm.from_pretrained(folder).eval()
    with torch.no_grad():
        captioner.model.lm_head.weight[captioner.tokenizer.eos_token_id] *= 4
    return captioner


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
