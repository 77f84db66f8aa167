"""Per-process memory of parameters, gradients and optimizer state, and the step time, of sharded training (FSDP2,
``train.strategy=fsdp``) against DDP, in 2 CPU processes (gloo), in one run.

    .venv/bin/python benchmarks/fsdp.py [--layers 24 --hidden 1024 --heads 16 --vocab 50257] [--batch 4]
                                        [--tokens 32] [--steps 3] [--json OUT]

The model is a ClipCap of real shape built from configs (no download): by default a GPT-2-medium-shaped language
model (24 layers, width 1024, 50,257 words: 355 M parameters, trained fully in float32) after a 10-token MLP prefix
from 512-d image features (features are given, as the frozen-feature cache gives them). Each strategy runs in its own
``torchrun --nproc-per-node 2`` group: DDP wraps the captioner in ``DistributedDataParallel`` (what accelerate does);
FSDP2 shards it with :func:`finecap.models.sharding.shard_captioner` (each ``GPT2Block`` and the root). Each
process takes ``--steps`` AdamW steps of the teacher-forced loss on random token ids (``--batch`` captions of
``--tokens`` tokens per process).

Measured per process, after the last step: the bytes of the parameters, the gradients and AdamW's state that the
process holds (for a sharded tensor its local shard: ``DTensor.to_local()``), exactly, from the tensors. Not
counted: DDP's communication buckets (with torch's default ``gradient_as_bucket_view=False`` another copy of the
gradients, which would make DDP's figure larger still) and FSDP2's transient all-gather buffers (one layer's full
parameters at a time). And the mean wall time of the steps after the first. Printed: each strategy's figures and
the FSDP2 / DDP ratios (2 processes: about 1/2 is the target for the sharded state). Activations are not counted
(they are the same per process in both strategies).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine, machine_line  # noqa: E402  (benchmarks/machine.py)

STRATEGIES = ("ddp", "fsdp")


def local_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        if t is None:
            continue
        t = t.to_local() if hasattr(t, "to_local") else t
        total += t.numel() * t.element_size()
    return total


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from transformers import GPT2Config, GPT2LMHeadModel

    from finecap.models import sharding
    from finecap.models.clipcap import ClipCap
    from finecap.models.presets import build_world_lm

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    config = GPT2Config(n_layer=args.layers, n_embd=args.hidden, n_head=args.heads, vocab_size=args.vocab,
                        n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    _, tokenizer = build_world_lm(layers=1, hidden=32, heads=2)  # pad / EOS ids only (inside any vocabulary)
    model = ClipCap(GPT2LMHeadModel(config), tokenizer, 512)
    model.train()
    if args.strategy == "fsdp":
        sharding.shard_captioner(model)
        wrapped = model
    else:
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW([p for p in wrapped.parameters() if p.requires_grad], lr=1e-5)
    g = torch.Generator().manual_seed(1 + rank)
    times = []
    for _ in range(args.steps):
        batch = {"features": torch.randn(args.batch, 512, generator=g),
                 "input_ids": torch.randint(0, args.vocab, (args.batch, args.tokens), generator=g)}  # fmt: skip
        t0 = time.perf_counter()
        logits = wrapped(batch)  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch["input_ids"].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # gradients stay allocated, as between steps of a run
        times.append(time.perf_counter() - t0)
    params = list(model.parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.ndim > 0]
    grads = local_bytes(p.grad for p in params)
    result = {
        "parameters": local_bytes(params),
        "gradients": grads,
        "optimizer": local_bytes(state),
        "step_s": sum(times[1:]) / max(1, len(times) - 1),
        "numel": sum(p.numel() for p in params),
    }
    gathered = [None, None]
    dist.all_gather_object(gathered, result)
    if rank == 0:
        Path(args.json_out).write_text(json.dumps(gathered))
    dist.destroy_process_group()


def launch(strategy: str, args: argparse.Namespace, out: Path) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(port), __file__, "--worker", "--strategy", strategy, "--json-out", str(out),
           "--layers", str(args.layers), "--hidden", str(args.hidden), "--heads", str(args.heads),
           "--vocab", str(args.vocab), "--batch", str(args.batch), "--tokens", str(args.tokens),
           "--steps", str(args.steps)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"{strategy}: {proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", choices=STRATEGIES, help=argparse.SUPPRESS)
    parser.add_argument("--json-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for strategy in STRATEGIES:
            results[strategy] = launch(strategy, args, Path(tmp) / f"{strategy}.json")
    mib = 1024**2
    print(f"ClipCap, GPT-2 shape {args.layers} x {args.hidden}, vocab {args.vocab}: "
          f"{results['ddp'][0]['numel'] / 1e6:.0f} M parameters, 2 processes, batch {args.batch} x {args.tokens} "
          "tokens per process")  # fmt: skip
    print(machine_line())
    print("| strategy | rank | parameters MiB | gradients MiB | AdamW state MiB | total MiB | step s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for strategy, ranks in results.items():
        for rank, r in enumerate(ranks):
            total = r["parameters"] + r["gradients"] + r["optimizer"]
            print(f"| {strategy} | {rank} | {r['parameters'] / mib:,.0f} | {r['gradients'] / mib:,.0f} | "
                  f"{r['optimizer'] / mib:,.0f} | {total / mib:,.0f} | {r['step_s']:.2f} |")  # fmt: skip
    state = {s: max(sum(r[k] for k in ("parameters", "gradients", "optimizer")) for r in ranks)
             for s, ranks in results.items()}  # fmt: skip
    print(
        f"FSDP2 / DDP, parameters + gradients + AdamW state per process (largest rank): "
        f"{state['fsdp'] / state['ddp']:.3f}"
    )
    step = {s: max(r["step_s"] for r in ranks) for s, ranks in results.items()}
    print(f"FSDP2 / DDP step time: {step['fsdp'] / step['ddp']:.2f} ({step['fsdp']:.2f} s vs {step['ddp']:.2f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps({**results, "machine": machine()}, indent=2))


if __name__ == "__main__":
    main()
