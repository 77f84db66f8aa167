"""The engine/trainer mismatch of rollouts decoded by another engine (``decode.engine=vllm``), and TRL's
importance-sampling correction of it (``vllm_importance_sampling_correction``).

vLLM computes the log-probs of the tokens it samples with its own kernels (and, in bfloat16, its own rounding), so
the captions are drawn from a distribution ``q`` a little off the trainer's policy ``π_old`` (the policy whose
weights the engine received, scored by the trainer). The policy-gradient losses assume samples from ``π_old``;
TRL 1.16 (``GRPOTrainer._generate_and_score_completions``, mode ``token_truncate``) reweights each token of the loss by

    ρ_t = min(exp(log π_old(y_t) - log q(y_t)), C)

(truncated importance sampling: ``C = rl.vllm_is_cap``, TRL's ``vllm_importance_sampling_clip_max``, default 3),
``ρ_t = 1`` on padding (the difference is masked before ``exp``) and where the engine gave no log-prob (NaN), without
gradient. ``_compute_loss`` multiplies the per-token policy loss by ``ρ`` before the KL term is added; finecap does the
same (:class:`finecap.objectives.grpo.PolicyOptimization`) and, for REINFORCE, weighs each token's log-prob in
``log p(caption)`` by it (:class:`finecap.objectives.reinforce.Reinforce`). When the engines agree (float32, the
weights synced) every ``ρ_t`` is 1 and the loss is the uncorrected one.

The mismatch is logged (TRL's ``sampling/sampling_logp_difference`` and ``sampling/importance_sampling_ratio``):
``vllm/logp_diff/mean|max`` (``|log π_old - log q|`` over the captions' tokens, NaN left out) and
``vllm/is_ratio/mean|min|max`` (``ρ`` after truncation, over the same tokens); each NaN over no token (a
micro-batch whose captions have none; TRL logs 0 there: :func:`finecap.objectives.base.token_stats`).
"""

from __future__ import annotations

import torch

from finecap.objectives.base import token_stats


def importance_weights(trainer: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor, cap: float) -> torch.Tensor:
    """``ρ = min(exp((trainer - engine) * mask), cap)`` per token ``(N, L)`` without gradient (module docstring);
    NaN differences count as 0 (``ρ = 1``).

    >>> trainer = torch.tensor([[-1.0, -2.0, -0.5]])
    >>> engine = torch.tensor([[-1.5, -0.5, 0.0]])  # differences 0.5, -1.5, and padding
    >>> w = importance_weights(trainer, engine, torch.tensor([[True, True, False]]), cap=3.0)
    >>> [round(v, 4) for v in w[0].tolist()]  # exp(0.5), exp(-1.5), 1 on padding
    [1.6487, 0.2231, 1.0]
    >>> importance_weights(torch.tensor([[0.0]]), torch.tensor([[-2.0]]), torch.tensor([[True]]), cap=3.0).item()
    3.0
    """
    diff = (trainer.detach().float() - engine.detach().to(trainer.device).float()) * mask.to(trainer.device)
    return torch.exp(torch.nan_to_num(diff, nan=0.0)).clamp(max=cap)


def mismatch_metrics(trainer: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor,
                     weights: torch.Tensor) -> dict[str, float]:  # fmt: skip
    """The logged mismatch (module docstring) of ``(N, L)`` log-probs over the ``mask`` of real tokens (NaN over
    none).

    >>> t, e = torch.tensor([[-1.0, -2.0, 0.0]]), torch.tensor([[-1.5, -0.5, 0.0]])
    >>> m = torch.tensor([[True, True, False]])
    >>> for name, value in mismatch_metrics(t, e, m, importance_weights(t, e, m, 3.0)).items():
    ...     print(name, round(value, 4))
    vllm/logp_diff/mean 1.0
    vllm/logp_diff/max 1.5
    vllm/is_ratio/mean 0.9359
    vllm/is_ratio/min 0.2231
    vllm/is_ratio/max 1.6487
    """
    values = mismatch_values(trainer, engine, mask, weights)
    return {**token_stats("vllm/logp_diff", values["vllm/logp_diff"], ("mean", "max")),
            **token_stats("vllm/is_ratio", values["vllm/is_ratio"])}  # fmt: skip


def mismatch_values(trainer: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor,
                    weights: torch.Tensor) -> dict[str, torch.Tensor]:  # fmt: skip
    """The tokens' values (1-D each) whose statistics :func:`mismatch_metrics` logs: ``vllm/logp_diff``
    (``|log π_old - log q|`` at the ``mask``'s tokens, NaN left out) and ``vllm/is_ratio`` (``ρ`` there); their
    means are the step's token means over every process (:mod:`finecap.objectives.token_means`)."""
    mask = mask.to(trainer.device).bool()
    delta = (trainer.detach().float() - engine.detach().to(trainer.device).float()).abs()[mask]
    return {"vllm/logp_diff": delta[~torch.isnan(delta)], "vllm/is_ratio": weights.to(trainer.device)[mask]}
