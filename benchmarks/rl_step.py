"""Time one sequence-level RL step of the tiny world captioner and the share of it spent computing rewards.

    .venv/bin/python benchmarks/rl_step.py [--images 64] [--samples 5] [--steps 5] [--init CHECKPOINT] [--json OUT]

Setting (the demo's defaults): a batch of ``--images`` images x ``--samples`` sampled captions, the world-tiny GPT-2
preset (3 layers, width 128, 4 heads, prefix 10), decode.max_length 24, CIDEr-D reward with document frequencies
from the references of ``--train-scenes`` world scenes (10,000, as world.n_train). Image features are random vectors
(the step's cost does not depend on where they come from). Unless ``--init`` loads a trained checkpoint, the fresh
model is first fitted for ``--mle-steps`` MLE steps to (random feature, reference caption) pairs so that its samples
have realistic caption lengths (a random model samples 24-token word salad).

For each objective (``reinforce`` = SCST: samples + greedy baseline; ``sle``: plus the diversity term) a step is
timed end to end (objective call, backward, optimizer step), with the objective's own timings of decoding
(``time/generate``), reward scoring (``time/reward``: CIDEr-D of the samples and the greedy captions, PTB
tokenisation included) and, for sle, the BLEU-3/4 distances (``time/diversity``). Printed: mean seconds per step,
per part, and the reward share = (reward + diversity) / step. Wall-clock times on a shared machine vary; the share
is the robust number. ``--threads`` sets torch's intra-op threads (default 1).

``--vlm-image-tokens N`` (e.g. 256) times instead the SCST step of a tiny LLaVA (Llama 3 x 128 over a vision tower
giving N image tokens per 64 px image, random weights) with the S samples of an image scored after one
language-model pass over its prompt (:meth:`finecap.models.vlm.Vlm._shared_prompt_logits`, "after") and with the
prompt repeated for every sample ("before"), interleaved; printed: the scoring forward + backward (the step minus
decoding and reward) and the whole step, before / after.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from finecap.config import load
from finecap.data.targets import encode_captions
from finecap.models.clipcap import ClipCap
from finecap.models.presets import build_world_lm
from finecap.objectives import get_objective
from finecap.world.captions import reference_captions
from finecap.world.scene import sample_scene

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine, machine_line  # noqa: E402  (benchmarks/machine.py)


def world_references(n: int, seed: int = 0) -> dict[int, list[str]]:
    rng = random.Random(seed)
    return {i: reference_captions(sample_scene(rng, i), rng) for i in range(n)}


def fit_mle(model: ClipCap, feats: torch.Tensor, refs: dict[int, list[str]], steps: int, batch: int) -> None:
    """A few MLE steps on (feature of image i, one of its references) so that samples look like captions."""
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    rng = random.Random(1)
    ids = list(refs)
    model.train()
    for _ in range(steps):
        pick = rng.sample(ids, batch)
        enc = encode_captions(model.tokenizer, [rng.choice(refs[i]) for i in pick], max_tokens=48)
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        logits = model({"features": feats[pick], **enc})  # (B, T, V)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()


def time_objective(name: str, overrides: list[str], model: ClipCap, records, batches, steps: int) -> dict:
    cfg = load(None, [f"train.objective={name}", *overrides])
    objective = get_objective(name, cfg)
    t = time.perf_counter()
    objective.setup(SimpleNamespace(cfg=cfg, accelerator=None, train_records=records, tokenizer=model.tokenizer))
    setup_s = time.perf_counter() - t
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    rows: list[dict[str, float]] = []
    for i in range(steps + 1):  # the first step warms up (allocations, lazy imports) and is not counted
        batch = batches[i % len(batches)]
        model.train()
        t0 = time.perf_counter()
        out = objective(model, batch)
        loss = sum(out.losses.values())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        total = time.perf_counter() - t0
        if i > 0:
            m = out.metrics
            rows.append({
                "step": total,
                "generate": m["time/generate"],
                "reward": m["time/reward"],
                "diversity": m.get("time/diversity", 0.0),
                "sample_words": m["sample_words"],
            })  # fmt: skip
    mean = {k: statistics.mean(r[k] for r in rows) for k in rows[0]}
    mean["reward_share"] = (mean["reward"] + mean["diversity"]) / mean["step"]
    mean["setup"] = setup_s
    return mean


def vlm_shared_prompt(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """SCST steps of a tiny LLaVA whose prompt holds ``--vlm-image-tokens`` image tokens (64 px images, patch
    64 / sqrt(tokens)), with the samples scored after one prompt pass per image (``share_prompt``, the default) and
    with the prompt repeated for every sample (before), interleaved step by step so both see the same load."""
    from PIL import Image

    from finecap.data.datasets import model_collator
    from finecap.models.presets import tiny_vlm
    from finecap.models.vlm import Vlm

    side = int(round(args.vlm_image_tokens**0.5))
    if side * side != args.vlm_image_tokens or 64 % side:
        raise SystemExit(f"--vlm-image-tokens must be a square whose side divides 64 (16, 64, 256, 1024), got "
                         f"{args.vlm_image_tokens}")  # fmt: skip
    model_hf, processor = tiny_vlm(
        "llava",
        image_size=64,
        hidden=128,
        layers=3,
        heads=4,
        kv_heads=4,
        intermediate=512,
        positions=args.vlm_image_tokens + 128,
        patch=64 // side,
    )
    model = Vlm(model_hf, processor, source="tiny-llava").train()
    refs = world_references(2000)
    records = [SimpleNamespace(image_id=i, captions=c) for i, c in refs.items()]
    rng = random.Random(3)
    collate = model_collator(model, 24)
    batches = []
    for _ in range(args.steps + 1):
        pick = rng.sample(list(refs), args.images)
        items = [{"caption": refs[i][0], "references": refs[i], "image_id": i, "index": i,
                  "image": Image.effect_noise((64, 64), 40 + i % 50).convert("RGB")} for i in pick]  # fmt: skip
        batches.append(collate(items))
    print(f"VLM prompt: {batches[0]['prompt_ids'].shape[1]} tokens, {args.vlm_image_tokens} of them image tokens")
    cfg = load(None, ["train.objective=reinforce", f"rl.samples={args.samples}", "decode.max_length=16"])
    objective = get_objective("reinforce", cfg)
    objective.setup(SimpleNamespace(cfg=cfg, accelerator=None, train_records=records, tokenizer=model.tokenizer))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    times: dict[str, list[float]] = {"shared prompt (after)": [], "prompt per sample (before)": []}
    for i in range(args.steps + 1):
        for name, share in (("shared prompt (after)", True), ("prompt per sample (before)", False)):
            model.share_prompt = share
            torch.manual_seed(i)  # the same samples in both
            t0 = time.perf_counter()
            out = objective(model, batches[i])
            opt.zero_grad(set_to_none=True)
            sum(out.losses.values()).backward()
            step = time.perf_counter() - t0
            if i > 0:  # the first step warms up
                times[name].append(step - out.metrics["time/generate"] - out.metrics["time/reward"])
                times[name + " step"] = [*times.get(name + " step", []), step]
    return {k: {"median_s": statistics.median(v)} for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64, help="images per batch")
    parser.add_argument("--samples", type=int, default=5, help="sampled captions per image (rl.samples)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per objective")
    parser.add_argument("--train-scenes", type=int, default=10000, help="world scenes whose references give CIDEr df")
    parser.add_argument("--init", default=None, help="captioner checkpoint (default: fresh world-tiny + MLE fit)")
    parser.add_argument("--feature-dim", type=int, default=64, help="image feature size of a fresh captioner")
    parser.add_argument("--mle-steps", type=int, default=150, help="MLE steps fitting a fresh captioner")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--json", default=None, help="write the results as JSON")
    parser.add_argument(
        "--vlm-image-tokens",
        type=int,
        default=0,
        help="instead: time a tiny LLaVA's SCST step "
        "with this many image tokens per prompt, scoring after one prompt pass per image vs per sample",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.vlm_image_tokens:
        results = vlm_shared_prompt(args)
        after, before = (results[k]["median_s"] for k in ("shared prompt (after)", "prompt per sample (before)"))
        steps = (results[k + " step"]["median_s"] for k in ("shared prompt (after)", "prompt per sample (before)"))
        step_after, step_before = steps
        print(f"\n{args.images} images x {args.samples} samples, {args.steps} timed steps; {machine_line()}")
        print(f"scoring forward + backward: before {before:.3f} s, after {after:.3f} s ({before / after:.2f}x)")
        print(f"whole SCST step (decoding and CIDEr-D included): before {step_before:.3f} s, after {step_after:.3f} s "
              f"({step_before / step_after:.2f}x)")  # fmt: skip
        if args.json:
            Path(args.json).write_text(json.dumps({**results, "machine": machine()}, indent=2))
        return

    refs = world_references(args.train_scenes)
    records = [SimpleNamespace(image_id=i, captions=c) for i, c in refs.items()]
    if args.init:
        model = ClipCap.from_checkpoint(args.init, load_encoder=False)
    else:
        lm, tok = build_world_lm(3, 128, 4, n_positions=64)
        model = ClipCap(lm, tok, args.feature_dim)
    feats = torch.randn(len(refs), model.feature_dim)
    if not args.init:
        t = time.perf_counter()
        fit_mle(model, feats, refs, args.mle_steps, batch=32)
        print(f"MLE fit of the fresh captioner: {args.mle_steps} steps in {time.perf_counter() - t:.1f} s")
    rng = random.Random(2)
    batches = []
    for _ in range(args.steps + 1):
        pick = rng.sample(list(refs), args.images)
        batches.append({"features": feats[pick], "image_ids": pick, "references": [refs[i] for i in pick]})

    common = [f"rl.samples={args.samples}", "decode.max_length=24"]
    results = {
        "scst (reinforce)": time_objective("reinforce", common, model, records, batches, args.steps),
        "sle": time_objective("sle", common, model, records, batches, args.steps),
    }
    print(f"\n{args.images} images x {args.samples} samples, {args.steps} timed steps; {machine_line()}")
    columns = [("objective", 18), ("step s", 9), ("decode s", 10), ("reward s", 10), ("divers. s", 10),
               ("reward %", 10), ("words", 7)]  # fmt: skip
    print("".join(f"{name:<{w}}" if i == 0 else f"{name:>{w}}" for i, (name, w) in enumerate(columns)))
    for name, r in results.items():
        print(f"{name:<18}{r['step']:>9.3f}{r['generate']:>10.3f}{r['reward']:>10.4f}{r['diversity']:>10.4f}"
              f"{100 * r['reward_share']:>9.1f}%{r['sample_words']:>7.1f}")  # fmt: skip
    print(f"(CIDEr-D statistics of {len(refs)} images' references computed once in setup: "
          f"{results['scst (reinforce)']['setup']:.2f} s)")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({**results, "machine": machine()}, indent=2))


if __name__ == "__main__":
    main()
