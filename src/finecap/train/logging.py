"""Logging of a training run: finecap's ``jsonl`` tracker, the flattened configuration trackers receive, and the
:class:`Logger` that averages training values between log events.

Logged values are averaged over micro-batches and processes (a step's loss and its parts are already the step's:
:meth:`finecap.train.engine.Engine.train_step`, and so are the objectives' per-token metrics, token means over
every process's tokens: :mod:`finecap.objectives.token_means`; an extreme such as ``advantage/min`` is the extreme
of them all: :data:`EXTREMES`) and go to the trackers of ``train.log_with`` through ``accelerator.log``
(``jsonl``: ``metrics.jsonl``, one event per line; ``tensorboard``, ``wandb``, ``mlflow``, ... as accelerate
supports them, under ``<run>/trackers``: :func:`placed_trackers`). Only the main process writes. Trackers receive
the configuration with every secret masked (:func:`tracker_config`) and see the command line masked while they start
(:func:`masked_argv`: wandb records it).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from accelerate.tracking import GeneralTracker
from accelerate.tracking import MLflowTracker as AccelerateMlflowTracker
from accelerate.utils import gather_object

from finecap.config import flat_options
from finecap.locks import command_argv
from finecap.runs import encode_event
from finecap.utils.files import append_jsonl
from finecap.utils.system import environment_defaults

PLACES: dict[str, tuple[str, str, str]] = {
    "wandb": ("dir", "WANDB_DIR", ""),
    "dvclive": ("dir", "DVCLIVE_DIR", "dvclive"),
    "swanlab": ("logdir", "SWANLAB_LOG_DIR", "swanlab"),
}
"""Trackers that write local files where they are started unless told a folder: ``{name: (their init keyword, the
environment variable that places them instead, subfolder of <run>/trackers)}``. tensorboard and aim take accelerate's
``project_dir``; mlflow is placed by its tracking URI (:func:`placed_trackers`); trackio, comet_ml and clearml log to
their servers or their own caches."""


class JsonlTracker(GeneralTracker):
    """accelerate tracker ``jsonl``: one line per event in ``metrics.jsonl``,
    ``{"step", "epoch", "split", "values", "text"?}``; keys logged as ``"<split>/<name>"`` are grouped by split,
    string values go to ``text``. Strict JSON: a value that is no finite number is ``null``, named in
    ``"nonfinite"`` (:func:`finecap.runs.encode_event`)."""

    name = "jsonl"
    requires_logging_directory = False
    main_process_only = True

    def __init__(self, path: Path):
        super().__init__()
        self.path = Path(path)
        self.epoch_at: tuple[int | None, Any] = (None, None)  # (step, epoch) of the last event that gave one

    @property
    def tracker(self) -> Path:
        return self.path

    def store_init_configuration(self, values: dict) -> None:  # the run's config.yaml holds it
        pass

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        if "epoch" in values:
            self.epoch_at = (step, values["epoch"])
        # the second event of a step (validation after training) comes without it (Logger.write): the step's
        epoch = values.get("epoch", self.epoch_at[1] if self.epoch_at[0] == step else None)
        splits: dict[str, dict[str, Any]] = {}
        for key, value in values.items():
            if key == "epoch" or "/" not in key:
                continue
            split, name = key.split("/", 1)
            splits.setdefault(split, {})[name] = value
        for split, items in splits.items():
            record: dict[str, Any] = {"step": step, "epoch": epoch, "split": split}
            record["values"] = {k: v for k, v in items.items() if not isinstance(v, str)}
            text = {k: v for k, v in items.items() if isinstance(v, str)}
            if text:
                record["text"] = text
            append_jsonl(self.path, encode_event(record))


MLFLOW_URI_ENV = "MLFLOW_TRACKING_URI"
MLFLOW_DB = "mlflow.db"
"""The SQLite database of mlflow's runs in ``<run>/trackers`` (:func:`placed_trackers`)."""
MLFLOW_UNNAMEABLE = re.compile(r"[^/\w.\- ]")
"""A character mlflow refuses in a metric name (``mlflow.utils.validation``: alphanumerics, ``_``, ``-``, ``.``, space
and ``/``; a colon too, except on Windows)."""


def mlflow_name(key: str) -> str:
    """``key`` as mlflow takes it: ``@`` is ``_at_``, any other character it refuses ``_`` (mlflow raises on
    ``val/r@1``, the retrieval validator's recall, and training stopped at its first evaluation).

    Example::

        >>> mlflow_name("val/r@1"), mlflow_name("train/loss/mle")
        ('val/r_at_1', 'train/loss/mle')
    """
    return MLFLOW_UNNAMEABLE.sub("_", key.replace("@", "_at_"))


class MlflowTracker(AccelerateMlflowTracker):
    """accelerate's ``mlflow`` tracker with finecap's names made mlflow's (:func:`mlflow_name`); values and steps
    as logged."""

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        super().log({mlflow_name(k): v for k, v in values.items()}, step=step, **kwargs)


@contextlib.contextmanager
def placed_trackers(
    log_with: Sequence[str], folder: Path, main: bool = True, resumed_at: int | None = None
) -> Iterator[dict[str, dict[str, Any]]]:
    """For the length of a run: ``init_kwargs`` of ``accelerator.init_trackers`` placing each tracker of
    ``log_with`` that would write into the working directory under ``folder`` (``<run>/trackers``), unless its own
    environment variable places it (:data:`PLACES`); mlflow, whose local default is ``./mlruns`` and which reads its
    tracking URI at every call, gets ``MLFLOW_TRACKING_URI=sqlite:///<folder>/mlflow.db`` while the run lasts when
    the variable is unset (given back after, so a next run in the process is placed in its own folder). Not mlflow's
    file store (``file:``): it keeps a metric in a file named by it, so ``train/loss`` and ``train/loss/mle`` cannot
    both be there (the first event fails, ``Not a directory``), and mlflow 3 refuses it unless told otherwise.
    Nothing on processes other than the main one (``main=False``), where trackers do not start.

    ``resumed_at``: the step of the checkpoint a resumed run continues from. TensorBoard's writer then gets
    ``purge_step=resumed_at + 1``, so the events the killed run logged after that checkpoint (written again by the
    resumed run) are hidden, as ``metrics.jsonl`` drops them (:func:`finecap.train.state.truncate_metrics`);
    without it TensorBoard shows those steps twice."""
    places: dict[str, dict[str, Any]] = {}
    for name in log_with if main else ():
        if name in PLACES and not os.environ.get(PLACES[name][1]):
            keyword, _, sub = PLACES[name]
            place = folder / sub if sub else folder
            place.mkdir(parents=True, exist_ok=True)
            places[name] = {keyword: str(place)}
    if main and resumed_at is not None and "tensorboard" in log_with:
        places.setdefault("tensorboard", {})["purge_step"] = resumed_at + 1  # SummaryWriter: steps >= it hidden
    mlflow = {}
    if main and "mlflow" in log_with and not os.environ.get(MLFLOW_URI_ENV):  # mlflow reads an empty one as unset
        folder.mkdir(parents=True, exist_ok=True)
        mlflow = {MLFLOW_URI_ENV: f"sqlite:///{(folder / MLFLOW_DB).resolve()}"}
    with environment_defaults(mlflow, empty_is_unset=True):
        yield places


@contextlib.contextmanager
def masked_argv() -> Iterator[None]:
    """``sys.argv`` with secrets masked (:func:`finecap.locks.command_argv`) while trackers start: wandb records the
    command line itself, and an override like ``boost.llm_api_key=sk-...`` would reach its run files."""
    saved = sys.argv
    sys.argv = command_argv()
    try:
        yield
    finally:
        sys.argv = saved


def tracker_config(config: dict[str, dict[str, Any]]) -> dict[str, int | float | str | bool]:
    """A configuration (``{section: {key: value}}``, secrets already masked) flattened to ``section.key`` scalars, as
    trackers' hyper-parameter tables accept them (a nested section's keys by their whole name,
    ``data.hf.image_column``: :func:`finecap.config.flat_options`)."""
    return {key: value if isinstance(value, int | float | str | bool) else json.dumps(value)
            for key, value in flat_options(config).items()}  # fmt: skip


EXTREMES = {"min": min, "max": max}
"""The one rule for a logged extreme: a key whose last ``/`` part is ``min`` or ``max`` (``advantage/min``,
``ratio/max``, ``vllm/is_ratio/min``) is the extreme of what it covers, and reduces as one (:func:`extreme`, used by
:class:`Means`) over a step's micro-batches, the processes and a log window: the smallest of the minima, the largest
of the maxima (docs/training.md#what-a-run-logs). An objective naming a metric so promises it is an extreme."""


STEP_SUMS = ("time/",)
"""Prefixes of the values a step sums over its micro-batches rather than averaging (:func:`step_sum`)."""


def step_sum(key: str) -> bool:
    """Whether ``key`` is summed over a step's micro-batches (seconds: ``time/generate``, ``time/reward``,
    ``time/sync``, ``time/diversity``), so the step logs the seconds the whole optimizer step spent, whatever
    ``train.grad_accum_steps``; over the steps of a log window and the processes it is still a mean (seconds per step,
    each process timing its own share in parallel). Until 2026-11-29 they were the mean over the micro-batches: a
    quarter of the step's seconds with 4 accumulation steps.

    >>> step_sum("time/generate"), step_sum("reward")
    (True, False)
    """
    return key.startswith(STEP_SUMS)


def extreme(key: str) -> Callable[[float, float], float] | None:
    """The reduction of ``key`` if it is a logged extreme (:data:`EXTREMES`), else ``None``.

    Example::

        >>> extreme("advantage/min") is min, extreme("vllm/logp_diff/max") is max, extreme("ratio/mean")
        (True, True, None)
    """
    return EXTREMES.get(key.rsplit("/", 1)[-1]) if "/" in key else None


class Means:
    """Per-key means of logged values added in turns (a step's micro-batches, a log window's steps, the processes):
    a key averages over the turns that gave it, and a NaN (a value nothing defined: a reward mean of a micro-batch
    whose every caption failed) is left out, so it is NaN only when every turn's was. An extreme (:func:`extreme`:
    ``advantage/min``) is the extreme of the turns' instead, so the order and grouping of the turns does not change
    it. ``sums``/``counts`` are the state (:meth:`Logger.state_dict`; an extreme's ``sums`` entry holds the extreme
    so far); a key whose every value so far was NaN has the sum NaN and count 1. ``summed`` (a step's micro-batches:
    :func:`step_sum`) marks the keys whose sum over the turns is kept instead of their mean.

    Example::

        >>> means = Means()
        >>> means.add({"reward": 0.2, "m": 1.0, "adv/min": -1.0}); means.add({"reward": float("nan")})
        >>> means.add({"reward": 0.4, "adv/min": -3.0})
        >>> means.means()
        {'reward': 0.30000000000000004, 'm': 1.0, 'adv/min': -3.0}
    """

    def __init__(self, summed: Callable[[str], bool] | None = None) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.summed = summed

    def add(self, values: dict[str, float]) -> None:
        for k, v in values.items():
            v = float(v)
            if k not in self.sums or (math.isnan(self.sums[k]) and not math.isnan(v)):  # first, or first defined
                self.sums[k], self.counts[k] = v, 1
            elif not math.isnan(v):
                reduce = extreme(k)
                self.sums[k] = reduce(self.sums[k], v) if reduce else self.sums[k] + v
                self.counts[k] += 1

    def means(self) -> dict[str, float]:
        """Each key's mean, or for an extreme its extreme, for a ``summed`` key its sum."""
        return {k: self.sums[k] if self._kept(k) else self.sums[k] / self.counts[k] for k in self.sums}

    def _kept(self, key: str) -> bool:
        """Whether ``key``'s running value is what is logged (an extreme, or a ``summed`` key), not divided."""
        return extreme(key) is not None or (self.summed is not None and self.summed(key))


def mean_over_processes(values: dict[str, float], accelerator: Accelerator) -> dict[str, float]:
    """Per-key mean of each process's ``values`` (:class:`Means`: keys present on only some processes average over
    those, a NaN counts only where every process's is; an extreme is the extreme over the processes)."""
    if accelerator.num_processes == 1:
        return values
    means = Means()
    for part in gather_object([values]):
        means.add(part)
    return means.means()


class Logger(Means):
    """Averages training values between log events (:class:`Means` over the steps) and sends events to the trackers
    (``accelerator.log``)."""

    def __init__(self, accelerator: Accelerator):
        super().__init__()
        self.accelerator = accelerator
        self.epoch_step: int | None = None  # the last step whose epoch was written

    def state_dict(self) -> dict[str, Any]:
        return {"sums": dict(self.sums), "counts": dict(self.counts), "extremes": True}

    def load_state_dict(self, state: dict[str, dict]) -> None:
        """Restore :meth:`state_dict`; ``ValueError`` unless every pending value has a number and a count >= 1 (the
        next log line divides one by the other). A state saved before extremes were reduced as extremes (no
        ``"extremes"``, before 2026-11-28) summed them: their pending sums become the mean of their values, what
        that run would have logged for them."""
        sums, counts = dict(state["sums"]), dict(state["counts"])
        numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in sums.values())
        if set(sums) != set(counts) or not numbers or not all(type(c) is int and c >= 1 for c in counts.values()):
            raise ValueError("the pending log values must be numbers, each with a count >= 1")
        if not state.get("extremes"):
            sums = {k: v / counts[k] if extreme(k) else v for k, v in sums.items()}
        self.sums, self.counts = sums, counts

    def flush_train(self, step: int, epoch: float) -> dict[str, float]:
        local = self.means()
        self.sums, self.counts = {}, {}
        values = mean_over_processes(local, self.accelerator)
        self.write(step, epoch, "train", values)
        return values

    def write(self, step: int, epoch: float, split: str, values: dict[str, Any]) -> None:
        """Log ``values`` as ``<split>/<name>`` (numbers as scalars, strings as text) at ``step``, with ``epoch`` at
        the step's first event only: a step that logs training and validation values (or a stop) writes it once, so
        TensorBoard's ``epoch`` curve has one point per step (until 2026-11-29 it had two there). ``metrics.jsonl``
        gives every event of the step its epoch still (:class:`JsonlTracker`)."""
        named = {f"{split}/{k}": v for k, v in values.items()}
        if step != self.epoch_step:
            named = {"epoch": round(epoch, 4), **named}
            self.epoch_step = step
        self.accelerator.log(named, step=step)
