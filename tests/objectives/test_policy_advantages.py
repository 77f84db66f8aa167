"""The GRPO family's advantages (finecap.objectives.grpo), hand-computed on 2 images x 3 samples for each
grpo.scale_rewards and grpo.reward_aggregation, with the arithmetic in comments; a group of equal rewards gives 0,
never NaN; the configuration's checks name the key: every float option of ``rl``, ``grpo``, ``sle`` (and ``sr``) is
finite and in a usable range, reward weights fit float32 and are not all 0."""

import dataclasses
import math

import pytest
import torch

from finecap.config import ConfigError, GRPOConfig, RLConfig, SLEConfig, SRConfig, load
from finecap.objectives.grpo import (
    EPS,
    batch_mean_std,
    clipped_surrogate,
    group_advantages,
    normalize_then_sum,
    zero_std_share,
)

# Image 0 samples rewards (1, 2, 6); image 1 (4, 4, 4).
#   image 0: mean 3, deviations (-2, -1, 3), Bessel variance (4 + 1 + 9) / 2 = 7, std sqrt(7) = 2.6458
#   image 1: mean 4, deviations (0, 0, 0), std 0 -> advantages 0 / (0 + eps) = 0
REWARDS = torch.tensor([1.0, 2.0, 6.0, 4.0, 4.0, 4.0])
CENTRED = [-2.0, -1.0, 3.0, 0.0, 0.0, 0.0]


def test_group_scaling_divides_by_each_groups_std():
    got = group_advantages(REWARDS, 3, "group")
    s7 = math.sqrt(7.0)
    assert got.tolist() == pytest.approx([-2 / (s7 + EPS), -1 / (s7 + EPS), 3 / (s7 + EPS), 0.0, 0.0, 0.0], rel=1e-6)
    assert EPS == 1e-4  # TRL's constant


def test_no_scaling_is_dr_grpos_centred_rewards():
    assert group_advantages(REWARDS, 3, "none").tolist() == CENTRED


def test_batch_scaling_divides_the_group_centred_rewards_by_the_batch_std():
    # all six rewards: mean 21 / 6 = 3.5; deviations (-2.5, -1.5, 2.5, .5, .5, .5); squares 6.25 + 2.25 + 6.25 +
    # 3 x .25 = 15.5; Bessel variance 15.5 / 5 = 3.1; std sqrt(3.1) = 1.7607. TRL centres by the *group* mean.
    got = group_advantages(REWARDS, 3, "batch")
    std = math.sqrt(3.1)
    assert got.tolist() == pytest.approx([c / (std + EPS) for c in CENTRED], rel=1e-6)
    mean, s = batch_mean_std(REWARDS)
    assert (mean.item(), s.item()) == pytest.approx((3.5, std), rel=1e-6)


def test_normalize_then_sum_normalises_each_reward_in_its_group_then_the_weighted_sum_over_the_batch():
    cider = REWARDS  # image 0: (-2, -1, 3) / sqrt(7); image 1: (0, 0, 0)
    retrieval = torch.tensor([0.0, 0.0, 3.0, 1.0, 2.0, 3.0])
    # retrieval, image 0: mean 1, deviations (-1, -1, 2), variance (1 + 1 + 4) / 2 = 3 -> (-1, -1, 2) / sqrt(3)
    #            image 1: mean 2, deviations (-1, 0, 1), variance 1 -> (-1, 0, 1) / 1
    s7, s3 = math.sqrt(7) + EPS, math.sqrt(3) + EPS
    c = [-2 / s7, -1 / s7, 3 / s7, 0.0, 0.0, 0.0]
    r = [-1 / s3, -1 / s3, 2 / s3, -1 / (1 + EPS), 0.0, 1 / (1 + EPS)]
    summed = [a + 0.5 * b for a, b in zip(c, r, strict=True)]  # weights cider 1, retrieval 0.5
    # = (-1.0446, -0.6666, 1.7112, -0.5, 0, 0.5): mean 0 (each group's part is centred), Bessel std over the six
    mean = sum(summed) / 6
    std = math.sqrt(sum((x - mean) ** 2 for x in summed) / 5)  # sqrt(4.9635 / 5) = 0.9963
    want = [(x - mean) / (std + EPS) for x in summed]
    got = normalize_then_sum([cider, retrieval], [1.0, 0.5], 3)
    assert got.tolist() == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert got.tolist()[2] == pytest.approx(1.7173, abs=1e-4)  # 1.7112 / (0.9963 + eps)


def test_sum_then_normalize_of_two_rewards_is_group_advantages_of_the_weighted_sum():
    retrieval = torch.tensor([0.0, 0.0, 3.0, 1.0, 2.0, 3.0])
    total = REWARDS + 0.5 * retrieval  # image 0: (1, 2, 7.5); image 1: (4.5, 5, 5.5)
    # image 0: mean 3.5, deviations (-2.5, -1.5, 4), variance (6.25 + 2.25 + 16) / 2 = 12.25, std 3.5
    # image 1: mean 5, deviations (-.5, 0, .5), variance .25, std .5
    want = [-2.5 / (3.5 + EPS), -1.5 / (3.5 + EPS), 4 / (3.5 + EPS), -0.5 / (0.5 + EPS), 0.0, 0.5 / (0.5 + EPS)]
    assert group_advantages(total, 3, "group").tolist() == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_a_group_of_equal_rewards_gets_zero_advantage_not_nan(scale):
    constant = torch.tensor([0.7, 0.7, 0.7, 0.7, 0.7, 0.7])  # two groups, both constant
    got = group_advantages(constant, 3, scale)
    assert torch.isfinite(got).all() and got.abs().max().item() < 1e-6
    gdpo = normalize_then_sum([constant, constant], [1.0, 1.0], 3)
    assert torch.isfinite(gdpo).all() and gdpo.abs().max().item() < 1e-6
    assert zero_std_share(constant, 3) == 1.0 and zero_std_share(REWARDS, 3) == 0.5


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_a_constant_group_is_exactly_zero_whatever_the_float_rounding_of_its_mean(scale):
    # Seven samples of 0.7 and eight of 0.9 (float32): their float mean is 6e-8 off the value, std 6e-8, and
    # (R - mean) / (std + 1e-4) gave every caption of the group an advantage of +-6e-4 (one sign: a push on
    # captions that carry no signal) while zero_std_groups missed the group (std 6e-8 is not isclose to 0).
    varied = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    for value, s in ((0.7, 7), (0.9, 8)):
        constant = torch.full((s,), value)
        assert group_advantages(constant, s, scale).tolist() == [0.0] * s
        rewards = torch.cat([constant, varied[:s]])  # a constant group beside a varied one
        got = group_advantages(rewards, s, scale)
        assert got[:s].tolist() == [0.0] * s and got[s:].abs().max() > 0.5
        failed = torch.zeros(2 * s, dtype=torch.bool)
        failed[-1] = True  # the masked path too
        assert group_advantages(rewards, s, scale, failed=failed)[:s].tolist() == [0.0] * s
        assert zero_std_share(rewards, s) == 0.5
        # GDPO: the constant reward's part is 0 in each group, so the sum is the other reward's alone
        gdpo = normalize_then_sum([torch.full((2 * s,), value), rewards], [1.0, 1.0], s)
        assert torch.equal(gdpo, normalize_then_sum([torch.zeros(2 * s), rewards], [1.0, 1.0], s))


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize(("samples", "says"), [(1, "at least 2"), (0, "at least 2"), (4, "does not divide")])
def test_group_advantages_refuses_groups_it_cannot_form_naming_samples(scale, samples, says):
    # samples=1 with scale=group was NaN for every caption (the std of one value); the configuration refuses it, a
    # direct call must too, and with the argument's name, as must the GDPO path that calls it per reward
    with pytest.raises(ValueError, match=f"samples={samples}.*{says}"):
        group_advantages(REWARDS, samples, scale)
    with pytest.raises(ValueError, match=f"samples={samples}"):
        normalize_then_sum([REWARDS], [1.0], samples)


def test_a_single_value_has_the_nan_std_of_trls_nanstd():
    mean, std = batch_mean_std(torch.tensor([2.0]))
    assert mean.item() == 2.0 and math.isnan(std.item())


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["grpo.advantage=group", "rl.samples=1"], "rl.samples"),
        (["grpo.scale_rewards=batch"], "grpo.scale_rewards"),
        (["grpo.reward_aggregation=normalize_then_sum"], "grpo.reward_aggregation"),
        (
            ["grpo.advantage=group", "grpo.reward_aggregation=normalize_then_sum", "grpo.scale_rewards=none"],
            "grpo.scale_rewards",
        ),
        (["grpo.iterations=2"], "grpo.iterations"),
        (["grpo.kl_coef=0.1"], "grpo.kl_coef"),
        (["grpo.advantage=mean"], "grpo.advantage"),
        (["grpo.loss_aggregation=dapo"], "grpo.loss_aggregation"),
        (["rl.alarms={length: 1.0}"], "rl.alarms"),
        (["rl.alarms={fact_precision: 1.5}"], "rl.alarms.fact_precision"),
        (["rl.alarms={length_drift: -1}"], "rl.alarms.length_drift"),
        (["grpo.iterations=100", "grpo.policy_loss=clipped"], "grpo.iterations"),
    ],
)
def test_configuration_checks_name_the_key(overrides, key):
    with pytest.raises(ConfigError) as e:
        load(None, overrides)
    assert e.value.key == key, str(e.value)


FLOAT_OPTIONS = [(cls, f.name) for cls in (RLConfig, GRPOConfig, SLEConfig, SRConfig) for f in dataclasses.fields(cls)
                 if f.type in ("float", "float | None")]  # fmt: skip


def test_the_float_options_are_the_ones_checked_below():
    names = {f"{cls.section_name}.{name}" for cls, name in FLOAT_OPTIONS}
    assert {"rl.temperature", "grpo.clip_low", "grpo.clip_high", "grpo.kl_coef", "rl.entropy_coef", "rl.vllm_is_cap",
            "rl.mean_momentum", "sle.alpha", "sr.logit_scale", "sr.duplicate_threshold"} <= names  # fmt: skip


@pytest.mark.parametrize(("cls", "name"), FLOAT_OPTIONS)
@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e300", "-1e300"])
def test_every_float_option_of_rl_and_sr_is_finite_and_in_range(cls, name, value):
    key = f"{cls.section_name}.{name}"
    with pytest.raises(ConfigError) as e:  # an override
        load(None, [f"{key}={value}"])
    assert e.value.key == key and "\n" not in str(e.value), str(e.value)
    with pytest.raises(ConfigError) as e:  # a section built by hand (the TRL adapter's way)
        cls(**{name: float(value)})
    assert e.value.key == key and str(e.value).startswith(f"{key}: must be"), str(e.value)


def test_the_upper_bounds_still_train():
    # the largest accepted clip: ratios 0.5 and 150 with A = 1 -> -min(0.5, 0.5) = -0.5, -min(150, 101) = -101
    RLConfig(temperature=100, entropy_coef=100)
    grpo = GRPOConfig(clip_low=0.2, clip_high=100, policy_loss="clipped", kl_coef=100)
    loss = clipped_surrogate(torch.tensor([[0.5, 150.0]]), torch.tensor([1.0]), grpo.clip_low, grpo.clip_high)
    assert loss.tolist() == [[-0.5, -101.0]]


@pytest.mark.parametrize(
    ("weights", "key", "message"),
    [("{cider: 1e39}", "rl.rewards.cider", "must be in [-1e+06, 1e+06], got 1e+39"),
     ("{cider: 1.0, retrieval: -2e6}", "rl.rewards.retrieval", "must be in [-1e+06, 1e+06], got -2000000.0"),
     ("{cider: .inf}", "rl.rewards", "rl.rewards.cider: must be a finite number"),
     ("{cider: 1e-50}", "rl.rewards.cider", "1e-50 is 0 in float32"),
     ("{cider: 0.0}", "rl.rewards", "every weight is 0, so every caption's reward is 0 and nothing is learnt"),
     ("{cider: 0, retrieval: -0.0}", "rl.rewards", "every weight is 0")],
)  # fmt: skip
def test_reward_weights_fit_float32_and_are_not_all_zero(weights, key, message):
    with pytest.raises(ConfigError) as e:
        load(None, [f"rl.rewards={weights}"])
    assert e.value.key == key and message in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("weights", ["{cider: 0, retrieval: 1}", "{retrieval: 1.0, cider: -0.5}", "{cider: 1e6}",
                                     "{cider: -1e-30}"])  # fmt: skip
def test_usable_reward_weights_are_accepted(weights):
    assert any(w != 0 for w in load(None, [f"rl.rewards={weights}"]).rl.rewards.values())


def test_defaults_are_the_papers_reinforce():
    rl, grpo = RLConfig(), GRPOConfig()
    assert (grpo.advantage, grpo.policy_loss, grpo.iterations, grpo.kl_coef, rl.alarms) == (
        "baseline",
        "reinforce",
        1,
        0.0,
        {},
    )
    assert (grpo.clip_low, grpo.clip_high, grpo.importance, grpo.loss_aggregation) == (0.2, 0.2, "token", "sequence")
