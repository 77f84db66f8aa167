"""The trained vision tower's forecast (:func:`finecap.models.forecast.tower_layer_bytes`, a layer of the tower's
kind) against what autograd saves in every supported family's own tower, on the CPU, in a few seconds.

    .venv/bin/python benchmarks/tower_forecast.py

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
"""

from __future__ import annotations

import contextlib
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
    mlp_width,
    tower_autocast_bytes,
    tower_kind,
    tower_layer_bytes,
    tower_targets_of,
)
from finecap.models.tiny import tiny_family
from finecap.models.vlm import FAMILIES, Vlm

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import machine_line  # noqa: E402  (benchmarks/machine.py)

RANK = 8
LAYERS = 2  # a tower of LAYERS + 1 layers less one of LAYERS: the added layer's input requires grad
IMAGES = 4
WIDTHS = {"hidden": 64, "intermediate": 256, "heads": 4}
"""The towers' width, MLP width and heads (head width 16), in every family."""


def saved_bytes(forward: Any, excluded: set[int]) -> int:
    """Bytes of the distinct storages that ``forward()`` saves for backward, but those of ``excluded`` (data
    pointers: the model's parameters and buffers). Each is held until the end, so that no address is reused by a
    later one (a branch whose result is dropped, CLIP's pooled class token, frees its graph at once)."""
    storages: dict[int, torch.UntypedStorage] = {}  # by storage, not address: one address may hold two

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in excluded:
            storages[t.untyped_storage()._cdata] = t.untyped_storage()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward()
    return sum(s.nbytes() for s in storages.values())


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


def measure(family: str, layers: int, autocast: bool) -> dict[str, Any]:
    """What the prompt pass of :data:`IMAGES` images saves in ``family``'s tiny model with a tower of ``layers``
    layers trained with LoRA (module docstring), the patches its layers see, its tower's class and its adapters'
    targets."""
    model, processor = tiny_family(family)
    config = model.config
    widened(config.vision_config, layers)
    torch.manual_seed(0)
    model = type(model)._from_config(config, attn_implementation="sdpa").to(torch.bfloat16)
    vlm = Vlm(model, processor, train_encoder=True, train_lm=False, source=f"tiny:{family}")
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

    excluded = {t.untyped_storage().data_ptr() for t in [*vlm.parameters(), *vlm.buffers()]}
    try:
        saved = saved_bytes(forward, excluded)
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


def main() -> None:
    print(f"bytes one trained tower layer saves per patch (LoRA r{RANK}, bf16 base); {machine_line()}")
    print("\n".join(table()))


if __name__ == "__main__":
    main()
