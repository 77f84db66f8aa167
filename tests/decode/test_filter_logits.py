"""``finecap.decode.filter_logits`` against transformers' own logits warpers: the nucleus and the top-k that
``generate(do_sample=True, temperature=T, top_k=k, top_p=p)`` samples from (``TemperatureLogitsWarper``, then
``TopKLogitsWarper``, then ``TopPLogitsWarper``), also where tokens tie at the edge or the mass reaches ``top_p``
exactly."""

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from finecap.decode import filter_logits


def warped(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """What ``generate`` samples from: its warpers in its order (each only when set, as ``generate`` adds them)."""
    out = logits.clone()
    if temperature != 1.0:
        out = TemperatureLogitsWarper(temperature)(None, out)
    if top_k > 0:
        out = TopKLogitsWarper(top_k)(None, out)
    if top_p < 1.0:
        out = TopPLogitsWarper(top_p)(None, out)
    return out


def test_ties_at_the_nucleus_edge_keep_the_tokens_generate_keeps():
    # Four equal tokens (p = .25 each), top_p .5: two of them make the nucleus; which two is generate's choice (it
    # sorts ascending and drops the tokens whose mass with every less likely one is at most 1 - .5), not another
    logits = torch.zeros(1, 4)
    ours = filter_logits(logits, top_p=0.5)
    assert int(torch.isfinite(ours).sum()) == 2
    assert torch.equal(ours, warped(logits, 1.0, 0, 0.5))


def test_mass_reaching_top_p_exactly_keeps_the_tokens_generate_keeps():
    # p = [.5, .4, .1], top_p .5: the first token alone reaches .5 (transformers keeps it alone; a descending cumsum
    # rounding .5 to 0.49999997 kept .4 too)
    logits = torch.log(torch.tensor([[0.5, 0.4, 0.1]]))
    assert torch.equal(filter_logits(logits, top_p=0.5), warped(logits, 1.0, 0, 0.5))


@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize(("top_k", "top_p"), [(0, 0.9), (5, 1.0), (40, 0.8), (0, 0.3)])
def test_bfloat16_logits_are_filtered_as_generate_filters_them(temperature, top_k, top_p):
    # A bfloat16 model's logits (8 bits of mantissa) tie often at the nucleus edge: 64 rows of 4,000 tokens
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(64, 4000, generator=g) * 2.5 + 8).bfloat16().float()
    ours = filter_logits(logits / temperature, top_k, top_p)
    assert torch.equal(ours, warped(logits, temperature, top_k, top_p))


def test_integer_logits_with_many_ties_are_filtered_as_generate_filters_them():
    g = torch.Generator().manual_seed(1)
    logits = torch.randint(0, 3, (500, 9), generator=g).float()  # (N, V), values 0, 1, 2
    for top_k, top_p in [(0, 0.6), (0, 0.3), (3, 0.9), (1, 0.5), (9, 0.95)]:
        assert torch.equal(filter_logits(logits, top_k, top_p), warped(logits, 1.0, top_k, top_p)), (top_k, top_p)
