"""Mixed precision from an empty finecap home (issue 49, item 3): ``finecap train`` trains the world encoder (float32,
its own ``Accelerator``) and then the captioner in bf16 or fp16 with gradient checkpointing, in one process, on every
backbone. accelerate keeps one precision per process and refused the second ``Accelerator`` ("AcceleratorState has
already been initialized and cannot be changed") until :func:`finecap.train.engine._release_precision`."""

from __future__ import annotations

import json
import math

import pytest

from helpers.cli import run_cli

WORLD = ("world.n_train=20", "world.n_val=4", "world.n_test=4", "world.image_size=32")
ENCODER = ("retriever.epochs=1", "retriever.batch_size=8", "retriever.batch_size_eval=16")
TRAIN = ("train.max_steps=2", "train.batch_size=8", "train.eval_samples=4", "train.eval_every=1", "train.log_every=1",
         "decode.max_length=6", "train.gradient_checkpointing=true")  # fmt: skip
BACKBONES = {
    "demo/mle": ("clipcap.tiny_layers=1", "clipcap.tiny_hidden=32", "clipcap.tiny_heads=2", "clipcap.prefix_length=2"),
    "demo/blip_mle": ("blip.tiny_layers=1", "blip.tiny_hidden=32", "blip.tiny_heads=2"),
    "demo/vlm_mle": ("vlm.tiny_layers=1", "vlm.tiny_hidden=32", "vlm.tiny_heads=2"),
}


def test_a_second_accelerator_may_take_another_precision():
    from finecap.config import TrainConfig
    from finecap.train.engine import make_accelerator

    first = make_accelerator(TrainConfig(cpu=True, mixed_precision="no"))
    assert first.mixed_precision == "no"
    second = make_accelerator(TrainConfig(cpu=True, mixed_precision="bf16"))
    assert second.mixed_precision == "bf16"
    again = make_accelerator(TrainConfig(cpu=True, mixed_precision="bf16"))  # same precision: state kept
    assert again.state is second.state or again.mixed_precision == "bf16"
    make_accelerator(TrainConfig(cpu=True, mixed_precision="no"))  # leave the process as the other tests expect


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("recipe", list(BACKBONES))
def test_mixed_precision_trains_from_an_empty_home(recipe, precision, tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("FINECAP_HOME", str(home))
    dtype = "bfloat16" if precision == "bf16" else "float32"  # fp16 weights do not train on the CPU; autocast does
    run = tmp_path / "run"
    argv = ["train", recipe, *WORLD, *ENCODER, *TRAIN, *BACKBONES[recipe], f"world.out={tmp_path / 'w'}",
            f"model.dtype={dtype}", f"train.mixed_precision={precision}", "--out", str(run)]  # fmt: skip
    code, _, err = run_cli(argv)
    assert code == 0, err
    assert "training the world encoder" in err  # the encoder was trained in this process, first
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [e["values"]["loss"] for e in events if e.get("split") == "train"]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses), losses
    assert any(e.get("split") == "val" for e in events)  # validation ran under the same precision
    assert (run / "checkpoints" / "best").is_dir()
