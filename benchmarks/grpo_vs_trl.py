"""GRPO steps of finecap against TRL's ``GRPOTrainer`` on the same VLM, the same CIDEr-D reward and the same images
(issue 65), alternated in one run: seconds per step, sampled captions per second and their ratio.

    .venv/bin/python benchmarks/grpo_vs_trl.py [--size tiny|smolvlm] [--images 4] [--group 8] [--tokens 16]
                                               [--steps 3] [--rounds 2] [--threads 2] [--device cpu|cuda]
                                               [--quick] [--json OUT]

Both sides train one Idefics3 saved once to a temporary folder with random weights (``tiny``: finecap's tiny preset;
``smolvlm``: SmolVLM-256M-Instruct's shapes, as ``benchmarks/memory.py`` builds them), on ``--images`` random 64 x 48
JPEGs a step, ``--group`` sampled captions per image of at most ``--tokens`` tokens, no KL (beta 0), one optimizer
step per rollout, LoRA off (the whole language model and projector train), float32 on the CPU (``--device cuda``:
both sides on the GPU, ``train.cpu=false`` and TRL's ``use_cpu=False``; the GPU check's ``trl`` line). The reward is
finecap's CIDEr-D, called by TRL through finecap's adapter (``finecap.integrations.trl.reward_function("cider")``)
and by finecap itself (``rl.rewards={cider: 1.0}``), against the same five random references per image.

- finecap: ``finecap train coco/grpo_cider_vlm`` with the model, data and sizes above (``rl.samples``, ``decode.
  max_length``, ``train.batch_size``; checkpointing, bf16 and LoRA switched off, as on the TRL side), finecap's own
  decoder for the rollouts; step times from a training callback.
- TRL: ``GRPOTrainer`` (1.16) with ``per_device_train_batch_size = images x group``, ``num_generations = group``,
  ``max_completion_length = tokens``; rollouts with transformers' ``generate`` (TRL cannot call finecap's decoder: the
  engines differ, and that is part of what is compared); step times from a ``TrainerCallback``.

Each round runs ``--steps`` steps of each, finecap first, then TRL. finecap's steps are timed from the end of one to
the end of the next (a callback after each optimizer step), so its first step of each round is not counted; TRL's from
``on_step_begin`` to ``on_step_end``, its first step of the first round left out as a warm-up. Reported: the median
seconds per step of each side, captions per second (images x group / seconds) and finecap's captions per second over
TRL's. ``--quick``: the tiny model, 2 images x 2 samples of 4
tokens, 2 steps, 1 round (the smoke test's mode: tests/benchmarks/test_grpo_vs_trl.py).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine, machine_line  # noqa: E402  (benchmarks/machine.py)

WORDS = ("a", "red", "blue", "green", "small", "big", "circle", "square", "star", "on", "the", "left", "right", "two")


def write_data(root: Path, n: int) -> tuple[Path, dict[int, list[str]]]:
    """A Karpathy-format split of ``n`` random JPEGs, all in train, five random captions each; returns the JSON's
    path and the references by image id."""
    import numpy as np
    from PIL import Image

    rng, images = random.Random(0), root / "images"
    images.mkdir(parents=True, exist_ok=True)
    entries, references = [], {}
    for i in range(n):
        pixels = np.random.default_rng(i).integers(0, 256, (48, 64, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(images / f"{i:05d}.jpg", quality=90)
        refs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 8))) for _ in range(5)]
        references[i] = refs
        entries.append({"filename": f"{i:05d}.jpg", "split": "train", "cocoid": i,
                        "sentences": [{"raw": r} for r in refs]})  # fmt: skip
    # a validation split must exist: one more image of its own (one image file in two splits is refused)
    pixels = np.random.default_rng(n).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(images / f"{n:05d}.jpg", quality=90)
    entries.append({**entries[0], "filename": f"{n:05d}.jpg", "split": "val", "cocoid": n})
    (root / "dataset.json").write_text(json.dumps({"images": entries}))
    return root / "dataset.json", references


def save_model(folder: Path, size: str) -> None:
    import torch

    from finecap.models.presets import tiny_vlm

    torch.manual_seed(0)
    if size == "tiny":
        model, processor = tiny_vlm("idefics3")
    else:
        sys.path.insert(0, str(Path(__file__).parent))
        from rollouts import SMOLVLM_256M

        model, processor = tiny_vlm("idefics3", **SMOLVLM_256M)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)


class StepTimer:
    """Wall-clock seconds of each training step (``mark()`` after each)."""

    def __init__(self) -> None:
        self.last = time.perf_counter()
        self.seconds: list[float] = []

    def mark(self, *_: Any, **__: Any) -> None:
        now = time.perf_counter()
        self.seconds.append(now - self.last)
        self.last = now


def finecap_steps(folder: Path, data: Path, work: Path, args: argparse.Namespace, tag: str) -> list[float]:
    from finecap.config import load
    from finecap.train.run import train

    overrides = [f"vlm.name={folder}", f"data.path={data}", f"data.images={data.parent / 'images'}",
                 "train.init_from=", f"train.max_steps={args.steps}", f"train.batch_size={args.images}",
                 f"rl.samples={args.group}", f"decode.max_length={args.tokens}", "data.max_tokens=16",
                 "train.eval_every=0", "train.save_every=0", "train.log_every=1", "train.log_captions=0",
                 "data.num_workers=0", "data.persistent_workers=false", "data.pin_memory=false",
                 "model.dtype=float32", "train.mixed_precision=no", "train.gradient_checkpointing=false",
                 "lora.lm=false", "vlm.image_max_pixels=null", f"run.dir={work / tag}",
                 f"train.cpu={str(args.device == 'cpu').lower()}",
                 f"run.cache_dir={work / 'cache'}", "train.lr=1e-5"]  # fmt: skip
    cfg = load("coco/grpo_cider_vlm", overrides)
    timer = StepTimer()
    timer.last = None  # the first step's interval would hold the run's setup: timed from its end on

    def callback(_state: Any) -> None:
        if timer.last is None:
            timer.last = time.perf_counter()
            return
        timer.mark()

    train(cfg, callbacks=[callback], overwrite=True)
    return timer.seconds  # steps 2 .. n: from the end of one step to the end of the next


def trl_steps(folder: Path, data_refs: tuple[Path, dict], work: Path, args: argparse.Namespace) -> list[float]:
    from datasets import Dataset
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from finecap.integrations.trl import reward_function

    data, references = data_refs
    model = AutoModelForImageTextToText.from_pretrained(folder)
    processor = AutoProcessor.from_pretrained(folder)
    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe the image."}]}]
    rows = [{"prompt": prompt, "image": Image.open(data.parent / "images" / f"{i:05d}.jpg").convert("RGB"),
             "image_id": i} for i in references]  # fmt: skip
    timer = StepTimer()

    class Timing(TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            timer.last = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            timer.mark()

    config = GRPOConfig(output_dir=str(work / "trl"), per_device_train_batch_size=args.images * args.group,
                        num_generations=args.group, max_completion_length=args.tokens, max_steps=args.steps,
                        logging_steps=1, report_to="none", use_cpu=args.device == "cpu", learning_rate=1e-5,
                        save_strategy="no",
                        bf16=False, seed=0, beta=0.0)  # fmt: skip
    trainer = GRPOTrainer(model=model, processing_class=processor, args=config, train_dataset=Dataset.from_list(rows),
                          reward_funcs=[reward_function("cider", references=references)],
                          callbacks=[Timing()])  # fmt: skip
    trainer.train()
    return timer.seconds


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=("tiny", "smolvlm"), default="tiny")
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where both sides train")
    parser.add_argument("--quick", action="store_true", help="tiny, 2 images x 2 samples of 4 tokens, 2 steps, once")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.size, args.images, args.group, args.tokens, args.steps, args.rounds = "tiny", 2, 2, 4, 2, 1
    import torch

    torch.set_num_threads(args.threads)
    times: dict[str, list[float]] = {"finecap": [], "trl": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        save_model(work / "model", args.size)
        data_refs = write_data(work / "data", args.images * args.steps)
        for r in range(args.rounds):
            fc = finecap_steps(work / "model", data_refs[0], work, args, f"finecap{r}")
            tr = trl_steps(work / "model", data_refs, work, args)
            times["finecap"] += fc  # its first step is never timed (the run's setup)
            times["trl"] += tr[1:] if r == 0 else tr  # the first step of the first round warms up
    captions = args.images * args.group
    out: dict[str, Any] = {"size": args.size, "images": args.images, "group": args.group, "tokens": args.tokens,
                           "steps": args.steps, "rounds": args.rounds, "threads": args.threads,
                           "device": args.device, "machine": machine()}  # fmt: skip
    print(machine_line())
    for side, seconds in times.items():
        median = statistics.median(seconds) if seconds else float("nan")
        out[side] = {"seconds_per_step": median, "captions_per_second": captions / median, "steps": seconds}
        print(f"{side:<8} {median:7.3f} s/step  {captions / median:8.2f} captions/s  ({len(seconds)} steps)")
    out["ratio"] = out["finecap"]["captions_per_second"] / out["trl"]["captions_per_second"]
    print(f"finecap / TRL captions per second: {out['ratio']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
