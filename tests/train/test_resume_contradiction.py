"""A run folder does not steer the training resumed into it (issue 48, class 3).

torch's ``load_state_dict`` would apply a checkpoint's optimizer hyperparameters, scheduler base rates and scaler
settings over the configuration. A checkpoint whose ``state/main`` was doctored (``maximize``, weight decay, learning
rates, betas, eps, param groups, the schedule's warmup or total, per-parameter state), or a resume whose configuration
changed what the state was trained with, is refused with one line naming the file, the saved value, the configured
one and the option; an untouched checkpoint resumes bit-identically, and a run extended with a larger
``train.max_steps`` resumes on the extended schedule.

One tiny run is trained and killed once per module (its ``checkpoints/last`` is at step 2 of 6: past the one warmup
step, so warmup, total and schedule all show in the learning rate); each case works on a copy.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from finecap.app.cli import main
from finecap.config import load
from finecap.models.clipcap import ClipCap
from finecap.runs import STATE_DIR, checkpoint_dir, model_dir
from finecap.train.run import train
from finecap.train.schedule import lr_factor
from finecap.train.state import CheckpointError, load_tree, save_tree

LR, DECAY = 3e-3, 0.01
COMMON = ["train.max_steps=6", "train.warmup_steps=1", "train.schedule=linear", "train.save_every=2",
          "train.batch_size=16", f"train.lr={LR}", f"train.weight_decay={DECAY}", "train.log_every=1"]  # fmt: skip
STEP = 2
"""The step of the killed run's ``checkpoints/last``."""


class Killed(Exception):
    pass


def kill_at(step: int) -> Callable:
    def callback(state) -> None:
        if state.step == step:
            raise Killed

    return callback


@pytest.fixture(scope="module")
def overrides(world_args, tiny_encoder, tmp_path_factory) -> Callable[..., list[str]]:
    cache = tmp_path_factory.mktemp("cache")

    def make(run_dir: Path, *extra: str) -> list[str]:
        return [*world_args, f"model.encoder={tiny_encoder}", "clipcap.tiny_layers=1", "clipcap.tiny_hidden=32",
                "clipcap.tiny_heads=2", "clipcap.prefix_length=2", f"run.dir={run_dir}", f"run.cache_dir={cache}",
                "decode.max_length=10", *COMMON, *extra]  # fmt: skip

    return make


@pytest.fixture(scope="module")
def killed(overrides, tmp_path_factory) -> Path:
    """A run killed at step 3; its ``checkpoints/last`` is the step-2 one."""
    run = tmp_path_factory.mktemp("killed") / "run"
    with pytest.raises(Killed):
        train(load(None, overrides(run)), callbacks=[kill_at(STEP + 1)])
    assert json.loads((checkpoint_dir(run, "last") / "trainer_state.json").read_text())["step"] == STEP
    return run


def copy_of(killed: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(killed, run)
    return run


def doctor(run: Path, change: Callable[[dict], None]) -> None:
    """Rewrite the checkpoint's ``state/main`` with ``change`` applied (as an editor of the JSON and safetensors
    would: the files stay well-formed)."""
    folder = checkpoint_dir(run, "last") / STATE_DIR
    tree = load_tree(folder, "main")
    change(tree)
    save_tree(folder, "main", tree)


def groups(tree: dict) -> list[dict]:
    return tree["optimizer"]["param_groups"]


def _set(key: str, value, group: int = 0) -> Callable[[dict], None]:
    def change(tree: dict) -> None:
        groups(tree)[group][key] = value

    return change


def _initial_lr(tree: dict) -> None:
    for g in groups(tree):
        g["initial_lr"] = 0.3


def _extra_group(tree: dict) -> None:
    groups(tree).append({**groups(tree)[1], "params": []})


def _missing_group(tree: dict) -> None:
    del groups(tree)[1]


def _moved_parameter(tree: dict) -> None:
    groups(tree)[0]["params"].append(groups(tree)[1]["params"].pop())


def _base_lrs(tree: dict) -> None:
    tree["scheduler"]["base_lrs"] = [0.03, 0.03]


def _schedule(**settings) -> Callable[[dict], None]:
    """The learning rates a run with other schedule settings would hold at the checkpoint's step."""

    def change(tree: dict) -> None:
        factor = lr_factor(STEP, **{"warmup": 1, "total": 6, "kind": "linear", **settings})
        for g in groups(tree):
            g["lr"] = g["initial_lr"] * factor
        tree["scheduler"]["_last_lr"] = [g["lr"] for g in groups(tree)]

    return change


def _last_lr(tree: dict) -> None:
    tree["scheduler"]["_last_lr"] = [1.0, 1.0]


def _lr_lambdas(tree: dict) -> None:
    tree["scheduler"]["lr_lambdas"] = [{"keywords": {"warmup": 0}}, {}]


def _exp_avg_shape(tree: dict) -> None:
    tree["optimizer"]["state"][0]["exp_avg"] = torch.zeros(1)


def _step_count(tree: dict) -> None:
    tree["optimizer"]["state"][0]["step"] = torch.tensor(1e6)


linear = lr_factor(STEP, warmup=1, total=6, kind="linear")  # 0.8: what the configured schedule gives at step 2

DOCTORED = {
    # name: (change, fragments the one-line error must hold: the saved value, the configured one, the option)
    "maximize": (_set("maximize", True), ["'maximize' is True", "gives False", "finecap's AdamW"]),
    "weight_decay": (_set("weight_decay", 0.5), ["'weight_decay' is 0.5", f"gives {DECAY}", "train.weight_decay"]),
    "decay on biases": (
        _set("weight_decay", 0.1, group=1),
        ["group 1 'weight_decay' is 0.1", "gives 0.0", "biases and norms"],
    ),  # fmt: skip
    "lr": (
        _set("lr", LR * linear * 10),
        [
            f"'lr' is {LR * linear * 10}",
            f"gives {LR * linear}",
            "train.warmup_steps=1",
            "train.schedule=linear",
            f"step {STEP} of 6",
        ],
    ),
    "initial_lr": (_initial_lr, ["'initial_lr' is 0.3", f"gives {LR}", "(train.lr)"]),
    "betas": (_set("betas", (0.5, 0.9)), ["'betas' is (0.5, 0.9)", "gives (0.9, 0.999)"]),
    "eps": (_set("eps", 1e-3), ["'eps' is 0.001", "gives 1e-08"]),
    "amsgrad": (_set("amsgrad", True), ["'amsgrad' is True", "gives False"]),
    "extra param group": (_extra_group, ["param groups is 3", "gives 2"]),
    "missing param group": (_missing_group, ["param groups is 1", "gives 2"]),
    "parameter moved between groups": (_moved_parameter, ["parameters in optimizer param group 0 is", "gives"]),
    "scheduler base_lrs": (_base_lrs, ["base learning rates is [0.03, 0.03]", f"gives [{LR}, {LR}]", "(train.lr)"]),
    "scheduler warmup": (
        _schedule(warmup=3),
        [
            f"'lr' is {LR * lr_factor(STEP, warmup=3, total=6, kind='linear')}",
            f"gives {LR * linear}",
            "train.warmup_steps=1",
        ],
    ),  # fmt: skip
    "scheduler total": (
        _schedule(total=10),
        [f"'lr' is {LR * lr_factor(STEP, warmup=1, total=10, kind='linear')}", f"gives {LR * linear}", "of 6"],
    ),  # fmt: skip
    "scheduler kind": (_schedule(kind="cosine"), [f"gives {LR * linear}", "train.schedule=linear"]),
    "scheduler last lr": (_last_lr, ["last learning rates is [1.0, 1.0]", f"gives [{LR * linear}, {LR * linear}]"]),
    "scheduler lr_lambdas": (_lr_lambdas, ["lr_lambdas is [{'keywords'", "gives [{}, {}]"]),
    "exp_avg shape": (_exp_avg_shape, ["shape of 'exp_avg' of parameter 0 is [1]", "gives ["]),
    "parameter step count": (_step_count, ["step count of parameter 0 is 1000000.0", f"outside [0, {STEP}]"]),
}


def _one_line(error: CheckpointError, run: Path) -> str:
    message = str(error)
    assert "\n" not in message and message.startswith(str(checkpoint_dir(run, "last") / STATE_DIR / "main.json"))
    return message


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(DOCTORED))
def test_a_doctored_state_is_refused_naming_both_values(variant, killed, overrides, tmp_path):
    change, fragments = DOCTORED[variant]
    run = copy_of(killed, tmp_path)
    doctor(run, change)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(CheckpointError) as e:
        train(load(None, overrides(run)), resume=True)
    message = _one_line(e.value, run)
    assert all(f in message for f in fragments), message
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before  # refused before writing anything


CHANGED = {
    # a configuration that contradicts what the (untouched) state was trained with
    "train.lr": ("train.lr=0.001", ["'initial_lr' is 0.003", "gives 0.001", "(train.lr)"]),
    "train.weight_decay": ("train.weight_decay=0.1", ["'weight_decay' is 0.01", "gives 0.1", "train.weight_decay"]),
    "train.warmup_steps": ("train.warmup_steps=3", [f"'lr' is {LR * linear}", "gives 0.003", "train.warmup_steps=3"]),
    "train.schedule": (
        "train.schedule=constant",
        [f"'lr' is {LR * linear}", "gives 0.003", "train.schedule=constant"],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(CHANGED))
def test_a_resume_whose_configuration_contradicts_the_state_is_refused(variant, killed, overrides, tmp_path):
    override, fragments = CHANGED[variant]
    run = copy_of(killed, tmp_path)
    with pytest.raises(CheckpointError) as e:
        train(load(None, overrides(run, override)), resume=True)
    message = _one_line(e.value, run)
    assert all(f in message for f in fragments), message


@pytest.mark.slow
def test_the_command_line_refuses_with_one_line_and_exit_code_2(killed, overrides, tmp_path):
    run = copy_of(killed, tmp_path)
    doctor(run, _set("maximize", True))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["train", *overrides(run), "--resume", "-q"])
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("finecap: error: "), err.getvalue()
    assert "'maximize' is True" in lines[0] and "gives False" in lines[0]


def weights(run: Path) -> dict[str, torch.Tensor]:
    return ClipCap.from_checkpoint(model_dir(checkpoint_dir(run, "last"))).state_dict()


@pytest.mark.slow
def test_an_untouched_checkpoint_resumes_bit_identically(killed, overrides, tmp_path):
    full = train(load(None, overrides(tmp_path / "full")))
    run = copy_of(killed, tmp_path)
    resumed = train(load(None, overrides(run)), resume=True)
    a, b = weights(full), weights(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_an_extended_run_resumes_on_the_extended_schedule(killed, overrides, tmp_path):
    run = copy_of(killed, tmp_path)
    train(load(None, overrides(run, "train.max_steps=8")), resume=True)
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    lrs = {e["step"]: e["values"]["lr"] for e in events if e["split"] == "train"}
    assert max(lrs) == 8
    # step 3 (the first resumed one, optimizer step index 2) runs at the 8-step schedule's rate, not the 6-step one's
    assert lrs[STEP + 1] == pytest.approx(LR * lr_factor(STEP, warmup=1, total=8, kind="linear"), rel=1e-12)
    assert lrs[STEP + 1] != pytest.approx(LR * linear, rel=1e-6)


SCALER = {
    # the gradient scaler's state (fp16): its settings are the configured scaler's, its scale a positive number
    "growth_interval": (("growth_interval", 1), ["'growth_interval' is 1", "gives 2000"]),
    "growth_factor": (("growth_factor", 1000.0), ["'growth_factor' is 1000.0", "gives 2.0"]),
    "negative scale": (("scale", -1024.0), ["scale must be a finite number > 0, got -1024.0"]),
    "growth tracker": (("_growth_tracker", 5000), ["growth tracker must be an integer in [0, 2000), got 5000"]),
}


def fresh_accelerate() -> None:
    """accelerate keeps one mixed-precision setting per process (``AcceleratorState``): the fp16 runs start from a
    fresh one and leave one behind (as tests/train/test_mixed_precision.py does)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@pytest.fixture(scope="module")
def killed_fp16(overrides, tmp_path_factory) -> tuple[Path, Callable]:
    """A run under a float16 gradient scaler (on the CPU, as tests/train/test_mixed_precision.py makes one), killed
    at step 3: its ``checkpoints/last`` holds the scaler's state. Returns the run and the accelerator maker."""
    import finecap.train.run as app_train
    from finecap.train.engine import make_accelerator

    def accelerator(settings, run_dir=None):
        acc = make_accelerator(settings, run_dir)
        acc.native_amp, acc.scaler = True, torch.amp.GradScaler("cpu", init_scale=2.0**10)
        return acc

    run = tmp_path_factory.mktemp("killed-fp16") / "run"
    fresh_accelerate()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(app_train, "make_accelerator", accelerator)
        with pytest.raises(Killed):
            train(load(None, overrides(run, "train.mixed_precision=fp16")), callbacks=[kill_at(STEP + 1)])
    fresh_accelerate()
    assert load_tree(checkpoint_dir(run, "last") / STATE_DIR, "main")["scaler"]["scale"] > 0
    return run, accelerator


@pytest.mark.slow
@pytest.mark.parametrize("variant", [*SCALER, "untouched"])
def test_a_doctored_scaler_state_is_refused(variant, killed_fp16, overrides, tmp_path, monkeypatch, request):
    import finecap.train.run as app_train

    killed, accelerator = killed_fp16
    monkeypatch.setattr(app_train, "make_accelerator", accelerator)
    fresh_accelerate()
    request.addfinalizer(fresh_accelerate)
    run = copy_of(killed, tmp_path)
    cfg = load(None, overrides(run, "train.mixed_precision=fp16"))
    if variant == "untouched":
        train(cfg, resume=True)
        assert json.loads((checkpoint_dir(run, "last") / "trainer_state.json").read_text())["step"] == 6
        return
    (key, value), fragments = SCALER[variant]
    doctor(run, lambda tree: tree["scaler"].__setitem__(key, value))
    with pytest.raises(CheckpointError) as e:
        train(cfg, resume=True)
    message = _one_line(e.value, run)
    assert all(f in message for f in fragments), message
