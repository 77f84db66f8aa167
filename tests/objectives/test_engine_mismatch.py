"""TRL's importance-sampling correction of vLLM rollouts (``decode.engine=vllm``): the truncated per-token weights
``min(exp(trainer - vllm), rl.vllm_is_cap)`` and the logged mismatch equal hand-computed values and TRL 1.16's own
code: a ``GRPOTrainer`` told it decodes with vLLM (``use_vllm``, mode ``token_truncate``) and handed a rollout of
chosen completions and engine log-probs (:func:`helpers.trl_grpo.trls_own_vllm_correction`), whose
``_generate_and_score_completions`` returns the weights and logs ``sampling/*`` (slow: it builds the trainer), and a
fast transcription of that branch; REINFORCE and the GRPO family weigh each token of their loss by them (gradients
checked by hand), only for rollouts another engine decoded, and with ``rl.vllm_is_correction=false`` log the mismatch
without correcting. No vLLM is needed: the rollouts here are hand-made."""

from __future__ import annotations

import math

import pytest
import torch

from finecap.config import DecodeConfig, RLConfig
from finecap.decode import Generation
from finecap.models.captioner import TokenScores
from finecap.objectives.baselines import build_baseline
from finecap.objectives.engine_mismatch import importance_weights, mismatch_metrics
from finecap.objectives.grpo import PolicyOptimization
from finecap.objectives.reinforce import Reinforce, Rollout
from finecap.rewards.base import RewardOutput, WeightedSum
from finecap.train.logging import Means
from helpers.rl_sections import rl_sections
from helpers.trl_grpo import save_tiny_lm, trainer_logprobs, trls_own_vllm_correction, vllm_trainer

# Two captions of 3 and 2 tokens (the second padded), and a third of 1 token.
TRAINER = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -3.0, 0.0], [-4.0, 0.0, 0.0]])
ENGINE = torch.tensor([[-1.5, -0.5, -0.5], [-0.2, -2.0, 0.0], [-0.5, 0.0, 0.0]])
LENGTHS = torch.tensor([3, 2, 1])
MASK = torch.arange(3)[None, :] < LENGTHS[:, None]


def test_weights_and_metrics_equal_hand_computed_values():
    w = importance_weights(TRAINER, ENGINE, MASK, cap=2.0)
    # differences 0.5, -1.5, 0 | 0, -1, (pad) | -3.5, (pad), (pad); exp, capped at 2
    expected = [[math.exp(0.5), math.exp(-1.5), 1.0], [1.0, math.exp(-1.0), 1.0],
                [math.exp(-3.5), 1.0, 1.0]]  # fmt: skip
    torch.testing.assert_close(w, torch.tensor(expected), rtol=0, atol=1e-6)
    assert importance_weights(torch.tensor([[0.0]]), torch.tensor([[-2.0]]), torch.tensor([[True]]), 2.0).item() == 2.0
    m = mismatch_metrics(TRAINER, ENGINE, MASK, w)
    deltas = [0.5, 1.5, 0.0, 0.0, 1.0, 3.5]  # |trainer - engine| on the 6 real tokens
    ratios = [math.exp(0.5), math.exp(-1.5), 1.0, 1.0, math.exp(-1.0), math.exp(-3.5)]
    assert m["vllm/logp_diff/mean"] == pytest.approx(sum(deltas) / 6)
    assert m["vllm/logp_diff/max"] == pytest.approx(3.5)
    assert m["vllm/is_ratio/mean"] == pytest.approx(sum(ratios) / 6)
    assert m["vllm/is_ratio/min"] == pytest.approx(math.exp(-3.5))
    assert m["vllm/is_ratio/max"] == pytest.approx(math.exp(0.5))


def test_a_token_without_an_engine_log_prob_is_not_corrected_and_no_gradient_flows():
    engine = ENGINE.clone()
    engine[0, 1] = float("nan")
    trainer = TRAINER.clone().requires_grad_(True)
    w = importance_weights(trainer, engine, MASK, cap=3.0)
    assert w[0, 1].item() == 1.0 and not w.requires_grad
    m = mismatch_metrics(trainer, engine, MASK, w)
    assert m["vllm/logp_diff/max"] == pytest.approx(3.5)  # the NaN token is left out, not counted as 0
    assert m["vllm/logp_diff/mean"] == pytest.approx((0.5 + 0 + 0 + 1.0 + 3.5) / 5)


def trl_token_truncate(old, sampling, mask, cap):
    """TRL 1.16.0 ``_generate_and_score_completions``, lines 2660-2685 (``vllm_importance_sampling_mode=
    "token_truncate"``, no tool mask, ``clip_min=None``), and lines 2860-2895 (its metrics, one process)."""
    per_token_logps_diff = (old - sampling) * mask
    per_token_logps_diff = torch.nan_to_num(per_token_logps_diff, nan=0.0)
    ratio = torch.exp(per_token_logps_diff)
    ratio = torch.clamp(ratio, min=None, max=cap)
    delta = torch.abs(old - sampling)
    bool_mask = mask.bool()
    delta = delta[bool_mask & ~torch.isnan(delta)]
    flat = ratio[bool_mask]
    metrics = {"vllm/logp_diff/mean": torch.mean(delta).item(), "vllm/logp_diff/max": torch.max(delta).item(),
               "vllm/is_ratio/min": torch.min(flat).item(), "vllm/is_ratio/mean": torch.mean(flat).item(),
               "vllm/is_ratio/max": torch.max(flat).item()}  # fmt: skip
    return ratio, metrics


@pytest.mark.parametrize("cap", [3.0, 1.2])
def test_weights_and_metrics_equal_trls_code(cap):
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(8, 7, generator=g) * 4
    sampling = old + 0.8 * torch.randn(8, 7, generator=g)
    sampling[2, 1] = float("nan")  # a token vLLM could not score
    sampling[0, 0] = old[0, 0] - 2.0  # a ratio of e^2, above both caps
    mask = (torch.arange(7)[None, :] < torch.randint(1, 8, (8,), generator=g)[:, None]).long()
    mask[2, 1] = 1
    theirs, their_metrics = trl_token_truncate(old, sampling, mask, cap)
    ours = importance_weights(old, sampling, mask.bool(), cap)
    assert torch.equal(ours, theirs)
    assert (ours < cap).any() and (ours == cap).any()  # the cap binds on some tokens, not all
    ours_metrics = mismatch_metrics(old, sampling, mask.bool(), ours)
    assert ours_metrics.keys() == their_metrics.keys()
    for name, value in their_metrics.items():
        assert ours_metrics[name] == pytest.approx(value, rel=1e-6), name


TRL_NAME = {"vllm/logp_diff/mean": "sampling/sampling_logp_difference/mean",
            "vllm/logp_diff/max": "sampling/sampling_logp_difference/max",
            "vllm/is_ratio/mean": "sampling/importance_sampling_ratio/mean",
            "vllm/is_ratio/min": "sampling/importance_sampling_ratio/min",
            "vllm/is_ratio/max": "sampling/importance_sampling_ratio/max"}  # fmt: skip
# Six completions of the tiny LM's tokens, ending at its stop token (4) but the last, cut at 2 tokens
COMPLETIONS = [[7, 8, 9, 4], [10, 4], [11, 12, 13, 14, 15, 16], [4], [20, 21, 4], [30, 31]]


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("tiny_lm"))


def engine_logprobs(sampling):
    """The engine's lists of token log-probs as finecap's vLLM engine pads them: (N, 6), 0 after each caption, NaN
    where vLLM gave none."""
    out = torch.zeros(len(sampling), 6)
    for i, row in enumerate(sampling):
        out[i, : len(row)] = torch.tensor([math.nan if v is None else v for v in row])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("cap", [3.0, 1.2])
def test_weights_and_metrics_equal_trls_own_code(tiny_lm, tmp_path, cap):
    """TRL 1.16's ``_generate_and_score_completions`` on a vLLM rollout (its ``importance_sampling_ratio`` and its
    logged ``sampling/sampling_logp_difference/*`` and ``sampling/importance_sampling_ratio/*``) against finecap's
    weights and metrics of the same trainer log-probs (TRL's ``old_per_token_logps``) and engine log-probs: engine
    log-probs 0.8 off the trainer's, one a ratio of e^2 (above both caps), one token vLLM could not score."""
    pytest.importorskip("trl")
    trainer = vllm_trainer(tiny_lm, tmp_path, cap)
    old = trainer_logprobs(trainer, COMPLETIONS)
    g = torch.Generator().manual_seed(0)
    sampling = [[float(old[i, t]) + 0.8 * float(torch.randn(1, generator=g)) for t in range(len(c))]
                for i, c in enumerate(COMPLETIONS)]  # fmt: skip
    sampling[0][0] = float(old[0, 0]) - 2.0
    sampling[2][1] = None
    output, theirs = trls_own_vllm_correction(trainer, COMPLETIONS, sampling)
    mask = output["completion_mask"].bool()
    trainer_side, engine = output["old_per_token_logps"], engine_logprobs(sampling)
    lengths = torch.tensor([len(c) for c in COMPLETIONS])
    assert torch.equal(mask, torch.arange(6)[None, :] < lengths[:, None])  # TRL's mask is Generation.mask's
    ours = importance_weights(trainer_side, engine, mask, cap)
    assert torch.equal(ours, output["importance_sampling_ratio"])
    assert (ours[mask] < 1).any() and (ours[mask] == cap).any() and ours[2, 1] == 1  # cap binds; the NaN is 1
    ours_metrics = mismatch_metrics(trainer_side, engine, mask, ours)
    assert {TRL_NAME[name] for name in ours_metrics} == set(theirs)
    for name, value in ours_metrics.items():
        assert value == pytest.approx(theirs[TRL_NAME[name]], rel=1e-6), name
    assert theirs["sampling/importance_sampling_ratio/max"] == pytest.approx(cap)


@pytest.mark.slow
def test_a_batch_of_no_token_logs_nan_where_trls_own_code_logs_0(tiny_lm, tmp_path):
    """The one difference of the metrics (docs/methods/grpo.md): over no token (TRL's rollout mask, ``env_mask``, 0
    on every token) TRL logs 0 for each ``sampling/*`` metric; finecap logs NaN, which the step's means and extremes
    leave out (a 0 would pull ``vllm/is_ratio/min`` and the means down). The weights are 1 on both sides."""
    pytest.importorskip("trl")
    trainer = vllm_trainer(tiny_lm, tmp_path, 3.0)
    sampling = [[-1.0] * len(c) for c in COMPLETIONS]
    output, theirs = trls_own_vllm_correction(trainer, COMPLETIONS, sampling, [[0] * len(c) for c in COMPLETIONS])
    none = torch.zeros(6, 6, dtype=torch.bool)
    ours = importance_weights(output["old_per_token_logps"], engine_logprobs(sampling), none, 3.0)
    assert torch.equal(ours, output["importance_sampling_ratio"]) and (ours == 1).all()
    assert set(theirs.values()) == {0.0} and len(theirs) == 5
    ours_metrics = mismatch_metrics(output["old_per_token_logps"], engine_logprobs(sampling), none, ours)
    assert {TRL_NAME[name] for name in ours_metrics} == set(theirs)
    assert all(math.isnan(v) for v in ours_metrics.values()), ours_metrics


# --------------------------------------------------------------------------------------------------------------------
# The objectives: each token of the loss weighed, for rollouts of another engine only
# --------------------------------------------------------------------------------------------------------------------


def constant_reward(values):
    def reward(captions, batch):
        return RewardOutput(torch.tensor(values[: len(captions)]))

    return WeightedSum({"r": (1.0, reward)})


def rollout_of(engine_logprobs, rewards, baseline, lengths=LENGTHS):
    n, length = engine_logprobs.shape
    gen = Generation(sequences=torch.full((n, length), 7), token_logprobs=engine_logprobs, lengths=lengths[:n],
                     image_index=torch.arange(n), scores=engine_logprobs.sum(1), texts=["a b"] * n)  # fmt: skip
    return Rollout(gen, RewardOutput(torch.tensor(rewards)), torch.tensor(baseline))


def run(objective, rollout, trainer):
    """One call of ``objective`` on a hand-made rollout, the trainer's token log-probs ``trainer`` (a leaf with
    gradient) standing for the captioner's ``forward``; returns the output and d(total loss)/d(trainer)."""
    leaf = trainer.clone().requires_grad_(True)
    objective.rollout = lambda model, batch: (rollout, {"time/generate": 0.0, "time/reward": 0.0})
    objective.score = lambda model, batch, gen: TokenScores(logprobs=leaf * gen.mask)
    out = objective(None, {"index": torch.arange(len(rollout.samples)), "image_ids": list(range(3))})
    sum(out.losses.values()).backward()
    return out, leaf.grad


@pytest.mark.parametrize("correct", [True, False])
def test_reinforce_weighs_each_tokens_log_prob_by_its_importance_ratio(correct):
    rl = RLConfig(baseline="mean", samples=1, vllm_is_cap=2.0, vllm_is_correction=correct)
    objective = Reinforce(constant_reward([1.0, 0.0, 2.0]), build_baseline(rl), rl=rl,
                          decode=DecodeConfig(engine="vllm"))  # fmt: skip
    advantage = torch.tensor([0.5, -1.0, 1.5])
    out, grad = run(objective, rollout_of(ENGINE, [1.0, 0.0, 2.0], [0.5, 1.0, 0.5]), TRAINER)
    w = importance_weights(TRAINER, ENGINE, MASK, 2.0) if correct else torch.ones(3, 3)
    # loss = -mean_n A_n sum_t w_nt logp_nt  ->  d loss / d logp_nt = -A_n w_nt / 3 on real tokens, 0 on padding
    torch.testing.assert_close(grad, -advantage[:, None] * w * MASK / 3, rtol=0, atol=1e-7)
    expected = -(advantage * (w * TRAINER * MASK).sum(1)).mean()
    assert out.losses["reinforce"].item() == pytest.approx(expected.item(), rel=1e-6)
    assert out.metrics["vllm/logp_diff/max"] == pytest.approx(3.5)  # logged, corrected or not
    assert out.metrics["logprob"] == pytest.approx((TRAINER * MASK).sum(1).mean().item())  # log p itself, unweighted


def test_the_policys_own_rollouts_are_not_reweighted():
    rl = RLConfig(baseline="mean", samples=1, vllm_is_cap=2.0)
    objective = Reinforce(constant_reward([1.0, 0.0, 2.0]), build_baseline(rl), rl=rl, decode=DecodeConfig())
    out, grad = run(objective, rollout_of(ENGINE, [1.0, 0.0, 2.0], [0.5, 1.0, 0.5]), TRAINER)
    torch.testing.assert_close(grad, -torch.tensor([0.5, -1.0, 1.5])[:, None] * MASK / 3, rtol=0, atol=1e-7)
    assert not any(k.startswith("vllm/") for k in out.metrics) and "time/sync" not in out.metrics


@pytest.mark.parametrize("policy_loss", ["clipped", "reinforce"])
def test_the_grpo_family_weighs_each_tokens_loss_by_its_importance_ratio(policy_loss):
    """One image, a group of 3 captions; the cycle's first step (ratio to ``old`` = 1, nothing clipped), so the
    clipped surrogate's per-token loss is ``-A w`` and its ``sequence`` aggregation gives d loss / d logp_nt =
    ``-A_n w_nt / (len_n * 3)``; ``rl.logprob=mean`` makes REINFORCE's the same."""
    rl = rl_sections(advantage="group", samples=3, policy_loss=policy_loss, logprob="mean", vllm_is_cap=2.0)
    rewards = [1.0, 0.0, 2.0]
    objective = PolicyOptimization(constant_reward(rewards), None, **rl, decode=DecodeConfig(engine="vllm"))
    rollout = rollout_of(ENGINE, rewards, [0.0, 0.0, 0.0])
    rollout.samples.image_index = torch.zeros(3, dtype=torch.long)
    out, grad = run(objective, rollout, TRAINER)
    advantage = torch.tensor([0.0, -1.0, 1.0]) / (1.0 + 1e-4)  # (R - mean) / (std + eps), std 1
    w = importance_weights(TRAINER, ENGINE, MASK, 2.0)
    torch.testing.assert_close(grad, -advantage[:, None] * w * MASK / (LENGTHS[:, None] * 3), rtol=1e-6, atol=1e-7)
    assert out.metrics["vllm/is_ratio/min"] == pytest.approx(math.exp(-3.5))


@pytest.mark.parametrize(
    ("policy_loss", "aggregation"),
    [("clipped", "sequence"), ("clipped", "token"), ("clipped", "constant"), ("reinforce", "sequence")],
)
def test_a_micro_batch_of_captions_of_no_token_logs_nan_which_the_step_leaves_out(policy_loss, aggregation):
    """Neither finecap's decoder nor its vLLM engine returns a caption of no token (the stop token counts, and
    ``decode.max_length >= 1``), and a rollout refuses an engine of one's own that does
    (:func:`finecap.engines.base.check_lengths`, tests/engines/test_toy_engine.py); handed such a rollout directly,
    the objective's micro-batch of such captions trains on nothing (loss 0) and logs ``ratio/*`` and ``vllm/*`` as
    NaN, and ``clip_fraction`` too (a token mean over no token: :mod:`finecap.objectives.token_means`), so the
    step's logged means and extremes (:class:`finecap.train.logging.Means`) are those of its other micro-batches.
    Until 2026-11-29 ``ratio/min`` raised there (``min()`` of no value) and ``vllm/*`` logged 0,
    which made the step's ``vllm/is_ratio/min`` 0 and pulled its means toward 0."""
    rl = rl_sections(advantage="group", samples=3, policy_loss=policy_loss, vllm_is_cap=2.0,
                     **({"loss_aggregation": aggregation} if policy_loss == "clipped" else {}))  # fmt: skip
    rewards = [1.0, 0.0, 2.0]
    outs = []
    for lengths in (torch.zeros(3, dtype=torch.long), LENGTHS):
        objective = PolicyOptimization(constant_reward(rewards), None, **rl, decode=DecodeConfig(engine="vllm"))
        rollout = rollout_of(ENGINE, rewards, [0.0, 0.0, 0.0], lengths)
        rollout.samples.image_index = torch.zeros(3, dtype=torch.long)
        outs.append(run(objective, rollout, TRAINER))
    (empty, grad), (full, _) = outs
    logged = [k for k in full.metrics if k.startswith(("ratio/", "vllm/"))]
    assert len(logged) == (8 if policy_loss == "clipped" else 5)
    assert all(math.isnan(empty.metrics[k]) for k in logged), empty.metrics
    assert sum(empty.losses.values()).item() == 0.0 and not grad.any()
    if policy_loss == "clipped":  # a token mean over no token, as ratio/*: none (0 until 2026-11-29)
        assert math.isnan(empty.metrics["clip_fraction"])
    means = Means()
    means.add(empty.metrics)
    means.add(full.metrics)
    assert {k: means.means()[k] for k in logged} == {k: full.metrics[k] for k in logged}
    assert full.metrics["vllm/is_ratio/min"] == pytest.approx(math.exp(-3.5))  # the full micro-batch's, not 0
