"""The GRPO family as an objective (finecap.objectives.grpo.PolicyOptimization), with a stand-in captioner whose
log-probs are a parameter, so gradients are known: with one iteration and no clipping the gradient is REINFORCE's
with the same advantages; the token mean is that of the whole step whatever its micro-batches; iterations reuse the
rollout and keep it in the state; the factory keeps the papers' REINFORCE for the defaults. Then the reference
policy on a tiny ClipCap: KL 0 at step 0 and positive after a step; under LoRA the reference log-probs are the base
model's."""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from finecap.config import ClipCapBackboneConfig, ConfigError, DecodeConfig, load
from finecap.contract import StepInfo
from finecap.decode import Generation
from finecap.engines import rollouts as rollouts_module
from finecap.models import lora
from finecap.models.captioner import TokenScores
from finecap.models.clipcap import ClipCap
from finecap.models.presets import build_world_lm
from finecap.objectives import get_objective
from finecap.objectives import grpo as grpo_module
from finecap.objectives import reinforce as reinforce_module
from finecap.objectives.baselines import MeanBaseline, NoBaseline
from finecap.objectives.grpo import PolicyOptimization
from finecap.objectives.monitor import RewardHackingAlarm
from finecap.objectives.reinforce import Reinforce
from finecap.objectives.token_means import spread_keys
from finecap.rewards import RewardOutput, WeightedSum
from finecap.train.logging import step_sum
from finecap.train.state import load_tree, save_tree
from helpers.objective_steps import OtherProcess, train_steps
from helpers.rl_sections import rl_sections

S, L = 3, 4  # samples per image, token positions
N_IMAGES = 4
# Caption j of image i is "c<i>_<j>"; its reward and length are fixed. Rewards per image (3 samples):
#   0: (1, 2, 6)   1: (4, 4, 4)   2: (0, 3, 3)   3: (5, 1, 0)
REWARD = {
    f"c{i}_{j}": r for i, rs in enumerate([(1, 2, 6), (4, 4, 4), (0, 3, 3), (5, 1, 0)]) for j, r in enumerate(rs)
}
LENGTH = {f"c{i}_{j}": 1 + (i + j) % L for i in range(N_IMAGES) for j in range(S)}


class Table:
    def __call__(self, captions, batch):
        total = torch.tensor([float(REWARD[c]) for c in captions])
        return RewardOutput(total, {"table": total})


class StandIn(torch.nn.Module):
    """Decodes the fixed captions of the batch's images (``batch["index"]``); ``forward`` scores them with the rows of
    a (images x S, L) parameter (0 at padding). Counts its ``generate`` calls."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.lp = torch.nn.Parameter(-torch.rand(N_IMAGES * S, L, generator=g) - 0.1)
        self.generated = 0

    def rows(self, batch):
        index = torch.as_tensor(batch["index"])
        return (index.repeat_interleave(S) * S + torch.arange(S).repeat(len(index))).long()  # (N,)

    def generate(self, batch, cfg, seeds=None):
        self.generated += 1
        index = torch.as_tensor(batch["index"]).tolist()
        texts = [f"c{i}_{j}" for i in index for j in range(S)]
        return Generation(
            sequences=torch.ones(len(texts), L, dtype=torch.long), token_logprobs=torch.zeros(len(texts), L),
            lengths=torch.tensor([LENGTH[t] for t in texts]),
            image_index=torch.arange(len(index)).repeat_interleave(S), scores=torch.zeros(len(texts)), texts=texts,
        )  # fmt: skip

    def forward(self, batch, sequences, mask, image_index=None, temperature=1.0, with_entropy=False):
        return TokenScores(self.lp[self.rows(batch)] * mask)


def batch(*index):
    return {"index": torch.tensor(index), "image_ids": list(index)}


def objective(**options):
    sections = rl_sections(samples=S, advantage="group", **options)
    return PolicyOptimization(WeightedSum({"table": (1.0, Table())}), NoBaseline(), **sections,
                              decode=DecodeConfig(max_length=L))  # fmt: skip


def grad_of(obj, model, *micro_batches):
    """The engine's step on these micro-batches: begin_step, then the item-weighted sum of the losses / all items."""
    model.zero_grad()
    obj.begin_step(model, list(micro_batches))
    outs = [obj(model, b) for b in micro_batches]
    total = sum(o.num_items for o in outs)
    sum(sum(o.losses.values()) * o.num_items for o in outs).backward()
    obj.end_step()
    return model.lp.grad / total, outs


# --------------------------------------------------------------------------------------------------------------------
# REINFORCE identity and aggregation
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("aggregation", "logprob", "scale"),
    [("sequence", "mean", lambda n, tokens: 1.0),  # grpo = REINFORCE with the length-normalised log p
     ("constant", "sum", lambda n, tokens: 1.0 / L),  # dr_grpo = REINFORCE with the summed log p / max length
     ("token", "sum", lambda n, tokens: n / tokens)],  # token mean = summed log p x captions / tokens
)  # fmt: skip
def test_one_iteration_without_clipping_is_reinforce_with_the_same_advantages(aggregation, logprob, scale):
    model = StandIn()
    clipped, outs = grad_of(objective(policy_loss="clipped", loss_aggregation=aggregation), model, batch(0, 1, 2, 3))
    assert (
        outs[0].metrics["ratio/min"] == outs[0].metrics["ratio/max"] == 1.0 and outs[0].metrics["clip_fraction"] == 0
    )
    reinforce, _ = grad_of(objective(policy_loss="reinforce", logprob=logprob), model, batch(0, 1, 2, 3))
    tokens = sum(LENGTH[f"c{i}_{j}"] for i in range(N_IMAGES) for j in range(S))
    assert torch.allclose(clipped, reinforce * scale(N_IMAGES * S, tokens), atol=1e-7)
    assert clipped.abs().max() > 0


@pytest.mark.parametrize("aggregation", ["sequence", "token", "constant"])
@pytest.mark.parametrize("scale_rewards", ["group", "batch"])
def test_one_or_two_micro_batches_give_the_same_gradient(aggregation, scale_rewards):
    # The engine weighs each micro-batch's loss by its num_items and divides by the step's: the token mean is that of
    # all the step's tokens, and batch statistics are those of all its images (both micro-batches rolled out first).
    kw = dict(policy_loss="clipped", loss_aggregation=aggregation, scale_rewards=scale_rewards)
    one, outs_one = grad_of(objective(**kw), StandIn(), batch(0, 1, 2, 3))
    two, outs_two = grad_of(objective(**kw), StandIn(), batch(0, 1), batch(2, 3))
    assert torch.allclose(one, two, atol=1e-7)
    if aggregation == "token":  # each micro-batch reports its own token count
        assert [o.num_items for o in outs_two] == [sum(LENGTH[f"c{i}_{j}"] for i in p for j in range(S))
                                                   for p in ((0, 1), (2, 3))]  # fmt: skip


def test_normalize_then_sum_over_two_micro_batches_uses_the_whole_steps_statistics():
    one, _ = grad_of(objective(reward_aggregation="normalize_then_sum"), StandIn(), batch(0, 1, 2, 3))
    two, _ = grad_of(objective(reward_aggregation="normalize_then_sum"), StandIn(), batch(0, 1), batch(2, 3))
    assert torch.allclose(one, two, atol=1e-7)
    alone, _ = grad_of(objective(reward_aggregation="normalize_then_sum"), StandIn(), batch(0, 1))
    assert not torch.allclose(alone[: 2 * S], one[: 2 * S], atol=1e-4)  # half the batch has other statistics


# --------------------------------------------------------------------------------------------------------------------
# Iterations
# --------------------------------------------------------------------------------------------------------------------


def sgd_step(model, lr=0.5):
    with torch.no_grad():
        model.lp -= lr * model.lp.grad


def test_iterations_reuse_the_rollout_then_roll_out_again():
    model, obj = StandIn(), objective(policy_loss="clipped", iterations=2)
    assert obj.batch_repeats == 2
    _, first = grad_of(obj, model, batch(0, 1))
    sgd_step(model)
    assert model.generated == 1 and len(obj.cycle) == 1
    _, second = grad_of(obj, model, batch(0, 1))  # the same captions, scored by the updated policy
    assert model.generated == 1 and second[0].metrics["ratio/max"] > 1.0 > second[0].metrics["ratio/min"]
    assert second[0].metrics["time/generate"] == 0.0 and obj.cycle == []  # the cycle ended
    grad_of(obj, model, batch(0, 1))
    assert model.generated == 2


def test_a_step_with_other_images_than_the_kept_rollout_rolls_out_afresh(caplog):
    model, obj = StandIn(), objective(policy_loss="clipped", iterations=3)
    grad_of(obj, model, batch(0, 1))
    grad_of(obj, model, batch(2, 3))  # mid-cycle, other images (a resume with another process count)
    assert model.generated == 2 and "the cycle restarts" in caplog.text


def test_the_kept_rollout_is_saved_and_a_restored_objective_continues_identically(tmp_path):
    model, obj = StandIn(), objective(policy_loss="clipped", iterations=3)
    grad_of(obj, model, batch(1, 2))
    sgd_step(model)
    save_tree(tmp_path, "objective", obj.state_dict())  # what a checkpoint stores (JSON + safetensors)
    restored = objective(policy_loss="clipped", iterations=3)
    restored.load_state_dict(load_tree(tmp_path, "objective"))
    twin = copy.deepcopy(model)
    a, out_a = grad_of(obj, model, batch(1, 2))
    b, out_b = grad_of(restored, twin, batch(1, 2))
    assert torch.equal(a, b) and out_a[0].losses["policy"].item() == out_b[0].losses["policy"].item()
    assert model.generated == twin.generated == 1  # neither rolled out again
    with pytest.raises(ValueError, match="step count must be in"):
        objective(policy_loss="clipped", iterations=3).load_state_dict({"policy": {"taken": 3, "cycle": []}})


class FailsOne(Table):
    """The table, but caption ``c1_1`` is not scored (as a judge that timed out: NaN and the failed mask)."""

    def __call__(self, captions, batch):
        out = super().__call__(captions, batch)
        failed = torch.tensor([c == "c1_1" for c in captions])
        total = out.total.masked_fill(failed, float("nan"))
        return RewardOutput(total, {"table": total}, failed)


def test_the_kept_rollouts_failed_captions_are_kept_and_reported_after_a_restore(tmp_path):
    def failing():
        sections = rl_sections(samples=S, advantage="group", policy_loss="clipped", iterations=3)
        return PolicyOptimization(WeightedSum({"table": (1.0, FailsOne())}), NoBaseline(), **sections,
                                  decode=DecodeConfig(max_length=L))  # fmt: skip

    model, obj = StandIn(), failing()
    grad_of(obj, model, batch(1, 2))
    save_tree(tmp_path, "objective", obj.state_dict())
    restored = failing()
    restored.load_state_dict(load_tree(tmp_path, "objective"))
    twin = copy.deepcopy(model)
    _, out_a = grad_of(obj, model, batch(1, 2))
    _, out_b = grad_of(restored, twin, batch(1, 2))
    assert out_a[0].metrics["reward/failed"] == out_b[0].metrics["reward/failed"] == pytest.approx(1 / 6)
    assert twin.generated == 1  # the restored objective went on with the kept rollout
    state = obj.state_dict()
    state["policy"]["cycle"][0]["failed"] = torch.zeros(5, dtype=torch.bool)
    with pytest.raises(ValueError, match="failed mask must be a bool tensor of its 6 captions"):
        failing().load_state_dict(state)


def test_a_kept_rollouts_failed_greedy_captions_are_failed_after_a_restore():
    # a mid-cycle resume of SCST's advantages (grpo.advantage=baseline): the kept greedy rewards (2, NaN) come back
    # with image 1's greedy caption failed, so the resumed steps count it in reward_greedy/failed and the
    # rl.alarms.greedy_failed alarm as the uninterrupted run does (until 2026-11-29: none failed after a resume)
    gen = Generation(sequences=torch.ones(2, 1, dtype=torch.long), token_logprobs=torch.zeros(2, 1),
                     lengths=torch.ones(2, dtype=torch.long), image_index=torch.arange(2), scores=torch.zeros(2),
                     texts=["a", "b"])  # fmt: skip
    greedy = RewardOutput(torch.tensor([2.0, float("nan")]), failed=torch.tensor([False, True]))
    rollout = reinforce_module.Rollout(gen, RewardOutput(torch.tensor([1.0, 3.0])), torch.tensor([2.0, 3.0]), None,
                                       greedy)  # fmt: skip
    kept = grpo_module.Prepared(torch.arange(2), rollout, torch.tensor([-1.0, 0.0]))
    restored = grpo_module.Prepared.from_state(kept.state_dict())
    assert restored.rollout.greedy_rewards.failed_mask().tolist() == [False, True]


@pytest.mark.parametrize("aggregation", ["sequence", "token", "constant"])
@pytest.mark.parametrize("importance", ["token", "sequence"])
def test_a_failed_caption_gets_no_kl_gradient_and_counts_in_no_kl_or_clip_fraction(aggregation, importance):
    """Caption c1_1 (row 4 of the stand-in) is not scored. Moved off the reference, the policy gets the KL term's
    gradient on every caption; the failed caption's row gets none, and ``kl`` / ``clip_fraction`` are the
    scored tokens' means. Until 2026-11-29 the KL term's gradient reached it and it counted in both averages."""

    def failing():
        sections = rl_sections(samples=S, advantage="group", policy_loss="clipped", kl_coef=0.5,
                               loss_aggregation=aggregation, importance=importance)  # fmt: skip
        return PolicyOptimization(WeightedSum({"table": (1.0, FailsOne())}), NoBaseline(), **sections,
                                  decode=DecodeConfig(max_length=L))  # fmt: skip

    model, obj = StandIn(), failing()
    grad_of(obj, model, batch(1, 2))  # the first rollout captures the reference
    with torch.no_grad():
        model.lp -= 0.3  # every caption off the reference (image 1's rewards are equal: no update moves it)
    grad, (out,) = grad_of(obj, model, batch(1, 2))
    assert grad[4].abs().sum().item() == 0.0  # the failed caption: no gradient at all
    assert grad[3].abs().sum().item() > 0 and grad[5].abs().sum().item() > 0  # its scored group mates: the KL's
    # the metrics by hand, over the scored captions' tokens only (rows 3..8 are images 1 and 2; row 4 failed)
    mask = torch.tensor([[t < LENGTH[c] for t in range(L)] for c in [f"c{i}_{j}" for i in (1, 2) for j in range(S)]])
    logp = model.lp.detach()[3:9] * mask
    ref = obj.reference.logprobs(model, batch(1, 2), model.generate(batch(1, 2), None))
    d = ref - logp
    kl = torch.exp(d) - d - 1  # ratio 1 at the cycle's first step: the bias correction changes nothing
    keep = mask.clone()
    keep[1] = False
    assert out.metrics["kl"] == pytest.approx(float(kl[keep].mean()), rel=1e-6)
    assert out.metrics["clip_fraction"] == 0.0
    assert obj.monitor.step_kl == pytest.approx(float(kl[keep].mean()), rel=1e-6)
    # the denominators are those of every caption: the loss is the mean with the failed caption's terms 0
    items = float(mask.sum()) if aggregation == "token" else 6.0
    assert out.num_items == items


class EntropyStandIn(StandIn):
    """:class:`StandIn` whose captions' token entropies are a parameter ``h`` (images x S, L) too (0 at padding)."""

    def __init__(self):
        super().__init__()
        self.h = torch.nn.Parameter(torch.rand(N_IMAGES * S, L, generator=torch.Generator().manual_seed(1)) + 0.5)

    def forward(self, batch, sequences, mask, image_index=None, temperature=1.0, with_entropy=False):
        rows = self.rows(batch)
        return TokenScores(self.lp[rows] * mask, self.h[rows] * mask if with_entropy else None)


@pytest.mark.parametrize("loss", ["reinforce", "sequence", "token"])
def test_a_failed_caption_is_out_of_the_entropy_bonus_and_the_logged_entropy(loss):
    """Caption c1_1 (row 4 of the stand-in) is not scored. The ``rl.entropy_coef`` bonus by hand: the scored
    captions' token means over every caption (6; under the token mean their tokens over every token), so the failed
    caption takes no gradient from it; ``entropy`` is the token mean over the scored captions' tokens alone, whatever
    the loss's aggregation (TRL's logged ``entropy``). REINFORCE (the family's defaults), GRPO's clipped loss with the
    sequence and the token mean. Until 2026-11-29 the bonus covered the failed caption (a gradient on its row) and
    ``entropy`` counted it, and under REINFORCE and the sequence mean ``entropy`` was the mean of the captions'
    token means (4.8 % above the token mean here)."""
    coef = 0.5
    if loss == "reinforce":
        obj = Reinforce(WeightedSum({"table": (1.0, FailsOne())}), NoBaseline(), decode=DecodeConfig(max_length=L),
                        rl=rl_sections(samples=S, entropy_coef=coef)["rl"])  # fmt: skip
    else:
        sections = rl_sections(samples=S, advantage="group", policy_loss="clipped", loss_aggregation=loss,
                               entropy_coef=coef)  # fmt: skip
        obj = PolicyOptimization(WeightedSum({"table": (1.0, FailsOne())}), NoBaseline(), **sections,
                                 decode=DecodeConfig(max_length=L))  # fmt: skip
    model = EntropyStandIn()
    out = obj(model, batch(1, 2))  # rows 3..8: images 1 and 2
    out.losses["entropy"].backward()
    captions = [f"c{i}_{j}" for i in (1, 2) for j in range(S)]
    h = model.h.detach()[3:9].tolist()
    scored = [n for n, c in enumerate(captions) if c != "c1_1"]
    tokens = sum(LENGTH[c] for c in captions)  # 17: every caption's, the failed one's included
    want = torch.zeros_like(model.h)
    total = sum(h[n][t] for n in scored for t in range(LENGTH[captions[n]]))
    logged = total / sum(LENGTH[captions[n]] for n in scored)  # every loss: the scored captions' token mean
    if loss == "token":
        bonus = total / tokens
        for n in scored:
            want[3 + n, : LENGTH[captions[n]]] = -coef / tokens
    else:
        means = {n: sum(h[n][: LENGTH[captions[n]]]) / LENGTH[captions[n]] for n in scored}
        bonus = sum(means.values()) / 6
        for n in scored:
            want[3 + n, : LENGTH[captions[n]]] = -coef / 6 / LENGTH[captions[n]]
    assert out.losses["entropy"].item() == pytest.approx(-coef * bonus, rel=1e-6)
    assert out.metrics["entropy"] == pytest.approx(logged, rel=1e-6)
    assert model.h.grad[4].abs().sum().item() == 0.0  # the failed caption: no gradient from the bonus
    assert torch.allclose(model.h.grad, want, rtol=1e-6, atol=0.0)


@pytest.mark.parametrize("importance", ["token", "sequence"])
def test_the_logged_ratios_are_over_the_scored_captions_tokens(importance):
    """At the second step of a cycle, each caption's log-probs moved by its own amount since the rollout, the failed
    caption c1_1 (row 4) the most: ``ratio/*`` by hand over the scored captions' tokens (token importance: a mean
    over their tokens; GSPO's sequence importance: over the captions). Until 2026-11-29 they covered the failed
    caption, whose weight the loss never applies: ``ratio/max`` was its e^1."""
    sections = rl_sections(samples=S, advantage="group", policy_loss="clipped", iterations=2, importance=importance)
    obj = PolicyOptimization(WeightedSum({"table": (1.0, FailsOne())}), NoBaseline(), **sections,
                             decode=DecodeConfig(max_length=L))  # fmt: skip
    model = StandIn()
    grad_of(obj, model, batch(1, 2))  # the cycle's first step: the rollout's log-probs are the policy's
    moved = {3: 0.1, 4: 1.0, 5: -0.2, 6: 0.3, 7: -0.4, 8: 0.2}  # row: its log-ratio at every token
    with torch.no_grad():
        for row, d in moved.items():
            model.lp[row] += d
    _, (out,) = grad_of(obj, model, batch(1, 2))
    captions = {3 + n: f"c{i}_{j}" for n, (i, j) in enumerate((i, j) for i in (1, 2) for j in range(S))}
    scored = [row for row in moved if captions[row] != "c1_1"]
    weights = [math.exp(moved[row]) for row in scored]
    if importance == "token":
        counts = [LENGTH[captions[row]] for row in scored]
        mean = sum(w * n for w, n in zip(weights, counts, strict=True)) / sum(counts)
    else:
        mean = sum(weights) / len(weights)
    assert out.metrics["ratio/mean"] == pytest.approx(mean, rel=1e-6)
    assert out.metrics["ratio/min"] == pytest.approx(math.exp(-0.4), rel=1e-6)
    assert out.metrics["ratio/max"] == pytest.approx(math.exp(0.3), rel=1e-6)  # not the failed caption's e^1


def test_a_micro_batch_of_failed_captions_only_has_no_kl_or_clip_fraction():
    class FailsAll(Table):
        def __call__(self, captions, batch):
            failed = torch.ones(len(captions), dtype=torch.bool)
            total = torch.full((len(captions),), float("nan"))
            return RewardOutput(total, {"table": total}, failed)

    sections = rl_sections(samples=S, advantage="group", policy_loss="clipped", kl_coef=0.5)
    obj = PolicyOptimization(WeightedSum({"table": (1.0, FailsAll())}), NoBaseline(), **sections,
                             decode=DecodeConfig(max_length=L))  # fmt: skip
    model = StandIn()
    grad_of(obj, model, batch(1))
    grad, (out,) = grad_of(obj, model, batch(1))
    assert grad.abs().sum().item() == 0.0
    assert math.isnan(out.metrics["kl"]) and math.isnan(out.metrics["clip_fraction"])  # nothing defined: left out
    assert all(math.isnan(out.metrics[f"ratio/{stat}"]) for stat in ("mean", "min", "max"))  # no weight applied
    assert obj.monitor.step_kl is None  # no scored token: the step has no KL (logged: the micro-batches' NaN)


# --------------------------------------------------------------------------------------------------------------------
# Factory
# --------------------------------------------------------------------------------------------------------------------


def test_the_defaults_build_the_papers_reinforce_and_options_the_policy_objective():
    assert type(get_objective("reinforce", load())) is Reinforce
    assert type(get_objective("reinforce", load(None, ["grpo.advantage=group"]))) is PolicyOptimization
    assert type(get_objective("reinforce", load(None, ["grpo.policy_loss=clipped"]))) is PolicyOptimization
    grpo = get_objective("reinforce", load(None, ["grpo.advantage=group", "rl.baseline=greedy"]))
    assert isinstance(grpo.baseline, NoBaseline)  # the group mean is the baseline: no greedy decoding
    with pytest.raises(ValueError, match="grpo.advantage=group: train.objective=sle is REINFORCE only"):
        get_objective("sle", load(None, ["grpo.advantage=group"]))


# --------------------------------------------------------------------------------------------------------------------
# The reference policy on a tiny ClipCap
# --------------------------------------------------------------------------------------------------------------------

D = 16
REFS = {0: ["a red circle on grass", "a small red circle"], 1: ["a blue square on the sand", "a big blue square"]}


def tiny_captioner(seed=0):
    torch.manual_seed(seed)
    lm, tok = build_world_lm(layers=1, hidden=32, heads=2, dropout=0.0)
    return ClipCap(lm, tok, D, ClipCapBackboneConfig(prefix_length=2))


class Words:
    """A reward with signal on a random captioner: the caption's number of words."""

    def __call__(self, captions, batch):
        total = torch.tensor([float(len(c.split())) for c in captions])
        return RewardOutput(total, {"words": total})


def kl_objective(*overrides):
    cfg = load(None, ["grpo.advantage=group", "rl.samples=3", "grpo.policy_loss=clipped", "grpo.kl_coef=0.5",
                      *overrides])  # fmt: skip
    return PolicyOptimization(WeightedSum({"words": (1.0, Words())}), NoBaseline(), rl=cfg.rl, grpo=cfg.grpo,
                              decode=DecodeConfig(max_length=6))  # fmt: skip


def clip_batch():
    g = torch.Generator().manual_seed(1)
    return {"features": torch.randn(2, D, generator=g), "image_ids": [0, 1], "references": list(REFS.values()),
            "index": torch.tensor([0, 1])}  # fmt: skip


def policy_steps(model, obj, steps, lr=3e-2):
    return train_steps(model, obj, clip_batch, steps, lr)


def test_kl_is_zero_at_step_zero_and_positive_after_a_step():
    model = tiny_captioner().train()
    outs = policy_steps(model, kl_objective(), 3)
    assert outs[0].metrics["kl"] == pytest.approx(0.0, abs=1e-7)  # the reference is the policy itself, no dropout
    assert outs[1].metrics["kl"] > 1e-4 and outs[2].metrics["kl"] > 1e-4


def test_the_kl_term_and_the_clip_fraction_by_hand():
    """One caption of one token, advantage 0, logp = -1, the reference's -2: k3 = e^(ref - logp) - (ref - logp) - 1
    = e^-1 = 0.367879, beta = 0.5 (the TRL comparison checks these only in the slow suite)."""

    def loss_and_grad(correction: bool, old: float, adv: float = 0.0):
        obj = kl_objective(f"grpo.kl_bias_correction={str(correction).lower()}")
        logp = torch.tensor([[-1.0]], requires_grad=True)
        item = SimpleNamespace(old=torch.tensor([[old]]), ref=torch.tensor([[-2.0]]))
        loss, _, metrics = obj.clipped_loss(logp, item, torch.tensor([adv]), torch.ones(1, 1, dtype=torch.bool))
        (grad,) = torch.autograd.grad(loss, logp)
        return float(loss.detach()), float(grad), metrics

    k3, d_k3 = math.exp(-1), 1 - math.exp(-1)  # and d k3 / d logp
    loss, grad, metrics = loss_and_grad(False, old=-1.0)
    assert (loss, grad, metrics["kl"]) == (pytest.approx(0.5 * k3), pytest.approx(0.5 * d_k3), pytest.approx(k3))
    # TRL's bias correction: k3 times the ratio e^(logp - old) = e^0.5, its gradient through the ratio too
    ratio = math.exp(0.5)
    loss, grad, _ = loss_and_grad(True, old=-1.5)
    assert (loss, grad) == (pytest.approx(0.5 * k3 * ratio), pytest.approx(0.5 * ratio * (d_k3 + k3)))
    # clip_fraction: a ratio of e^0.5 = 1.65 beyond 1 + 0.2, a positive advantage: clipped; a negative one: not
    assert loss_and_grad(True, old=-1.5, adv=1.0)[2]["clip_fraction"] == 1.0
    assert loss_and_grad(True, old=-1.5, adv=-1.0)[2]["clip_fraction"] == 0.0


def test_the_reference_scores_at_the_policys_temperature():
    # rl.scaled_logprob scores the policy at rl.temperature: the reference too, so the KL starts at 0 at T != 1
    outs = policy_steps(tiny_captioner().train(), kl_objective("rl.temperature=0.5", "rl.scaled_logprob=true"), 1)
    assert outs[0].metrics["kl"] == pytest.approx(0.0, abs=1e-7)


def test_under_lora_the_reference_is_the_base_model_with_no_copy_of_the_adapters():
    model = tiny_captioner()
    base = copy.deepcopy(model).eval()  # the captioner before any adapter: the policy at the start
    model = lora.configure_training(model, load(None, ["lora.lm=true", "lora.rank=4", "lora.alpha=8"])).train()
    obj = kl_objective()
    policy_steps(model, obj, 3, lr=5e-2)
    ref = obj.reference
    assert ref.adapters_off and ref.snapshot  # the mapper trains fully: its start values are kept, the adapters not
    assert not any(lora.is_adapter_parameter(n) for n in ref.snapshot)
    assert all(n.startswith("mapper.") for n in ref.snapshot), sorted(ref.snapshot)
    assert not lora.adapters_are_identity(model)  # the adapters did learn
    gen = model.generate(clip_batch()["features"], DecodeConfig(strategy="sample", num_return_sequences=3,
                                                                 max_length=6))  # fmt: skip
    kw = dict(sequences=gen.sequences, mask=gen.mask, image_index=gen.image_index)
    theirs = ref.logprobs(model, clip_batch(), gen)
    with torch.no_grad():
        want = base(clip_batch(), **kw).logprobs
        now = model.eval()(clip_batch(), **kw).logprobs
    assert torch.allclose(theirs, want, atol=1e-6)
    assert not torch.allclose(now, want, atol=1e-3)  # the policy itself moved away


def test_the_reference_pass_is_timed_in_time_reference_alone(monkeypatch, tmp_path):
    """With ``grpo.kl_coef > 0`` each micro-batch's rollout logs the seconds of its reference pass as
    ``time/reference`` (a step sum, as every ``time/*``), in neither ``time/generate`` nor ``time/reward``; 0 at the
    cycle's next step, also resumed from a checkpoint mid-cycle; no key without the KL. A fake clock that only the
    reference pass moves (0.25 s each) makes the seconds exact. Until 2026-11-29 no ``time/*`` held them."""
    clock = [0.0]
    fake = SimpleNamespace(perf_counter=lambda: clock[0])
    for module in (grpo_module, reinforce_module, rollouts_module):
        monkeypatch.setattr(module, "time", fake, raising=False)  # each reads time.perf_counter()
    obj, model = objective(policy_loss="clipped", kl_coef=0.5, iterations=2), StandIn()
    passes = []
    real = obj.reference.logprobs

    def reference_pass(*args, **kwargs):
        clock[0] += 0.25
        passes.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(obj.reference, "logprobs", reference_pass)
    _, first = grad_of(obj, model, batch(0), batch(1))
    assert len(passes) == 2 and step_sum("time/reference")  # one pass per micro-batch; the step logs their sum
    for out in first:
        assert out.metrics["time/reference"] == 0.25
        assert out.metrics["time/generate"] == out.metrics["time/reward"] == 0.0
    save_tree(tmp_path, "objective", obj.state_dict())
    _, second = grad_of(obj, model, batch(0), batch(1))
    assert len(passes) == 2 and [o.metrics["time/reference"] for o in second] == [0.0, 0.0]
    restored = objective(policy_loss="clipped", kl_coef=0.5, iterations=2)
    restored.load_state_dict(load_tree(tmp_path, "objective"))  # the kept rollout has no seconds
    _, resumed = grad_of(restored, copy.deepcopy(model), batch(0), batch(1))
    assert [o.metrics["time/reference"] for o in resumed] == [0.0, 0.0]
    _, (plain,) = grad_of(objective(policy_loss="clipped"), StandIn(), batch(0))
    assert "time/reference" not in plain.metrics and "time/generate" in plain.metrics


def test_the_reference_is_kept_in_the_state(tmp_path):
    model = tiny_captioner().train()
    obj = kl_objective()
    policy_steps(model, obj, 1)
    save_tree(tmp_path, "objective", obj.state_dict())
    restored = kl_objective()
    restored.load_state_dict(load_tree(tmp_path, "objective"))
    assert restored.reference.captured and restored.reference.snapshot.keys() == obj.reference.snapshot.keys()
    for name, value in obj.reference.snapshot.items():
        assert torch.equal(restored.reference.snapshot[name], value)
    with pytest.raises(ValueError, match="two flags and a mapping"):
        restored.reference.load_state_dict({"captured": 1, "adapters_off": False, "snapshot": {}})


@pytest.mark.parametrize(
    ("field", "bad", "message"),
    [("sequences", lambda t: t.float(), "sequences must be an"),
     ("old", lambda t: t[:, :2], "'old' must have the shape"),
     ("ref", lambda t: torch.zeros(1), "'ref' must have the shape"),
     ("advantages", lambda t: t[:-1], "must be tensors of its 6 captions"),
     ("texts", lambda t: t[:-1], "texts must be 6 strings"),
     ("parts", lambda t: {"table": torch.zeros(2)}, "reward parts must be"),
     ("index", lambda t: t.reshape(1, -1), "image indices must be a vector")],
)  # fmt: skip
def test_a_tampered_kept_rollout_is_refused(field, bad, message):
    model, obj = StandIn(), objective(policy_loss="clipped", iterations=3)
    grad_of(obj, model, batch(1, 2))
    state = obj.state_dict()
    kept = state["policy"]["cycle"][0]
    kept["ref"] = torch.zeros_like(kept["old"])
    kept[field] = bad(kept[field])
    with pytest.raises(ValueError, match=message):
        objective(policy_loss="clipped", iterations=3).load_state_dict(state)


def test_a_reference_copy_under_fsdp2_sharding_is_refused_naming_the_option(monkeypatch):
    from finecap.models import sharding

    monkeypatch.setattr(sharding, "is_sharded", lambda model: True)  # as FSDP2 leaves a captioner
    model = tiny_captioner().train()
    with pytest.raises(
        ValueError, match=r"^grpo.kl_coef: the reference policy needs a copy of \d+ trained parameters"
    ):
        policy_steps(model, kl_objective(), 1)
    lora_only = lora.configure_training(tiny_captioner(), load(None, ["lora.lm=true", "lora.rank=4"]))
    for name, p in lora_only.named_parameters():  # adapters alone learn: their reference is the adapters off
        p.requires_grad_(lora.is_adapter_parameter(name))
    obj = kl_objective()
    policy_steps(lora_only.train(), obj, 1)
    assert obj.reference.adapters_off and not obj.reference.snapshot


# --------------------------------------------------------------------------------------------------------------------
# Captions a reward could not score
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class Scored(RewardOutput):
    """A reward's values with the captions it could not score (``RewardOutput.failed``, as judge rewards give it)."""

    failed: torch.Tensor | None = None


class FailingTable(Table):
    """:class:`Table`, except that it cannot score caption 1 of image 0 (``c0_1``)."""

    def __call__(self, captions, batch):
        out = super().__call__(captions, batch)
        return Scored(out.total, out.parts, failed=torch.tensor([c == "c0_1" for c in captions]))


def test_a_failed_caption_takes_no_gradient_is_logged_and_sounds_its_alarm():
    sections = rl_sections(samples=S, advantage="group", alarms={"failed": 0.1}, alarm_action="stop")
    obj = PolicyOptimization(FailingTable(), NoBaseline(), **sections, decode=DecodeConfig(max_length=L))
    model = StandIn()
    obj.begin_step(model, [batch(0, 1)])
    out = obj(model, batch(0, 1))
    # image 0 over its scored (1, 6): (-2.5, 0, 2.5) / (sqrt(12.5) + eps); image 1 (4, 4, 4): 0
    s0 = math.sqrt(12.5) + 1e-4
    assert obj.cycle[0].advantages.tolist() == pytest.approx([-2.5 / s0, 0.0, 2.5 / s0, 0.0, 0.0, 0.0], rel=1e-6)
    out.losses["reinforce"].backward()
    assert model.lp.grad[1].abs().sum().item() == 0.0  # the failed caption's row
    assert out.metrics["reward/failed"] == pytest.approx(1 / 6)
    with pytest.raises(RewardHackingAlarm, match=r"share of captions a reward could not score \(rl.alarms.failed\)"):
        obj.end_step()  # 1/6 > 0.1


class FailingOnlyWhenFailed(Table):
    """:class:`FailingTable` whose ``failed`` is ``None`` where no caption failed, as the reward server's client
    (:func:`finecap.serve.client`) and any reward may give it (``RewardOutput.failed``: ``None`` or a mask)."""

    def __call__(self, captions, batch):
        out = super().__call__(captions, batch)
        failed = torch.tensor([c == "c0_1" for c in captions])
        return Scored(out.total, out.parts, failed=failed if bool(failed.any()) else None)


def test_the_failed_alarm_reads_the_share_of_every_caption_of_the_step():
    # two micro-batches of 6 captions, one failed in the first, none in the second (failed None): 1/12. The alarm
    # read the share over the micro-batches whose reward gave a mask (1/6) until 2026-12, and stopped at 0.1.
    for threshold, sounds in ((0.1, False), (0.05, True)):
        sections = rl_sections(samples=S, advantage="group", alarms={"failed": threshold}, alarm_action="stop")
        obj = PolicyOptimization(FailingOnlyWhenFailed(), NoBaseline(), **sections, decode=DecodeConfig(max_length=L))
        model = StandIn()
        obj.begin_step(model, [batch(0, 1), batch(2, 3)])
        obj(model, batch(0, 1)), obj(model, batch(2, 3))
        if not sounds:
            obj.end_step()  # 1/12 <= 0.1: nothing sounds
            continue
        with pytest.raises(RewardHackingAlarm, match=r"rl.alarms.failed\) is 0.08333, above its threshold 0.05"):
            obj.end_step()


class FailingFirst(Table):
    """:class:`Table` that cannot score caption 0 of image 2 (``c2_0``, reward 0): the others of image 2 are (3, 3).
    Its total keeps the number there, as a reward of its own may (only :class:`WeightedSum` writes NaN)."""

    def __call__(self, captions, batch):
        out = super().__call__(captions, batch)
        return Scored(out.total, out.parts, failed=torch.tensor([c == "c2_0" for c in captions]))


def test_zero_std_groups_skips_the_failed_captions_of_a_reward_used_alone():
    # images 2 (0 failed, 3, 3) and 3 (5, 1, 0): image 2's scored captions agree, a group without signal, as its
    # advantages say (all 0). zero_std_groups read the failed caption's 0 and counted no such group.
    sections = rl_sections(samples=S, advantage="group")
    obj = PolicyOptimization(FailingFirst(), NoBaseline(), **sections, decode=DecodeConfig(max_length=L))
    model = StandIn()
    obj.begin_step(model, [batch(2, 3)])
    out = obj(model, batch(2, 3))
    assert obj.cycle[0].advantages[:3].tolist() == [0.0, 0.0, 0.0]
    assert out.metrics["zero_std_groups"] == 0.5


def test_the_failed_alarm_is_a_share_and_a_reward_without_failures_logs_none():
    with pytest.raises(ConfigError) as e:
        load(None, ["rl.alarms={failed: 1.5}"])
    assert e.value.key == "rl.alarms.failed"
    out = objective()(StandIn(), batch(0, 1))
    assert "reward/failed" not in out.metrics


# --------------------------------------------------------------------------------------------------------------------
# Copies: an epoch's last global batch repeated to fill the step's micro-batches
# --------------------------------------------------------------------------------------------------------------------


class Wordy(StandIn):
    """:class:`StandIn` whose image 0's captions are long and loop (``c0_j a red circle a red circle``), so that a
    caption counted twice moves the length, the repetition and the distinct share."""

    def generate(self, batch, cfg, seeds=None):
        gen = super().generate(batch, cfg, seeds)
        loop = " a red circle a red circle"
        texts = [t + loop if t.startswith("c0_") else t for t in gen.texts]
        return dataclasses.replace(gen, texts=texts)


class FailingWordyTable(FailingTable):
    """:class:`FailingTable` of :class:`Wordy`'s captions (by their first word)."""

    def __call__(self, captions, batch):
        return super().__call__([c.split()[0] for c in captions], batch)


def step_batch(*index, copy=False, step=0):
    """:func:`batch` with the engine's ``step_info`` (a global batch of images 0 and 1); ``copy``: the micro-batch
    repeats another's examples (``finecap.data.samplers.repeated_micro_batches``)."""
    return {**batch(*index), "step_info": StepInfo(step, [0, 1], copy=copy)}


def test_a_copy_micro_batch_counts_in_no_monitor_measure():
    # A last global batch of images 0 and 1 cut into 3 micro-batches: [0], [1] and a copy of [0], which the engine
    # weights 0. The monitor counted the copy's captions: image 0's failed caption twice (a failed share of 2/9 for
    # 1/6, above the alarm's 0.2), its long looping captions twice (length, repetition, distinct) and its KL twice.
    # Every measure must be that of the two real micro-batches.
    def monitored(micro_batches):
        sections = rl_sections(samples=S, advantage="group", policy_loss="clipped", kl_coef=0.5,
                               alarms={"failed": 0.2}, alarm_action="stop")  # fmt: skip
        obj = PolicyOptimization(FailingWordyTable(), NoBaseline(), **sections, decode=DecodeConfig(max_length=L))
        model = Wordy()
        obj.reference.capture(model)  # the start; then a policy that moved away from it, by image
        with torch.no_grad():
            model.lp.add_(torch.arange(N_IMAGES * S).unsqueeze(1) * 0.1)
        obj.begin_step(model, micro_batches)
        outs = [obj(model, b) for b in micro_batches]
        values = obj.monitor.step_values()
        obj.end_step()  # 1/6 < 0.2: nothing sounds
        return values, outs, obj

    real, _, real_obj = monitored([step_batch(0), step_batch(1)])
    with_copy, outs, obj = monitored([step_batch(0), step_batch(1), step_batch(0, copy=True)])
    assert set(real) == {"length_drift", "repetition", "distinct", "failed"}
    assert with_copy == pytest.approx(real) and real["failed"] == pytest.approx(1 / 6)
    assert real["repetition"] > 0 and real["distinct"] == 1.0
    # the logged share and the step's token means, the KL the kl alarm reads among them (the copy's tokens left out:
    # image 0's KL differs from image 1's, and counted twice it would move the step's)
    logged = real_obj.step_values()
    clip_ratios = {f"clip_ratio/{name}" for name in ("low_mean", "high_mean", "region_mean", "low_min", "high_max")}
    captions = {"reward", "baseline", "logprob", "sample_words", "advantage_std"}  # the step's values over captions
    groups = {"distinct_samples", "zero_std_groups"}  # and over images
    assert set(logged) == {"reward/failed", "kl", "clip_fraction", "ratio/mean", *clip_ratios, *captions, *groups}
    assert logged["distinct_samples"] == real["distinct"]  # the distinct alarm's measure
    assert logged["kl"] > 0
    assert logged["reward/failed"] == pytest.approx(1 / 6) and real_obj.monitor.step_kl == logged["kl"]
    assert obj.step_values() == pytest.approx(logged) and obj.monitor.step_kl == pytest.approx(logged["kl"])
    assert "reward/failed" in outs[2].metrics  # the copy's own values, which the engine leaves out of the log
    # a process whose every micro-batch is a copy measures nothing, and an alarm the others' captions sound there
    # still names the step
    obj = PolicyOptimization(FailingWordyTable(), NoBaseline(), **rl_sections(samples=S, advantage="group"),
                             decode=DecodeConfig(max_length=L))  # fmt: skip
    only = step_batch(0, copy=True, step=4)
    obj.begin_step(model := Wordy(), [only])
    obj(model, only)
    assert obj.monitor.step_values() == {} and obj.monitor.step == 5


@pytest.mark.parametrize("options", [{"scale_rewards": "batch"}, {"reward_aggregation": "normalize_then_sum"}])
@pytest.mark.parametrize("reward", [Table, FailingTable])
def test_a_copy_micro_batch_counts_in_no_batch_statistic(options, reward):
    # A last global batch of images 0 and 1 cut into 3 micro-batches: [0], [1] and a copy of [0]. The batch std of
    # scale_rewards=batch and GDPO's batch mean and std counted the copy's captions (image 0's three rewards twice),
    # so the real captions' advantages, and the step's gradient, were not those of the batch itself. With a caption
    # a reward could not score (FailingTable: c0_1) the statistics run over the scored captions only.
    def advantages(micro_batches):
        sections = rl_sections(samples=S, advantage="group", **options)
        obj = PolicyOptimization(WeightedSum({"table": (1.0, reward())}), NoBaseline(), **sections,
                                 decode=DecodeConfig(max_length=L))  # fmt: skip
        obj.begin_step(StandIn(), micro_batches)
        return [p.advantages for p in obj.cycle]

    real = advantages([step_batch(0), step_batch(1)])
    with_copy = advantages([step_batch(0), step_batch(1), step_batch(0, copy=True)])
    assert torch.equal(torch.cat(with_copy[:2]), torch.cat(real)) and real[0].abs().max() > 0.5
    assert torch.equal(with_copy[2], real[0])  # the copy's: those of the captions it repeats (weighted 0 anyway)
    alone = advantages([step_batch(0)])  # the statistics do depend on the batch: image 1's rewards count
    assert not torch.allclose(alone[0], real[0], atol=1e-3)


# what process 1's captions (image 1: rewards 4, 4, 4) add to the batch statistics: their rewards
# (scale_rewards=batch), or their group-normalised sum (GDPO: a constant group, all 0)
@pytest.mark.parametrize(
    ("options", "others"),
    [({"scale_rewards": "batch"}, [4.0, 4.0, 4.0]), ({"reward_aggregation": "normalize_then_sum"}, [0.0, 0.0, 0.0])],
)
def test_a_process_whose_other_micro_batch_is_a_copy_adds_only_its_real_one_to_the_batch_statistics(options, others):
    # 2 processes x 2 accumulation steps, a last global batch of images 0 and 1: process 0 runs [0] and a copy of
    # [0], process 1 [1] and a copy of [1]. Process 0's reductions are emulated: each adds process 1's sum of the
    # same statistic over its real captions (the count, the sum, then the squares about the global mean).
    sections = rl_sections(samples=S, advantage="group", **options)
    other = torch.tensor(others)
    global_mean = {}

    def with_process_1(t):
        if t.numel() == 2:  # (sum, count)
            total = t + torch.stack([other.sum(), torch.tensor(float(other.numel()))])
            global_mean["value"] = total[0] / total[1]
            return total
        return t + ((other - global_mean["value"]) ** 2).sum()

    def cycle(micro_batches, reduce=None):
        obj = PolicyOptimization(WeightedSum({"table": (1.0, Table())}), NoBaseline(), **sections,
                                 decode=DecodeConfig(max_length=L))  # fmt: skip
        if reduce is not None:
            obj.reduce = reduce
        obj.begin_step(StandIn(), micro_batches)
        return [p.advantages for p in obj.cycle]

    whole = cycle([step_batch(0), step_batch(1)])  # the global batch on one process
    process_0 = cycle([step_batch(0), step_batch(0, copy=True)], with_process_1)
    assert torch.allclose(process_0[0], whole[0], atol=1e-6) and torch.allclose(process_0[1], whole[0], atol=1e-6)
    assert whole[0].abs().max() > 0.5


@pytest.mark.parametrize("policy", [False, True])
def test_a_copy_micro_batch_counts_in_no_running_mean(policy):
    # The running-mean baseline (rl.baseline=mean, DiscriTune's) of a step of images 0 and 1 cut into [0], [1] and a
    # copy of [0]: it summed the copy's rewards too, a mean of (9 + 12 + 9) / 9 captions for the step's 21 / 6 = 3.5,
    # and the next steps' advantages moved with it. REINFORCE calls it per micro-batch; the GRPO family's
    # grpo.advantage=baseline in begin_step's rollout of the whole step.
    def next_advantages(micro_batches):
        sections = rl_sections(samples=S, policy_loss="clipped")
        if not policy:
            del sections["grpo"]
        kind = PolicyOptimization if policy else Reinforce
        obj = kind(WeightedSum({"table": (1.0, Table())}), MeanBaseline(sections["rl"]), **sections,
                   decode=DecodeConfig(max_length=L))  # fmt: skip
        model = StandIn()
        obj.begin_step(model, micro_batches)
        for b in micro_batches:
            obj(model, b)
        obj.end_step()
        return obj.baseline.mean, obj.rollout(model, step_batch(2, step=1))[0].advantage

    real = next_advantages([step_batch(0), step_batch(1)])
    with_copy = next_advantages([step_batch(0), step_batch(1), step_batch(0, copy=True)])
    assert real[0] == with_copy[0] == pytest.approx(3.5)  # (1 + 2 + 6 + 4 + 4 + 4) / 6
    assert torch.equal(with_copy[1], real[1]) and real[1].tolist() == [-3.5, -0.5, -0.5]  # image 2: (0, 3, 3)


def test_the_logged_advantage_values_leave_out_a_failed_captions_placeholder_zero():
    # image 0's rewards (1, 2, 6) with c0_2 failed: its group is (1, 2), advantages -/+ 1/sqrt(2); image 1's
    # (4, 4, 4) are all 0. c0_2's placeholder 0 counted in the logged spread until 2026-11-29 (0.447 for 0.5)
    class FailsC02(Table):
        def __call__(self, captions, batch):
            out = super().__call__(captions, batch)
            failed = torch.tensor([c == "c0_2" for c in captions])
            total = out.total.masked_fill(failed, float("nan"))
            return RewardOutput(total, {"table": total}, failed)

    sections = rl_sections(samples=S, advantage="group")
    obj = PolicyOptimization(WeightedSum({"table": (1.0, FailsC02())}), NoBaseline(), **sections,
                             decode=DecodeConfig(max_length=L))  # fmt: skip
    _, (out,) = grad_of(obj, StandIn(), batch(0, 1))
    a = 0.5 / (math.sqrt(0.5) + 1e-4)  # +/- 0.5 over the group's std plus GRPO's eps
    assert out.metrics["advantage/min"] == pytest.approx(-a, rel=1e-6)
    assert out.metrics["advantage/max"] == pytest.approx(a, rel=1e-6)
    assert out.metrics["advantage_std"] == pytest.approx(a / math.sqrt(2), rel=1e-6)  # of (-a, a, 0, 0, 0)


def test_a_lone_scored_caption_of_a_group_has_no_advantage_to_log_or_learn_from():
    # image 0's c0_1 and c0_2 failed: c0_0 is its group's only scored caption, nothing to compare it with, and its
    # advantage a placeholder 0, as a failed caption's. Image 2 (0, 3, 3): (-2, 1, 1) / (sqrt(3) + eps). Until
    # 2026-11-29 the placeholder counted in the logged spread (0.816 for 1.0) and as a caption
    # with a signal (ObjectiveOutput.scored 4: a step of such captions alone was taken, its gradient 0)
    class FailsC01C02(Table):
        def __call__(self, captions, batch):
            out = super().__call__(captions, batch)
            failed = torch.tensor([c in ("c0_1", "c0_2") for c in captions])
            total = out.total.masked_fill(failed, float("nan"))
            return RewardOutput(total, {"table": total}, failed)

    sections = rl_sections(samples=S, advantage="group")
    obj = PolicyOptimization(WeightedSum({"table": (1.0, FailsC01C02())}), NoBaseline(), **sections,
                             decode=DecodeConfig(max_length=L))  # fmt: skip
    model = StandIn()
    obj.begin_step(model, [batch(0, 2)])
    out = obj(model, batch(0, 2))
    a = 1.0 / (math.sqrt(3.0) + 1e-4)
    assert obj.cycle[0].advantages.tolist() == pytest.approx([0.0, 0.0, 0.0, -2 * a, a, a], rel=1e-6)
    assert out.scored == 3  # image 2's captions
    assert out.metrics["advantage/min"] == pytest.approx(-2 * a, rel=1e-6)
    assert out.metrics["advantage/max"] == pytest.approx(a, rel=1e-6)
    assert out.metrics["advantage_std"] == pytest.approx(a * math.sqrt(3.0), rel=1e-6)  # of (-2a, a, a): var 3a^2


def test_the_logged_advantage_std_and_zero_std_groups_are_the_steps_over_every_group():
    # micro-batches of images (0, 1) and (2): rewards (1, 2, 6), (4, 4, 4), (0, 3, 3); group advantages with TRL's
    # std: k0 (-2, -1, 3), 0, k2 (-2, 1, 1), k0 = 1 / (sqrt(7) + 1e-4), k2 = 1 / (sqrt(3) + 1e-4). The step's std over
    # its 9 advantages (sum 0, squares 14 k0^2 + 6 k2^2, Bessel-corrected as TRL's nanstd): sqrt((14 k0^2 + 6 k2^2)
    # / 8), about 0.707, and 1 of its 3 groups has equal rewards. Until 2026-11-29 the log held the means of the
    # micro-batches' values: (sqrt(14 k0^2 / 5) + sqrt(3) k2) / 2, about 0.816, and (1/2 + 0) / 2 = 1/4.
    k0, k2 = 1 / (math.sqrt(7) + 1e-4), 1 / (math.sqrt(3) + 1e-4)
    obj = objective()
    _, outs = grad_of(obj, StandIn(), batch(0, 1), batch(2))
    stds = [o.metrics["advantage_std"] for o in outs]
    assert stds == pytest.approx([math.sqrt(14 * k0**2 / 5), math.sqrt(3) * k2], rel=1e-6)  # each micro-batch's
    assert [o.metrics["zero_std_groups"] for o in outs] == [0.5, 0.0]
    logged = obj.step_values()
    assert logged["advantage_std"] == pytest.approx(math.sqrt((14 * k0**2 + 6 * k2**2) / 8), rel=1e-6)
    assert logged["zero_std_groups"] == pytest.approx(1 / 3)
    assert abs(logged["advantage_std"] - sum(stds) / 2) > 0.1  # what the log held: not the step's


def test_the_logged_advantage_values_of_a_micro_batch_whose_captions_all_failed_are_undefined():
    class FailsAll(Table):
        def __call__(self, captions, batch):
            nan = torch.full((len(captions),), float("nan"))
            return RewardOutput(nan, {"table": nan}, torch.ones(len(captions), dtype=torch.bool))

    sections = rl_sections(samples=S, advantage="group")
    obj = PolicyOptimization(WeightedSum({"table": (1.0, FailsAll())}), NoBaseline(), **sections,
                             decode=DecodeConfig(max_length=L))  # fmt: skip
    _, (out,) = grad_of(obj, StandIn(), batch(0, 1))
    assert all(math.isnan(out.metrics[k]) for k in ("advantage_std", "advantage/min", "advantage/max"))


def _moved_policy_step(model, accelerator=None, **rl) -> tuple[PolicyOptimization, list[dict]]:
    """One GRPO step (clipped loss, KL to the reference at 0.5, ``rl`` options) of ``model`` moved off its
    reference by image, over images 0 and 1 in two micro-batches of 6 and 9 tokens (LENGTH): the objective after
    its ``end_step`` and each micro-batch's metrics."""
    sections = rl_sections(samples=S, advantage="group", policy_loss="clipped", kl_coef=0.5, **rl)
    obj = PolicyOptimization(WeightedSum({"table": (1.0, Table())}), NoBaseline(), **sections,
                             decode=DecodeConfig(max_length=L))  # fmt: skip
    if accelerator is not None:
        obj.accelerator = accelerator
    obj.reference.capture(model)
    with torch.no_grad():
        model.lp.add_(torch.arange(N_IMAGES * S).unsqueeze(1) * 0.1)
    micro_batches = [step_batch(0), step_batch(1)]
    obj.begin_step(model, micro_batches)
    outs = [obj(model, b).metrics for b in micro_batches]
    obj.end_step()
    return obj, outs


def test_the_logged_kl_is_the_steps_token_mean_the_kl_alarm_reads():
    # images 0 and 1 in two micro-batches of 6 and 9 tokens (LENGTH), the policy moved away from the reference by
    # image: the step's KL is the mean over its 15 tokens, which the kl alarm reads. The log held the mean of the two
    # micro-batch means until 2026-11-29: a run could stop for a KL above the threshold its log never showed.
    obj, outs = _moved_policy_step(StandIn())
    kls = [out["kl"] for out in outs]
    alarmed = obj.monitor.step_kl
    token_mean = (kls[0] * 6 + kls[1] * 9) / 15
    assert obj.step_values()["kl"] == pytest.approx(token_mean, rel=1e-6) == alarmed
    assert abs(token_mean - sum(kls) / 2) > 1e-3  # what the log held: not the step's KL


def test_the_logged_per_token_metrics_are_the_token_means_over_every_processs_tokens():
    # This process: images 0 and 1 in two micro-batches of 6 and 9 tokens, the policy moved off the reference; the
    # other process: 100 tokens whose values are hand-made. Each logged per-token metric is the mean over the step's
    # 115 tokens, as TRL 1.16's global_masked_mean sums and counts over the processes. Until 2026-11-29 the log held
    # the mean over the processes of each one's mean of its micro-batches' means (kl: of its own tokens' mean).
    # TRL's clip_ratio/*_mean likewise (clip_fraction is region_mean's other name); nothing is clipped on this process
    # (one iteration: the ratio is 1), so its low_min (0) is the step's and the other's high_max (0.75) the step's
    others = {"clip_ratio/region_mean": [50.0, 100.0], "clip_ratio/low_mean": [20.0, 100.0],
              "clip_ratio/high_mean": [30.0, 100.0], "entropy": [300.0, 100.0], "kl": [40.0, 100.0],
              "ratio/mean": [80.0, 100.0]}  # fmt: skip
    captions = {"reward": [6.0, 4.0], "baseline": [0.0, 4.0], "logprob": [-8.0, 4.0], "sample_words": [4.0, 4.0],
                "distinct_samples": [1.0, 1.0], "zero_std_groups": [0.0, 1.0],
                **dict(zip(spread_keys("advantage_std"), ([0.0, 4.0], [4.0, 4.0]), strict=True))}  # fmt: skip
    extremes = {"clip_ratio/low_min": 0.25, "clip_ratio/high_max": 0.75}
    accelerator = OtherProcess({**others, **captions}, extremes)
    obj, outs = _moved_policy_step(EntropyStandIn(), accelerator, entropy_coef=0.1)
    tokens = [sum(LENGTH[f"c{i}_{j}"] for j in range(S)) for i in (0, 1)]  # 6, 9 (every caption scored)
    logged = obj.step_values()
    for name, (other_sum, other_count) in others.items():
        mine = sum(out[name] * n for out, n in zip(outs, tokens, strict=True))  # this process's sum over its tokens
        want = (mine + other_sum) / (sum(tokens) + other_count)
        assert logged[name] == pytest.approx(want, rel=1e-6), name
        process_means = ((outs[0][name] + outs[1][name]) / 2, other_sum / other_count)  # what was logged
        assert abs(want - sum(process_means) / 2) > 0.05, name
    assert logged["clip_fraction"] == logged["clip_ratio/region_mean"]
    assert outs[0]["clip_ratio/low_min"] == outs[1]["clip_ratio/high_max"] == 0.0
    assert logged["clip_ratio/low_min"] == 0.0 and logged["clip_ratio/high_max"] == 0.75
    assert obj.monitor.step_kl == logged["kl"]  # the kl alarm reads the logged value
