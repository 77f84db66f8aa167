"""Memory of one training step of real-size captioners, with and without each memory lever, built from configs (no
download) and loaded through finecap's own loading code.

    .venv/bin/python benchmarks/memory.py [--backbones clipcap,blip,vlm] [--images 8] [--samples 5] [--tokens 24]
                                          [--json OUT]

Models (random weights, saved to a temporary folder, then loaded by path with the run's ``model.*`` keys, as a
user's checkpoint would be):

- ``clipcap``: GPT-2 124M (``GPT2Config()``, 50,257-word vocabulary) after a 10-token MLP prefix from 512-d CLIP
  features; the ViT-B/32-shaped CLIP (``CLIPConfig()``) is loaded too, but frozen features are cached, so it does not
  run in the step;
- ``blip``: BLIP-base shapes (ViT-B/16 at 384 px: 577 image tokens of width 768, a 12-layer 768-wide text decoder,
  a 30,524-word vocabulary); the text decoder trains, the frozen vision tower runs in the step (BLIP's own ViT
  tokens are recomputed, not cached: ``Blip.cache_features``), so its attention over 577 tokens (16 x 12 heads x
  577 x 577 floats, 244 MB per tensor in float32) is part of every BLIP step peak;
- ``vlm``: SmolVLM-256M shapes (Idefics3: a 12-layer 768-wide SigLIP tower at 512 px, patch 16, pixel shuffle 4: 64
  image tokens; a 30-layer 576-wide Llama with 9 / 3 heads, 49,152 words); the vision tower runs frozen, the
  language model and the projector train.

Steps: ``mle`` = the MLE objective (``finecap.objectives.mle.MLE``, as training runs it: under checkpointing it
scores the captions in vocabulary chunks) on ``--images`` captions of ``--tokens`` tokens; ``scst`` = the REINFORCE
loss of ``--samples`` sampled captions per image (``forward(batch, sequences=..., image_index=...)``; the samples are
random token ids: decoding runs without gradient and is not what the levers change). Variants: float32 weights;
with ``train.gradient_checkpointing``; bfloat16 weights (``model.dtype=bfloat16``, what trains kept float32 by
``model.trainable_dtype``); both; LoRA r16 on the language model over a float32 base (also with checkpointing)
and a bfloat16 base; and, where
bitsandbytes is installed, ``model.quantization=4bit`` with the same LoRA (QLoRA). ``--variants`` picks some.

How memory is measured (the method is the point). Each variant runs in its own process. *Weights*: the bytes of
every parameter and buffer as loaded (exact). *Training state*: gradients of the trainable parameters plus AdamW's
two float32 moments (exact, from the trainable parameter count). *Step peak*: the largest amount of tensor memory
allocated at once during the step's forward and backward, above what was allocated before them, after one warm-up
step (AdamW's state allocated, gradients freed). On CUDA that is ``torch.cuda.max_memory_allocated`` after
``reset_peak_memory_stats``, minus ``memory_allocated`` before. On the CPU, which has no such counter, torch's
profiler records every allocation and free of the step (``profile_memory=True``: the ``[memory]`` events with their
sizes and times), and the peak of their running sum is taken (:func:`allocation_peak`): the same quantity, counted
from the allocator's own events rather than from the process's resident memory (which reuses freed pages and missed
allocations, the method of this script before 2026-11-24). It counts the activations kept for backward, the logits,
the gradients being formed and every temporary; the optimizer step is left out (its temporaries are the same in
every variant: training state). *Activations*: the same peak in a second forward and backward whose gradient buffers
already exist (zeroed in place, ``zero_grad(set_to_none=False)``), so the trainable parameters' gradients (training
state, which no lever but LoRA changes) are not in it, except one parameter's incoming gradient at a time while it
is added in place (and, for a parameter used several times in the graph, the sum of its incoming gradients, e.g.
GPT-2's tied embedding and head). *Saved*: the bytes of the distinct tensors the forward pass saves for the backward
pass (``benchmarks/saved_tensors.py``'s ``saved_bytes``, each storage once): activations in the textbook sense,
what checkpointing recomputes instead of keeping (under checkpointing: the checkpointed layers' and vocabulary
chunks' inputs).
Ratios are printed in one run: checkpointed / plain step peak, activations and saved, and bf16 / fp32 weight memory.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_allocations import allocation_sizes  # noqa: E402  (benchmarks/cpu_allocations.py)
from machine import machine, machine_line  # noqa: E402  (benchmarks/machine.py)

VARIANTS = {
    "fp32": [],
    "fp32+ckpt": ["train.gradient_checkpointing=true"],
    "bf16": ["model.dtype=bfloat16"],
    "bf16+ckpt": ["model.dtype=bfloat16", "train.gradient_checkpointing=true"],
    "lora": ["lora.lm=true", "lora.rank=16", "lora.alpha=32"],
    "lora+ckpt": ["lora.lm=true", "lora.rank=16", "lora.alpha=32", "train.gradient_checkpointing=true"],
    "bf16+lora": ["model.dtype=bfloat16", "lora.lm=true", "lora.rank=16", "lora.alpha=32"],
    "4bit+lora": ["model.quantization=4bit", "lora.lm=true", "lora.rank=16", "lora.alpha=32"],
}
"""The memory levers compared, as the run's overrides."""
BACKBONES = ("clipcap", "blip", "vlm")


# --------------------------------------------------------------------------------------------------------------------
# Real-size checkpoints from configs
# --------------------------------------------------------------------------------------------------------------------


def words(n: int) -> list[str]:
    return [f"w{i}" for i in range(n)]


def save_checkpoints(root: Path, backbones: list[str], vlm_tower_layers: int = 12) -> dict[str, list[str]]:
    """Save each backbone's real-size random checkpoint under ``root``; returns the overrides that load it.
    ``vlm_tower_layers``: the depth of the ``vlm``'s SigLIP tower (SmolVLM-256M's 12, what this script measures; a
    test of what does not grow with a frozen tower's depth may build fewer, at the same widths)."""
    import torch
    from transformers import (
        BlipForConditionalGeneration,
        BlipImageProcessor,
        CLIPConfig,
        CLIPModel,
        GPT2Config,
        GPT2LMHeadModel,
    )

    from finecap.models.presets import tiny_blip_config, tiny_vlm
    from finecap.models.tokenizer import world_tokenizer

    torch.manual_seed(0)
    loads: dict[str, list[str]] = {}
    if "clipcap" in backbones:
        tok = world_tokenizer(words(50_257 - 8))
        lm = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                                        eos_token_id=tok.eos_token_id))  # fmt: skip
        lm.save_pretrained(root / "gpt2")
        tok.save_pretrained(root / "gpt2")
        CLIPModel(CLIPConfig()).save_pretrained(root / "clip")  # ViT-B/32 shapes
        from transformers import CLIPImageProcessor, CLIPTokenizerFast  # noqa: F401 (the encoder needs a processor)

        CLIPImageProcessor().save_pretrained(root / "clip")
        loads["clipcap"] = ["model.kind=clipcap", f"clipcap.lm={root / 'gpt2'}", f"model.encoder={root / 'clip'}"]
    if "blip" in backbones:
        tok = world_tokenizer(words(30_524 - 8))
        cfg = tiny_blip_config(tok, image_size=384, patch_size=16, vision_hidden=768, vision_layers=12, hidden=768,
                               layers=12, heads=12, positions=512)  # fmt: skip
        cfg.vision_config.intermediate_size = cfg.text_config.intermediate_size = 3072
        BlipForConditionalGeneration(cfg).save_pretrained(root / "blip")
        tok.save_pretrained(root / "blip")
        BlipImageProcessor(size={"height": 384, "width": 384}).save_pretrained(root / "blip")
        loads["blip"] = ["model.kind=blip", f"blip.name={root / 'blip'}"]
    if "vlm" in backbones:
        vision = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": vlm_tower_layers,
                  "num_attention_heads": 12}  # fmt: skip
        model, processor = tiny_vlm("idefics3", image_size=512, hidden=576, layers=30, heads=9, kv_heads=3,
                                    intermediate=1536, positions=8192, patch=16, scale=4, vision=vision,
                                    extra_words=49_152 - 200)  # fmt: skip
        model.save_pretrained(root / "vlm")
        processor.save_pretrained(root / "vlm")
        loads["vlm"] = ["model.kind=vlm", f"vlm.name={root / 'vlm'}"]
    return loads


# --------------------------------------------------------------------------------------------------------------------
# One measured step (in a child process)
# --------------------------------------------------------------------------------------------------------------------


def allocation_peak(fn: Callable[[], None], cuda: bool) -> int:
    """The largest number of tensor bytes allocated at once while ``fn()`` runs, above those allocated before it: on
    CUDA from the caching allocator's counters, on the CPU from the allocation and free events torch's profiler
    records (``profile_memory=True``), in time order."""
    import torch

    if cuda:  # pragma: no cover - a GPU
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        return torch.cuda.max_memory_allocated() - before
    return max(itertools.accumulate(allocation_sizes(fn), initial=0))


MEASURES = ("step_peak", "activations", "saved")
"""What :func:`measure` measures, one pass each: the step's allocation peak, the activations' (the gradient buffers
kept from the step before) and the tensors saved for the backward pass."""


def measure(overrides: list[str], step: str, images: int, samples: int, tokens: int,
            measures: Sequence[str] = MEASURES) -> dict[str, float]:  # fmt: skip
    """Build the training model of ``overrides`` as ``finecap train`` does, run one warm-up step and one pass of each
    of ``measures`` (:data:`MEASURES`; a test of the activations' peak alone leaves the others' passes out)."""
    unknown = set(measures) - set(MEASURES)
    if unknown:
        raise ValueError(f"measures: unknown {sorted(unknown)}; valid: {', '.join(MEASURES)}")
    import gc

    import torch
    from PIL import Image

    from finecap.config import load
    from finecap.data.datasets import model_collator
    from finecap.models.backbones import build_model
    from finecap.models.lora import configure_training
    from finecap.models.memory import prepare_training
    from finecap.objectives.mle import MLE
    from saved_tensors import saved_bytes  # benchmarks/saved_tensors.py

    torch.manual_seed(0)
    cfg = load(None, overrides)
    model = prepare_training(configure_training(build_model(cfg), cfg), cfg).train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-5)
    vocab = len(model.tokenizer)
    g = torch.Generator().manual_seed(1)
    captions = torch.randint(8, vocab, (images, tokens), generator=g)
    if model.cache_features:  # frozen vision: the feature cache's tensors
        shape = (images, 512) if cfg.model.kind == "clipcap" else (images, 577, 768)
        batch = {"features": torch.randn(*shape, generator=g), "input_ids": captions,
                 "attention_mask": torch.ones_like(captions), "labels": captions}  # fmt: skip
    else:  # a VLM reads its images every step
        items = [{"caption": "w1 w2", "image": Image.effect_noise((512, 512), 40).convert("RGB"), "image_id": i,
                  "references": ["w1"], "index": i} for i in range(images)]  # fmt: skip
        batch = model_collator(model, tokens)(items)
        batch["input_ids"], batch["attention_mask"], batch["labels"] = captions, torch.ones_like(captions), captions
    sequences = torch.randint(8, vocab, (images * samples, tokens), generator=g)
    image_index = torch.arange(images).repeat_interleave(samples)
    advantage = torch.randn(images * samples, 1, generator=g)

    def forward() -> torch.Tensor:
        if step == "mle":
            return MLE()(model, batch).losses["mle"]
        scores = model(batch, sequences=sequences, image_index=image_index)
        return -(advantage * scores.logprobs).sum() / len(sequences)

    def forward_backward(set_to_none: bool = True) -> None:
        optimizer.zero_grad(set_to_none=set_to_none)
        forward().backward()

    forward_backward()  # warm-up: AdamW's state, allocator pools
    optimizer.step()
    # the step's peak starts without gradient buffers; the activations' is measured with them kept (from the warm-up
    # when the step's peak is not measured before it)
    optimizer.zero_grad(set_to_none="step_peak" in measures)
    gc.collect()
    cuda = torch.cuda.is_available() and next(model.parameters()).is_cuda
    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    n_trainable = sum(p.numel() for p in trainable)
    state = sum(p.numel() * p.element_size() for p in trainable) + 8 * n_trainable  # grads + AdamW's 2 fp32 moments
    row = {"weights_mb": weights / 2**20, "train_state_mb": state / 2**20, "trainable_m": n_trainable / 1e6,
           "device": "cuda" if cuda else "cpu",
           "prompt_tokens": int(batch["prompt_ids"].shape[1]) if "prompt_ids" in batch else 0}  # fmt: skip
    if "step_peak" in measures:
        row["step_peak_mb"] = allocation_peak(forward_backward, cuda) / 2**20
        gc.collect()
    if "activations" in measures:  # the gradient buffers kept
        row["activations_mb"] = allocation_peak(lambda: forward_backward(set_to_none=False), cuda) / 2**20
    if "saved" in measures:
        row["saved_mb"] = saved_bytes(forward, model) / 2**20  # the loss dropped: its graph freed
    return row


# --------------------------------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbones", default=",".join(BACKBONES))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--steps", default="mle,scst")
    parser.add_argument("--images", type=int, default=8, help="images per step")
    parser.add_argument("--samples", type=int, default=5, help="sampled captions per image (scst)")
    parser.add_argument("--tokens", type=int, default=24, help="caption length")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None, help="write the results as JSON")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # one measurement in this process: JSON on stdout's last line
        import torch

        torch.set_num_threads(args.threads)
        spec = json.loads(args.child)
        print(json.dumps(measure(spec["overrides"], spec["step"], args.images, args.samples, args.tokens)))
        return
    backbones = args.backbones.split(",")
    results: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        loads = save_checkpoints(Path(tmp), backbones)
        for backbone in backbones:
            for step in args.steps.split(","):
                for variant in args.variants.split(","):
                    spec = {"overrides": [*loads[backbone], "train.batch_size=8", *VARIANTS[variant]], "step": step}
                    cmd = [sys.executable, __file__, "--child", json.dumps(spec), "--images", str(args.images),
                           "--samples", str(args.samples), "--tokens", str(args.tokens),
                           "--threads", str(args.threads)]  # fmt: skip
                    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1"})
                    key = f"{backbone}/{step}"
                    if done.returncode != 0:
                        last = (done.stderr.strip().splitlines() or ["?"])[-1]
                        print(f"{key} {variant}: not measured ({last[:160]})")
                        continue
                    row = json.loads(done.stdout.strip().splitlines()[-1])
                    results.setdefault(key, {})[variant] = row
                    print(f"{key:<14}{variant:<11} weights {row['weights_mb']:8.0f} MB  train state "
                          f"{row['train_state_mb']:7.0f} MB  step peak {row['step_peak_mb']:7.0f} MB  "
                          f"activations {row['activations_mb']:7.0f} MB  saved {row['saved_mb']:6.0f} MB  "
                          f"({row['trainable_m']:.1f} M trainable, {row['device']})", flush=True)  # fmt: skip
    print(f"\n{machine_line()}")
    print(f"{args.images} images x {args.tokens} tokens (scst: x {args.samples} samples); ratios in this run:")
    for key, rows in results.items():
        parts = []
        for plain, ckpt in (("fp32", "fp32+ckpt"), ("bf16", "bf16+ckpt"), ("lora", "lora+ckpt")):
            if plain in rows and ckpt in rows:
                a, b = rows[ckpt], rows[plain]
                parts.append(f"{ckpt} / {plain} step peak {a['step_peak_mb'] / b['step_peak_mb']:.2f}, "
                             f"activations {a['activations_mb'] / b['activations_mb']:.2f}, "
                             f"saved {a['saved_mb'] / b['saved_mb']:.2f}")  # fmt: skip
        for low, high in (("bf16", "fp32"), ("bf16+lora", "lora")):
            if low in rows and high in rows:
                parts.append(f"{low} / {high} weights {rows[low]['weights_mb'] / rows[high]['weights_mb']:.2f}")
        if "fp32" in rows and "4bit+lora" in rows:
            parts.append(f"4bit / fp32 weights {rows['4bit+lora']['weights_mb'] / rows['fp32']['weights_mb']:.2f}")
        print(f"  {key}: " + "; ".join(parts))
    if args.json:
        Path(args.json).write_text(json.dumps({**results, "machine": machine()}, indent=2))


if __name__ == "__main__":
    main()
