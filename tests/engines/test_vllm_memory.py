"""The vLLM engine's memory options on vLLM's CPU build (without vLLM: tests/engines/test_engine_memory_options.py):
an engine in the training step's dtype, bfloat16 under ``train.mixed_precision=bf16`` for a float32 captioner, starts
on the CPU, computes in bfloat16 and follows the captioner; ``vllm.enable_sleep_mode`` is refused on the CPU in one
line naming it, before an engine starts."""

from __future__ import annotations

import pytest
import torch

from helpers.vllm_engines import NOT_HERE

pytest.importorskip("vllm", reason=NOT_HERE)

from finecap.config import ConfigError, DecodeConfig, VllmConfig  # noqa: E402
from finecap.engines import vllm as engines_vllm  # noqa: E402
from finecap.engines.vllm import VllmEngine  # noqa: E402
from helpers.vlm import images  # noqa: E402

pytestmark = pytest.mark.slow

IMAGES = images(4)


def test_a_bf16_engine_serves_a_float32_captioner_under_bf16_mixed_precision(captioner):
    engine = VllmEngine.from_captioner(captioner, VllmConfig(max_model_len=128, kv_cache_memory_bytes=2**28),
                                       mixed_precision="bf16")  # fmt: skip
    try:
        assert engine.llm.llm_engine.vllm_config.model_config.dtype == torch.bfloat16
        theirs = engine.generate_images(IMAGES, DecodeConfig(max_length=12))
    finally:
        engine.close()
    assert next(captioner.parameters()).dtype == torch.float32  # the captioner is left as it was
    batch = captioner.encoder.preprocess(IMAGES)
    with torch.no_grad():  # the float32 captioner's log-probs of the bf16 engine's tokens
        ours = captioner(batch, sequences=theirs.sequences, mask=theirs.mask, image_index=theirs.image_index)
    mask = theirs.mask
    assert mask.sum() > 0 and torch.isfinite(theirs.token_logprobs[mask]).all()
    gap = (theirs.token_logprobs[mask] - ours.logprobs[mask]).abs()
    # bfloat16 keeps 8 bits of mantissa: the engine's log-probs are the captioner's to a few hundredths, not 1e-5
    assert float(gap.max()) < 0.05, f"largest gap {float(gap.max()):.3g}"
    assert float(gap.max()) > 1e-6  # and it did compute in bfloat16, not float32


def test_sleep_mode_is_refused_on_the_cpu_before_an_engine_starts(captioner, monkeypatch):
    from vllm.platforms import current_platform

    assert not current_platform.is_sleep_mode_available()  # vLLM's own check: its CPU build cannot sleep
    started = []
    monkeypatch.setattr(engines_vllm, "start_llm", lambda *a, **k: started.append(a))
    with pytest.raises(ConfigError) as e:
        VllmEngine.from_captioner(captioner, VllmConfig(max_model_len=128, enable_sleep_mode=True))
    message = str(e.value)
    assert message.startswith("vllm.enable_sleep_mode=true: vLLM 0.32") and "\n" not in message
    assert "not on the cpu platform; set vllm.enable_sleep_mode=false" in message
    assert e.value.key == "vllm.enable_sleep_mode" and started == []
