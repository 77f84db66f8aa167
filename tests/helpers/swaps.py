"""A run still training saves its next ``best`` while a reader is reading the current one: the race that
:func:`finecap.runs.reading_checkpoint` closes (a reader pairing one save's ``config.yaml`` with the next save's
weights). :func:`clipcap_run` writes the run, :class:`NextSave` saves its next best at the moment a test picks."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from finecap.config import ClipCapBackboneConfig, load
from finecap.runs import BEST, checkpoint_dir
from finecap.train.checkpoint import save_checkpoint

FIRST, NEXT = 5, 9
"""``decode.max_length`` in the stored configuration of the run's first best and of its next one."""


def clipcap_run(folder: Path) -> tuple[Path, torch.nn.Module, Callable[[], None]]:
    """A run directory under ``folder`` whose best checkpoint (step 7) is a tiny ClipCap stored with
    ``decode.max_length=FIRST``; its model; and the run's next save of best (step 9): every weight 1 more, stored with
    ``decode.max_length=NEXT``."""
    from finecap.models.clipcap import ClipCap
    from finecap.models.presets import build_world_lm, save_tiny_clip
    from finecap.models.vision import VisionEncoder

    clip = save_tiny_clip(folder / "clip", image_size=16, patch_size=8)
    torch.manual_seed(0)
    lm, tok = build_world_lm(layers=1, hidden=32, heads=2)
    encoder = VisionEncoder.from_pretrained(clip)
    model = ClipCap(lm, tok, encoder.feature_dim, ClipCapBackboneConfig(prefix_length=2), encoder=encoder).eval()
    run_dir = folder / "run"
    best = checkpoint_dir(run_dir, BEST)

    def cfg(max_length: int):
        return load(None, [f"model.encoder={clip}", "clipcap.tiny_layers=1", "clipcap.tiny_hidden=32",
                           "clipcap.tiny_heads=2", "clipcap.prefix_length=2", "decode.strategy=greedy",
                           f"decode.max_length={max_length}", "train.cpu=true"])  # fmt: skip

    save_checkpoint(best, model=model, cfg=cfg(FIRST), info={"step": 7})
    first = weight_sum(model)

    def save_next() -> None:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        assert weight_sum(model) != first
        save_checkpoint(best, model=model, cfg=cfg(NEXT), info={"step": 9})

    return run_dir, model, save_next


def weight_sum(model: torch.nn.Module) -> float:
    """The sum of every weight of ``model``: which save's weights it holds."""
    return float(sum(p.detach().double().sum() for p in model.parameters()))


class NextSave:
    """The run's next save (``save``), made in a thread that :meth:`start` starts while a reader is between two of its
    reads; :meth:`start` returns once the save waits for a reader's hold of the run's swap guard (it logs so) or has
    swapped its checkpoint in (nothing held it off). ``waited``: whether it waited. A context manager: the save is
    joined on exit."""

    def __init__(self, save: Callable[[], None]) -> None:
        self.said = threading.Event()
        self.waited = False
        self.thread = threading.Thread(target=self._save)
        self.save = save
        self.started = False

    def _save(self) -> None:
        try:
            self.save()
        finally:
            self.said.set()

    def start(self) -> None:
        assert not self.started, "the next save is made once"
        self.started = True
        self.thread.start()
        assert self.said.wait(120), "the next save neither waited nor finished"

    def after(self, read: Callable[..., Any]) -> Callable[..., Any]:
        """``read`` (a reader's step, patched in its place) that starts the next save once it has returned: the save
        comes between that read and the reader's next one."""

        def read_then_save(*args: Any, **kwargs: Any) -> Any:
            out = read(*args, **kwargs)
            self.start()
            return out

        return read_then_save

    def __enter__(self) -> NextSave:
        outer = self

        class Waiting(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if "waiting for another process to finish loading" in record.getMessage():
                    outer.waited = True
                    outer.said.set()

        self.handler, self.log = Waiting(), logging.getLogger("finecap.runs")
        self.level = self.log.level
        self.log.addHandler(self.handler)
        self.log.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.started:
            self.thread.join(120)
        self.log.removeHandler(self.handler)
        self.log.setLevel(self.level)
