"""Max-entropy regularisation of the policy (SLL-ME, the comparison of the sequence-level exploration paper, Sec. 4.1
and 5.2, after Mnih et al. 2016).

Definition used here (the paper gives only ``H(p_theta(w_j | w_<j, x_i))``): at every position of a *decoded*
caption (its tokens up to and including the stop token, not padding), the entropy of the full next-token
distribution ``H_t = -sum_v p(v | y_<t, x) log p(v | y_<t, x)``; the regulariser is the mean of ``H_t`` over all
such positions of the batch (token-level average), and the loss *subtracts* ``coef * mean H`` (maximising the
entropy). The distribution is the one whose log-probs REINFORCE uses (temperature 1, or the sampling temperature
with ``rl.scaled_logprob``). The paper's coefficient is 1e-2 (tuned among 1e-1, 1e-2, 1e-3).

The entropies come from the same forward pass as the REINFORCE log-probs: the captioner's ``forward`` with
``with_entropy=True`` returns both (:class:`finecap.models.captioner.TokenScores`).

Example::

    >>> import torch
    >>> logits = torch.log(torch.tensor([[[0.5, 0.5, 0.0], [0.25, 0.25, 0.5]]]))  # (1, 2, 3)
    >>> [round(v, 4) for v in token_entropy(logits)[0].tolist()]  # ln 2; 2 * 0.25 ln 4 + 0.5 ln 2 = 1.5 ln 2
    [0.6931, 1.0397]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from finecap.models.captioner import entropy_of


def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy (nats) of ``softmax(logits / temperature)`` at every position: logits (..., V) -> (...)."""
    return entropy_of(F.log_softmax(logits.float() / temperature, dim=-1))


def mean_entropy(entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``entropy`` (N, L) over the positions where ``mask`` (N, L) is true (token-level average)."""
    m = mask.to(entropy.dtype)
    return (entropy * m).sum() / m.sum().clamp(min=1.0)
