"""Max-entropy regularisation of the policy (SLL-ME, the comparison of the sequence-level exploration paper, Sec. 4.1
and 5.2, after Mnih et al. 2016).

Definition used here (the paper gives only ``H(p_theta(w_j | w_<j, x_i))``): at every position of a *decoded*
caption (its tokens up to and including the stop token, not padding), the entropy of the full next-token
distribution ``H_t = -sum_v p(v | y_<t, x) log p(v | y_<t, x)``; the regulariser is the mean over the batch's
captions of each caption's mean ``H_t`` (``per="caption"``; REINFORCE, and GRPO unless its loss is a token mean), or
the mean of ``H_t`` over all positions of the batch (``per="token"``: GRPO's ``grpo.loss_aggregation=token``), as
the objective's loss is a mean over captions or over tokens (its ``num_items``). So the term, like the loss, is
that of the whole step however it is cut into micro-batches: a token mean per micro-batch weighted by its captions
would not be (10 tokens of entropy 1 and 2 of entropy 3: 16 / 12 as one batch, (1 + 3) / 2 cut in two). The loss
*subtracts* ``coef * mean H`` (maximising the entropy). The distribution is the one whose log-probs REINFORCE
uses (temperature 1, or the sampling temperature with ``rl.scaled_logprob``). The paper's coefficient is 1e-2
(tuned among 1e-1, 1e-2, 1e-3).

A caption a reward could not score (``RewardOutput.failed``: a judge that timed out) is out of the term and of the
logged ``entropy``, as it is out of the rest of the loss (its advantage is 0; the GRPO family's KL term leaves it
out too): a failed caption takes no gradient (docs/methods/grpo.md). Were the bonus to cover it, the push towards a
flatter distribution at its tokens would be its only gradient, with no reward to answer it, and a judge fails on
some captions more than on others (long, garbled ones), so that push would fall where the reward cannot see. Its
caption (or tokens) still counts in the denominator, as in the loss's ``num_items``, so the term of a step is the
same however it is cut. Until 2026-11-29 the bonus and ``entropy`` covered failed captions.

The logged ``entropy`` is the mean of ``H_t`` over the scored captions' tokens whatever the bonus's aggregation, as
TRL 1.16's logged ``entropy`` is and as the GRPO family's ``kl`` is of its KL term: the measure of the policy's
entropy, which a caption's length does not reweigh; a step logs the mean over every token of its global batch, every
process's (:mod:`finecap.objectives.token_means`). Until 2026-11-29 it was the mean of the captions' token means for
REINFORCE and for the GRPO family's ``sequence`` and ``constant`` aggregations, a value TRL's ``entropy`` of the same
tokens is not; until 2026-11-29 a step's was the mean of its micro-batches' and processes' token means.

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


def mean_entropy(
    entropy: torch.Tensor, mask: torch.Tensor, per: str = "caption", rows: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean of ``entropy`` (N, L) over the positions where ``mask`` (N, L) is true: ``per="caption"`` the mean over
    the captions of each one's mean, ``per="token"`` over all positions (module docstring). Whatever ``entropy``
    holds where ``mask`` is false (a NaN of a row of ``-inf`` logits) takes no part.

    ``rows`` (N,) bool: the captions the term covers (``None``: every one), those a reward scored; the others'
    (``RewardOutput.failed``) terms are 0, so they take no gradient from it, and they still count in the
    denominators (their caption, or their tokens with ``per="token"``), as they count in the objective's
    ``num_items``: the step's term stays the same however the step is cut into micro-batches (module docstring).

    >>> h, m = torch.tensor([[1.0, 1.0, 1.0], [3.0, 0.0, 0.0]]), torch.tensor([[True] * 3, [True, False, False]])
    >>> mean_entropy(h, m).item(), mean_entropy(h, m, per="token").item()  # (1 + 3) / 2; 6 / 4
    (2.0, 1.5)
    >>> rows = torch.tensor([False, True])  # caption 0 failed: (0 + 3) / 2; 3 / 4
    >>> mean_entropy(h, m, rows=rows).item(), mean_entropy(h, m, per="token", rows=rows).item()
    (1.5, 0.75)
    """
    keep = mask.to(entropy.device).bool()
    kept, m = entropy.masked_fill(~keep, 0.0), keep.to(entropy.dtype)  # (N, L) each
    if rows is not None:  # the other captions' terms 0; their tokens stay in the denominators
        kept = kept.masked_fill(~rows.to(entropy.device, torch.bool).unsqueeze(1), 0.0)
    if per == "token":
        return kept.sum() / m.sum().clamp(min=1.0)
    if per != "caption":
        raise ValueError(f"mean_entropy: per={per!r}; valid: caption, token")
    return (kept.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
