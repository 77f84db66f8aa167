"""Helpers of the vLLM tests (tests/engines/): the skip reason in a venv without vLLM and the tiny Idefics3
captioner they serve (a Llama of 2 heads of width 32, as vLLM's CPU attention needs, weights from N(0, 0.1), its EOS
row scaled up so that some captions stop before ``decode.max_length``)."""

from __future__ import annotations

import torch

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


def served_as_decoded(captioner, images):
    """The vLLM engine's greedy captions of ``images`` (``decode.max_length=12``) asserted token for token equal to
    finecap's decoder's, their log-probs within 1e-5; finecap's :class:`~finecap.decode.Generation` returned."""
    from finecap.config import DecodeConfig, VllmConfig
    from finecap.engines.vllm import VllmEngine

    cfg = DecodeConfig(max_length=12)
    engine = VllmEngine.from_captioner(captioner, VllmConfig(max_model_len=128, kv_cache_memory_bytes=2**28))
    try:
        theirs = engine.generate_images(images, cfg)
    finally:
        engine.close()
    ours = captioner.generate(captioner.encoder.preprocess(images), cfg)
    assert torch.equal(theirs.sequences, ours.sequences)
    torch.testing.assert_close(theirs.token_logprobs, ours.token_logprobs, atol=1e-5, rtol=0)
    return ours
