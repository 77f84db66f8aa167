"""Per-step wall time of finecap's training engine against a bare PyTorch loop, for MLE and SCST, in one run.

    .venv/bin/python benchmarks/train_step.py [--n-train 3000] [--mle-steps 60] [--rl-steps 12] [--threads 2]
        [--backbones clipcap,blip] [--repeat 2] [--json OUT]

Setting: a generated world of ``--n-train`` scenes (64x64 images), a random tiny CLIP as the frozen encoder (the
step's cost does not depend on whether the encoder is trained), the world-tiny GPT-2 (3 layers, width 128, prefix
10) and the demo recipes' batch sizes (MLE 128 captions; SCST 64 images x 5 samples + greedy).

- **finecap**: ``finecap train``'s ``train`` runs for real (the engine's loop: data loader, step with accelerate,
  logging); a callback stamps the time after each optimizer step; the first steps (warm-up of allocators and
  caches) and the steps that evaluated or saved are left out (evaluation only at the last step).
- **bare**: the same model, data set, collator, batches (the same sampler), AdamW groups, schedule, clipping and
  objective, in a plain loop: collate, forward, backward, clip, ``optimizer.step()``, ``scheduler.step()``; no
  accelerate, no logging.

The two alternate ``--repeat`` times in the same process, so both see the same machine load; printed: the median
seconds per step of each and the ratio finecap / bare (the issue's target: at most 1.05 for MLE, 1.10 for SCST).
Wall-clock times on a shared machine vary by 10-20%; compare the ratio, not the seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from finecap.config import WorldConfig, load
from finecap.contract import TrainContext
from finecap.data.datasets import to_device
from finecap.data.samplers import get_sampler
from finecap.home import run_path
from finecap.models.presets import save_tiny_clip
from finecap.objectives import get_objective
from finecap.train.engine import build_optimizer, make_accelerator, weighted_loss
from finecap.train.run import train
from finecap.train.schedule import build_scheduler
from finecap.train.setup import build_data, build_model, train_unit
from finecap.utils.rng import seed_everything
from finecap.world.make import make_world

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine, machine_line  # noqa: E402  (benchmarks/machine.py)


def finecap_step(cfg, skip: int) -> float:
    stamps: list[float] = []
    train(cfg, callbacks=[lambda state: stamps.append(time.perf_counter())])
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)][skip:-1]  # the last step evaluates
    return statistics.median(gaps)


def bare_step(cfg, steps: int, skip: int) -> float:
    """The same work in a plain PyTorch loop (see the module docstring)."""
    accelerator = make_accelerator(cfg.train)  # only to hand the objective a device; never wraps anything here
    seed_everything(cfg.run.seed)
    model = build_model(cfg)
    objective = get_objective(cfg.train.objective, cfg)
    data = build_data(cfg, model, accelerator, per_caption=train_unit(cfg, objective) == "caption")
    optimizer = build_optimizer(model, cfg.train)
    scheduler = build_scheduler(optimizer, warmup=cfg.train.warmup_steps, total=steps, kind=cfg.train.schedule)
    objective.setup(TrainContext(cfg, accelerator, data.train_records, model.tokenizer, run_path(cfg.run)))
    sampler = get_sampler(cfg, data.train, cfg.train.batch_size)
    batches = sampler.batches(0)
    params = [p for p in model.parameters() if p.requires_grad]
    seed_everything(cfg.run.seed)
    model.train()
    stamps = [time.perf_counter()]
    for indices in batches[:steps]:
        batch = to_device(data.collator([data.train[i] for i in indices]), "cpu")
        optimizer.zero_grad(set_to_none=True)
        out = objective(model, batch)
        weighted_loss(out.losses, cfg.train.loss_weights).backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.train.grad_clip)
        optimizer.step()
        scheduler.step()
        stamps.append(time.perf_counter())
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)][skip:]
    return statistics.median(gaps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-train", type=int, default=3000)
    parser.add_argument("--mle-steps", type=int, default=60)
    parser.add_argument("--rl-steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--backbones", default="clipcap", help="comma-separated model.kind values (clipcap,blip)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="finecap-step-"))
    make_world(WorldConfig(n_train=args.n_train, n_val=64, n_test=8, seed=0), out=tmp / "world", progress=False)
    encoder = save_tiny_clip(tmp / "encoder", image_size=64, patch_size=16, hidden=64, layers=2, projection_dim=64)
    common = [f"world.out={tmp / 'world'}", f"world.n_train={args.n_train}", "world.n_val=64", "world.n_test=8",
              f"model.encoder={encoder}", f"run.cache_dir={tmp / 'cache'}",
              "train.eval_samples=16", "train.log_every=10", "train.validators=[]", "train.best_metric=loss",
              "train.log_captions=0"]  # fmt: skip
    results: dict[str, float] = {}
    for kind in args.backbones.split(","):
        extra = [] if kind == "clipcap" else [f"model.kind={kind}", "blip.name=world-tiny"]
        tag = "" if kind == "clipcap" else f"{kind}/"
        start = tmp / kind / "start"
        # the MLE checkpoint SCST starts from
        train(load("demo/mle", [*common, *extra, f"run.dir={start}", "train.max_steps=2", "train.eval_every=2"]))
        for stage, steps, skip in (("mle", args.mle_steps, 3), ("scst", args.rl_steps, 2)):
            init = [] if stage == "mle" else [f"train.init_from={start / 'checkpoints' / 'last'}"]
            times: dict[str, list[float]] = {"finecap": [], "bare": []}
            for r in range(args.repeat):
                cfg = load(f"demo/{stage}", [*common, *extra, *init, f"run.dir={tmp / kind / f'{stage}{r}'}",
                                             f"train.max_steps={steps}", f"train.eval_every={steps}"])  # fmt: skip
                times["finecap"].append(finecap_step(cfg, skip))
                times["bare"].append(bare_step(cfg, steps, skip))
            for side, values in times.items():
                results[f"{tag}{stage}/{side}"] = statistics.median(values)
            results[f"{tag}{stage}/ratio"] = results[f"{tag}{stage}/finecap"] / results[f"{tag}{stage}/bare"]
    print(machine_line())
    for name, value in results.items():
        unit = "" if name.endswith("ratio") else " s per step (median)"
        print(f"{name}: {value:.3f}{unit}")
    if args.json:
        Path(args.json).write_text(json.dumps({**results, "machine": machine()}, indent=2) + "\n")


if __name__ == "__main__":
    main()
