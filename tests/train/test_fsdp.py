"""Sharded training (``train.strategy=fsdp``, torch's FSDP2 applied by finecap) in 2 CPU processes over gloo.

The same proof as tests/train/test_equivalence.py: one optimizer step of 2 sharded processes x batch 8 gives the
parameters of 1 process x batch 16, for MLE, SMILE, SCST (seeded sampled rollouts, decoded with full parameters while
each process decodes its own batch) and self-retrieval, within that test's bounds (justified there). Then: a run
stopped after its first step and resumed sharded continues exactly as the uninterrupted sharded run (equal bit for
bit); the same checkpoint resumes in one process (the optimizer state is stored full, keyed by parameter names) to
within the equivalence bounds, and a checkpoint of one process resumes sharded; gradient accumulation and clipping
act on sharded gradients; gradient checkpointing composes with sharding; the sharded run's checkpoint is a plain
transformers folder; and no sharded run's forward returns a view (FSDP2's warning). Every sharded run is trained in
the one launch of 2 processes that several modules share (:mod:`helpers.shared_launch`; the ``launched`` fixture).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from finecap.app.cli import main
from finecap.config import load
from finecap.runs import INFO_FILE, checkpoint_dir, model_dir
from finecap.train.run import train
from helpers.equivalence import OBJECTIVES, compare, overrides, weights

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(torch.accelerator.is_available(), reason="the test launches CPU processes on a CPU machine"),
]


@pytest.fixture(scope="module")
def launched(shared_launch) -> Path:
    """Every sharded run of this module, trained in the launch of 2 processes that several modules share
    (:func:`helpers.shared_launch.fsdp_runs`), once for both xdist workers, so that the absence of FSDP2's view
    warning is checked over all of them (the launch's ``launch.log``): one step of each objective
    (``<name>-fsdp``) and the resume test's runs (``whole``, ``cut``, ``ckpt`` with gradient checkpointing,
    ``cut1``, ``one``); around the launch, the resume test's one-process parts (``one``'s step 1 before it,
    ``cut1``'s step 2 after it). Every run's feature cache: ``cache``."""
    return shared_launch / "fsdp"


def test_no_sharded_run_returns_a_view(launched):
    """FSDP2 warns when a sharded module's forward returns a view: an in-place op on it would skip the pre-backward
    all-gather. No run of the launch may print it (the other modules' sharded runs as well), gradient checkpointing's
    (ClipCap's scores of given sequences in vocabulary chunks) included."""
    log = (launched.parent / "launch.log").read_text()
    assert "returned a view tensor" not in log, [line for line in log.splitlines() if "view tensor" in line][:3]


def test_two_sharded_processes_equal_one_big_batch(launched, world_args, clip_dir, tmp_path):
    args = dict(world=world_args, clip=clip_dir, cache=tmp_path / "cache")
    for name in OBJECTIVES:
        info = json.loads((checkpoint_dir(launched / f"{name}-fsdp", "last") / INFO_FILE).read_text())
        assert info["sharded"] is True and info["num_processes"] == 2
        big = train(load(None, overrides(name, tmp_path / f"{name}-big", batch=16, accum=1, **args)))
        compare(weights(big), weights(launched / f"{name}-fsdp"), f"{name}: 2 sharded processes x 8 vs 1 x 16")
    # the sharded checkpoint is a plain transformers folder (the language model of ClipCap) with the trained weights
    lm = AutoModelForCausalLM.from_pretrained(model_dir(checkpoint_dir(launched / "mle-fsdp", "last")) / "lm")
    trained = weights(launched / "mle-fsdp")
    assert all(torch.equal(v, trained[f"lm.{k}"]) for k, v in lm.state_dict().items() if f"lm.{k}" in trained)
    # and a one-process `finecap caption` decodes it
    out = tmp_path / "captions.json"
    code = main(["caption", "--checkpoint", str(launched / "mle-fsdp"), "--out", str(out),
                 f"run.cache_dir={tmp_path / 'cache'}"])  # fmt: skip
    assert code == 0
    assert len(json.loads(out.read_text())) == 8  # world.n_test


def test_resume_sharded_is_exact_and_in_one_process_is_close(launched):
    """2 steps with accumulation (2 micro-batches of 4 per process) and clipping: uninterrupted, and stopped after
    step 1 then resumed, sharded; the resumed sharded run equals the uninterrupted one bit for bit."""
    whole, cut = weights(launched / "whole"), weights(launched / "cut")
    assert all(torch.equal(whole[k], cut[k]) for k in whole), "resumed sharded run differs from the uninterrupted one"
    compare(whole, weights(launched / "ckpt"), "sharded with gradient checkpointing vs without")
    events = [json.loads(line) for line in (launched / "whole" / "metrics.jsonl").read_text().splitlines()]
    norms = [e["values"]["grad_norm"] for e in events if e["split"] == "train"]
    assert norms and all(n > 0.05 for n in norms)  # clipping was active (norm logged before clipping)
    # a sharded checkpoint of step 1 resumed in one process (1 x 8 x 2 accumulation steps: the same global batch)
    compare(whole, weights(launched / "cut1"), "sharded step 1, then step 2 resumed in one process")
    # and the other way: the run started in one process (nothing to shard: torch's position-keyed optimizer state)
    # resumed sharded over 2 (refused before, as 'trained with train.strategy=ddp'; a run could never scale out)
    info = json.loads((checkpoint_dir(launched / "one", "last") / INFO_FILE).read_text())
    assert (info["step"], info["sharded"], info["num_processes"]) == (2, True, 2)
    compare(whole, weights(launched / "one"), "step 1 in one process, then step 2 resumed sharded over 2")
