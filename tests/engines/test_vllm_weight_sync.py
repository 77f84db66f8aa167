"""Weight sync (RL rollouts on vLLM): after the captioner's weights change and are loaded into the running engine
(:meth:`VllmEngine.sync`, ``collective_rpc("reload_weights")``), the engine's greedy captions and log-probs are the
updated captioner's, for images it had already seen (its encoder and prefix caches dropped), also with LoRA
adapters (added to the weights sent, the captioner's own left as they were)."""

from __future__ import annotations

import pytest
import torch

from helpers.vllm_engines import NOT_HERE

pytest.importorskip("vllm", reason=NOT_HERE)

from finecap.config import DecodeConfig  # noqa: E402
from finecap.models import lora  # noqa: E402
from helpers.vlm import images  # noqa: E402

pytestmark = pytest.mark.slow

CFG = DecodeConfig(max_length=12)
IMAGES = images(4)


def check_engine_follows(captioner, engine, batch):
    """The engine's greedy decoding equals the captioner's, tokens and log-probs."""
    ours, theirs = captioner.generate(batch, CFG), engine.generate_images(IMAGES, CFG)
    assert torch.equal(theirs.sequences, ours.sequences)
    torch.testing.assert_close(theirs.token_logprobs, ours.token_logprobs, atol=1e-5, rtol=0)
    return theirs


def test_synced_weights_give_the_updated_captioners_captions(captioner, engine):
    batch = captioner.encoder.preprocess(IMAGES)
    before = check_engine_follows(captioner, engine, batch)  # the images' features and prompts are now cached
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # every weight moves: the vision tower, the projector and the language model
        for p in captioner.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    changed = captioner.generate(batch, CFG)
    assert not torch.equal(changed.sequences, before.sequences)  # the update changes the captions
    stale = engine.generate_images(IMAGES, CFG)
    assert torch.equal(stale.sequences, before.sequences)  # not synced yet: the engine has the old weights
    engine.sync(captioner)
    check_engine_follows(captioner, engine, batch)

    # LoRA on the language model: the adapters' update reaches the engine merged, and the captioner keeps them
    lora.apply_lora(captioner, "lm", lora.LoraSpec(rank=4, alpha=8.0))
    with torch.no_grad():
        for name, p in captioner.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5, generator=g)
    adapted = captioner.generate(batch, CFG)
    assert not torch.equal(adapted.sequences, captioner_without_adapters(captioner, batch).sequences)
    engine.sync(captioner)
    check_engine_follows(captioner, engine, batch)
    assert lora.has_adapters(captioner) and not lora.adapters_are_identity(captioner)


def captioner_without_adapters(captioner, batch):
    with lora.adapters_disabled(captioner):
        return captioner.generate(batch, CFG)
