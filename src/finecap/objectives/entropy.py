"""Max-entropy regularisation of the policy (SLL-ME, the comparison of the sequence-level exploration paper, Sec. 4.1
and 5.2, after Mnih et al. 2016).

Definition used here (the paper gives only ``H(p_theta(w_j | w_<j, x_i))``): at every position of a *decoded*
caption (its tokens up to and including the stop token, not padding), the entropy of the full next-token
distribution ``H_t = -sum_v p(v | y_<t, x) log p(v | y_<t, x)``; the regulariser is the mean of ``H_t`` over all
such positions of the batch (token-level average), and the loss *subtracts* ``coef * mean H`` (maximising the
entropy). The distribution is the one whose log-probs REINFORCE uses (temperature 1, or the sampling temperature
with ``rl.scaled_logprob``). The paper's coefficient is 1e-2 (tuned among 1e-1, 1e-2, 1e-3).

The entropy needs the full distribution, which :meth:`ClipCap.sequence_logprob` does not return, so
:func:`logprobs_and_entropy` runs the same teacher-forced pass through the captioner's ``prefix`` and ``lm_logits``
and returns both the token log-probs and the entropies from one forward.

Example::

    >>> import torch
    >>> logits = torch.log(torch.tensor([[[0.5, 0.5, 0.0], [0.25, 0.25, 0.5]]]))  # (1, 2, 3)
    >>> [round(v, 4) for v in token_entropy(logits)[0].tolist()]  # ln 2; 2 * 0.25 ln 4 + 0.5 ln 2 = 1.5 ln 2
    [0.6931, 1.0397]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy (nats) of ``softmax(logits / temperature)`` at every position: logits (..., V) -> (...)."""
    return _entropy(F.log_softmax(logits.float() / temperature, dim=-1))


def _entropy(logp: torch.Tensor) -> torch.Tensor:
    """``-sum p log p`` over the last axis of log-probs (..., V), with ``0 * log 0 = 0``."""
    p = logp.exp()
    return -(p * logp.masked_fill(p == 0, 0.0)).sum(-1)  # (...)


def mean_entropy(entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``entropy`` (N, L) over the positions where ``mask`` (N, L) is true (token-level average)."""
    m = mask.to(entropy.dtype)
    return (entropy * m).sum() / m.sum().clamp(min=1.0)


def logprobs_and_entropy(
    model: torch.nn.Module,
    features: torch.Tensor,
    sequences: torch.Tensor,
    mask: torch.Tensor,
    temperature: float = 1.0,
    image_index: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token log-probs (N, L) of ``sequences`` (0 where ``mask`` is false) and next-token entropies (N, L), with
    gradient, from one teacher-forced pass; same arguments and conventions as ``ClipCap.sequence_logprob``."""
    prefix = model.prefix(features)  # (B, k, H)
    if image_index is not None:
        prefix = prefix[image_index.to(prefix.device)]  # (N, k, H)
    sequences = sequences.to(prefix.device)
    mask = mask.to(prefix.device)
    logits = model.lm_logits(prefix, sequences, mask.long())  # (N, L, V)
    logp = F.log_softmax(logits.float() / temperature, dim=-1)  # (N, L, V)
    token = logp.gather(-1, sequences.unsqueeze(-1)).squeeze(-1) * mask.to(logp.dtype)  # (N, L)
    entropy = _entropy(logp) * mask.to(logp.dtype)  # (N, L)
    return token, entropy
