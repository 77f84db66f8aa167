"""The vocabulary head in chunks (``finecap.models.captioner.chunked_token_scores``): the scores and gradients of
given sequences equal those computed from the whole logits, and the whole logits are never held."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from finecap.models.captioner import chunked_token_scores, token_scores


def case(seed: int = 0, N: int = 3, L: int = 5, H: int = 8, V: int = 11):
    g = torch.Generator().manual_seed(seed)
    head = nn.Linear(H, V)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g))
        head.bias.copy_(torch.randn(V, generator=g))
    hidden = torch.randn(N, L, H, generator=g, requires_grad=True)
    sequences = torch.randint(0, V, (N, L), generator=g)
    mask = torch.ones(N, L, dtype=torch.bool)
    mask[0, 3:] = False  # a caption that stopped early
    return head, hidden, sequences, mask


@pytest.mark.parametrize("chunk_elements", [11, 30, 10_000], ids=["one-position", "two-positions", "whole"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunks_equal_the_whole_logits_with_gradients(chunk_elements, temperature):
    """Values of log-probs, entropies and top flags, and the gradients of a loss mixing log-probs and entropies
    with respect to the hidden states and the head's weight and bias, for chunks of 1 and 2 positions (15 positions
    of an 11-word vocabulary) and for one chunk."""
    results = []
    for chunked in (False, True):
        head, hidden, sequences, mask = case()
        if chunked:
            out = chunked_token_scores(head, hidden, sequences, mask, temperature, True, True, chunk_elements)
        else:
            out = token_scores(head(hidden), sequences, mask, temperature, True, True)
        weights = torch.linspace(0.5, 1.5, out.logprobs.numel()).reshape(out.logprobs.shape)
        ((out.logprobs * weights).sum() - 0.3 * out.entropy.sum()).backward()
        results.append((out, hidden.grad, head.weight.grad, head.bias.grad))
    (whole, *whole_grads), (parts, *part_grads) = results
    torch.testing.assert_close(parts.logprobs, whole.logprobs)
    torch.testing.assert_close(parts.entropy, whole.entropy)
    assert torch.equal(parts.top, whole.top)
    assert not parts.logprobs[0, 3:].any() and not parts.top[0, 3:].any()  # masked positions: 0 and false
    # no view (of the chunks' concatenation): a sharded captioner's forward returns these, and FSDP2 warns of a view
    # (an in-place op on it would skip the pre-backward all-gather; tests/models/test_sharding.py), whatever backbone
    assert parts.logprobs._base is None and parts.entropy._base is None
    for got, want in zip(part_grads, whole_grads, strict=True):
        torch.testing.assert_close(got, want)


def test_top_is_the_argmax_and_logprobs_are_hand_checked():
    """One position, a 3-word head with weight [[1], [2], [0]] and no bias, hidden 1: logits (1, 2, 0), log-softmax
    = logits - log(e + e^2 + 1) = logits - 2.4076; token 1 is the argmax."""
    head = nn.Linear(1, 3, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[1.0], [2.0], [0.0]]))
    hidden = torch.ones(1, 1, 1)
    for token, want, top in ((1, 2 - 2.4076, True), (2, -2.4076, False)):
        out = chunked_token_scores(head, hidden, torch.tensor([[token]]), torch.ones(1, 1, dtype=torch.bool),
                                   with_top=True, chunk_elements=3)  # fmt: skip
        assert out.logprobs.item() == pytest.approx(want, abs=1e-4)
        assert out.top.item() is top


def test_whole_logits_are_not_kept_for_backward():
    """Saved-for-backward tensors while the chunked scores exist: the hidden chunks and the small outputs, never a
    tensor with the vocabulary's size (the unchunked scoring keeps the (N, L, V) log-softmax)."""
    V = 1000
    head = nn.Linear(4, V)
    hidden = torch.randn(2, 6, 4, requires_grad=True)
    sequences, mask = torch.randint(0, V, (2, 6)), torch.ones(2, 6, dtype=torch.bool)
    for chunked, expect_vocab in ((False, True), (True, False)):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t, saved=saved: saved.append(t.shape) or t, lambda t: t):
            if chunked:
                chunked_token_scores(head, hidden, sequences, mask, chunk_elements=2 * V)
            else:
                token_scores(head(hidden), sequences, mask)
        assert any(V in shape for shape in saved) == expect_vocab, saved
        if chunked:  # what is kept: each chunk's inputs, 6 chunks of 2 positions (hidden (2, 4), tokens, mask)
            assert saved.count(torch.Size([2, 4])) == 6
