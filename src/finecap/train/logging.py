"""Logging of a training run: finecap's ``jsonl`` tracker, the flattened configuration trackers receive, and the
:class:`Logger` that averages training values between log events.

Logged values are averaged over micro-batches and processes and go to the trackers of ``train.log_with`` through
``accelerator.log`` (``jsonl``: ``metrics.jsonl``, one event per line; ``tensorboard``, ``wandb``, ``mlflow``, ... as
accelerate supports them, under ``<run>/trackers``). Only the main process writes. Trackers receive the configuration
with every secret masked (:func:`tracker_config`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from accelerate.tracking import GeneralTracker
from accelerate.utils import gather_object

from finecap.config import flat_options
from finecap.utils.files import append_jsonl


class JsonlTracker(GeneralTracker):
    """accelerate tracker ``jsonl``: one line per event in ``metrics.jsonl``,
    ``{"step", "epoch", "split", "values", "text"?}``; keys logged as ``"<split>/<name>"`` are grouped by split,
    string values go to ``text``."""

    name = "jsonl"
    requires_logging_directory = False
    main_process_only = True

    def __init__(self, path: Path):
        super().__init__()
        self.path = Path(path)

    @property
    def tracker(self) -> Path:
        return self.path

    def store_init_configuration(self, values: dict) -> None:  # the run's config.yaml holds it
        pass

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        epoch = values.get("epoch")
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
            append_jsonl(self.path, record)


def tracker_config(config: dict[str, dict[str, Any]]) -> dict[str, int | float | str | bool]:
    """A configuration (``{section: {key: value}}``, secrets already masked) flattened to ``section.key`` scalars, as
    trackers' hyper-parameter tables accept them (a nested section's keys by their whole name,
    ``data.hf.image_column``: :func:`finecap.config.flat_options`)."""
    return {key: value if isinstance(value, int | float | str | bool) else json.dumps(value)
            for key, value in flat_options(config).items()}  # fmt: skip


def mean_over_processes(values: dict[str, float], accelerator: Accelerator) -> dict[str, float]:
    """Per-key mean of each process's ``values`` (keys present on only some processes average over those)."""
    if accelerator.num_processes == 1:
        return values
    sums: dict[str, list[float]] = {}
    for part in gather_object([values]):
        for k, v in part.items():
            sums.setdefault(k, []).append(v)
    return {k: sum(v) / len(v) for k, v in sums.items()}


class Logger:
    """Averages training values between log events and sends events to the trackers (``accelerator.log``)."""

    def __init__(self, accelerator: Accelerator):
        self.accelerator = accelerator
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def state_dict(self) -> dict[str, dict]:
        return {"sums": dict(self.sums), "counts": dict(self.counts)}

    def load_state_dict(self, state: dict[str, dict]) -> None:
        """Restore :meth:`state_dict`; ``ValueError`` unless every pending value has a number and a count >= 1 (the
        next log line divides one by the other)."""
        sums, counts = dict(state["sums"]), dict(state["counts"])
        numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in sums.values())
        if set(sums) != set(counts) or not numbers or not all(type(c) is int and c >= 1 for c in counts.values()):
            raise ValueError("the pending log values must be numbers, each with a count >= 1")
        self.sums, self.counts = sums, counts

    def add(self, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v)
            self.counts[k] = self.counts.get(k, 0) + 1

    def flush_train(self, step: int, epoch: float) -> dict[str, float]:
        local = {k: self.sums[k] / self.counts[k] for k in self.sums}
        self.sums, self.counts = {}, {}
        values = mean_over_processes(local, self.accelerator)
        self.write(step, epoch, "train", values)
        return values

    def write(self, step: int, epoch: float, split: str, values: dict[str, Any]) -> None:
        """Log ``values`` as ``<split>/<name>`` (numbers as scalars, strings as text) at ``step``."""
        self.accelerator.log({"epoch": round(epoch, 4), **{f"{split}/{k}": v for k, v in values.items()}}, step=step)
