import math

import pytest
import torch

from finecap.train.schedule import build_scheduler, lr_factor, short_run_note


def factors(kind, warmup, total):
    return [lr_factor(s, warmup=warmup, total=total, kind=kind) for s in range(total)]


def test_linear_with_warmup():
    # warmup 2: (0+1)/2 = 0.5, (1+1)/2 = 1; then decay over d = 6 - 2 = 4 steps: 1 - u/4 for u = 0..3
    assert factors("linear", 2, 6) == pytest.approx([0.5, 1.0, 1.0, 0.75, 0.5, 0.25])


def test_cosine_with_warmup():
    # warmup 1: 1/1 = 1; then (1 + cos(pi * u / 4)) / 2 for u = 0..3: 1, (1 + 0.70711)/2, 1/2, (1 - 0.70711)/2
    c = math.cos(math.pi / 4)
    assert factors("cosine", 1, 5) == pytest.approx([1.0, 1.0, (1 + c) / 2, 0.5, (1 - c) / 2])
    assert factors("cosine", 1, 5)[2] == pytest.approx(0.853553, abs=1e-6)


def test_constant_and_no_warmup():
    assert factors("constant", 4, 6) == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])
    assert factors("linear", 0, 4) == pytest.approx([1.0, 0.75, 0.5, 0.25])


def test_scheduler_drives_optimizer_lr():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    sched = build_scheduler(opt, warmup=2, total=6, kind="linear")
    seen = []
    for _ in range(6):
        seen.append(opt.param_groups[0]["lr"])  # the lr the step uses
        opt.step()
        sched.step()
    assert seen == pytest.approx([0.05, 0.1, 0.1, 0.075, 0.05, 0.025])


def test_unknown_schedule():
    with pytest.raises(ValueError, match="train.schedule: unknown schedule 'step'"):
        build_scheduler(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1), warmup=0, total=3, kind="step")


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_the_rate_stays_at_zero_after_the_last_step(kind):
    # the scheduler is stepped after the last optimizer step too; linear would turn negative there and cosine rise
    # again if the progress were not held at 1
    for step in (10, 11, 15, 30):
        assert lr_factor(step, warmup=2, total=10, kind=kind) == pytest.approx(0.0, abs=1e-12)


def test_a_warmup_not_below_the_runs_steps_is_named():
    """A recipe's warmup on a small data set: the peak the rate reaches, and what to change."""
    assert short_run_note(warmup=100, total=10) == (
        "train.warmup_steps=100 is not below this run's 10 optimizer steps: the learning rate rises to 10% of "
        "train.lr at the last step and never decays; lower train.warmup_steps (e.g. to a tenth of the steps) or "
        "train longer (train.epochs)"
    )
    assert "rises to 100% of train.lr" in short_run_note(warmup=10, total=10)
    assert short_run_note(warmup=9, total=10) is None and short_run_note(warmup=0, total=1) is None


@pytest.mark.slow
def test_training_warns_when_the_warmup_outlasts_the_run(make_cfg, caplog):
    from finecap.train.run import train

    train(make_cfg("train.max_steps=2", "train.warmup_steps=8"))
    want = "train.warmup_steps=8 is not below this run's 2 optimizer steps: the learning rate rises to 25%"
    assert want in caplog.text
