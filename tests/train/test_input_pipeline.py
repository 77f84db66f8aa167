"""The training and captioning input pipeline: one DataLoader per run whatever the epochs, DataLoader workers that
change nothing but where batches are made (the same weights, the same captions), and resume-exactness with
persistent workers."""

from __future__ import annotations

import json

import pytest
import torch

from finecap.caption import generate_captions
from finecap.config import DecodeConfig
from finecap.data import loading
from finecap.data.samplers import StepBatches
from finecap.home import run_path
from finecap.models.clipcap import ClipCap
from finecap.runs import checkpoint_dir, model_dir
from finecap.train.run import train
from helpers.resume import Killed, kill_at, train_events, weights

# 200 examples / 32 per step = 7 steps per epoch: 16 steps run 3 epochs (the third one partly)
STEPS = ["train.max_steps=16", "train.batch_size=32", "train.eval_every=7", "train.log_every=4"]


@pytest.fixture
def loaders(monkeypatch):
    """Every DataLoader the pipeline builds, recorded: ``(batch sampler, num_workers, persistent_workers)``."""
    built = []

    class Counted(torch.utils.data.DataLoader):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append((kwargs.get("batch_sampler"), self.num_workers, self.persistent_workers))

    monkeypatch.setattr(loading, "DataLoader", Counted)
    return built


@pytest.mark.slow
def test_one_training_dataloader_per_run_and_workers_change_nothing(make_cfg, loaders):
    main = train(make_cfg(*STEPS, run="main"))
    in_workers = train(make_cfg(*STEPS, "data.num_workers=2", run="workers"))
    training = [(w, p) for sampler, w, p in loaders if isinstance(sampler, StepBatches)]
    assert training == [(0, False), (2, True)]  # one per run, over 3 epochs; persistent workers with workers
    assert len(loaders) > len(training)  # the validation loss built its own (every evaluation, no workers)
    a, b = weights(main), weights(in_workers)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert train_events(main) == train_events(in_workers)


@pytest.mark.slow
def test_killed_and_resumed_run_with_persistent_workers_matches_uninterrupted(make_cfg):
    # As tests/train/test_resume.py, with 2 persistent workers: the resumed run's one DataLoader starts mid-epoch.
    common = ["train.max_steps=10", "train.batch_size=32", "train.save_every=3", "train.eval_every=4",
              "train.log_every=2", "data.num_workers=2"]  # fmt: skip
    full = train(make_cfg(*common, run="full"))
    cfg = make_cfg(*common, run="killed")
    with pytest.raises(Killed):
        train(cfg, callbacks=[kill_at(5)])
    resumed = train(cfg, resume=True)
    a, b = weights(full), weights(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert train_events(resumed) == train_events(full)


@pytest.mark.slow
def test_a_seed_of_nanoseconds_trains_with_workers(make_cfg, loaders):
    # run.seed=$(date +%s%N): the sampler's and the workers' epoch seeds (seed * 1_000_003 + epoch) overflowed
    # torch's manual_seed at the first step, after the data and the feature cache were built
    run = train(make_cfg("train.max_steps=2", "run.seed=1700000000000000000", "data.num_workers=2"))
    assert json.loads((checkpoint_dir(run, "last") / "trainer_state.json").read_text())["step"] == 2


def test_captions_decoded_in_workers_equal_the_main_process(make_cfg, loaders):
    # A trained encoder reads pixels: images are decoded and preprocessed in the workers.
    cfg = make_cfg("train.max_steps=2", "model.train_encoder=true")
    train(cfg)
    model = ClipCap.from_checkpoint(model_dir(checkpoint_dir(run_path(cfg.run), "last")))
    decode = DecodeConfig(strategy="greedy", max_length=8, batch_size=3)
    main = generate_captions(model, cfg, "val", decode=decode, progress=False)
    loaders.clear()
    workers_cfg = make_cfg("train.max_steps=2", "model.train_encoder=true", "data.num_workers=2")
    in_workers = generate_captions(model, workers_cfg, "val", decode=decode, progress=False)
    assert in_workers == main and len(main) == 8
    assert [(w, p) for _, w, p in loaders] == [(2, False)]  # one loader, 2 workers, not kept
