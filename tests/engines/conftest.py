"""Fixtures of the vLLM tests (``decode.engine=vllm``, :mod:`finecap.engines.vllm`).

They run in the vLLM venv (``.venv-vllm``, built by ``make vllm``), in two pytest processes (``make vllm-test``:
pytest-xdist, ``--dist loadfile``), each running whole files one after another, as engines are opened and closed in
one notebook: a test closes every engine it starts (the module's :func:`engine` at the module's end), so that the
process state vLLM's engines share (its environment variables, process groups) is torn down before the next file's
(:mod:`finecap.engines.vllm`). In the main venv every module skips, naming why
(:data:`tests.helpers.vllm_engines.NOT_HERE`).

The captioner is a tiny random Idefics3 (SmolVLM's architecture) built from a config: a Llama language model of 2
heads of width 32 (vLLM's CPU attention needs a head size of at least 32), weights drawn from N(0, 0.1), and its EOS
row of the output head scaled up so that some captions stop before ``decode.max_length`` (stopping is compared too).
"""

from __future__ import annotations

import os
import sys

import pytest

from helpers.vllm_engines import tiny_captioner

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # vLLM's CPU worker warns at every step otherwise


@pytest.fixture(scope="module", autouse=True)
def closes_its_engines():
    """Every engine a test file started is closed (or gone) when the file ends, the next file of its process starting
    with none (module docstring); an engine left open would keep vLLM's shared process state under the next one."""
    yield
    engines = sys.modules.get("finecap.engines.vllm")
    left = list(engines.LIVE) if engines is not None else []
    assert not left, f"{len(left)} vLLM engine(s) left open at the end of this file: close each engine a test starts"


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
