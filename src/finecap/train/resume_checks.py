"""A resumed run's saved optimizer, scheduler and gradient-scaler state against the run's configuration.

torch's ``Optimizer.load_state_dict`` replaces every hyperparameter of each param group (``lr``, ``betas``, ``eps``,
``weight_decay``, ``maximize``, ...) with the saved one, ``LRScheduler.load_state_dict`` the base learning rates and
copies saved attributes onto the schedule's functions, ``GradScaler.load_state_dict`` the growth settings. Loaded as
they are, a run folder steers the training resumed into it: ``maximize: true`` turns descent into ascent while
``config.yaml`` and the command line say otherwise. So before anything is loaded, the saved state is compared with
the optimizer, scheduler and scaler this run built from its configuration (:func:`check_main_state`), and any
contradiction is a :class:`~finecap.train.state.CheckpointError`: one line naming the file, the saved value, the
configured one and the option that sets it. Compared:

- the number of param groups, and of parameters in each;
- every hyperparameter of every group equal to the configured one (``train.weight_decay``; the others are finecap's
  fixed AdamW settings); a key the saved group lacks (a checkpoint of another torch version) takes the configured
  value, a key this torch does not know is dropped;
- ``initial_lr`` and the scheduler's ``base_lrs``: ``train.lr``;
- the current ``lr`` of each group and the scheduler's ``_last_lr``: what the configured schedule (``train.lr``,
  ``train.warmup_steps``, ``train.schedule``) gives at the checkpoint's step, over the checkpoint's own total steps
  (``trainer_state.json``), so a run extended with a larger ``train.max_steps`` still resumes;
- the scheduler's functions carry no saved attributes;
- each parameter's state: tensors of the parameter's shape (a smaller one would be broadcast), a ``step`` count
  between 0 and the checkpoint's step (AdamW's bias correction reads it);
- the gradient scaler's ``growth_factor``, ``backoff_factor`` and ``growth_interval``: the configured scaler's; its
  ``scale`` finite and positive (a negative scale flips every gradient), its growth tracker within the interval.

What is not compared is state no configuration fixes: AdamW's moments, the scale, RNG and objective states (those
are checked for type and range where they are loaded), the loop's counters (:func:`finecap.train.state.check_info`).
An honest checkpoint passes every check unchanged, so its resume stays bit-identical. After loading, each group's
learning rate is set to the configured schedule's at the step (:func:`apply_schedule`): equal for an unchanged run,
and the extended run's schedule for an extended one.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from finecap.train.schedule import lr_factor, schedule_of
from finecap.train.state import CheckpointError
from finecap.utils.text import short_repr

ADVICE = (
    "resume with the settings the run was trained with (finecap train --resume --out RUN, no recipe, reads its "
    "config.yaml), or start a new run (--out) with train.init_from=<its checkpoints/best>; if the run never had that "
    "setting, the state file was changed"
)

OPTION_OF = {"weight_decay": "train.weight_decay", "initial_lr": "train.lr"}
"""The option that sets a param-group hyperparameter; the others are fixed by finecap's AdamW
(:func:`finecap.train.engine.build_optimizer`)."""


def _same(saved: Any, configured: Any) -> bool:
    """Equal as hyperparameters: a bool only to a bool, numbers by value, a tuple to a list (JSON has no tuples)."""
    if isinstance(configured, bool) or isinstance(saved, bool):
        return type(saved) is type(configured) and saved == configured
    if isinstance(configured, int | float) and isinstance(saved, int | float):
        return float(saved) == float(configured)
    if isinstance(configured, list | tuple) and isinstance(saved, list | tuple):
        return len(saved) == len(configured) and all(_same(s, c) for s, c in zip(saved, configured, strict=True))
    return type(saved) is type(configured) and saved == configured


def _close(saved: Any, expected: float) -> bool:
    """A learning rate read back equals the one computed (up to rounding: both come from the same formula)."""
    return (
        isinstance(saved, int | float)
        and not isinstance(saved, bool)
        and math.isclose(float(saved), expected, rel_tol=1e-9, abs_tol=1e-300)
    )


def _refuse(path: Path, what: str, saved: Any, configured: Any, option: str) -> CheckpointError:
    return CheckpointError(
        f"{path}: {what} is {short_repr(saved)}, but this run's configuration gives {short_repr(configured)} "
        f"({option}); {ADVICE}"
    )


def _option(key: str, group: int) -> str:
    if key == "weight_decay" and group > 0:
        return "biases and norms get no weight decay, whatever train.weight_decay"
    return OPTION_OF.get(key, "a fixed setting of finecap's AdamW, no option")


def _scheduled(scheduler: torch.optim.lr_scheduler.LRScheduler, step: int, total: int) -> tuple[float, str]:
    """The factor of the configured schedule at ``step`` of ``total`` steps, and the options that give it."""
    warmup, _, kind = schedule_of(scheduler)
    options = f"train.lr with train.warmup_steps={warmup}, train.schedule={kind} at step {step} of {total}"
    return lr_factor(step, warmup=warmup, total=total, kind=kind), options


def check_optimizer_state(
    saved: dict[str, Any],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    path: Path,
    *,
    step: int,
    saved_total: int,
) -> None:
    """The saved optimizer state (torch's, or the name-keyed one of a sharded run) against ``optimizer`` as this run
    built it (module docstring); completes the saved groups with configured keys they lack, drops unknown ones."""
    groups, configured = saved.get("param_groups"), optimizer.param_groups
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise CheckpointError(f"{path}: the optimizer state has no list of param groups; {ADVICE}")
    if len(groups) != len(configured):
        raise _refuse(
            path,
            "the number of optimizer param groups",
            len(groups),
            len(configured),
            "weights with weight decay, and biases and norms without",
        )
    factor, options = _scheduled(scheduler, step, saved_total)
    for i, (group, mine) in enumerate(zip(groups, configured, strict=True)):
        params = group.get("params")
        if not isinstance(params, list) or len(params) != len(mine["params"]):
            n = len(params) if isinstance(params, list) else params
            raise _refuse(
                path,
                f"the number of parameters in optimizer param group {i}",
                n,
                len(mine["params"]),
                "the model's trainable parameters: model.*, lora.*",
            )
        for key in [k for k in group if k not in mine]:
            del group[key]  # unknown to this torch: never read by its AdamW
        for key, value in mine.items():
            if key in ("params", "lr", "param_names"):
                continue
            if key not in group:
                group[key] = value  # a checkpoint of another torch version: nothing to contradict
            elif not _same(group[key], value):
                raise _refuse(path, f"optimizer param group {i} {key!r}", group[key], value, _option(key, i))
        expected = mine["initial_lr"] * factor
        if not _close(group.get("lr"), expected):
            raise _refuse(path, f"optimizer param group {i} 'lr'", group.get("lr"), expected, options)
    _check_parameter_states(saved.get("state"), groups, configured, path, step)


def _check_parameter_states(
    states: Any, groups: list[dict[str, Any]], configured: list[dict[str, Any]], path: Path, step: int
) -> None:
    """Each parameter's saved state: tensors of its shape (torch's format: indices pair with this run's parameters
    in order; a name-keyed sharded state is matched by its loader), a ``step`` count in ``[0, step]``."""
    if not isinstance(states, dict):
        raise CheckpointError(f"{path}: the optimizer state has no per-parameter state mapping; {ADVICE}")
    shapes: dict[Any, torch.Size] = {}
    for group, mine in zip(groups, configured, strict=True):
        for key, param in zip(group["params"], mine["params"], strict=True):
            if isinstance(key, int) and not isinstance(key, bool):
                shapes[key] = param.shape
    for key, state in states.items():
        if not isinstance(state, dict):
            raise CheckpointError(f"{path}: the optimizer state of parameter {short_repr(key)} is not a mapping")
        for name, value in state.items():
            if name == "step":
                count = float(value) if isinstance(value, torch.Tensor) and value.numel() == 1 else value
                if not isinstance(count, int | float) or isinstance(count, bool) or not 0 <= count <= step:
                    raise CheckpointError(
                        f"{path}: the optimizer step count of parameter {short_repr(key)} is {short_repr(count)}, "
                        f"outside [0, {step}] (the checkpoint's step, trainer_state.json); {ADVICE}"
                    )
            elif isinstance(value, torch.Tensor) and key in shapes and value.shape != shapes[key]:
                raise _refuse(
                    path,
                    f"the shape of {name!r} of parameter {short_repr(key)}",
                    list(value.shape),
                    list(shapes[key]),
                    "the model's parameter shapes: model.*, clipcap.*, lora.*",
                )


def check_scheduler_state(
    saved: dict[str, Any],
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    optimizer: torch.optim.Optimizer,
    path: Path,
    *,
    step: int,
    saved_total: int,
) -> None:
    """The saved learning-rate scheduler state against the configured ``scheduler`` (module docstring)."""
    n = len(optimizer.param_groups)
    base = saved.get("base_lrs")
    configured = [g["initial_lr"] for g in optimizer.param_groups]
    if not isinstance(base, list) or len(base) != n or not all(_close(b, c) for b, c in zip(base, configured)):
        raise _refuse(path, "the scheduler's base learning rates", base, configured, "train.lr")
    factor, options = _scheduled(scheduler, step, saved_total)
    last = saved.get("_last_lr")
    expected = [c * factor for c in configured]
    if last is not None and (
        not isinstance(last, list) or len(last) != n or not all(_close(v, e) for v, e in zip(last, expected))
    ):
        raise _refuse(path, "the scheduler's last learning rates", last, expected, options)
    functions = saved.get("lr_lambdas")
    if functions is not None and (not isinstance(functions, list) or any(f not in (None, {}) for f in functions)):
        raise _refuse(
            path,
            "the scheduler's lr_lambdas",
            functions,
            [{}] * n,
            "finecap's schedule functions carry no saved attributes",
        )


def check_scaler_state(saved: dict[str, Any], scaler: Any, path: Path) -> None:
    """The saved gradient-scaler state against the configured ``scaler`` (a ``torch.amp.GradScaler``)."""
    mine = scaler.state_dict()
    for key in ("growth_factor", "backoff_factor", "growth_interval"):
        if key in mine and not _same(saved.get(key), mine[key]):
            raise _refuse(
                path,
                f"the gradient scaler's {key!r}",
                saved.get(key),
                mine[key],
                "accelerate's fp16 scaler settings (train.mixed_precision=fp16), no option",
            )
    scale, tracker = saved.get("scale"), saved.get("_growth_tracker", 0)
    if not isinstance(scale, int | float) or isinstance(scale, bool) or not (math.isfinite(scale) and scale > 0):
        raise CheckpointError(
            f"{path}: the gradient scaler's scale must be a finite number > 0, got {short_repr(scale)}; {ADVICE}"
        )
    interval = mine.get("growth_interval", saved.get("growth_interval"))
    if type(tracker) is not int or not 0 <= tracker < interval:
        raise CheckpointError(
            f"{path}: the gradient scaler's growth tracker must be an integer in [0, {interval}), "
            f"got {short_repr(tracker)}; {ADVICE}"
        )


def check_main_state(
    main: dict[str, Any],
    *,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: Any,
    path: Path,
    step: int,
    saved_total: int,
) -> None:
    """Every check of the module docstring on a checkpoint's ``state/main`` tree (read from ``path``), before any of
    it is loaded. ``optimizer``, ``scheduler`` and ``scaler`` (``None``: none) are this run's, as built from its
    configuration; ``step`` and ``saved_total`` the checkpoint's step and total steps."""
    if not isinstance(main.get("optimizer"), dict) or not isinstance(main.get("scheduler"), dict):
        raise CheckpointError(f"{path}: the optimizer or scheduler state is missing; {ADVICE}")
    check_optimizer_state(main["optimizer"], optimizer, scheduler, path, step=step, saved_total=saved_total)
    check_scheduler_state(main["scheduler"], scheduler, optimizer, path, step=step, saved_total=saved_total)
    if main.get("scaler") is not None and scaler is not None:
        if not isinstance(main["scaler"], dict):
            raise CheckpointError(f"{path}: the gradient scaler state is not a mapping; {ADVICE}")
        check_scaler_state(main["scaler"], scaler, path)


def apply_schedule(scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
    """Set each param group's learning rate to what the configured schedule gives at the scheduler's step (after a
    checked state was loaded: the same value for an unchanged run, the new schedule's for an extended one)."""
    values = [
        base * fn(scheduler.last_epoch) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)
    ]
    for group, lr in zip(scheduler.optimizer.param_groups, values, strict=True):
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr
    scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]
