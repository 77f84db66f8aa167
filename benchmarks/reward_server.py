"""Rewards per second of the reward server (``finecap serve-reward``) against the same reward called in process.

    nice -n 10 python benchmarks/reward_server.py [--n-train 1000] [--requests 120] [--json results.json]

Setup: a world of ``--n-train`` training scenes (32 px, made once under ``--root``) and a tiny random CLIP as the
retriever (a real CLIP makes self-retrieval's text encoder dearer, not the server's share of the time). Two rewards,
each loaded as ``finecap serve-reward`` loads it (:func:`finecap.app.serve_reward.build_service`: the training loop's
reward and setup): CIDEr-D (``rl.rewards={cider: 1.0}``) and self-retrieval (``{retrieval: 1.0}``, distractors the
request's other images). Requests of ``--captions`` (512) captions of random training images: a reference of the
image, another image's reference, or a reference's words reshuffled, so that no two requests repeat.

- **in process**: ``reward(captions, call_batch(image_ids))``, one request after another: rewards per second, and
  the p50 / p99 time of a call.
- **server**: ``finecap serve-reward`` in a process of its own (``python -m finecap.app.cli``, port 0), asked by 1, 8
  and 32 concurrent clients (asyncio tasks over one httpx client in this process; the bodies are encoded before the
  clock starts, the answers are parsed and checked against the in-process values): rewards per second, the p50 / p99
  latency of a request, and the throughput's ratio to in process.

The goal (issue 53) for CIDEr-D: the server at least half the in-process throughput and at least 20,000 rewards/s.
The clients share the machine's cores with the server (2 on the reference machine), as a trainer on the same host
would; the machine's load average is printed with the table, since other processes may have shared it too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import torch

from finecap.app.serve_reward import build_service
from finecap.config import WorldConfig, load
from finecap.data.datasets import load_records
from finecap.models.presets import save_tiny_clip
from finecap.report.table import markdown_table
from finecap.rewards import call_batch
from finecap.world.make import make_world

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine, machine_line  # noqa: E402  (benchmarks/machine.py)

REWARDS = {"CIDEr-D": "{cider: 1.0}", "SR": "{retrieval: 1.0}"}
CLIENTS = (1, 8, 32)


def setup(root: Path, n_train: int) -> list[str]:
    """The world and the CLIP under ``root`` (made once): the overrides that serve them."""
    world = WorldConfig(n_train=n_train, n_val=8, n_test=8, image_size=32, seed=0)
    if not (root / "world").exists():
        make_world(world, out=root / "world", progress=False)
    clip = root / "clip"
    if not clip.exists():
        save_tiny_clip(clip, image_size=32, patch_size=16)
    return [f"world.out={root / 'world'}", f"world.n_train={n_train}", "world.n_val=8", "world.n_test=8",
            "world.image_size=32", f"retriever.checkpoint={clip}", f"run.cache_dir={root / 'cache'}",
            f"run.dir={root / 'run'}"]  # fmt: skip


def make_requests(records: list, n_requests: int, size: int, seed: int = 0) -> list[tuple[list[str], list]]:
    """``n_requests`` requests of ``size`` captions with their images (module docstring)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n_requests):
        captions, ids = [], []
        for k in range(size):
            record = records[rng.randrange(len(records))]
            text = rng.choice(record.captions if k % 3 != 1 else records[rng.randrange(len(records))].captions)
            if k % 3 == 2:
                words = text.split()
                rng.shuffle(words)
                text = " ".join(words)
            captions.append(text)
            ids.append(record.image_id)
        out.append((captions, ids))
    return out


def in_process(reward, requests) -> tuple[dict[str, float], list[list[float]]]:
    for captions, ids in requests[:3]:  # warm-up
        reward(captions, call_batch(ids))
    times, values = [], []
    start = time.perf_counter()
    for captions, ids in requests:
        t = time.perf_counter()
        values.append(reward(captions, call_batch(ids)).total.tolist())
        times.append(time.perf_counter() - t)
    wall = time.perf_counter() - start
    return {"wall": wall, "p50_ms": 1000 * np.percentile(times, 50), "p99_ms": 1000 * np.percentile(times, 99)}, values


def median_run(runs: list[dict[str, float]], n_rewards: int) -> dict[str, float]:
    """The run of median wall time among repetitions, as rewards per second and its latencies."""
    run = sorted(runs, key=lambda r: r["wall"])[len(runs) // 2]
    return {"rewards_per_s": n_rewards / run["wall"], "p50_ms": run["p50_ms"], "p99_ms": run["p99_ms"]}


async def ask(url: str, bodies: list[bytes], expected: list[list[float]], clients: int) -> dict[str, float]:
    """``clients`` concurrent clients sending ``bodies`` (each once) to ``url``; every answer checked."""
    queue = list(range(len(bodies)))
    latencies: list[float] = []
    wrong: list[int] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        for body in bodies[:2]:  # warm-up: connections, the server's first calls
            await http.post(url, content=body, headers={"content-type": "application/json"})

        async def client() -> None:
            while queue:
                i = queue.pop()
                t = time.perf_counter()
                response = await http.post(url, content=bodies[i], headers={"content-type": "application/json"})
                latencies.append(time.perf_counter() - t)
                if response.status_code != 200 or response.json()["total"] != expected[i]:
                    wrong.append(i)

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        wall = time.perf_counter() - start
    if wrong:
        raise SystemExit(f"{len(wrong)} answers differ from the in-process values (request {wrong[0]})")
    return {"wall": wall, "p50_ms": 1000 * np.percentile(latencies, 50), "p99_ms": 1000 * np.percentile(latencies, 99)}


def serve(overrides: list[str], rewards: str, threads: int) -> tuple[subprocess.Popen, str]:
    argv = [sys.executable, "-m", "finecap.app.cli", "serve-reward", *overrides, f"rl.rewards={rewards}", "--port",
            "0", "--log-every", "0", "-q"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}  # torch's intra-op threads, as in process
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    if " on http://" not in line:
        proc.kill()
        raise SystemExit(f"finecap serve-reward did not start: {line!r}")
    return proc, line.split(" on ")[1].split()[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", default="runs/bench_reward_server", help="folder of the world and the CLIP")
    p.add_argument("--n-train", dest="n_train", type=int, default=1000, help="training scenes of the world")
    p.add_argument("--requests", type=int, default=120, help="requests per measurement")
    p.add_argument("--captions", type=int, default=512, help="captions per request")
    p.add_argument("--rewards", default=",".join(REWARDS), help=f"comma-separated, of {', '.join(REWARDS)}")
    p.add_argument("--repeat", type=int, default=3, help="repetitions of each row (the median is shown)")
    p.add_argument("--threads", type=int, default=1, help="torch's threads, in process and in the server (on 2 "
                   "cores shared with the clients, 2 threads only wait on each other)")  # fmt: skip
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = p.parse_args()
    overrides = setup(Path(args.root).resolve(), args.n_train)
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    rows = []
    for name in args.rewards.split(","):
        cfg = load(None, [*overrides, f"rl.rewards={REWARDS[name]}"])
        requests = make_requests(load_records(cfg, "train"), args.requests, args.captions)
        n_rewards = sum(len(c) for c, _ in requests)
        reward = build_service(cfg, log_every=0).reward
        runs = [in_process(reward, requests) for _ in range(args.repeat)]
        expected = runs[0][1]
        local = median_run([r for r, _ in runs], n_rewards)
        rows.append({"reward": name, "front end": "in process", "clients": 1, **local, "ratio": 1.0})
        bodies = [json.dumps({"captions": c, "image_ids": i}).encode() for c, i in requests]
        proc, url = serve(overrides, REWARDS[name], args.threads)
        try:
            for clients in CLIENTS:
                got = median_run([asyncio.run(ask(f"{url}/reward", bodies, expected, clients))
                                  for _ in range(args.repeat)], n_rewards)  # fmt: skip
                rows.append({"reward": name, "front end": "server", "clients": clients, **got,
                             "ratio": got["rewards_per_s"] / local["rewards_per_s"]})  # fmt: skip
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    table = {}
    for r in rows:
        name = f"{r['reward']}, {r['front end']}" + (f", {r['clients']} clients" if r["front end"] == "server" else "")
        table[name] = {"rewards/s": f"{r['rewards_per_s']:,.0f}", "p50 ms": f"{r['p50_ms']:.1f}",
                       "p99 ms": f"{r['p99_ms']:.1f}", "vs in process": f"{r['ratio']:.2f}x"}  # fmt: skip
    print(markdown_table(table, row_header="reward, front end"))
    print(f"\n{args.requests} requests of {args.captions} captions per row, the median of {args.repeat} runs; world "
          f"of {args.n_train} training images; torch threads {args.threads}; {machine_line()}; load average "
          f"{load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after; {time.strftime('%Y-%m-%d')}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "machine": machine(), "args": vars(args)}, indent=2))


if __name__ == "__main__":
    main()
