"""finecap's memory forecast (:mod:`finecap.models.forecast`) of every ``coco/*_vlm`` recipe at SmolVLM-256M's and
Qwen2-VL-2B's shapes, and of the recipes as the first H200 run measured them (issue 65). Nothing is built or loaded:
the numbers come from the shapes alone, in a fraction of a second.

    .venv/bin/python benchmarks/memory_forecast.py [--card-gb 80] [--h200]

Prints the table of docs/memory.md ("Forecast per recipe"): recipe x backbone -> weights, gradients, AdamW state,
the frozen retrievers and the KL reference's copy of the trained weights, activations at the step's peak and the total
per process, in GiB, and whether it fits the card (``--card-gb``, 10^9 bytes) with the margin
:func:`finecap.models.forecast.fits` states (the forecast's tolerated error and what CUDA holds outside torch's
allocator). ``--h200``: the forecast of the three recipe steps
``benchmarks/results/gpu_check_h200_2026-11-26*.json`` measured (their settings as they ran then: float32 full
fine-tuning with SmolVLM's image splitting, and so on) against the measured CUDA peaks.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from finecap.config import load
from finecap.models.forecast import (
    BACKBONES,
    CARD_80GB,
    GIB,
    LmShapes,
    Step,
    Training,
    VisionShapes,
    activation_forecast,
    fits,
    recipe_forecast,
    training_of,
)

RECIPES = ("mle_vlm", "smile_vlm", "discritune_vlm", "sr_l_vlm", "sr_lv_bagcurri_vlm", "grpo_cider_vlm",
           "grpo_sr_cider_vlm")  # fmt: skip
RESULTS = Path(__file__).parent / "results"


def table(card: int = CARD_80GB) -> list[str]:
    """The forecast of every recipe at each of :data:`BACKBONES`, and whether it :func:`fits` ``card`` (bytes)."""
    rows = ["| recipe | backbone | batch x captions | weights | gradients | AdamW | retrievers | KL reference | "
            f"activations | total | fits {card / 1e9:g} GB with the margin |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]  # fmt: skip
    for recipe in RECIPES:
        cfg = load(f"coco/{recipe}")
        for backbone in BACKBONES.values():
            f = recipe_forecast(cfg, backbone)
            s, step, b = f["state"], f["step"], f["beside"]
            rows.append(
                f"| `coco/{recipe}` | {backbone.name} | {step.images} x {step.captions} | {s['weights'] / GIB:.2f} | "
                f"{s['gradients'] / GIB:.2f} | {s['optimizer'] / GIB:.2f} | {b['retrievers'] / GIB:.2f} | "
                f"{b['reference'] / GIB:.2f} | {f['activations']['peak'] / GIB:.2f} | "
                f"{f['total'] / GIB:.2f} | {'yes' if fits(f['total'], card) else 'no'} |"
            )
    return rows


SMOLVLM_AS_MEASURED = LmShapes(30, 576, 1536, 9, 3, 49_152)  # gpu_check's SmolVLM (benchmarks/rollouts.py)
SIGLIP_512 = VisionShapes(768, 3072, 1024, 3 * 512 * 512, 12, 12, pixel_copy="select", embeddings_kept=1)
"""SmolVLM's tower over a 512 px crop (SigLIP: its encoder keeps the embeddings while its later layers run)."""
H200 = [  # gpu_check's settings then (the recipes before issue 65), the state it printed, its measured peak
    ("memory:mle_vlm", "gpu_check_h200_2026-11-26.json", Training("full", 4),
     Step(32, 894, 1, 9), replace(SIGLIP_512, patches=13 * 1024, pixels=13 * 3 * 512 * 512),
     "float32 full fine-tune, image splitting on (13 crops, 894 prompt tokens), captions of 4-8 words (9 tokens)"),
    ("memory:sr_l_vlm", "gpu_check_h200_2026-11-26.json",
     Training("lora", 4, rank=32, targets=("q_proj", "k_proj", "v_proj", "o_proj")),
     Step(100, 78, 1, 40, shared=True), SIGLIP_512,
     "float32, LoRA r32 on attention, one 512 px crop (78 prompt tokens), 1 sample of 40 tokens, prompt shared"),
    ("memory:grpo_cider_vlm", "gpu_check_h200_2026-11-26_memory_rerun.json",
     Training("lora", 2, autocast=True, checkpointing=True, rank=32, targets=("q_proj", "k_proj", "v_proj", "o_proj")),
     Step(16, 78, 8, 40), SIGLIP_512,
     "bf16 + LoRA r32 + autocast + checkpointing, 16 images x 8 samples of 40 tokens"),
    # the same step as the code committed before that run scored it (01b68616: the sampled captions' rows read the
    # prompt embeddings made once per image; a4857391, 14 minutes after the run began, made it the model's own
    # forward, which runs the tower for every row of an unshared prompt)
    ("memory:grpo_cider_vlm", "gpu_check_h200_2026-11-26_memory_rerun.json",
     Training("lora", 2, autocast=True, checkpointing=True, rank=32, targets=("q_proj", "k_proj", "v_proj", "o_proj")),
     Step(16, 78, 8, 40, own_forward=False), SIGLIP_512,
     "the same, the rows reading prompt embeddings made once per image (the code committed before the run)"),
]  # fmt: skip


def h200() -> list[str]:
    rows = ["| check | settings | weights + gradients + AdamW (exact) | activations (forecast) | total forecast | "
            "measured CUDA peak | forecast / measured |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for name, file, train, step, vision, what in H200:
        record = next(c for c in json.loads((RESULTS / file).read_text())["checks"] if c["name"] == name)
        state = record["forecast_bytes"]["total"]
        act = activation_forecast(SMOLVLM_AS_MEASURED, train, step, vision)["peak"]
        measured = record["measured_peak_bytes"]
        rows.append(f"| `{name}` | {what} | {state / GIB:.2f} | {act / GIB:.2f} | {(state + act) / GIB:.2f} | "
                    f"{measured / GIB:.2f} | {(state + act) / measured:.3f} |")  # fmt: skip
    return rows


SMOLVLM_NOV28 = LmShapes(30, 576, 1536, 9, 3, 49_036)  # the vocabulary the 2026-11-28 records' forecasts were of
H200_NOV28 = [  # the memory lines of the second H200 run, the recipes as they are; each step as the record's own
    # forecast parts give it (tests/benchmarks/test_memory_pages.py checks they are reproduced exactly): 78 prompt
    # tokens (one crop), the data's captions of 9 tokens (MLE, SMILE), or the RL recipes' samples of 40
    ("memory:mle_vlm", "gpu_check_h200_2026-11-28_memory.json", Step(32, 78, 1, 9)),
    ("memory:smile_vlm", "gpu_check_h200_2026-11-28_memory.json", Step(32, 78, 1, 9, chunked=False)),
    ("memory:discritune_vlm", "gpu_check_h200_2026-11-28_memory.json", Step(100, 78, 1, 40)),
    ("memory:sr_l_vlm", "gpu_check_h200_2026-11-28_memory.json", Step(100, 78, 1, 40)),
    ("memory:sr_lv_bagcurri_vlm", "gpu_check_h200_2026-11-28_memory.json", Step(100, 78, 1, 40)),
    ("memory:grpo_cider_vlm", "gpu_check_h200_2026-11-28_memory_grpo.json", Step(16, 78, 8, 40, shared=True)),
]


def nov28_record(name: str, file: str) -> dict:
    return next(c for c in json.loads((RESULTS / file).read_text())["checks"] if c["name"] == name)


def nov28_forecast(name: str, step: Step) -> dict:
    """The activation forecast now of a 2026-11-28 memory line's step (its recipe's levers, batches padded)."""
    train = training_of(load(f"coco/{name.split(':')[1]}"))
    return activation_forecast(SMOLVLM_NOV28, train, step, SIGLIP_512)


def h200_nov28() -> list[str]:
    rows = ["| check | trains | step | weights + gradients + AdamW (exact) | forecast then | forecast now | "
            "measured CUDA peak | now / measured |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for name, file, step in H200_NOV28:
        record = nov28_record(name, file)
        state = record["forecast_bytes"]["total"]
        then = state + record["activation_forecast_bytes"]["peak"]
        now = state + nov28_forecast(name, step)["peak"]
        measured = record["measured_peak_bytes"]
        tower = training_of(load(f"coco/{name.split(':')[1]}")).tower
        trains = "LoRA on the language model" + (" and the vision tower" if tower != "frozen" else "")
        what = f"{step.images} x {step.captions} of {step.tokens} tokens" + (", prompt shared" if step.shared else "")
        rows.append(f"| `{name}` | {trains} | {what} | {state / GIB:.2f} | {then / GIB:.2f} | {now / GIB:.2f} | "
                    f"{measured / GIB:.2f} | {now / measured:.3f} |")  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--card-gb",
        type=float,
        default=CARD_80GB / 1e9,
        help="the card's memory the totals are held to, in GB (10^9 bytes)",
    )
    parser.add_argument("--h200", action="store_true", help="also the forecast of the H200 run's measured steps")
    args = parser.parse_args()
    print("\n".join(table(round(args.card_gb * 1e9))))
    if args.h200:
        print()
        print("\n".join(h200()))
        print()
        print("\n".join(h200_nov28()))


if __name__ == "__main__":
    main()
