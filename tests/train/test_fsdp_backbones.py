"""FSDP2 on every backbone (issue 49, item 4): the world BLIP and the world VLM train sharded over 2 gloo processes
through validation after every step (validation loss, the captions validator decoding with full parameters, the
frozen-feature cache's fingerprint) and checkpointing, the sharded checkpoint captions in one process, and the losses
equal those of the same runs under DDP. (ClipCap's sharded runs are tests/train/test_fsdp.py and
test_fsdp_validation.py.) The VLM crashed at its first validation: the feature cache's fingerprint called ``numpy()``
on a sharded parameter."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

from finecap.app.cli import main
from finecap.runs import METRICS_FILE
from helpers.launch import launch_bounded, two_processes
from helpers.once import once_per_session

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(torch.accelerator.is_available(), reason="the test launches CPU processes on a CPU machine"),
]
TIMEOUT = 600  # seconds for the one launch of 6 tiny runs
BACKBONES = {
    "blip": ["model.kind=blip", "blip.name=world-tiny", "blip.tiny_layers=1", "blip.tiny_hidden=32",
             "blip.tiny_heads=2"],
    "vlm": ["model.kind=vlm", "vlm.name=world-tiny", "vlm.tiny_layers=1", "vlm.tiny_hidden=32", "vlm.tiny_heads=2"],
}  # fmt: skip


def run_overrides(run_dir: Path, world: list[str], clip: Path, cache: Path, backbone: str, strategy: str) -> list:
    """2 steps of a tiny world-backbone captioner over 2 processes x batch 4, validated after each step, saved."""
    return [
        *world, *BACKBONES[backbone], f"model.encoder={clip}", f"run.cache_dir={cache}", "decode.max_length=6",
        "train.max_steps=2", "train.warmup_steps=0", "train.schedule=constant", "train.lr=1e-3", "train.eval_every=1",
        "train.eval_samples=4", "train.log_captions=2", "train.log_every=1", "train.batch_size=4",
        "train.validators=[captions]", f"train.strategy={strategy}", f"run.dir={run_dir}",
    ]  # fmt: skip


def losses(run_dir: Path) -> dict[tuple[int, str], float]:
    events = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]
    return {(e["step"], e["split"]): e["values"]["loss"] for e in events if e["split"] in ("train", "val")}


def grpo_overrides(run_dir: Path, world: list[str], clip: Path, cache: Path, strategy: str) -> list:
    """2 steps of demo/grpo_cider on a tiny ClipCap over 2 processes x batch 4, validated at step 2."""
    tiny = [*world, f"model.encoder={clip}", f"run.cache_dir={cache}", "clipcap.tiny_layers=1",
            "clipcap.tiny_hidden=32", "clipcap.tiny_heads=2", "clipcap.prefix_length=2", "clipcap.tiny_dropout=0",
            "train.init_from=", "train.max_steps=2", "train.batch_size=4", "train.eval_every=2",
            "train.eval_samples=4", "train.log_every=1", "decode.max_length=6", "rl.samples=3"]  # fmt: skip
    return ["--recipe=demo/grpo_cider", *tiny, f"train.strategy={strategy}", f"run.dir={run_dir}"]


@pytest.fixture(scope="module")
def launched(world_args, clip_dir, tmp_path_factory) -> Path:
    """Every run of this module trained in one launch of 2 processes, one after another (each launch costs both
    processes' imports of torch, transformers and finecap), once for both xdist workers:
    ``backbones/<backbone>-<strategy>`` (cache ``backbones/cache``) and ``grpo/<strategy>`` (cache ``grpo/cache``)."""

    def make(root: Path) -> None:
        cache = root / "backbones" / "cache"
        runs = [(run_overrides(root / "backbones" / f"{b}-{s}", world_args, clip_dir, cache, b, s), False)
                for b in BACKBONES for s in ("fsdp", "ddp")]  # fmt: skip
        runs += [(grpo_overrides(root / "grpo" / s, world_args, clip_dir, root / "grpo" / "cache", s), False)
                 for s in ("fsdp", "ddp")]  # fmt: skip
        worker = str(Path(__file__).with_name("fsdp_worker.py"))
        launch_bounded([*two_processes(), worker, json.dumps(runs)], root / "launch.log", TIMEOUT)

    return once_per_session(tmp_path_factory, "fsdp_backbones", make)


def test_blip_and_vlm_train_sharded_through_validation_and_caption_in_one_process(launched, tmp_path):
    folder = launched / "backbones"
    cache = folder / "cache"
    for backbone in BACKBONES:
        run = folder / f"{backbone}-fsdp"
        info = json.loads((run / "checkpoints" / "last" / "trainer_state.json").read_text())
        assert info["sharded"] is True and info["num_processes"] == 2
        sharded, ddp = losses(run), losses(folder / f"{backbone}-ddp")
        assert sorted(sharded) == [(s, split) for s in (1, 2) for split in ("train", "val")], backbone
        for key, value in ddp.items():  # the same sums in another order (float32)
            assert sharded[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (backbone, key)
        out = tmp_path / f"{backbone}.json"
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = main(["caption", "--checkpoint", str(run), "--out", str(out), f"run.cache_dir={cache}"])
        assert code == 0, err.getvalue()
        assert len(json.loads(out.read_text())) == 8  # world.n_test


def test_grpo_trains_sharded_as_under_ddp(launched):
    """GRPO (demo/grpo_cider: group advantages, the clipped surrogate, rollouts decoded with full parameters by every
    process at once) over 2 sharded processes logs the losses of the same run under DDP (issue 50: FSDP2)."""
    sharded, ddp = losses(launched / "grpo" / "fsdp"), losses(launched / "grpo" / "ddp")
    assert sorted(k for k in sharded if k[1] == "train") == [(1, "train"), (2, "train")]
    assert sharded.keys() == ddp.keys()
    for key, value in ddp.items():
        assert sharded[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
