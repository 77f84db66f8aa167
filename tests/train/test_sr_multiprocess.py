"""Self-retrieval under ``accelerate launch`` with 2 CPU processes: the in-batch distractors are the *global* batch.

The demo's DiscriTune recipe runs on a tiny world with 2 processes of 8 images each (launched through torchrun with
``--multi_gpu``, see tests/train/test_multiprocess.py). Every caption must be scored against all 16 images of the
global batch, so the first step's rewards equal those of a single process training on batches of 16.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from finecap.config import load
from finecap.recipes import resolve_recipe
from finecap.train.run import train
from helpers.shared_launch import discritune_run

RECIPE = resolve_recipe("demo/discritune")


def train_values(run_dir: Path) -> list[dict]:
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [e["values"] for e in events if e["split"] == "train"]


@pytest.mark.slow
@pytest.mark.skipif(torch.accelerator.is_available(), reason="the test launches CPU processes on a CPU-only machine")
def test_in_batch_distractors_are_the_global_batch(world_args, clip_dir, tmp_path, shared_launch):
    folder = shared_launch / "discritune"  # 2 processes x 8: helpers.shared_launch.discritune_runs
    two = folder / "two"

    # 40 training images in global batches of 2 x 8 = 16: 16, 16, then the last 8 images
    values = train_values(two)
    assert [v["reward/retrieval/candidates"] for v in values] == [16.0, 16.0, 8.0]

    _, *single_run = discritune_run(tmp_path / "one", world_args, clip_dir, folder / "cache", 16)
    one = train(load(RECIPE, single_run))
    single = train_values(one)
    assert [v["reward/retrieval/candidates"] for v in single] == [16.0, 16.0, 8.0]
    # same start, same global batch, greedy captions: the first step's rewards agree (each process averages its 8)
    for key in ("reward", "reward/retrieval/accuracy", "reward/retrieval/cosine", "baseline"):
        assert values[0][key] == pytest.approx(single[0][key], abs=1e-5), key
