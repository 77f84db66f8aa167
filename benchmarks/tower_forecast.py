"""The trained vision tower's forecast (:func:`finecap.models.forecast.tower_layer_bytes`, a layer of the tower's
kind) against what autograd saves in every supported family's own tower, on the CPU, in a few seconds; with
``--frozen``, the frozen tower's (:func:`finecap.models.forecast.frozen_tower_bytes`) against its forward pass's
allocation peak.

    .venv/bin/python benchmarks/tower_forecast.py [--frozen]

For each family of :data:`finecap.models.vlm.FAMILIES`: its tiny model (:func:`finecap.models.tiny.tiny_family`'s
config, the tower widened to :data:`WIDTHS` so that its MLP is 4 x its width, as in the real towers) in bf16, LoRA r8
on the family's default tower targets put on by finecap (:func:`finecap.models.lora.apply_lora` on a
:class:`finecap.models.vlm.Vlm`, the adapters then in float32 as ``model.trainable_dtype``), and the prompt pass of
:data:`IMAGES` images run up to the language model, with and without bf16 autocast. A layer's bytes are the saved
tensors (``saved_tensors_hooks``; parameters and buffers left out, each storage once) of a tower of
``LAYERS + 1`` layers less those of ``LAYERS`` layers, per patch the layers see (the tokens of their input: CLIP's
class token included), against the forecast for that layer: ``tower_layer_bytes`` + ``tower_autocast_bytes`` /
patches for a layer of the family's kind (:func:`finecap.models.forecast.tower_kind` of its vision config, as
``VisionShapes.of`` reads it), with ``Training.cpu`` (the CPU's LayerNorm: statistics in the input's dtype, bf16 under
autocast). Prints the table of docs/memory.md ("A trained vision tower").

``--frozen``: each family's tiny model as above, in bf16 and frozen (no adapters, eval mode), runs finecap's prompt
pass of :data:`FROZEN_IMAGES` images without gradient up to the projector (Qwen's merger: inside the tower, not run),
and torch's profiler records every allocation and free (``profile_memory=True``, as ``benchmarks/memory.py``'s
``allocation_peak``); the tower's peak is the largest running sum between its entry and its exit (or the projector)
less the sum at its entry: net of the weights and of its inputs, allocated before; and the same from the entry of the
model's ``get_image_features`` and from the model's own entry (its forward, as finecap's prompt pass calls it; net of
the batch's inputs), which also hold what the family makes of the pixels before the tower runs (Idefics3's bf16 copy,
LLaVA-NeXT's crops, Qwen's cast: :func:`pixel_copy_bytes`) and, from the model's entry, the prompt's embeddings
(``inputs_embeds``, bf16, the tiny language model's width). A peak at the smaller and
at the larger image count, differenced per patch, leaves out what does not grow with the patches (the CPU's oneDNN
scratch buffers, of the weights' size, which at these widths are as large as a layer's activations), against the
forecast's difference over the same patches (:func:`frozen_tower_bytes`; Pixtral's block mask grows as the
square); the larger count's peak per patch, not differenced, against the forecast's at that count (the fixed scratch
buffers then divided by the patches, not cancelled: a peak whose phase holds one at the smaller count only reads low
differenced); and the peak of a tower of ``LAYERS + 2`` layers less that of ``LAYERS`` layers, at the larger count (a
tower that kept every layer's output would grow)."""

from __future__ import annotations

import contextlib
import itertools
import sys
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from finecap.models import lora
from finecap.models.base import module_path
from finecap.models.forecast import (
    Training,
    VisionShapes,
    frozen_tower_bytes,
    mlp_width,
    pixel_copy_bytes,
    tower_autocast_bytes,
    tower_kind,
    tower_layer_bytes,
    tower_targets_of,
)
from finecap.models.tiny import tiny_family
from finecap.models.vlm import FAMILIES, Vlm

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_allocations import allocation_sizes  # noqa: E402  (benchmarks/cpu_allocations.py)
from machine import machine_line  # noqa: E402  (benchmarks/machine.py)
from saved_tensors import saved_bytes  # noqa: E402  (benchmarks/saved_tensors.py)

RANK = 8
LAYERS = 2  # a tower of LAYERS + 1 layers less one of LAYERS: the added layer's input requires grad
IMAGES = 4
WIDTHS = {"hidden": 64, "intermediate": 256, "heads": 4}
"""The towers' width, MLP width and heads (head width 16), in every family."""


def widened(vision: Any, layers: int) -> None:
    """Sets the tower config ``vision`` to ``layers`` layers of :data:`WIDTHS` (Qwen2-VL's ``embed_dim`` and
    ``mlp_ratio``; the others' ``hidden_size`` and ``intermediate_size``), in place."""
    h, i, heads = WIDTHS["hidden"], WIDTHS["intermediate"], WIDTHS["heads"]
    if hasattr(vision, "embed_dim"):  # Qwen2-VL: hidden_size is its merger's output
        vision.embed_dim, vision.mlp_ratio = h, i // h
    else:
        vision.hidden_size, vision.intermediate_size = h, i
    for key, value in {"num_hidden_layers": layers, "depth": layers, "num_attention_heads": heads,
                       "num_heads": heads, "head_dim": h // heads}.items():  # fmt: skip
        if hasattr(vision, key):
            setattr(vision, key, value)


class _Stop(Exception):
    """Stops the prompt pass where the language model would start."""


def tower_layers(tower: torch.nn.Module, layers: int) -> torch.nn.ModuleList:
    """The tower's list of ``layers`` encoder layers (``encoder.layers``, ``blocks``, ``transformer.layers``, ...)."""
    found = [m for m in tower.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == layers
             and type(m[0]).__name__.endswith(("Layer", "Block"))]  # fmt: skip
    if len(found) != 1:
        raise RuntimeError(f"{type(tower).__name__}: {len(found)} lists of {layers} encoder layers")
    return found[0]


def tiny_vlm(family: str, layers: int, train_encoder: bool) -> Vlm:
    """``family``'s tiny model with a tower of ``layers`` layers (:func:`widened`), random weights (seed 0) in bf16,
    sdpa attention, its language model frozen and its tower trained or not."""
    model, processor = tiny_family(family)
    config = model.config
    widened(config.vision_config, layers)
    torch.manual_seed(0)
    model = type(model)._from_config(config, attn_implementation="sdpa").to(torch.bfloat16)
    return Vlm(model, processor, train_encoder=train_encoder, train_lm=False, source=f"tiny:{family}")


def measure(family: str, layers: int, autocast: bool) -> dict[str, Any]:
    """What the prompt pass of :data:`IMAGES` images saves in ``family``'s tiny model with a tower of ``layers``
    layers trained with LoRA (module docstring), the patches its layers see, its tower's class and its adapters'
    targets."""
    vlm = tiny_vlm(family, layers, train_encoder=True)
    lora.apply_lora(vlm, "encoder", lora.LoraSpec(rank=RANK, alpha=RANK))
    tower = lora.unwrapped(vlm.lora_module("encoder"))
    for name, p in vlm.named_parameters():
        if "lora_" in name:
            p.data = p.data.float()
    vlm.train()
    g = torch.Generator().manual_seed(0)
    images = [Image.fromarray((torch.rand(16, 16, 3, generator=g) * 255).byte().numpy()) for _ in range(IMAGES)]
    prompt = vlm.prompt_of(vlm._images.preprocess(images))
    seen: list[int] = []
    first = tower_layers(tower, layers)[0]
    hidden = WIDTHS["hidden"]
    handles = [
        first.register_forward_pre_hook(
            lambda _m, args, kwargs: seen.append((args[0] if args else kwargs["hidden_states"]).numel() // hidden),
            with_kwargs=True,
        ),
        module_path(vlm.model, vlm.family.language_model).register_forward_pre_hook(
            lambda *_: (_ for _ in ()).throw(_Stop())
        ),
    ]

    def forward() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), contextlib.suppress(_Stop):
            vlm.prompt_pass(prompt, use_cache=False)

    try:
        saved = saved_bytes(forward, vlm)
    finally:
        for handle in handles:
            handle.remove()
    targets = sorted({n.split(".")[-1] for n, m in tower.named_modules() if lora.is_lora_layer(m)})
    vision = vlm.model.config.vision_config
    width = mlp_width(vision, hidden)  # GLM-4.1V's: its out_hidden_size
    return {"saved": saved, "patches": seen[0], "tower": type(tower).__name__, "targets": targets, "mlp": width,
            "kind": tower_kind(vision)}  # fmt: skip


def row(family: str, autocast: bool) -> tuple[str, int, float, float]:
    """``family``'s tower class, the patches its layers see, and one layer's bytes per patch, measured and forecast
    (module docstring), with or without ``autocast``."""
    fewer, more = measure(family, LAYERS, autocast), measure(family, LAYERS + 1, autocast)
    patches = more["patches"]
    vision = VisionShapes(WIDTHS["hidden"], more["mlp"], patches, 0, LAYERS + 1, WIDTHS["heads"], **more["kind"])
    train = Training(tower="lora", weights_bytes=2, autocast=autocast, rank=RANK, cpu=True,
                     tower_targets=tower_targets_of(FAMILIES[family].vision_targets))  # fmt: skip
    forecast = tower_layer_bytes(vision, train) + tower_autocast_bytes(vision, train) / patches
    return more["tower"], patches, (more["saved"] - fewer["saved"]) / patches, forecast


def table(families: tuple[str, ...] = tuple(sorted(FAMILIES))) -> list[str]:
    """The table of docs/memory.md: per family, one trained tower layer's bytes per patch, measured and forecast,
    in bf16 and under bf16 autocast."""
    rows = ["| family | tower class | patches | bf16: measured | forecast | forecast / measured "
            "| autocast: measured | forecast | forecast / measured |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for family in families:
        tower, patches, measured, forecast = row(family, False)
        _, _, cast_measured, cast_forecast = row(family, True)
        rows.append(f"| `{family}` | `{tower}` | {patches} | {measured:.1f} | {forecast:.1f} | "
                    f"{forecast / measured:.3f} | {cast_measured:.1f} | {cast_forecast:.1f} | "
                    f"{cast_forecast / cast_measured:.3f} |")  # fmt: skip
    return rows


FROZEN_IMAGES = (16, 64)
"""The image counts whose frozen-tower peaks are differenced (16 x 16 pixels each: 16 patches in most families)."""
_MARKS = (700_001, 700_003, 700_005, 700_007, 700_009)
"""Sizes of the byte tensors the hooks allocate and drop at once to mark, among the profiler's events (set to 0 in
the running sum), the entry of ``get_image_features``, the tower's entry, its exit, the projector's entry and the
model's own entry (its forward, as finecap's prompt pass calls it)."""


def _mark(size: int) -> Any:
    """A hook that allocates ``size`` bytes and drops them (a marker among the profiler's events)."""

    def hook(*_: Any) -> None:
        torch.empty(size, dtype=torch.uint8)

    return hook


def frozen_peak(family: str, layers: int, images: int) -> dict[str, Any]:
    """The frozen tower's forward peak in ``family``'s tiny model (module docstring) with ``layers`` layers over
    ``images`` images, the patches its layers see, its class, its kind (:func:`tower_kind`) and its shapes as finecap's
    forecast reads them (:meth:`VisionShapes.of`: an image's pixels and patches, ``layers``, the pixels' copy)."""
    vlm = tiny_vlm(family, layers, train_encoder=False)
    vlm.eval()
    g = torch.Generator().manual_seed(0)
    pictures = [Image.fromarray((torch.rand(16, 16, 3, generator=g) * 255).byte().numpy()) for _ in range(images)]
    prompt = vlm.prompt_of(vlm._images.preprocess(pictures))
    tower = module_path(vlm.model, vlm.family.vision)
    seen: list[int] = []
    hidden = WIDTHS["hidden"]
    call, enter, leave, stop, model_entry = _MARKS
    vlm.model.register_forward_pre_hook(_mark(model_entry))
    tower.register_forward_pre_hook(_mark(enter))
    tower.register_forward_hook(_mark(leave))
    inner = vlm.model.model
    features = inner.get_image_features

    def get_image_features(*args: Any, **kwargs: Any) -> Any:
        _mark(call)()
        return features(*args, **kwargs)

    inner.get_image_features = get_image_features
    tower_layers(tower, layers)[0].register_forward_pre_hook(
        lambda _m, args, kwargs: seen.append((args[0] if args else kwargs["hidden_states"]).numel() // hidden),
        with_kwargs=True,
    )

    def halt(*args: Any) -> None:
        _mark(stop)(*args)
        raise _Stop

    module_path(vlm.model, vlm.family.projector).register_forward_pre_hook(halt)
    module_path(vlm.model, vlm.family.language_model).register_forward_pre_hook(halt)

    def forward() -> None:
        with torch.no_grad(), contextlib.suppress(_Stop):
            vlm.prompt_pass(prompt, use_cache=False)

    forward()  # warm-up: lazily built buffers and hooks
    seen.clear()
    sizes = allocation_sizes(forward)
    running = list(itertools.accumulate((0 if abs(n) in _MARKS else n for n in sizes), initial=0))
    end = min(sizes.index(m) for m in (leave, stop) if m in sizes)
    peaks = {}
    for key, mark in (("peak", enter), ("call", call), ("entry", model_entry)):
        start = sizes.index(mark)
        peaks[key] = max(running[start : end + 1]) - running[start]
    config = vlm.model.config
    return {**peaks, "patches": seen[0], "tower": type(tower).__name__, "kind": tower_kind(config.vision_config),
            "shapes": VisionShapes.of(config, prompt.images["pixel_values"], images),
            "embedded": prompt.ids.numel() * config.text_config.hidden_size * 2}  # fmt: skip


def frozen_row(family: str) -> dict[str, Any]:
    """``family``'s frozen tower: its class, kind, the patches of the two image counts, the peak's growth per patch
    between them, measured and forecast (now and by the count it replaced), and the peak's growth from ``LAYERS`` to
    ``LAYERS + 2`` layers."""
    few, many = (frozen_peak(family, LAYERS, n) for n in FROZEN_IMAGES)
    deeper = frozen_peak(family, LAYERS + 2, FROZEN_IMAGES[-1])
    vision = many["shapes"]  # an image's patches: pixel_copy_bytes counts the selected images' bool patch mask
    h, i = vision.hidden, vision.intermediate
    extra = many["patches"] - few["patches"]
    copies = (FROZEN_IMAGES[-1] - FROZEN_IMAGES[0]) * pixel_copy_bytes(vision, 2) / extra  # per patch, in bf16
    embeds = (many["embedded"] - few["embedded"]) / extra  # the prompt's embeddings, bf16

    def per_patch(count: Any) -> float:
        return (count(many["patches"]) - count(few["patches"])) / extra

    return {"tower": many["tower"], "kind": many["kind"], "patches": (few["patches"], many["patches"]),
            "measured": (many["peak"] - few["peak"]) / extra, "call": (many["call"] - few["call"]) / extra,
            "entry": (many["entry"] - few["entry"]) / extra, "copies": copies, "embeds": embeds,
            "shapes": vision,
            "forecast": per_patch(lambda n: frozen_tower_bytes(vision, 2, n)),
            "whole": many["peak"] / many["patches"],  # the larger count's peak, not differenced
            "whole_forecast": frozen_tower_bytes(vision, 2, many["patches"]) / many["patches"],
            "before": per_patch(lambda n: n * (5 * h + 2 * i) * 2),  # the count until 2026-11-28: 5h + 2i
            "deeper": deeper["peak"] - many["peak"]}  # fmt: skip


def frozen_table(families: tuple[str, ...] = tuple(sorted(FAMILIES))) -> list[str]:
    """The frozen tower's table of docs/memory.md: per family, the peak's bytes per patch, measured and forecast."""
    rows = ["| family | tower class | kind | patches | measured | forecast | forecast / measured "
            "| at the larger count | forecast / it "
            "| before | before / measured | 2 more layers | `get_image_features` | pixel copy | the model's entry "
            "| forecast / it | + pixel copies | + prompt embeddings | (forecast + both) / it |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: "
            "| ---: | ---: | ---: | ---: |"]  # fmt: skip
    for family in families:
        r = frozen_row(family)
        kind = ", ".join(str(v) if not isinstance(v, bool) else k for k, v in r["kind"].items() if v)
        rows.append(f"| `{family}` | `{r['tower']}` | {kind} | {r['patches'][0]} -> {r['patches'][1]} | "
                    f"{r['measured']:.0f} | {r['forecast']:.0f} | {r['forecast'] / r['measured']:.2f} | "
                    f"{r['whole']:.0f} | {r['whole_forecast'] / r['whole']:.2f} | "
                    f"{r['before']:.0f} | {r['before'] / r['measured']:.2f} | {r['deeper']:+d} B | {r['call']:.0f} | "
                    f"{r['shapes'].pixel_copy} | {r['entry']:.0f} | {r['forecast'] / r['entry']:.2f} | "
                    f"{r['copies']:.0f} | {r['embeds']:.0f} | "
                    f"{(r['forecast'] + r['copies'] + r['embeds']) / r['entry']:.2f} "
                    "|")  # fmt: skip
    return rows


def main() -> None:
    if "--frozen" in sys.argv[1:]:
        print(f"bytes a frozen bf16 tower's forward peak grows by per patch (without gradient); {machine_line()}")
        print("\n".join(frozen_table()))
        return
    print(f"bytes one trained tower layer saves per patch (LoRA r{RANK}, bf16 base); {machine_line()}")
    print("\n".join(table()))


if __name__ == "__main__":
    main()
