"""REINFORCE: surrogate loss, log-prob conventions, baselines, max-entropy term (hand-computed values with a stand-in
model), configuration, and a smoke test on a tiny ClipCap with the CIDEr-D reward."""

import math
from types import SimpleNamespace

import pytest
import torch

from finecap.config import ClipCapBackboneConfig, ConfigError, DecodeConfig, RLConfig, load
from finecap.decode import Generation
from finecap.models.captioner import TokenScores, token_scores
from finecap.models.clipcap import ClipCap
from finecap.models.presets import build_world_lm
from finecap.objectives import get_objective
from finecap.objectives.baselines import GreedyBaseline, LeaveOneOut, MeanBaseline, NoBaseline, build_baseline
from finecap.objectives.entropy import mean_entropy, token_entropy
from finecap.objectives.reinforce import Reinforce, sequence_logprob
from finecap.objectives.token_means import spread_keys
from finecap.rewards import RewardBase, RewardOutput, WeightedSum, caption_rows
from helpers.contexts import training_context
from helpers.objective_steps import OtherProcess, train_steps

# --------------------------------------------------------------------------------------------------------------------
# Stand-ins
# --------------------------------------------------------------------------------------------------------------------


class TableReward:
    """Reward looked up by caption text."""

    def __init__(self, table):
        self.table = table
        self.seen = []

    def __call__(self, captions, batch):
        self.seen.append((list(captions), caption_rows(captions, batch).tolist()))
        total = torch.tensor([self.table[c] for c in captions])
        return RewardOutput(total, {"table": total})


class StandIn(torch.nn.Module):
    """Decodes fixed captions; ``forward`` scores them with a fixed (N, L) parameter (0 at padding), so the loss and
    its gradient are known. Records the mode and gradient state of every call."""

    def __init__(self, texts, token_logprobs, lengths, samples, greedy_texts=None):
        super().__init__()
        self.lp = torch.nn.Parameter(torch.tensor(token_logprobs))
        self.texts, self.lengths, self.samples, self.greedy_texts = texts, lengths, samples, greedy_texts
        self.calls = []

    def _gen(self, texts, lengths, n, B):
        L = self.lp.shape[1]
        return Generation(
            sequences=torch.ones(len(texts), L, dtype=torch.long),
            token_logprobs=torch.zeros(len(texts), L),
            lengths=torch.tensor(lengths),
            image_index=torch.arange(B).repeat_interleave(n),
            scores=torch.zeros(len(texts)),
            texts=list(texts),
        )

    def generate(self, batch, cfg, seeds=None):
        self.calls.append(("generate", cfg.strategy, self.training, torch.is_grad_enabled()))
        B = batch["features"].shape[0]
        if cfg.strategy == "greedy" and self.samples != 1:
            return self._gen(self.greedy_texts, [1] * B, 1, B)
        assert cfg.num_return_sequences == self.samples
        return self._gen(self.texts, self.lengths, self.samples, B)

    def forward(self, batch, sequences, mask, image_index=None, temperature=1.0, with_entropy=False):
        self.calls.append(("logprob", temperature, self.training))
        return TokenScores(self.lp * mask, torch.zeros_like(self.lp) if with_entropy else None)


# Two images, two samples each. Token log-probs (0 at padding) and lengths:
#   sample 0: (-1, -1, 0)     length 2  sum -2   mean -1
#   sample 1: (-2, 0, 0)      length 1  sum -2   mean -2
#   sample 2: (-.5, -.5, -.5) length 3  sum -1.5 mean -0.5
#   sample 3: (-3, 0, 0)      length 1  sum -3   mean -3
TEXTS = ["a", "b", "c", "d"]
LOGPROBS = [[-1.0, -1.0, 0.0], [-2.0, 0.0, 0.0], [-0.5, -0.5, -0.5], [-3.0, 0.0, 0.0]]
LENGTHS = [2, 1, 3, 1]
REWARDS = {"a": 1.0, "b": 3.0, "c": 2.0, "d": 2.0, "g0": 2.0, "g1": 1.0}
BATCH = {"features": torch.zeros(2, 3), "image_ids": [10, 11]}


def run(baseline, *, logprob="sum", **kw):
    model = StandIn(TEXTS, LOGPROBS, LENGTHS, 2, greedy_texts=["g0", "g1"]).train()
    reward = WeightedSum({"table": (1.0, TableReward(REWARDS))})
    objective = Reinforce(reward, baseline, rl=RLConfig(samples=2, logprob=logprob, **kw))
    out = objective(model, BATCH)
    return model, out


# --------------------------------------------------------------------------------------------------------------------
# Surrogate loss and log-prob conventions
# --------------------------------------------------------------------------------------------------------------------


def test_surrogate_loss_without_baseline_and_its_gradient():
    model, out = run(NoBaseline())
    # A = R = (1, 3, 2, 2); log p = sums (-2, -2, -1.5, -3)
    # loss = -(1*-2 + 3*-2 + 2*-1.5 + 2*-3) / 4 = -(-2 - 6 - 3 - 6) / 4 = 17/4
    assert out.losses["reinforce"].item() == pytest.approx(4.25)
    out.losses["reinforce"].backward()
    # d loss / d lp[n, t] = -A_n / N on real tokens, 0 on padding
    expected = torch.tensor([[-0.25, -0.25, 0.0], [-0.75, 0.0, 0.0], [-0.5, -0.5, -0.5], [-0.5, 0.0, 0.0]])
    assert torch.allclose(model.lp.grad, expected)
    assert out.metrics["reward"] == pytest.approx(2.0)  # (1 + 3 + 2 + 2) / 4
    assert out.metrics["reward/table"] == pytest.approx(2.0)
    assert out.metrics["baseline"] == 0.0
    assert out.metrics["logprob"] == pytest.approx(-2.125)  # (-2 - 2 - 1.5 - 3) / 4
    assert out.metrics["distinct_samples"] == 1.0
    assert set(out.losses) == {"reinforce"}


def test_length_normalised_logprob():
    _, out = run(NoBaseline(), logprob="mean")
    # log p = means (-1, -2, -0.5, -3): loss = -(1*-1 + 3*-2 + 2*-0.5 + 2*-3) / 4 = -(-1 - 6 - 1 - 6) / 4 = 14/4
    assert out.losses["reinforce"].item() == pytest.approx(3.5)
    assert sequence_logprob(torch.tensor(LOGPROBS), torch.tensor(LENGTHS), "mean").tolist() == [-1, -2, -0.5, -3]


def test_decoding_without_gradient_in_eval_mode_then_logprob_in_train_mode():
    model, _ = run(GreedyBaseline(), temperature=0.3)
    assert model.calls[0] == ("generate", "sample", False, False)
    assert model.calls[1] == ("generate", "greedy", False, False)
    assert model.calls[2] == ("logprob", 1.0, True)  # log-probs of the untempered model by default
    assert model.training


def test_scaled_logprob_uses_the_sampling_temperature():
    model, _ = run(NoBaseline(), temperature=0.3, scaled_logprob=True)
    assert model.calls[-1] == ("logprob", 0.3, True)


# --------------------------------------------------------------------------------------------------------------------
# Baselines
# --------------------------------------------------------------------------------------------------------------------


def test_greedy_baseline_scst():
    _, out = run(GreedyBaseline())
    # greedy rewards per image (g0 = 2, g1 = 1) -> b = (2, 2, 1, 1); A = (1-2, 3-2, 2-1, 2-1) = (-1, 1, 1, 1)
    # loss = -(-1*-2 + 1*-2 + 1*-1.5 + 1*-3) / 4 = -(2 - 2 - 1.5 - 3) / 4 = 4.5/4
    assert out.losses["reinforce"].item() == pytest.approx(1.125)
    assert out.metrics["reward_greedy"] == pytest.approx(1.5)
    assert out.metrics["baseline"] == pytest.approx(1.5)


class FailingTable(TableReward):
    """:class:`TableReward` that could not score the captions of ``fails`` (a judge that failed on them)."""

    def __init__(self, table, fails):
        super().__init__(table)
        self.fails = fails

    def __call__(self, captions, batch):
        out = super().__call__(captions, batch)
        return RewardOutput(out.total, out.parts, failed=torch.tensor([c in self.fails for c in captions]))


def test_a_failed_greedy_caption_falls_back_to_the_mean_of_the_images_other_samples():
    model = StandIn(TEXTS, LOGPROBS, LENGTHS, 2, greedy_texts=["g0", "g1"]).train()
    reward = WeightedSum({"table": (1.0, FailingTable({**REWARDS, "d": 4.0}, {"g1"}))})
    out = Reinforce(reward, GreedyBaseline(), rl=RLConfig(samples=2))(model, BATCH)
    # image 0: b = g0 = 2, A = (1-2, 3-2) = (-1, 1); image 1's greedy caption failed: b = the other sample's reward,
    # c: 4 (d's), d: 2 (c's), A = (2-4, 4-2) = (-2, 2). log p = (-2, -2, -1.5, -3)
    # loss = -(-1*-2 + 1*-2 + -2*-1.5 + 2*-3) / 4 = -(2 - 2 + 3 - 6) / 4 = 3/4 (image 1 took none: 0 until 2026-11-29)
    assert out.losses["reinforce"].item() == pytest.approx(0.75)
    out.losses["reinforce"].backward()
    # d loss / d lp[n, t] = -A_n / N on real tokens: image 1's rows have a gradient
    expected = torch.tensor([[0.25, 0.25, 0.0], [-0.25, 0.0, 0.0], [0.5, 0.5, 0.5], [-0.5, 0.0, 0.0]])
    assert torch.allclose(model.lp.grad, expected)
    assert out.scored == 4
    assert out.metrics["reward_greedy"] == 2.0 and out.metrics["reward_greedy/failed"] == 0.5
    assert out.metrics["baseline"] == pytest.approx(2.5)  # (2 + 2 + 4 + 2) / 4


def test_a_reward_given_as_is_pays_a_failed_greedy_caption_nothing_whatever_number_it_left():
    # FailingTable, not in a WeightedSum, leaves g1's table value (1) in the total of the greedy caption it failed on.
    # It is no baseline: image 1's samples fall back to each other's rewards, as under the weighted sum (the test
    # above: loss 3/4). Until 2026-11-29 the number was image 1's baseline, A = (2-1, 4-1) = (1, 3), loss
    # -(-1*-2 + 1*-2 + 1*-1.5 + 3*-3) / 4 = 2.625, and the logged greedy reward the mean of 2 and 1
    model = StandIn(TEXTS, LOGPROBS, LENGTHS, 2, greedy_texts=["g0", "g1"]).train()
    reward = FailingTable({**REWARDS, "d": 4.0}, {"g1"})
    out = Reinforce(reward, GreedyBaseline(), rl=RLConfig(samples=2))(model, BATCH)
    assert out.losses["reinforce"].item() == pytest.approx(0.75)
    assert out.metrics["reward_greedy"] == 2.0 and out.metrics["reward_greedy/failed"] == 0.5


def test_a_reward_given_as_is_leaves_a_failed_samples_number_out_of_the_running_mean_and_the_logged_reward():
    # c failed with 6 left in its total: the step's mean reward is (1 + 3 + 2) / 3 = 2, not (1 + 3 + 6 + 2) / 4 = 3
    # (until 2026-11-29), in the log and in the running mean the next step's baseline is
    model = StandIn(TEXTS, LOGPROBS, LENGTHS, 2).train()
    baseline = MeanBaseline()
    objective = Reinforce(FailingTable({**REWARDS, "c": 6.0}, {"c"}), baseline, rl=RLConfig(samples=2))
    out = objective(model, BATCH)
    objective.end_step()
    assert out.metrics["reward"] == pytest.approx(2.0) and baseline.mean == pytest.approx(2.0)


def test_leave_one_out_baseline():
    _, out = run(LeaveOneOut())
    # b = the other sample of the image: (3, 1, 2, 2); A = (-2, 2, 0, 0)
    # loss = -(-2*-2 + 2*-2 + 0 + 0) / 4 = 0
    assert out.losses["reinforce"].item() == pytest.approx(0.0)
    b = LeaveOneOut()(torch.tensor([1.0, 2.0, 6.0, 4.0, 8.0]), torch.tensor([0, 0, 0, 1, 1]), None)
    # image 0: ((2+6)/2, (1+6)/2, (1+2)/2) = (4, 3.5, 1.5); image 1: (8, 4)
    assert b.tolist() == [4.0, 3.5, 1.5, 8.0, 4.0]
    with pytest.raises(ValueError, match="at least 2"):
        LeaveOneOut()(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 0, 1]), None)


def test_running_mean_baseline_cumulative_and_resume():
    idx = torch.tensor([0, 1])
    base = MeanBaseline()
    # step 1 (mean 2): no past rewards -> b = 0 (as EGG); after the step the running mean is 2 (1 batch)
    assert base(torch.tensor([1.0, 3.0]), idx, None).tolist() == [0.0, 0.0]
    base.end_step()
    # step 2 (mean 5): b = 2; then mean = 2 + (5 - 2)/2 = 3.5
    assert base(torch.tensor([4.0, 6.0]), idx, None).tolist() == [2.0, 2.0]
    base.end_step()
    state = base.state_dict()
    assert state == {"mean": 3.5, "count": 2}
    resumed = MeanBaseline()
    resumed.load_state_dict(state)
    # step 3 (mean 0.5): b = 3.5; then mean = 3.5 + (0.5 - 3.5)/3 = 2.5
    for b in (base, resumed):
        assert b(torch.tensor([0.0, 1.0]), idx, None).tolist() == [3.5, 3.5]
        b.end_step()
        assert b.mean == pytest.approx(2.5)


def test_running_mean_baseline_counts_a_step_once_whatever_its_micro_batches():
    # one step of rewards (1, 3, 4, 6) as one batch, or as two micro-batches: the same b during the step (the past
    # mean, 0 here) and the same running mean after it, (1 + 3 + 4 + 6) / 4 = 3.5
    idx = torch.tensor([0, 1])
    whole, split = MeanBaseline(), MeanBaseline()
    assert whole(torch.tensor([1.0, 3.0, 4.0, 6.0]), torch.tensor([0, 1, 2, 3]), None).tolist() == [0.0] * 4
    assert split(torch.tensor([1.0, 3.0]), idx, None).tolist() == [0.0, 0.0]
    assert split(torch.tensor([4.0, 6.0]), idx, None).tolist() == [0.0, 0.0]
    whole.end_step()
    split.end_step()
    assert whole.state_dict() == split.state_dict() == {"mean": 3.5, "count": 1}


def test_running_mean_baseline_exponential():
    idx = torch.tensor([0, 1])
    base = MeanBaseline(RLConfig(baseline="mean", mean_momentum=0.9))
    base(torch.tensor([1.0, 3.0]), idx, None)  # b = 0, mean = 2 after the step
    base.end_step()
    assert base(torch.tensor([4.0, 6.0]), idx, None).tolist() == [2.0, 2.0]  # mean = 0.9*2 + 0.1*5 = 2.3
    base.end_step()
    assert base(torch.tensor([0.0, 0.0]), idx, None)[0].item() == pytest.approx(2.3)


def test_objective_state_holds_the_baseline():
    model = StandIn(TEXTS, LOGPROBS, LENGTHS, 2)
    objective = Reinforce(TableReward(REWARDS), MeanBaseline(), rl=RLConfig(samples=2))
    objective(model, BATCH)  # rewards (1, 3, 2, 2): mean 2
    objective.end_step()
    state = objective.state_dict()
    assert state["baseline"] == {"mean": 2.0, "count": 1}
    other = Reinforce(TableReward(REWARDS), MeanBaseline(), rl=RLConfig(samples=2))
    other.load_state_dict(state)
    assert other.baseline.mean == 2.0 and other.baseline.count == 1


def test_closing_the_objective_closes_its_reward():
    closed = []

    class Closing(RewardBase):
        def __call__(self, captions, batch):
            return TableReward(REWARDS)(captions, batch)

        def close(self):
            closed.append(self)

    objective = Reinforce(Closing(), MeanBaseline(), rl=RLConfig(samples=2))
    objective.close()  # training's end (the engine calls it once, also after an error)
    assert closed == [objective.reward]


class Tallying(RewardBase):
    """:class:`TableReward`'s values, counting its calls and captions (:meth:`RewardBase.tallies`, as a judged
    reward reports its judge's calls)."""

    def __init__(self):
        self.calls = self.captions = 0

    def setup(self, inputs):
        self.calls += 2  # work before the first step (a judged reward's blind asks)

    def __call__(self, captions, batch):
        self.calls, self.captions = self.calls + 1, self.captions + len(captions)
        return TableReward(REWARDS)(captions, batch)

    def tallies(self):
        return {"calls": float(self.calls), "captions": float(self.captions)}


class TwoProcesses:
    """An accelerator of two processes whose other process counted as much as this one (``reduce`` by sum)."""

    num_processes, device = 2, "cpu"

    def reduce(self, t, reduction):
        assert reduction == "sum"
        return t * 2


def test_each_step_logs_the_increase_of_the_rewards_tallies_over_every_process():
    # the tallies of a reward (a judge's calls, failures, HTTP 429s) were logged nowhere; each step now logs how much
    # they grew over it, summed over the processes, as reward/<name>/<key>
    reward = Tallying()
    objective = Reinforce(WeightedSum({"t": (1.0, reward)}), MeanBaseline(), rl=RLConfig(samples=2))
    objective.setup(training_context([]))  # one process; the set-up's 2 calls are no step's
    model = StandIn(TEXTS, LOGPROBS, LENGTHS, 2)
    # the step's values over its captions (images: distinct_samples), beside
    captions = {"reward", "baseline", "logprob", "sample_words", "advantage_std", "distinct_samples"}

    def tallies():
        values = objective.step_values()
        return {k: v for k, v in values.items() if k not in captions}

    objective(model, BATCH)  # 4 captions, one call
    objective.end_step()
    assert tallies() == {"reward/t/calls": 1.0, "reward/t/captions": 4.0} and captions <= set(objective.step_values())
    objective.accelerator = TwoProcesses()
    objective(model, BATCH), objective(model, BATCH)  # two micro-batches here, as many on the other process
    objective.end_step()
    assert tallies() == {"reward/t/calls": 4.0, "reward/t/captions": 16.0}
    objective.end_step()  # a step that called nothing: no caption either
    assert objective.step_values() == {"reward/t/calls": 0.0, "reward/t/captions": 0.0}


def test_the_logged_caption_means_are_the_steps_over_every_micro_batch_and_process():
    # micro-batch 1: images 0 and 1, captions a, b, c, d: rewards (1, 3, 2, 2), log p (-2, -2, -1.5, -3);
    # micro-batch 2: one image, captions b, b: rewards (3, 3), log p (-2, -2); the other process: one image's two
    # samples, one caption twice, of rewards (5, 5) (summing to 10, their squares to 50) and log-probs (-3.5, -3.5).
    # The step's means are over its 8 captions, as TRL's reward over the step's gathered rewards: reward
    # (8 + 6 + 10) / 8 = 3, logprob (-8.5 - 4 - 7) / 8 = -2.4375. Until 2026-11-29 the log held the mean over the
    # processes of each one's mean of its micro-batches' means: reward ((2 + 3) / 2 + 5) / 2 = 3.75, logprob
    # ((-2.125 - 2) / 2 - 3.5) / 2 = -2.78125.
    reward = WeightedSum({"table": (1.0, TableReward(REWARDS))})
    objective = Reinforce(reward, NoBaseline(), rl=RLConfig(samples=2))
    total, squares = spread_keys("advantage_std")
    objective.accelerator = OtherProcess(
        {"baseline": [0.0, 2.0], "logprob": [-7.0, 2.0], "reward": [10.0, 2.0], "sample_words": [6.0, 2.0],
         total: [10.0, 2.0], squares: [50.0, 2.0], "distinct_samples": [0.5, 1.0]}
    )  # fmt: skip
    model = StandIn(TEXTS, LOGPROBS, LENGTHS, 2)
    outs = [objective(model, BATCH).metrics]
    model.texts, model.lengths, model.lp = ["b", "b"], [1, 1], torch.nn.Parameter(torch.tensor([LOGPROBS[1]] * 2))
    outs.append(objective(model, {"features": torch.zeros(1, 3), "image_ids": [12]}).metrics)
    assert [o["reward"] for o in outs] == [2.0, 3.0] and [o["logprob"] for o in outs] == [-2.125, -2.0]  # their own
    objective.end_step()
    logged = objective.step_values()
    assert logged["reward"] == 3.0 and logged["logprob"] == -2.4375
    assert logged["baseline"] == 0.0 and logged["sample_words"] == 1.5  # (6 x 1 word + 6) / 8
    # advantage_std (no baseline: A = R) over the step's 8 advantages (1, 3, 2, 2; 3, 3; 5, 5), Bessel-corrected as
    # TRL's nanstd: sum 24, squares 18 + 18 + 50 = 86, variance (86 - 24^2 / 8) / 7 = 2. Until 2026-11-29 the mean
    # over the processes of the means of the micro-batches' stds: ((sqrt(2/3) + 0) / 2 + 0) / 2 = 0.204.
    assert [o["advantage_std"] for o in outs] == pytest.approx([math.sqrt(2 / 3), 0.0])  # their own
    assert logged["advantage_std"] == pytest.approx(math.sqrt(2), rel=1e-12)
    # distinct_samples over the step's 3 images (a b: 1, c d: 1, b b: 1/2) and the other process's one (1/2): 3 / 4.
    # Until 2026-11-29: ((1 + 1/2) / 2 + 1/2) / 2 = 5/8
    assert [o["distinct_samples"] for o in outs] == [1.0, 0.5]  # their own
    assert logged["distinct_samples"] == 0.75


def test_build_baseline_names():
    assert isinstance(build_baseline(RLConfig(baseline="greedy")), GreedyBaseline)
    assert build_baseline(RLConfig(baseline="mean", mean_momentum=0.5)).momentum == 0.5
    assert isinstance(build_baseline(RLConfig(baseline="leave_one_out")), LeaveOneOut)
    assert isinstance(build_baseline(RLConfig(baseline="none")), NoBaseline)
    with pytest.raises(ConfigError, match="valid choices: greedy, mean, leave_one_out, none"):
        RLConfig(baseline="median")
    with pytest.raises(ConfigError, match=r"rl.mean_momentum: must be in \[0, 1\), got 1.0"):
        RLConfig(mean_momentum=1.0)


# --------------------------------------------------------------------------------------------------------------------
# Max-entropy term
# --------------------------------------------------------------------------------------------------------------------


def test_token_entropy_and_masked_mean():
    logits = torch.log(torch.tensor([[[0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0]]]))
    h = token_entropy(logits)  # (1, 3): ln 2, ln 4, 0
    assert h[0].tolist() == pytest.approx([math.log(2), math.log(4), 0.0], abs=1e-6)
    # only the first two positions are real: (ln 2 + ln 4) / 2 = 1.5 ln 2
    assert mean_entropy(h, torch.tensor([[True, True, False]])).item() == pytest.approx(1.5 * math.log(2))
    # temperature 2 on logits (log 1, log 0 -> -inf) keeps the one-hot: entropy 0; uniform stays uniform
    assert token_entropy(logits, 2.0)[0, 1].item() == pytest.approx(math.log(4))


def test_the_entropy_term_is_the_steps_however_the_step_is_cut():
    # the engine averages micro-batches weighted by their num_items (captions for REINFORCE): a token mean per
    # micro-batch was not the step's (10 tokens of entropy 1, 2 of entropy 3: 16 / 12 whole, 2.0 cut in two)
    h = torch.tensor([[1.0] * 10, [3.0, 3.0] + [0.0] * 8])
    m = torch.tensor([[True] * 10, [True, True] + [False] * 8])
    for per, items in (("caption", lambda mask: 1.0), ("token", lambda mask: float(mask.sum()))):
        whole = mean_entropy(h, m, per).item()
        parts = [(mean_entropy(h[i : i + 1], m[i : i + 1], per).item(), items(m[i])) for i in range(2)]
        assert sum(v * n for v, n in parts) / sum(n for _, n in parts) == pytest.approx(whole), per
    assert (mean_entropy(h, m).item(), mean_entropy(h, m, "token").item()) == (2.0, pytest.approx(16 / 12))


def test_the_entropy_term_ignores_whatever_padding_holds():
    # a padded row of -inf logits has entropy NaN (token_entropy); the mean over the real positions is untouched:
    # (ln 2 + ln 4) / 2 = 1.5 ln 2 per caption and per token
    h = torch.tensor([[math.log(2), math.log(4), float("nan")]])
    m = torch.tensor([[True, True, False]])
    for per in ("caption", "token"):
        assert mean_entropy(h, m, per).item() == pytest.approx(1.5 * math.log(2)), per


class Uniform(StandIn):
    """A stand-in whose LM gives uniform logits over 2 tokens: every token log-prob is -ln 2, entropy ln 2."""

    def forward(self, batch, sequences, mask, image_index=None, temperature=1.0, with_entropy=False):
        N, L = sequences.shape
        logits = torch.zeros(N, L, 2) + 0 * self.lp.sum()  # (N, L, 2) uniform, depends on the parameter
        return token_scores(logits, torch.zeros_like(sequences), mask, temperature, with_entropy)


def test_max_entropy_loss():
    model = Uniform(TEXTS, LOGPROBS, LENGTHS, 2).train()
    objective = Reinforce(TableReward(REWARDS), NoBaseline(), rl=RLConfig(samples=2, entropy_coef=0.1))
    out = objective(model, BATCH)
    ln2 = math.log(2)
    # log p = -ln2 * lengths (2, 1, 3, 1); loss = ln2 * (1*2 + 3*1 + 2*3 + 2*1) / 4 = ln2 * 13/4
    assert out.losses["reinforce"].item() == pytest.approx(13 / 4 * ln2)
    # mean entropy over the real tokens = ln 2; the loss subtracts coef * entropy
    assert out.metrics["entropy"] == pytest.approx(ln2)
    assert out.losses["entropy"].item() == pytest.approx(-0.1 * ln2)


# --------------------------------------------------------------------------------------------------------------------
# Configuration and registry
# --------------------------------------------------------------------------------------------------------------------


def test_objectives_from_config():
    objective = get_objective("reinforce", load())
    assert isinstance(objective, Reinforce)
    assert isinstance(objective.baseline, GreedyBaseline)
    assert objective.rl.samples == 5 and objective.sample_cfg.strategy == "sample"
    assert objective.greedy_cfg.strategy == "greedy"
    assert sorted(objective.reward.rewards) == ["cider"]
    with pytest.raises(ValueError, match="rl.entropy_coef > 0"):
        get_objective("scst_me", load())
    me = get_objective("scst_me", load(None, ["rl.entropy_coef=0.01"]))
    assert me.rl.entropy_coef == 0.01
    dt = get_objective("reinforce", load(None, ["rl.strategy=greedy", "rl.samples=1", "rl.baseline=mean"]))
    assert dt.sample_cfg.strategy == "greedy" and isinstance(dt.baseline, MeanBaseline)


def test_rollout_sections_are_the_decode_section_with_the_rl_options():
    cfg = load(None, ["rl.samples=128", "rl.temperature=0.3", "decode.max_length=12", "decode.top_k=5",
                      "decode.top_p=0.5", "decode.stop_at_period=true", "decode.batch_size=512"])  # fmt: skip
    objective = get_objective("reinforce", cfg)
    sample = objective.sample_cfg  # 128 samples per image: more than decode.beam_size may be, and no beam is searched
    assert (sample.strategy, sample.num_return_sequences, sample.temperature) == ("sample", 128, 0.3)
    assert (sample.max_length, sample.stop_at_period, sample.batch_size) == (12, True, 512)  # the decode section's
    assert (sample.top_k, sample.top_p) == (0, 1.0)  # sampled from the whole tempered distribution
    greedy = objective.greedy_cfg
    assert (greedy.strategy, greedy.num_return_sequences, greedy.max_length, greedy.stop_at_period) == (
        "greedy", 1, 12, True)  # fmt: skip
    beam_cfg = load(None, ["rl.strategy=beam", "rl.samples=1", "rl.baseline=mean", "decode.beam_size=3",
                           "decode.length_penalty=0.5"])  # fmt: skip
    beam = get_objective("reinforce", beam_cfg).sample_cfg
    assert (beam.strategy, beam.beam_size, beam.length_penalty, beam.num_return_sequences) == ("beam", 3, 0.5, 1)


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["rl.strategy=beam"], "rl.samples"),  # beam with the default 5 samples
        (["rl.baseline=leave_one_out", "rl.samples=1"], "rl.samples"),
        (["rl.strategy=greedy", "rl.samples=1"], "rl.baseline"),  # greedy baseline of greedy captions: A = 0
        (["sle.alpha=1.5"], "sle.alpha"),
        (["rl.rewards={}"], "rl.rewards"),
        (["rl.baseline=median"], "rl.baseline"),
    ],
)
def test_config_checks_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key):
        load(None, overrides)


# --------------------------------------------------------------------------------------------------------------------
# Smoke test on a tiny ClipCap
# --------------------------------------------------------------------------------------------------------------------

D = 16
CAPTIONS = {
    0: ["a red circle on grass", "a small red circle", "a red circle at the top"],
    1: ["a blue square on the sand", "a big blue square", "a blue square in the middle"],
    2: ["two shapes on grass with a green star", "a green star", "a green star left of a circle"],
    3: ["a yellow triangle", "a yellow triangle at the bottom", "a large yellow triangle on snow"],
}


def tiny_captioner(seed=0):
    torch.manual_seed(seed)
    lm, tok = build_world_lm(layers=2, hidden=32, heads=2)
    return ClipCap(lm, tok, D, ClipCapBackboneConfig(prefix_length=4))


def test_entropy_comes_from_the_same_forward_as_the_logprobs():
    model = tiny_captioner().eval()
    feats = torch.randn(2, D)
    gen = model.generate(feats, DecodeConfig(strategy="sample", num_return_sequences=2, max_length=6))
    kw = dict(sequences=gen.sequences, mask=gen.mask, image_index=gen.image_index, temperature=0.7)
    both = model({"features": feats}, with_entropy=True, **kw)
    assert torch.allclose(both.logprobs, model({"features": feats}, **kw).logprobs, atol=1e-6)
    h = both.entropy
    assert bool((h[gen.mask] > 0).all()) and bool((h[~gen.mask] == 0).all())


@pytest.mark.parametrize("objective_name", ["reinforce", "scst_me"])
def test_smoke_reinforce_with_cider_on_tiny_clipcap(objective_name):
    model = tiny_captioner().train()
    torch.manual_seed(1)
    batch = {"features": torch.randn(4, D), "image_ids": [0, 1, 2, 3], "references": list(CAPTIONS.values())}
    coef = 0.01 if objective_name == "scst_me" else 0.0
    cfg = load(None, ["rl.samples=3", "decode.max_length=8", f"rl.entropy_coef={coef}"])
    objective = get_objective(objective_name, cfg)
    records = [SimpleNamespace(image_id=i, captions=c) for i, c in CAPTIONS.items()]
    objective.setup(training_context(records))
    before = [p.detach().clone() for p in model.parameters()]
    out = train_steps(model, objective, batch, 3)[-1]
    assert set(out.losses) == ({"reinforce", "entropy"} if objective_name == "scst_me" else {"reinforce"})
    assert out.metrics["time/reward"] >= 0 and "reward/cider" in out.metrics and "reward_greedy" in out.metrics
    changed = [not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)]
    assert all(changed)
