"""Seeding and the process's random states (saved with checkpoints, restored on resume)."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of ``epoch``'s draws (the data order, the DataLoader workers' seeds, BagCurri's rebuilt bags) under
    ``run.seed`` = ``seed``: ``seed * 1_000_003 + epoch`` taken modulo 2**64, the range a torch generator takes (it
    reads a negative seed modulo 2**64 too, so every seed keeps the order it had), so that any integer ``run.seed``
    works (``run.seed=$(date +%s%N)`` overflowed torch's ``manual_seed`` at the first training step).

    Example::

        >>> epoch_seed(3, 1), epoch_seed(-1, 0) == 2**64 - 1_000_003, epoch_seed(2**62, 0) < 2**64
        (3000010, True, True)
    """
    return (seed * 1_000_003 + epoch) % 2**64


def seed_everything(seed: int) -> None:
    # Deferred: utils is on the start-up path of text-only commands (`finecap eval` writes JSON with it), which
    # must not import torch (tests/app/test_cli.py checks); only training seeds.
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """This process's random states (python, numpy, torch CPU and CUDA)."""
    import torch  # deferred, as in seed_everything

    version, internal, gauss = random.getstate()
    state = {"python": {"version": version, "internal": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
             "numpy": np.random.get_state(legacy=True), "torch": torch.get_rng_state()}  # fmt: skip
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state`."""
    import torch

    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["internal"].tolist()), py["gauss"]))
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def rng_preserved() -> Iterator[None]:
    """Within the block, code may reseed the process's random generators (vLLM's engine start does); after it they
    are as before (:func:`rng_state`), so a training run's draws do not depend on when an engine was started."""
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)


@contextlib.contextmanager
def torch_seeded(seed: int) -> Iterator[None]:
    """Within the block, torch's global generator starts from ``torch.manual_seed(seed)`` (modules built there draw
    the same initial weights for the same ``seed``); after it every random state is as before (:func:`rng_preserved`),
    so building a seeded model (the tiny models of :mod:`finecap.models.tiny`) leaves the caller's later draws as they
    were (a notebook's, a test's)."""
    import torch  # deferred, as in seed_everything

    with rng_preserved():
        torch.manual_seed(seed)
        yield
