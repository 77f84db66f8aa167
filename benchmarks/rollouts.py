"""Rollout throughput of the three generation engines in one run: finecap's decoder, ``transformers.generate`` and
vLLM (``decode.engine=vllm``), on a VLM of SmolVLM-256M's shapes.

    .venv-vllm/bin/python benchmarks/rollouts.py [--images 4] [--samples 5] [--max-length 24] [--repeat 3]
                                                 [--threads 1] [--json OUT]

It runs in the vLLM venv (``make vllm``); without vLLM it times the first two and says why the third is missing.

The model: an Idefics3 (SmolVLM's architecture) of SmolVLM-256M-Instruct's shapes built from a config with random
weights (:func:`finecap.models.presets.tiny_vlm`, as ``benchmarks/memory.py`` builds it: a 30-layer x 576 Llama with 9
heads / 3 KV heads and a 49,152-token vocabulary, a 12-layer x 768 SigLIP-shaped vision tower on 512 px images, 64
image tokens), float32. A rollout is what an RL step decodes: ``--samples`` captions per image (SCST's 5) sampled at
temperature 1 up to ``--max-length`` tokens (random weights seldom stop early: nearly every caption has the full
length; the tokens counted are the ones generated), from the PIL images to the token ids:

- ``finecap``: the processor, then ``Vlm.generate`` (:mod:`finecap.decode`: per-image seeds, the tokens'
  log-probs returned);
- ``generate``: the processor, then ``Idefics3ForConditionalGeneration.generate(do_sample=True,
  num_return_sequences=S, top_k=0)`` (no log-probs asked);
- ``vllm``: :class:`finecap.engines.vllm.VllmEngine` (``LLM.generate`` with ``n=S``, per-image seeds, the tokens'
  log-probs returned): its processor runs inside. The engine's start (saving the model as a folder, loading it,
  sizing a 1 GiB KV cache) and its first call (vLLM's warm-up) are timed apart and not in the rates.

The three alternate ``--repeat`` times in one process (the same machine load for each); printed: images/s and
generated tokens/s of each (best and median of the repeats) and each one's ratio to finecap's. All run with
``--threads`` torch threads (vLLM's CPU backend sets its own to the same number).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from PIL import Image

from finecap.config import DecodeConfig, VllmConfig
from finecap.models.presets import tiny_vlm
from finecap.models.vlm import Vlm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine, machine_line  # noqa: E402  (benchmarks/machine.py)

SMOLVLM_256M = dict(image_size=512, hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536, positions=8192,
                    patch=16, scale=4, extra_words=49_152 - 200,
                    vision={"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                            "num_attention_heads": 12})  # fmt: skip
"""SmolVLM-256M-Instruct's shapes (its config.json), as benchmarks/memory.py builds them."""


def build(root: Path) -> Vlm:
    torch.manual_seed(0)
    model, processor = tiny_vlm("idefics3", **SMOLVLM_256M)
    model.save_pretrained(root / "smolvlm")
    processor.save_pretrained(root / "smolvlm")
    return Vlm.from_pretrained(root / "smolvlm").eval()


def timed(fn: Callable[[], int]) -> tuple[float, int]:
    """``(seconds, tokens generated)`` of one call of ``fn`` (which returns the tokens it generated)."""
    start = time.perf_counter()
    tokens = fn()
    return time.perf_counter() - start, tokens


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=4)
    p.add_argument("--samples", type=int, default=5)
    p.add_argument("--max-length", type=int, default=24)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))  # vLLM's CPU backend sizes its threads from it
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    torch.set_num_threads(args.threads)

    tmp = Path(tempfile.mkdtemp(prefix="rollouts-"))
    captioner = build(tmp)
    g = torch.Generator().manual_seed(0)
    images = [Image.fromarray((torch.rand(512, 512, 3, generator=g) * 255).byte().numpy())
              for _ in range(args.images)]  # fmt: skip
    seeds = torch.arange(args.images)
    cfg = DecodeConfig(strategy="sample", num_return_sequences=args.samples, max_length=args.max_length,
                       batch_size=args.images * args.samples)  # fmt: skip

    def finecap() -> int:
        with torch.no_grad():
            return int(captioner.generate(captioner.encoder.preprocess(images), cfg, seeds=seeds).lengths.sum())

    def generate() -> int:
        enc = captioner.processor(text=[captioner.prompt_text] * len(images), images=[[im] for im in images],
                                  padding=True, return_tensors="pt")  # fmt: skip
        with torch.no_grad():
            out = captioner.model.generate(**enc, do_sample=True, num_return_sequences=args.samples, top_k=0,
                                           top_p=1.0, temperature=1.0, max_new_tokens=args.max_length,
                                           pad_token_id=captioner.tokenizer.pad_token_id)  # fmt: skip
        new = out[:, enc["input_ids"].shape[1] :]  # (B*S, T): stop at EOS as finecap counts (EOS included)
        eos = (new == captioner.tokenizer.eos_token_id).int()
        ended = eos.cumsum(1) - eos > 0  # positions after the first EOS
        return int((~ended).sum())

    engines: dict[str, Callable[[], int]] = {"finecap": finecap, "generate": generate}
    start: dict[str, float] = {}
    missing = None
    try:
        from finecap.engines.vllm import VllmEngine, import_vllm

        import_vllm()
    except ImportError as e:
        missing = str(e)
    if missing is None:
        t0 = time.perf_counter()
        engine = VllmEngine.from_captioner(captioner, VllmConfig(max_model_len=256, kv_cache_memory_bytes=2**30))
        start["engine start"] = time.perf_counter() - t0

        def vllm() -> int:
            return int(engine.generate_images(images, cfg, seeds=seeds).lengths.sum())

        start["first call"], _ = timed(vllm)
        engines["vllm"] = vllm
    else:
        print(f"vllm: not timed ({missing})")

    for name in ("finecap", "generate"):  # their first calls (allocator, kernels) are not timed either
        engines[name]()
    runs: dict[str, list[tuple[float, int]]] = {name: [] for name in engines}
    for _ in range(args.repeat):
        for name, fn in engines.items():
            runs[name].append(timed(fn))

    width = args.images * args.samples
    print(machine_line())
    print(f"rollouts: {args.images} images x {args.samples} samples x <= {args.max_length} tokens, SmolVLM-256M "
          f"shapes (random weights, float32), {args.threads} thread(s), best / median of {args.repeat}")  # fmt: skip
    results: dict[str, dict[str, float]] = {}
    for name, rs in runs.items():
        best = min(s for s, _ in rs)
        median = statistics.median(s for s, _ in rs)
        tokens = statistics.median(t for _, t in rs)
        results[name] = {"seconds": best, "median_seconds": median, "images_per_s": args.images / best,
                         "tokens_per_s": tokens / best, "tokens": tokens, "sequences": width}  # fmt: skip
    base = results["finecap"]["seconds"]
    for name, r in results.items():
        print(f"  {name:9s} {r['images_per_s']:6.2f} images/s  {r['tokens_per_s']:7.1f} tokens/s  "
              f"({r['seconds']:.2f} s best, {r['median_seconds']:.2f} s median, {r['tokens']:.0f} tokens)  "
              f"x{base / r['seconds']:.2f} finecap's speed")  # fmt: skip
    for what, seconds in start.items():
        print(f"  vllm {what}: {seconds:.2f} s (not in the rates)")
    out = {"machine": machine(), "settings": vars(args), "results": results, "vllm_costs": start,
           "vllm_missing": missing}  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
