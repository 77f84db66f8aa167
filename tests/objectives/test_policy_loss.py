"""The GRPO family's loss pieces (finecap.objectives.grpo), hand-computed as torchtune's PPO loss tests: the clipped
surrogate and its gradient for ratios inside and outside [1 - clip_low, 1 + clip_high] with positive and negative
advantages, DAPO's asymmetric clip, token and sequence (GSPO) importance, the k3 KL, and each aggregation on captions
of different lengths."""

import math

import pytest
import torch

from finecap.objectives.grpo import aggregate, clipped_surrogate, k3, log_importance

RATIOS = [0.5, 0.9, 1.0, 1.1, 1.5]  # one caption of five tokens; the clip range is [0.8, 1.2]
ALL = torch.ones(1, 5, dtype=torch.bool)


def surrogate_and_grad(ratios, advantage, clip_low=0.2, clip_high=0.2):
    """Per-token loss and d loss / d logp for ``w = exp(logp - old)`` with old = 0, so logp = log w."""
    logp = torch.tensor([ratios]).log().requires_grad_(True)  # (1, 5)
    w = torch.exp(log_importance(logp, torch.zeros_like(logp), ALL, "token"))
    per_token = clipped_surrogate(w, torch.tensor([advantage]), clip_low, clip_high)
    per_token.sum().backward()
    return per_token.detach()[0].tolist(), logp.grad[0].tolist()


def test_positive_advantage_clips_only_above():
    loss, grad = surrogate_and_grad(RATIOS, 1.0)
    # A = 1: -min(w, clip(w)): 0.5 -> -min(.5, .8) = -.5; .9, 1, 1.1 inside; 1.5 -> -min(1.5, 1.2) = -1.2
    assert loss == pytest.approx([-0.5, -0.9, -1.0, -1.1, -1.2])
    # unclipped tokens: d(-w A)/d logp = -A w (dw/dlogp = w); the clipped token is constant: 0
    assert grad == pytest.approx([-0.5, -0.9, -1.0, -1.1, 0.0])


def test_negative_advantage_clips_only_below():
    loss, grad = surrogate_and_grad(RATIOS, -2.0)
    # A = -2: -min(-2w, -2 clip(w)) = 2 max(w, clip(w)): .5 -> 2 * .8 = 1.6 (clipped); 1.5 -> 2 * 1.5 = 3 (not)
    assert loss == pytest.approx([1.6, 1.8, 2.0, 2.2, 3.0])
    # d(2w)/d logp = 2w where not clipped; 0 for the clipped token w = .5
    assert grad == pytest.approx([0.0, 1.8, 2.0, 2.2, 3.0])


def test_asymmetric_clip_of_dapo():
    loss, grad = surrogate_and_grad([0.75, 0.85, 1.25, 1.3], 1.0, clip_low=0.2, clip_high=0.28)
    # range [0.8, 1.28]; A > 0 binds only above: 1.25 stays (grad -1.25), 1.3 -> 1.28 (grad 0); below never binds
    assert loss == pytest.approx([-0.75, -0.85, -1.25, -1.28])
    assert grad == pytest.approx([-0.75, -0.85, -1.25, 0.0])
    _, grad_neg = surrogate_and_grad([0.75, 0.85, 1.25, 1.3], -1.0, clip_low=0.2, clip_high=0.28)
    # A < 0 binds only below: 0.75 -> 0.8 (grad 0); the others keep d(w)/d logp = w
    assert grad_neg == pytest.approx([0.0, 0.85, 1.25, 1.3])


def test_sequence_importance_is_the_exponentiated_mean_log_ratio():
    # GSPO: tokens with log-ratios (0.2, 0.4) and a padding position: w = exp((0.2 + 0.4) / 2) = exp(0.3) = 1.3499
    logp = torch.tensor([[0.2, 0.4, 7.0]], requires_grad=True)
    mask = torch.tensor([[True, True, False]])
    log_w = log_importance(logp, torch.zeros_like(logp), mask, "sequence")
    assert log_w.shape == (1, 1) and log_w.item() == pytest.approx(0.3)
    w = torch.exp(log_w)
    # A = +1: clipped at 1.2, no gradient; A = -1: max(w, clip(w)) = w = 1.3499, d w / d logp_t = w / 2 per real token
    pos = clipped_surrogate(w, torch.tensor([1.0]), 0.2, 0.2)
    assert pos.item() == pytest.approx(-1.2)
    neg = clipped_surrogate(w, torch.tensor([-1.0]), 0.2, 0.2)
    assert neg.item() == pytest.approx(math.exp(0.3))
    neg.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([math.exp(0.3) / 2, math.exp(0.3) / 2, 0.0])


# Two captions of lengths 1 and 3 (max length 4), per-token losses (1 | 2, 3, 4); padding holds junk (9) that no
# aggregation may count.
PER_TOKEN = torch.tensor([[1.0, 9.0, 9.0, 9.0], [2.0, 3.0, 4.0, 9.0]])
MASK = torch.tensor([[True, False, False, False], [True, True, True, False]])


def test_sequence_aggregation_is_trls_grpo():
    # mean per caption (1 and (2 + 3 + 4) / 3 = 3), then over captions: (1 + 3) / 2 = 2; a mean over 2 captions
    loss, items = aggregate(PER_TOKEN, MASK, "sequence", 4)
    assert (loss.item(), items) == (2.0, 2.0)


def test_token_aggregation_is_trls_bnpo_and_dapo():
    # (1 + 2 + 3 + 4) / 4 tokens = 2.5; a mean over 4 tokens (the engine divides by the global batch's tokens)
    loss, items = aggregate(PER_TOKEN, MASK, "token", 4)
    assert (loss.item(), items) == (2.5, 4.0)


def test_constant_aggregation_is_dr_grpo():
    # (1 + 2 + 3 + 4) / (2 captions x max length 4) = 10 / 8 = 1.25; a mean over 2 captions
    loss, items = aggregate(PER_TOKEN, MASK, "constant", 4)
    assert (loss.item(), items) == (1.25, 2.0)


def test_a_per_caption_loss_broadcasts_over_the_captions_tokens():
    # sequence importance gives (N, 1): caption 0 has 1 token, caption 1 three; token mean = (5 + 3 x 7) / 4 = 6.5
    per_caption = torch.tensor([[5.0], [7.0]])
    assert aggregate(per_caption, MASK, "token", 4)[0].item() == 6.5
    assert aggregate(per_caption, MASK, "sequence", 4)[0].item() == 6.0  # (5 + 7) / 2


def test_gradients_weigh_tokens_as_each_aggregation_says():
    # d loss / d per_token[n, t] on real tokens: sequence 1 / (N len_n); token 1 / T; constant 1 / (N max_length)
    for how, want in [("sequence", [[0.5, 0, 0, 0], [1 / 6, 1 / 6, 1 / 6, 0]]),
                      ("token", [[0.25, 0, 0, 0], [0.25, 0.25, 0.25, 0]]),
                      ("constant", [[0.125, 0, 0, 0], [0.125, 0.125, 0.125, 0]])]:  # fmt: skip
        x = PER_TOKEN.clone().requires_grad_(True)
        aggregate(x, MASK, how, 4)[0].backward()
        assert x.grad.tolist() == [pytest.approx(row) for row in want], how


def test_k3_is_zero_where_policy_and_reference_agree_and_positive_elsewhere():
    logp = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    ref = torch.tensor([-1.0, -1.0, -1.5])
    kl = k3(logp, ref)
    # d = ref - logp = (0, 1, -1): e^0 - 0 - 1 = 0; e - 1 - 1 = 0.71828; e^-1 + 1 - 1 = 0.36788
    assert kl.tolist() == pytest.approx([0.0, math.e - 2, math.exp(-1)])
    kl.sum().backward()
    # d k3 / d logp = 1 - e^d: 0 at agreement, pulls logp towards ref elsewhere
    assert logp.grad.tolist() == pytest.approx([0.0, 1 - math.e, 1 - math.exp(-1)])
