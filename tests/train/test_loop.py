"""Smoke test of the training loop with the real tiny ClipCap, plus its small building blocks."""

import json
import math

import pytest
import torch
from accelerate import Accelerator

from finecap.config import ConfigError, DecodeConfig, RLConfig
from finecap.contract import StepInfo
from finecap.data.samplers import RandomBatches
from finecap.decode import Generation
from finecap.engines.base import GenerationEngine
from finecap.home import run_path
from finecap.models.captioner import TokenScores
from finecap.models.clipcap import ClipCap
from finecap.objectives import ObjectiveOutput
from finecap.objectives.base import as_objective
from finecap.objectives.baselines import NoBaseline
from finecap.objectives.mle import MLE
from finecap.objectives.reinforce import Reinforce
from finecap.rewards import RewardOutput
from finecap.runs import checkpoint_dir, model_dir
from finecap.train.engine import (
    Engine,
    TrainingData,
    best_mode,
    build_optimizer,
    is_better,
    reference_items,
    total_steps,
    weighted_loss,
)
from finecap.train.logging import mean_over_processes
from finecap.train.run import train
from finecap.train.schedule import build_scheduler
from finecap.train.setup import build_model, train_unit
from finecap.train.state import config_changes
from finecap.utils.rng import seed_everything
from helpers.equivalence import LR, compare, weights
from helpers.logged_keys import undocumented
from helpers.objective_steps import FixedLogits


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_smoke_training_changes_parameters_and_lowers_loss(make_cfg):
    cfg = make_cfg("train.max_steps=16", "train.eval_every=8", "train.validators=[captions]")
    seed_everything(cfg.run.seed)
    initial = {k: v.clone() for k, v in ClipCap.build(cfg).state_dict().items()}  # the same init train() builds
    seen_steps = []
    run_dir = train(cfg, callbacks=[lambda state: seen_steps.append(state.step)])
    assert seen_steps == list(range(1, 17))

    trained = ClipCap.from_checkpoint(model_dir(checkpoint_dir(run_dir, "last"))).state_dict()
    changed = [k for k in initial if not torch.equal(initial[k], trained[k])]
    assert any(k.startswith("mapper.") for k in changed) and any(k.startswith("lm.") for k in changed)
    assert not any(k.startswith("encoder.") for k in changed)  # frozen encoder

    events = read_metrics(run_dir)
    train_loss = [e["values"]["loss"] for e in events if e["split"] == "train"]
    assert len(train_loss) == 16
    assert sum(train_loss[-3:]) / 3 < sum(train_loss[:3]) / 3 - 0.2
    val = [e for e in events if e["split"] == "val"]
    assert [e["step"] for e in val] == [8, 16]
    assert val[1]["values"]["loss"] < val[0]["values"]["loss"]
    assert {"loss", "perplexity", "length", "vocab"} <= set(val[0]["values"])
    first = events[0]
    assert set(first) == {"step", "epoch", "split", "values"}
    assert {"loss", "loss/mle", "accuracy", "lr", "grad_norm"} <= set(first["values"])
    assert undocumented({k for e in events if e["split"] == "train" for k in e["values"]}) == []  # docs/training.md
    # 40 scenes x 5 references = 200 examples, 16 per step -> 13 steps per epoch; step 1 is at epoch 1/13
    assert first["epoch"] == pytest.approx(round(1 / 13, 4))

    assert (run_dir / "config.yaml").exists()
    best = json.loads((checkpoint_dir(run_dir, "best") / "trainer_state.json").read_text())
    assert best["metric"] == "loss" and best["best_step"] == 16  # loss still falling: the last eval is the best
    assert not (checkpoint_dir(run_dir, "best") / "trainer_state.pt").exists()
    assert not list((run_dir / "checkpoints").glob(".*"))  # no temporary folders left


def test_existing_run_needs_resume_or_overwrite(make_cfg):
    cfg = make_cfg("train.max_steps=1")
    train(cfg)
    with pytest.raises(ValueError, match="run.dir: .* already holds a run; pass --resume") as refused:
        train(cfg)
    # a notebook's training cell run again: the message names what replaces the run (it named only --resume)
    assert "finecap.train(..., overwrite=True)" in str(refused.value)
    train(cfg, overwrite=True)
    assert [e["step"] for e in read_metrics(run_path(cfg.run))] == [1, 1]  # one train + one val event, old ones gone


def test_best_metric_must_be_a_validation_value(make_cfg):
    # checked when the configuration is loaded, not at the first evaluation
    with pytest.raises(ConfigError, match=r"train.best_metric: 'r@1' is not a validation value .*available: loss"):
        make_cfg("train.max_steps=1", "train.best_metric=r@1")
    assert make_cfg("train.best_metric=r@1", "train.validators=[retrieval]").train.best_metric == "r@1"
    # cider_d: only with the CIDEr-D validator, and maximised
    with pytest.raises(ConfigError, match=r"best_metric: .cider_d. is not a validation value .*cider -> cider_d"):
        make_cfg("train.best_metric=cider_d", "train.validators=[captions]")
    cfg = make_cfg("train.best_metric=cider_d", "train.validators=[cider]")
    assert cfg.train.best_metric == "cider_d" and best_mode(cfg.train) == "max"


def score_validator(cfg):
    """A user validator factory, named in train.validators by its dotted path."""
    scores = iter([0.2, 0.9, 0.5])

    def validator(model, cfg, accelerator):
        return {"score": next(scores)}

    return validator


def test_custom_validator_selects_best_checkpoint(make_cfg):
    cfg = make_cfg("train.max_steps=3", "train.eval_every=1", "train.best_metric=score",
                   f"train.validators=['{__name__}:score_validator']")  # fmt: skip
    run_dir = train(cfg)
    best = json.loads((checkpoint_dir(run_dir, "best") / "trainer_state.json").read_text())
    assert best["best_step"] == 2 and best["best_value"] == 0.9  # maximised: 0.2, 0.9, 0.5


def test_cider_validator_selects_the_best_validation_checkpoint(make_cfg, monkeypatch):
    # The validator's CIDEr-D at the three evaluations is injected (1.2, 1.9, 1.5): the best checkpoint is step 2's,
    # not the last model (whose weights, step 3's, differ)
    import finecap.train.validators as validators

    ciders = iter([1.2, 1.9, 1.5])
    monkeypatch.setattr(validators, "evaluate", lambda *a, **k: {"CIDEr-D": next(ciders)})
    cfg = make_cfg("train.max_steps=3", "train.eval_every=1", "train.validators=[cider]", "train.best_metric=cider_d")
    run_dir = train(cfg)
    best = json.loads((checkpoint_dir(run_dir, "best") / "trainer_state.json").read_text())
    assert best["metric"] == "cider_d" and best["best_step"] == 2 and best["best_value"] == 1.9
    val = [e["values"] for e in read_metrics(run_dir) if e["split"] == "val"]
    assert [v["cider_d"] for v in val] == [1.2, 1.9, 1.5] and all("length" in v for v in val)
    best_weights = ClipCap.from_checkpoint(model_dir(checkpoint_dir(run_dir, "best"))).state_dict()
    last_weights = ClipCap.from_checkpoint(model_dir(checkpoint_dir(run_dir, "last"))).state_dict()
    assert any(not torch.equal(best_weights[k], last_weights[k]) for k in best_weights)


def test_weighted_loss():
    losses = {"a": torch.tensor(2.0), "b": torch.tensor(3.0)}
    assert float(weighted_loss(losses, {})) == 5.0  # 2 + 3
    assert float(weighted_loss(losses, {"b": 0.5})) == 3.5  # 2 + 0.5 * 3
    with pytest.raises(ValueError, match=r"train.loss_weights: \['c'\] are not losses of this objective"):
        weighted_loss(losses, {"c": 1.0})


def test_is_better_modes(make_cfg):
    mode = best_mode(make_cfg().train)
    assert mode == "min" and is_better(1.0, None, mode) and is_better(1.0, 2.0, mode) and not is_better(3.0, 2.0, mode)
    mode = best_mode(make_cfg("train.best_metric=r@1", "train.validators=[retrieval]").train)
    assert mode == "max" and is_better(3.0, 2.0, mode) and not is_better(1.0, 2.0, mode)  # others: max
    mode = best_mode(make_cfg("train.best_metric=length", "train.best_mode=min", "train.validators=[captions]").train)
    assert is_better(1.0, 2.0, mode)


def test_non_finite_values_never_become_best():
    for mode in ("min", "max"):
        assert not is_better(float("nan"), None, mode) and not is_better(float("inf"), 2.0, mode)
        assert is_better(1.0, float("nan"), mode)  # a NaN best (from an older run) is replaced by any finite value


def test_total_steps_fractional_epochs(make_cfg):
    sampler = RandomBatches(10, 4)  # 3 batches per epoch
    assert total_steps(make_cfg("train.epochs=2.5").train, sampler) == 8  # 3 + 3 + ceil(0.5 * 3)
    assert total_steps(make_cfg("train.epochs=1", "train.max_steps=5").train, sampler) == 5
    # resumed: the checkpoint's steps, then this run's batches of what is left (2 batches an epoch before, 3 now)
    cfg = make_cfg("train.epochs=2.5").train
    assert total_steps(cfg, sampler, {"step": 2, "epoch": 1, "position": 0}) == 2 + 3 + 2
    assert total_steps(cfg, sampler, {"step": 4, "epoch": 1, "position": 1}) == 4 + 2 + 2  # its own batches
    assert total_steps(cfg, sampler, {"step": 7, "epoch": 3, "position": 0}) == 7 - 1  # past 2.5 epochs: < step


def test_config_changes_reported_on_resume(make_cfg, tmp_path):
    saved = tmp_path / "config.yaml"
    make_cfg().save(saved)
    assert config_changes(saved, make_cfg().saved_dict()) == []
    assert config_changes(saved, make_cfg("train.lr=1e-3").saved_dict()) == ["train.lr: 0.003 -> 0.001"]
    saved.write_text(saved.read_text().replace("  lr: 0.003\n", ""))  # a key the old run did not have: not reported
    assert config_changes(saved, make_cfg("train.lr=1e-3").saved_dict()) == []


class TwoLosses:
    """Objective with losses a = c * 100 * sum(p) and b = c * 200 * sum(p) on a 4-element parameter p, where c is the
    batch's ``scale`` (1 by default), a mean over ``batch["items"]`` items."""

    def __call__(self, model, batch):
        s = model.p.sum() * batch.get("scale", 1.0)
        return ObjectiveOutput(losses={"a": 100 * s, "b": 200 * s}, metrics={"m": 7.0}, num_items=batch.get("items"))


def _engine(make_cfg, objective, *overrides, model=None):
    """An engine training ``model`` (by default a module of one parameter ``p``, 4 zeros) with ``objective``."""
    cfg = make_cfg("train.weight_decay=0", "train.warmup_steps=0", *overrides)
    if model is None:
        model = torch.nn.Module()
        model.p = torch.nn.Parameter(torch.zeros(4))
    optimizer = build_optimizer(model, cfg.train)
    scheduler = build_scheduler(optimizer, warmup=0, total=10, kind="constant")
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=cfg.train.grad_accum_steps,
                              step_scheduler_with_optimizer=False)  # fmt: skip
    data = TrainingData(dataset=None, collator=None, sampler=RandomBatches(2, 2))
    engine = Engine(cfg.train, accelerator, model, as_objective(objective), data, optimizer, scheduler, seed=0,
                    total=10, progress=False)  # fmt: skip
    return model, engine


def _step(make_cfg, *overrides, micro_batches=({"index": [0, 1]},)):
    model, engine = _engine(make_cfg, TwoLosses(), *overrides)
    return model, engine.train_step(list(micro_batches))


def test_train_step_weights_logs_and_clips(make_cfg):
    # weights {b: 0.5}: total = 100 s + 0.5 * 200 s = 200 s -> gradient 200 per element, norm sqrt(4 * 200^2) = 400
    model, values = _step(make_cfg, "train.loss_weights={b: 0.5}", "train.grad_clip=0")
    assert torch.equal(model.p.grad, torch.full((4,), 200.0))
    assert values["grad_norm"] == pytest.approx(400.0)
    assert set(values) == {"loss", "loss/a", "loss/b", "m", "lr", "grad_norm"}
    assert values["loss"] == 0.0 and values["m"] == 7.0 and values["lr"] == pytest.approx(3e-3)
    # clipping to norm 1 scales the gradient by 1/400: 200 / 400 = 0.5 per element; the logged norm is pre-clip
    model, values = _step(make_cfg, "train.loss_weights={b: 0.5}", "train.grad_clip=1")
    assert torch.allclose(model.p.grad, torch.full((4,), 0.5)) and values["grad_norm"] == pytest.approx(400.0)
    # Adam's first step moves every element by lr against the gradient's sign
    assert torch.allclose(model.p.detach(), torch.full((4,), -3e-3))


def test_accumulated_micro_batches_are_weighted_by_their_items(make_cfg):
    # Two micro-batches whose losses are means over 1 and 3 items with scales 1 and 2: the step's gradient is that of
    # the mean over all 4 items, (1 * 1 + 3 * 2) / 4 = 1.75 times the single-batch gradient of 200 -> 350 (not the
    # plain mean of the two micro-batch gradients, (200 + 400) / 2 = 300).
    micro = ({"items": 1, "scale": 1.0}, {"items": 3, "scale": 2.0})
    model, values = _step(make_cfg, "train.loss_weights={b: 0.5}", "train.grad_clip=0", "train.grad_accum_steps=2",
                          micro_batches=micro)  # fmt: skip
    assert torch.allclose(model.p.grad, torch.full((4,), 350.0))
    assert values["loss"] == 0.0 and values["grad_norm"] == pytest.approx(700.0)


def _backward_values(make_cfg, monkeypatch, micro: list) -> tuple[torch.nn.Module, list[float], dict[str, float]]:
    """One engine step of :class:`TwoLosses` at p = 1 (weights {b: 0.5}, no clipping), its micro-batches ``micro``
    accumulated: the model, the value each micro-batch passed to ``accelerator.backward`` and the logged values."""
    model, engine = _engine(make_cfg, TwoLosses(), "train.loss_weights={b: 0.5}", "train.grad_clip=0",
                            f"train.grad_accum_steps={len(micro)}")  # fmt: skip
    with torch.no_grad():
        model.p.fill_(1.0)
    backward, seen = engine.accelerator.backward, []
    monkeypatch.setattr(engine.accelerator, "backward", lambda loss: (seen.append(loss.item()), backward(loss)))
    return model, seen, engine.train_step(micro)


def test_each_micro_batch_back_propagates_its_loss_weighted_relative_to_the_first(make_cfg, monkeypatch):
    # p = 1: the losses (weights {b: 0.5}) are 800 x scale, means over 300 and 100 items. Weighted by the items
    # themselves the engine back-propagated 480,000 and 80,000, hundreds of times a mean loss (fp16's scaled
    # gradients overflow: test_mixed_precision.py); weighted by items / R, R = 300 (the first micro-batch's items),
    # 1600 and 800 / 3. The step's gradient stays the item-weighted mean's: (300 x 2 + 100 x 1) / 400 = 1.75 times
    # the gradient of 200 per element at scale 1 (a plain mean of the micro-batch means would give 1.5 x 200)
    model, seen, values = _backward_values(make_cfg, monkeypatch, [{"items": 300, "scale": 2.0},
                                                                    {"items": 100, "scale": 1.0}])  # fmt: skip
    assert seen == pytest.approx([1600.0, 800.0 / 3], rel=1e-6)
    assert torch.allclose(model.p.grad, torch.full((4,), 350.0))
    assert values["loss"] == 1400.0 and values["grad_norm"] == pytest.approx(700.0)


class ProcessesSumming:
    """An accelerator of 2 processes whose ``reduce`` adds the other process's values to this one's."""

    num_processes, device = 2, torch.device("cpu")

    def __init__(self, other: list[float]):
        self.other = other

    def reduce(self, tensor, reduction):
        assert reduction == "sum"
        return tensor + torch.tensor(self.other)


def test_the_reference_item_count_is_the_mean_of_the_first_micro_batches_that_have_items():
    one = type("OneProcess", (), {"num_processes": 1})()
    assert reference_items(one, 184.0) == 184.0
    assert reference_items(one, 0.0) == 1.0  # no items (e.g. no caption tokens): no division by 0
    assert reference_items(one, math.nan) == reference_items(one, math.inf) == 1.0  # a count that is not one
    assert reference_items(ProcessesSumming([60.0, 1.0]), 90.0) == 75.0  # the mean over both processes
    # the other process's first micro-batch is a copy or has no items (0): R is this one's items, not half of them
    assert reference_items(ProcessesSumming([0.0, 0.0]), 90.0) == 90.0
    assert reference_items(ProcessesSumming([90.0, 1.0]), 0.0) == 90.0  # likewise, seen from that process
    assert reference_items(ProcessesSumming([0.0, 0.0]), 0.0) == 1.0  # no process has items


def test_on_one_process_the_reference_is_the_first_micro_batch_that_has_items(make_cfg, monkeypatch):
    # the first micro-batch has no items (weight 0 whatever R is); R is the second's 100 items, so it back-propagates
    # its loss (800 at scale 1, weights {b: 0.5}) x 100 / 100, not x 100 / 1 (R = 1 when taken from the first: the
    # item-sized loss that overflowed fp16's scaled gradients); the step's gradient is the second's, 200 per element
    model, seen, values = _backward_values(make_cfg, monkeypatch, [{"items": 0}, {"items": 100},
                                                                    {"items": 300, "scale": 2.0}])  # fmt: skip
    assert seen == pytest.approx([0.0, 800.0, 4800.0], rel=1e-6)
    assert torch.allclose(model.p.grad, torch.full((4,), 350.0))  # (100 x 1 + 300 x 2) / 400 x 200
    assert values["loss"] == 1400.0


def test_a_step_whose_micro_batches_have_no_items_takes_a_zero_gradient(make_cfg):
    # every micro-batch reports 0 items (e.g. no caption tokens): each loss is weighted 0, so the step's gradient is
    # 0 and its loss, a mean over no items, NaN; the sync divided by the 0 items (ZeroDivisionError) until 2026-11-28
    model, engine = _engine(make_cfg, TwoLosses(), "train.grad_clip=0", "train.grad_accum_steps=2")
    with torch.no_grad():
        model.p.fill_(1.0)
    values = engine.train_step([{"items": 0}, {"items": 0}])
    assert torch.equal(model.p.grad, torch.zeros(4)) and torch.equal(model.p.detach(), torch.ones(4))
    assert math.isnan(values["loss"]) and values["grad_norm"] == 0.0


class Scored:
    """Objective of the RL family's shape: loss ``batch["advantage"] * sum(p)``, a mean over 2 captions of which
    ``batch["scored"]`` a reward scored (a failed caption's advantage is 0, so a micro-batch that scored none has
    advantage 0 and gradient 0)."""

    def __call__(self, model, batch):
        loss = batch["advantage"] * model.p.sum()
        return ObjectiveOutput(losses={"reinforce": loss}, metrics={}, num_items=2, scored=batch["scored"])


SCORED = {"advantage": 1.0, "scored": 2}  # a micro-batch a reward scored: gradient 1 per element
UNSCORED = {"advantage": 0.0, "scored": 0}  # one whose every caption failed: gradient 0


def test_a_step_no_caption_of_which_was_scored_is_not_taken(make_cfg, caplog):
    # Step 1 is scored and moves p by Adam's first step (-lr per element) and leaves its momentum. Step 2 scored no
    # caption: its gradient is 0, yet AdamW moved p by that momentum alone until 2026-11-29, with nothing learned: by
    # -lr x m / sqrt(v) per element, m = 0.09 / (1 - 0.9^2), v = 0.000999 / (1 - 0.999^2): a further -0.67 lr. Now
    # its update is skipped: p, AdamW's moments and its step count stay as step 1 left them, while the step counts
    # for the schedule (the scheduler advances)
    model, engine = _engine(make_cfg, Scored(), "train.grad_clip=0")
    first = engine.train_step([SCORED])
    engine.state.step += 1
    after_one = model.p.detach().clone()
    adam = {k: v.clone() for k, v in engine.optimizer.state[model.p].items()}
    with caplog.at_level("WARNING", logger="finecap.train.engine"):
        values = engine.train_step([UNSCORED])
    engine.state.step += 1
    assert torch.equal(model.p.detach(), after_one)
    assert all(torch.equal(engine.optimizer.state[model.p][k], v) for k, v in adam.items())  # step count 1 too
    assert engine.scheduler.scheduler.last_epoch == 2  # a step of the schedule all the same
    assert first["skipped/unscored"] == 0.0 and values["skipped/unscored"] == 1.0
    assert "grad_norm" not in values  # no norm taken: no update
    assert "train: step 2: no caption of the step carries a learning signal" in caplog.text
    assert "the optimizer update is skipped" in caplog.text
    values = engine.train_step([SCORED])  # the next scored step is taken, from the state step 1 left
    assert values["skipped/unscored"] == 0.0 and values["grad_norm"] == pytest.approx(2.0)
    assert not torch.equal(model.p.detach(), after_one) and int(engine.optimizer.state[model.p]["step"]) == 2


def test_an_accumulated_step_is_skipped_only_when_none_of_its_micro_batches_scored_a_caption(make_cfg):
    model, engine = _engine(make_cfg, Scored(), "train.grad_clip=0", "train.grad_accum_steps=2")
    start = model.p.detach().clone()
    taken = engine.train_step([UNSCORED, SCORED])  # one micro-batch scored: the step has a signal
    moved = model.p.detach().clone()
    assert not torch.equal(moved, start)
    skipped = engine.train_step([UNSCORED, UNSCORED])
    assert torch.equal(model.p.detach(), moved)
    assert taken["skipped/unscored"] == 0.0 and taken["grad_norm"] > 0 and skipped["skipped/unscored"] == 1.0


def test_the_skip_is_decided_on_every_processs_captions(make_cfg, monkeypatch):
    # Two processes: this one's micro-batches scored nothing, the other's did (or did not). The decision is the sum
    # over the processes (the all-reduce of the step's counts, simulated: the other process's local counts, recorded
    # from its own step, added to this one's), so every process steps, or every process skips, alike: a process
    # that skipped alone would leave its DDP replica (or FSDP2 shards) behind the others'
    def other_process(batch):
        _, other = _engine(make_cfg, Scored(), "train.grad_accum_steps=2")
        seen = []
        monkeypatch.setattr(other.accelerator, "reduce", lambda t, reduction: seen.append(t.clone()) or t)
        other.train_step([batch, batch])
        return seen[0]

    for theirs, skipped in ((SCORED, 0.0), (UNSCORED, 1.0)):
        counts = other_process(theirs)
        model, engine = _engine(make_cfg, Scored(), "train.grad_accum_steps=2")
        monkeypatch.setattr(engine.accelerator, "reduce", lambda t, reduction, c=counts: t + c)
        values = engine.train_step([UNSCORED, UNSCORED])
        assert ("step" in engine.optimizer.state[model.p]) == (not skipped)  # AdamW stepped (its gradient: DDP's)
        assert values["skipped/unscored"] == skipped


class FailsFromStep2:
    """Scores every caption 1 at step 1 (as logged) and none from step 2 on: every caption failed, as a judge that
    went down, or a retrieval reward's one-image global batch (no distractor), leaves them."""

    def __call__(self, captions, batch):
        total = torch.ones(len(captions))
        failed = torch.full((len(captions),), int(batch["step_info"].step) + 1 >= 2)
        return RewardOutput(total.masked_fill(failed, math.nan), {"one": total}, failed)


def fails_from_step_2(cfg):
    return FailsFromStep2()


@pytest.mark.parametrize("objective", [
    ["rl.baseline=mean"],  # REINFORCE: step 1's advantage 1 - 0 on every caption
    ["grpo.advantage=baseline", "rl.baseline=mean", "grpo.policy_loss=clipped", "grpo.kl_coef=0.1"],  # the family
])  # fmt: skip
def test_a_run_whose_second_step_scored_nothing_ends_with_the_first_steps_weights(make_cfg, objective):
    # The same run stopped after step 1, and after step 2, whose every caption failed (constant schedule: step 1 is
    # the same in both). Until 2026-11-29 step 2 still ran AdamW's update, which moved every weight by its
    # momentum from step 1 (up to 0.002 for lr 3e-3) with nothing learned
    options = ["train.objective=reinforce", f"rl.rewards={{'{__name__}:fails_from_step_2': 1.0}}", "rl.samples=2",
               *objective, "clipcap.tiny_dropout=0", "train.warmup_steps=0", "train.schedule=constant",
               "train.eval_every=0", "train.validators=[]", "train.batch_size=8"]  # fmt: skip
    one = weights(train(make_cfg(*options, "train.max_steps=1", run="one")))
    run = train(make_cfg(*options, "train.max_steps=2", run="two"))
    two = weights(run)
    assert all(torch.equal(one[k], two[k]) for k in one)
    logged = [e["values"] for e in read_metrics(run) if e["split"] == "train"]
    assert [v["skipped/unscored"] for v in logged] == [0.0, 1.0]
    assert [v.get("reward/failed") for v in logged] == [None, 1.0]
    assert "grad_norm" not in logged[1] and undocumented(logged[1]) == []  # docs/training.md
    assert json.loads((checkpoint_dir(run, "last") / "trainer_state.json").read_text())["step"] == 2  # it counts


class WordsGreedyFailsFromStep2:
    """Pays a caption its number of words; from step 2 on (1-based) fails every greedy caption (the second call of
    each rollout: the samples are scored first), or with ``odd`` every second sample of each image instead."""

    def __init__(self, odd: bool = False):
        self.calls, self.odd = 0, odd

    def __call__(self, captions, batch):
        self.calls += 1
        total = torch.tensor([float(len(c.split())) for c in captions])
        late = int(batch["step_info"].step) + 1 >= 2
        failed = torch.full((len(captions),), late and not self.odd and self.calls % 2 == 0)
        if self.odd:
            failed = (torch.arange(len(captions)) % 2 == 1) & late
        return RewardOutput(total.masked_fill(failed, math.nan), {"words": total}, failed)


def greedy_fails_from_step_2(cfg):
    return WordsGreedyFailsFromStep2()


def second_samples_fail_from_step_2(cfg):
    return WordsGreedyFailsFromStep2(odd=True)


@pytest.mark.parametrize(("reward", "objective", "taken"), [
    # SCST with one sample: every greedy caption failed, no other sample to fall back on, no baseline
    ("greedy_fails_from_step_2", ["rl.samples=1"], False),
    # GRPO: one of each image's two samples failed, so no group has two scored captions to compare
    ("second_samples_fail_from_step_2", ["rl.samples=2", "grpo.advantage=group"], False),
    # the same, with a term that covers every scored caption: the entropy bonus, GRPO's KL to the reference
    ("greedy_fails_from_step_2", ["rl.samples=1", "rl.entropy_coef=0.1"], True),
    ("second_samples_fail_from_step_2", ["rl.samples=2", "grpo.advantage=group", "grpo.policy_loss=clipped",
                                         "grpo.kl_coef=0.5"], True),
])  # fmt: skip
def test_a_step_whose_scored_captions_have_no_advantage_is_not_taken(make_cfg, reward, objective, taken):
    # Step 2's captions were scored, but none has an advantage (no baseline or group to compare with): its loss is
    # 0 x log p, its gradient 0. Until 2026-11-29 the engine counted scored captions only, took the step, and AdamW
    # moved every weight by its momentum from step 1 (up to 0.002 at lr 3e-3), with nothing learned. A term that
    # covers the scored captions (the entropy bonus, the KL) is a signal: that step is taken
    options = ["train.objective=reinforce", f"rl.rewards={{'{__name__}:{reward}': 1.0}}", *objective,
               "clipcap.tiny_dropout=0", "train.warmup_steps=0", "train.schedule=constant", "train.eval_every=0",
               "train.validators=[]", "train.batch_size=8"]  # fmt: skip
    one = weights(train(make_cfg(*options, "train.max_steps=1", run="one")))
    run = train(make_cfg(*options, "train.max_steps=2", run="two"))
    two = weights(run)
    assert all(torch.equal(one[k], two[k]) for k in one) != taken
    logged = [e["values"] for e in read_metrics(run) if e["split"] == "train"]
    assert [v["skipped/unscored"] for v in logged] == [0.0, float(not taken)]
    assert ("grad_norm" in logged[1]) == taken and undocumented(logged[1]) == []


class CountingEngine(GenerationEngine):
    """A rollout engine (``decode.engine=test_loop:CountingEngine``) that decodes the caption "a b" (2 tokens, the stop
    token included) for each image and counts the weight syncs it is sent (``synced``), as vLLM's would load them."""

    def __init__(self) -> None:
        self.synced = 0

    @classmethod
    def open(cls, model, cfg, *, tempered=False):
        return cls()

    def generate(self, batch, decode, seeds=None):
        n = len(batch["index"]) * decode.num_return_sequences
        return Generation(sequences=torch.ones(n, 2, dtype=torch.long), token_logprobs=torch.zeros(n, 2),
                          lengths=torch.full((n,), 2), image_index=torch.arange(n) // decode.num_return_sequences,
                          scores=torch.zeros(n), texts=["a b"] * n)  # fmt: skip

    def sync(self, policy) -> None:
        self.synced += 1


class Policy(torch.nn.Module):
    """A policy of one parameter per token position: the log-probs of a caption's tokens are ``p[:L]``."""

    def __init__(self):
        super().__init__()
        self.p = torch.nn.Parameter(torch.zeros(4))

    def forward(self, batch, sequences, mask, image_index=None, temperature=1.0, with_entropy=False):
        return TokenScores(self.p[: sequences.shape[1]].expand(sequences.shape) * mask, None)


def one_unless_failing(captions, batch):
    """Reward 1 for every caption, or every caption failed (``batch["fail"]``: a judge down for the micro-batch)."""
    failed = torch.full((len(captions),), bool(batch["fail"]))
    return RewardOutput(torch.ones(len(captions)).masked_fill(failed, math.nan), {}, failed)


def test_a_skipped_step_sends_the_rollout_engine_no_weights(make_cfg):
    # REINFORCE (advantage 1 - 0) whose rollouts a counting engine decodes. Step 1 opens the engine and is taken;
    # step 2's rollout first syncs the weights step 1 changed, and scores no caption: its update is skipped, so the
    # weights the engine holds are the policy's and step 3's rollout needs no sync. Until 2026-11-29 end_step told
    # the engine the policy changed after every step, skipped or not: step 3 synced again (with decode.engine=vllm a
    # full copy of the weights for nothing), syncs [0, 1, 2, 3]
    objective = Reinforce(one_unless_failing, NoBaseline(), rl=RLConfig(samples=2),
                          decode=DecodeConfig(engine=f"{__name__}:CountingEngine"))  # fmt: skip
    model, engine = _engine(make_cfg, objective, "train.grad_clip=0", model=Policy())
    synced, weights_seen = [], []
    for fail in (False, True, False, False):
        before = model.p.detach().clone()
        values = engine.train_step([{"index": torch.tensor([0, 1]), "fail": fail}])
        synced.append(objective.rollouts.engine.synced)
        weights_seen.append((values["skipped/unscored"], not torch.equal(model.p.detach(), before)))
    assert weights_seen == [(0.0, True), (1.0, False), (0.0, True), (0.0, True)]  # step 2 skipped, the others moved
    assert synced == [0, 1, 1, 2]


def test_a_last_batch_smaller_than_the_micro_batches_is_one_big_batchs_step(make_cfg):
    # 200 examples, global batch 3 x 66 = 198: the second step's global batch holds 2 examples for 3 micro-batches,
    # which repeat them ([a], [b], [a]). The copy takes part with weight 0, so the step is that of the 2 examples
    # in one batch; counted, it doubled a's tokens (the step's logged loss was 4.2601 for 4.2541)
    options = ["clipcap.tiny_dropout=0", "train.max_steps=2", "train.warmup_steps=0", "train.schedule=constant",
               f"train.lr={LR}", "train.eval_every=0", "train.validators=[]"]  # fmt: skip
    big = train(make_cfg(*options, "train.batch_size=198", run="big"))
    accum = train(make_cfg(*options, "train.batch_size=66", "train.grad_accum_steps=3", run="accum"))
    logged = [[e["values"] for e in read_metrics(run) if e["split"] == "train"] for run in (big, accum)]
    assert [e["step"] for e in read_metrics(big) if e["split"] == "train"] == [1, 2]
    for key in ("loss", "grad_norm"):
        assert logged[1][1][key] == pytest.approx(logged[0][1][key], rel=1e-5), key
    compare(weights(big), weights(accum), "1 x 66 x 3 accumulation steps, a last batch of 2, vs 1 x 198")


def test_the_logged_loss_parts_are_the_steps_as_the_loss_is(make_cfg):
    # p = 1 (s = 4 x scale): micro-batches of 1 item at scale 1 and 3 items at scale 2 give a = 400 and 800, b = 800
    # and 1600. The step's parts are item-weighted as its loss: a = (400 + 3 * 800) / 4 = 700, b = 1400, and with
    # weights {b: 0.5} loss = a + b / 2 = 1400; means of the micro-batch means (a = 600, b = 1200) would not add up
    # to the loss, and would move with the split (a 2-process run's parts differed from one process's)
    model, engine = _engine(make_cfg, TwoLosses(), "train.loss_weights={b: 0.5}", "train.grad_accum_steps=2")
    with torch.no_grad():
        model.p.fill_(1.0)
    values = engine.train_step([{"items": 1, "scale": 1.0}, {"items": 3, "scale": 2.0}])
    assert (values["loss/a"], values["loss/b"], values["loss"]) == (700.0, 1400.0, 1400.0)
    assert values["m"] == 7.0  # metrics stay means over the micro-batches


def test_mles_logged_accuracy_is_the_steps_share_of_its_tokens_predicted_right(make_cfg):
    # Fixed logits whose top tokens are 0, 1, 0 (caption 0) and 1, 2, 2 (caption 1); two accumulated micro-batches:
    # 5 tokens of which 4 are right (label 0 at (1, 1), where 2 is on top), then 1 token that is wrong. The step's
    # accuracy is 4 / 6; the mean of the micro-batches' shares, (0.8 + 0) / 2 = 0.4, was logged until 2026-11-29.
    logits = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 0.7, 0.0], [50.0, -50.0, 9.0]],
                           [[0.0, 1.1, 0.0], [-7.0, 3.0, 20.0], [1.0, 2.0, 3.0]]])  # fmt: skip
    labels = ([[0, 1, 0], [1, 0, -100]], [[2, -100, -100], [-100, -100, -100]])
    _, engine = _engine(make_cfg, MLE(), "train.grad_accum_steps=2", model=FixedLogits(logits))
    values = engine.train_step([{"labels": torch.tensor(t)} for t in labels])
    assert values["accuracy"] == pytest.approx(4 / 6) and values["tokens"] == 3  # tokens: per micro-batch


class RewardOfTheBatch:
    """Objective logging the micro-batch's ``reward``: NaN where none of its captions was scored (every reward call
    failed), as the REINFORCE family's reward means are (``finecap.rewards.base.scored_mean``)."""

    def __call__(self, model, batch):
        return ObjectiveOutput(losses={"a": model.p.sum()}, metrics={"reward": batch["reward"]}, num_items=1)


def test_a_value_no_caption_defined_is_left_out_of_the_logged_means(make_cfg, monkeypatch):
    # A micro-batch whose captions all failed made its step's reward NaN, and the NaN the mean of the whole log
    # window (and of the processes): one failed micro-batch in train.log_every steps hid every scored one
    nan = float("nan")
    _, engine = _engine(make_cfg, RewardOfTheBatch(), "train.grad_accum_steps=2")
    logged = []
    monkeypatch.setattr(engine.accelerator, "log", lambda values, step: logged.append(values))
    first = engine.train_step([{"reward": 0.2}, {"reward": nan}])
    assert first["reward"] == 0.2  # the step's scored micro-batch
    engine.logger.add(first)
    engine.logger.add(engine.train_step([{"reward": 0.6}, {"reward": 0.4}]))  # 0.5
    engine.logger.add(engine.train_step([{"reward": nan}, {"reward": nan}]))  # nothing scored: NaN
    engine.logger.flush_train(3, 0.3)
    assert logged[-1]["train/reward"] == pytest.approx((0.2 + 0.5) / 2)  # the steps that had a reward
    engine.logger.add(engine.train_step([{"reward": nan}, {"reward": nan}]))
    engine.logger.flush_train(4, 0.4)
    assert math.isnan(logged[-1]["train/reward"])  # none had one: logged as such
    # over processes likewise: process 0 scored 0.3, process 1 nothing; m is 1.0 and 3.0
    monkeypatch.setattr("finecap.train.logging.gather_object", lambda x: [{"reward": 0.3, "m": 1.0},
                                                                          {"reward": nan, "m": 3.0}])  # fmt: skip
    two = type("TwoProcesses", (), {"num_processes": 2})()
    assert mean_over_processes({}, two) == {"reward": 0.3, "m": 2.0}


class Timed:
    """Objective logging the micro-batch's seconds (``time/generate``) and a ``reward``, as the RL objectives do."""

    def __call__(self, model, batch):
        metrics = {"time/generate": batch["seconds"], "reward": batch["seconds"] / 10}
        return ObjectiveOutput(losses={"a": model.p.sum()}, metrics=metrics, num_items=1)


def test_the_seconds_of_a_step_are_summed_over_its_micro_batches(make_cfg):
    # 4 accumulation steps of 1, 2, 3 and 4 seconds: the step spent 10 s (until 2026-11-29 it logged their mean, 2.5 s,
    # a quarter of the step's time); a copy micro-batch's seconds were spent too; other values stay means
    _, engine = _engine(make_cfg, Timed(), "train.grad_accum_steps=4")
    values = engine.train_step([{"seconds": float(s)} for s in (1, 2, 3, 4)])
    assert values["time/generate"] == 10.0 and values["reward"] == pytest.approx(0.25)
    info = StepInfo(0, ["a", "b"])
    values = engine.train_step([{"seconds": float(s), "step_info": info} for s in (1, 2, 3, 4)], [False] * 3 + [True])
    assert values["time/generate"] == 10.0 and values["reward"] == pytest.approx(0.2)
    # a log window is the mean over its steps: seconds per optimizer step
    engine.logger.add({"time/generate": 10.0})
    engine.logger.add({"time/generate": 20.0})
    assert engine.logger.means() == {"time/generate": 15.0}


class CopiesSeen:
    """Objective logging the micro-batch's ``reward`` and ``advantage/max`` and recording whether each micro-batch it
    ran was marked a copy (``batch["step_info"].copy``)."""

    def __init__(self):
        self.seen = []

    def __call__(self, model, batch):
        self.seen.append(batch["step_info"].copy)
        metrics = {"reward": batch["reward"], "advantage/max": batch["reward"]}
        return ObjectiveOutput(losses={"a": model.p.sum()}, metrics=metrics, num_items=1)


def test_a_copy_micro_batch_is_marked_for_the_objective_and_left_out_of_the_logged_values(make_cfg):
    # A last global batch of 2 examples cut into 3 micro-batches: [a], [b] and a copy of [a], weighted 0. The
    # objective is told which one is the copy (StepInfo.copy: what it sums over the step, such as the reward-hacking
    # monitor's measures, leaves it out), and its logged values count only the real micro-batches: (0.2 + 0.6) / 2,
    # not (0.2 + 0.6 + 0.2) / 3 as until 2026-11-28 (a copy's captions counted twice in the logged reward)
    objective = CopiesSeen()
    _, engine = _engine(make_cfg, objective, "train.grad_accum_steps=3")
    info = StepInfo(0, ["a", "b"])
    micro = [{"reward": r, "step_info": info} for r in (0.2, 0.6, 0.2)]
    values = engine.train_step(micro, [False, False, True])
    assert objective.seen == [False, False, True] and [m["step_info"].copy for m in micro] == [False] * 3
    assert values["reward"] == pytest.approx(0.4) and values["advantage/max"] == 0.6
    # a process whose every micro-batch is a copy logs none of the objective's values (the others' speak for it)
    values = engine.train_step([{"reward": 0.9, "step_info": info}] * 3, [True, True, True])
    assert "reward" not in values and "advantage/max" not in values and math.isnan(values["loss"])
    with pytest.raises(ValueError, match=r"a copy micro-batch needs batch\['step_info'\]"):
        engine.train_step([{"reward": 0.2}, {"reward": 0.6}, {"reward": 0.2}], [False, False, True])


class ExtremesOfTheBatch:
    """Objective logging the micro-batch's ``advantage/min|max`` and their mean, as the GRPO family does."""

    def __call__(self, model, batch):
        adv = batch["advantages"]
        metrics = {"advantage/min": min(adv), "advantage/max": max(adv), "advantage_mean": sum(adv) / len(adv)}
        return ObjectiveOutput(losses={"a": model.p.sum()}, metrics=metrics, num_items=1)


def test_a_logged_extreme_is_the_extreme_of_the_micro_batches_steps_and_processes(make_cfg, monkeypatch):
    # advantage/min of a step cut into micro-batches [-1, 2] and [-3, 0] is -3, the union's minimum; a mean of the
    # minima (-2) changed with the cut. The log window and the processes reduce extremes as extremes too (min of
    # the minima), while the other values stay means
    _, engine = _engine(make_cfg, ExtremesOfTheBatch(), "train.grad_accum_steps=2")
    logged = []
    monkeypatch.setattr(engine.accelerator, "log", lambda values, step: logged.append(values))
    first = engine.train_step([{"advantages": [-1.0, 2.0]}, {"advantages": [-3.0, 0.0]}])
    assert (first["advantage/min"], first["advantage/max"], first["advantage_mean"]) == (-3.0, 2.0, -0.5)
    engine.logger.add(first)
    engine.logger.add(engine.train_step([{"advantages": [-2.0, 5.0]}, {"advantages": [1.0, 4.0]}]))  # -2, 5; 2
    engine.logger.flush_train(2, 0.2)
    assert (logged[-1]["train/advantage/min"], logged[-1]["train/advantage/max"]) == (-3.0, 5.0)
    assert logged[-1]["train/advantage_mean"] == 0.75  # (-0.5 + 2) / 2
    parts = [{"ratio/min": 0.9, "ratio/max": 1.2}, {"ratio/min": 0.7, "ratio/max": 1.1}]  # 2 processes' values
    monkeypatch.setattr("finecap.train.logging.gather_object", lambda x: parts)
    two = type("TwoProcesses", (), {"num_processes": 2})()
    assert mean_over_processes({}, two) == {"ratio/min": 0.7, "ratio/max": 1.2}
    # a pending window saved before extremes were reduced so (no "extremes" in the state) held their sum: it is
    # taken as their mean, what that run would have logged; a state saved now keeps the extreme
    engine.logger.load_state_dict({"sums": {"advantage/min": -4.0}, "counts": {"advantage/min": 2}})
    assert engine.logger.means() == {"advantage/min": -2.0}
    engine.logger.add({"advantage/min": -1.0})
    engine.logger.load_state_dict(engine.logger.state_dict())
    assert engine.logger.means() == {"advantage/min": -2.0}


def test_init_from_starts_from_a_checkpoint(make_cfg):
    first = train(make_cfg("train.max_steps=2", run="first"))
    start = checkpoint_dir(first, "best")
    model = build_model(make_cfg(f"train.init_from={start}"))
    saved = ClipCap.from_checkpoint(model_dir(start)).state_dict()
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    train(make_cfg(f"train.init_from={start}", "train.max_steps=1", run="second"))


def test_train_unit(make_cfg):
    class Sampling:
        example_unit = "image"

    assert train_unit(make_cfg(), MLE()) == "caption"
    assert train_unit(make_cfg(), Sampling()) == "image"
    assert train_unit(make_cfg("data.train_unit=caption"), Sampling()) == "caption"
    run_dir = train(make_cfg("data.train_unit=image", "train.max_steps=1"))
    # 40 training images (not 200 captions) / 16 per step -> 3 steps per epoch
    assert read_metrics(run_dir)[0]["epoch"] == pytest.approx(round(1 / 3, 4))


def test_a_run_without_a_checkpoint_is_not_sent_to_resume(make_cfg):
    """A run that failed before its first checkpoint (a notebook's interrupted cell) left config.yaml and the metrics:
    the error said to pass --resume, which then refused for want of a checkpoint; it names what works instead."""
    import shutil

    cfg = make_cfg("train.max_steps=1")
    run_dir = train(cfg)
    shutil.rmtree(run_dir / "checkpoints")
    with pytest.raises(ValueError) as e:
        train(cfg)
    message = str(e.value)
    assert "already holds a run, with no checkpoint to resume from (found: no checkpoints/ folder)" in message
    assert "--resume" not in message and "overwrite=True" in message
    with pytest.raises(Exception, match="overwrite=True"):  # and --resume says so too
        train(cfg, resume=True)
    train(cfg, overwrite=True)  # what the message says works


def test_training_turns_grad_on_whatever_the_callers_mode(make_cfg):
    import torch

    import finecap

    with torch.no_grad():  # left over from a notebook's inference cell
        run_dir = train(make_cfg("train.max_steps=1"))
    assert [e["step"] for e in read_metrics(run_dir) if e["split"] == "train"] == [1]
    with torch.inference_mode():  # the same through the Python API, whose model is built in that mode too
        run_dir = finecap.train(make_cfg("train.max_steps=1", run="inference"))
    assert [e["step"] for e in read_metrics(run_dir) if e["split"] == "train"] == [1]


def test_the_python_api_gives_the_callers_tf32_flags_back(make_cfg, monkeypatch):
    """train.tf32 sets torch's process-wide TF32 flags on a CUDA device (here the CPU run is handed a CUDA device's
    call, as accelerate on a GPU would make it); after finecap.train a notebook's float32 matmuls keep its precision:
    the flags are as the caller left them, whether the run turned TF32 on or, with train.tf32=false, cuDNN's off."""
    import torch

    import finecap
    from finecap.train import engine

    seen = []
    apply = engine.apply_tf32

    def on_cuda(enabled, device):
        seen.append(apply(enabled, torch.device("cuda")))
        seen.append(engine.tf32_settings())

    monkeypatch.setattr(engine, "apply_tf32", on_cuda)
    saved = engine.tf32_settings()
    try:
        for tf32, theirs, during in ((True, ("ieee",) * 2, ("tf32",) * 2), (False, ("tf32",) * 2, ("ieee",) * 2)):
            torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision = theirs
            seen.clear()
            finecap.train(make_cfg("train.max_steps=1", f"train.tf32={str(tf32).lower()}", run=f"tf32_{tf32}"))
            assert seen == [True, during]  # the run itself had the flags it asked for
            assert engine.tf32_settings() == theirs
    finally:
        torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision = saved


def test_the_python_api_gives_the_callers_generators_and_accelerate_state_back(make_cfg):
    """finecap.train seeds the generators with run.seed and sets accelerate's per-process state up for its run; a
    notebook's own generators and Accelerator are as they were afterwards."""
    import random

    import numpy as np
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    import finecap

    mine = Accelerator(cpu=True, gradient_accumulation_steps=4)
    try:
        torch.manual_seed(1234), np.random.seed(1234), random.seed(1234)
        expected = (torch.rand(3), np.random.rand(3), random.random())
        torch.manual_seed(1234), np.random.seed(1234), random.seed(1234)
        finecap.train(make_cfg("train.max_steps=1", "train.grad_accum_steps=1"))
        got = (torch.rand(3), np.random.rand(3), random.random())
        assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1]) and got[2] == expected[2]
        assert mine.gradient_accumulation_steps == 4 and GradientState().num_steps == 4
    finally:  # this test's accelerator leaves nothing to the next test in this process
        AcceleratorState._reset_state()
        GradientState._reset_state()


def test_a_notebooks_next_run_sets_up_its_own_device(make_cfg):
    """finecap.train made accelerate's process state (``PartialState``, which holds the device) for its run and left
    it: a notebook's run with train.cpu=true and a later one without it on a GPU machine trained both on the CPU
    (accelerate sets the state up once per process). Afterwards there is none again, so the next run's is made for
    its own ``train.cpu``; a caller's own state is theirs, untouched."""
    from accelerate.state import PartialState

    import finecap
    from finecap.config import TrainConfig
    from finecap.train.engine import process_state

    theirs = dict(PartialState._shared_state)  # this test process's (other tests made it), given back at the end
    try:
        PartialState._reset_state()  # a fresh notebook's process: none yet
        finecap.train(make_cfg("train.max_steps=1", "train.cpu=true", run="on_cpu"))
        assert PartialState._shared_state == {}
        assert process_state(TrainConfig(cpu=False))._cpu is False  # set up for the next run's own device
        mine = dict(PartialState._shared_state)
        finecap.train(make_cfg("train.max_steps=1", "train.cpu=true", run="again"))
        assert PartialState._shared_state == mine  # a caller's own, as it was
    finally:
        PartialState._shared_state.clear()
        PartialState._shared_state.update(theirs)


def test_an_interrupted_run_closes_its_progress_bar(make_cfg, monkeypatch):
    """Ctrl-C (or any error) during the steps closes the training bar: a notebook keeps the traceback, which held the
    bar open, and the next run's bar was drawn under it (tqdm's position 1) with the stale one redrawn."""
    from finecap.train import engine

    closed = []

    class Bar(engine.tqdm):
        def close(self):
            closed.append(self.desc)
            super().close()

    def interrupt(state):
        if state.step == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(engine, "tqdm", Bar)
    with pytest.raises(KeyboardInterrupt) as interrupted:  # holds the traceback, as a notebook does
        train(make_cfg("train.max_steps=4"), callbacks=[interrupt])
    assert closed == ["train"] and interrupted.traceback


def test_init_from_takes_a_run_directory(tmp_path):
    """`train.init_from=RUN` starts from the run's best checkpoint (else its last), as `finecap caption --checkpoint
    RUN` and `finecap export RUN` read it and the not-found error offers it; it was read as a model folder and
    refused (`RUN: not a captioner checkpoint (no captioner.json)`)."""
    import dataclasses

    from finecap.config import Config
    from finecap.train.setup import resolve_start

    run = tmp_path / "run"
    for which in ("best", "last"):
        (checkpoint_dir(run, which) / "model").mkdir(parents=True)
        (checkpoint_dir(run, which) / "model" / "captioner.json").write_text("{}")
    cfg = Config()
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, init_from=str(run)))
    assert resolve_start(cfg).train.init_from == str(checkpoint_dir(run, "best"))
    (tmp_path / "empty").mkdir()
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, init_from=str(tmp_path / "empty")))
    with pytest.raises(FileNotFoundError, match="empty: not a checkpoint folder; pass a run directory"):
        resolve_start(cfg)
    assert resolve_start(cfg, must_exist=False).train.init_from == str(tmp_path / "empty")  # never read again
