"""``vlm.image_max_pixels``: one family-independent pixel budget per image (LLaMA-Factory's name), mapped per family
to its own processor's option.

The budget is the most pixels one image may send through the vision tower, every crop, tile or grid cell counted. It
is a cap: a budget above what the processor already does changes nothing, and the processor's own defaults stay
wherever the budget needs no option. Each family names its rule (:attr:`finecap.models.vlm.Family.image_budget`),
one function of :data:`RULES` from the processor (its own settings, read from the checkpoint: :func:`setting`) and
the budget to the processor options that respect it:

- ``"pixels"`` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): ``size.longest_edge`` (Qwen's ``max_pixels``) = the budget;
- ``"frames"`` (GLM-4V): the same, counted over the ``temporal_patch_size`` frames GLM-4V's bound includes;
- ``"edge"`` (Pixtral, Mistral 3): ``size.longest_edge`` = the side of a square of that many pixels (a processor
  whose size has no ``longest_edge``, LLaVA-1.5's CLIP crop, is ``"fixed"``);
- ``"crops"`` (SmolVLM, Idefics3): ``n x n`` crops of ``max_image_size`` plus the global image: ``size.longest_edge``
  = ``n`` crops' side, or ``do_image_splitting=False`` (one crop) below 2 x 2 crops + 1;
- ``"splitting"`` (Idefics2): no splitting (4 crops + the image) below 5 images, a smaller ``size`` below one;
- ``"tiles"`` (InternVL): ``max_patches`` tiles plus the thumbnail, or ``max_patches=min_patches=1`` (one tile, no
  thumbnail: what ``crop_to_patches=False`` gives, in options a saved processor keeps, :func:`call_defaults`);
- ``"grid"`` (LLaVA-NeXT, LLaVA-OneVision): ``image_grid_pinpoints`` kept to the grids that fit with the base
  image (at least the smallest); the model reads the same list (:func:`finecap.models.vlm.Vlm` sets both);
- ``"fixed"`` (Gemma 3, LLaVA-1.5): the processor resizes every image to one size: nothing to map; a budget below it
  is a warning naming that size.

A rule never goes below one crop, tile or grid: the smallest input the vision tower takes. User keys in
``vlm.processor_kwargs`` win over the budget's, key by key, within a ``size`` too (:func:`budget_kwargs`). A lower
bound over an upper one (:data:`LIMITS`: ``vlm.processor_kwargs={min_pixels: 2048}`` under
``vlm.image_max_pixels=256`` on Qwen) is an error naming both options (:func:`check_limits`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any


def setting(processor: Any, key: str) -> Any:
    """What a processor call uses for the image option ``key`` when not given it: the processor's own image defaults
    (its class's ``images_kwargs`` and ``_defaults``, which transformers passes over the image processor's, e.g.
    InternVL's ``crop_to_patches=True``), else the image processor's attribute (from the checkpoint)."""
    defaults = call_defaults(processor)
    return defaults[key] if key in defaults else getattr(processor.image_processor, key, None)


def call_defaults(processor: Any) -> dict[str, Any]:
    """The image options a processor call passes over the image processor's own settings when not given them: its
    class's ``images_kwargs`` and ``_defaults`` (InternVL's ``crop_to_patches=True``, Gemma 3's
    ``do_pan_and_scan=False``). A saved processor does not keep them: a plain ``AutoProcessor.from_pretrained`` of
    it uses its class's again."""
    kwargs_class = getattr(processor, "valid_processor_kwargs", None)
    return {**(getattr(processor, "images_kwargs", None) or {}),
            **getattr(kwargs_class, "_defaults", {}).get("images_kwargs", {})}  # fmt: skip


def unsaved_options(processor: Any, options: dict[str, Any]) -> dict[str, Any]:
    """The ``options`` (a run's processor call options) that a saved processor cannot carry: those the processor
    class's :func:`call_defaults` set to another value, which a plain load of the saved processor passes over any
    image-processor setting. ``{}`` when a plain load reads images as the run did."""
    defaults = call_defaults(processor)
    return {k: v for k, v in options.items() if k in defaults and defaults[k] != v}


def own_size(processor: Any, key: str = "size") -> dict[str, int]:
    """The processor's ``size`` (or ``key``) as a plain dict (:func:`setting`), unset keys left out (transformers 5's
    ``SizeDict``)."""
    try:
        return {k: v for k, v in dict(setting(processor, key)).items() if v is not None}
    except (TypeError, ValueError):
        return {}


def pixels(processor: Any, budget: int, frames: int = 1) -> dict[str, Any]:
    size = own_size(processor)
    cap = budget * frames
    if "longest_edge" not in size or cap >= size["longest_edge"]:
        return {}
    return {"size": {**size, "longest_edge": cap, "shortest_edge": min(size.get("shortest_edge", cap), cap)}}


def frames(processor: Any, budget: int) -> dict[str, Any]:
    return pixels(processor, budget, int(setting(processor, "temporal_patch_size") or 1))


def edge(processor: Any, budget: int) -> dict[str, Any]:
    size = own_size(processor)
    if set(size) != {"longest_edge"}:
        return fixed(processor, budget)
    side = math.isqrt(budget)
    return {"size": {"longest_edge": side}} if side < size["longest_edge"] else {}


def crops(processor: Any, budget: int) -> dict[str, Any]:
    if not setting(processor, "do_image_splitting"):
        return {}  # one crop already: the least the vision tower takes
    crop = own_size(processor, "max_image_size")["longest_edge"]
    n = math.isqrt(max(budget // (crop * crop) - 1, 0))  # n x n crops + the global image
    if n <= 1:
        return {"do_image_splitting": False}
    longest = own_size(processor).get("longest_edge")
    return {"size": {"longest_edge": n * crop}} if longest is None or n * crop < longest else {}


def splitting(processor: Any, budget: int) -> dict[str, Any]:
    size = own_size(processor)
    side = size.get("longest_edge", 0)
    out: dict[str, Any] = {}
    if setting(processor, "do_image_splitting") and budget < 5 * side * side:  # 4 crops + the image
        out["do_image_splitting"] = False
    if budget < side * side:
        cap = math.isqrt(budget)
        out["size"] = {**size, "longest_edge": cap, "shortest_edge": min(size.get("shortest_edge", cap), cap)}
    return out


def tiles(processor: Any, budget: int) -> dict[str, Any]:
    if not setting(processor, "crop_to_patches"):
        return {}  # one tile
    tile = own_size(processor)
    allowed = budget // (tile["height"] * tile["width"]) - 1  # tiles besides the thumbnail
    if allowed <= 1:  # one tile, in options the saved image processor keeps (crop_to_patches is a call default)
        return {"max_patches": 1, "min_patches": 1}
    most, least = setting(processor, "max_patches"), setting(processor, "min_patches")
    return {"max_patches": allowed, "min_patches": min(least, allowed)} if allowed < most else {}


def grid(processor: Any, budget: int) -> dict[str, Any]:
    base = own_size(processor, "crop_size") or own_size(processor)
    base_pixels = base.get("height", 0) * base.get("width", 0)
    pinpoints = [list(p) for p in setting(processor, "image_grid_pinpoints")]
    kept = [p for p in pinpoints if p[0] * p[1] + base_pixels <= budget]
    if not kept:  # at least the smallest grids
        least = min(p[0] * p[1] for p in pinpoints)
        kept = [p for p in pinpoints if p[0] * p[1] == least]
    return {"image_grid_pinpoints": kept} if kept != pinpoints else {}


def fixed(processor: Any, budget: int) -> dict[str, Any]:
    size = own_size(processor, "crop_size") if setting(processor, "do_center_crop") else own_size(processor)
    if "height" in size and "width" in size and size["height"] * size["width"] > budget:
        warnings.warn(
            f"vlm.image_max_pixels={budget}: {type(processor.image_processor).__name__} resizes every image to "
            f"{size['height']}x{size['width']} ({size['height'] * size['width']} pixels) and has no option for fewer",
            stacklevel=2,
        )
    return {}


RULES: dict[str, Callable[[Any, int], dict[str, Any]]] = {
    "pixels": pixels, "frames": frames, "edge": edge, "crops": crops, "splitting": splitting, "tiles": tiles,
    "grid": grid, "fixed": fixed,
}  # fmt: skip
"""Budget rules by name (the module docstring): ``rule(processor, budget) -> processor options``."""


def budget_kwargs(rule: str, processor: Any, budget: int | None, given: dict[str, Any]) -> dict[str, Any]:
    """The processor options of a family's ``rule`` for ``budget`` pixels (``vlm.image_max_pixels``; ``None``: none)
    under the user's ``given`` (``vlm.processor_kwargs``), which win key by key, and within a dict-valued option
    (``size``) key by key too: a given ``size: {shortest_edge: ...}`` keeps the budget's ``longest_edge``."""
    if budget is None:
        return dict(given)
    ruled = RULES[rule](processor, int(budget))
    merged = {k: {**ruled[k], **v} for k, v in given.items() if isinstance(v, dict) and isinstance(ruled.get(k), dict)}
    return {**ruled, **given, **merged}


PIXEL_BOUNDS = {"max_pixels": "longest_edge", "min_pixels": "shortest_edge"}
"""Qwen2-VL's pixel bounds and the keys of its ``size`` that transformers 5 reads them from: a processor call given
``max_pixels`` warns that it is deprecated ("pass size={'longest_edge': ...}"); finecap passes them in ``size``
(:func:`finecap.models.vlm.processor_call_kwargs`)."""

LIMITS = (("size.shortest_edge", "size.longest_edge"), ("min_patches", "max_patches"))
"""Processor options bounding one quantity from below and from above: Qwen's and GLM-4V's pixels (``min_pixels``
/ ``max_pixels``, kept in ``size``), Idefics2's edges, InternVL's tiles. No processor applies a lower bound over its
upper one as given: Qwen and GLM-4V apply the cap and ignore the minimum, Idefics2 the minimum over the cap,
InternVL finds no tile grid between them and takes one tile."""


def check_limits(processor: Any, budget: int | None, ruled: dict[str, Any], given: dict[str, Any],
                 options: dict[str, Any]) -> None:  # fmt: skip
    """Refuse contradictory bounds (:data:`LIMITS`) among a processor call's ``options`` (as the call gets them:
    ``max_pixels`` / ``min_pixels`` moved into ``size``) and, where those lack one, the processor's own setting: a
    lower bound over its upper bound set by ``vlm.image_max_pixels`` (``budget``, whose rule gave ``ruled``) or
    ``vlm.processor_kwargs`` (``given``) is a ``ValueError`` naming the option that set each (two contradictory
    settings of the checkpoint's own processor are its own, and left to it)."""
    name = type(getattr(processor, "image_processor", processor)).__name__
    for low, high in LIMITS:
        least, most = limit(processor, options, low), limit(processor, options, high)
        if least is None or most is None or least <= most:
            continue
        origins = [
            origin(processor, budget, ruled, given, path, value) for path, value in ((low, least), (high, most))
        ]
        if all(o is None for o in origins):
            continue
        first, second = (o or f"{name}'s own {p}={v}" for o, p, v in zip(origins, (low, high), (least, most)))
        raise ValueError(
            f"{first} is over {second}: a lower bound over the upper one, which {name} does not apply as given; "
            "lower the first or raise the second"
        )


def limit(processor: Any, options: dict[str, Any], path: str) -> Any:
    """The value of ``path`` (``"max_patches"``, or ``"size.longest_edge"`` in a dict option) in a call given
    ``options``: theirs, else the processor's own (:func:`setting`, :func:`own_size`); ``None`` when unset."""
    key, _, sub = path.partition(".")
    if not sub:
        return options[key] if key in options else setting(processor, key)
    values = options[key] if isinstance(options.get(key), dict) else own_size(processor, key)
    return values.get(sub)


def origin(processor: Any, budget: int | None, ruled: dict[str, Any], given: dict[str, Any], path: str,
           value: Any) -> str | None:  # fmt: skip
    """The option that sets ``path`` to ``value`` in the call, as an error names it: ``vlm.processor_kwargs.<key>``
    (Qwen's ``max_pixels`` / ``min_pixels`` for ``size``'s edges), else ``vlm.image_max_pixels`` where its rule's
    options (``ruled``) changed the processor's own value; ``None``: the processor's own setting."""
    key, _, sub = path.partition(".")
    alias = next((k for k, edge in PIXEL_BOUNDS.items() if sub and key == "size" and edge == sub), None)
    if alias in given:
        return f"vlm.processor_kwargs.{alias}={given[alias]}"
    if (sub and isinstance(given.get(key), dict) and sub in given[key]) or (not sub and key in given):
        return f"vlm.processor_kwargs.{path}={value}"
    ruled_value = ruled.get(key, {}).get(sub) if sub and isinstance(ruled.get(key), dict) else ruled.get(key)
    own = limit(processor, {}, path)
    if budget is not None and ruled_value is not None and ruled_value == value and ruled_value != own:
        return f"vlm.image_max_pixels={budget} ({path}={value})"
    return None
