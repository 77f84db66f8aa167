"""Peak host memory of loading a VLM at the start of training: finecap's load path against the naive one, at
SmolVLM-256M and Qwen2-VL-2B shapes (random weights, bfloat16 safetensors, built from configs: no download).

    .venv/bin/python benchmarks/load_memory.py [--shapes smolvlm,qwen2vl] [--variants finecap,naive,finecap_fp32]
                                               [--fsdp] [--json OUT]

Checkpoints: each shape is built in bfloat16 with random weights in a child process and saved with
``save_pretrained`` (safetensors) and its processor into a temporary folder, deleted at the end (Qwen2-VL-2B: about
4.4 GB on disk). Shapes: SmolVLM-256M = Idefics3 with a 12-layer 768-wide SigLIP tower at 512 px and a 30-layer
576-wide Llama (9 / 3 heads, 49,152 words), as ``benchmarks/memory.py`` builds it; Qwen2-VL-2B = its config.json's
shapes: a 32-layer 1280-wide vision tower (16 heads, patch 14, merge 2) and a 28-layer 1536-wide Qwen2 (12 / 2 heads,
feed-forward 8,960, 151,936 words, tied head).

Variants, each measured in a fresh child process (the method of ``peak_rss.py``: after the imports the peak resident
set ``VmHWM`` is reset to the current one; the model is loaded, then every weight is read once (:func:`touch`: a
bfloat16 load of bfloat16 safetensors leaves the tensors backed by the memory-mapped file, resident only once read,
as training's first step or a move to the GPU reads them); the figure is the peak minus that baseline, every byte
the load and that read touched: allocated tensors and the checkpoint's mapped pages alike. Also printed: the
resident set afterwards split into allocated (``RssAnon``) and mapped file pages (``RssFile``: shared with the page
cache and with other processes mapping the same file, so a per-process sum overcounts them)):

- ``finecap``: the training path, :func:`finecap.train.setup.build_model` with the process's device (the CPU here)
  and docs/vlm.md's GPU settings (``model.dtype=bfloat16``, ``lora.lm=true``);
- ``finecap_fp32``: the same with ``model.dtype=float32`` (the default: weights upcast as they load);
- ``naive``: ``AutoModelForImageTextToText.from_pretrained(folder, dtype=float32)`` then ``.to(bfloat16)``, the
  load-then-cast of a script that loads in the default dtype.

``--fsdp``: 2 gloo processes (``--fsdp-processes N``: N; a ``torchrun``-style environment) build the ``finecap``
variant as ``finecap train train.strategy=fsdp`` does and shard it
(:func:`finecap.models.sharding.shard_captioner`): ``fsdp_all`` = every process loads the checkpoint, then shards
(finecap before issue 65); ``fsdp_rank0`` = only the main process reads the weights, the others build the model on
the meta device and receive their shards from it (:func:`finecap.train.setup.build_sharded_model`);
``--fsdp-dtypes ,_fp32`` adds both with ``model.dtype=float32`` (``fsdp_all_fp32``, ``fsdp_rank0_fp32``). Printed:
each process's peak and their sum. The main process of ``fsdp_rank0`` holds the whole model and its shard at once
(the full tensors are broadcast after sharding), about (1 + 1/N) models; every other holds about 1/N: the sum is
about 2 models whatever N, against about N models when every process loads.

What is not measured here: a CUDA process. There :func:`finecap.models.memory.loading_onto` loads each tensor
straight onto the GPU (``device_map``), and the host holds at most the memory-mapped pages of the file being read;
on the CPU the weights' home is host memory, so the ``finecap`` row is the weights themselves.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine, machine_line  # noqa: E402  (benchmarks/machine.py)

SHAPES = ("smolvlm", "qwen2vl")
VARIANTS = ("finecap", "naive", "finecap_fp32")
GPU_SETTINGS = ["model.dtype=bfloat16", "lora.lm=true", "lora.rank=16", "lora.alpha=32"]
"""docs/vlm.md's GPU settings that bear on loading (the weights' dtype; the language model frozen under LoRA)."""
GIB = 2**30


# --------------------------------------------------------------------------------------------------------------------
# Checkpoints (each built in a child process, so that the measuring processes start from nothing)
# --------------------------------------------------------------------------------------------------------------------


def qwen2vl_2b() -> tuple[Any, Any]:
    """A random Qwen2-VL-2B-shaped model in bfloat16 and a processor for it: the tiny Qwen2-VL of
    :func:`finecap.models.presets.tiny_vlm` (its tokenizer grown to 151,936 words, its special tokens) with
    Qwen2-VL-2B-Instruct's config.json shapes."""
    import torch
    import transformers as tf

    from finecap.models.presets import tiny_vlm

    tiny, processor = tiny_vlm("qwen2_vl", extra_words=151_936 - 200)
    config = tiny.config
    text = config.text_config
    for key, value in dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
    ).items():
        setattr(text, key, value)  # fmt: skip
    text.rope_parameters = {"rope_type": "default", "mrope_section": [16, 24, 24], "rope_theta": 1_000_000.0}
    if getattr(text, "layer_types", None) is not None:  # one entry per layer
        text.layer_types = [text.layer_types[0]] * text.num_hidden_layers
    config.tie_word_embeddings = True
    vision = config.vision_config
    for key, value in dict(
        depth=32,
        embed_dim=1280,
        hidden_size=1536,
        num_heads=16,
        mlp_ratio=4,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
    ).items():
        setattr(vision, key, value)  # fmt: skip
    processor.image_processor.patch_size = 14
    generation = tiny.generation_config
    del tiny
    model = tf.Qwen2VLForConditionalGeneration._from_config(config, dtype=torch.bfloat16)
    model.generation_config = generation
    return model, processor


def save_shape(shape: str, out: Path) -> None:
    """Build ``shape``'s random model in bfloat16 and save it with its processor into ``out``."""
    import torch

    from finecap.models.presets import tiny_vlm

    torch.manual_seed(0)
    if shape == "smolvlm":
        from rollouts import SMOLVLM_256M

        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            model, processor = tiny_vlm("idefics3", **SMOLVLM_256M)
        finally:
            torch.set_default_dtype(default)
    else:
        model, processor = qwen2vl_2b()
    model.to(torch.bfloat16).save_pretrained(out)
    processor.save_pretrained(out)


def disk_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


# --------------------------------------------------------------------------------------------------------------------
# One measured load (in a child process)
# --------------------------------------------------------------------------------------------------------------------


def import_first_uses() -> None:
    """Import what finecap's load path imports on its first use, before the peak is reset: peft (and bitsandbytes,
    which peft imports when installed; :mod:`finecap.models.peft_import`), which ``lora.lm=true`` reaches inside
    ``build_model``. Imported there, its ~0.09 GiB counted as the load's: since 2ac6f8e0 moved peft's import out of
    finecap's models, the SmolVLM-256M ``finecap`` row read 0.65 GiB for the 0.56 the load itself holds."""
    from finecap.models.peft_import import peft_library

    peft_library()


def measure(variant: str, folder: str) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForImageTextToText

    from finecap.config import load
    from finecap.train.setup import build_model
    from peak_rss import peak_bytes, reset_peak, status_kb

    torch.set_num_threads(2)
    import_first_uses()
    base = reset_peak()
    if variant == "naive":
        model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
        model.to(torch.bfloat16)
    else:
        dtype = "model.dtype=float32" if variant == "finecap_fp32" else "model.dtype=bfloat16"
        cfg = load(None, ["model.kind=vlm", f"vlm.name={folder}", *GPU_SETTINGS, dtype])
        model = build_model(cfg, device="cpu")
    touch(model)
    peak = peak_bytes() - base
    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    return {"peak": peak, "weights": weights, "rss_anon_after": status_kb("RssAnon") * 1024,
            "rss_file_after": status_kb("RssFile") * 1024}  # fmt: skip


def touch(model: Any) -> None:
    """Read every weight once, as training's first forward (or a move to the GPU) does: a tensor transformers left
    backed by the memory-mapped checkpoint (a bfloat16 load of bfloat16 weights) becomes resident then."""
    import torch

    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            t.sum()


def child(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1", **(env or {})})
    if done.returncode != 0:
        raise RuntimeError((done.stderr.strip().splitlines() or ["?"])[-1][:300])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--fsdp", action="store_true", help="also FSDP processes, with and without the rank-0 load")
    parser.add_argument("--fsdp-processes", type=int, default=2, help="processes of the FSDP rows")
    parser.add_argument("--fsdp-dtypes", default="", help="',_fp32': the FSDP rows also with model.dtype=float32")
    parser.add_argument("--json", default=None, help="write the results as JSON")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--save", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rank-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.save:
        shape, out = json.loads(args.save)
        save_shape(shape, Path(out))
        return
    if args.rank_child:
        spec = json.loads(args.rank_child)
        print(json.dumps(measure_fsdp(spec["variant"], spec["folder"])))
        return
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(measure(spec["variant"], spec["folder"])))
        return
    me = [sys.executable, __file__]
    results: dict[str, dict[str, Any]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="finecap-load-memory-"))
    try:
        for shape in args.shapes.split(","):
            folder = tmp / shape
            subprocess.run([*me, "--save", json.dumps([shape, str(folder)])], check=True)
            rows: dict[str, Any] = {"disk": disk_bytes(folder)}
            print(f"{shape}: checkpoint {rows['disk'] / GIB:.2f} GiB (bfloat16 safetensors)", flush=True)
            for variant in args.variants.split(","):
                try:
                    row = child([*me, "--child", json.dumps({"variant": variant, "folder": str(folder)})])
                except RuntimeError as e:
                    print(f"  {variant}: not measured ({e})", flush=True)
                    continue
                rows[variant] = row
                print(f"  {variant:<14} peak {row['peak'] / GIB:6.2f} GiB   weights {row['weights'] / GIB:6.2f} GiB"
                      f"   after: anon {row['rss_anon_after'] / GIB:5.2f} GiB, file {row['rss_file_after'] / GIB:5.2f}"
                      " GiB", flush=True)  # fmt: skip
            if args.fsdp:
                for variant in [f"{v}{d}" for d in args.fsdp_dtypes.split(",") for v in ("fsdp_all", "fsdp_rank0")]:
                    try:
                        ranks = fsdp_group(variant, folder, args.fsdp_processes)
                    except RuntimeError as e:
                        print(f"  {variant}: not measured ({e})", flush=True)
                        continue
                    rows[variant] = {"ranks": ranks, "peak": sum(r["peak"] for r in ranks)}
                    print(f"  {variant:<14} peak sum {rows[variant]['peak'] / GIB:6.2f} GiB  ("
                          + ", ".join(f"rank {i}: {r['peak'] / GIB:.2f}" for i, r in enumerate(ranks))
                          + " GiB)", flush=True)  # fmt: skip
            shutil.rmtree(folder)
            results[shape] = rows
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{machine_line()}")
    print("ratios (peak host memory at start):")
    for shape, rows in results.items():
        parts = []
        pairs = [("finecap", "naive"), ("finecap", "finecap_fp32"), ("fsdp_rank0", "fsdp_all"),
                 ("fsdp_rank0_fp32", "fsdp_all_fp32")]  # fmt: skip
        for a, b in pairs:
            if a in rows and b in rows:
                parts.append(f"{a} / {b} {rows[a]['peak'] / rows[b]['peak']:.2f}")
        print(f"  {shape}: " + "; ".join(parts))
    if args.json:
        Path(args.json).write_text(json.dumps({**results, "machine": machine()}, indent=2))


def fsdp_group(variant: str, folder: Path, processes: int = 2) -> list[dict[str, Any]]:
    """Each process's measurement of ``variant`` in a group of ``processes`` gloo processes on a free loopback
    port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    spec = json.dumps({"variant": variant, "folder": str(folder)})
    procs = []
    for rank in range(processes):
        env = {**os.environ, "TQDM_DISABLE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(processes),
               "OMP_NUM_THREADS": "1"}  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank-child", spec], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=env))  # fmt: skip
    outs = [p.communicate(timeout=1800) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        if p.returncode != 0:
            raise RuntimeError((err.strip().splitlines() or ["?"])[-1][:300])
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


def measure_fsdp(variant: str, folder: str) -> dict[str, Any]:
    """One process of a sharded run's start (``train.strategy=fsdp``, gloo processes), the ``finecap`` variant's
    settings: ``fsdp_rank0`` = :func:`finecap.train.setup.build_sharded_model` (the main process reads, the other
    receives); ``fsdp_all`` = every process loads (:func:`finecap.train.setup.build_model`), then shards, as finecap
    did before; ``..._fp32``: with ``model.dtype=float32``. Then every local shard is read once (:func:`touch`)."""
    import torch
    import torch.distributed as dist

    from finecap.config import load
    from finecap.models import sharding
    from finecap.train.setup import build_model, build_sharded_model
    from peak_rss import peak_bytes, reset_peak, status_kb

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    dtype = ["model.dtype=float32"] if variant.endswith("_fp32") else []
    cfg = load(None, ["model.kind=vlm", f"vlm.name={folder}", *GPU_SETTINGS, *dtype, "train.strategy=fsdp"])
    import_first_uses()
    dist.barrier()
    base = reset_peak()
    if variant.startswith("fsdp_rank0"):
        model, _ = build_sharded_model(cfg, None, "cpu", dist.get_rank() == 0)
    else:
        model = build_model(cfg, None, "cpu")
        sharding.shard_captioner(model, cfg.train.mixed_precision)
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            (t.to_local() if hasattr(t, "to_local") else t).sum()
    peak = peak_bytes() - base
    local = sum((t.to_local() if hasattr(t, "to_local") else t).nbytes for t in model.parameters())
    dist.barrier()
    dist.destroy_process_group()
    return {"peak": peak, "local_weights": local, "rss_anon_after": status_kb("RssAnon") * 1024,
            "rss_file_after": status_kb("RssFile") * 1024}  # fmt: skip


if __name__ == "__main__":
    main()
