"""The GRPO family in the training engine on the tiny world (tiny ClipCap): it trains and logs what the issue asks
(KL, clip fraction, ratios, per-part rewards, the monitor); one optimizer step with 1 process x 8 images x 2
accumulation steps gives the weights of 1 x 16 (batch statistics and the token mean of the whole global batch); a run
killed in the middle of an iteration cycle and resumed ends with exactly the weights of an uninterrupted one; each
global batch is taken grpo.iterations times."""

from __future__ import annotations

import json

import pytest
import torch

from finecap.home import run_path
from finecap.models.clipcap import ClipCap
from finecap.runs import checkpoint_dir, model_dir
from finecap.train.run import train
from helpers.logged_keys import undocumented

GRPO = ["train.objective=reinforce", "grpo.advantage=group", "rl.samples=3", "grpo.policy_loss=clipped",
        "rl.rewards={cider: 1.0}", "decode.max_length=8", "clipcap.tiny_dropout=0", "train.eval_every=0",
        "train.eval_samples=4", "train.log_captions=0"]  # fmt: skip


class Killed(Exception):
    pass


def kill_at(step):
    def callback(state):
        if state.step == step:
            raise Killed

    return callback


def weights(run_dir):
    return ClipCap.from_checkpoint(model_dir(checkpoint_dir(run_dir, "last")), load_encoder=False).state_dict()


def train_values(run_dir):
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [e["values"] for e in events if e["split"] == "train"]


def test_grpo_trains_and_logs_kl_clipping_rewards_and_the_monitor(make_cfg):
    cfg = make_cfg(*GRPO, "grpo.iterations=2", "grpo.kl_coef=0.1", "grpo.loss_aggregation=token", "train.max_steps=4",
                   "train.lr=1e-2", "train.batch_size=8")  # fmt: skip
    run_dir = train(cfg)
    values = train_values(run_dir)
    assert len(values) == 4
    for key in ("loss/policy", "kl", "clip_fraction", "ratio/mean", "ratio/min", "ratio/max", "reward/cider",
                "advantage_std", "sample_words", "monitor/length_drift", "monitor/repetition",
                "monitor/fact_precision", "monitor/fact_recall", "zero_std_groups"):  # fmt: skip
        assert all(key in v for v in values), key
    assert undocumented({k for v in values for k in v}) == []  # docs/training.md, "What a run logs"
    assert values[0]["kl"] == pytest.approx(0.0, abs=1e-7)  # the reference is the starting policy, no dropout
    assert values[1]["ratio/max"] > 1.0 or values[1]["ratio/min"] < 1.0  # step 2 reuses step 1's rollout
    assert values[0]["ratio/min"] == values[0]["ratio/max"] == 1.0
    assert values[0]["time/generate"] > 0 and values[1]["time/generate"] == 0.0
    assert values[0]["time/reference"] > 0 and values[1]["time/reference"] == 0.0  # the reference pass's seconds
    assert any(v["kl"] > 0 for v in values[1:])


@pytest.mark.slow
def test_accumulation_gives_the_weights_of_one_big_batch(make_cfg):
    options = [*GRPO, "grpo.scale_rewards=batch", "grpo.loss_aggregation=token", "grpo.kl_coef=0.1",
               "train.max_steps=1", "train.lr=1e-3", "train.warmup_steps=0", "train.schedule=constant"]  # fmt: skip
    big = train(make_cfg(*options, "train.batch_size=16", run="big"))
    accum = train(make_cfg(*options, "train.batch_size=8", "train.grad_accum_steps=2", run="accum"))
    a, b = weights(big), weights(accum)
    diffs = torch.cat([(a[k].float() - b[k].float()).abs().flatten() for k in a])
    assert (diffs > 1e-6).float().mean().item() <= 1e-3 and diffs.max().item() <= 0.05 * 1e-3  # as test_equivalence
    one, two = train_values(big)[0], train_values(accum)[0]
    assert one["reward"] == pytest.approx(two["reward"], rel=1e-6)
    # the step's extremes are those of the union batch (a mean of the micro-batches' minima was logged before)
    for key in ("advantage/min", "advantage/max", "ratio/min", "ratio/max"):
        assert one[key] == pytest.approx(two[key], rel=1e-6), key
    assert one["grad_norm"] == pytest.approx(two["grad_norm"], rel=1e-4) and one["grad_norm"] > 0


@pytest.mark.slow
def test_killed_mid_cycle_and_resumed_matches_uninterrupted(make_cfg):
    # grpo.iterations=3: steps 1-3 share a rollout, 4-6 the next. The checkpoint of step 4 holds the second cycle's
    # rollout (and the KL reference); the run is killed after step 5, so steps 5-6 are redone from the kept rollout.
    common = [*GRPO, "grpo.iterations=3", "grpo.kl_coef=0.1", "train.max_steps=6", "train.save_every=4",
              "train.batch_size=16", "clipcap.tiny_dropout=0.1"]  # fmt: skip
    full = train(make_cfg(*common, run="full"))
    cfg = make_cfg(*common, run="killed")
    with pytest.raises(Killed):
        train(cfg, callbacks=[kill_at(5)])
    saved = json.loads((checkpoint_dir(run_path(cfg.run), "last") / "trainer_state.json").read_text())
    assert saved["step"] == 4
    state = json.loads((checkpoint_dir(run_path(cfg.run), "last") / "state" / "process_0.json").read_text())
    assert state["objective"]["policy"]["taken"] == 1 and len(state["objective"]["policy"]["cycle"]) == 1
    resumed = train(cfg, resume=True)
    a, b = weights(full), weights(resumed)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    untimed = [[{k: v for k, v in values.items() if not k.startswith("time/")} for values in train_values(run)]
               for run in (resumed, full)]  # fmt: skip
    assert untimed[0] == untimed[1]  # the killed steps' logs were rewritten, value for value


@pytest.mark.slow
def test_each_global_batch_is_taken_rl_iterations_times(make_cfg):
    # 40 images / 16 per step = 3 global batches per epoch, each taken twice: one epoch is 6 optimizer steps
    cfg = make_cfg(*GRPO, "grpo.iterations=2", "train.epochs=1", "train.max_steps=0", "train.batch_size=16")
    values = train_values(train(cfg))
    assert len(values) == 6
    rolled = [v["time/generate"] > 0 for v in values]
    assert rolled == [True, False] * 3


def untimed(run_dir):
    return [{k: v for k, v in values.items() if not k.startswith("time/")} for values in train_values(run_dir)]


DROPOUT_RUN = [*GRPO, "grpo.iterations=2", "grpo.kl_coef=0.1", "train.max_steps=4", "train.batch_size=8",
               "train.lr=1e-2"]  # fmt: skip


@pytest.mark.slow
def test_disable_dropout_gives_the_ratios_and_kl_of_a_model_without_dropout(make_cfg):
    # The same initial weights (dropout draws nothing at construction); with rl.disable_dropout the GPT-2's dropout
    # of 0.1 is off in the policy's scoring, so every logged value (ratios, clip fraction, KL, losses) and the final
    # weights are those of the run whose model has dropout 0. Without it, step 2's ratios carry dropout noise.
    off = train(make_cfg(*DROPOUT_RUN, "clipcap.tiny_dropout=0.1", "rl.disable_dropout=true", run="off"))
    none = train(make_cfg(*DROPOUT_RUN, "clipcap.tiny_dropout=0", run="none"))
    noisy = train(make_cfg(*DROPOUT_RUN, "clipcap.tiny_dropout=0.1", run="noisy"))
    assert untimed(off) == untimed(none)
    a, b = weights(off), weights(none)
    assert all(torch.equal(a[k], b[k]) for k in a)
    steps = untimed(noisy)
    assert steps[0]["ratio/max"] == 1.0  # the first step of a cycle scores the rollout policy itself
    assert (steps[1]["ratio/min"], steps[1]["ratio/max"]) != (untimed(none)[1]["ratio/min"],
                                                              untimed(none)[1]["ratio/max"])  # fmt: skip


@pytest.mark.slow
def test_init_from_applies_a_dropout_override_and_refuses_settings_that_built_the_weights(make_cfg):
    """clipcap.tiny_dropout=0 from a checkpoint trained with 0.1 is applied (the GRPO run is the one with
    rl.disable_dropout, and the checkpoints it saves record 0); a world-tiny size or another LM cannot apply and is
    refused in one line naming the key and the checkpoint's value."""
    from finecap.runs import CheckpointError

    start = train(make_cfg("train.max_steps=1", "train.eval_every=0", "train.eval_samples=4",
                           "clipcap.tiny_dropout=0.1", run="mle"))  # fmt: skip
    init = f"train.init_from={checkpoint_dir(start, 'last')}"
    common = [*DROPOUT_RUN, init, "clipcap.tiny_dropout=0.1"]
    applied = train(make_cfg(*common, "clipcap.tiny_dropout=0", run="applied"))
    disabled = train(make_cfg(*common, "rl.disable_dropout=true", run="disabled"))
    kept = train(make_cfg(*common, run="kept"))
    assert untimed(applied) == untimed(disabled) != untimed(kept)
    lm_config = json.loads((model_dir(checkpoint_dir(applied, "last")) / "lm" / "config.json").read_text())
    assert (lm_config["resid_pdrop"], lm_config["embd_pdrop"], lm_config["attn_pdrop"]) == (0.0, 0.0, 0.0)
    for override, shown in (("clipcap.tiny_layers=2", "clipcap.tiny_layers=1 in the checkpoint, 2 configured"),
                            ("clipcap.tiny_hidden=64", "clipcap.tiny_hidden=32 in the checkpoint, 64 configured"),
                            ("clipcap.lm=data-tiny",
                             "clipcap.lm='world-tiny' in the checkpoint, 'data-tiny' configured")):  # fmt: skip
        with pytest.raises(CheckpointError) as e:
            train(make_cfg(*common, override, run=override.split("=")[0]))
        assert "train.init_from was trained with other settings" in str(e.value) and shown in str(e.value)
        assert "\n" not in str(e.value)


def test_objective_grpo_trains_as_its_former_name_with_the_former_keys_bit_for_bit(make_cfg):
    """``train.objective=grpo`` with the ``grpo`` section, and ``reinforce`` with the GRPO options under their former
    ``rl.*`` names (read as ``grpo.*``): 2 steps on the tiny world end with the same weights and log the same
    values."""
    common = ["rl.samples=3", "rl.rewards={cider: 1.0}", "decode.max_length=8", "clipcap.tiny_dropout=0",
              "train.eval_every=0", "train.eval_samples=4", "train.log_captions=0", "train.max_steps=2",
              "train.batch_size=8", "train.lr=1e-2"]  # fmt: skip
    new = make_cfg(*common, "train.objective=grpo", "grpo.advantage=group", "grpo.policy_loss=clipped",
                   "grpo.iterations=2", run="grpo")  # fmt: skip
    old = make_cfg(*common, "train.objective=reinforce", "rl.advantage=group", "rl.policy_loss=clipped",
                   "rl.iterations=2", run="alias")  # fmt: skip
    assert old.grpo == new.grpo and old.rl == new.rl
    a, b = train(new), train(old)
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    drop = ("time/", "steps_per_second", "samples_per_second", "throughput")
    strip = [{k: v for k, v in row.items() if not k.startswith(drop)} for row in train_values(a)]
    assert len(strip) == 2 and "loss/policy" in strip[0]
    assert strip == [{k: v for k, v in row.items() if not k.startswith(drop)} for row in train_values(b)]
