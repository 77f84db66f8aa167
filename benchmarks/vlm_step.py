"""Per-step time of the three backbone families (ClipCap, BLIP, decoder-only VLMs) under the same objective,
interleaved in one process.

    .venv/bin/python benchmarks/vlm_step.py [--batch 64] [--steps 12] [--threads 1] [--json OUT]

Every captioner has a text side of the same size, 3 layers x 128 with 4 heads and a feed-forward width of 512
(random initialisation; the world sizes), over the world vocabulary:

- ``clipcap``: GPT-2 after a prefix of 10 from a 256-d feature (MLP mapper) - the world ClipCap; frozen features are
  cached, so the vision side costs nothing per step;
- ``blip``: the world BLIP's text decoder cross-attending to 5 image tokens of width 256 (cached as well);
- ``vlm_llava``, ``vlm_idefics3``, ``vlm_qwen2_vl``: a tiny VLM of each family
  (:func:`finecap.models.presets.tiny_vlm`: Llama / Qwen2 language model of the same size, a 1-layer vision tower of
  width 16, 4 image tokens per 16 px image) reading the chat prompt (13-18 tokens with the image tokens) before the
  caption; a VLM's vision tower runs at every step (``cache_features`` is false), frozen
  (``model.train_encoder=false``), while the language model and the projector learn.

The batch is ``--batch`` random captions of 12 words + EOS (and random features / images); one optimizer step
(objective forward, backward, AdamW) of each backbone alternates with the others', so all see the same machine load.
Printed: the median seconds per step of each backbone and its ratio to ClipCap's, for MLE and SMILE.

    .venv/bin/python benchmarks/vlm_step.py --shared-prompt [--images 4] [--samples 8] [--image-tokens 256]
        [--tokens 16] [--steps 6] [--json OUT]

``--shared-prompt`` instead times the RL objectives' policy step of a tiny LLaVA under gradient checkpointing, with
the samples scored after one prompt pass per image (``Vlm.share_prompt``, the default) and with the prompt repeated
per sample: the same text side, a prompt of ``--image-tokens`` image tokens (64 px images) plus the chat template's
text, ``--samples`` random captions of ``--tokens`` tokens per image (a GRPO group), LoRA (rank 16) on the language
model and the projector trained; one step = the scoring forward, a policy-gradient loss with random advantages, the
backward pass (recomputing the checkpointed layers) and AdamW, the two alternating step by step (rollouts left out:
they are the same either way). Printed per step: the positions the language model reads (counted at its first
decoder layer's forward calls; the backward's recomputation reads them again in both) and the median seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from PIL import Image

from finecap.data.datasets import model_collator
from finecap.models.blip import Blip
from finecap.models.clipcap import ClipCap
from finecap.models.presets import VLM_FAMILIES, build_world_lm, tiny_vlm, world_blip
from finecap.models.vlm import Vlm
from finecap.objectives.mle import MLE
from finecap.objectives.smile import SmileObjective

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine, machine_line  # noqa: E402  (benchmarks/machine.py)

SIZES = dict(layers=3, hidden=128, heads=4)


def captions(tokenizer, n: int, g: torch.Generator) -> list[str]:
    words = [w for w in tokenizer.get_vocab() if w.isalpha()]
    picks = torch.randint(len(words), (n, 12), generator=g).tolist()
    return [" ".join(words[i] for i in row) for row in picks]


def build(kind: str, n: int) -> tuple[torch.nn.Module, dict]:
    """A captioner of ``kind`` and one training batch of ``n`` examples for it."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    if kind == "clipcap":
        lm, tok = build_world_lm(**SIZES, n_positions=64, dropout=0.1)
        model = ClipCap(lm, tok, feature_dim=256)
        features = torch.randn(n, 256, generator=g)  # (B, D)
    elif kind == "blip":
        blip, tok = world_blip(256, **SIZES, positions=40)
        model = Blip(blip, tok)
        features = torch.randn(n, 5, 256, generator=g)  # (B, P, H) image tokens, as the world BLIP caches them
    else:
        hf, processor = tiny_vlm(kind.removeprefix("vlm_"), **SIZES, kv_heads=4, intermediate=512, positions=64)
        model, features = Vlm(hf, processor), None
    images = [Image.fromarray((torch.rand(16, 16, 3, generator=g) * 255).byte().numpy()) for _ in range(n)]
    texts = captions(model.tokenizer, n, g)
    items = [
        {
            "caption": c,
            "image_id": i,
            "references": [c],
            "index": i,
            **({"features": features[i]} if features is not None else {"image": images[i]}),
        }
        for i, c in enumerate(texts)
    ]
    return model.train(), model_collator(model, 13)(items)


def shared_prompt(args: argparse.Namespace) -> dict:
    """``--shared-prompt``'s policy steps under gradient checkpointing, shared and repeated prompt (module
    docstring): ``{mode: {"positions": per step, "median_s": ...}}``."""
    from finecap.config import load
    from finecap.models import lora, memory
    from finecap.models.base import module_path

    side = int(round(args.image_tokens**0.5))
    if side * side != args.image_tokens or 64 % side:
        raise SystemExit(f"--image-tokens must be a square whose side divides 64 (16, 64, 256, 1024), got "
                         f"{args.image_tokens}")  # fmt: skip
    torch.manual_seed(0)
    hf, processor = tiny_vlm("llava", **SIZES, kv_heads=4, intermediate=512, image_size=64, patch=64 // side,
                             positions=args.image_tokens + 64 + args.tokens)  # fmt: skip
    cfg = load(None, ["model.kind=vlm", "lora.lm=true", "lora.rank=16", "lora.alpha=32"])
    model = lora.configure_training(Vlm(hf, processor), cfg).train()
    memory.enable_gradient_checkpointing(model)
    optimizer = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-5)
    g = torch.Generator().manual_seed(0)
    images = [Image.fromarray((torch.rand(64, 64, 3, generator=g) * 255).byte().numpy()) for _ in range(args.images)]
    texts = captions(model.tokenizer, args.images, g)
    batch = model_collator(model, 13)([{"caption": c, "image_id": i, "references": [c], "index": i, "image": im}
                                       for i, (c, im) in enumerate(zip(texts, images, strict=True))])  # fmt: skip
    N = args.images * args.samples
    sequences = torch.randint(4, model.tokenizer.vocab_size, (N, args.tokens), generator=g)  # (N, L)
    sequences[sequences == model.image_token_id] = model.tokenizer.eos_token_id  # the own forward for the repeats
    mask = torch.ones_like(sequences, dtype=torch.bool)  # (N, L)
    image_index = torch.arange(args.images).repeat_interleave(args.samples)  # (N,)
    advantages = torch.randn(N, 1, generator=g)  # (N, 1)
    lm = module_path(model.model, model.family.language_model)
    first = next(m for n, m in lm.named_modules() if n.endswith("layers.0"))
    seen: list[int] = []
    first.register_forward_pre_hook(lambda m, a, k: seen.append((a[0] if a else k["hidden_states"]).shape[:2].numel()),
                                    with_kwargs=True)  # fmt: skip
    modes = {"shared prompt": True, "prompt per sample": False}
    out: dict[str, dict] = {m: {"times": []} for m in modes}
    for step in range(args.steps + 1):
        for name, share in modes.items():
            model.share_prompt = share
            seen.clear()
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            logprobs = model(batch, sequences=sequences, mask=mask, image_index=image_index).logprobs  # (N, L)
            (-(advantages * logprobs).sum(1).mean()).backward()
            optimizer.step()
            if step:  # the first step warms up
                out[name]["times"].append(time.perf_counter() - start)
            out[name]["positions"] = sum(seen)
    prompt = int(batch["prompt_ids"].shape[1])
    results = {
        name: {"positions": r["positions"], "median_s": statistics.median(r["times"])} for name, r in out.items()
    }
    shared, repeated = results["shared prompt"], results["prompt per sample"]
    print(
        f"tiny LLaVA (3 layers x 128), LoRA r16 + projector, gradient checkpointing; {args.images} images x "
        f"{args.samples} samples, prompt {prompt} tokens ({args.image_tokens} image tokens), captions of "
        f"{args.tokens} tokens; torch threads {torch.get_num_threads()}, {args.steps} timed steps"
    )
    print(machine_line())
    print(f"{'scoring':<20}{'LM positions/step':>19}{'s/step':>9}")
    for name, r in results.items():
        print(f"{name:<20}{r['positions']:>19,}{r['median_s']:>9.3f}")
    print(
        f"sharing: {repeated['positions'] / shared['positions']:.2f}x fewer positions, "
        f"{repeated['median_s'] / shared['median_s']:.2f}x faster steps"
    )
    return {"prompt_tokens": prompt, **results}


def main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--shared-prompt", action="store_true", help="time the shared prompt under checkpointing instead")
    p.add_argument("--images", type=int, default=4, help="--shared-prompt: images per step")
    p.add_argument("--samples", type=int, default=8, help="--shared-prompt: sampled captions per image")
    p.add_argument("--image-tokens", type=int, default=256, help="--shared-prompt: image tokens per prompt")
    p.add_argument("--tokens", type=int, default=16, help="--shared-prompt: tokens per sampled caption")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.shared_prompt:
        results = shared_prompt(args)
        if args.json:
            args.json.write_text(json.dumps({**results, "machine": machine()}, indent=2) + "\n")
        return results
    kinds = ["clipcap", "blip", *(f"vlm_{f}" for f in VLM_FAMILIES)]
    results: dict[str, float] = {}
    for name, objective in (("mle", MLE()), ("smile", SmileObjective())):
        setups = {}
        for kind in kinds:
            model, batch = build(kind, args.batch)
            optimizer = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-4)
            setups[kind] = (model, optimizer, batch)
        times: dict[str, list[float]] = {k: [] for k in setups}
        for _ in range(args.steps):
            for kind, (model, optimizer, batch) in setups.items():
                start = time.perf_counter()
                optimizer.zero_grad()
                out = objective(model, batch)
                sum(out.losses.values()).backward()
                optimizer.step()
                times[kind].append(time.perf_counter() - start)
        for kind, ts in times.items():
            results[f"{kind}/{name}"] = statistics.median(ts[2:])
    print(f"batch {args.batch}, 12 words + EOS; {machine_line()}")
    print(f"{'backbone':<16}{'mle s/step':>12}{'x clipcap':>11}{'smile s/step':>14}{'x clipcap':>11}")
    for kind in kinds:
        row = [results[f"{kind}/{o}"] for o in ("mle", "smile")]
        ratios = [r / results[f"clipcap/{o}"] for r, o in zip(row, ("mle", "smile"), strict=True)]
        print(f"{kind:<16}{row[0]:>12.3f}{ratios[0]:>11.2f}{row[1]:>14.3f}{ratios[1]:>11.2f}")
    if args.json:
        args.json.write_text(json.dumps({**results, "machine": machine()}, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
