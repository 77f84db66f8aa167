# Device command (one H100 or H200; timeout_s=560, the ignored .whl/ folder carried along; without make, the same
# through bash benchmarks/gpu_check.sh --budget 480): benchmarks/gpu_check.sh installs the wheels, runs this script and
# leaves gpu_check.json, gpu_check.log, nvidia-smi.txt and gpu_check_logs.tgz under $OUT (8 files come back at most):
#   make gpu-check GPU_CHECK_ARGS="--budget 480"
"""finecap's CUDA paths, checked on one GPU in a few minutes with no download: every model is built from transformers'
config classes with random weights, as finecap's own tests build theirs.

    make gpu-check [PYTHON=python3] [OUT=dir]            # or:
    PYTHONPATH=src python3 benchmarks/gpu_check.py [--out-dir DIR] [--out gpu_check.json] [--budget 480]
    PYTHONPATH=src python3 benchmarks/gpu_check.py --cpu-smoke --out-dir DIR   # the same plumbing on the CPU

``--cpu-smoke`` costs 40 to 65 CPU seconds; on the 2-core development machine (AMD EPYC, 2026-11-29, shared) it took
39 s of wall time at load 2.5 and 163 s at load 7.5: under a minute only on a machine that is not busy.

Checks (docs/scaling.md, "The GPU check", says what each line of the table means); they run in the order
``env``, ``setup``, ``qlora``, ``fsdp2``, ``grpo``, ``family:*``, ``memory:*``, ``grpo_vllm``, ``trl``
(:func:`checks`), so that a budget that runs short leaves measurements undone rather than correctness checks:

- ``env``: python, torch, transformers, peft, accelerate and bitsandbytes versions, the GPU's name, memory and compute
  capability, and whether ``flash_attn``, ``bitsandbytes`` and ``vllm`` import (the error when not).
- ``setup``: the random checkpoints and data the others read: a tiny instance of every VLM family of
  :data:`finecap.models.vlm.FAMILIES` (:func:`finecap.models.tiny.save_family`: 2 language-model and 2 vision layers,
  weights redrawn from N(0, 0.2) so the image matters), an Idefics3 of SmolVLM-256M-Instruct's shapes
  (``benchmarks/rollouts.py``'s, with SmolVLM's image splitting: 2048 px longest edge in 512 px crops), a tiny CLIP
  retriever and a COCO-like Karpathy JSON of random 640x480 JPEGs.
- ``family:<model_type>``: the tiny model in float32 and bfloat16 on the GPU with ``sdpa`` (and ``flash_attention_2``
  in bfloat16 when flash-attn imports): finecap's prompt pass (:meth:`Vlm.start`) against the model's own forward
  (largest absolute and relative difference of the first-token logits), finecap's greedy captions against
  ``model.generate``'s tokens, and one MLE step with LoRA on the language model, gradient checkpointing and bfloat16
  autocast over bfloat16 frozen weights (loss and every gradient finite, some gradient non-zero, adapters moved).
- ``qlora``: ``model.quantization=4bit`` (bitsandbytes) on the tiny Idefics3, one MLE step through LoRA.
- ``fsdp2``: one process (world size 1) in a NCCL group on a free 127.0.0.1 port: finecap's FSDP2 sharding
  (:func:`finecap.models.sharding.shard_captioner`, what ``train.strategy=fsdp`` applies with several processes,
  bf16 mixed precision), two MLE steps, greedy captions inside :func:`~finecap.models.sharding.decoding`, the full
  model and optimizer state gathered.
- ``grpo``: ``finecap train coco/grpo_cider_vlm`` (GRPO, CIDEr-D, 16 images x 8 samples, LoRA, checkpointing,
  bf16) for 6 steps on the SmolVLM-256M-shaped model and the random images with finecap's decoder, on references the
  random model can partly match (:func:`signal_references`): seconds per step (median of steps 2-5; step 6 also
  validates and saves), sampled captions per second, peak CUDA memory, the losses and the run's logged learning
  signal per step (:data:`SIGNAL_KEYS`); ``fail`` when a loss or gradient norm is not finite, no step had a finite,
  non-zero gradient norm, or every group's rewards were equal in every step (:func:`learning_signal`).
- ``grpo_vllm``: the same training for 5 steps with its rollouts on a colocated vLLM engine (``decode.engine=vllm``)
  that sleeps between rollouts (``vllm.enable_sleep_mode=true``, vLLM's sleep level 1): seconds per step (median of
  steps 2-4), captions per second, and the device's memory in use (``mem_get_info``; torch's ``memory_allocated``
  and vLLM's mapped sleep-mode pool beside it) as each rollout's engine goes to sleep, after it, and after each
  step's backward pass: the memory sleep frees. Skipped where ``vllm`` does not import; on the CPU (``--cpu-smoke``
  in ``.venv-vllm``) the option is off and vLLM's refusal to sleep there is recorded.
- ``trl``: ``benchmarks/grpo_vs_trl.py`` on the GPU (``--device cuda``): finecap's GRPO step against TRL's
  ``GRPOTrainer`` on SmolVLM-256M's shapes (4 images x 8 samples of at most 16 tokens, float32, no LoRA, 3 steps each,
  one round): seconds per step of each and finecap's captions per second over TRL's; skipped where TRL is missing.
- ``memory:<recipe>``: ``finecap train coco/<recipe> --dry-run`` for each ``coco/*_vlm`` recipe at its own batch on
  the SmolVLM-256M-shaped model: the forecast it prints (weights, gradients, optimizer state, and the activations
  forecast from the model's shapes) against the CUDA peak of its one real step, their ratio
  ``forecast_over_measured``; ``fail`` when the forecast with activations is under 0.75 of the peak (the quarter the
  CPU test holds it to: :func:`judge_forecast`); a step that does not fit the card is recorded as ``oom``.

Each check runs in a forked process of its own (its own CUDA context and peak counter; a crash, a hang or a device
assert ends only that check) under its own time cap and the run's ``--budget``; a failure is recorded with its
one-line error and the tail of its traceback, and the next check runs. The JSON is first written before anything
slow (``status`` ``started``, with the ``machine`` facts that need no CUDA work: :func:`machine`), then rewritten
once finecap is imported (``running``) and after every check, and last with ``status`` ``done``, so a run killed from
outside still leaves what it measured (and, killed in its first minute, where it ran). ``--cpu-smoke`` runs
everything at the tiniest sizes on the CPU: bfloat16 on the CPU, FSDP2 over gloo, 4-bit layers on the CPU where
bitsandbytes imports; what needs CUDA and has no stand-in says ``skipped: no CUDA``. Exit status 1 when a check
failed, erred or timed out (``oom`` of a ``memory:*`` line is a finding about a recipe, not a failure of the check;
anywhere else an out-of-memory error is an ``error``); checks the budget left undone are named in a last line.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VLM_RECIPES = ("mle_vlm", "smile_vlm", "discritune_vlm", "sr_l_vlm", "sr_lv_bagcurri_vlm", "grpo_cider_vlm",
               "grpo_sr_cider_vlm")  # fmt: skip
"""The ``coco/*_vlm`` recipes whose dry-run forecast ``memory:<recipe>`` measures."""
FAILED = ("fail", "error", "timeout")
"""Statuses that make the run exit 1."""
BUDGET = "budget"
"""The ``reason`` of a check skipped because what was left of ``--budget`` was below its cap."""
OOM_TEXTS = ("CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED", "CUDA out of memory")
"""What a library's allocation failure on a full card says when it is not torch's ``OutOfMemoryError`` (cuBLAS and
cuDNN creating their workspaces raise a ``RuntimeError``)."""


def out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` says the device's memory ran out (:data:`OOM_TEXTS`)."""
    return type(e).__name__ == "OutOfMemoryError" or (
        isinstance(e, RuntimeError) and any(text in str(e) for text in OOM_TEXTS)
    )


GIB = 1024**3
WORDS = ("a", "red", "blue", "green", "small", "big", "circle", "square", "star", "on", "the", "left", "right", "two")
TOL_REL = {"float32": 1e-4, "bfloat16": 3e-2}
"""Largest first-token logit difference relative to the largest logit magnitude that passes, per weight dtype
(float32: arithmetic in another order; bfloat16: 8 mantissa bits, two layers)."""


@dataclass
class Ctx:
    """What a check knows: the device, the smoke mode, the work folder (models and data of ``setup``)."""

    smoke: bool
    work: Path
    cuda: bool = False
    device: Any = None
    sizes: dict[str, Any] = field(default_factory=dict)
    argv: list[str] | None = None  # --spawn: the arguments of each check's fresh process


class Skip(Exception):
    """A check that cannot run here (its reason is the status's text)."""


# --------------------------------------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------------------------------------


def strict_json(obj: Any) -> str:
    """``obj`` as strict JSON (indent 1): a float that is no number (a loss or a timing of a check that failed) is
    ``null``, never Python's ``NaN`` or ``Infinity``, which ``jq`` and strict parsers refuse (the rule of
    :func:`finecap.utils.files.strict_json`, not imported: the JSON is written where finecap does not import too); any
    other object as its ``str``."""
    loose = json.loads(json.dumps(obj, default=str), parse_constant=lambda _: None)  # NaN, Infinity -> None
    return json.dumps(loose, indent=1, allow_nan=False)


def write_report(path: Path, report: dict) -> None:
    """``report`` as :func:`strict_json` to ``path``, atomically (a command cut off mid-write leaves the last one)."""
    part = path.with_name(f".{path.name}.part")
    part.write_text(strict_json(report) + "\n")
    os.replace(part, path)


def one_line(e: BaseException) -> str:
    """The error's type and message on one line (at most 400 characters)."""
    return " ".join(f"{type(e).__name__}: {e}".split())[:400]


def sync(ctx: Ctx) -> None:
    if ctx.cuda:
        import torch

        torch.cuda.synchronize()


def peak_bytes(ctx: Ctx) -> int | None:
    if not ctx.cuda:
        return None
    import torch

    return int(torch.cuda.max_memory_allocated())


def images(n: int, width: int, height: int, seed: int = 0) -> list:
    """Random RGB images, every second one 8 px wider (prompts of different lengths in Qwen2-VL)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (height, width + 8 * (i % 2), 3), dtype=np.uint8)) for i in range(n)]


def captions(n: int, seed: int = 0) -> list[str]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(4, 9)))) for _ in range(n)]


def training_batch(model: Any, n: int, ctx: Ctx) -> dict:
    """finecap's collated training batch for ``model``: ``n`` random captions, one random image each."""
    from finecap.data.datasets import model_collator, to_device

    size = ctx.sizes["family_image"]
    items = [{"caption": c, "image": im, "image_id": i, "references": [c], "index": i}
             for i, (c, im) in enumerate(zip(captions(n), images(n, size, size), strict=True))]  # fmt: skip
    return to_device(model_collator(model, 12)(items), ctx.device)


def load_cfg(recipe: str | None, overrides: list[str]) -> Any:
    from finecap.config import load

    return load(recipe, overrides)


def any_family(ctx: Ctx) -> Path:
    """The tiny Idefics3 (SmolVLM's family), else the first other family setup built."""
    for family in ("idefics3", "llava", "qwen2_vl"):
        if (ctx.work / "families" / family / "config.json").exists():
            return ctx.work / "families" / family
    raise Skip("skipped: setup built no tiny VLM")


def family_dir(ctx: Ctx, family: str) -> Path:
    folder = ctx.work / "families" / family
    if not (folder / "config.json").exists():
        errors = ctx.work / "families" / "setup_errors.json"
        why = json.loads(errors.read_text()).get(family, "not tried") if errors.exists() else "not tried"
        raise Skip(f"skipped: setup did not build the tiny {family} ({why})")
    from finecap.models.tiny import LOAD_NEEDS

    need = LOAD_NEEDS.get(family)
    if need and importlib.util.find_spec(need) is None:
        raise Skip(f"skipped: the tiny {family}'s processor loads back only with {need} installed "
                   f"(finecap.models.tiny.LOAD_NEEDS)")  # fmt: skip
    return folder


# --------------------------------------------------------------------------------------------------------------------
# env, setup
# --------------------------------------------------------------------------------------------------------------------


def check_env(ctx: Ctx) -> dict:
    import importlib
    import importlib.metadata as md

    import torch

    def version(name: str) -> str | None:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    out: dict[str, Any] = {"python": platform.python_version(), "cpus": os.cpu_count(),
                           "versions": {n: version(n) for n in ("torch", "transformers", "peft", "accelerate",
                                                                "tokenizers", "safetensors", "bitsandbytes",
                                                                "flash-attn", "vllm", "numpy", "torchvision")},
                           "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}  # fmt: skip
    imports = {}
    for name in ("flash_attn", "bitsandbytes", "vllm", "torchvision", "finecap.train.run", "finecap.models.vlm"):
        try:
            importlib.import_module(name)
            imports[name] = "ok"
        except Exception as e:  # noqa: BLE001 - recorded
            imports[name] = one_line(e)
    out["imports"] = imports
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out["gpu"] = {"name": props.name, "memory_gib": round(props.total_memory / GIB, 1),
                      "capability": f"{props.major}.{props.minor}", "count": torch.cuda.device_count(),
                      "bf16_supported": torch.cuda.is_bf16_supported()}  # fmt: skip
        out["summary"] = f"{props.name}, {out['gpu']['memory_gib']} GiB, sm {props.major}.{props.minor}"
    else:
        out["summary"] = "no CUDA"
    out["summary"] += (f"; torch {out['versions']['torch']}, transformers {out['versions']['transformers']}; "
                       f"flash_attn {'yes' if imports['flash_attn'] == 'ok' else 'no'}, bitsandbytes "
                       f"{'yes' if imports['bitsandbytes'] == 'ok' else 'no'}")  # fmt: skip
    broken = [k for k in ("finecap.train.run", "finecap.models.vlm") if imports[k] != "ok"]
    out["status"] = "fail" if broken else "pass"
    return out


def layer_counts(config: Any) -> dict[str, int]:
    """The language model's and the vision tower's layers of a VLM config (object or ``config.json`` dict)."""
    get = dict.get if isinstance(config, dict) else getattr
    text, vision = get(config, "text_config"), get(config, "vision_config")
    get = dict.get if isinstance(text, dict) else getattr
    return {"lm_layers": int(get(text, "num_hidden_layers")),
            "vision_layers": int(get(vision, "depth", None) or get(vision, "num_hidden_layers"))}  # fmt: skip


def smolvlm_sizes(smoke: bool) -> dict[str, Any]:
    """SmolVLM-256M-Instruct's shapes (benchmarks/rollouts.py), or a tiny Idefics3 in the smoke mode (2 heads of
    width 32: vLLM's CPU attention serves no narrower head, ``grpo_vllm``)."""
    if smoke:
        return dict(image_size=16, hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128, positions=2048)
    from rollouts import SMOLVLM_256M

    return dict(SMOLVLM_256M)


def smolvlm_tokenizer(processor: Any, sizes: dict[str, Any]) -> None:
    """Give setup's SmolVLM-shaped model's tokenizer the model's own length limit: ``model_max_length`` = its
    ``positions`` (SmolVLM-256M-Instruct's 8192, as its own tokenizer says; the smoke model's 2048). The world
    tokenizer it is built from says 64 (the tiny models' limit), and transformers warned of every longer prompt
    ("Token indices sequence length is longer than the specified maximum sequence length for this model (78 > 64)",
    in every ``memory:*`` and ``grpo`` log of the 2026-11-28 H200 run). The tiny families keep theirs: their prompts
    (4 image tokens, no image splitting) stay under 64."""
    processor.tokenizer.model_max_length = int(sizes["positions"])


def check_setup(ctx: Ctx) -> dict:
    import torch

    from finecap.models.presets import save_tiny_clip, tiny_vlm
    from finecap.models.tiny import BUILDERS, save_family
    from finecap.models.vlm import FAMILIES

    out: dict[str, Any] = {"families": {}, "built": [], "no_tiny_builder": [f for f in FAMILIES if f not in BUILDERS]}
    errors, failed = [], {}
    (ctx.work / "families").mkdir(parents=True, exist_ok=True)
    for family in FAMILIES:
        if family not in BUILDERS:  # its family line says so (skipped); not a failure of the setup
            continue
        try:
            folder = save_family(ctx.work / "families" / family, family)
            out["families"][family] = layer_counts(json.loads((folder / "config.json").read_text()))
        except Exception as e:  # noqa: BLE001 - the family's check reports it skipped, with this error
            failed[family] = one_line(e)
            errors.append(f"{family}: {one_line(e)}")
    if failed:
        (ctx.work / "families" / "setup_errors.json").write_text(json.dumps(failed))
    try:
        start = time.perf_counter()
        torch.manual_seed(0)
        sizes = smolvlm_sizes(ctx.smoke)
        folder = ctx.work / "smolvlm"
        try:
            model, processor = tiny_vlm("idefics3", **sizes)
            edge = sizes["image_size"]
            ip = processor.image_processor  # SmolVLM's preprocessor_config.json: split into crops of the tower's size
            ip.do_image_splitting, ip.size, ip.max_image_size = (
                True,
                {"longest_edge": 4 * edge},
                {"longest_edge": edge},
            )
            stand_in = None
        except ImportError as e:  # transformers 5.17: Idefics3's image processors need torchvision
            stand_in = f"a LLaVA with SmolVLM-256M's language model and 64 image tokens ({one_line(e)[:200]})"
            sizes = {k: v for k, v in sizes.items() if k != "scale"} | ({"patch": 64} if not ctx.smoke else {})
            model, processor = tiny_vlm("llava", **sizes)
        model.save_pretrained(folder)
        smolvlm_tokenizer(processor, sizes)
        processor.save_pretrained(folder)
        if stand_in:
            (folder / "STAND_IN").write_text(stand_in)
            errors.append(f"smolvlm: Idefics3 could not be built; {stand_in}")
        n = sum(p.numel() for p in model.parameters())
        out["smolvlm"] = {
            "model_type": model.config.model_type,
            "stand_in": stand_in,
            "parameters": n,
            "seconds": round(time.perf_counter() - start, 1),
            **layer_counts(model.config),
        }
        out["built"].append("smolvlm")
    except Exception as e:  # noqa: BLE001
        errors.append(f"smolvlm: {one_line(e)}")
    try:
        save_tiny_clip(ctx.work / "clip", image_size=32, patch_size=16)
        out["built"].append("clip (tiny: the recipes' retriever, not ViT-B/32)")
    except Exception as e:  # noqa: BLE001
        errors.append(f"clip: {one_line(e)}")
    try:
        out["data"] = write_karpathy(ctx)
        out["built"].append("data")
    except Exception as e:  # noqa: BLE001
        errors.append(f"data: {one_line(e)}")
    out["errors"] = errors
    out["status"] = "fail" if errors else "pass"
    smol = out.get("smolvlm", {}).get("parameters", 0) / 1e6
    out["summary"] = (
        f"{len(out['families'])} families, smolvlm {smol:.0f}M params, {out.get('data', {}).get('images', 0)} images"
    )
    return out


def write_karpathy(ctx: Ctx) -> dict:
    """A Karpathy-format JSON of random JPEGs (COCO's 640x480; 32x24 in the smoke mode) with five captions each."""
    n_train, n_val, n_test = ctx.sizes["data_split"]
    width, height = ctx.sizes["data_image"]
    root = ctx.work / "data"
    (root / "images").mkdir(parents=True, exist_ok=True)
    entries = []
    n = n_train + n_val + n_test
    for i, im in enumerate(images(n, width, height, seed=1)):
        name = f"{i:05d}.jpg"
        im.crop((0, 0, width, height)).save(root / "images" / name, quality=90)
        split = "train" if i < n_train else "val" if i < n_train + n_val else "test"
        entries.append({"filename": name, "split": split, "cocoid": i,
                        "sentences": [{"raw": c} for c in captions(5, seed=i)]})  # fmt: skip
    (root / "dataset.json").write_text(json.dumps({"images": entries}))
    return {"images": n, "size": f"{width}x{height}", "path": str(root / "dataset.json")}


# --------------------------------------------------------------------------------------------------------------------
# Families: prompt pass, greedy decoding, a training step
# --------------------------------------------------------------------------------------------------------------------


def greedy_agreement(ours: list[list[int]], theirs: list[list[int]], logits: Any, pad_id: int,
                     tolerance: float) -> tuple[int, list[dict]]:  # fmt: skip
    """Rows of finecap's greedy tokens ``ours`` (each up to its end) equal to ``generate``'s ``theirs`` (padded after
    its end), and the rows that part at a near tie: where ``generate``'s own logits at the first differing step
    (``logits[t][row]``, of the prefix both share) put the two tokens within ``tolerance`` of each other (kernels that
    round apart in bfloat16 may break a tie either way; past it the two continue from other prefixes)."""
    equal, ties = 0, []
    for row, (mine, seq) in enumerate(zip(ours, theirs, strict=True)):
        n = len(mine)
        if mine == seq[:n] and all(t == pad_id for t in seq[n:]):
            equal += 1
            continue
        t = next((i for i, (a, b) in enumerate(zip(mine, seq, strict=False)) if a != b), None)
        if t is None or t >= len(logits):  # one ended where the other went on: no tie to read
            continue
        step = logits[t][row].float()
        gap = float(step[seq[t]] - step[mine[t]])
        if 0 <= gap <= tolerance:  # below 0: generate's processors chose a token its logits rank lower, no tie
            ties.append({"row": row, "step": t, "logit_gap": gap, "tolerance": tolerance})
    return equal, ties


def compare_with_model(ctx: Ctx, folder: Path, dtype: str, attn: str) -> dict:
    """finecap's first-token logits and greedy captions against the transformers model's own forward (at the
    positions ``generate`` gives it) and ``generate`` on 4 images (prompts padded where the family's lengths
    differ)."""
    import torch

    from finecap.config import DecodeConfig
    from finecap.models.memory import LoadOptions
    from finecap.models.vlm import Vlm

    model = Vlm.from_pretrained(folder, LoadOptions(dtype=dtype, attn_implementation=attn)).to(ctx.device).eval()
    size = ctx.sizes["family_image"]
    ims = images(4, size, size)
    enc = model.processor(text=[model.prompt_text] * 4, images=[[im] for im in ims], padding=True,
                          return_tensors="pt")  # fmt: skip
    weight_dtype = next(model.model.parameters()).dtype
    inputs = {
        k: (v.to(ctx.device, weight_dtype) if v.is_floating_point() else v.to(ctx.device)) for k, v in enc.items()
    }
    batch = inputs | {"prompt_ids": inputs["input_ids"], "prompt_mask": inputs["attention_mask"]}
    max_new = 8
    reference = dict(inputs)
    if not model.family.mrope:
        # generate's positions (cumsum of the mask), not the forward's default arange: under left padding the two
        # are equal in exact arithmetic (rope is relative) but round apart in bfloat16 (llava_next: 4e-2 relative)
        mask = inputs["attention_mask"]
        reference["position_ids"] = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
    with torch.no_grad():
        ours, _ = model.start(model.prompt_of(batch))  # (B, V)
        if hasattr(model.model.model, "rope_deltas"):
            model.model.model.rope_deltas = None
        theirs = model.model(**reference).logits[:, -1]  # (B, V)
        diff = (ours.float() - theirs.float()).abs()
        scale = theirs.float().abs().max().item()
        if hasattr(model.model.model, "rope_deltas"):
            model.model.model.rope_deltas = None
        # other images (not zeros: Idefics3's padding)
        shifted = reference | {"pixel_values": inputs["pixel_values"] + 0.5}
        other = model.model(**shifted).logits[:, -1]  # (B, V)
        control = (ours.float() - other.float()).abs().max().item() / max(scale, 1e-12)
        greedy = model.generate(batch, DecodeConfig(strategy="greedy", max_length=max_new))
        generated = model.model.generate(**inputs, max_new_tokens=max_new, do_sample=False, output_logits=True,
                                         return_dict_in_generate=True)  # fmt: skip
    prompt_len = inputs["input_ids"].shape[1]
    ours_rows = [greedy.sequences[row, : int(greedy.lengths[row])].tolist() for row in range(4)]
    equal, ties = greedy_agreement(ours_rows, generated.sequences[:, prompt_len:].tolist(), generated.logits,
                                   model.pad_token_id, TOL_REL[dtype] * scale)  # fmt: skip
    rel = diff.max().item() / max(scale, 1e-12)
    out = {"first_token_max_abs_diff": diff.max().item(), "first_token_max_rel_diff": rel, "logit_scale": scale,
           "tolerance_rel": TOL_REL[dtype], "argmax_equal": int((ours.argmax(-1) == theirs.argmax(-1)).sum()),
           "greedy_rows_equal": f"{equal}/4", "greedy_near_ties": ties, "distinct_captions": len(set(greedy.texts)),
           "prompt_tokens": prompt_len, "control_rel_diff_other_images": control}  # fmt: skip
    # the control: the model's own forward on other images (pixels shifted by 0.5) must differ from finecap's beyond
    # the tolerance, or the comparison could not see an image dropped or misplaced
    agree = equal + len(ties) == 4  # each row equal, or parting at a near tie of generate's own logits
    ok = math.isfinite(rel) and rel <= TOL_REL[dtype] < control and agree and len(set(greedy.texts)) > 1
    out["status"] = "pass" if ok else "fail"
    return out


def mle_step(ctx: Ctx, folder: Path, overrides: list[str]) -> dict:
    """One MLE step of finecap's training model (:func:`finecap.train.setup.build_model`: LoRA, dtypes,
    checkpointing as ``overrides`` say) under bfloat16 autocast; the loss, the gradients, the adapters' move."""
    import torch

    from finecap.models.memory import gradient_checkpointing, quantization_of
    from finecap.objectives.mle import MLE
    from finecap.train.setup import build_model

    cfg = load_cfg(None, ["model.kind=vlm", f"vlm.name={folder}", *overrides])
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats()  # this step's peak, not that of the comparisons before it in the check
    model = build_model(cfg).to(ctx.device).train()
    batch = training_batch(model, 4, ctx)
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    sync(ctx)
    start = time.perf_counter()
    with torch.autocast(ctx.device.type, dtype=torch.bfloat16):
        out = MLE()(model, batch)
        loss = sum(out.losses.values())
    loss.backward()
    grads = [p.grad for p in params if p.grad is not None]
    finite = all(bool(torch.isfinite(g).all()) for g in grads)
    nonzero = sum(int(g.abs().sum().item() > 0) for g in grads)
    grad_norm = torch.stack([g.float().norm() for g in grads]).norm().item() if grads else float("nan")
    optimizer.step()
    sync(ctx)
    moved = sum(int(not torch.equal(p.detach(), b)) for p, b in zip(params, before, strict=True))
    result = {"loss": loss.item(), "grad_norm": grad_norm, "trainable_tensors": len(params), "grads": len(grads),
              "nonzero_grads": nonzero, "moved": moved, "gradient_checkpointing": gradient_checkpointing(model),
              "lm_quantization": quantization_of(model.lora_module("lm")), "seconds": time.perf_counter() - start,
              "peak_gib": (peak_bytes(ctx) or 0) / GIB}  # fmt: skip
    ok = math.isfinite(result["loss"]) and finite and grads and nonzero > 0 and moved > 0
    if "train.gradient_checkpointing=true" in overrides:
        ok = ok and result["gradient_checkpointing"]
    result["grads_finite"] = finite
    result["status"] = "pass" if ok else "fail"
    return result


def attn_implementations(ctx: Ctx) -> list[str]:
    from transformers.utils import is_flash_attn_2_available

    return ["sdpa", *(["flash_attention_2"] if ctx.cuda and is_flash_attn_2_available() else [])]


SMOKE_FAMILIES = ("llava", "llava_next", "idefics3", "qwen2_vl", "gemma3")
"""The families ``--cpu-smoke`` runs the family check on: a plain LLaVA, one whose prompts are padded (anyres image
tokens), Idefics3's image rows per token, Qwen2-VL's multimodal rope and Gemma 3's sliding layers. Every family's
CPU contract (the same comparisons and a training step) is ``tests/models/test_vlm_families.py``'s; the GPU run checks
them all."""


def check_family(ctx: Ctx, family: str) -> dict:
    if ctx.smoke and family not in SMOKE_FAMILIES:
        raise Skip(f"skipped: --cpu-smoke checks {', '.join(SMOKE_FAMILIES)} (every family on the CPU: "
                   "tests/models/test_vlm_families.py)")  # fmt: skip
    folder = family_dir(ctx, family)
    parts: dict[str, Any] = {}
    impls = attn_implementations(ctx)
    runs = [("float32", "sdpa"), *(("bfloat16", a) for a in impls)]
    for dtype, attn in runs:
        parts[f"{dtype}/{attn}"] = guarded(lambda d=dtype, a=attn: compare_with_model(ctx, folder, d, a))
    lora = [
        "model.dtype=bfloat16",
        "lora.lm=true",
        "lora.rank=8",
        "lora.alpha=16",
        "train.gradient_checkpointing=true",
    ]
    for attn in impls:
        parts[f"train/{attn}"] = guarded(
            lambda a=attn: mle_step(ctx, folder, [*lora, f"model.attn_implementation={a}"])
        )
    statuses = {k: v["status"] for k, v in parts.items()}
    status = "pass" if all(s == "pass" for s in statuses.values()) else "fail"
    if not ctx.cuda:
        parts["note"] = "CPU stand-in: float32 and bfloat16 on the CPU (no CUDA)"
    worst = max((v.get("first_token_max_rel_diff", 0.0) for v in parts.values() if isinstance(v, dict)), default=0)
    bf = parts.get("bfloat16/sdpa", {})
    tr = parts.get("train/sdpa", {})
    summary = (f"rel diff max {worst:.1e}; greedy bf16 {bf.get('greedy_rows_equal', '-')}; "
               f"train loss {tr.get('loss', float('nan')):.3f}; {'+'.join(impls)}")  # fmt: skip
    if status != "pass":
        summary = "failed: " + ", ".join(k for k, s in statuses.items() if s != "pass") + "; " + summary
    return {"status": status, "parts": parts, "summary": summary}


def guarded(fn: Callable[[], dict]) -> dict:
    """``fn()``, or its error as a record (one line and the traceback's tail); CUDA memory freed after."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - recorded
        return {"status": "error", "error": one_line(e), "traceback": traceback.format_exc().splitlines()[-12:]}
    finally:
        free_cuda()


def free_cuda() -> None:
    import gc

    gc.collect()
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001, S110 - nothing to free
        pass


# --------------------------------------------------------------------------------------------------------------------
# QLoRA, FSDP2
# --------------------------------------------------------------------------------------------------------------------


def check_qlora(ctx: Ctx) -> dict:
    try:
        import bitsandbytes  # noqa: F401
    except Exception as e:  # noqa: BLE001
        raise Skip(f"skipped: bitsandbytes does not import ({one_line(e)})") from None
    folder = any_family(ctx)
    out = mle_step(ctx, folder, ["model.quantization=4bit", "model.dtype=bfloat16", "lora.lm=true", "lora.rank=8",
                                 "lora.alpha=16", "train.gradient_checkpointing=true"])  # fmt: skip
    if out["lm_quantization"] != "4bit":
        out["status"] = "fail"
        out["error"] = f"the language model is not 4-bit after loading (quantization: {out['lm_quantization']})"
    if not ctx.cuda:
        out["note"] = "CPU stand-in: bitsandbytes' CPU 4-bit layers"
    out["family"] = folder.name
    out["summary"] = (
        f"{folder.name}: loss {out['loss']:.3f}, grad norm {out['grad_norm']:.2e}, lm {out['lm_quantization']}"
    )
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_fsdp2(ctx: Ctx) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from finecap.config import DecodeConfig
    from finecap.models import sharding
    from finecap.objectives.mle import MLE
    from finecap.train.setup import build_model

    backend = "nccl" if ctx.cuda else "gloo"
    port = free_port()
    if ctx.cuda:
        torch.cuda.set_device(0)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        folder = any_family(ctx)
        cfg = load_cfg(None, ["model.kind=vlm", f"vlm.name={folder}", "train.strategy=fsdp",
                              "train.mixed_precision=bf16"])  # fmt: skip
        model = build_model(cfg).to(ctx.device).train()
        layers = sharding.shard_captioner(model, cfg.train.mixed_precision)
        dtensors = sum(isinstance(p, DTensor) for p in model.parameters())
        batch = training_batch(model, 4, ctx)
        before = {k: v.clone() for k, v in sharding.model_state(model).items()}
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        losses = []
        for _ in range(2):
            optimizer.zero_grad()
            out = MLE()(model, batch)
            loss = sum(out.losses.values())
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        after = sharding.model_state(model)
        moved = sum(int(not torch.equal(after[k], before[k])) for k in before)
        model.eval()
        with sharding.decoding(model) as m, torch.no_grad():
            gen = m.generate(batch, DecodeConfig(strategy="greedy", max_length=6))
        opt_state = sharding.optimizer_state(model, optimizer)
    finally:
        dist.destroy_process_group()
    ok = all(math.isfinite(x) for x in losses) and moved > 0 and dtensors > 0 and len(gen.texts) == 4
    return {"status": "pass" if ok else "fail", "family": folder.name, "backend": backend,
            "world_size": 1, "sharded_layers": len(layers),
            "dtensor_parameters": dtensors, "losses": losses, "tensors_moved": moved, "state_tensors": len(after),
            "optimizer_state_entries": len(opt_state.get("state", {})), "captions": gen.texts,
            "summary": f"{backend}, {len(layers)} layers sharded, losses {losses[0]:.3f} -> {losses[-1]:.3f}, "
                       f"{moved}/{len(after)} tensors moved"}  # fmt: skip


# --------------------------------------------------------------------------------------------------------------------
# GRPO and the recipes' memory
# --------------------------------------------------------------------------------------------------------------------


def recipe_overrides(ctx: Ctx, recipe: str, name: str) -> list[str]:
    """Point a ``coco/*_vlm`` recipe at setup's SmolVLM-shaped model, random data and tiny retriever; fresh weights
    (no ``train.init_from``); the smoke mode's tiny batches."""
    folder = ctx.work / "smolvlm"
    if not (folder / "config.json").exists() or not (ctx.work / "data" / "dataset.json").exists():
        raise Skip("skipped: setup did not build the SmolVLM-shaped model or the data")
    out = [f"vlm.name={folder}", f"data.path={ctx.work / 'data' / 'dataset.json'}",
           f"data.images={ctx.work / 'data' / 'images'}", "train.init_from=", f"run.dir={ctx.work / 'runs' / name}",
           f"retriever.checkpoint={ctx.work / 'clip'}"]  # fmt: skip
    if (folder / "STAND_IN").exists():
        out.append("vlm.processor_kwargs={}")  # SmolVLM's image splitting is Idefics3's option
    if ctx.smoke:
        out += [] if load_cfg(recipe, []).rl.samples == 1 else ["rl.samples=2"]  # greedy rollouts take 1
        out += ["train.batch_size=2", "decode.max_length=4", "decode.beam_size=2", "data.max_tokens=8",
                "data.num_workers=0", "data.persistent_workers=false", "data.pin_memory=false",
                "train.eval_samples=4"]  # fmt: skip
    return out


def check_trl(ctx: Ctx) -> dict:
    """``benchmarks/grpo_vs_trl.py`` on the device: finecap's GRPO step against TRL's ``GRPOTrainer`` on SmolVLM-256M's
    shapes, 4 images x 8 samples of at most 16 tokens, 3 steps each, one round (the smoke mode: its ``--quick``)."""
    try:
        import trl  # noqa: F401
    except Exception as e:  # noqa: BLE001
        raise Skip(f"skipped: TRL is not installed here ({one_line(e)})") from None
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import grpo_vs_trl

    argv = (["--quick"] if ctx.smoke else
            ["--size", "smolvlm", "--images", "4", "--group", "8", "--tokens", "16", "--steps", "3", "--rounds", "1",
             "--threads", str(min(8, os.cpu_count() or 1))])  # fmt: skip
    out = grpo_vs_trl.main([*argv, "--device", "cuda" if ctx.cuda else "cpu"])
    ok = math.isfinite(out["ratio"]) and out["finecap"]["steps"] and out["trl"]["steps"]
    out["status"] = "pass" if ok else "fail"
    out["summary"] = (
        f"{out['size']} on {out['device']}: finecap {out['finecap']['seconds_per_step']:.2f} s/step, "
        f"TRL {out['trl']['seconds_per_step']:.2f} s/step; finecap/TRL {out['ratio']:.2f}x captions/s"
    )
    return out


def train_rows(run_dir: Path) -> list[dict]:
    """The values of a run's training events in its ``metrics.jsonl`` (one per logged step), oldest first."""
    from finecap.report.plots import read_events
    from finecap.runs import METRICS_FILE

    metrics = run_dir / METRICS_FILE
    if not metrics.exists():
        return []
    return [e["values"] for e in read_events(metrics) if e.get("split") == "train"]


SIGNAL_KEYS = ("grad_norm", "reward", "advantage_std", "advantage/min", "advantage/max", "zero_std_groups")
"""What a GRPO run logs per step (``metrics.jsonl``) that shows whether the policy got a learning signal: the gradient
norm before clipping, the mean reward, the advantages' spread and the share of groups whose rewards were all equal
(TRL's ``frac_reward_zero_std``: :func:`finecap.objectives.grpo.zero_std_share`)."""


def signal_references(ctx: Ctx, length: int) -> Path:
    """A Karpathy JSON of setup's images and splits whose references the random policy can partly match, for the GRPO
    checks: each image's 5 references are ``length`` (``decode.max_length``) words drawn at random (seeded by the
    image) from the words of the SmolVLM-shaped model's tokenizer; setup's ``dataset.json`` is left as it is (the
    ``memory:*`` lines train on its captions).

    Why: the GRPO step is a learning step only where a group's rewards differ. With setup's references (4 to 8 of
    the 14 :data:`WORDS`) the random model's captions (``decode.max_length`` tokens drawn near uniformly from its
    49k words: it never ends one early) share almost no n-gram with them, and CIDEr-D's length penalty
    ``exp(-(40 - 6)^2 / 72)`` ~ 1e-7 scales what they share: on the CPU at SmolVLM's vocabulary, 4 images x 8
    samples x 40 tokens, the rewards were 0 or 2e-12, every group equal to TRL's tolerance (``zero_std_groups`` 1.0),
    the gradient norm 0 or 9e-9 and the losses 0 and 8.9e-16: the 2026-11-28 H200 record's (reward 2.5e-12). With
    references as long as the captions there is no length penalty, and a caption shares a word with its image's
    5 references with probability ``1 - (1 - 5 L / V) ** L`` (L = 40, V = 49k: 15%), so most groups of 8 hold
    different rewards. The reward is the recipe's own (CIDEr-D), its cost included in the step's time."""
    import numpy as np
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ctx.work / "smolvlm")
    special = set(tok.all_special_tokens)
    words = sorted(w for w in tok.get_vocab() if w not in special and w.isalnum())
    dataset = json.loads((ctx.work / "data" / "dataset.json").read_text())
    for entry in dataset["images"]:
        rng = np.random.default_rng(int(entry["cocoid"]))
        entry["sentences"] = [{"raw": " ".join(rng.choice(words, size=length))} for _ in range(5)]
    path = ctx.work / "data" / "grpo_dataset.json"
    path.write_text(json.dumps(dataset))
    return path


def learning_signal(rows: list[dict]) -> tuple[dict[str, list], str | None]:
    """The per-step values of :data:`SIGNAL_KEYS` in a GRPO run's logged training rows (``None`` where a step did not
    log one) and what fails the check, else ``None``: a loss or a gradient norm that is no finite number, no step with
    a finite, non-zero gradient norm (the policy learned nothing), every group's rewards equal in every step that
    logged them (``zero_std_groups`` 1.0: the advantages are 0, or float rounding of equal rewards, and so is the
    gradient), or no step that logged ``zero_std_groups`` at all (the rule could not be checked)."""
    signal = {key: [r.get(key) for r in rows] for key in SIGNAL_KEYS}
    steps = list(range(1, len(rows) + 1))
    problems = []
    for key in ("loss", "grad_norm"):
        bad = [s for s, r in zip(steps, rows, strict=True)
               if isinstance(r.get(key), float | int) and not math.isfinite(r[key])]  # fmt: skip
        if bad:
            problems.append(f"{key} not finite at step {', '.join(map(str, bad))}")
    norms = signal["grad_norm"]
    if not any(isinstance(g, float | int) and math.isfinite(g) and g != 0 for g in norms):
        problems.append(f"no step had a finite, non-zero grad_norm (per step: {norms})")
    zero = [z for z in signal["zero_std_groups"] if z is not None]
    if not zero:  # the rule below could not fail: say so rather than pass on nothing
        problems.append("no step logged zero_std_groups: whether any group's rewards differed is unknown")
    elif all(z == 1.0 for z in zero):
        problems.append("every group's rewards were equal in every step (zero_std_groups 1.0): no learning signal")
    return signal, "; ".join(problems) or None


def timed_grpo(ctx: Ctx, name: str, steps: int, extra: list[str],
               on_step: Callable[[Any], None] | None = None) -> tuple[Any, dict, list[dict]]:  # fmt: skip
    """``finecap train coco/grpo_cider_vlm`` (``recipe_overrides``, then ``extra``) for ``steps`` steps in
    ``runs/<name>``, logging every step, on the references of :func:`signal_references`: the configuration, the
    timing record (seconds per step: the median of the steps between the first, which builds, and the last, which
    also validates and saves; captions per second; the CUDA peak from step 2 on; the losses; the run's per-step
    learning signal, ``learning_signal``: :data:`SIGNAL_KEYS`; ``status`` fail unless every step ran and logged a
    loss and :func:`learning_signal` found nothing wrong, its finding the ``error``) and the logged training values;
    its ``summary`` begins the check's line (seconds per step, captions per second, the shapes, the largest gradient
    norm). ``on_step(state)`` runs after each step's timing mark."""
    import torch

    from finecap.train.run import train

    overrides = [*recipe_overrides(ctx, "coco/grpo_cider_vlm", name), f"train.max_steps={steps}",
                 "train.eval_every=0", "train.eval_samples=8", "train.log_every=1", *extra]  # fmt: skip
    references = signal_references(ctx, load_cfg("coco/grpo_cider_vlm", overrides).decode.max_length)
    cfg = load_cfg("coco/grpo_cider_vlm", [*overrides, f"data.path={references}"])
    marks: list[float] = []

    def mark(state: Any) -> None:
        sync(ctx)
        marks.append(time.perf_counter())
        if len(marks) == 1 and ctx.cuda:
            torch.cuda.reset_peak_memory_stats()
        if on_step is not None:
            on_step(state)

    start = time.perf_counter()
    train(cfg, callbacks=[mark], overwrite=True)
    intervals = [b - a for a, b in zip(marks, marks[1:])]
    clean = intervals[:-1] or intervals  # the last step also validates and saves
    per_step = statistics.median(clean) if clean else float("nan")
    rows = train_rows(ctx.work / "runs" / name)
    losses = [r["loss"] for r in rows if "loss" in r]
    signal, problem = learning_signal(rows)
    peak = peak_bytes(ctx)
    ok = len(marks) == steps and math.isfinite(per_step) and len(losses) == steps
    out = {"status": "pass" if ok and problem is None else "fail", "steps": steps,
           "first_step_seconds_with_setup": marks[0] - start if marks else None, "step_seconds": intervals,
           "seconds_per_step": per_step, "images_per_step": cfg.train.batch_size, "samples": cfg.rl.samples,
           "max_length": cfg.decode.max_length,
           "captions_per_second": cfg.train.batch_size * cfg.rl.samples / per_step, "losses": losses,
           "learning_signal": signal, "references": "signal_references: decode.max_length words of the tokenizer's",
           "peak_cuda_gib_steps_2_on": peak / GIB if peak is not None else None, "model": model_note(ctx)}  # fmt: skip
    if problem is not None:
        out["error"] = problem
    norms = [g for g in signal["grad_norm"] if isinstance(g, float | int) and math.isfinite(g)]
    out["summary"] = (f"{per_step:.2f} s/step, {out['captions_per_second']:.0f} captions/s "
                      f"({cfg.train.batch_size}x{cfg.rl.samples}x<={cfg.decode.max_length} tok), "
                      f"grad norm <= {max(norms, default=float('nan')):.2g}")  # fmt: skip
    return cfg, out, rows


def check_grpo(ctx: Ctx) -> dict:
    steps = 6 if not ctx.smoke else 3
    _, out, _ = timed_grpo(ctx, "grpo", steps, [])
    try:
        import vllm  # noqa: F401

        vllm_note = "not run here: the grpo_vllm check runs the same training on vLLM"
    except Exception as e:  # noqa: BLE001
        vllm_note = f"not run: vLLM is not installed here ({one_line(e)})"
    out.update(engine="finecap", vllm=vllm_note)
    peak = out["peak_cuda_gib_steps_2_on"]
    mem = f", peak {peak:.1f} GiB" if peak is not None else ""
    out["summary"] += f"{mem}; vLLM not run"
    return out


def device_memory(ctx: Ctx) -> dict | None:
    """The device's memory in use now (``torch.cuda.mem_get_info``: every allocation on the card, vLLM's
    included), torch's ``memory_allocated`` (expected to keep counting a sleeping engine's tensors: their addresses
    stay reserved while vLLM unmaps their memory) and what vLLM's sleep-mode allocator has mapped (``vllm_mapped``:
    ``CuMemAllocator``'s allocations awake; ``None`` where its internals differ), in GiB; ``None`` without CUDA."""
    if not ctx.cuda:
        return None
    import torch

    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    out: dict[str, Any] = {
        "device_used_gib": (total - free) / GIB,
        "torch_allocated_gib": torch.cuda.memory_allocated() / GIB,
        "vllm_mapped_gib": None,
    }
    try:
        from vllm.device_allocator.cumem import CuMemAllocator

        held = CuMemAllocator.get_instance().pointer_to_data.values()
        out["vllm_mapped_gib"] = sum(d.handle[1] for d in held if not d.is_asleep) / GIB
    except Exception:  # noqa: BLE001, S110 - another vLLM's internals: the device's figure stands
        pass
    return out


def engine_forecast(cfg: Any, freed_gib: float) -> dict:
    """What finecap's memory forecast (``--dry-run``'s vLLM line: :func:`finecap.models.forecast.vllm_share`) says a
    colocated engine holds awake, beside the memory its sleep freed on this device (``freed_gib``), and their ratio:
    ``vllm.gpu_memory_utilization`` of the device's memory. ``None`` where ``vllm.kv_cache_memory_bytes`` is set (the
    forecast then adds the engine's copy of the weights, which this check does not read) or without CUDA."""
    import torch

    from finecap.models.forecast import vllm_share

    if cfg.vllm.kv_cache_memory_bytes or not torch.cuda.is_available():
        return {"forecast_engine_share_gib": None, "freed_over_forecast": None}
    share = vllm_share(cfg.vllm, torch.cuda.mem_get_info()[1]) / GIB
    return {"forecast_engine_share_gib": share, "freed_over_forecast": freed_gib / share if share else None}


def check_grpo_vllm(ctx: Ctx) -> dict:
    """``grpo``'s training with its rollouts on a colocated vLLM engine (``decode.engine=vllm``) that sleeps between
    rollouts (``vllm.enable_sleep_mode=true``) on CUDA; on the CPU, where vLLM cannot sleep, with the option off and
    vLLM's refusal recorded. The device's memory is read as each rollout's engine goes to sleep (awake: weights and
    KV cache held) and after it (asleep), and after each training step (the backward pass done, the engine
    asleep)."""
    try:
        import vllm
        from vllm.platforms import current_platform
    except Exception as e:  # noqa: BLE001
        raise Skip(f"skipped: vLLM does not import here ({one_line(e)})") from None
    from unittest import mock

    from finecap.engines.vllm import VllmEngine, sleep_refusal

    refusal = sleep_refusal(current_platform, vllm.__version__)
    sleep_on = refusal is None and ctx.cuda
    extra = ["decode.engine=vllm", f"vllm.enable_sleep_mode={str(sleep_on).lower()}"]
    if ctx.smoke:  # vLLM's CPU backend: a small context and KV cache (its default takes GiBs)
        extra += ["vllm.max_model_len=1024", "vllm.kv_cache_memory_bytes=268435456"]
    sleeps: list[dict] = []
    after_steps: list[dict] = []
    engines: list[Any] = []
    dtypes: list[str] = []
    original = VllmEngine.sleep

    def sleep(engine: Any) -> None:
        if engine not in engines:
            engines.append(engine)
            with contextlib.suppress(Exception):  # the dtype vLLM computes in (vllm.dtype=auto: the step's)
                dtypes.append(str(engine.llm.llm_engine.vllm_config.model_config.dtype))
        was_asleep, awake = bool(engine.asleep), device_memory(ctx)
        original(engine)
        if engine.asleep and not was_asleep:
            sleeps.append({"awake": awake, "asleep": device_memory(ctx)})

    def after_step(_state: Any) -> None:
        asleep = sorted(engines[0].asleep) if engines else []  # the rollouts' engine (validation decodes itself)
        after_steps.append({"engine_asleep": asleep, **(device_memory(ctx) or {})})

    steps = 5  # the smoke mode's too: seconds on vLLM's CPU backend
    with mock.patch.object(VllmEngine, "sleep", sleep):
        cfg, out, rows = timed_grpo(ctx, "grpo_vllm", steps, extra, on_step=after_step)
    out.update(engine="vllm", vllm_dtype=f"{cfg.vllm.dtype}: {dtypes[0] if dtypes else '?'}",
               gpu_memory_utilization=cfg.vllm.gpu_memory_utilization, enable_sleep_mode=sleep_on,
               sleeps=len(sleeps), sleep_events=sleeps, memory_after_steps=after_steps)  # fmt: skip
    for key in ("time/sync", "vllm/is_ratio/min", "vllm/is_ratio/max", "vllm/logp_diff/max"):
        values = [r[key] for r in rows if key in r]
        if values:
            out[key] = values
    if not sleep_on:
        out["sleep"] = f"refused on the CPU (vllm.enable_sleep_mode=false here): {refusal}" if refusal else (
            "off: no CUDA")  # fmt: skip
        summary_mem = "sleep refused on the CPU"
    else:
        last = sleeps[-1] if sleeps else None
        freed = last["awake"]["device_used_gib"] - last["asleep"]["device_used_gib"] if last else float("nan")
        asleep_at_steps = [m["device_used_gib"] for m in after_steps if m["engine_asleep"]]
        out["sleep"] = "on: the engine sleeps after each rollout (vLLM sleep level 1)"
        out["freed_by_sleep_gib"] = freed
        out["device_used_awake_gib"] = last["awake"]["device_used_gib"] if last else None
        out["device_used_asleep_gib"] = last["asleep"]["device_used_gib"] if last else None
        out["device_used_after_steps_asleep_gib"] = max(asleep_at_steps) if asleep_at_steps else None
        out.update(engine_forecast(cfg, freed))
        if not (sleeps and freed > 0 and len(asleep_at_steps) == steps):
            out["status"] = "fail"
            out["error"] = (f"vllm.enable_sleep_mode=true: {len(sleeps)} sleeps, {freed:.2f} GiB freed by the last, "
                            f"the engine asleep after {len(asleep_at_steps)} of {steps} steps")  # fmt: skip
        forecast = out["forecast_engine_share_gib"]
        summary_mem = (
            (
                f"device {out['device_used_awake_gib']:.1f} GiB awake -> "
                f"{out['device_used_asleep_gib']:.1f} GiB asleep ({freed:.1f} freed"
                + (f", forecast {forecast:.1f})" if forecast is not None else ")")
            )
            if last
            else "no sleep"
        )
    out["summary"] += f"; {summary_mem}"
    return out


def model_note(ctx: Ctx) -> str:
    """What the SmolVLM-shaped model of setup is (a LLaVA stand-in where Idefics3 could not be built)."""
    marker = ctx.work / "smolvlm" / "STAND_IN"
    what = "tiny idefics3 (smoke)" if ctx.smoke else "idefics3 at SmolVLM-256M-Instruct's shapes"
    return f"stand-in: {marker.read_text()}" if marker.exists() else what


def judge_forecast(record: dict, cuda: bool) -> dict:
    """``record`` (a ``memory:*`` record of one measured step) with ``forecast_over_measured``: the forecast with
    activations (``forecast_with_activations_gib``), else the state forecast (``forecast_gib``: weights, gradients,
    optimizer state), over the measured peak; ``None`` off CUDA, where the measured number is the step's peak RSS
    growth, which leaves out what the process held before the step and is no peak to hold a forecast to. On CUDA a
    forecast with activations below ``finecap.models.forecast.UNDER_FORECAST`` (0.75: the quarter
    ``tests/models/test_memory_forecast.py`` holds the forecast to on the CPU, and the margin a recipe's claim to fit a
    card allows for) of the measured peak makes the line ``fail`` with an ``error`` that says so. Only the
    under-forecast fails: a run forecast to fit could run out of memory; an over-forecast sizes a run safely and
    passes, its size said by ``forecast_over_measured``. A state forecast alone counts no activations, is under the
    peak by construction and is only recorded."""
    from finecap.models.forecast import UNDER_FORECAST

    out = dict(record)
    forecast = out.get("forecast_with_activations_gib", out["forecast_gib"])
    measured = out["measured_peak_gib"]
    out["forecast_over_measured"] = forecast / measured if cuda and measured > 0 else None
    ratio = out["forecast_over_measured"]
    if ratio is not None and "forecast_with_activations_gib" in out and ratio < UNDER_FORECAST:
        out["status"] = "fail"
        out["error"] = (f"forecast {forecast:.2f} GiB is under {UNDER_FORECAST} of the measured {measured:.2f} GiB "
                        f"({ratio:.2f} of it): a run forecast to fit can run out of memory")  # fmt: skip
    return out


def check_memory(ctx: Ctx, recipe: str) -> dict:
    """``finecap train coco/<recipe> --dry-run`` on setup's SmolVLM-shaped model: the dry run's forecast against the
    measured peak of its one step, judged by :func:`judge_forecast`; ``oom`` when the step does not fit the card."""
    import torch

    from finecap.models.memory import training_memory
    from finecap.train.run import dry_run

    cfg = load_cfg(f"coco/{recipe}", recipe_overrides(ctx, f"coco/{recipe}", f"dry-{recipe}"))
    device_total = torch.cuda.get_device_properties(0).total_memory if ctx.cuda else None
    base = {"recipe": f"coco/{recipe}", "model": model_note(ctx),
            "batch": cfg.train.batch_size, "samples": cfg.rl.samples,
            "objective": cfg.train.objective, "dtype": cfg.model.dtype, "lora_lm": cfg.lora.lm,
            "gradient_checkpointing": cfg.train.gradient_checkpointing,
            "mixed_precision": cfg.train.mixed_precision, "processor_kwargs": cfg.vlm.processor_kwargs,
            "device_total_gib": device_total / GIB if device_total else None,
            "forecast_note": "finecap's forecast: weights + gradients + optimizer state (exact) and, for a VLM, the "
                             "activations forecast from its shapes (finecap.models.forecast)"}  # fmt: skip
    try:
        report = dry_run(cfg)
    except Exception as e:
        if not out_of_memory(e):
            raise
        free_cuda()
        from finecap.train.setup import build_model

        forecast = training_memory(build_model(cfg))  # on the CPU: the forecast the dry run would have printed
        return {**base, "status": "oom", "error": one_line(e), "forecast_bytes": forecast,
                "forecast_gib": forecast["total"] / GIB,
                "summary": f"does not fit: forecast {forecast['total'] / GIB:.2f} GiB + activations"}  # fmt: skip
    forecast = report["memory_bytes"]
    step = report["step"]
    out = {**base, "status": "pass" if math.isfinite(step["loss"]) else "fail", "forecast_bytes": forecast,
           "forecast_gib": forecast["total"] / GIB, "measured_peak_bytes": step["peak_bytes"],
           "measured_peak_gib": step["peak_bytes"] / GIB, "measured_what": "CUDA max_memory_allocated of one step"
           if ctx.cuda else "peak RSS growth (CPU)", "loss": step["loss"], "step_seconds": step["seconds"],
           "parameters": report["parameters"]}  # fmt: skip
    activations = (report.get("forecast") or {}).get("activations")
    if activations:
        out["activation_forecast_bytes"] = activations
        out["forecast_with_activations_gib"] = (forecast["total"] + activations["peak"]) / GIB
    if device_total:
        out["fits_fraction"] = step["peak_bytes"] / device_total
    if ctx.cuda:  # what the allocator holds (fragmentation, caches) beside what tensors used; the device's own use
        import torch

        out["max_reserved_gib"] = torch.cuda.max_memory_reserved() / GIB
        free, total = torch.cuda.mem_get_info()
        out["device_used_gib_after"] = (total - free) / GIB
    out = judge_forecast(out, ctx.cuda)
    total, ratio = out.get("forecast_with_activations_gib", out["forecast_gib"]), out["forecast_over_measured"]
    out["summary"] = (f"batch {cfg.train.batch_size}: forecast {total:.2f} GiB, measured "
                      f"{out['measured_peak_gib']:.2f} GiB{f' ({ratio:.2f})' if ratio is not None else ''}, "
                      f"{step['seconds']:.1f} s/step")  # fmt: skip
    return out


# --------------------------------------------------------------------------------------------------------------------
# The checks, each in a process of its own
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Ctx], dict]
    cap_s: float  # on the GPU
    needs_cuda: bool = False  # no CPU stand-in
    smoke_cap_s: float = 60.0  # under --cpu-smoke (the smaller of this and cap_s)
    needs: tuple[str, ...] = ()  # modules without which it can only skip: decided before a process is started


ENV = Check("env", check_env, 60)
"""The first check; needs torch alone, so it also runs (and is recorded) when finecap does not import."""


def checks() -> list[Check]:
    """The checks in the order they run: the training paths (QLoRA, FSDP2, GRPO), then every family's correctness
    against transformers, then the recipes' memory, then the engines that may be missing, so that a budget that runs
    out leaves measurements, not correctness checks, undone (docs/scaling.md, "The GPU check": each kind's seconds on
    the H200, and how few families a 480 s budget would reach after the memory lines)."""
    from finecap.models.tiny import LOAD_NEEDS
    from finecap.models.vlm import FAMILIES

    out = [ENV, Check("setup", check_setup, 90)]
    out += [Check("qlora", check_qlora, 60), Check("fsdp2", check_fsdp2, 60), Check("grpo", check_grpo, 120)]
    out += [Check(f"family:{f}", lambda ctx, f=f: check_family(ctx, f), 60,
                  needs=(LOAD_NEEDS[f],) if LOAD_NEEDS.get(f) else ()) for f in FAMILIES]  # fmt: skip
    out += [Check(f"memory:{r}", lambda ctx, r=r: check_memory(ctx, r), 100) for r in VLM_RECIPES]
    out += [Check("grpo_vllm", check_grpo_vllm, 180, smoke_cap_s=180, needs=("vllm",)),
            Check("trl", check_trl, 150, needs=("trl",))]  # fmt: skip
    return out


def run_body(check: Check, ctx: Ctx) -> dict:
    """Run ``check`` here: its record (a failure recorded, whatever it is)."""
    start = time.perf_counter()
    try:
        import torch

        torch.manual_seed(0)
        ctx.cuda = torch.cuda.is_available() and not ctx.smoke
        ctx.device = torch.device("cuda", 0) if ctx.cuda else torch.device("cpu")
        if ctx.cuda:
            torch.cuda.reset_peak_memory_stats()
        if check.needs_cuda and not ctx.cuda:
            raise Skip("skipped: no CUDA")
        record = check.run(ctx)
    except Skip as e:
        record = {"status": str(e).split(":")[0], "reason": str(e), "summary": str(e)}
    except BaseException as e:  # noqa: BLE001 - recorded, whatever it is
        # a recipe that does not fit the card is a finding of a memory line; anywhere else it is an error
        oom = out_of_memory(e) and check.name.startswith("memory:")
        record = {"status": "oom" if oom else "error", "error": one_line(e),
                  "traceback": traceback.format_exc().splitlines()[-15:], "summary": one_line(e)[:100]}  # fmt: skip
    record["seconds"] = time.perf_counter() - start
    record.setdefault("peak_cuda_gib", (peak_bytes(ctx) or 0) / GIB if ctx.cuda else None)
    return record


def child(check: Check, ctx: Ctx, result: Path, log: Path) -> None:
    """The forked process of one check: its output into ``log``, its record into ``result``."""
    os.setsid()  # its own process group: a timeout ends its DataLoader workers too
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    record = run_body(check, ctx)
    sys.stdout.flush()
    sys.stderr.flush()
    result.write_text(json.dumps(record, default=str, indent=1))
    os._exit(0)


def run_check(check: Check, ctx: Ctx, cap: float, logs: Path) -> dict:
    """Fork ``check``'s process, wait at most ``cap`` seconds, and read its record (a crash or a timeout recorded
    with the last lines of its log)."""
    result = logs / f"{check.name.replace(':', '_')}.json"
    log = logs / f"{check.name.replace(':', '_')}.log"
    result.unlink(missing_ok=True)
    start = time.perf_counter()
    if ctx.argv is not None:  # a fresh process (CUDA cannot be used in a process forked after it was touched)
        with open(log, "wb") as out:
            argv = [sys.executable, __file__, *ctx.argv, "--child", check.name, "--result", str(result)]
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        pid = proc.pid
    else:
        pid = os.fork()
        if pid == 0:
            child(check, ctx, result, log)
    status = None
    while time.perf_counter() - start < cap:
        done, code = os.waitpid(pid, os.WNOHANG)
        if done:
            status = code
            break
        time.sleep(0.05)
    else:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)
            time.sleep(1.0 if sig == signal.SIGTERM else 0)
        os.waitpid(pid, 0)
    seconds = time.perf_counter() - start
    tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
    if result.exists():
        record = json.loads(result.read_text())
        result.unlink()
    elif status is None:
        record = {"status": "timeout", "error": f"no result within its cap of {cap:.0f} s", "log_tail": tail,
                  "summary": f"timeout after {cap:.0f} s"}  # fmt: skip
    else:
        code = os.waitstatus_to_exitcode(status)
        record = {"status": "error", "error": f"the check's process ended with {code} before writing its result",
                  "log_tail": tail, "summary": f"process ended ({code})"}  # fmt: skip
    record.update(name=check.name, wall_seconds=round(seconds, 2), cap_s=round(cap, 1), log=str(log))
    return record


def table(records: list[dict]) -> str:
    rows = [f"{'check':<28} {'status':<8} {'seconds':>8}  key numbers"]
    for r in records:
        summary = str(r.get("summary", r.get("error", "")))
        rows.append(f"{r['name']:<28} {r['status']:<8} {r.get('wall_seconds', 0):>8.1f}  {summary}")
    return "\n".join(rows)


def gpu_lines() -> list[str]:
    """The GPUs NVML lists (``nvidia-smi -L``: ``GPU 0: NVIDIA H200 (UUID: ...)``), asked so that this process never
    touches CUDA; ``[]`` where there is none or no ``nvidia-smi``."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.startswith("GPU")] if out.returncode == 0 else []


def cuda_visible() -> bool:
    """Whether a CUDA device is there (:func:`gpu_lines`), without touching CUDA."""
    return bool(gpu_lines())


def machine() -> dict:
    """What this machine is, known without importing torch or touching CUDA (the JSON's first write, before any
    check): host, platform, Python, CPU cores, memory, the GPUs NVML lists and ``CUDA_VISIBLE_DEVICES``."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = None
    return {"host": socket.gethostname(), "platform": platform.platform(), "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "memory_bytes": memory, "gpus": gpu_lines(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}  # fmt: skip


def preload() -> str | None:
    """Import torch, transformers and finecap once, before forking (each check then starts in milliseconds); CUDA is
    not touched here (a forked child could not use it)."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401

        import finecap.models.sharding  # noqa: F401
        import finecap.models.vlm  # noqa: F401
        import finecap.train.run  # noqa: F401
        import finecap.train.setup  # noqa: F401

        return None
    except Exception as e:  # noqa: BLE001 - each check imports again and reports its own error
        return one_line(e)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="folder of the JSON and the logs (default: $FINECAP_HOME/gpu_check, else a new temporary one)",
    )
    p.add_argument("--out", default="gpu_check.json", help="the JSON's file name (or path) in --out-dir")
    p.add_argument("--work-dir", type=Path, default=None, help="models and data (default: a temporary folder)")
    p.add_argument("--budget", type=float, default=480.0, help="seconds for all checks together (a check whose cap "
                   "no longer fits is skipped, not started)")  # fmt: skip
    p.add_argument("--only", default="", help="comma-separated check names or prefixes (setup runs first always)")
    p.add_argument("--cpu-smoke", action="store_true", help="the same plumbing on the CPU at the tiniest sizes")
    p.add_argument("--spawn", action="store_true", help="each check in a fresh process instead of a fork (the default "
                   "when a CUDA device is visible: a fork cannot use CUDA once an import has touched it)")  # fmt: skip
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    out_dir = args.out_dir or (Path(os.environ["FINECAP_HOME"]) / "gpu_check" if os.environ.get("FINECAP_HOME")
                               else Path(tempfile.mkdtemp(prefix="finecap-gpu-check-")))  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    out_path = Path(args.out) if Path(args.out).is_absolute() else out_dir / args.out
    logs = out_dir / "gpu_check_logs"
    logs.mkdir(exist_ok=True)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="finecap-gpu-work-"))
    os.environ.setdefault("FINECAP_HOME", str(work / "home"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.cpu_smoke:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    sizes = {"family_image": 16, "data_split": (240, 8, 8) if not args.cpu_smoke else (40, 4, 4),
             "data_image": (640, 480) if not args.cpu_smoke else (32, 24)}  # fmt: skip
    ctx = Ctx(smoke=args.cpu_smoke, work=work, sizes=sizes)
    if args.child is not None:  # one check, in this process (--spawn's child); env without importing finecap
        check = ENV if args.child == ENV.name else next(c for c in checks() if c.name == args.child)
        args.result.write_text(json.dumps(run_body(check, ctx), default=str, indent=1))
        return 0
    report: dict[str, Any] = {"status": "started", "mode": "cpu-smoke" if args.cpu_smoke else "gpu",
                              "started": time.strftime("%FT%T%z"), "argv": sys.argv[1:], "budget_s": args.budget,
                              "work_dir": str(work), "machine": machine(), "preload_error": None, "checks": [],
                              "seconds": 0.0}  # fmt: skip
    write_report(out_path, report)  # before anything slow: a run cut off in its first minute still says where it ran
    spawn = args.spawn or (not args.cpu_smoke and cuda_visible())
    if spawn:
        ctx.argv = ["--work-dir", str(work), *(["--cpu-smoke"] if args.cpu_smoke else [])]
    preload_error = preload() if not spawn else None
    if preload_error is None:
        try:  # in spawn mode finecap is first imported here: a missing module still leaves the env check's JSON
            all_checks = checks()
        except Exception as e:  # noqa: BLE001 - recorded in the JSON
            preload_error = one_line(e)
    if preload_error is not None:
        all_checks = [ENV]
    wanted = [w for w in args.only.split(",") if w]
    selected = [c for c in all_checks if not wanted or c.name == "setup" or any(c.name.startswith(w) for w in wanted)]
    if preload_error is not None:  # finecap does not import: the env record says why, whatever --only asked
        selected = all_checks
    report.update(status="running", preload_error=preload_error)
    write_report(out_path, report)
    print(f"gpu_check: {len(selected)} checks, budget {args.budget:.0f} s, JSON {out_path}", flush=True)
    begin = time.perf_counter()
    for check in selected:
        left = args.budget - (time.perf_counter() - begin)
        cap = check.cap_s if not args.cpu_smoke else min(check.cap_s, check.smoke_cap_s)
        missing = [m for m in check.needs if importlib.util.find_spec(m) is None]
        if missing:  # no process started for a check that could only skip
            why = f"skipped: {', '.join(missing)} not installed"
            record = {"name": check.name, "status": "skipped", "reason": why, "summary": why}
        elif left < cap:  # a check started with less than its cap would be killed and counted as a failure
            record = {"name": check.name, "status": "skipped", "reason": BUDGET,
                      "summary": f"skipped: {left:.0f} s left of the --budget, its cap is {cap:.0f} s"}  # fmt: skip
        else:
            record = run_check(check, ctx, cap, logs)
        report["checks"].append(record)
        report["seconds"] = round(time.perf_counter() - begin, 1)
        write_report(out_path, report)
        print(f"  {record['name']:<28} {record['status']:<8} {record.get('wall_seconds', 0):>6.1f} s  "
              f"{record.get('summary', '')}", flush=True)  # fmt: skip
    report["status"] = "done"
    write_report(out_path, report)
    print(table(report["checks"]))
    print(f"gpu_check: {report['seconds']:.0f} s; JSON {out_path}; logs {logs}")
    left = [r["name"] for r in report["checks"] if r.get("reason") == BUDGET]
    if left:  # exit 0 (nothing failed), but said: what a next run with --only could take
        print(f"gpu_check: {len(left)} checks NOT RUN, the --budget spent: {', '.join(left)}")
    return 1 if any(r["status"] in FAILED for r in report["checks"]) else 0


if __name__ == "__main__":
    sys.exit(main())
