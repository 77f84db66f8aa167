"""The reward-hacking alarms on the tiny world: a reward that pays for length (this test's own, plugged in by dotted
path) drives the sampled captions' length up and sets off the length alarm within 50 steps, stopping ``finecap
train`` with one line naming the step and the measure (exit code 2); a clean SCST run (CIDEr-D, greedy baseline) from
the same captioner, with the same alarms, runs its 50 steps without one.

Measured when the test was written (tiny ClipCap after 60 MLE steps, 7.8 to 10.6 words per sampled caption, captions
of at most 30 tokens; run seeds 0-3, the test runs seed 0): under the length reward the drift passed +1.0 at steps 5,
9, 5 and 8 and ended at +1.6 to +2.5; under SCST its largest size was 0.66, 0.36, 0.31 and 0.39 (ending within
[-0.30, +0.16]). The threshold, 1.0, sits between the two; repetition stayed below 0.02 in every run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from finecap.app.cli import main
from finecap.objectives.monitor import RewardHackingAlarm
from finecap.rewards import RewardOutput
from finecap.train.run import train

ALARMS = ["rl.alarms={length_drift: 1.0, repetition: 0.3}", "rl.alarm_action=stop"]


class Words:
    """Pays for length: the caption's number of words."""

    def __call__(self, captions, batch):
        total = torch.tensor([float(len(c.split())) for c in captions])
        return RewardOutput(total, {"words": total})


def words(cfg):
    return Words()


class FailsFromStep7:
    """Scores every caption 1, and from step 7 on (1-based, as logged) none: every caption failed, as a judge that
    went down would leave them."""

    def __call__(self, captions, batch):
        total = torch.ones(len(captions))
        failed = torch.full((len(captions),), int(batch["step_info"].step) + 1 >= 7)
        return RewardOutput(total.masked_fill(failed, float("nan")), {"one": total}, failed)


def fails_from_step_7(cfg):
    return FailsFromStep7()


def reinforce_cfg(make_cfg, reward: str, *overrides: str):
    """REINFORCE with 2 samples and a mean baseline on ``reward`` (a function of this module), then ``overrides``."""
    return make_cfg("train.objective=reinforce", f"rl.rewards={{'{__name__}:{reward}': 1.0}}", "rl.samples=2",
                    "rl.baseline=mean", *overrides)  # fmt: skip


def test_a_stopping_alarm_logs_the_steps_since_the_last_event_and_why_it_stopped(make_cfg):
    # train.log_every=4: the run logs at step 4, then its failed alarm stops it at step 7. Steps 5 to 7 are logged
    # (one event at step 7, as a log event at that step would have been), then the stop, with the alarm's line.
    # Until 2026-11-28 the run ended at the alarm and the log stopped at step 4: steps 5 to 7 were never written.
    cfg = reinforce_cfg(make_cfg, "fails_from_step_7", "rl.alarms={failed: 0.5}", "rl.alarm_action=stop",
                        "train.log_every=4", "train.max_steps=12", "train.eval_every=12")  # fmt: skip
    with pytest.raises(RewardHackingAlarm, match=r"^rl.alarms: at step 7 the share of captions") as alarm:
        train(cfg)
    events = [json.loads(s) for s in (Path(cfg.run.dir) / "metrics.jsonl").read_text().splitlines()]
    assert [(e["step"], e["split"]) for e in events] == [(4, "train"), (7, "train"), (7, "stop")]
    assert events[0]["values"]["reward"] == 1.0 and "reward/failed" not in events[0]["values"]
    assert events[1]["values"]["reward/failed"] == 1.0  # step 7's, the only step of the window with a failure
    assert events[1]["values"]["reward"] == 1.0  # steps 5 and 6 (step 7 scored nothing: NaN, left out)
    assert events[1]["epoch"] == events[2]["epoch"] > events[0]["epoch"]
    assert events[2]["values"] == {} and events[2]["text"] == {"reason": str(alarm.value)}


class FailsOneAtStep2:
    """Scores every caption 1, except at step ``at`` (1-based; 2) the first caption of the global batch's first
    image, which it cannot score; ``failed`` is ``None`` where none failed, as the reward server's client gives it."""

    at = 2

    def __call__(self, captions, batch):
        first = batch["step_info"].image_ids[0]
        ids = [batch["image_ids"][int(i)] for i in batch["image_index"]]
        failed = torch.tensor([i == first for i in ids]) & (torch.arange(len(ids)) == ids.index(first) if first in ids
                                                            else torch.zeros(len(ids), dtype=torch.bool))  # fmt: skip
        if int(batch["step_info"].step) + 1 != self.at or not bool(failed.any()):
            failed = None
        total = torch.ones(len(captions))
        return RewardOutput(total if failed is None else total.masked_fill(failed, float("nan")), {"one": total},
                            failed)  # fmt: skip


def fails_one_at_step_2(cfg):
    return FailsOneAtStep2()


def logged_failed_shares(run) -> dict:
    """``{step: reward/failed}`` of the training events of ``run``'s log (``None`` where not logged)."""
    logged = [json.loads(s) for s in (Path(run) / "metrics.jsonl").read_text().splitlines()]
    return {e["step"]: e["values"].get("reward/failed") for e in logged if e["split"] == "train"}


def test_the_logged_failed_share_is_the_alarms_over_every_caption_of_the_step(make_cfg):
    # 20 images x 2 samples a step (40 training images: no short last batch) in two micro-batches of 20 captions; at
    # step 2 one caption of the first failed and the second's reward said failed=None: the step's share is 1/40, the
    # rl.alarms.failed alarm's measure. The log showed 1/20 until 2026-11-28 (the mean over the micro-batches that
    # gave a mask). A step before the run's first failure logs no share, one after it 0.
    cfg = reinforce_cfg(make_cfg, "fails_one_at_step_2", "train.batch_size=10", "train.grad_accum_steps=2",
                        "train.max_steps=3", "train.eval_every=3")  # fmt: skip
    failed = logged_failed_shares(train(cfg))
    assert failed == {1: None, 2: 1 / 40, 3: 0.0}


class FailsOneAtStep7(FailsOneAtStep2):
    at = 7


def fails_one_at_step_7(cfg):
    return FailsOneAtStep7()


def test_a_short_last_batchs_copies_count_in_no_logged_value(make_cfg):
    # 40 images, global batch 6 in 6 micro-batches of 1: step 7 takes the epoch's last 4 images [a], [b], [c], [d]
    # and repeats [a], [b] to fill the step (copies, weight 0). At step 7 one caption of a failed: the step's share
    # is 1 of its 8 captions. Until 2026-11-28 the copies' captions counted too: a's failed caption twice, 2/12.
    cfg = reinforce_cfg(make_cfg, "fails_one_at_step_7", "train.batch_size=1", "train.grad_accum_steps=6",
                        "train.max_steps=7", "train.eval_every=7", "train.log_every=1")  # fmt: skip
    failed = logged_failed_shares(train(cfg))
    assert failed == {**dict.fromkeys(range(1, 7)), 7: pytest.approx(1 / 8)}


class GreedyFailsFromStep2:
    """Pays a caption its number of words; from step 2 on (1-based) cannot score a greedy caption (the second call
    of each rollout: the samples are scored first), as a judge that fails on the greedy captions alone would."""

    def __init__(self):
        self.calls = 0

    def __call__(self, captions, batch):
        self.calls += 1
        total = torch.tensor([float(len(c.split())) for c in captions])
        failed = torch.full((len(captions),), self.calls % 2 == 0 and int(batch["step_info"].step) + 1 >= 2)
        return RewardOutput(total.masked_fill(failed, float("nan")), {"words": total}, failed)


def greedy_fails_from_step_2(cfg):
    return GreedyFailsFromStep2()


def test_a_run_whose_greedy_captions_fail_stops_naming_the_greedy_failed_alarm(make_cfg):
    # SCST with 2 samples: from step 2 every greedy caption failed and every sample was scored, so the samples took
    # each other's rewards as baseline (leave-one-out) and the run was no longer SCST. The failed alarm (sampled
    # captions) stays silent; greedy_failed reads the step's share of greedy captions, 1, and stops the run. Until
    # 2026-11-29 no alarm read it: the run went on as leave-one-out, its only trace reward_greedy/failed
    cfg = make_cfg("train.objective=reinforce", f"rl.rewards={{'{__name__}:greedy_fails_from_step_2': 1.0}}",
                   "rl.samples=2", "rl.alarms={failed: 0.1, greedy_failed: 0.5}", "rl.alarm_action=stop",
                   "train.batch_size=8", "train.grad_accum_steps=2", "train.max_steps=4", "train.eval_every=4",
                   "train.validators=[]")  # fmt: skip
    with pytest.raises(RewardHackingAlarm, match=r"^rl.alarms: at step 2 the share of greedy captions a reward could "
                       r"not score \(rl.alarms.greedy_failed\) is 1, above its threshold 0.5"):  # fmt: skip
        train(cfg)
    events = [json.loads(s) for s in (Path(cfg.run.dir) / "metrics.jsonl").read_text().splitlines()]
    logged = [e["values"] for e in events if e["split"] == "train"]
    assert [v["reward_greedy/failed"] for v in logged] == [0.0, 1.0]  # the step's share, over both micro-batches
    assert all("reward/failed" not in v for v in logged)  # no sampled caption failed
    assert [v["skipped/unscored"] for v in logged] == [0.0, 0.0]  # the samples had a baseline: the steps were taken


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """A tiny CLIP of its own seed (the shared ``tiny_encoder`` is drawn from whatever RNG state the session left),
    so that these runs, and the measurements above, do not depend on which tests ran before."""
    from finecap.models.presets import save_tiny_clip

    return save_tiny_clip(tmp_path_factory.mktemp("alarm_encoder"), image_size=32, patch_size=8, hidden=32, seed=0)


@pytest.fixture(scope="module")
def mle_captioner(tmp_path_factory, world_args, encoder):
    """60 MLE steps: a captioner whose samples end at a stop token (a random one runs to decode.max_length)."""
    from finecap.config import load

    out = tmp_path_factory.mktemp("mle")
    overrides = rl_base(world_args, encoder, out)
    return train(load(None, [*overrides, f"run.dir={out / 'run'}", "train.max_steps=60", "train.lr=3e-3"]))


def rl_base(world_args, encoder, folder) -> list[str]:
    return [*world_args, f"model.encoder={encoder}", "clipcap.tiny_layers=1", "clipcap.tiny_hidden=32",
            "clipcap.tiny_heads=2", "clipcap.prefix_length=2", f"run.cache_dir={folder / 'cache'}",
            "train.batch_size=16", "train.warmup_steps=0", "train.log_every=1", "decode.max_length=30",
            "train.eval_every=0", "train.eval_samples=4", "train.log_captions=0"]  # fmt: skip


def rl_run(world_args, encoder, tmp_path, mle, *extra) -> list[str]:
    return [*rl_base(world_args, encoder, tmp_path), f"run.dir={tmp_path / 'rl'}", "train.objective=reinforce",
            f"train.init_from={mle / 'checkpoints' / 'last'}", "train.max_steps=50", "train.lr=1e-3",
            "rl.samples=4", *ALARMS, *extra]  # fmt: skip


@pytest.mark.slow
def test_a_reward_paying_for_length_sets_off_the_length_alarm(mle_captioner, world_args, encoder, tmp_path, capsys):
    overrides = rl_run(world_args, encoder, tmp_path, mle_captioner, f"rl.rewards={{'{__name__}:words': 1.0}}",
                       "grpo.advantage=group")  # fmt: skip
    assert main(["train", *overrides]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    line = err[-1]
    assert line.startswith("finecap: error: rl.alarms: at step ") and "length_drift" in line, err[-3:]
    assert "training stopped (rl.alarm_action=stop)" in line
    step = int(line.split("at step ")[1].split()[0])
    assert 1 < step <= 50
    logged = [json.loads(s) for s in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    drift = [e["values"]["monitor/length_drift"] for e in logged if e["split"] == "train"]
    # the alarm ends the run after the step it sounds at, which is logged last (one micro-batch a step: the logged
    # drift is the alarm's), then the stop with its line; until 2026-11-28 the alarmed step was not logged
    assert len(drift) == step and max(abs(d) for d in drift[:-1]) <= 1.0 < abs(drift[-1])
    assert logged[-1]["split"] == "stop" and logged[-1]["step"] == step
    assert logged[-1]["text"]["reason"] == line.removeprefix("finecap: error: ")


@pytest.mark.slow
def test_a_clean_scst_run_sets_off_no_alarm(mle_captioner, world_args, encoder, tmp_path, caplog):
    overrides = rl_run(world_args, encoder, tmp_path, mle_captioner, "rl.rewards={cider: 1.0}",
                       "rl.baseline=greedy")  # fmt: skip
    assert main(["train", *overrides]) == 0
    logged = [json.loads(s) for s in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    values = [e["values"] for e in logged if e["split"] == "train"]
    assert len(values) == 50
    assert max(abs(v["monitor/length_drift"]) for v in values) < 1.0
    assert all(0 <= v["monitor/fact_precision"] <= 1 for v in values)  # the world's facts are measured


@pytest.mark.slow
def test_a_kl_past_its_alarm_stops_grpo_naming_the_option(mle_captioner, world_args, encoder, tmp_path, capsys):
    # the first step's KL is 0 (the policy is the reference, no dropout); after one update it is past 1e-6
    kl = ["grpo.policy_loss=clipped", "grpo.kl_coef=0.04", "rl.disable_dropout=true", "rl.alarms={kl: 1.0e-6}"]
    overrides = rl_run(
        world_args, encoder, tmp_path, mle_captioner, "rl.rewards={cider: 1.0}", "grpo.advantage=group", *kl
    )
    assert main(["train", *overrides]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("finecap: error: rl.alarms: at step 2 the KL to the starting policy (rl.alarms.kl)"), line
    assert "training stopped (rl.alarm_action=stop)" in line
