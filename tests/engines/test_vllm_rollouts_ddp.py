"""RL rollouts on vLLM (``decode.engine=vllm``) in 2 training processes (``accelerate launch``, gloo on this CPU),
DDP and FSDP2: each process builds its own colocated engine, joined to the training's process group (vLLM's
``external_launcher`` executor, as TRL's colocate mode), rolls out its own images on it and syncs it from its own
policy after each optimizer step (under FSDP2 the full weights gathered once per sync).

3 SCST steps on a tiny Idefics3 captioner in float32 (a reward that pays for length, so every step moves the policy)
over 2 processes x 2 images equal 1 process x 4 images: every step's loss, reward and gradient norm, and the weights
after training (the bounds of tests/helpers/equivalence.py). Each process samples an image's captions from the
image's own seed, so the same captions in both runs. At every step each process's engine log-probs of its samples
equal the policy's within 1e-4 (|log importance ratio| < 1e-4: the weights reached every engine; without the sync the
smallest ratio is 0.007), the losses are finite, and the weights moved (the equality is not that of runs that did
nothing)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from helpers.vllm_engines import NOT_HERE

pytest.importorskip("vllm", reason=NOT_HERE)

from finecap.config import WorldConfig, load  # noqa: E402
from finecap.models.vlm import Vlm  # noqa: E402
from finecap.runs import checkpoint_dir, model_dir  # noqa: E402
from finecap.train.run import train  # noqa: E402
from helpers.equivalence import compare  # noqa: E402
from helpers.launch import launch_bounded, two_processes  # noqa: E402

CPU_ONLY = pytest.mark.skipif(torch.accelerator.is_available(), reason="the test launches CPU processes (gloo)")
pytestmark = [pytest.mark.slow, CPU_ONLY]

STEPS = 3
WORKER = Path(__file__).with_name("vllm_ddp_worker.py")


def overrides(tmp_path: Path, world: Path, vlm: Path, run: str, batch: int) -> list[str]:
    return [
        f"world.out={world}", "world.n_train=8", "world.n_val=4", "world.n_test=4", "world.image_size=32",
        "model.kind=vlm", f"vlm.name={vlm}", f"run.dir={tmp_path / run}", f"run.cache_dir={tmp_path / 'cache'}",
        "train.objective=reinforce", "rl.rewards={'vllm_ddp_worker:words': 1.0}", "rl.baseline=greedy",
        "rl.samples=3", "decode.engine=vllm", "decode.max_length=8", "vllm.max_model_len=128",
        "vllm.kv_cache_memory_bytes=268435456", f"train.max_steps={STEPS}", f"train.batch_size={batch}",
        "train.lr=1e-2", "train.warmup_steps=0", "train.schedule=constant", "train.log_every=1",
        "train.eval_every=100", "train.eval_samples=4", "train.log_captions=0",
    ]  # fmt: skip


def train_values(run_dir: Path) -> list[dict]:
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [e["values"] for e in events if e["split"] == "train"]


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return Vlm.from_pretrained(str(model_dir(checkpoint_dir(run_dir, "last")))).state_dict()


def test_two_processes_roll_out_on_engines_of_their_own_and_equal_one(tmp_path):
    from finecap.models.presets import save_tiny_vlm
    from finecap.world.make import make_world

    world = make_world(WorldConfig(n_train=8, n_val=4, n_test=4, image_size=32, seed=0), out=tmp_path / "world",
                       progress=False)  # fmt: skip
    vlm = save_tiny_vlm(tmp_path / "vlm", "idefics3", std=0.1, hidden=64, heads=2, kv_heads=1)
    runs = [overrides(tmp_path, world, vlm, "ddp", batch=2),
            [*overrides(tmp_path, world, vlm, "fsdp", batch=2), "train.strategy=fsdp"]]  # fmt: skip
    launch_bounded([*two_processes(), str(WORKER), json.dumps(runs)], tmp_path / "launch.log", timeout=300)
    one = train(load(None, overrides(tmp_path, world, vlm, "one", batch=4)))  # the reference, in this process

    reference, start = weights(one), Vlm.from_pretrained(str(vlm)).state_dict()
    moved = max((reference[k] - start[k]).abs().max().item() for k in start)
    assert moved > 1e-3
    expected = train_values(one)
    for run in ("ddp", "fsdp"):
        values = train_values(tmp_path / run)
        assert len(values) == len(expected) == STEPS, run
        for step, (v, e) in enumerate(zip(values, expected, strict=True)):
            assert math.isfinite(v["loss"]), (run, step)
            assert 1 - 1e-4 <= v["vllm/is_ratio/min"] <= v["vllm/is_ratio/max"] <= 1 + 1e-4, (run, step, v)
            # logged: the mean of the 2 processes' values; of non-negative maxima, each process's is below 1e-4
            assert v["vllm/logp_diff/max"] < 0.5e-4, (run, step)
            assert v["time/sync"] > 0, (run, step)  # built at step 1, sent the policy's weights at the next ones
            assert v["loss"] == pytest.approx(e["loss"], rel=1e-5), (run, step)
            assert v["reward"] == pytest.approx(e["reward"], rel=1e-6), (run, step)
            assert v["grad_norm"] == pytest.approx(e["grad_norm"], rel=1e-5) and v["grad_norm"] > 0, (run, step)
        compare(reference, weights(tmp_path / run), f"{run}: 2 processes x 2 images vs 1 x 4")
