"""Equal to TRL: on a tiny causal LM, the same completions, advantages, old and reference log-probs, finecap's GRPO
loss (``PolicyOptimization.clipped_loss``, what the objective computes) and its gradient equal TRL 1.16's
``GRPOTrainer._compute_loss`` for ``grpo``, ``bnpo``, ``dr_grpo`` and ``dapo``, with β = 0 and β > 0, token and
sequence importance, with and without TRL's KL bias correction (relative 1e-6 on the loss); and the advantages equal
TRL's for each ``scale_rewards`` and ``multi_objective_aggregation``; both at the inputs' edges too (empty and
full-length completions, constant groups, captions no reward scored); and the objective's whole step at a sampling
temperature with the entropy bonus (``rl.scaled_logprob``, ``rl.entropy_coef``) equals TRL's ``temperature`` and
``entropy_coef`` under the token mean; and a cycle of ``grpo.iterations=2`` (the same rollout over two optimizer
steps, the policy updated between them) equals ``_compute_loss`` at both steps with TRL's ``num_iterations=2``.

The trainers are real ``GRPOTrainer`` objects built from a ``GRPOConfig`` (one per configuration, over a tiny GPT-2
saved like a Hub checkpoint, as TRL builds its reference model from the path); ``_compute_loss`` runs on hand-built
``inputs`` in eval mode (no dropout, so both sides score the same function; TRL's normalisers are then 1). TRL computes
its advantages inline in ``_generate_and_score_completions``: :func:`trls_own_advantages` calls it (it generates with
the tiny LM; reward functions pay chosen values), and :func:`trl_advantages`, a fast transcription of that code path
(lines 2761-2810 of ``trl/trainer/grpo_trainer.py`` in TRL 1.16.0, with TRL's own ``nanstd``), runs in the default
suite.
"""

from __future__ import annotations

import pytest
import torch

from finecap.config import DecodeConfig
from finecap.decode import Generation
from finecap.objectives.grpo import PolicyOptimization, Prepared, group_advantages, normalize_then_sum
from finecap.objectives.reinforce import Rollout
from finecap.rewards.base import RewardOutput, WeightedSum
from helpers.rl_sections import rl_sections
from helpers.trl_grpo import COMPLETION, PROMPT_IDS, make_trainer, save_tiny_lm, trls_own_advantages

trl = pytest.importorskip("trl")

PROMPT = 3  # token positions (COMPLETION: helpers.trl_grpo's max_completion_length)
LENGTHS = [6, 2, 4, 1, 5, 3]  # completion lengths: every aggregation weighs them differently
ADVANTAGES = [1.5, -0.7, 0.2, -1.1, 0.9, -0.3]
FINECAP_NAME = {"grpo": "sequence", "bnpo": "token", "dapo": "token", "dr_grpo": "constant"}


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("tiny_lm"))


def inputs_for(model, lengths=LENGTHS, advantages=ADVANTAGES):
    """Hand-built inputs: completions of different ``lengths``, ``advantages`` (of both signs), old log-probs a little
    off the model's (so ratios leave the clip range) and reference log-probs further off."""
    g = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    prompt_ids = torch.randint(5, vocab, (6, PROMPT), generator=g)
    completion_ids = torch.randint(5, vocab, (6, COMPLETION), generator=g)
    mask = (torch.arange(COMPLETION)[None, :] < torch.tensor(lengths)[:, None]).long()
    with torch.no_grad():
        logp = policy_logprobs(model, prompt_ids, completion_ids, mask)
    old = logp + 0.3 * torch.randn(logp.shape, generator=g)
    ref = logp + 0.5 * torch.randn(logp.shape, generator=g)
    return {
        "prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids), "completion_ids": completion_ids,
        "completion_mask": mask, "advantages": torch.tensor(advantages),
        "old_per_token_logps": old * mask, "ref_per_token_logps": ref * mask, "num_items_in_batch": mask.sum(),
    }  # fmt: skip


def policy_logprobs(model, prompt_ids, completion_ids, mask):
    """finecap's side of the scoring: per-token log-probs of the completions (teacher forcing), 0 at padding."""
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention = torch.cat([torch.ones_like(prompt_ids), mask], dim=1)
    logits = model(input_ids=ids, attention_mask=attention).logits[:, PROMPT - 1 : -1].float()  # (N, C, V)
    logp = torch.log_softmax(logits, dim=-1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)  # (N, C)
    return logp * mask


def finecap_loss(model, inputs, rl: dict):
    reward = WeightedSum({"r": (1.0, lambda captions, batch: None)})
    objective = PolicyOptimization(reward, None, **rl, decode=DecodeConfig(max_length=COMPLETION))
    mask = inputs["completion_mask"].bool()
    logp = policy_logprobs(model, inputs["prompt_ids"], inputs["completion_ids"], inputs["completion_mask"])
    item = Prepared(torch.arange(2), None, inputs["advantages"], inputs["ref_per_token_logps"],
                    inputs["old_per_token_logps"])  # fmt: skip
    loss, items, metrics = objective.clipped_loss(logp, item, inputs["advantages"], mask)
    return loss, items, metrics


CLIP_RATIOS = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/low_min",
               "clip_ratio/high_max")  # fmt: skip


def assert_clip_ratios_are_trls(metrics: dict, trainer, step: int | None = None) -> None:
    """finecap's ``clip_ratio/*`` (``PolicyOptimization.clip_ratios``) are what TRL's ``_compute_loss`` just logged
    (one process: its gathers and reductions are its own values), and ``clip_fraction`` is ``region_mean``."""
    logged = trainer._metrics["eval"]
    for name in CLIP_RATIOS:
        assert metrics[name] == pytest.approx(logged[name][-1], rel=1e-6), (name, step)
    assert metrics["clip_fraction"] == metrics["clip_ratio/region_mean"], step


def grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize(
    ("beta", "importance", "correction"),
    [(0.0, "token", True), (0.04, "token", True), (0.04, "token", False), (0.04, "sequence", True),
     (0.0, "sequence", True)],
)  # fmt: skip
def test_loss_and_gradient_equal_trls_compute_loss(tiny_lm, tmp_path, loss_type, beta, importance, correction):
    path, tok = tiny_lm
    trainer = make_trainer(path, tok, tmp_path, loss_type=loss_type, beta=beta, epsilon=0.2, epsilon_high=0.28,
                           importance_sampling_level=importance, use_bias_correction_kl=correction)  # fmt: skip
    model = trainer.model
    inputs = inputs_for(model)
    model.zero_grad()
    theirs = trainer._compute_loss(model, inputs)
    theirs.backward()
    their_grads = grads(model).clone()

    model.zero_grad()
    rl = rl_sections(
        advantage="group",
        samples=3,
        policy_loss="clipped",
        loss_aggregation=FINECAP_NAME[loss_type],
        clip_low=0.2,
        clip_high=0.28,
        importance=importance,
        kl_coef=beta,
        kl_bias_correction=correction,
    )
    ours, items, metrics = finecap_loss(model, inputs, rl)
    ours.backward()
    our_grads = grads(model)

    relative = abs(ours.item() - theirs.item()) / abs(theirs.item())
    gap = ((our_grads - their_grads).norm() / their_grads.norm()).item()  # measured: at most 4.4e-7
    # the figures docs/methods/grpo.md quotes (pytest -s shows them)
    print(f"TRL {loss_type} beta={beta} {importance} correction={correction}: relative loss difference "
          f"{relative:.2e}, gradient {gap:.2e}")  # fmt: skip
    assert relative <= 1e-6, (ours.item(), theirs.item())
    assert gap <= 1e-5, gap
    assert our_grads.abs().max() > 0
    # the clip really binds somewhere (so the comparison covers both branches), and the KL is logged as TRL's
    assert 0 < metrics["clip_fraction"] < 1
    if beta:
        assert metrics["kl"] == pytest.approx(trainer._metrics["eval"]["kl"][-1], rel=1e-5)
    assert_clip_ratios_are_trls(metrics, trainer)
    if importance == "token":  # both sides bind (of the 6 sequence ratios, one leaves the range, below)
        assert metrics["clip_ratio/low_mean"] > 0 and metrics["clip_ratio/high_mean"] > 0
    assert items == (float(sum(LENGTHS)) if FINECAP_NAME[loss_type] == "token" else 6.0)


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("importance", ["token", "sequence"])
def test_loss_equals_trls_on_empty_and_full_length_completions_and_zero_advantages(tiny_lm, tmp_path, loss_type,
                                                                                   importance):  # fmt: skip
    """The edges of the inputs above: a completion of no token (all padding: TRL's and finecap's ``clamp(min=1)``
    give it a loss of 0 that still counts as a caption in ``grpo``'s mean and ``dr_grpo``'s divisor, and a sequence
    ratio of exp(0 / 1) = 1), two of the full ``max_completion_length`` (truncated), and the advantages of a group
    whose rewards were all equal (0, whose captions then carry the KL term only)."""
    path, tok = tiny_lm
    trainer = make_trainer(path, tok, tmp_path, loss_type=loss_type, beta=0.04, epsilon=0.2, epsilon_high=0.28,
                           importance_sampling_level=importance)  # fmt: skip
    model = trainer.model
    lengths = [COMPLETION, 0, 3, COMPLETION, 1, 4]
    inputs = inputs_for(model, lengths, [0.0, 0.0, 0.0, -1.1, 0.9, -0.3])  # image 0: a constant group
    model.zero_grad()
    theirs = trainer._compute_loss(model, inputs)
    theirs.backward()
    their_grads = grads(model).clone()

    model.zero_grad()
    rl = rl_sections(advantage="group", samples=3, policy_loss="clipped", loss_aggregation=FINECAP_NAME[loss_type],
                     clip_low=0.2, clip_high=0.28, importance=importance, kl_coef=0.04)  # fmt: skip
    ours, items, metrics = finecap_loss(model, inputs, rl)
    ours.backward()
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6)
    assert ((grads(model) - their_grads).norm() / their_grads.norm()).item() <= 1e-5
    assert metrics["kl"] == pytest.approx(trainer._metrics["eval"]["kl"][-1], rel=1e-5)
    assert_clip_ratios_are_trls(metrics, trainer)  # the caption of no token: NaN in TRL's min and max, left out
    assert items == (float(sum(lengths)) if FINECAP_NAME[loss_type] == "token" else 6.0)


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_vllm_importance_correction_equals_trls_compute_loss(tiny_lm, tmp_path, loss_type):
    """TRL's correction of vLLM rollouts in ``_compute_loss`` (the per-token loss times
    ``inputs["importance_sampling_ratio"]``, before the KL term) equals finecap's clipped loss with the same weights
    (``engine_weights``: :func:`finecap.objectives.engine_mismatch.importance_weights`, tested equal to TRL's
    formula in tests/objectives/test_engine_mismatch.py), loss and gradient. Both sides score the completions with
    TRL's own per-token log-probs here (TRL computes them in float32 whatever the model's dtype, 4.6e-7 off
    finecap's log-softmax at most), so what is compared is the loss alone."""
    from finecap.objectives.engine_mismatch import importance_weights

    path, tok = tiny_lm
    trainer = make_trainer(path, tok, tmp_path, loss_type=loss_type, beta=0.04, epsilon=0.2, epsilon_high=0.28)
    trainer.use_vllm = True  # what _compute_loss reads (a GRPOTrainer built with use_vllm would start vLLM)
    trainer.vllm_importance_sampling_correction = True
    model = trainer.model
    inputs = inputs_for(model)
    mask = inputs["completion_mask"].bool()
    g = torch.Generator().manual_seed(3)
    sampling = (inputs["old_per_token_logps"] + 0.5 * torch.randn(mask.shape, generator=g)) * mask
    weights = importance_weights(inputs["old_per_token_logps"], sampling, mask, cap=1.5)
    assert (weights[mask] < 1).any() and (weights[mask] == 1.5).any()
    inputs["importance_sampling_ratio"] = weights
    model.zero_grad()
    theirs = trainer._compute_loss(model, inputs)
    theirs.backward()
    their_grads = grads(model).clone()

    rl = rl_sections(advantage="group", samples=3, policy_loss="clipped", loss_aggregation=FINECAP_NAME[loss_type],
                     clip_low=0.2, clip_high=0.28, kl_coef=0.04)  # fmt: skip
    objective = PolicyOptimization(WeightedSum({"r": (1.0, lambda c, b: None)}), None, **rl,
                                   decode=DecodeConfig(max_length=COMPLETION))  # fmt: skip
    item = Prepared(torch.arange(2), None, inputs["advantages"], inputs["ref_per_token_logps"],
                    inputs["old_per_token_logps"])  # fmt: skip
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    model.zero_grad()
    logp = trainer._get_per_token_logps_and_entropies(model, ids, attention, COMPLETION, batch_size=6)[0]
    ours, _, _ = objective.clipped_loss(logp, item, inputs["advantages"], mask, weights)
    ours.backward()
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6)
    assert ((grads(model) - their_grads).norm() / their_grads.norm()).item() <= 1e-5
    uncorrected, _, _ = objective.clipped_loss(logp, item, inputs["advantages"], mask)
    assert abs(uncorrected.item() - ours.item()) > 1e-3  # the weights change the loss


# --------------------------------------------------------------------------------------------------------------------
# Advantages
# --------------------------------------------------------------------------------------------------------------------


def trl_advantages(rewards_per_func, reward_weights, num_generations, scale_rewards, aggregation):
    """TRL 1.16.0 ``_generate_and_score_completions``, lines 2761-2810 (one process: the slice is the whole batch)."""
    from trl.trainer.utils import nanstd

    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
    if aggregation == "sum_then_normalize":
        rewards = (rewards_per_func * reward_weights.unsqueeze(0)).nansum(dim=1)
        rewards[unscorable_mask] = torch.nan
        mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
        mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
        if scale_rewards in ["group", "none"]:
            std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)
            std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
        else:
            std_rewards = nanstd(rewards).expand_as(rewards)
        advantages = rewards - mean_grouped_rewards
        if scale_rewards != "none":
            advantages = advantages / (std_rewards + 1e-4)
    else:
        grouped = rewards_per_func.view(-1, num_generations, rewards_per_func.shape[1])
        mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
        std_k = nanstd(grouped, dim=1, keepdim=True)
        reward_k = (grouped - mean_k) / (std_k + 1e-4)
        reward_k = reward_k.view(-1, rewards_per_func.shape[1])
        rewards = (reward_k * reward_weights.unsqueeze(0)).nansum(dim=1)
        rewards[unscorable_mask] = torch.nan
        std_rewards = nanstd(rewards).expand_as(rewards)
        advantages = (rewards - torch.nanmean(rewards)) / (std_rewards + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


@pytest.mark.parametrize(
    ("scale", "aggregation"),
    [("group", "sum_then_normalize"), ("batch", "sum_then_normalize"), ("none", "sum_then_normalize"),
     ("group", "normalize_then_sum")],  # TRL's normalize_then_sum reads no scale_rewards (nor does finecap's)
)  # fmt: skip
def test_advantages_equal_trls(scale, aggregation):
    g = torch.Generator().manual_seed(2)
    parts = torch.rand(12, 2, generator=g) * torch.tensor([3.0, 1.0])  # 4 images x 3 samples, two rewards
    parts[3:6, 0] = 0.5  # one group whose first reward is constant
    weights = torch.tensor([1.0, 0.5])
    theirs = trl_advantages(parts, weights, 3, scale, aggregation)
    if aggregation == "sum_then_normalize":
        ours = group_advantages((parts * weights).sum(dim=1), 3, scale)
    else:
        ours = normalize_then_sum([parts[:, 0], parts[:, 1]], weights.tolist(), 3)
    assert torch.allclose(ours, theirs, rtol=1e-6, atol=1e-6), (ours - theirs).abs().max()


def edge_rewards():
    """6 images x 3 samples of two rewards: varied groups, a group whose first reward is constant, one whose rewards
    are both constant (its total too), and groups with one, two and three captions no reward could score (NaN in both
    rewards: TRL's unscorable, finecap's failed)."""
    g = torch.Generator().manual_seed(2)
    parts = torch.rand(18, 2, generator=g) * torch.tensor([3.0, 1.0])
    parts[3:6, 0] = 0.5
    parts[6:9] = torch.tensor([0.25, 2.0])
    nan = float("nan")
    parts[9] = parts[13] = parts[14] = parts[15] = parts[16] = parts[17] = nan
    return parts


@pytest.mark.slow
@pytest.mark.parametrize(
    ("scale", "aggregation"),
    [("group", "sum_then_normalize"), ("batch", "sum_then_normalize"), ("none", "sum_then_normalize"),
     ("group", "normalize_then_sum")],  # TRL's normalize_then_sum reads no scale_rewards (nor does finecap's)
)  # fmt: skip
def test_advantages_equal_trls_own_at_the_edges(tiny_lm, tmp_path, scale, aggregation):
    """finecap's advantages against those TRL's own code returns (not a transcription of it), on the edges of
    :func:`edge_rewards`: constant groups get exactly 0 on both sides (rewards exactly representable, so TRL's
    rounding leaves none: the next test shows where it does), failed captions 0 and out of every statistic, and a
    lone scored caption 0 (its group has no std)."""
    parts, weights = edge_rewards(), torch.tensor([1.0, 0.5])
    theirs = trls_own_advantages(tiny_lm, tmp_path, parts, weights, 3, scale_rewards=scale,
                                 multi_objective_aggregation=aggregation)  # fmt: skip
    failed = torch.isnan(parts).any(dim=1)
    if aggregation == "sum_then_normalize":
        ours = group_advantages((parts * weights).sum(dim=1), 3, scale, failed=failed)
    else:
        ours = normalize_then_sum([parts[:, 0], parts[:, 1]], weights.tolist(), 3, failed=failed)
    assert torch.allclose(ours, theirs, rtol=1e-6, atol=1e-6), (ours - theirs).abs().max()
    assert ours[failed].tolist() == theirs[failed].tolist() == [0.0] * 6
    if aggregation == "sum_then_normalize":  # GDPO's batch normalisation moves a constant group off 0, on both sides
        assert ours[6:9].tolist() == theirs[6:9].tolist() == [0.0] * 3
        assert ours[12].item() == theirs[12].item() == 0.0  # the lone scored caption of its group


def test_a_constant_group_is_zero_where_trls_rounding_is_not():
    """The one documented difference of the advantages (docs/methods/grpo.md): seven rewards of 0.7 are 6e-8 off
    their float32 mean, which TRL's group scaling divides by ``std + 1e-4`` (6e-4 on each caption); finecap's are
    exactly 0. The varied group beside it is TRL's."""
    rewards = torch.tensor([0.7] * 7 + [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 9.0])
    theirs = trl_advantages(rewards[:, None], torch.tensor([1.0]), 7, "group", "sum_then_normalize")
    ours = group_advantages(rewards, 7, "group")
    assert theirs[:7].abs().min() > 1e-4 and ours[:7].tolist() == [0.0] * 7
    assert torch.allclose(ours[7:], theirs[7:], rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_trls_own_code_leaves_its_rounding_on_a_constant_group(tiny_lm, tmp_path):
    """The difference above, read from TRL's own ``_generate_and_score_completions`` rather than its transcription."""
    rewards = torch.tensor([0.7] * 7 + [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 9.0])
    theirs = trls_own_advantages(tiny_lm, tmp_path, rewards[:, None], torch.tensor([1.0]), 7)
    ours = group_advantages(rewards, 7, "group")
    assert theirs[:7].abs().min() > 1e-4 and ours[:7].tolist() == [0.0] * 7
    assert torch.allclose(ours[7:], theirs[7:], rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------------------------------------
# The documented differences of failed and unpaid rewards (docs/methods/grpo.md), read from TRL's own code
# --------------------------------------------------------------------------------------------------------------------


def objective_advantages(parts, weights, aggregation, scale="group"):
    """finecap's advantages through the objective: ``rl.rewards`` of K rewards (a :class:`WeightedSum` weighing them
    by ``weights``) paying ``parts`` (N, K) column by column and failing (``RewardOutput.failed``) where NaN, and
    ``PolicyOptimization.group_advantages`` of the rollout (groups of 3)."""

    def column(k):
        return lambda captions, batch: RewardOutput(parts[:, k], failed=torch.isnan(parts[:, k]))

    reward = WeightedSum({f"r{k}": (float(w), column(k)) for k, w in enumerate(weights.tolist())})
    rl = rl_sections(advantage="group", samples=3, scale_rewards=scale, reward_aggregation=aggregation)
    objective = PolicyOptimization(reward, None, **rl)
    n = len(parts)
    gen = Generation(sequences=torch.full((n, 1), 4), token_logprobs=torch.zeros(n, 1), lengths=torch.ones(n).long(),
                     image_index=torch.arange(n) // 3, scores=torch.zeros(n), texts=["a"] * n)  # fmt: skip
    rollout = Rollout(gen, reward(gen.texts, {}), torch.zeros(n))
    return objective.group_advantages([rollout])[0]


def varied_rewards(n=18, k=2):
    g = torch.Generator().manual_seed(4)
    return torch.rand(n, k, generator=g) * torch.tensor([3.0, 1.0, 2.0][:k])


AGGREGATIONS = [("group", "sum_then_normalize"), ("batch", "sum_then_normalize"), ("none", "sum_then_normalize"),
                ("group", "normalize_then_sum")]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("scale", "aggregation"), AGGREGATIONS)
def test_a_caption_one_reward_failed_for_fails_where_trl_keeps_it(tiny_lm, tmp_path, scale, aggregation):
    """The documented difference (docs/methods/grpo.md, "Where finecap differs"): a caption for which one weighed
    reward failed and another scored is failed in finecap (advantage 0, out of every statistic), as TRL treats a
    completion *every* reward failed for; TRL keeps it, counting the failed part as 0 in ``sum_then_normalize``'s sum
    (``nansum``) or leaving it out of that reward's group statistics only (``normalize_then_sum``). Read from TRL's
    own ``_generate_and_score_completions`` on captions 1 and 4 (one reward failed each) and 15 (both): TRL's
    advantages are the documented rule's, computed here from finecap's own functions, and finecap's are TRL's on the
    batch where captions 1 and 4 failed for both rewards."""
    weights = torch.tensor([1.0, 0.5])
    parts = varied_rewards()
    parts[1, 1] = parts[4, 0] = parts[15, 0] = parts[15, 1] = float("nan")
    theirs = trls_own_advantages(tiny_lm, tmp_path / "partial", parts, weights, 3, scale_rewards=scale,
                                 multi_objective_aggregation=aggregation)  # fmt: skip
    ours = objective_advantages(parts, weights, aggregation, scale)

    partial = torch.tensor([1, 4])
    assert ours[partial].tolist() == [0.0, 0.0] and ours[15] == theirs[15] == 0.0
    assert (theirs[partial].abs() > 1e-2).all(), theirs[partial]  # TRL trains on them
    unscorable = torch.isnan(parts).all(dim=1)
    if aggregation == "sum_then_normalize":  # TRL: the failed part counts as 0 in the weighted sum
        rule = group_advantages((parts * weights).nansum(dim=1), 3, scale, failed=unscorable)
    else:  # TRL: each reward's group statistics over the captions it scored, the sum's batch ones over the rest
        summed = sum(w * group_advantages(parts[:, k], 3, "group", failed=torch.isnan(parts[:, k]))
                     for k, w in enumerate(weights.tolist()))  # fmt: skip
        rule = group_advantages(summed, len(parts), "group", failed=unscorable)  # one group: the batch
    assert torch.allclose(theirs, rule, rtol=1e-6, atol=1e-6), (theirs - rule).abs().max()
    both = parts.clone()
    both[partial] = float("nan")  # TRL's unscorable: what finecap makes of a partial failure
    theirs_both = trls_own_advantages(tiny_lm, tmp_path / "both", both, weights, 3, scale_rewards=scale,
                                      multi_objective_aggregation=aggregation)  # fmt: skip
    assert torch.allclose(ours, theirs_both, rtol=1e-6, atol=1e-6), (ours - theirs_both).abs().max()


@pytest.mark.slow
@pytest.mark.parametrize(("scale", "aggregation"), AGGREGATIONS)
def test_a_reward_of_weight_0_changes_no_advantage_as_in_trl(tiny_lm, tmp_path, scale, aggregation):
    """The documented difference (docs/methods/grpo.md): GDPO leaves a reward of weight 0 out (logged only), TRL
    normalises it and adds it times 0, and ``sum_then_normalize`` sums it times 0 on both sides; so the advantages
    are TRL's own, here with the weight-0 reward varied within every group (its normalised values are not 0) and
    failing alone on three captions (it fails no caption in finecap, and its NaN is dropped by TRL's ``nansum``)."""
    weights = torch.tensor([1.0, 0.5, 0.0])
    parts = varied_rewards(k=3)
    parts[[2, 7, 11], 2] = float("nan")
    theirs = trls_own_advantages(tiny_lm, tmp_path, parts, weights, 3, scale_rewards=scale,
                                 multi_objective_aggregation=aggregation)  # fmt: skip
    ours = objective_advantages(parts, weights, aggregation, scale)
    assert torch.allclose(ours, theirs, rtol=1e-6, atol=1e-6), (ours - theirs).abs().max()
    assert (ours[[2, 7, 11]] != 0).all()  # trained on, as in TRL


# --------------------------------------------------------------------------------------------------------------------
# The objective's whole step: the sampling temperature and the entropy bonus
# --------------------------------------------------------------------------------------------------------------------

# Two images x 3 captions of the tiny LM's tokens (4 is its stop token; caption 2 is cut at the full length)
STEP_COMPLETIONS = [[7, 8, 9, 4], [10, 4], [11, 12, 13, 14, 15, 16], [4], [20, 21, 4], [30, 31, 32, 4]]
STEP_PAID = [1.0, 0.2, 0.5, 0.0, 0.9, 0.3]  # each caption's reward


class TinyLMCaptioner(torch.nn.Module):
    """finecap's captioner interface over TRL's tiny LM: every image's prompt is :data:`~helpers.trl_grpo.PROMPT_IDS`,
    ``generate`` decodes :data:`STEP_COMPLETIONS` (3 per image), ``forward`` scores them with finecap's own
    ``token_scores`` (the log-softmax of the logits over the temperature, and its entropy)."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def generate(self, batch, cfg, seeds=None):
        n = len(STEP_COMPLETIONS)
        sequences = torch.zeros(n, COMPLETION, dtype=torch.long)
        for i, c in enumerate(STEP_COMPLETIONS):
            sequences[i, : len(c)] = torch.tensor(c)
        return Generation(sequences=sequences, token_logprobs=torch.zeros(n, COMPLETION),
                          lengths=torch.tensor([len(c) for c in STEP_COMPLETIONS]),
                          image_index=torch.arange(n // 3).repeat_interleave(3), scores=torch.zeros(n),
                          texts=[str(i) for i in range(n)])  # fmt: skip

    def forward(self, batch, sequences, mask, image_index=None, temperature=1.0, with_entropy=False):
        from finecap.models.captioner import token_scores

        prompt = torch.tensor([PROMPT_IDS] * len(sequences))
        ids = torch.cat([prompt, sequences], dim=1)
        attention = torch.cat([torch.ones_like(prompt), mask.long()], dim=1)
        logits = self.lm(input_ids=ids, attention_mask=attention).logits[:, len(PROMPT_IDS) - 1 : -1]  # (N, C, V)
        return token_scores(logits, sequences, mask, temperature, with_entropy)


def paid(captions, batch):
    total = torch.tensor([STEP_PAID[int(c)] for c in captions])
    return RewardOutput(total, {"paid": total})


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["bnpo", "dapo", "grpo", "dr_grpo"])
def test_the_objectives_step_equals_trls_with_a_sampling_temperature_and_the_entropy_bonus(tiny_lm, tmp_path,
                                                                                           loss_type):  # fmt: skip
    """``PolicyOptimization`` called as the engine calls it (rollout, group advantages, the reference pass, the
    policy's scoring through finecap's ``token_scores``) against TRL's ``_compute_loss`` with ``temperature=0.7``
    (TRL scores the policy and its reference at it: finecap's ``rl.temperature=0.7`` with ``rl.scaled_logprob``)
    and ``entropy_coef=0.05`` (``rl.entropy_coef``), β = 0.04. Under the token mean (``bnpo``, ``dapo``) the bonus is
    TRL's token mean, and the loss, its gradient and the logged ``kl`` and ``entropy`` are TRL's; under ``grpo`` and
    ``dr_grpo`` finecap's bonus is the mean of each caption's token mean (docs/methods/grpo.md, where finecap
    differs), and TRL's loss is finecap's policy term minus 0.05 times the token mean of the same entropies."""
    from finecap.objectives.entropy import mean_entropy
    from helpers.trl_grpo import trainer_logprobs

    path, tok = tiny_lm
    temperature, coef = 0.7, 0.05
    trainer = make_trainer(path, tok, tmp_path, loss_type=loss_type, beta=0.04, epsilon=0.2, epsilon_high=0.28,
                           temperature=temperature, entropy_coef=coef)  # fmt: skip
    model = TinyLMCaptioner(trainer.model).eval()  # TRL's eval mode (no dropout, normalisers 1)
    aggregation = FINECAP_NAME[loss_type]
    rl = rl_sections(advantage="group", samples=3, policy_loss="clipped", loss_aggregation=aggregation,
                     clip_low=0.2, clip_high=0.28, kl_coef=0.04, temperature=temperature, scaled_logprob=True,
                     entropy_coef=coef)  # fmt: skip
    objective = PolicyOptimization(WeightedSum({"paid": (1.0, paid)}), None, **rl,
                                   decode=DecodeConfig(max_length=COMPLETION))  # fmt: skip
    batch = {"index": torch.tensor([0, 1]), "image_ids": [0, 1]}
    model.zero_grad()
    out = objective(model, batch)
    ours = out.losses["policy"] + out.losses["entropy"]
    ours.backward()
    our_grads = grads(model).clone()

    item = objective.cycle[0]
    gen = item.rollout.samples
    mask = gen.mask.long()
    # TRL's own reference log-probs at its temperature (the starting policy: the model has not moved)
    ref = trainer_logprobs(trainer, STEP_COMPLETIONS) * mask
    assert torch.allclose(item.ref, ref, rtol=0, atol=1e-5), (item.ref - ref).abs().max()
    inputs = {"prompt_ids": torch.tensor([PROMPT_IDS] * len(gen)), "prompt_mask": torch.ones(len(gen), 3).long(),
              "completion_ids": gen.sequences, "completion_mask": mask, "advantages": item.advantages,
              "ref_per_token_logps": ref, "num_items_in_batch": mask.sum()}  # fmt: skip
    model.zero_grad()
    theirs = trainer._compute_loss(trainer.model, inputs)
    theirs.backward()
    their_grads = grads(model)
    logged = trainer._metrics["eval"]
    assert out.metrics["kl"] == pytest.approx(logged["kl"][-1], rel=1e-5)
    # the logged entropy is TRL's token mean under every aggregation (until 2026-11-29 the mean of the captions'
    # token means under grpo and dr_grpo: 1.7e-4 relative off TRL's here)
    assert out.metrics["entropy"] == pytest.approx(logged["entropy"][-1], rel=1e-5)
    assert out.losses["entropy"].item() < -1e-2  # the bonus is a real share of the loss
    if aggregation == "token":
        assert ours.item() == pytest.approx(theirs.item(), rel=1e-6)
        assert ((our_grads - their_grads).norm() / their_grads.norm()).item() <= 1e-5
    else:  # the documented difference, read from TRL's own loss
        model.zero_grad()
        again = objective(model, batch)  # the cycle's rollout, scored again: the same policy term
        h = model(batch, gen.sequences, gen.mask, temperature=temperature, with_entropy=True).entropy
        rule = again.losses["policy"] - coef * mean_entropy(h, gen.mask, "token")
        rule.backward()
        rule_grads = grads(model)
        assert theirs.item() == pytest.approx(rule.item(), rel=1e-6)
        assert ((rule_grads - their_grads).norm() / their_grads.norm()).item() <= 1e-5
        # finecap's own bonus is not TRL's: the tiny LM's entropies are nearly even over its tokens (the mean of
        # the caption means is 7e-4 nats off the token mean of 4.3), yet the gradients part by 7.8e-4 (grpo) and
        # 1.9e-3 (dr_grpo), measured: 80 times the bound the equal ones meet
        assert ((our_grads - their_grads).norm() / their_grads.norm()).item() > 1e-4


# --------------------------------------------------------------------------------------------------------------------
# Iterations: a rollout over two optimizer steps (TRL's num_iterations = 2)
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("importance", ["token", "sequence"])
def test_a_cycle_of_two_iterations_equals_trls_compute_loss_with_num_iterations_2(tiny_lm, tmp_path, loss_type,
                                                                                  importance):  # fmt: skip
    """``grpo.iterations=2`` against TRL's ``num_iterations=2``: ``PolicyOptimization`` called as the engine calls it
    for both optimizer steps of one rollout, an SGD step on finecap's gradient between them, and TRL's
    ``_compute_loss`` at each step on the inputs its generation would have made: ``old_per_token_logps`` (TRL
    computes them at generation when ``num_iterations > 1``) and ``ref_per_token_logps``, both TRL's own log-probs
    of the starting policy, and the rollout's advantages. At the first step the ratio is 1 (nothing clipped); at the
    second the updated policy is scored against the first step's ``old`` (not its own), the clip binds and the KL
    (β = 0.04) is no longer 0: loss, gradient, ``kl`` and ``clip_ratio/*`` are TRL's at both."""
    from helpers.trl_grpo import trainer_logprobs

    path, tok = tiny_lm
    trainer = make_trainer(path, tok, tmp_path, loss_type=loss_type, beta=0.04, epsilon=0.2, epsilon_high=0.28,
                           importance_sampling_level=importance, num_iterations=2)  # fmt: skip
    model = TinyLMCaptioner(trainer.model).eval()  # TRL's eval mode (no dropout, normalisers 1)
    rl = rl_sections(advantage="group", samples=3, policy_loss="clipped", loss_aggregation=FINECAP_NAME[loss_type],
                     clip_low=0.2, clip_high=0.28, importance=importance, kl_coef=0.04, iterations=2)  # fmt: skip
    objective = PolicyOptimization(WeightedSum({"paid": (1.0, paid)}), None, **rl,
                                   decode=DecodeConfig(max_length=COMPLETION))  # fmt: skip
    batch = {"index": torch.tensor([0, 1]), "image_ids": [0, 1]}
    starting = trainer_logprobs(trainer, STEP_COMPLETIONS)  # TRL's generation-time pass: old and ref
    sgd = torch.optim.SGD(model.parameters(), lr=2.0)
    clipped = []
    for step in range(2):
        model.zero_grad()
        out = objective(model, batch)
        out.losses["policy"].backward()
        our_grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
        ours = grads(model).clone()

        item = objective.cycle[0]
        mask = item.rollout.samples.mask.long()
        # the kept old and ref log-probs are the starting policy's, TRL's own to float32 rounding (4.8e-7, measured)
        # at both steps (old is not taken again from the updated policy); TRL gets them, so that what is compared
        # is the loss alone
        assert torch.allclose(item.old, starting * mask, rtol=0, atol=1e-5), (step, (item.old - starting * mask))
        assert torch.allclose(item.ref, starting * mask, rtol=0, atol=1e-5), step
        inputs = {"prompt_ids": torch.tensor([PROMPT_IDS] * len(mask)), "prompt_mask": torch.ones(len(mask), 3).long(),
                  "completion_ids": item.rollout.samples.sequences, "completion_mask": mask,
                  "advantages": item.advantages, "old_per_token_logps": item.old, "ref_per_token_logps": item.ref,
                  "num_items_in_batch": mask.sum()}  # fmt: skip
        model.zero_grad()
        theirs = trainer._compute_loss(trainer.model, inputs)
        theirs.backward()
        logged = trainer._metrics["eval"]
        # at the first step grpo's loss is 0 but for rounding (ratio 1, advantages summing to 0 in each group, KL
        # 0), where no relative bound holds: the absolute one there is float32's (measured at most 1e-7)
        assert out.losses["policy"].item() == pytest.approx(theirs.item(), rel=1e-6, abs=5e-7 if step == 0 else 0)
        assert ((ours - grads(model)).norm() / grads(model).norm()).item() <= 1e-5, step
        assert out.metrics["kl"] == pytest.approx(logged["kl"][-1], rel=1e-5, abs=1e-9), step
        assert_clip_ratios_are_trls(out.metrics, trainer, step)
        clipped.append(out.metrics["clip_fraction"])

        for p, g in zip(model.parameters(), our_grads, strict=True):  # the update both sides then score
            p.grad = g
        sgd.step()
        objective.end_step()
    assert clipped[0] == 0.0 and clipped[1] > 0  # the second step's ratios left the clip range somewhere
    assert out.metrics["kl"] > 1e-6
    assert objective.cycle == []  # the cycle is over: the next step rolls out again
