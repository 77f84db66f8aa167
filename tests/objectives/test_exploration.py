"""Sequence-level exploration: the BLEU-3/4 distance, diversity rewards and their baseline (Eq. 14-16, Sec. 4.3), the
two-term surrogate loss with a stand-in model (hand-computed), configuration, and a tiny-ClipCap smoke test."""

import math
from types import SimpleNamespace

import pytest
import torch

from finecap.config import ClipCapBackboneConfig, RLConfig, SLEConfig, load
from finecap.decode import Generation
from finecap.models.captioner import TokenScores
from finecap.models.clipcap import ClipCap
from finecap.models.presets import build_world_lm
from finecap.objectives import get_objective
from finecap.objectives.baselines import GreedyBaseline, NoBaseline
from finecap.objectives.exploration import (
    DISTANCE_FUNCTIONS,
    DISTANCES,
    SequenceLevelExploration,
    caption_distances,
    diversity_advantages,
    diversity_rewards,
)
from finecap.objectives.token_means import spread_keys
from finecap.rewards import RewardOutput
from helpers.contexts import training_context
from helpers.objective_steps import OtherProcess, train_steps

# --------------------------------------------------------------------------------------------------------------------
# Distance
# --------------------------------------------------------------------------------------------------------------------


def test_distance_of_equal_length_captions():
    # "a b c d" vs "a b c e" (either way round, same lengths so symmetric; brevity penalty 1):
    #   precisions 1..3: 3/4, 2/3, 1/2 -> BLEU-3 = (3/4 * 2/3 * 1/2)^(1/3) = (1/4)^(1/3) = 0.629961
    #   no shared 4-gram: p4 = (0 + 1e-15) / (1 + 1e-9) -> BLEU-4 = (1/4 * 1e-15)^(1/4) = 0.000126
    #   d = 1 - (0.629961 + 0.000126) / 2 = 0.684957
    d = caption_distances(["a b c d", "a b c e"], 2)
    expected = 1 - ((1 / 4) ** (1 / 3) + (1 / 4 * 1e-15) ** (1 / 4)) / 2
    assert d.shape == (1, 2, 2)
    assert d[0, 0, 1].item() == pytest.approx(expected, abs=1e-6)
    assert d[0, 1, 0].item() == pytest.approx(expected, abs=1e-6)
    assert d[0, 0, 0].item() == 0.0 and d[0, 1, 1].item() == 0.0


def test_distance_is_symmetrised():
    # hypothesis "a b c d" vs reference "a b c d e": all precisions 1, brevity penalty exp(1 - 5/4) = exp(-0.25)
    #   d(1, 2) = 1 - exp(-0.25) = 0.221199
    # hypothesis "a b c d e" vs reference "a b c d": precisions 4/5, 3/4, 2/3, 1/2, no penalty
    #   BLEU-3 = (4/5 * 3/4 * 2/3)^(1/3) = 0.4^(1/3) = 0.736806; BLEU-4 = (0.4 * 1/2)^(1/4) = 0.2^(1/4) = 0.668740
    #   d(2, 1) = 1 - (0.736806 + 0.668740) / 2 = 0.297227
    # symmetrised: (0.221199 + 0.297227) / 2 = 0.259213
    d12 = 1 - math.exp(-0.25)
    d21 = 1 - (0.4 ** (1 / 3) + 0.2**0.25) / 2
    d = caption_distances(["a b c d", "a b c d e"], 2)
    assert d[0, 0, 1].item() == pytest.approx((d12 + d21) / 2, abs=1e-6)
    assert d[0, 1, 0].item() == d[0, 0, 1].item()


def test_identical_captions_are_at_distance_zero_even_when_short():
    # pycocoevalcap's smoothing gives "a b" vs itself BLEU-3 = (1 * 1 * 1e-6)^(1/3) = 0.01, i.e. d ~ 0.99;
    # identical captions are at distance 0 by definition. "b a" shares no bigram with "a b": d ~ 1.
    d = caption_distances(["a b", "a b", "b a"], 3)[0]
    assert d[0, 1].item() == 0.0
    assert d[0, 2].item() == pytest.approx(1.0, abs=1e-3)


def test_distances_are_per_image_group():
    d = caption_distances(["a b c d", "a b c d", "e f g h", "e f g h"], 2)
    assert d.shape == (2, 2, 2)
    assert d.abs().max().item() == 0.0  # each image's two captions are identical; across images is never compared
    with pytest.raises(ValueError, match="groups of 2"):
        caption_distances(["a", "b", "c"], 2)


def test_overlap_distance_hand_computed():
    captions = ["a b c d e", "a b c", "a b x d e", "A B c", ""]
    d = caption_distances(captions, 5, "overlap34")[0]
    # "a b c" inside "a b c d e": the shorter has 1 trigram (a b c), shared -> O3 = 1/1; order 4 on a 3-word caption
    #   is its whole sequence, shared -> O4 = 1; d = 1 - (1 + 1) / 2 = 0 (bleu34: 0.75)
    assert d[0, 1].item() == 0.0 and d[1, 0].item() == 0.0
    # "a b c d e" vs "a b x d e": trigrams {abc, bcd, cde} vs {abx, bxd, xde}: none shared -> O3 = 0; O4 = 0 -> d = 1
    assert d[0, 2].item() == 1.0
    # "a b c" vs "a b x d e": shorter "a b c", its one trigram not in the other -> O3 = 0, O4 (order 3) = 0 -> 1
    assert d[1, 2].item() == 1.0
    # PTB tokenisation first (lower-cased): "A B c" is "a b c" -> identical to caption 1 (0) and inside caption 0 (0)
    assert d[1, 3].item() == 0.0 and d[0, 3].item() == 0.0
    # the empty caption is at distance 1 from every non-empty one
    assert d[4, :4].tolist() == [1.0] * 4 and d[4, 4].item() == 0.0
    assert torch.equal(d, d.T)


def test_overlap_distance_counts_are_clipped_and_divided_by_the_shorter():
    # "a b c a b c" (6 words; trigrams abc, bca, cab, abc: 4) vs "a b c d" (4 words; trigrams abc, bcd: 2)
    #   shared trigrams: abc min(2, 1) = 1 -> O3 = 1 / 2 (the shorter's 2 trigrams)
    #   4-grams: {abca, bcab, cabc} vs {abcd}: none shared -> O4 = 0 / 1
    #   d = 1 - (1/2 + 0) / 2 = 0.75
    d = caption_distances(["a b c a b c", "a b c d"], 2, "overlap34")[0]
    assert d[0, 1].item() == pytest.approx(0.75)
    # length neutrality against BLEU-3/4: a caption and its 3-word start are far under bleu34, at 0 under overlap34
    pair = ["a red circle on the grass", "a red circle"]
    assert caption_distances(pair, 2, "bleu34")[0, 0, 1].item() > 0.8  # 0.813
    assert caption_distances(pair, 2, "overlap34")[0, 0, 1].item() == 0.0


def test_distance_names_are_the_config_choices():
    assert set(DISTANCE_FUNCTIONS) == set(DISTANCES) == {"bleu34", "overlap34"}
    assert load(None, ["sle.distance=overlap34"]).sle.distance == "overlap34"
    with pytest.raises(ValueError, match="sle.distance"):
        caption_distances(["a", "b"], 2, "jaccard")


# --------------------------------------------------------------------------------------------------------------------
# Diversity rewards and baseline
# --------------------------------------------------------------------------------------------------------------------

DIST = torch.tensor([[[0.0, 0.5, 1.0], [0.5, 0.0, 0.5], [1.0, 0.5, 0.0]]])  # one image, s = 3


def test_diversity_reward_eq_14():
    # r_j = (2/s) sum_k d_jk = (2/3) * (1.5, 1.0, 1.5) = (1, 2/3, 1)
    assert diversity_rewards(DIST)[0].tolist() == pytest.approx([1.0, 2 / 3, 1.0])


def test_diversity_baseline_inside_the_sum_gives_zero_mean_advantages():
    # b = (1/s^2) sum_jk d_jk = 4/9; advantage = (2/s) sum_k (d_jk - b) = r_j - 2b = r_j - 8/9
    #   = (1/9, -2/9, 1/9), summing to 0
    adv = diversity_advantages(DIST, "pairwise_mean")[0]
    assert adv.tolist() == pytest.approx([1 / 9, -2 / 9, 1 / 9])
    assert adv.sum().item() == pytest.approx(0.0, abs=1e-7)
    assert diversity_advantages(DIST, "none")[0].tolist() == pytest.approx([1.0, 2 / 3, 1.0])
    with pytest.raises(ValueError, match="pairwise_mean, none"):
        diversity_advantages(DIST, "outside")


# --------------------------------------------------------------------------------------------------------------------
# The two-term surrogate loss
# --------------------------------------------------------------------------------------------------------------------


class TableReward:
    def __init__(self, table):
        self.table = table

    def __call__(self, captions, batch):
        total = torch.tensor([self.table[c] for c in captions])
        return RewardOutput(total, {"table": total})


class StandIn(torch.nn.Module):
    """One image, three fixed samples, fixed token log-probs; greedy caption "a b c d"."""

    def __init__(self, texts, token_logprobs, lengths):
        super().__init__()
        self.lp = torch.nn.Parameter(torch.tensor(token_logprobs))
        self.texts, self.lengths = texts, lengths

    def generate(self, batch, cfg, seeds=None):
        greedy = cfg.strategy == "greedy"
        texts = ["a b c d"] if greedy else self.texts
        L = self.lp.shape[1]
        return Generation(
            sequences=torch.ones(len(texts), L, dtype=torch.long),
            token_logprobs=torch.zeros(len(texts), L),
            lengths=torch.tensor([1] if greedy else self.lengths),
            image_index=torch.zeros(len(texts), dtype=torch.long),
            scores=torch.zeros(len(texts)),
            texts=list(texts),
        )

    def forward(self, batch, sequences, mask, image_index=None, temperature=1.0, with_entropy=False):
        return TokenScores(self.lp * mask)


def test_surrogate_loss_eq_15_16_with_baselines():
    texts = ["a b c d", "a b c d", "e f g h"]
    model = StandIn(texts, [[-1.0, 0.0], [-1.0, -1.0], [-2.0, -2.0]], [1, 2, 2])  # log p = (-1, -2, -4)
    objective = SequenceLevelExploration(
        TableReward({"a b c d": 1.0, "e f g h": 0.4}),
        GreedyBaseline(),
        rl=RLConfig(samples=3),
        sle=SLEConfig(alpha=0.75),
    )
    out = objective(model, {"features": torch.zeros(1, 2), "image_ids": [7]})
    # precision: R = (1, 1, 0.4), greedy baseline R("a b c d") = 1 -> A = (0, 0, -0.6); times alpha: (0, 0, -0.45)
    #   loss = -(0*-1 + 0*-2 + -0.45*-4) / 3 = -1.8/3 = -0.6
    assert out.losses["precision"].item() == pytest.approx(-0.6)
    # distances: d12 = 0 (identical), d13 = d23 = 1 (no shared n-gram; up to smoothing ~1e-5)
    #   r = (2/3)(1, 1, 2) = (2/3, 2/3, 4/3); b = 4/9 -> A = r - 8/9 = (-2/9, -2/9, 4/9); times 0.25:
    #   (-1/18, -1/18, 1/9); loss = -((-1/18)(-1) + (-1/18)(-2) + (1/9)(-4)) / 3 = -(1/18 + 2/18 - 8/18)/3 = 5/54
    assert out.losses["diversity"].item() == pytest.approx(5 / 54, abs=1e-5)
    assert out.metrics["diversity_reward"] == pytest.approx(8 / 9, abs=1e-5)  # mean of r = 2b
    assert out.metrics["pairwise_distance"] == pytest.approx(4 / 6, abs=1e-5)  # mean over the 6 pairs j != k
    assert out.metrics["distinct_samples"] == pytest.approx(2 / 3)
    assert set(out.losses) == {"precision", "diversity"}


class JudgeTable(TableReward):
    """A table whose captions missing from it fail (a judge that timed out): NaN total, ``failed`` set."""

    def __call__(self, captions, batch):
        failed = torch.tensor([c not in self.table for c in captions])
        total = torch.tensor([self.table.get(c, math.nan) for c in captions])
        return RewardOutput(total, {"table": total}, failed=failed)


def test_a_failed_caption_takes_no_gradient_and_is_out_of_the_others_diversity():
    # the captions of the test above and a fourth, "i j k l", that the reward could not score; log p = (-1, -2, -4, -6)
    texts = ["a b c d", "a b c d", "e f g h", "i j k l"]
    model = StandIn(texts, [[-1.0, 0.0], [-1.0, -1.0], [-2.0, -2.0], [-3.0, -3.0]], [1, 2, 2, 2])
    objective = SequenceLevelExploration(
        JudgeTable({"a b c d": 1.0, "e f g h": 0.4}), GreedyBaseline(), rl=RLConfig(samples=4), sle=SLEConfig()
    )
    out = objective(model, {"features": torch.zeros(1, 2), "image_ids": [7]})
    # precision: A = 0.75 * (0, 0, -0.6, 0) (the failed caption's 0); loss = -(-0.45 * -4) / 4 = -0.45
    assert out.losses["precision"].item() == pytest.approx(-0.45)
    # diversity over the three scored captions as in the test above: A = 0.25 * (-2/9, -2/9, 4/9), the failed one's 0;
    #   loss = -((-1/18)(-1) + (-1/18)(-2) + (1/9)(-4) + 0 * -6) / 4 = 5/72. Over all four (the failed caption at
    #   distance 1 from each): r = (1/2)(2, 2, 3, 3), b = 10/16, A = 0.25 * (-1/4, -1/4, 1/4, 1/4), pushing up the
    #   caption the reward could not see: loss = 7/64
    assert out.losses["diversity"].item() == pytest.approx(5 / 72, abs=1e-5)
    assert out.metrics["diversity_reward"] == pytest.approx(8 / 9, abs=1e-5)  # the scored captions' mean r
    assert out.metrics["pairwise_distance"] == pytest.approx(10 / 12, abs=1e-5)  # the samples themselves: all pairs
    sum(out.losses.values()).backward()
    assert model.lp.grad[3].abs().max().item() == 0.0 and model.lp.grad[2].abs().max().item() > 0


def test_the_logged_diversity_reward_is_the_steps_mean_over_every_scored_sample():
    # micro-batch 1: the test above's four samples, three scored: r = (2/3)(1, 1, 2) = (2/3, 2/3, 4/3), summing to
    # 8/3 (overlap34: a b c d and e f g h share no trigram, d = 1 exactly); micro-batch 2: four samples with no
    # trigram in common, every one scored: r = (2/4) x 3 = 1.5 each, summing to 6; the other process: two samples
    # of r summing to 1. The step's mean over its 9 scored samples: (8/3 + 6 + 1) / 9 = 29/27. Until 2026-11-29 the
    # log held the mean of the processes' means of their micro-batches' means: ((8/9 + 1.5) / 2 + 0.5) / 2 = 61/72.
    table = {"a b c d": 1.0, "e f g h": 0.4, "m n o p": 0.2, "q r s t": 0.3}
    objective = SequenceLevelExploration(JudgeTable(table), NoBaseline(), rl=RLConfig(samples=4),
                                         sle=SLEConfig(distance="overlap34"))  # fmt: skip
    captions = {"baseline": [0.0, 2.0], "diversity_reward": [1.0, 2.0], "logprob": [-2.0, 2.0],
                "reward": [1.0, 2.0], "sample_words": [8.0, 2.0],  # and nothing of these, no part of this test:
                "distinct_samples": [0.0, 0.0], **dict.fromkeys(spread_keys("advantage_std"), [0.0, 0.0])}  # fmt: skip
    objective.accelerator = OtherProcess(captions)
    lp = [[-1.0, 0.0], [-1.0, -1.0], [-2.0, -2.0], [-3.0, -3.0]]
    model = StandIn(["a b c d", "a b c d", "e f g h", "i j k l"], lp, [1, 2, 2, 2])  # "i j k l" fails
    outs = [objective(model, {"features": torch.zeros(1, 2), "image_ids": [7]}).metrics]
    model.texts = ["a b c d", "e f g h", "m n o p", "q r s t"]
    outs.append(objective(model, {"features": torch.zeros(1, 2), "image_ids": [8]}).metrics)
    assert [o["diversity_reward"] for o in outs] == pytest.approx([8 / 9, 1.5])  # each micro-batch's own
    objective.end_step()
    assert objective.step_values()["diversity_reward"] == pytest.approx(29 / 27)


def test_alpha_one_is_plain_reinforce():
    texts = ["a b c d", "a b c d", "e f g h"]
    model = StandIn(texts, [[-1.0, 0.0], [-1.0, -1.0], [-2.0, -2.0]], [1, 2, 2])
    objective = SequenceLevelExploration(
        TableReward({"a b c d": 1.0, "e f g h": 0.4}), NoBaseline(), rl=RLConfig(samples=3), sle=SLEConfig(alpha=1.0)
    )
    out = objective(model, {"features": torch.zeros(1, 2), "image_ids": [7]})
    # -(1*-1 + 1*-2 + 0.4*-4) / 3 = 4.6/3; the diversity term has weight 0
    assert out.losses["precision"].item() == pytest.approx(4.6 / 3)
    assert out.losses["diversity"].item() == 0.0


def test_sle_from_config_and_checks():
    objective = get_objective("sle", load())
    assert isinstance(objective, SequenceLevelExploration)
    assert objective.sle.alpha == 0.75 and objective.rl.samples == 5 and isinstance(objective.baseline, GreedyBaseline)
    with pytest.raises(ValueError, match="rl.samples >= 2"):
        get_objective("sle", load(None, ["rl.samples=1"]))


# --------------------------------------------------------------------------------------------------------------------
# Smoke test
# --------------------------------------------------------------------------------------------------------------------


def test_smoke_sle_on_tiny_clipcap():
    torch.manual_seed(0)
    lm, tok = build_world_lm(layers=2, hidden=32, heads=2)
    model = ClipCap(lm, tok, 16, ClipCapBackboneConfig(prefix_length=4)).train()
    refs = {0: ["a red circle on grass", "a small red circle"], 1: ["a blue square", "a big blue square on sand"]}
    batch = {"features": torch.randn(2, 16), "image_ids": [0, 1]}
    objective = get_objective("sle", load(None, ["rl.samples=3", "decode.max_length=8"]))
    records = [SimpleNamespace(image_id=i, captions=c) for i, c in refs.items()]
    objective.setup(training_context(records))
    before = [p.detach().clone() for p in model.parameters()]
    train_steps(model, objective, batch, 2)
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
