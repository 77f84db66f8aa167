"""The KV cache under both of its names (:mod:`finecap.models.kvcache`): ``past_key_values`` before transformers 5.24,
``cache`` from 5.24. Stand-in models and outputs declare one name each, so both sides of the rename are checked
whichever version is installed (``test_contract.py`` checks every real backbone warns nothing on the installed one)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from peft import LoraConfig, get_peft_model
from torch import nn

from finecap.models.kvcache import cache_kwargs, returned_cache


class OldNames(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(2, 2)

    def forward(self, inputs_embeds=None, past_key_values=None, use_cache=None):
        return inputs_embeds


class NewNames(OldNames):
    def forward(self, inputs_embeds=None, cache=None, use_cache=None):
        return inputs_embeds


@dataclass
class OldOutput:
    logits: torch.Tensor
    past_key_values: object = None


@dataclass
class NewOutput:
    logits: torch.Tensor
    cache: object = None


def test_the_cache_goes_in_under_the_name_forward_declares():
    marker = object()
    assert cache_kwargs(OldNames(), marker) == {"past_key_values": marker}
    assert cache_kwargs(NewNames(), marker) == {"cache": marker}


def test_a_peft_wrapped_model_is_asked_about_its_base():
    """``PeftModel.forward`` takes ``**kwargs``: the name is the wrapped model's."""
    config = LoraConfig(r=1, target_modules=["proj"])
    marker = object()
    assert cache_kwargs(get_peft_model(NewNames(), config), marker) == {"cache": marker}
    assert cache_kwargs(get_peft_model(OldNames(), config), marker) == {"past_key_values": marker}


def test_the_cache_comes_out_of_either_output_field():
    marker, logits = object(), torch.zeros(1)
    assert returned_cache(OldOutput(logits, past_key_values=marker)) is marker
    assert returned_cache(NewOutput(logits, cache=marker)) is marker


def test_the_prompt_cache_records_each_layer_once_and_its_view_reads_rows_without_writing():
    """:class:`PromptCache`: a layer's second update in the recording pass (a checkpointed layer recomputed) returns
    the update against the layer as it was before the first, storing nothing; the read-only view returns the stored
    prompt's rows followed by the new keys and values, and leaves the cache as it was."""
    from finecap.models.kvcache import PromptCache

    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 1, 3, 4, generator=g), torch.randn(2, 1, 3, 4, generator=g)  # (B, heads, P, head_dim)
    cache = PromptCache()
    keys, values = cache.update(k, v, 0)
    assert torch.equal(keys, k) and torch.equal(values, v)
    again = cache.update(2 * k, 2 * v, 0)  # the recomputation: against the empty layer, not after the first
    assert torch.equal(again[0], 2 * k) and torch.equal(again[1], 2 * v)
    assert torch.equal(cache.layers[0].keys, k) and cache.get_seq_length() == 3
    rows = torch.tensor([1, 1, 0])
    view = cache.read_rows(rows)
    k2, v2 = torch.randn(3, 1, 2, 4, generator=g), torch.randn(3, 1, 2, 4, generator=g)  # (N, heads, L, head_dim)
    for _ in range(2):  # a recomputation of the caption pass computes the same again
        keys, values = view.update(k2, v2, 0)
        assert torch.equal(keys, torch.cat([k[rows], k2], dim=2)) and torch.equal(values, torch.cat([v[rows], v2], 2))
    assert torch.equal(cache.layers[0].keys, k) and view.get_seq_length() == cache.get_seq_length() == 3
