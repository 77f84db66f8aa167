"""Validation in the middle of sharded training (``train.strategy=fsdp``) runs the same collectives on every process
(issue 48, class 5: a hang).

Training's evaluation holds full parameters for all of its validation (:func:`finecap.models.sharding.decoding`);
inside it a validator's ``generate_captions`` opened a second decoding block, whose exit resharded the model, and the
frozen-feature cache's fingerprint called ``state_dict()``, whose FSDP2 hook reshards too (and ``numpy()`` on a
gathered parameter left its storage unfreeable). The main process's sample captions then all-gathered alone: rank 0
waited in ``all_gather`` while rank 1 went on (to ``broadcast``, then to the next backward's ``reduce_scatter``).

In one process (a 1-process gloo group, as tests/models/test_sharding.py): nested blocks and fingerprints leave the
parameters gathered. In 2 processes (slow): runs that validate at every step, with the validators that caption the
validation images (frozen features through the cache, and pixels through a trained encoder) and the main process's
sample captions, finish under a hard timeout (a deadlock kills the process group and fails) and log the losses of the
same runs under DDP.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from finecap.config import ClipCapBackboneConfig, DecodeConfig
from finecap.data.features import fingerprint_module
from finecap.models import sharding
from finecap.models.clipcap import ClipCap
from finecap.models.presets import build_world_lm
from finecap.runs import METRICS_FILE
from helpers.shared_launch import VALIDATION_VARIANTS


def is_gathered(model: torch.nn.Module) -> bool:
    return not any(type(p).__name__ == "DTensor" for p in model.parameters())


def captioner() -> ClipCap:
    torch.manual_seed(0)
    lm, tok = build_world_lm(layers=2, hidden=32, heads=2, dropout=0.0)
    return ClipCap(lm, tok, 24, ClipCapBackboneConfig(prefix_length=2))


def test_a_nested_decoding_block_keeps_the_parameters_gathered(group):
    model = captioner().eval()
    sharding.shard_captioner(model)
    features = torch.randn(2, 24, generator=torch.Generator().manual_seed(1))
    cfg = DecodeConfig(strategy="greedy", max_length=5)
    with sharding.decoding(model) as full:
        with sharding.decoding(model) as inner:  # a validator's generate_captions inside training's evaluation
            assert inner is full and is_gathered(model)
            first = full.generate(features, cfg).sequences
        assert is_gathered(model)  # the inner block's exit resharded the model, and the next decode all-gathered
        assert torch.equal(full.generate(features, cfg).sequences, first)
    assert not is_gathered(model)  # the outer block reshards on exit
    with sharding.decoding(model):  # and opens again
        assert is_gathered(model)


@pytest.mark.parametrize("where", ["inside a decoding block", "outside, sharded"])
def test_the_feature_fingerprint_leaves_a_sharded_model_alone_and_equals_the_plain_ones(group, where):
    plain, model = captioner(), captioner()
    sharding.shard_captioner(model)
    expected = fingerprint_module(plain.lm)
    if where == "outside, sharded":
        assert fingerprint_module(model.lm) == expected  # DTensors hashed whole
        assert not is_gathered(model)
        return
    with sharding.decoding(model):
        assert fingerprint_module(model.lm) == expected
        assert is_gathered(model)  # state_dict()'s FSDP2 hook had resharded it
    assert not is_gathered(model)  # and the exit frees the gathered storage (numpy() had made it unresizable)


# -- two processes ------------------------------------------------------------------------------------------------


def losses(run_dir: Path) -> dict[tuple[int, str], float]:
    events = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]
    return {(e["step"], e["split"]): e["values"]["loss"] for e in events if e["split"] in ("train", "val")}


@pytest.mark.slow
@pytest.mark.skipif(torch.accelerator.is_available(), reason="the test launches CPU processes on a CPU machine")
def test_sharded_training_validated_mid_run_finishes_and_matches_ddp(shared_launch):
    """The runs of :func:`helpers.shared_launch.validation_runs`, trained in the shared launch under its hard
    timeout."""
    folder = shared_launch / "validation"
    for variant in VALIDATION_VARIANTS:
        sharded, ddp = losses(folder / f"fsdp-{variant}"), losses(folder / f"ddp-{variant}")
        assert sorted(sharded) == [(s, split) for s in (1, 2, 3) for split in ("train", "val")], variant
        assert sharded.keys() == ddp.keys()
        for key, value in ddp.items():  # the same sums in another order (float32)
            assert sharded[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (variant, key)
