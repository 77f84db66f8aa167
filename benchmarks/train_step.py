"""Per-step wall time of the training loop for MLE, SCST and SMILE at the demo's settings, per backbone.

    .venv/bin/python benchmarks/train_step.py [--mle-steps 40] [--rl-steps 12] [--backbones clipcap,blip]
        [--json OUT]

Setting: a generated world of ``--n-train`` scenes (64x64 images), a random tiny CLIP as the frozen encoder (the
step's cost does not depend on whether the encoder is trained), the world-tiny GPT-2 (3 layers, width 128, prefix
10) and the demo recipes' batch sizes (MLE 128 captions, SCST 64 images x 5 samples + greedy). The loop runs for real
(``finecap train``'s ``train``), and a callback stamps the time after each optimizer step; the first steps (warm-up of
allocators and caches) and the steps that ran a validation or saved a checkpoint are left out. Printed: median
seconds per step. Wall-clock times on a shared machine vary by 10-20%; compare runs made back to back.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from finecap.config import WorldConfig, load
from finecap.models.presets import save_tiny_clip
from finecap.world.make import make_world

try:  # the training command's loop (finecap >= 0.2 keeps it in the app layer)
    from finecap.app.train import train
except ImportError:  # pragma: no cover - older layout
    from finecap.train.loop import train


def timed_run(cfg, skip: int) -> float:
    stamps: list[float] = []
    train(cfg, callbacks=[lambda state: stamps.append(time.perf_counter())])
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)][skip:]
    return statistics.median(gaps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-train", type=int, default=3000)
    parser.add_argument("--mle-steps", type=int, default=80)
    parser.add_argument("--rl-steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    help_kinds = (
        "comma-separated model.kind values to time (clipcap,blip); blip = the world BLIP decoder "
        "(3 layers, width 128) cross-attending to the tiny CLIP's 17 image tokens"
    )
    parser.add_argument("--backbones", default="clipcap", help=help_kinds)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="finecap-step-"))
    make_world(WorldConfig(n_train=args.n_train, n_val=64, n_test=8, seed=0), out=tmp / "world", progress=False)
    encoder = save_tiny_clip(tmp / "encoder", image_size=64, patch_size=16, hidden=64, layers=2, projection_dim=64)
    common = [f"world.out={tmp / 'world'}", f"model.encoder={encoder}", f"run.cache_dir={tmp / 'cache'}",
              "train.eval_samples=16", "train.log_every=10"]  # fmt: skip
    results = {}
    for kind in args.backbones.split(","):
        extra = [] if kind == "clipcap" else [f"model.kind={kind}", "model.blip=world-tiny"]
        tag = "" if kind == "clipcap" else f"{kind}/"
        run = tmp / kind
        mle = load("demo/mle",
                   [*common, *extra, f"run.dir={run / 'mle'}", f"train.max_steps={args.mle_steps}",
                    f"train.eval_every={args.mle_steps}", "train.validators=[]"])  # fmt: skip
        results[f"{tag}mle"] = timed_run(mle, skip=3)
        for stage, steps in (("scst", args.rl_steps), ("smile", args.mle_steps)):
            cfg = load(f"demo/{stage}",
                       [*common, *extra, f"run.dir={run / stage}",
                        f"train.init_from={run / 'mle' / 'checkpoints' / 'last'}", f"train.max_steps={steps}",
                        f"train.eval_every={steps}", "train.validators=[]", "train.best_metric=loss"])  # fmt: skip
            results[f"{tag}{stage}"] = timed_run(cfg, skip=2)
    for name, seconds in results.items():
        print(f"{name}: {seconds:.3f} s per step (median)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
