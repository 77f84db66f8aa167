"""The log-probs and entropies of given captions (``finecap.models.captioner.token_scores``) are 0 on padding
whatever the logits hold there: a ``-inf`` log-prob at a padded position once became NaN (``-inf * 0``)."""

from __future__ import annotations

import math

import torch

from finecap.models.captioner import token_scores

SEQUENCES = torch.tensor([[0, 1, 2]])
MASK = torch.tensor([[True, True, False]])  # the third position is padding


def scores(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probs, entropies and the gradient of their sum with respect to ``logits`` (1, 3, 3)."""
    logits = logits.clone().requires_grad_(True)
    out = token_scores(logits, SEQUENCES, MASK, with_entropy=True)
    assert out.entropy is not None
    (out.logprobs.sum() + out.entropy.sum()).backward()
    assert logits.grad is not None
    return out.logprobs.detach(), out.entropy.detach(), logits.grad


def test_a_minus_infinite_logprob_on_padding_counts_as_the_padding_it_is():
    # uniform logits over 3 words: log p = -ln 3 and H = ln 3 at every real position, 0 on padding
    plain = torch.zeros(1, 3, 3)
    crafted = plain.clone()
    crafted[0, 2, 2] = float("-inf")  # the padded position's own token: log p = -inf there
    want = ([[-math.log(3), -math.log(3), 0.0]], [[math.log(3), math.log(3), 0.0]])
    for logits in (plain, crafted):
        logp, entropy, _ = scores(logits)
        assert torch.allclose(logp, torch.tensor(want[0])) and torch.allclose(entropy, torch.tensor(want[1]))
    assert all(torch.equal(a, b) for a, b in zip(scores(plain), scores(crafted), strict=True))  # gradients too


def test_a_padded_row_of_minus_infinite_logits_has_no_nan_entropy_or_logprob():
    logits = torch.zeros(1, 3, 3)
    logits[0, 2] = float("-inf")  # log_softmax of the row: NaN
    out = token_scores(logits, SEQUENCES, MASK, with_entropy=True)
    assert out.entropy is not None
    assert out.logprobs[0, 2].item() == 0.0 and out.entropy[0, 2].item() == 0.0
