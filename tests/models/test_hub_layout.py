"""VLM checkpoints as the Hub holds them, written by transformers 4.x (tests/helpers/hub_layout.py: the old tensor
names, ``config.json`` field names, a sampling ``generation_config.json``): finecap loads them as transformers does,
and a fine-tuned checkpoint and its merged export keep the Hub's tensor names (transformers 5 saves what it converted
at load back in the names it read: the layout vLLM's loaders take for the family) with weights that reload bit for
bit in float32, by transformers alone and by finecap."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForImageTextToText

from finecap.config import DecodeConfig
from finecap.models.base import module_path
from finecap.models.export import export_merged
from finecap.models.vlm import Vlm
from finecap.objectives.mle import mle_loss
from helpers.adapters import adapted
from helpers.hub_layout import hub_folder
from helpers.vlm import batch_of

pytestmark = pytest.mark.slow

FAMILIES = ("qwen2_5_vl", "llava_onevision", "gemma3")
"""One family per kind of renaming: Qwen's ``visual.*`` / ``model.layers.*``, LLaVA's ``language_model.model.*``
with a SigLIP tower's ``vision_model.``, Gemma 3's per-layer-type rope in old fields."""


def names(folder) -> list[str]:
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return sorted(f.keys())


def plain_load(folder):
    """``AutoModelForImageTextToText.from_pretrained(folder)`` and what it reported missing or unexpected."""
    model, info = AutoModelForImageTextToText.from_pretrained(folder, output_loading_info=True)
    return model, {k: v for k, v in info.items() if v}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_hub_layout_checkpoint_trains_saves_and_exports_in_its_own_names(family, lora, tmp_path):
    hub = hub_folder(tmp_path / "hub", family)
    vlm = Vlm.from_pretrained(hub)
    theirs, report = plain_load(hub)
    assert not report
    assert all(torch.equal(t, vlm.model.state_dict()[n]) for n, t in theirs.state_dict().items())
    if lora:
        vlm = adapted(vlm, torch.nn.ModuleList([module_path(vlm.model, p) for p in vlm.family.projectors]))
    vlm.train()
    batch = batch_of(vlm)
    before = {n: p.detach().clone() for n, p in vlm.named_parameters()}
    opt = torch.optim.AdamW([p for p in vlm.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):
        opt.zero_grad()
        mle_loss(vlm(batch), batch["labels"]).backward()
        opt.step()
    assert any(not torch.equal(p, before[n]) for n, p in vlm.named_parameters())
    vlm.eval()
    out = vlm.save(tmp_path / "ckpt")
    assert names(out) == names(hub)  # the Hub's names, none of transformers 5's beside them
    again = Vlm.from_checkpoint(out).eval()
    mine = vlm.model.state_dict()
    assert all(torch.equal(t, mine[n]) for n, t in again.model.state_dict().items())
    if not lora:  # the checkpoint's base weights are the trained ones
        reloaded, report = plain_load(out)
        assert not report
        assert all(torch.equal(t, mine[n]) for n, t in reloaded.state_dict().items())
    merged = export_merged(out, tmp_path / "merged")
    assert names(merged) == names(hub)
    exported, report = plain_load(merged)
    assert not report
    greedy = DecodeConfig(strategy="greedy", max_length=6)
    with torch.no_grad():
        want = vlm.generate(batch, greedy).sequences
        got = Vlm(exported.eval(), vlm.processor, source=str(merged)).generate(batch, greedy).sequences
    assert torch.equal(got, want)
