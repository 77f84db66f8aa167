"""REINFORCE's losses and gradients against the reference implementations, written out here as their code computes
them, on small hand-made tensors at float64:

- SCST (greedy baseline) and "new self-critical" (leave-one-out): ruotianluo/self-critical.pytorch at 4c48a33,
  ``RewardCriterion.forward`` and ``StructureLosses``' ``new_self_critical`` (captioning/modules/losses.py),
  ``get_self_critical_reward`` (captioning/utils/rewards.py);
- the running mean baseline and the per-message REINFORCE of EGG (facebookresearch/EGG, ``MeanBaseline`` in
  egg/core/baselines.py, ``CommunicationRnnReinforce.forward`` in egg/core/reinforce_wrappers.py,
  ``find_lengths`` in egg/core/util.py), the code base of DiscriTune;
- the max-entropy term (per-caption mean entropy, EOS included), EGG's ``effective_entropy_s``.

Conventions they share with finecap: a caption's tokens are those up to and including its stop token (the
reference codes' id 0, which is also their padding), all L of a caption cut at the length limit without one, and
only its stop token for a caption that stops at once (all padding in their encoding). Where they differ, the
difference is the documented one (finecap/objectives/reinforce.py, "Choices the papers leave open"):
self-critical.pytorch's loss is a mean over the batch's *tokens*, finecap's a mean over *captions*, so with
``rl.logprob=sum`` finecap's gradient is the reference's times T / N (T tokens, N captions): the same direction.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from finecap.config import GRPOConfig, RLConfig
from finecap.decode import Generation
from finecap.models.captioner import TokenScores, entropy_of, token_scores
from finecap.objectives.baselines import GreedyBaseline, LeaveOneOut, MeanBaseline, NoBaseline
from finecap.objectives.grpo import PolicyOptimization
from finecap.objectives.reinforce import Reinforce
from finecap.rewards import RewardOutput

# --------------------------------------------------------------------------------------------------------------------
# The reference code, as published
# --------------------------------------------------------------------------------------------------------------------


def rc_reward_criterion(logprobs: torch.Tensor, seq: torch.Tensor, reward: torch.Tensor, reduction: str = "mean"):
    """self-critical.pytorch's ``RewardCriterion.forward``: ``logprobs`` (N, L, V) the model's log-softmax at each
    position, ``seq`` (N, L) with 0 = EOS and padding, ``reward`` (N, L) the advantage repeated over positions. The
    mask is ``seq > 0`` shifted right by one with a leading 1 (the EOS counts)."""
    N, L = logprobs.shape[:2]
    inp = logprobs.gather(2, seq.unsqueeze(2)).squeeze(2).reshape(-1)
    reward = reward.reshape(-1)
    mask = (seq > 0).to(inp)
    mask = torch.cat([mask.new_ones(N, 1), mask[:, :-1]], 1).reshape(-1)
    output = -inp * reward * mask
    if reduction == "none":
        return output.view(N, L).sum(1) / mask.view(N, L).sum(1)
    return torch.sum(output) / torch.sum(mask)


def rc_self_critical_reward(sample_scores: torch.Tensor, greedy_scores: torch.Tensor, L: int) -> torch.Tensor:
    """``get_self_critical_reward``'s arithmetic: each sample's score minus its image's greedy score, repeated over
    the L positions (N, L)."""
    B = greedy_scores.shape[0]
    scores = sample_scores.reshape(B, -1) - greedy_scores[:, None]
    return scores.reshape(-1, 1).repeat(1, L)


def rc_new_self_critical_reward(sample_scores: torch.Tensor, seq_per_img: int, L: int) -> torch.Tensor:
    """``StructureLosses``' ``new_self_critical``: each score minus the mean of the image's other samples; its loss
    is ``RewardCriterion``'s arithmetic with this reward (``-input * mask * scores``, summed / mask sum)."""
    scores = sample_scores.view(-1, seq_per_img)
    baseline = (scores.sum(1, keepdim=True) - scores) / (scores.shape[1] - 1)
    return (scores - baseline).reshape(-1, 1).repeat(1, L)


def egg_find_lengths(messages: torch.Tensor) -> torch.Tensor:
    """EGG's ``find_lengths``: the length including the first 0 (EOS); the full length when there is none."""
    max_k = messages.size(1)
    zero_mask = messages == 0
    lengths = max_k - (zero_mask.cumsum(dim=1) > 0).sum(dim=1)
    lengths.add_(1).clamp_(max=max_k)
    return lengths


class EggMeanBaseline:
    """EGG's ``MeanBaseline``: the running mean of the batch means of the loss (predict before update)."""

    def __init__(self):
        self.mean_baseline = torch.zeros(1, dtype=torch.float64, requires_grad=False)
        self.n_points = 0.0

    def update(self, loss: torch.Tensor) -> None:
        self.n_points += 1
        self.mean_baseline += (loss.detach().mean().item() - self.mean_baseline) / self.n_points

    def predict(self, loss: torch.Tensor) -> torch.Tensor:
        return self.mean_baseline


def egg_effective(per_position: torch.Tensor, message_length: torch.Tensor) -> torch.Tensor:
    """``CommunicationRnnReinforce``'s ``effective_log_prob_s``: the sum over the positions up to and including EOS."""
    out = torch.zeros(per_position.shape[0], dtype=per_position.dtype)
    for i in range(per_position.size(1)):
        not_eosed = (i < message_length).to(per_position.dtype)
        out = out + per_position[:, i] * not_eosed
    return out


def egg_policy_loss(loss: torch.Tensor, log_prob: torch.Tensor, baseline: EggMeanBaseline) -> torch.Tensor:
    """``CommunicationRnnReinforce``'s ``policy_loss`` (the game's loss is the negative reward), then the update."""
    policy_loss = ((loss.detach() - baseline.predict(loss.detach())) * log_prob).mean()
    baseline.update(loss)
    return policy_loss


# --------------------------------------------------------------------------------------------------------------------
# finecap's side: REINFORCE with a stand-in policy whose forward is finecap's token scoring of fixed logits
# --------------------------------------------------------------------------------------------------------------------

V = 5  # token 0 is the stop token and the padding, as in both reference codes
# two images, two samples each, L = 4
SEQ = torch.tensor(
    [
        [3, 1, 0, 0],  # two words and the stop token: 3 tokens
        [2, 4, 1, 3],  # cut at the length limit without a stop token: 4 tokens
        [0, 0, 0, 0],  # stops at once (all padding in the references' encoding): 1 token, the stop token
        [1, 2, 0, 0],  # 3 tokens
    ]
)
LENGTHS = torch.tensor([3, 4, 1, 3])  # finecap's: up to and including the stop token
TEXTS = ["a b", "c d e f", "", "g h"]


def logits_of(seed: int = 0) -> torch.Tensor:
    return torch.randn(len(SEQ), SEQ.shape[1], V, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


class Policy(torch.nn.Module):
    """Decodes ``SEQ`` (and ``greedy`` texts); ``forward`` scores them as a captioner's forward does
    (:func:`token_scores`, checked against this one below) from a fixed (N, L, V) logits parameter."""

    def __init__(self, logits: torch.Tensor, texts=TEXTS, greedy=("g0", "g1"), samples: int = 2):
        super().__init__()
        self.logits = torch.nn.Parameter(logits.clone())
        self.texts, self.greedy, self.samples = list(texts), list(greedy), samples

    def generate(self, batch, cfg, seeds=None):
        B = batch["features"].shape[0]
        if cfg.strategy == "greedy" and cfg.num_return_sequences == 1 and self.samples > 1:  # (only texts matter)
            n, texts, seq, lengths = 1, self.greedy, torch.zeros(B, 1, dtype=torch.long), torch.ones(B).long()
        else:
            n, texts, seq, lengths = self.samples, self.texts, SEQ, LENGTHS
        return Generation(seq, torch.zeros(seq.shape, dtype=torch.float64), lengths,
                          torch.arange(B).repeat_interleave(n), torch.zeros(len(texts)), list(texts))  # fmt: skip

    def forward(self, batch, sequences, mask, image_index=None, temperature=1.0, with_entropy=False):
        # token_scores' arithmetic in float64 (token_scores itself computes in float32, the precision of training)
        logp = F.log_softmax(self.logits / temperature, dim=-1)  # (N, L, V)
        keep = mask.to(logp.dtype)
        token = logp.gather(-1, sequences.unsqueeze(-1)).squeeze(-1) * keep  # (N, L)
        return TokenScores(token, entropy_of(logp) * keep if with_entropy else None)


class Table:
    """Reward looked up by caption text (float64)."""

    def __init__(self, table):
        self.table = table

    def __call__(self, captions, batch):
        total = torch.tensor([self.table[c] for c in captions], dtype=torch.float64)
        return RewardOutput(total, {"table": total})


BATCH = {"features": torch.zeros(2, 3), "image_ids": [10, 11]}


def finecap_step(policy, baseline, rewards, **rl):
    """One REINFORCE step of finecap: the loss (all named losses summed) and the gradient on the logits."""
    objective = Reinforce(Table(rewards), baseline, rl=RLConfig(samples=2, **rl))
    policy.logits.grad = None
    out = objective(policy.train(), BATCH)
    loss = sum(out.losses.values())
    loss.backward()
    return loss.detach(), policy.logits.grad.clone(), out, objective


def reference_grad(loss_fn, logits: torch.Tensor):
    leaf = logits.clone().requires_grad_(True)
    loss = loss_fn(F.log_softmax(leaf, dim=-1))
    loss.backward()
    return loss.detach(), leaf.grad


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-12, atol=1e-14)


SAMPLE_R = {"a b": 1.0, "c d e f": 0.25, "": 2.0, "g h": 0.5}
GREEDY_R = {"g0": 0.5, "g1": 1.0}


def sample_scores(table=SAMPLE_R):
    return torch.tensor([table[t] for t in TEXTS], dtype=torch.float64)


# --------------------------------------------------------------------------------------------------------------------
# Conventions shared with the references
# --------------------------------------------------------------------------------------------------------------------


def test_the_stand_in_scores_as_token_scores():
    logits, mask = logits_of(), Generation(SEQ, torch.zeros(4, 4), LENGTHS, torch.arange(4), torch.zeros(4)).mask
    ours = Policy(logits)(BATCH, SEQ, mask, temperature=0.7, with_entropy=True)
    theirs = token_scores(logits, SEQ, mask, 0.7, with_entropy=True)
    for a, b in ((ours.logprobs, theirs.logprobs), (ours.entropy, theirs.entropy)):
        assert torch.allclose(a.detach().float(), b, atol=1e-6)
    assert torch.count_nonzero(ours.logprobs[~mask]) == 0


def test_token_counts_are_the_references():
    # the stop token counts, a caption cut at the limit counts all L, one that stops at once its stop token alone
    mask = torch.cat([torch.ones(4, 1, dtype=torch.bool), (SEQ > 0)[:, :-1]], 1)  # self-critical.pytorch's
    assert torch.equal(mask.sum(1), LENGTHS)
    assert torch.equal(egg_find_lengths(SEQ), LENGTHS)
    gen = Generation(SEQ, torch.zeros(4, 4), LENGTHS, torch.arange(4), torch.zeros(4))
    assert torch.equal(gen.mask, mask)


# --------------------------------------------------------------------------------------------------------------------
# SCST: the greedy baseline
# --------------------------------------------------------------------------------------------------------------------


def test_scst_length_normalised_equals_rewardcriterion_per_caption():
    # rl.logprob=mean: each caption's token mean of -A log p, then the mean over captions = RewardCriterion with
    # reduction='none' averaged
    logits = logits_of()
    loss, grad, _, _ = finecap_step(Policy(logits), GreedyBaseline(), {**SAMPLE_R, **GREEDY_R}, logprob="mean")
    reward = rc_self_critical_reward(sample_scores(), torch.tensor([0.5, 1.0], dtype=torch.float64), 4)
    ref_loss, ref_grad = reference_grad(lambda lp: rc_reward_criterion(lp, SEQ, reward, "none").mean(), logits)
    assert close(loss, ref_loss) and close(grad, ref_grad)


def test_scst_sum_is_rewardcriterion_scaled_by_tokens_over_captions():
    # rl.logprob=sum (the default): finecap's mean over the N = 4 captions of -A sum_t log p; RewardCriterion's
    # mean over the T = 3 + 4 + 1 + 3 = 11 tokens of -A log p: finecap = reference * T / N, gradient too
    logits = logits_of()
    loss, grad, out, _ = finecap_step(Policy(logits), GreedyBaseline(), {**SAMPLE_R, **GREEDY_R})
    reward = rc_self_critical_reward(sample_scores(), torch.tensor([0.5, 1.0], dtype=torch.float64), 4)
    ref_loss, ref_grad = reference_grad(lambda lp: rc_reward_criterion(lp, SEQ, reward), logits)
    assert close(loss, ref_loss * 11 / 4) and close(grad, ref_grad * 11 / 4)
    assert out.metrics["baseline"] == pytest.approx(0.75)  # (0.5, 0.5, 1, 1)


def test_a_sample_equal_to_the_greedy_caption_takes_no_gradient():
    # image 0's second sample is its greedy caption: advantage 0, its logits' gradient exactly 0, as the reference
    logits = logits_of(1)
    policy = Policy(logits, greedy=("c d e f", "g1"))
    loss, grad, _, _ = finecap_step(policy, GreedyBaseline(), {**SAMPLE_R, **GREEDY_R})
    reward = rc_self_critical_reward(sample_scores(), torch.tensor([0.25, 1.0], dtype=torch.float64), 4)
    assert reward[1].abs().sum() == 0
    ref_loss, ref_grad = reference_grad(lambda lp: rc_reward_criterion(lp, SEQ, reward), logits)
    assert close(loss, ref_loss * 11 / 4) and close(grad, ref_grad * 11 / 4)
    assert torch.count_nonzero(grad[1]) == 0 and torch.count_nonzero(grad[0]) > 0


def test_the_token_mean_of_the_reference_is_the_clipped_loss_at_one_iteration():
    # grpo.policy_loss=clipped, grpo.loss_aggregation=token, one iteration: the ratio is 1 with the gradient of
    # log p, so the gradient is RewardCriterion's token mean exactly (the loss's value is -mean A, not the reference's)
    logits = logits_of(5)
    policy = Policy(logits)
    objective = PolicyOptimization(Table({**SAMPLE_R, **GREEDY_R}), GreedyBaseline(), rl=RLConfig(samples=2),
                                   grpo=GRPOConfig(policy_loss="clipped", loss_aggregation="token"))  # fmt: skip
    out = objective(policy.train(), BATCH)
    out.losses["policy"].backward()
    reward = rc_self_critical_reward(sample_scores(), torch.tensor([0.5, 1.0], dtype=torch.float64), 4)
    _, ref_grad = reference_grad(lambda lp: rc_reward_criterion(lp, SEQ, reward), logits)
    assert close(policy.logits.grad, ref_grad)
    assert out.num_items == 11.0  # the tokens: the engine divides the step's sum by the global count


# --------------------------------------------------------------------------------------------------------------------
# Leave-one-out: "new self-critical"
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rewards", [SAMPLE_R, {t: 0.7 for t in TEXTS}], ids=["rewards", "all-equal"])
def test_leave_one_out_equals_new_self_critical(rewards):
    logits = logits_of(2)
    ref_reward = rc_new_self_critical_reward(sample_scores(rewards), 2, 4)

    def per_caption(lp):
        return rc_reward_criterion(lp, SEQ, ref_reward, "none").mean()

    def per_token(lp):
        return rc_reward_criterion(lp, SEQ, ref_reward)

    for logprob, reference, scale in (("sum", per_token, 11 / 4), ("mean", per_caption, 1.0)):
        loss, grad, _, _ = finecap_step(Policy(logits), LeaveOneOut(), rewards, logprob=logprob)
        ref_loss, ref_grad = reference_grad(reference, logits)
        assert close(loss, ref_loss * scale) and close(grad, ref_grad * scale), logprob
    if len(set(rewards.values())) == 1:  # all equal: no signal at all
        assert torch.count_nonzero(grad) == 0


def test_leave_one_out_with_more_samples():
    # one image, four samples: b_j = mean of the three others
    logits = logits_of(3)
    rewards = dict(zip(TEXTS, (1.0, 0.25, 2.0, 0.5), strict=True))
    policy = Policy(logits, samples=4)
    objective = Reinforce(Table(rewards), LeaveOneOut(), rl=RLConfig(samples=4))
    out = objective(policy.train(), {"features": torch.zeros(1, 3), "image_ids": [0]})
    out.losses["reinforce"].backward()
    ref_reward = rc_new_self_critical_reward(sample_scores(rewards), 4, 4)
    # A = r - (sum - r)/3: sum 3.75 -> (1 - 2.75/3, 0.25 - 3.5/3, 2 - 1.75/3, 0.5 - 3.25/3)
    assert ref_reward[:, 0].tolist() == pytest.approx([1 / 12, -11 / 12, 17 / 12, -7 / 12])
    ref_loss, ref_grad = reference_grad(lambda lp: rc_reward_criterion(lp, SEQ, ref_reward), logits)
    assert close(out.losses["reinforce"].detach(), ref_loss * 11 / 4) and close(policy.logits.grad, ref_grad * 11 / 4)


# --------------------------------------------------------------------------------------------------------------------
# The running mean baseline: EGG's, DiscriTune's code base
# --------------------------------------------------------------------------------------------------------------------


def test_running_mean_equals_egg_over_steps():
    # three steps: the second has all rewards equal, the third new ones; EGG's loss is the negative reward, its
    # log-prob the sum up to and including EOS (rl.logprob=sum) or that over the length (DiscriTune's, mean)
    steps = [SAMPLE_R, {t: 0.7 for t in TEXTS}, dict(zip(TEXTS, (0.1, 0.9, 0.3, 1.5), strict=True))]
    for logprob in ("sum", "mean"):
        ours, theirs = MeanBaseline(), EggMeanBaseline()
        for i, rewards in enumerate(steps):
            logits = logits_of(10 + i)
            loss, grad, _, objective = finecap_step(Policy(logits), ours, rewards, logprob=logprob)
            objective.end_step()
            lengths = egg_find_lengths(SEQ)

            def egg(lp, rewards=rewards, lengths=lengths, logprob=logprob, theirs=theirs):
                log_prob = egg_effective(lp.gather(2, SEQ.unsqueeze(2)).squeeze(2), lengths)
                if logprob == "mean":
                    log_prob = log_prob / lengths
                return egg_policy_loss(-sample_scores(rewards), log_prob, theirs)

            ref_loss, ref_grad = reference_grad(egg, logits)
            # EGG's baseline is of the loss (-R): -m; finecap's of the reward: m
            assert ours.mean == pytest.approx(-theirs.mean_baseline.item(), abs=1e-15)
            assert close(loss, ref_loss) and close(grad, ref_grad), (logprob, i)


# --------------------------------------------------------------------------------------------------------------------
# Max-entropy
# --------------------------------------------------------------------------------------------------------------------


def test_max_entropy_term_equals_eggs_effective_entropy():
    # the per-caption mean entropy up to and including EOS, then the mean over captions; the loss subtracts
    # coef times it (NoBaseline and all-zero rewards: the REINFORCE term is exactly 0)
    logits = logits_of(4)
    loss, grad, out, _ = finecap_step(Policy(logits), NoBaseline(), {t: 0.0 for t in TEXTS}, entropy_coef=0.01)
    assert out.losses["reinforce"].item() == 0.0

    def egg(lp):
        entropy = -(lp.exp() * lp).sum(-1)  # (N, L)
        lengths = egg_find_lengths(SEQ)
        return -0.01 * (egg_effective(entropy, lengths) / lengths).mean()

    ref_loss, ref_grad = reference_grad(egg, logits)
    assert close(loss, ref_loss) and close(grad, ref_grad)
