"""Captioners with LoRA adapters that change what they say, for the tests of adapters outside finecap
(tests/models/test_whole_adapter.py, tests/models/test_vlm_families.py, tests/engines/test_vllm_lora.py)."""

from __future__ import annotations

import torch

from finecap.models import lora
from finecap.models.captioner import PARTS


def adapted(model, projector: torch.nn.Module | None = None, parts: tuple[str, ...] = PARTS):
    """``model`` with LoRA on ``parts`` (both by default), B drawn at random (so the adapters change the captions),
    and ``projector`` (a fully trained module: peft's ``modules_to_save``) moved too; in eval mode."""
    torch.manual_seed(0)
    for part in parts:
        lora.apply_lora(model, part, lora.LoraSpec(rank=4, alpha=8.0))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        for p in projector.parameters() if projector is not None else []:
            p.add_(torch.randn(p.shape, generator=g) * 0.5)
    return model.eval()
