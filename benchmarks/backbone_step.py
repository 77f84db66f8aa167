"""Per-step time of the world ClipCap and the world BLIP under the same objective, interleaved in one process.

    .venv/bin/python benchmarks/backbone_step.py [--batch 128] [--steps 20] [--threads 2] [--json OUT]
        [section.key=value ...]   (e.g. run.cache_dir=runs/cache to reuse the trained world encoder)

Both captioners are built as the demo builds them (``demo/mle`` with ``model.kind=clipcap`` / ``blip``: GPT-2 3 x 128
with a prefix of 10 from the world encoder's feature, or the BLIP text decoder 3 x 128 cross-attending to the world
encoder's 5 image tokens); the batch is ``--batch`` random captions of 12 words + EOS with random frozen features /
image tokens of the right shapes (the vision side is frozen and cached in the demo, so it costs nothing per step).
One optimizer step (objective forward, backward, AdamW) of each backbone alternates with the other's, so both see
the same machine load; printed: the median seconds per step and the BLIP / ClipCap ratio, for MLE and SMILE.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from finecap.config import load
from finecap.data.targets import IGNORE_INDEX
from finecap.objectives import get_objective
from finecap.train.engine import build_optimizer
from finecap.train.setup import build_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine, machine_line  # noqa: E402  (benchmarks/machine.py)


def batch_for(model, n: int, generator: torch.Generator) -> dict:
    vocab = len(model.tokenizer)
    ids = torch.randint(5, vocab, (n, 13), generator=generator)
    ids[:, -1] = model.eos_token_id
    mask = torch.ones_like(ids)
    if hasattr(model, "world") and model.world is not None:
        features = torch.randn(n, 5, 256, generator=generator)  # (B, P, H) world BLIP image tokens
    else:
        features = torch.randn(n, model.feature_dim, generator=generator)  # (B, D)
    labels = ids.masked_fill(mask == 0, IGNORE_INDEX)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels, "features": features,
            "image_ids": list(range(n))}  # fmt: skip


def main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = {}
    for objective in ("mle", "smile"):
        setups = {}
        for kind in ("clipcap", "blip"):
            cfg = load("demo/mle", [*args.overrides, f"model.kind={kind}", f"train.objective={objective}"])
            model = build_model(cfg).train()
            setups[kind] = (model, get_objective(objective, cfg), build_optimizer(model, cfg.train),
                            batch_for(model, args.batch, torch.Generator().manual_seed(0)))  # fmt: skip
        times: dict[str, list[float]] = {k: [] for k in setups}
        for _ in range(args.steps):
            for kind, (model, obj, opt, batch) in setups.items():
                start = time.perf_counter()
                opt.zero_grad()
                out = obj(model, batch)
                sum(out.losses.values()).backward()
                opt.step()
                times[kind].append(time.perf_counter() - start)
        for kind, ts in times.items():
            results[f"{kind}/{objective}"] = statistics.median(ts[2:])
        results[f"ratio/{objective}"] = results[f"blip/{objective}"] / results[f"clipcap/{objective}"]
    print(machine_line())
    for key, value in results.items():
        unit = "" if key.startswith("ratio") else " s per step (median)"
        print(f"{key}: {value:.3f}{unit}")
    if args.json:
        args.json.write_text(json.dumps({**results, "machine": machine()}, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
