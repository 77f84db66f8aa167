"""Mixed precision on the CPU: a bf16 step close to float32's, the fp16 gradient scaler's skipped steps (not
divergence unless more than ``train.max_skipped_steps`` in a row), evaluation and ``finecap caption`` under the run's
autocast, ``train.tf32``, and retrievers on the accelerator's device.

accelerate only sets up fp16 (autocast + ``GradScaler``) on a GPU; on the CPU it trains in float32. The fp16 tests
therefore give a real CPU ``Accelerator`` what accelerate gives it on a GPU (:func:`cpu_fp16`: ``native_amp`` and a
real ``torch.amp.GradScaler("cpu")``), so that the engine's own code path runs: accelerate's scaled backward, unscale
before clipping, ``scaler.step`` skipping the update and ``scaler.update`` halving the scale, under a real float16
autocast whose backward overflows exactly as it does on a GPU.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState

import finecap.train.run as app_train
from finecap.app.caption import main as caption_main
from finecap.caption import generate_captions, mixed_precision_autocast
from finecap.config import ClipCapBackboneConfig, DecodeConfig, TrainConfig
from finecap.data.samplers import RandomBatches
from finecap.data.targets import encode_captions
from finecap.home import run_path
from finecap.models.clipcap import ClipCap
from finecap.models.presets import build_world_lm
from finecap.objectives import ObjectiveOutput
from finecap.objectives.base import ObjectiveBase, as_objective
from finecap.objectives.mle import MLE, mle_loss
from finecap.runs import checkpoint_dir, model_dir
from finecap.train.engine import (
    Engine,
    SkippedSteps,
    TrainingData,
    TrainingDiverged,
    apply_tf32,
    make_accelerator,
    tf32_kept,
    tf32_settings,
)
from finecap.train.run import train
from finecap.train.schedule import build_scheduler
from finecap.train.setup import build_sharded_model

U = 2.0**-8  # bf16 keeps 8 significant bits (7 stored + 1 implicit): one rounding to nearest errs by <= 2**-8 relative
FP16_MAX = 65504.0  # the largest finite float16


@pytest.fixture(autouse=True)
def fresh_accelerate():
    """accelerate keeps one mixed-precision setting per process (``AcceleratorState``); these tests change it, so
    they start from a fresh state and leave one behind (the other tests then set up ``mixed_precision=no``)."""
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def cpu_fp16(init_scale: float = 2.0**16, accum: int = 1) -> Accelerator:
    """A CPU ``Accelerator`` with what accelerate sets up for fp16 on a GPU: float16 autocast and a gradient scaler
    (here ``torch.amp.GradScaler("cpu")``, the same class and update rule as CUDA's); ``accum`` accumulation steps."""
    acc = make_accelerator(TrainConfig(cpu=True, mixed_precision="fp16", grad_accum_steps=accum))
    assert acc.scaler is None and not acc.native_amp  # accelerate: no fp16 on the CPU (it would train in float32)
    acc.native_amp = True  # accelerator.autocast() -> torch.autocast("cpu", torch.float16)
    acc.scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    return acc


# ------------------------------------------------------------------------------------------------------------------
# bf16: one step close to float32's
# ------------------------------------------------------------------------------------------------------------------

CAPTIONS = ["a red circle", "a big blue square on grass", "two things", "a small green star at the top left"]


def _tiny_clipcap() -> ClipCap:
    lm, tok = build_world_lm(layers=2, hidden=32, heads=2, dropout=0.0)  # no dropout: both runs see the same net
    return ClipCap(lm, tok, 16, ClipCapBackboneConfig(prefix_length=4))  # MLP mapper


@pytest.fixture(scope="module")
def fitted():
    """A tiny ClipCap fitted for 20 float32 Adam steps to four captions (so that its logits mean something), its
    weights and the batch."""
    torch.manual_seed(0)
    model = _tiny_clipcap()
    enc = encode_captions(model.tokenizer, CAPTIONS, max_tokens=16)
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    batch = {"features": torch.randn(4, 16), **enc, "labels": labels, "index": [0, 1, 2, 3]}
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(20):
        loss = mle_loss(model(batch), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, batch


def _one_step(weights, batch, mixed_precision: str, weights_dtype=torch.float32):
    """One engine step (SGD, lr 1e-2: the update is -lr x the gradient, so it shows the gradient's error; AdamW's
    first step is lr x sign(gradient)) -> (loss, update (P,), lm_head output dtype, max |logit|, parameter dtypes)."""
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    model = _tiny_clipcap()
    model.load_state_dict(weights)
    model.to(weights_dtype)
    settings = TrainConfig(cpu=True, mixed_precision=mixed_precision, grad_clip=0.0, max_steps=1)
    acc = make_accelerator(settings)
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    before = {n: p.detach().float().clone() for n, p in trained}
    optimizer = torch.optim.SGD([p for _, p in trained], lr=1e-2)
    scheduler = build_scheduler(optimizer, warmup=0, total=1, kind="constant")
    seen = {}
    model.lm.lm_head.register_forward_hook(
        lambda m, i, o: seen.update(dtype=o.dtype, zmax=float(o.detach().abs().max()))
    )
    engine = Engine(settings, acc, model, MLE(), TrainingData(None, None, RandomBatches(4, 4)), optimizer, scheduler,
                    seed=0, total=1, progress=False)  # fmt: skip
    values = engine.train_step([batch])
    update = torch.cat([(p.detach().float() - before[n]).flatten() for n, p in trained])  # (P,)
    return values["loss"], update, seen, {p.dtype for _, p in trained}


def test_a_bf16_step_is_close_to_float32s(fitted):
    weights, batch = fitted
    loss32, update32, seen32, _ = _one_step(weights, batch, "no")
    loss16, update16, seen16, dtypes16 = _one_step(weights, batch, "bf16")
    # bf16 really ran (the logits came out of a bf16 matmul) and changed the numbers; master weights stay float32
    assert seen32["dtype"] == torch.float32 and seen16["dtype"] == torch.bfloat16
    assert loss16 != loss32 and not torch.equal(update16, update32)
    assert dtypes16 == {torch.float32}
    # The bounds, from bf16's precision (u = 2**-8) and a count of its roundings, not from what this run measured:
    # under CPU autocast every matmul rounds its two inputs and its output to bf16 (products accumulate in float32;
    # tanh, LayerNorm, softmax and the loss stay float32), i.e. 3 roundings per matmul. The logits come after 15
    # matmuls (mapper 2; per GPT-2 block qkv, q.k, attention x v, out, fc, proj: 2 x 6; lm_head): k = 45 roundings;
    # a gradient has as many again in the backward pass: k = 90. Independent rounding errors add like a random walk,
    # so k of them give a relative error ~ sqrt(k) * u, not the worst case k * u (Higham & Mary 2019, "A new approach
    # to probabilistic rounding error analysis").
    # - Update (SGD: -lr x gradient), norm-wise: sqrt(90) * u = 0.037.
    assert (update16 - update32).norm() / update32.norm() <= math.sqrt(90) * U
    # - Loss: dL = mean over tokens of (softmax - onehot) . dz, so |dL| <= 2 max |dz| <= 2 sqrt(45) u max |z| (a loose
    #   bound, ~0.34 here: the loss is a mean of smooth functions of the logits; the update above is the tight check).
    assert abs(loss16 - loss32) <= 2 * math.sqrt(45) * U * seen32["zmax"]
    # The update bound can fail: bf16 master weights (the update rounded into 8-bit parameters, as AdamW on a bf16
    # checkpoint without float32 copies would do) lose most of a 1e-2 x gradient step.
    _, update_bf16_weights, _, _ = _one_step(weights, batch, "bf16", weights_dtype=torch.bfloat16)
    assert (update_bf16_weights - update32).norm() / update32.norm() > math.sqrt(90) * U


# ------------------------------------------------------------------------------------------------------------------
# fp16: skipped steps are not divergence
# ------------------------------------------------------------------------------------------------------------------


def test_skip_accounting_driven_by_a_real_grad_scaler():
    """torch's GradScaler on an injected inf gradient: it skips optimizer.step, halves its scale; SkippedSteps counts
    consecutive skips, resets on a taken step and calls more than its limit in a row divergence."""
    p = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([p], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    skips = SkippedSteps(limit=2)

    def step(inject_inf: bool) -> bool:
        optimizer.zero_grad()
        scaler.scale(p.sum()).backward()  # gradient 1024 per element (scaled)
        if inject_inf:
            p.grad[0] = float("inf")  # what a float16 backward overflow leaves
        before, scale = p.detach().clone(), scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        skipped = torch.equal(p.detach(), before)
        assert scaler.get_scale() == (scale / 2 if inject_inf else scale)  # backoff 0.5; growth only every 2000
        assert skipped == inject_inf
        return skips.record(skipped)

    assert [step(True), step(True)] == [False, False]  # 2 consecutive skips: at the limit, not past it
    assert not step(False) and skips.consecutive == 0  # a taken step resets the count
    assert torch.allclose(p.detach(), torch.full((3,), 0.9))  # the one taken step: 1 - 0.1 x (1024 / 1024)
    assert [step(True), step(True), step(True)] == [False, False, True]  # the third in a row is past the limit
    assert (skips.consecutive, skips.total) == (3, 5)
    with pytest.raises(ValueError, match="skipped-step counts"):
        SkippedSteps(2).load_state_dict({"consecutive": 3, "total": 1})


class Overflowing:
    """Loss ``g * sum(W x)`` of a 4 x 4 linear layer (run in float16 under autocast) with ``g = batch["g"]``: its
    float16 backward sees output gradients ``g * scale``, which overflow float16 when ``g * scale > 65504``."""

    def __call__(self, model, batch):
        out = model.layer(torch.ones(1, 4))  # (1, 4) float16 under fp16 autocast
        loss = out.float().sum() * batch["g"]
        return ObjectiveOutput(losses={"loss": loss}, metrics={}, num_items=1)


def _fp16_engine(*, limit: int = 25, init_scale: float = 2.0**16,
                 objective: Overflowing | None = None) -> tuple[torch.nn.Module, Engine]:  # fmt: skip
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.layer = torch.nn.Linear(4, 4)
    settings = TrainConfig(cpu=True, mixed_precision="fp16", max_skipped_steps=limit, weight_decay=0.0,
                           grad_clip=1.0, max_steps=100)  # fmt: skip
    acc = cpu_fp16(init_scale)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    scheduler = build_scheduler(optimizer, warmup=0, total=100, kind="linear")
    data = TrainingData(None, None, RandomBatches(2, 2))
    engine = Engine(settings, acc, model, as_objective(objective or Overflowing()), data, optimizer, scheduler, seed=0,
                    total=100, progress=False)  # fmt: skip
    return model, engine


def _weights(model):
    return torch.cat([p.detach().flatten().clone() for p in model.parameters()])


def test_an_fp16_overflow_step_is_skipped_not_divergence(caplog):
    model, engine = _fp16_engine()
    start = _weights(model)
    # g = 1 at the default initial scale 2**16: the float16 output gradient is 65536 > 65504 -> inf: a real overflow
    assert FP16_MAX < 1.0 * 2**16
    with caplog.at_level("WARNING", logger="finecap.train.engine"):
        values = engine.train_step([{"g": 1.0, "index": [0]}])
    assert torch.equal(_weights(model), start)  # the scaler skipped the update
    assert values["skipped"] == 1.0 and values["loss_scale"] == 2.0**15  # and halved its scale
    assert "grad_norm" not in values and math.isfinite(values["loss"])  # an inf norm is not logged as a value
    assert "the fp16 gradient scaler skipped the update and lowered its scale to 32768" in caplog.text
    assert "train.max_skipped_steps=25" in caplog.text
    assert engine.skipped.consecutive == 1
    # The schedule advances with the step (it is a function of the step, as the resume check wants)
    assert engine.scheduler.scheduler.last_epoch == 1
    # At 2**15, 1 x 32768 fits in float16: the step is taken, the count resets
    values = engine.train_step([{"g": 1.0, "index": [0]}])
    assert values["skipped"] == 0.0 and values["loss_scale"] == 2.0**15 and math.isfinite(values["grad_norm"])
    assert not torch.equal(_weights(model), start) and engine.skipped.consecutive == 0
    assert engine.skipped.total == 1 and engine.scheduler.scheduler.last_epoch == 2
    # the skip count is part of the resumable state
    assert engine._main_state()["skipped_steps"] == {"consecutive": 0, "total": 1}


def test_more_consecutive_skips_than_the_limit_is_divergence():
    # g = 2**20 overflows float16 at every scale above 65504 / 2**20 ~ 2**-4: 20 halvings from 2**16 away
    model, engine = _fp16_engine(limit=3)
    for _ in range(3):  # 3 skips in a row: at the limit, training goes on
        assert engine.train_step([{"g": 2.0**20, "index": [0]}])["skipped"] == 1.0
        engine.state.step += 1
    with pytest.raises(TrainingDiverged, match=r"skipped 4 consecutive steps .*more than train.max_skipped_steps=3"):
        engine.train_step([{"g": 2.0**20, "index": [0]}])
    assert engine.accelerator.scaler.get_scale() == 2.0**12  # halved 4 times from 2**16


def test_skips_separated_by_taken_steps_never_stop_the_run():
    model, engine = _fp16_engine(limit=1)
    for g in [2.0**20, 1e-3, 2.0**20, 1e-3, 2.0**20, 1e-3]:  # skip, take, skip, take, ...
        values = engine.train_step([{"g": g, "index": [0]}])
        assert values["skipped"] == (1.0 if g > 1 else 0.0)
    assert (engine.skipped.consecutive, engine.skipped.total) == (0, 3)


class OverflowingScored(Overflowing):
    """:class:`Overflowing` with the RL family's count of scored captions: ``batch["scored"]``."""

    def __call__(self, model, batch):
        return dataclasses.replace(super().__call__(model, batch), scored=batch["scored"])


def test_a_step_no_caption_of_which_was_scored_leaves_the_gradient_scaler_alone():
    # A step that scored no caption is skipped before its gradients are unscaled (docs/training.md: a step no caption
    # of which was scored): the scaler neither halves nor keeps counting, the fp16 skip count neither grows nor
    # resets, and the next step unscales, tests and steps as usual (unscaled and never updated, torch's scaler would
    # refuse the next unscale_: "unscale_() has already been called on this optimizer since the last update()")
    model, engine = _fp16_engine(objective=OverflowingScored())
    assert engine.train_step([{"g": 1.0, "scored": 2, "index": [0]}])["skipped"] == 1.0  # overflow: scale 2**15
    start = _weights(model)
    values = engine.train_step([{"g": 0.0, "scored": 0, "index": [0]}])
    assert values["skipped/unscored"] == 1.0 and "skipped" not in values and "loss_scale" not in values
    assert torch.equal(_weights(model), start) and engine.accelerator.scaler.get_scale() == 2.0**15
    assert (engine.skipped.consecutive, engine.skipped.total) == (1, 1)
    values = engine.train_step([{"g": 1.0, "scored": 2, "index": [0]}])  # 1 x 2**15 fits float16: taken
    assert values["skipped"] == 0.0 and values["skipped/unscored"] == 0.0 and math.isfinite(values["grad_norm"])
    assert not torch.equal(_weights(model), start) and engine.skipped.consecutive == 0


class UpdatesSeen(ObjectiveBase):
    """:class:`OverflowingScored` recording, at each ``end_step``, whether the step's weights changed (no
    ``update_skipped`` before it)."""

    def __init__(self):
        self.updated: list[bool] = []
        self.kept = False

    def __call__(self, model, batch):
        return OverflowingScored()(model, batch)

    def update_skipped(self) -> None:
        self.kept = True

    def end_step(self) -> None:
        self.updated.append(not self.kept)
        self.kept = False


def test_the_objective_learns_which_steps_changed_the_weights():
    # a step the scaler skips (overflow) and one that scored no caption leave the weights as they were, and the
    # objective is told so (update_skipped: REINFORCE then sends a vLLM rollout engine no weights); a taken step
    # changed them. Until 2026-11-29 nothing told it: every step counted as a change
    objective = UpdatesSeen()
    model, engine = _fp16_engine(objective=objective)
    start = _weights(model)
    assert engine.train_step([{"g": 1.0, "scored": 2, "index": [0]}])["skipped"] == 1.0  # overflow at 2**16
    assert engine.train_step([{"g": 0.0, "scored": 0, "index": [0]}])["skipped/unscored"] == 1.0
    assert torch.equal(_weights(model), start)
    assert engine.train_step([{"g": 1.0, "scored": 2, "index": [0]}])["skipped"] == 0.0  # 2**15 fits float16
    assert not torch.equal(_weights(model), start)
    assert objective.updated == [False, False, True]


def _tiny_clipcap_fp16_skips(accum: int, examples: int = 64, steps: int = 3) -> tuple[list[float], float]:
    """``steps`` engine steps of the tiny ClipCap (MLE, seed 0) under float16 autocast and a GradScaler at its default
    initial scale 2**16, on one global batch of ``examples`` captions cut into ``accum`` accumulated micro-batches ->
    (each step's ``skipped``, the scale after them)."""
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    torch.manual_seed(0)
    model = _tiny_clipcap()
    enc = encode_captions(model.tokenizer, CAPTIONS * (examples // len(CAPTIONS)), max_tokens=16)
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    batch = {"features": torch.randn(examples, 16), **enc, "labels": labels, "index": list(range(examples))}
    size = examples // accum
    micro = [{k: v[i * size : (i + 1) * size] for k, v in batch.items()} for i in range(accum)]
    settings = TrainConfig(cpu=True, mixed_precision="fp16", grad_clip=0.0, grad_accum_steps=accum, max_steps=steps)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    scheduler = build_scheduler(optimizer, warmup=0, total=steps, kind="constant")
    engine = Engine(settings, cpu_fp16(accum=accum), model, MLE(), TrainingData(None, None, RandomBatches(64, 64)),
                    optimizer, scheduler, seed=0, total=steps, progress=False)  # fmt: skip
    skipped = [engine.train_step(micro)["skipped"] for _ in range(steps)]
    return skipped, engine.accelerator.scaler.get_scale()


def test_accumulated_token_losses_do_not_overflow_fp16_where_one_batch_does_not():
    # 64 captions, 368 target tokens: one batch back-propagates the mean over them and fits float16 at the scale
    # 2**16. Cut into 2 or 4 micro-batches (184 or 92 tokens each), the engine back-propagated loss x tokens (184
    # or 92 times a mean loss, / the accumulation steps) and the scaled gradients overflowed: the scaler skipped the
    # first 6 (2 micro-batches) or 4 (4) steps, halving its scale each time (every one of these 3). Weighted by
    # tokens / R (R: the first micro-batch's tokens) the back-propagated loss is of the order of the mean loss, and
    # no step is skipped.
    for accum in (1, 2, 4):
        assert _tiny_clipcap_fp16_skips(accum) == ([0.0, 0.0, 0.0], 2.0**16), accum


def test_a_non_finite_loss_under_fp16_is_divergence_at_once():
    model, engine = _fp16_engine()
    with pytest.raises(TrainingDiverged, match="the loss is not finite at step 1"):
        engine.train_step([{"g": float("inf"), "index": [0]}])


@pytest.mark.slow
def test_resume_after_skipped_steps_is_bit_identical(make_cfg, monkeypatch):
    """A run whose scaler skips its first steps (initial scale 2**22: the tiny ClipCap's gradients overflow float16
    until the scale has come down to 2**17), killed and resumed across those skips, ends with the weights of an
    uninterrupted one: the scale, the scaler's growth tracker and the skip count come back from the checkpoint, and
    the schedule, which advances on skipped steps too, stays at the checkpoint's step."""
    scalers, restored = [], []
    original_restore = Engine.restore

    def restore(self, folder):
        original_restore(self, folder)
        restored.append(self.skipped.state_dict())

    monkeypatch.setattr(Engine, "restore", restore)

    def accelerator(settings, run_dir=None):
        acc = make_accelerator(settings, run_dir)
        acc.native_amp, acc.scaler = True, torch.amp.GradScaler("cpu", init_scale=2.0**22)
        scalers.append(acc.scaler)
        return acc

    monkeypatch.setattr(app_train, "make_accelerator", accelerator)
    common = ["train.mixed_precision=fp16", "train.max_steps=8", "train.batch_size=32", "train.save_every=3",
              "train.eval_every=4", "train.log_every=1"]  # fmt: skip
    full = train(make_cfg(*common, run="full"))
    events = [json.loads(line) for line in (full / "metrics.jsonl").read_text().splitlines()]
    skipped = [e["values"]["skipped"] for e in events if e["split"] == "train"]
    # skips at the start and past the step-3 checkpoint (the resumed run must start from its scale), then steps taken
    assert skipped[:4] == [1.0] * 4 and skipped[-1] == 0.0
    assert all(math.isfinite(e["values"]["loss"]) for e in events)

    cfg = make_cfg(*common, run="killed")

    class Killed(Exception):
        pass

    def kill_at_5(state):
        if state.step == 5:
            raise Killed

    with pytest.raises(Killed):
        train(cfg, callbacks=[kill_at_5])
    resumed = train(cfg, resume=True)
    assert restored == [{"consecutive": 3, "total": 3}]  # the checkpoint of step 3, after 3 skipped steps
    assert scalers[-1].get_scale() == scalers[0].get_scale()  # the resumed scaler ends where the full run's did
    a = ClipCap.from_checkpoint(model_dir(checkpoint_dir(full, "last"))).state_dict()
    b = ClipCap.from_checkpoint(model_dir(checkpoint_dir(resumed, "last"))).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------------------------------------
# Autocast in evaluation, validation decoding and finecap caption
# ------------------------------------------------------------------------------------------------------------------


def test_mixed_precision_autocast():
    assert isinstance(mixed_precision_autocast("no", "cpu"), type(mixed_precision_autocast("fp16", "cpu")))
    with mixed_precision_autocast("bf16", "cpu"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    with mixed_precision_autocast("fp16", "cpu"):  # as accelerate: no float16 autocast on the CPU
        assert not torch.is_autocast_enabled("cpu")
    with mixed_precision_autocast("no", "cpu"):
        assert not torch.is_autocast_enabled("cpu")


def test_evaluation_runs_under_the_runs_autocast():
    settings = TrainConfig(cpu=True, mixed_precision="bf16", max_steps=1)
    acc = make_accelerator(settings)
    model = torch.nn.Module()
    model.p = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    seen = {}

    def evaluate(bare):
        seen.update(enabled=torch.is_autocast_enabled("cpu"), dtype=torch.get_autocast_dtype("cpu"),
                    grad=torch.is_grad_enabled())  # fmt: skip
        return {"loss": 1.0}

    scheduler = build_scheduler(optimizer, warmup=0, total=1, kind="constant")
    data = TrainingData(None, None, RandomBatches(2, 2))
    engine = Engine(settings, acc, model, as_objective(lambda m, b: None), data, optimizer, scheduler, seed=0, total=1,
                    evaluate=evaluate, progress=False)  # fmt: skip
    assert engine.evaluate() == {"loss": 1.0}
    assert seen == {"enabled": True, "dtype": torch.bfloat16, "grad": False}


def _trained_checkpoint(make_cfg):
    cfg = make_cfg("train.max_steps=12", run="fp32")
    train(cfg)
    return cfg, checkpoint_dir(run_path(cfg.run), "last")


def _record_generate(monkeypatch):
    """Record, at each ClipCap.generate call, the autocast state, the images of the batch and the lm_head dtype."""
    calls = []
    original = ClipCap.generate

    def generate(self, batch, decode_cfg=None, *args, **kwargs):
        seen = {}
        hook = self.lm.lm_head.register_forward_hook(lambda m, i, o: seen.update(dtype=o.dtype))
        try:
            out = original(self, batch, decode_cfg, *args, **kwargs)
        finally:
            hook.remove()
        calls.append((torch.is_autocast_enabled("cpu"), len(batch["image_ids"]), seen["dtype"]))
        return out

    monkeypatch.setattr(ClipCap, "generate", generate)
    return calls


def test_decoding_under_bf16_autocast_gives_float32s_greedy_captions(make_cfg, monkeypatch):
    """generate_captions (validation decoding, the demo) under the run's bf16: the same greedy captions as float32
    on the tiny ClipCap (bf16 moves its logits by ~1e-2 relative, less than the gap between the two most likely
    tokens at every step of these captions; a model with near-ties can choose differently)."""
    cfg, ckpt = _trained_checkpoint(make_cfg)
    model = ClipCap.from_checkpoint(model_dir(ckpt))
    calls = _record_generate(monkeypatch)
    decode = DecodeConfig(strategy="greedy", max_length=10)
    fp32 = generate_captions(model, cfg, "val", decode=decode, progress=False)
    assert [(c[0], c[2]) for c in calls] == [(False, torch.float32)]
    calls.clear()
    bf16_cfg = make_cfg("train.mixed_precision=bf16", run="fp32")
    bf16 = generate_captions(model, bf16_cfg, "val", decode=decode, progress=False)
    assert [(c[0], c[2]) for c in calls] == [(True, torch.bfloat16)]
    assert bf16 == fp32 and len(fp32) == 8


def test_finecap_caption_decodes_under_the_runs_autocast_in_batches_of_sequences(make_cfg, monkeypatch, tmp_path):
    cfg, ckpt = _trained_checkpoint(make_cfg)
    calls = _record_generate(monkeypatch)
    beam = ["decode.strategy=beam", "decode.beam_size=2", "decode.batch_size=4", "train.cpu=true"]
    out32 = caption_main(make_cfg(*beam, run="fp32"), checkpoint=ckpt, split="test", out=tmp_path / "fp32.json")
    # decode.batch_size=4 sequences at beam 2: 2 images per decoding batch (8 test images: 4 batches)
    assert calls == [(False, 2, torch.float32)] * 4
    calls.clear()
    AcceleratorState._reset_state(True)  # the command sets up its own accelerator, here with bf16
    GradientState._reset_state()
    bf16_cfg = make_cfg(*beam, "train.mixed_precision=bf16", run="fp32")
    out16 = caption_main(bf16_cfg, checkpoint=ckpt, split="test", out=tmp_path / "bf16.json")
    assert calls == [(True, 2, torch.bfloat16)] * 4
    assert json.loads(out16.read_text()) == json.loads(out32.read_text())  # same beam captions on this model


# ------------------------------------------------------------------------------------------------------------------
# train.tf32
# ------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def tf32_flags():
    """Restore torch's TF32 settings after the test (through the new API: readable whichever API set them)."""
    b = torch.backends
    saved = b.fp32_precision, b.cuda.matmul.fp32_precision, b.cudnn.fp32_precision, b.cudnn.conv.fp32_precision
    yield
    b.fp32_precision, b.cuda.matmul.fp32_precision, b.cudnn.fp32_precision, b.cudnn.conv.fp32_precision = saved


def test_tf32_is_set_on_cuda_only(tf32_flags):
    before = tf32_settings()
    # On the CPU (this machine), nothing is touched: train.tf32=true is a no-op there
    make_accelerator(TrainConfig(cpu=True, tf32=True))
    assert not apply_tf32(True, torch.device("cpu"))
    assert tf32_settings() == before
    # For a CUDA device the flags are set (the flags exist without a GPU; whether TF32 then runs needs Ampere or later)
    assert apply_tf32(True, torch.device("cuda"))
    assert tf32_settings() == ("tf32", "tf32")
    assert apply_tf32(False, torch.device("cuda"))
    assert tf32_settings() == ("ieee", "ieee")


def test_tf32_kept_and_apply_tf32_work_after_the_caller_used_torchs_new_precision_api(tf32_flags):
    """torch 2.9+ controls TF32 with ``fp32_precision`` (what PyTorch's notes recommend, and what transformers'
    ``TrainingArguments(tf32=...)`` sets: ``torch.backends.fp32_precision``); once it is set, reading the legacy
    ``allow_tf32`` flags raises ("you have used mix of the legacy and new APIs"), which made ``finecap.train`` of a
    caller who had set it fail on entry (``tf32_kept`` read them). The flags are read and set through the new API,
    and the caller's settings come back as they were."""
    torch.backends.fp32_precision = "tf32"
    theirs = tf32_settings()
    with tf32_kept():
        assert apply_tf32(False, torch.device("cuda"))
        assert tf32_settings() == ("ieee", "ieee")
    assert tf32_settings() == theirs


def test_make_accelerator_passes_train_tf32_to_its_device(monkeypatch):
    calls = []
    monkeypatch.setattr("finecap.train.engine.apply_tf32", lambda enabled, device: calls.append((enabled, device)))
    acc = make_accelerator(TrainConfig(cpu=True, tf32=True))
    assert calls == [(True, acc.device)]


def test_fp16_on_the_cpu_says_it_runs_in_float32(caplog):
    with caplog.at_level("WARNING", logger="finecap.train.engine"):
        make_accelerator(TrainConfig(cpu=True, mixed_precision="fp16"))
    assert "train.mixed_precision=fp16 on cpu" in caplog.text and "runs in float32" in caplog.text


@pytest.mark.parametrize(("precision", "computes"), [("fp16", torch.float32), ("bf16", torch.bfloat16)])
def test_a_sharded_run_on_the_cpu_computes_as_the_warning_says(make_cfg, group, precision, computes):
    """``train.strategy=fsdp`` (:func:`finecap.train.setup.build_sharded_model`, here in a 1-process gloo group) on the
    CPU: fp16, which accelerate cannot autocast nor scale there (the run says it trains in float32), gathers the
    sharded parameters in float32; FSDP2's policy gathered them in float16, so the step computed in float16 with no
    gradient scaler. bf16 still gathers them in bfloat16."""
    model, _ = build_sharded_model(make_cfg("train.strategy=fsdp", f"train.mixed_precision={precision}"), None, "cpu",
                                   main=True)  # fmt: skip
    seen = []
    model.lm.transformer.h[0].attn.c_attn.register_forward_hook(lambda m, i, o: seen.append((m.weight.dtype, o.dtype)))
    batch = {"features": torch.randn(2, model.feature_dim), "input_ids": torch.tensor([[5, 6, 2], [7, 2, 0]]),
             "attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0]])}  # fmt: skip
    assert model(batch).dtype == computes and seen == [(computes, computes)]


def test_a_cpu_fp16_run_records_its_device_and_its_export_claims_no_autocast(make_cfg, tmp_path, capsys):
    """train.mixed_precision=fp16 on the CPU runs no autocast (accelerate trains and validates in float32 there), yet
    finecap export warned that the run "captioned under train.mixed_precision=fp16 (an autocast)": the checkpoint did
    not say where the run ran. trainer_state.json now records the device type (a resume reads it back), and the
    export of a CPU fp16 run neither warns nor says on its card that it computes otherwise than the run."""
    from finecap.app.cli import main

    run_dir = train(make_cfg("train.mixed_precision=fp16", "train.max_steps=2", run="fp16-cpu"))
    assert json.loads((checkpoint_dir(run_dir, "last") / "trainer_state.json").read_text())["device"] == "cpu"
    train(make_cfg("train.mixed_precision=fp16", "train.max_steps=3", run="fp16-cpu"), resume=True)
    assert json.loads((checkpoint_dir(run_dir, "last") / "trainer_state.json").read_text())["step"] == 3
    capsys.readouterr()
    assert main(["export", str(run_dir), "--merged", str(tmp_path / "export")]) == 0
    err = capsys.readouterr().err
    assert "autocast" not in err and "finecap export:" in err, err
    assert "computes otherwise" not in (tmp_path / "export" / "README.md").read_text()
