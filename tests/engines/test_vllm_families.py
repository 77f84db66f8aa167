"""The other VLM families through vLLM: greedy captions token-identical to finecap's decoder (float32). vLLM's LLaVA
and Qwen2-VL import torchvision, of which PyPI has no CPU build: without it they skip, saying so (they run on GPU
machines, where torchvision is installed with vLLM)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from helpers.vllm_engines import NOT_HERE

pytest.importorskip("vllm", reason=NOT_HERE)

from finecap.config import DecodeConfig, VllmConfig  # noqa: E402
from finecap.engines.vllm import VllmEngine  # noqa: E402
from finecap.models.presets import save_tiny_vlm  # noqa: E402
from finecap.models.vlm import Vlm  # noqa: E402
from helpers.vlm import images  # noqa: E402

pytestmark = pytest.mark.slow

NO_TORCHVISION = ("vLLM's LLaVA and Qwen2-VL import torchvision, which is not installed (PyPI has no CPU build of it; "
                  "these families run on GPU machines)")  # fmt: skip


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
def test_greedy_captions_are_token_identical(family, tmp_path):
    if importlib.util.find_spec("torchvision") is None:
        pytest.skip(NO_TORCHVISION)
    folder = save_tiny_vlm(tmp_path / family, family, std=0.1, hidden=64, heads=2, kv_heads=1)
    captioner = Vlm.from_pretrained(folder).eval()
    ims, cfg = images(4), DecodeConfig(max_length=12)
    engine = VllmEngine.from_captioner(captioner, VllmConfig(max_model_len=128, kv_cache_memory_bytes=2**28))
    try:
        theirs = engine.generate_images(ims, cfg)
    finally:
        engine.close()
    ours = captioner.generate(captioner.encoder.preprocess(ims), cfg)
    assert torch.equal(theirs.sequences, ours.sequences)
    torch.testing.assert_close(theirs.token_logprobs, ours.token_logprobs, atol=1e-5, rtol=0)
