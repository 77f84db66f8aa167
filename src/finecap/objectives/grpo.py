"""The GRPO family of policy optimisation over caption rewards: group advantages (GRPO, Dr. GRPO, GDPO), the clipped
surrogate over several iterations (PPO/GRPO, DAPO's asymmetric clip, GSPO's sequence-level ratio), a k3 KL to the
starting policy and TRL's loss aggregations. Formulas and names follow TRL 1.16 (``trl/trainer/grpo_trainer.py``:
``_generate_and_score_completions`` for the advantages, ``_compute_loss`` for the loss) and are tested equal to it
(``tests/objectives/test_policy_trl.py``); docs/methods/grpo.md puts them side by side.

It is the ``reinforce`` objective with options (:class:`PolicyOptimization`, built by the same factory when an option
asks for it; the defaults are the papers' REINFORCE, :class:`~finecap.objectives.reinforce.Reinforce`). Per image,
``s = rl.samples`` captions are sampled: the image's *group*. One optimizer step of the ``grpo.iterations = μ`` that
share a rollout:

1. **Roll out** (first step of a cycle only; :meth:`PolicyOptimization.begin_step`, before any micro-batch's
   backward pass): decode and score every micro-batch of the step as REINFORCE does; with ``grpo.kl_coef > 0`` score
   the captions under the reference policy too (:mod:`finecap.objectives.reference`).
2. **Advantages** ``A`` per caption (no gradient), ``eps = 1e-4`` as TRL:

   - ``grpo.advantage=baseline``: ``R - b`` with ``rl.baseline`` (REINFORCE's);
   - ``group`` with ``grpo.reward_aggregation=sum_then_normalize``: ``A = (R - mean_g R) / (std + eps)``, ``std`` the
     group's (``grpo.scale_rewards=group``), the global batch's (``batch``) or none, ``A = R - mean_g R`` (``none``,
     Dr. GRPO);
   - ``normalize_then_sum`` (GDPO): each reward of ``rl.rewards`` normalised within its group,
     ``a_k = (r_k - mean_g r_k) / (std_g r_k + eps)``, summed with the weights, ``S = sum_k w_k a_k``, and the sum
     normalised over the global batch, ``A = (S - mean S) / (std S + eps)``.

   Standard deviations are Bessel-corrected (TRL's ``nanstd``), so a group whose rewards are all equal has
   ``std = 0`` and ``A = 0 / eps = 0``, never NaN, and exactly 0 (:func:`constant_groups`; TRL's float rounding
   leaves up to 6e-4 there). *Batch* statistics are over the step's whole global batch: every
   micro-batch of the step is rolled out first, and the sums are reduced over processes with the accelerator that
   ``setup`` received (``accelerator.reduce``), so they do not depend on how the global batch is split over
   processes and accumulation steps. A copy micro-batch's captions (:func:`~finecap.contract.is_copy`: an epoch's
   last global batch repeated to fill the step) are left out of them, and get the advantages of the captions they
   repeat. Groups never straddle processes or micro-batches: an image's samples are decoded together.
3. **Loss**, with ``logp`` the policy's per-token log-probs (with gradient) and ``old`` those of the rollout:

   - ``grpo.policy_loss=reinforce``: ``-mean_n A_n log p(y_n)`` (``rl.logprob``: sum or mean of the caption's tokens);
   - ``clipped``: per token ``-min(w A, clip(w, 1 - clip_low, 1 + clip_high) A)`` with ``w = exp(logp - old)``
     (``grpo.importance=token``) or ``w = exp(mean_t (logp - old))`` per caption (``sequence``, GSPO); plus, with
     ``grpo.kl_coef = β > 0``, ``β k3`` per token, ``k3 = exp(ref - logp) - (ref - logp) - 1`` (times ``w`` with
     ``grpo.kl_bias_correction``, TRL 1.16's default); aggregated by ``grpo.loss_aggregation``: ``sequence`` (TRL's
     ``grpo``: mean over the caption's tokens, then over captions), ``token`` (``bnpo``/``dapo``: sum over every token
     of the global batch / their number; each micro-batch reports its token count as ``ObjectiveOutput.num_items``
     and the engine divides by the global count, so the mean is that of the global batch whatever its split),
     ``constant`` (``dr_grpo``: sum / (captions x ``decode.max_length``)).

   ``old`` is the policy's own log-probs at the first step of the cycle, detached (TRL does the same when μ = 1):
   the first step's ratio is exactly 1, so with μ = 1 nothing is clipped and the gradient is REINFORCE's with the
   same advantages (``sequence`` gives ``rl.logprob=mean``'s, ``constant`` ``rl.logprob=sum``'s divided by
   ``decode.max_length``). Later steps of the cycle score the same captions with the updated policy.

**Iterations.** With μ > 1 the same images must come back for μ consecutive optimizer steps: the application
repeats each global batch of the sampler μ times (:class:`finecap.data.samplers.RepeatedBatches`, from
``batch_repeats``), so an epoch has μ times as many optimizer steps and ``train.epochs``, ``train.max_steps`` and the
learning-rate schedule count every one. The rollout of the cycle (captions, advantages, ``old``, ``ref``) is kept by
this process, micro-batch by micro-batch, checked against each micro-batch's image indices (``batch["index"]``); it
is part of the objective's state, so a checkpoint taken mid-cycle resumes bit-exactly
(``tests/train/test_grpo_training.py``). A kept rollout whose images do not match the step's (a run resumed with
another number of processes) is dropped with a warning and the cycle restarts with a fresh rollout. With dropout in
the policy, the ratios of the later steps also carry the dropout noise of two forward passes (as TRL's without
``disable_dropout``).

Losses: ``policy`` (the clipped surrogate, KL included) or ``reinforce``, and ``entropy`` with ``rl.entropy_coef``.
Metrics besides REINFORCE's: ``advantage/min``, ``advantage/max``, ``zero_std_groups`` (share of groups whose rewards
are all equal: no signal), and with ``clipped`` TRL's ``clip_ratio/low_mean``, ``high_mean``, ``region_mean`` (also
``clip_fraction``: tokens whose ratio left the clip range on the side where the clip binds), ``low_min`` and
``high_max`` (:meth:`PolicyOptimization.clip_ratios`), ``ratio/mean|min|max`` and ``kl`` (per-token mean;
a step logs the token mean over every process's tokens: :mod:`~finecap.objectives.token_means`);
``kl``, ``clip_ratio/*`` and ``ratio/*`` over the scored captions' tokens (a failed caption is out of the clipped
loss, its KL term included: :meth:`PolicyOptimization.clipped_loss`), and so is the ``entropy`` bonus
(:mod:`finecap.objectives.entropy`): a failed caption takes no gradient from any term. The logged ``entropy`` is a
token mean whatever ``grpo.loss_aggregation`` (TRL's: :mod:`~finecap.objectives.entropy`), while the
bonus is a mean of caption means outside ``token``. With ``grpo.kl_coef > 0``,
``time/reference``: the seconds of the reference pass, beside ``time/generate`` and ``time/reward`` (each 0 at the
steps of a cycle after its rollout: :meth:`PolicyOptimization.rollout_seconds`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from finecap.config import DecodeConfig, GRPOConfig, RLConfig
from finecap.contract import is_copy
from finecap.decode import Generation
from finecap.objectives.base import ObjectiveOutput, token_stats
from finecap.objectives.baselines import NoBaseline
from finecap.objectives.entropy import mean_entropy
from finecap.objectives.reference import Reference
from finecap.objectives.reinforce import (
    Reinforce,
    Rollout,
    advantage_range,
    policy_gradient_loss,
    reinforce_kwargs,
    sequence_logprob,
    usable_advantages,
)
from finecap.objectives.token_means import caption_means, scored_values
from finecap.rewards.base import RewardOutput

if TYPE_CHECKING:
    from finecap.config import Config, VllmConfig
    from finecap.contract import TrainContext
    from finecap.rewards.base import Reward

log = logging.getLogger(__name__)

EPS = 1e-4
"""Added to every standard deviation that divides an advantage (TRL's constant)."""

Reduce = Callable[[torch.Tensor], torch.Tensor]
"""Sums a tensor over the processes (the identity in one process)."""


def local(t: torch.Tensor) -> torch.Tensor:
    """:data:`Reduce` of one process."""
    return t


# --------------------------------------------------------------------------------------------------------------------
# Advantages
# --------------------------------------------------------------------------------------------------------------------


def batch_mean_std(x: torch.Tensor, reduce: Reduce = local) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and Bessel-corrected standard deviation of every value of ``x`` on every process (TRL's ``nanmean`` and
    ``nanstd`` over the gathered batch), by two reductions of sums. One value in all: std NaN, as TRL's.

    >>> [round(v.item(), 4) for v in batch_mean_std(torch.tensor([1.0, 2.0, 6.0]))]  # var = (4 + 1 + 9) / 2 = 7
    [3.0, 2.6458]
    """
    totals = reduce(torch.stack([x.sum(), torch.tensor(float(x.numel()), dtype=x.dtype, device=x.device)]))
    mean = totals[0] / totals[1]
    squares = reduce(((x - mean) ** 2).sum().reshape(1))[0]
    return mean, (squares / (totals[1] - 1)).sqrt() if totals[1] > 1 else torch.full_like(mean, float("nan"))


def group_advantages(
    rewards: torch.Tensor,
    samples: int,
    scale: str = "group",
    reduce: Reduce = local,
    failed: torch.Tensor | None = None,
    counted: torch.Tensor | None = None,
) -> torch.Tensor:
    """GRPO's advantages of ``rewards`` (N,), groups of ``samples`` contiguous captions: ``R - group mean``, divided
    by the group's std + eps (``scale="group"``), the global batch's std + eps (``"batch"``) or nothing (``"none"``).

    ``failed`` (N,) bool marks captions a reward could not score (``RewardOutput.failed``): the statistics skip them
    (the mean and std of a group over its other captions, the batch's over every scored caption) and their advantage
    is 0, so the policy term gives them no gradient (the clipped loss also leaves them out of its KL term:
    :meth:`PolicyOptimization.clipped_loss`); a group whose captions all failed is all 0. A batch std of a single
    scored caption (every other caption of the global batch failed) is undefined (NaN, as TRL's ``nanstd``): that
    caption's advantage is 0 too, as TRL's ``nan_to_num`` of the advantages makes it, never NaN. Without failures
    the result is the unmasked computation's, bit for bit.

    ``counted`` (N,) bool marks the captions the batch std is over (``None``: every one): not those of a copy
    micro-batch (:func:`~finecap.contract.is_copy`, an epoch's last global batch repeated to fill the step), whose
    advantages are computed with the real captions' statistics, as those of the captions it repeats. A process whose
    every caption is a copy adds nothing to the sums, but still takes part in their reductions.

    Raises ``ValueError`` naming ``samples`` when it is below 2 (a group of one caption has no mean to compare with:
    its std is NaN, ``grpo.advantage=group`` needs ``rl.samples >= 2``) or does not divide the number of rewards.

    >>> adv = group_advantages(torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0]), 3)  # std 1; a constant group: 0
    >>> [round(a, 4) for a in adv.tolist()]  # -1 / (1 + 1e-4), 0, 1 / (1 + 1e-4)
    [-0.9999, 0.0, 0.9999, 0.0, 0.0, 0.0]
    """
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"grpo.scale_rewards: invalid value {scale!r}; valid choices: group, batch, none")
    _check_group_size(rewards, samples)
    if failed is not None and bool(failed.any()):
        scored = ~failed.to(rewards.device, torch.bool)
        return _scored_group_advantages(rewards, samples, scale, reduce, scored, counted)
    grouped = rewards.view(-1, samples)  # (G, s)
    centred = centre(grouped).flatten()  # (N,)
    if scale == "none":
        return centred
    if scale == "group":
        std = grouped.std(dim=1, keepdim=True).expand_as(grouped).flatten()  # (N,), Bessel-corrected
    else:
        std = batch_mean_std(counted_only(rewards, counted), reduce)[1].expand_as(rewards)
    return centred / (std + EPS)


def counted_only(
    values: torch.Tensor, counted: torch.Tensor | None, scored: torch.Tensor | None = None
) -> torch.Tensor:
    """The entries of ``values`` (N,) a batch statistic is over: those ``counted`` (N,) bool (not a copy
    micro-batch's; every one for ``None``) and ``scored`` (N,) bool (every one for ``None``)."""
    mask = scored
    if counted is not None:
        counted = counted.to(values.device, torch.bool)
        mask = counted if mask is None else mask & counted
    return values if mask is None else values[mask]


def _check_group_size(rewards: torch.Tensor, samples: int) -> None:
    """Refuse ``samples`` (captions per group) that cannot split ``rewards`` (N,) into groups of two or more."""
    if samples < 2:
        raise ValueError(f"samples={samples}: a group needs at least 2 captions (its mean and std are the baseline)")
    if rewards.numel() % samples:
        raise ValueError(f"samples={samples} does not divide the {rewards.numel()} rewards into whole groups")


def _scored_group_advantages(
    rewards: torch.Tensor, samples: int, scale: str, reduce: Reduce, scored: torch.Tensor, counted: torch.Tensor | None
) -> torch.Tensor:
    """:func:`group_advantages` over the ``scored`` (N,) captions only (the batch std over those ``counted`` too); 0
    for the others."""
    count, centred = _scored_centred(rewards.view(-1, samples), scored.view(-1, samples))
    if scale == "none":
        out = centred
    elif scale == "group":  # one scored caption or none: centred is 0 there
        out = centred / (_scored_std(centred, count) + EPS)
    else:
        out = centred / (batch_mean_std(counted_only(rewards, counted, scored), reduce)[1] + EPS)
    return scored_only(out.flatten(), scored)


def _scored_centred(grouped: torch.Tensor, ok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(count (G, 1), centred (G, s))`` of rewards ``grouped`` (G, s): how many captions of each group are ``ok``
    (scored), and their rewards minus the mean over them; 0 at the others (a failed caption's NaN kept out)."""
    r = torch.where(ok, grouped, torch.zeros_like(grouped))
    count = ok.sum(dim=1, keepdim=True).to(grouped.dtype)
    mean = r.sum(dim=1, keepdim=True) / count.clamp(min=1.0)
    return count, torch.where(ok & ~constant_groups(grouped, ok), r - mean, torch.zeros_like(r))


def centre(grouped: torch.Tensor) -> torch.Tensor:
    """``grouped`` (G, s) minus each group's mean, exactly 0 in a group whose values are all equal."""
    centred = grouped - grouped.mean(dim=1, keepdim=True)  # (G, s)
    constant = constant_groups(grouped, torch.ones_like(grouped, dtype=torch.bool))  # (G, 1)
    return torch.where(constant, torch.zeros_like(centred), centred)


def constant_groups(grouped: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
    """(G, 1): whether each group's ``ok`` values (G, s) are all equal (true for one, false for none). Their centred
    rewards are 0 by definition, but ``x - mean(x, ..., x)`` in floating point is not always: seven rewards of 0.7
    (float32) are 6e-8 off their mean, which the group scaling's ``/ (std + eps)`` turns into an advantage of 6e-4
    on every caption of a group that carries no signal (TRL 1.16 computes exactly that: docs/methods/grpo.md)."""
    inf = torch.full_like(grouped, float("inf"))
    high = torch.where(ok, grouped, -inf).amax(dim=1, keepdim=True)
    low = torch.where(ok, grouped, inf).amin(dim=1, keepdim=True)
    return high == low


def _scored_std(centred: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """(G, 1) Bessel-corrected std of each group's scored captions (:func:`_scored_centred`); 0 for a group of fewer
    than two."""
    return ((centred**2).sum(dim=1, keepdim=True) / (count - 1).clamp(min=1.0)).sqrt()


def scored_only(advantages: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """``advantages`` (N,) where a caption was ``scored`` and its advantage is a number, 0 elsewhere: a failed
    caption, or one whose statistics are undefined (a batch std over one scored caption is NaN, TRL's
    ``nan_to_num`` then gives 0)."""
    return torch.where(scored & ~torch.isnan(advantages), advantages, torch.zeros_like(advantages))


def normalize_then_sum(parts: Sequence[torch.Tensor], weights: Sequence[float], samples: int,
                       reduce: Reduce = local, failed: torch.Tensor | None = None,
                       counted: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """GDPO's advantages: each reward (N,) normalised within its group, the weighted sum of those, normalised over
    the global batch (module docstring). ``failed`` as :func:`group_advantages`: skipped by every statistic, 0 (and
    0 for a lone scored caption, whose batch std is undefined); ``counted`` as there: the batch mean and std are
    over those captions only (not a copy micro-batch's), whose advantages they give too."""
    if failed is None or not bool(failed.any()):
        summed = sum(w * group_advantages(r, samples, "group") for r, w in zip(parts, weights, strict=True))
        assert isinstance(summed, torch.Tensor)
        mean, std = batch_mean_std(counted_only(summed, counted), reduce)
        return (summed - mean) / (std + EPS)
    scored = ~failed.to(parts[0].device, torch.bool)
    summed = sum(w * group_advantages(r, samples, "group", failed=failed) for r, w in zip(parts, weights, strict=True))
    assert isinstance(summed, torch.Tensor)
    mean, std = batch_mean_std(counted_only(summed, counted, scored), reduce)
    return scored_only((summed - mean) / (std + EPS), scored)


def compared(failed: torch.Tensor | None, n: int, samples: int) -> torch.Tensor:
    """(N,) bool over ``n`` captions in groups of ``samples``: those a reward scored (not ``failed`` (N,) bool;
    ``None``: every one) whose group holds another scored caption, the captions a group advantage is defined for.

    >>> compared(torch.tensor([False, True, False, False, True, True]), 6, 3).tolist()  # group 1: one scored
    [True, False, True, False, False, False]
    """
    scored = torch.ones(n, dtype=torch.bool) if failed is None else ~failed.cpu().to(torch.bool)
    grouped = scored.view(-1, samples)  # (G, s)
    return (grouped & (grouped.sum(dim=1, keepdim=True) >= 2)).flatten()  # (N,)


def zero_std_groups(rewards: torch.Tensor, samples: int, failed: torch.Tensor | None = None) -> torch.Tensor:
    """(G,) bool: whether each group's rewards are all equal (TRL's ``is_std_zero``): no learning signal. The std of a
    group is over its scored captions (neither NaN, which TRL's ``nanstd`` skips too, nor ``failed`` (N,), whatever
    number a reward left there), so a group whose scored captions agree counts; one with fewer than two scored
    captions has no std and does not (as TRL's).

    >>> zero_std_groups(torch.tensor([2.0, float("nan"), 2.0, 1.0, 2.0, 3.0]), 3).tolist()  # group 0: (2, 2)
    [True, False]
    >>> zero_std_groups(torch.tensor([float("nan")] * 3 + [1.0, 2.0, 3.0]), 3).tolist()  # group 0: none scored
    [False, False]
    """
    grouped = rewards.view(-1, samples)  # (G, s)
    ok = ~torch.isnan(grouped)
    if failed is not None:
        ok &= ~failed.to(grouped.device, torch.bool).view(-1, samples)
    count, centred = _scored_centred(grouped, ok)
    std = _scored_std(centred, count)
    return (torch.isclose(std, torch.zeros_like(std)) & (count >= 2)).flatten()  # (G, 1) -> (G,)


def zero_std_share(rewards: torch.Tensor, samples: int, failed: torch.Tensor | None = None) -> float:
    """Share of groups whose rewards are all equal (:func:`zero_std_groups`; TRL's ``frac_reward_zero_std``).

    >>> zero_std_share(torch.tensor([2.0, float("nan"), 2.0, 1.0, 2.0, 3.0]), 3)
    0.5
    """
    return float(zero_std_groups(rewards, samples, failed).float().mean())


# --------------------------------------------------------------------------------------------------------------------
# The clipped surrogate, the KL term and aggregation
# --------------------------------------------------------------------------------------------------------------------


def log_importance(logp: torch.Tensor, old: torch.Tensor, mask: torch.Tensor, level: str = "token") -> torch.Tensor:
    """``log w``: per token ``logp - old`` (N, L), or per caption the masked mean of it (N, 1) (GSPO)."""
    log_ratio = logp - old  # (N, L)
    if level == "token":
        return log_ratio
    if level == "sequence":
        m = mask.to(log_ratio.dtype)
        return ((log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0)).unsqueeze(-1)  # (N, 1)
    raise ValueError(f"grpo.importance: invalid value {level!r}; valid choices: token, sequence")


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> torch.Tensor:
    """Per-token loss ``-min(w A, clip(w, 1 - clip_low, 1 + clip_high) A)``; ``ratio`` (N, L) or (N, 1), ``advantages``
    (N,) without gradient.

    >>> w = torch.tensor([[0.5, 1.0, 1.5]])  # A = 2: the upper clip binds at 1.5 -> 1.2; the lower one never
    >>> clipped_surrogate(w, torch.tensor([2.0]), 0.2, 0.2).tolist()
    [[-1.0, -2.0, -2.4000000953674316]]
    """
    a = advantages.detach().to(ratio.dtype).unsqueeze(1)  # (N, 1)
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    return -torch.min(ratio * a, clipped * a)


def k3(logp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """TRL's per-token KL estimate ``exp(ref - logp) - (ref - logp) - 1`` (>= 0, 0 where they agree). (N, L).

    >>> k3(torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -1.0])).tolist()  # e^1 - 1 - 1
    [0.0, 0.7182817459106445]
    """
    d = ref - logp
    return torch.exp(d) - d - 1


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, how: str, max_length: int) -> tuple[torch.Tensor, float]:
    """The loss from per-token losses ``(N, L)`` (or ``(N, 1)``, broadcast over the tokens) and what it is a mean over
    (``ObjectiveOutput.num_items``): ``sequence`` (captions), ``token`` (tokens), ``constant`` (captions, with the
    sum divided by ``N x max_length``).

    >>> x, m = torch.tensor([[1.0, 3.0], [2.0, 0.0]]), torch.tensor([[True, True], [True, False]])
    >>> [(round(v.item(), 4), n) for v, n in (aggregate(x, m, h, 4) for h in ("sequence", "token", "constant"))]
    [(2.0, 2.0), (2.0, 3.0), (0.75, 2.0)]
    """
    m = mask.to(per_token.dtype)
    masked = per_token * m  # (N, L)
    n = float(per_token.shape[0])
    if how == "sequence":
        return (masked.sum(-1) / m.sum(-1).clamp(min=1.0)).mean(), n
    if how == "token":
        return masked.sum() / m.sum().clamp(min=1.0), float(m.sum())
    if how == "constant":
        return masked.sum() / (n * max_length), n
    raise ValueError(f"grpo.loss_aggregation: invalid value {how!r}; valid choices: sequence, token, constant")


# --------------------------------------------------------------------------------------------------------------------
# The objective
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class Prepared:
    """One micro-batch's rollout, kept for the ``grpo.iterations`` steps of its cycle."""

    index: torch.Tensor  # (B,) dataset indices of the micro-batch's images
    rollout: Rollout
    advantages: torch.Tensor  # (N,)
    ref: torch.Tensor | None = None  # (N, L) reference log-probs (grpo.kl_coef > 0)
    old: torch.Tensor | None = None  # (N, L) the policy's log-probs at the cycle's first step, detached
    seconds: dict[str, float] = field(default_factory=dict)  # the rollout's timings (logged at its first step only)

    def state_dict(self) -> dict[str, Any]:
        r, g = self.rollout, self.rollout.samples
        return {
            "index": self.index, "sequences": g.sequences, "token_logprobs": g.token_logprobs, "lengths": g.lengths,
            "image_index": g.image_index, "scores": g.scores, "texts": list(g.texts), "rewards": r.rewards.total,
            "parts": dict(r.rewards.parts), "baseline": r.baseline, "advantages": self.advantages, "ref": self.ref,
            "old": self.old, "greedy_rewards": None if r.greedy_rewards is None else r.greedy_rewards.total,
            "failed": r.rewards.failed_mask(),
        }  # fmt: skip

    @classmethod
    def from_state(cls, s: dict[str, Any]) -> Prepared:
        """The kept rollout of a checkpoint; ``ValueError`` unless its tensors agree in kind and shape."""
        check_kept(s)
        samples = Generation(s["sequences"], s["token_logprobs"], s["lengths"], s["image_index"], s["scores"],
                             list(s["texts"]))  # fmt: skip
        # a failed greedy caption's reward is NaN (RewardOutput.failed_as_nan), the only one that is not finite
        greedy = s["greedy_rewards"]
        greedy = None if greedy is None else RewardOutput(greedy, failed=~torch.isfinite(torch.as_tensor(greedy)))
        rewards = RewardOutput(s["rewards"], dict(s["parts"]), s.get("failed"))  # no "failed" before finecap kept it
        rollout = Rollout(samples, rewards, s["baseline"], None, greedy)
        return cls(s["index"], rollout, s["advantages"], s["ref"], s["old"])


def check_kept(s: dict[str, Any]) -> None:
    """A kept rollout read from a checkpoint: N captions of L positions, their texts, rewards and advantages, and
    ``old`` / ``ref`` of the same (N, L) shape when present (a tampered state is refused, never half-used)."""
    seq = s["sequences"]
    if not isinstance(seq, torch.Tensor) or seq.dim() != 2 or seq.is_floating_point():
        raise ValueError("the kept rollout's sequences must be an (N, L) integer tensor")
    n = seq.shape[0]
    vectors = ("lengths", "image_index", "scores", "rewards", "baseline", "advantages")
    if not all(isinstance(s[k], torch.Tensor) and tuple(s[k].shape) == (n,) for k in vectors):
        raise ValueError(f"the kept rollout's {', '.join(vectors)} must be tensors of its {n} captions")
    for key in ("token_logprobs", "old", "ref"):
        if s[key] is not None and (not isinstance(s[key], torch.Tensor) or s[key].shape != seq.shape):
            raise ValueError(f"the kept rollout's {key!r} must have the shape of its sequences {tuple(seq.shape)}")
    texts, parts = s["texts"], s["parts"]
    if not isinstance(texts, list) or len(texts) != n or not all(isinstance(t, str) for t in texts):
        raise ValueError(f"the kept rollout's texts must be {n} strings")
    if not isinstance(parts, dict) or not all(isinstance(v, torch.Tensor) and v.shape == (n,) for v in parts.values()):
        raise ValueError(f"the kept rollout's reward parts must be tensors of its {n} captions")
    if not isinstance(s["index"], torch.Tensor) or s["index"].dim() != 1:
        raise ValueError("the kept rollout's image indices must be a vector")
    failed = s.get("failed")
    if failed is not None and (not isinstance(failed, torch.Tensor) or failed.dtype != torch.bool
                               or tuple(failed.shape) != (n,)):  # fmt: skip
        raise ValueError(f"the kept rollout's failed mask must be a bool tensor of its {n} captions")


def computed(t: torch.Tensor) -> torch.Tensor:
    """``t`` once its device has computed it: an accelerator runs kernels after the call that queued them returns,
    so a timing of that call stops here (the reference pass's ``time/reference``)."""
    if t.device.type != "cpu":
        torch.accelerator.synchronize(t.device)
    return t


def batch_indices(batch: dict[str, Any]) -> torch.Tensor:
    """The micro-batch's dataset indices ``(B,)`` (what a kept rollout is matched by); rows when none are given."""
    if "index" in batch:
        return torch.as_tensor(batch["index"]).long().cpu()
    rows = next((v for v in batch.values() if isinstance(v, torch.Tensor) and v.dim() > 0), None)
    return torch.arange(0 if rows is None else rows.shape[0])


def failed_mask(rollouts: Sequence[Rollout]) -> torch.Tensor | None:
    """The (N_all,) mask of the captions a reward could not score (``RewardOutput.failed``, read with ``getattr``:
    rewards without it score every caption) of the micro-batches ``rollouts``, or ``None`` when none says."""
    masks = [r.rewards.failed for r in rollouts]
    if all(m is None for m in masks):
        return None
    return torch.cat([torch.zeros(len(r.samples), dtype=torch.bool) if m is None else m.detach().cpu().to(torch.bool)
                      for r, m in zip(rollouts, masks, strict=True)])  # fmt: skip


def counted_mask(rollouts: Sequence[Rollout], copies: Sequence[bool]) -> torch.Tensor | None:
    """The (N_all,) mask of the captions of the micro-batches ``rollouts`` that count in the step's batch statistics:
    those of the micro-batches that are no ``copies`` (one flag each, or none: every one counts, ``None``)."""
    if not any(copies):
        return None
    return torch.cat([torch.full((len(r.samples),), not copy, dtype=torch.bool)
                      for r, copy in zip(rollouts, copies, strict=True)])  # fmt: skip


class PolicyOptimization(Reinforce):
    """``objective(model, batch)``: the GRPO family (module docstring); :class:`Reinforce`'s arguments.

    Called by the training engine, ``begin_step`` rolls out the step's micro-batches (or reuses the cycle's rollout)
    and each call takes the next one; called directly (tests, scripts), a call without ``begin_step`` rolls out its
    own batch, and ``end_step()`` after each optimizer step advances the cycle.
    """

    headline = ("reward", "kl")  # the progress bar's: one iteration's clipped surrogate is 0 by construction

    def __init__(self, reward: Reward, baseline: Any, *, rl: RLConfig | None = None, grpo: GRPOConfig | None = None,
                 decode: DecodeConfig | None = None, seed: int = 0, vllm: VllmConfig | None = None):  # fmt: skip
        super().__init__(reward, baseline, rl=rl, decode=decode, seed=seed, vllm=vllm)
        self.grpo = grpo = grpo or GRPOConfig()
        if grpo.advantage == "group":
            self.baseline = NoBaseline()  # the group mean is the baseline (rl.baseline is not used)
        self.batch_repeats = grpo.iterations
        self.max_length = self.sample_cfg.max_length  # loss_aggregation=constant's divisor
        self.reference = Reference() if grpo.kl_coef > 0 else None
        self.reduce: Reduce = local
        self.cycle: list[Prepared] = []  # this process's micro-batches of the current rollout, in order
        self.taken = 0  # optimizer steps of the cycle finished
        self.cursor = 0  # the next micro-batch of the cycle
        self.open = False  # a step began and has not ended

    # -- hooks -----------------------------------------------------------------------------------------------------

    def setup(self, ctx: TrainContext) -> None:
        super().setup(ctx)
        acc = getattr(ctx, "accelerator", None)
        if acc is not None and acc.num_processes > 1:
            self.reduce = lambda t: acc.reduce(t.to(acc.device), reduction="sum").to(t.device)

    def begin_step(self, model: torch.nn.Module, micro_batches: list[dict[str, Any]]) -> None:
        """Roll out and score the step's micro-batches, unless the cycle's rollout covers the same images."""
        indices = [batch_indices(b) for b in micro_batches]
        kept = [p.index for p in self.cycle]
        same = len(kept) == len(indices) and all(torch.equal(a, b) for a, b in zip(kept, indices, strict=True))
        if not (same and self.taken < self.grpo.iterations):
            if self.cycle and self.taken < self.grpo.iterations:
                log.warning("grpo.iterations: the kept rollout is of other images than this step's (a resume with "
                            "another number of processes?); the cycle restarts with a fresh rollout")  # fmt: skip
            self.cycle, self.taken = self.prepare(model, micro_batches, indices), 0
        self.cursor, self.open = 0, True

    def end_step(self) -> None:
        super().end_step()
        self._finish_step()

    def _finish_step(self) -> None:
        if self.open:
            self.taken += 1
            self.open = False
            if self.taken >= self.grpo.iterations:
                self.cycle, self.taken = [], 0

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["policy"] = {"taken": self.taken, "cycle": [p.state_dict() for p in self.cycle],
                           "reference": None if self.reference is None else self.reference.state_dict()}  # fmt: skip
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        policy = state.get("policy")
        if policy is None:
            return
        taken = policy["taken"]
        if type(taken) is not int or not 0 <= taken < self.grpo.iterations:
            raise ValueError(f"the kept rollout's step count must be in [0, {self.grpo.iterations}), got {taken!r}")
        self.cycle, self.taken = [Prepared.from_state(p) for p in policy["cycle"]], taken
        if self.reference is not None and policy.get("reference") is not None:
            self.reference.load_state_dict(policy["reference"])

    # -- the rollout -----------------------------------------------------------------------------------------------

    def prepare(self, model: torch.nn.Module, micro_batches: list[dict[str, Any]],
                indices: list[torch.Tensor]) -> list[Prepared]:  # fmt: skip
        """Decode and score every micro-batch (every process at once), then the advantages with the batch statistics
        of the global batch, and the reference log-probs."""
        rolled = [self.rollout(model, b) for b in micro_batches]
        rollouts = [r for r, _ in rolled]
        for r in rollouts:
            self._check_groups(r.samples)
        if self.grpo.advantage == "group":  # a copy counts in no batch statistic
            advantages = self.group_advantages(rollouts, [is_copy(b) for b in micro_batches])
        else:
            advantages = [r.advantage for r in rollouts]
        prepared = []
        for batch, index, (rollout, seconds), adv in zip(micro_batches, indices, rolled, advantages, strict=True):
            ref = None
            if self.reference is not None:
                start = time.perf_counter()
                ref = computed(self.reference.logprobs(model, batch, rollout.samples, self.logprob_temperature))
                seconds = {**seconds, "time/reference": time.perf_counter() - start}
            prepared.append(Prepared(index, rollout, adv.detach(), ref, None, seconds))
        return prepared

    def _check_groups(self, gen: Generation) -> None:
        s = self.rl.samples
        want = torch.arange(len(gen) // s, device=gen.image_index.device).repeat_interleave(s)
        if len(gen) % s or not torch.equal(gen.image_index, want):
            raise RuntimeError(f"rl.samples={s}: the decoded captions are not {s} contiguous ones per image")

    def group_advantages(self, rollouts: list[Rollout], copies: Sequence[bool] = ()) -> list[torch.Tensor]:
        """The advantages of ``grpo.advantage=group`` of every micro-batch, with the global batch's statistics: over
        the micro-batches that are no ``copies`` (:func:`~finecap.contract.is_copy`; none when not given), whose
        statistics give the copies' advantages too. Until 2026-11-28 a copy's captions counted in the batch std
        (``grpo.scale_rewards=batch``) and GDPO's batch mean and std, and changed the real captions' advantages."""
        s, grpo = self.rl.samples, self.grpo
        sizes = [len(r.samples) for r in rollouts]
        failed = failed_mask(rollouts)
        counted = counted_mask(rollouts, copies)
        if grpo.reward_aggregation == "normalize_then_sum":
            weights = self.reward_weights()
            parts = [torch.cat([r.rewards.parts[name] for r in rollouts]) for name in weights]  # each (N_all,)
            flat = normalize_then_sum(parts, list(weights.values()), s, self.reduce, failed, counted)
        else:
            total = torch.cat([r.rewards.total for r in rollouts])
            flat = group_advantages(total, s, grpo.scale_rewards, self.reduce, failed, counted)
        return list(flat.split(sizes))

    def reward_weights(self) -> dict[str, float]:
        """``{name: weight}`` of the weighted rewards (GDPO normalises each one); one of weight 0 is logged only."""
        rewards = getattr(self.reward, "rewards", None)
        if not isinstance(rewards, dict):
            raise ValueError("grpo.reward_aggregation=normalize_then_sum needs the weighted rewards of rl.rewards")
        return {name: float(weight) for name, (weight, _) in rewards.items() if weight}  # 0: logged, not paid

    # -- the step --------------------------------------------------------------------------------------------------

    def _next(self, model: torch.nn.Module, batch: dict[str, Any]) -> Prepared:
        if self.cursor >= len(self.cycle) or not self.open:  # called without begin_step: this batch is a step
            self._finish_step()
            self.begin_step(model, [batch])
        item = self.cycle[self.cursor]
        self.cursor += 1
        if not torch.equal(item.index, batch_indices(batch)):
            raise RuntimeError("grpo.iterations: the micro-batch is not the one its rollout was made for")
        return item

    def __call__(self, model: torch.nn.Module, batch: dict[str, Any]) -> ObjectiveOutput:
        item = self._next(model, batch)
        first = self.taken == 0  # the cycle's first step: its rollout's timings are logged
        rollout, gen = item.rollout, item.rollout.samples
        scores = self.score(model, batch, gen)  # (N, L) log-probs with gradient (Reinforce.score)
        logp = scores.logprobs
        mask = gen.mask.to(logp.device)
        if item.old is None:  # the cycle's first step: the rollout policy is this one
            item.old = logp.detach()
        adv = item.advantages.to(logp.device)
        seq_logp = sequence_logprob(logp, gen.lengths, self.rl.logprob)  # (N,)
        metrics = {name: value if first else 0.0 for name, value in self.rollout_seconds(item).items()}
        counted = not is_copy(batch)  # a copy's tokens count in no step's token mean (finecap.objectives.token_means)
        weights, mismatch = self.engine_correction(item.old.to(logp.device), gen, counted)  # vLLM's: TRL's IS
        metrics.update(mismatch)
        failed = rollout.rewards.failed_mask()
        scored = None if failed is None else ~failed  # what the loss covers: a failed caption takes no gradient
        if self.grpo.policy_loss == "reinforce":
            weighted = seq_logp if weights is None else self.weighted_logprob(logp, gen, weights)
            losses, items = {"reinforce": policy_gradient_loss(adv, weighted)}, float(len(gen))
        else:
            loss, items, extra = self.clipped_loss(logp, item, adv, mask, weights, scored, counted)
            losses = {"policy": loss}
            metrics.update(extra)
        if scores.entropy is not None:  # over the scored captions, as the clipped loss (finecap.objectives.entropy)
            tokens = self.grpo.policy_loss != "reinforce" and self.grpo.loss_aggregation == "token"
            per = "token" if tokens else "caption"  # a mean over what `items` counts
            mask = mask.to(scores.entropy.device)
            losses["entropy"] = -self.rl.entropy_coef * mean_entropy(scores.entropy, mask, per, scored)
            # a token mean whatever the bonus's aggregation, as TRL's: the measure of the policy's entropy
            metrics["entropy"] = self.token_means.add("entropy", scored_values(scores.entropy, mask, scored), counted)
        metrics.update(self.metrics(rollout, seq_logp, counted, item.advantages))
        metrics.update(self.advantage_metrics(item, counted))
        metrics.update(self.watch(rollout, batch))
        return ObjectiveOutput(losses=losses, metrics=metrics, num_items=items, scored=self.signal(rollout))

    def has_advantage(self, rollout: Rollout) -> torch.Tensor:
        """(N,) bool: the captions whose advantage is defined: REINFORCE's (:meth:`Reinforce.has_advantage`), or
        under ``grpo.advantage=group`` the scored captions of a group with another scored caption
        (:func:`compared`); a lone scored caption's group statistics are undefined and its advantage a placeholder 0,
        as TRL's ``nan_to_num`` makes it."""
        if self.grpo.advantage != "group":
            return super().has_advantage(rollout)
        return compared(rollout.rewards.failed_mask(), len(rollout.samples), self.rl.samples)

    def signal(self, rollout: Rollout) -> int:
        """:meth:`Reinforce.signal`; with the KL term (``grpo.kl_coef > 0``), which covers every caption a reward
        scored, every such caption."""
        if self.reference is not None:
            return rollout.rewards.scored()
        return super().signal(rollout)

    def rollout_seconds(self, item: Prepared) -> dict[str, float]:
        """The seconds ``item``'s rollout took, each micro-batch's (the engine logs the step's sum, as every
        ``time/*``: :func:`~finecap.train.logging.step_sum`): ``time/generate``, ``time/reward`` (and ``time/sync``
        with vLLM's rollouts) and, with ``grpo.kl_coef > 0``, ``time/reference``, the reference policy's forward
        pass over its captions (:mod:`finecap.objectives.reference`), in none of the others; 0 for those a rollout
        kept from a checkpoint no longer has (a resumed cycle's). Until 2026-11-29 the reference pass was in no
        ``time/*``."""
        kept = {"time/generate": 0.0, "time/reward": 0.0}
        if self.reference is not None:
            kept["time/reference"] = 0.0
        return {**kept, **item.seconds}

    def clipped_loss(
        self,
        logp: torch.Tensor,
        item: Prepared,
        adv: torch.Tensor,
        mask: torch.Tensor,
        engine_weights: torch.Tensor | None = None,
        scored: torch.Tensor | None = None,
        counted: bool = True,
    ) -> tuple[torch.Tensor, float, dict[str, float]]:
        """The clipped surrogate (times ``engine_weights``, the importance weights of rollouts vLLM decoded:
        :meth:`engine_correction`; + β k3) aggregated, its item count, and its metrics.

        ``scored`` (N,) bool marks the captions a reward scored (``None``: every one). A failed caption
        (``RewardOutput.failed``) is out of the whole per-token loss, the KL term included, so it takes no gradient
        from it, and out of ``kl`` and ``clip_fraction`` (NaN when no caption of the micro-batch was scored); it
        still counts in the aggregation's denominator (its captions or tokens: ``num_items``), as its 0 advantage
        always made it count in the surrogate's, so a step's loss is that of every caption with the failed ones'
        terms 0, and with ``grpo.kl_coef = 0`` nothing changes. TRL 1.16 keeps an unscorable completion's KL term
        and counts it in its ``kl`` and ``clip_ratio`` (docs/methods/grpo.md, where finecap differs). ``ratio/*`` are
        over the scored captions' tokens too (NaN over none): they are the range of the importance weights the loss
        applies, the measure ``grpo.clip_low`` / ``clip_high`` are set against, and a failed caption's weigh nothing
        (its terms are 0) and can never be clipped. Until 2026-11-29 a failed caption took the KL term's gradient
        and counted in ``kl`` and ``clip_fraction`` (lowering it), and ``ratio/*`` covered its tokens."""
        grpo = self.grpo
        assert item.old is not None
        ratio = torch.exp(log_importance(logp, item.old.to(logp.device, logp.dtype), mask, grpo.importance))
        per_token = clipped_surrogate(ratio, adv, grpo.clip_low, grpo.clip_high)  # (N, L) or (N, 1)
        if engine_weights is not None:  # TRL: the per-token loss times the IS weights, before the KL term
            per_token = per_token * engine_weights.to(per_token.dtype)  # (N, L)
        metrics = {}
        if self.reference is not None:
            assert item.ref is not None
            kl = k3(logp, item.ref.to(logp.device, logp.dtype))  # (N, L)
            if grpo.kl_bias_correction:
                kl = kl * ratio
            per_token = per_token + grpo.kl_coef * kl
            metrics["kl"] = self.token_means.add("kl", scored_values(kl, mask, scored), counted)
        if scored is not None:  # a failed caption's terms are 0; it still counts in the denominator (docstring)
            keep = scored.to(per_token.device, torch.bool).unsqueeze(1)  # (N, 1)
            per_token = torch.where(keep, per_token, torch.zeros_like(per_token))
        loss, items = aggregate(per_token, mask, grpo.loss_aggregation, self.max_length)
        w = ratio.detach()
        metrics.update(self.clip_ratios(w, adv, mask, scored, counted))
        values = scored_values(w, mask, scored)  # ratio/*: the weights the loss applies, a failed caption's none
        metrics.update(token_stats("ratio", values))
        self.token_means.add("ratio/mean", values, counted)
        return loss, items, metrics

    def clip_ratios(self, w: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, scored: torch.Tensor | None = None,
                    counted: bool = True) -> dict[str, float]:  # fmt: skip
        """TRL 1.16's ``clip_ratio/*`` of the importance weights ``w`` (N, L) or (N, 1) (GSPO's) and the advantages
        ``adv`` (N,), over the ``scored`` (N,) captions' tokens (``None``: every caption), each the micro-batch's own:
        a token is *low-clipped* where ``w < 1 - clip_low`` and ``A < 0``, *high-clipped* where ``w > 1 + clip_high``
        and ``A > 0`` (the sides where the clip binds), *region-clipped* where either holds. ``clip_ratio/low_mean``,
        ``high_mean`` and ``region_mean`` (also logged as ``clip_fraction``, finecap's name before it took TRL's) are
        their shares of the tokens, the step's token means over every process's tokens (TRL's
        ``global_masked_mean``: :mod:`~finecap.objectives.token_means`); ``clip_ratio/low_min`` and ``high_max`` the
        smallest low-clipped and largest high-clipped share of a caption's tokens, the step's over every caption of
        every process (TRL's ``nanmin`` / ``nanmax`` of the gathered ``masked_seq_mean``s). Until 2026-11-29 only
        ``clip_fraction`` was logged."""
        a = adv.to(w.dtype).unsqueeze(1)  # (N, 1)
        low = ((w < 1 - self.grpo.clip_low) & (a < 0)).float()  # (N, L) or (N, 1)
        high = ((w > 1 + self.grpo.clip_high) & (a > 0)).float()
        region = torch.maximum(low, high)  # either: the two never hold at once
        means = self.token_means
        shares = (("clip_ratio/low_mean", low), ("clip_ratio/high_mean", high), ("clip_ratio/region_mean", region))
        out = {name: means.add(name, scored_values(x, mask, scored), counted) for name, x in shares}
        out["clip_fraction"] = out["clip_ratio/region_mean"]
        for name, x, highest in (("clip_ratio/low_min", low, False), ("clip_ratio/high_max", high, True)):
            out[name] = means.add_extreme(name, caption_means(x, mask, scored), highest, counted)
        return out

    def step_values(self) -> dict[str, float]:
        """:meth:`Reinforce.step_values`, with ``clip_fraction`` the step's ``clip_ratio/region_mean``
        (:meth:`clip_ratios`: one value, two names)."""
        values = super().step_values()
        if "clip_ratio/region_mean" in values:
            values["clip_fraction"] = values["clip_ratio/region_mean"]
        return values

    def advantage_metrics(self, item: Prepared, counted: bool = True) -> dict[str, float]:
        """``advantage/min`` and ``advantage/max`` of the micro-batch (``advantage_std``: :meth:`Reinforce.metrics`)
        and under group advantages ``zero_std_groups``, the share of its groups whose rewards are all equal, which
        also goes to the step's means (``counted``: unless the micro-batch is a copy): the step logs the share over
        every group of every process, as TRL's ``frac_reward_zero_std`` over the step's gathered groups (until
        2026-11-29 the mean of the micro-batches' and processes' shares)."""
        rewards = item.rollout.rewards
        failed = rewards.failed_mask()
        # a placeholder 0 is no advantage (usable_advantages): a failed caption's, or one without a baseline or a
        # group to compare with (until 2026-11-29 the latter counted here, as it never did in REINFORCE's metrics)
        out = advantage_range(usable_advantages(item.advantages, self.has_advantage(item.rollout)))
        if self.grpo.advantage == "group":
            zero = zero_std_groups(rewards.total, self.rl.samples, failed).double()  # (G,)
            out["zero_std_groups"] = self.token_means.add("zero_std_groups", zero, counted)
        return out


# --------------------------------------------------------------------------------------------------------------------
# Factories
# --------------------------------------------------------------------------------------------------------------------


def uses_policy_options(grpo: GRPOConfig) -> bool:
    """Whether ``grpo`` asks for anything of the GRPO family (group advantages or the clipped surrogate)."""
    return grpo.advantage != "baseline" or grpo.policy_loss != "reinforce"


def build(cfg: Config) -> Reinforce:
    """Factory of ``train.objective=grpo`` and of its former name ``reinforce``: SCST with the ``grpo`` section's
    defaults (CIDEr-D reward, greedy baseline, :class:`Reinforce`), the GRPO family (:class:`PolicyOptimization`) when
    ``grpo.advantage`` or ``grpo.policy_loss`` ask for it."""
    if uses_policy_options(cfg.grpo):
        return PolicyOptimization(**reinforce_kwargs(cfg), grpo=cfg.grpo)
    return Reinforce(**reinforce_kwargs(cfg))


def build_max_entropy(cfg: Config) -> Reinforce:
    """Factory of ``train.objective=scst_me``: REINFORCE with the max-entropy term, which needs rl.entropy_coef > 0."""
    if cfg.rl.entropy_coef <= 0:
        raise ValueError("train.objective=scst_me needs rl.entropy_coef > 0 (the paper's SLL-ME uses 0.01)")
    return build(cfg)
