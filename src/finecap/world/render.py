"""Render scenes with Pillow: textured muted backgrounds, saturated outlined objects, deterministic.

Geometry is defined in unit coordinates (the image is the unit square, a grid cell is 1/3) and scaled to the
requested size, so nothing depends on the default 64 px. Images are drawn ``SUPERSAMPLE``-times larger (at least
256 px) and box-downscaled by that integer factor (``Image.reduce``) for clean, antialiased edges.

Sizes (chosen so that a small encoder can tell every shape apart at 64 px, where a cell is ~21 px): a large object
spans ~0.9 of a cell, a small one ~0.6. Each object lies inside its own cell, outline included, so no object hides or
is hidden by another and none is cut by the image border (tests check both from the pixels). Every object gets a thin
dark outline, so saturated object colours stay visible on every (muted) background, including green on grass and blue
on water. Patterns are drawn in a darker shade of the object colour (stripes ~54% of the area, dots ~23%: shares of the
full-canvas masks), so the colour stays recognisable.

Background texture varies with the scene id (a random crop of a per-kind texture tile), never with anything else;
the same scene and size always give the same pixels.
"""

from __future__ import annotations

import math
import random
from functools import lru_cache

from PIL import Image, ImageDraw

from finecap.world.scene import GRID, Obj, Scene

COLOR_RGB: dict[str, tuple[int, int, int]] = {
    "red": (225, 30, 35),
    "orange": (255, 140, 0),
    "yellow": (255, 228, 0),
    "green": (30, 200, 50),
    "cyan": (0, 215, 225),
    "blue": (35, 75, 235),
    "purple": (140, 45, 205),
    "pink": (255, 120, 200),
}
BACKGROUND_RGB: dict[str, tuple[int, int, int]] = {
    "grass": (92, 124, 66),
    "sand": (205, 186, 142),
    "water": (66, 102, 140),
    "snow": (222, 226, 234),
    "brick": (162, 58, 48),
    "wood": (140, 108, 62),
}
OUTLINE_RGB = (20, 20, 24)
SIZE_EXTENT = {"large": 0.9, "small": 0.6}
"""Object extent (bounding diameter) as a fraction of a grid cell."""
SUPERSAMPLE = 3
MIN_CANVAS = 256


def _canvas_size(size: int) -> int:
    return size * max(SUPERSAMPLE, math.ceil(MIN_CANVAS / size))


def _shade(rgb: tuple[int, int, int], f: float) -> tuple[int, int, int]:
    return tuple(int(round(c * f)) for c in rgb)  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------------------------------
# Shapes: polygons in unit-circle coordinates (radius 1 = half the object extent), y grows downwards.
# ---------------------------------------------------------------------------------------------------------------------


def _star(points: int = 5, inner: float = 0.48) -> list[tuple[float, float]]:
    out = []
    for k in range(2 * points):
        r = 1.0 if k % 2 == 0 else inner
        a = -math.pi / 2 + k * math.pi / points
        out.append((r * math.cos(a), r * math.sin(a) + 0.08))
    return out


def _triangle() -> list[tuple[float, float]]:
    # Equilateral, pointing up, circumradius 1.1, shifted down so its bounding box is centred.
    r = 1.1
    pts = [(r * math.cos(a), r * math.sin(a)) for a in (-math.pi / 2, math.pi / 6, 5 * math.pi / 6)]
    dy = -(pts[0][1] + pts[1][1]) / 2
    return [(x, y + dy) for x, y in pts]


_ARM = 0.34
SHAPE_POLYGONS: dict[str, list[tuple[float, float]]] = {
    "square": [(-0.82, -0.82), (0.82, -0.82), (0.82, 0.82), (-0.82, 0.82)],
    "triangle": _triangle(),
    "star": _star(),
    "cross": [
        (-_ARM, -1), (_ARM, -1), (_ARM, -_ARM), (1, -_ARM), (1, _ARM), (_ARM, _ARM),
        (_ARM, 1), (-_ARM, 1), (-_ARM, _ARM), (-1, _ARM), (-1, -_ARM), (-_ARM, -_ARM),
    ],
    "diamond": [(0, -1), (0.72, 0), (0, 1), (-0.72, 0)],
}  # fmt: skip
"""Polygon outlines; ``circle`` is drawn as an ellipse of radius 1."""


def _shape_xy(shape: str, cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    return [(cx + x * r, cy + y * r) for x, y in SHAPE_POLYGONS[shape]]


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float, **kw) -> None:
    if shape == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), **kw)
    else:
        draw.polygon(_shape_xy(shape, cx, cy, r), **kw)


# ---------------------------------------------------------------------------------------------------------------------
# Textures
# ---------------------------------------------------------------------------------------------------------------------


@lru_cache(maxsize=32)
def _texture_tile(kind: str, s: int) -> Image.Image:
    """A ``2s x 2s`` texture of background ``kind`` for canvas side ``s`` (fixed seed per kind)."""
    t = 2 * s
    base = BACKGROUND_RGB[kind]
    img = Image.new("RGB", (t, t), base)
    d = ImageDraw.Draw(img)
    rng = random.Random(f"texture-{kind}")
    u = s / 64.0  # one pixel of a 64 px image
    if kind == "grass":
        for _ in range(int(900 * 4)):
            x, y = rng.uniform(0, t), rng.uniform(0, t)
            h = rng.uniform(2, 4) * u
            dx = rng.uniform(-1, 1) * u
            col = _shade(base, rng.choice([0.82, 0.9, 1.12]))
            d.line((x, y, x + dx, y - h), fill=col, width=max(1, int(0.6 * u)))
    elif kind == "sand":
        for _ in range(int(700 * 4)):
            x, y = rng.uniform(0, t), rng.uniform(0, t)
            rr = rng.uniform(0.3, 0.6) * u
            d.ellipse((x - rr, y - rr, x + rr, y + rr), fill=_shade(base, rng.choice([0.88, 0.93, 1.05])))
    elif kind == "water":
        step = 5 * u
        y0 = 0.0
        while y0 < t + step:
            phase = rng.uniform(0, 2 * math.pi)
            pts = [(x, y0 + 1.2 * u * math.sin(x / (6 * u) + phase)) for x in range(0, t + 1, max(1, int(u)))]
            d.line(pts, fill=_shade(base, 1.22), width=max(1, int(0.7 * u)))
            y0 += step
    elif kind == "snow":
        for _ in range(int(250 * 4)):
            x, y = rng.uniform(0, t), rng.uniform(0, t)
            rr = rng.uniform(0.6, 1.6) * u
            d.ellipse((x - rr, y - rr, x + rr, y + rr), fill=_shade(base, rng.choice([0.93, 0.96])))
    elif kind == "brick":
        mortar = (172, 156, 146)
        bh, bw, w = 5 * u, 10 * u, max(1, int(0.8 * u))
        row = 0
        y = 0.0
        while y < t:
            d.line((0, y, t, y), fill=mortar, width=w)
            x = (row % 2) * bw / 2
            while x < t:
                d.line((x, y, x, y + bh), fill=mortar, width=w)
                x += bw
            y += bh
            row += 1
    elif kind == "wood":
        y = 0.0
        while y < t:
            y += rng.uniform(1.5, 3.5) * u
            phase = rng.uniform(0, 2 * math.pi)
            pts = [(x, y + 0.8 * u * math.sin(x / (14 * u) + phase)) for x in range(0, t + 1, max(1, int(2 * u)))]
            d.line(pts, fill=_shade(base, rng.choice([0.8, 0.88, 1.1])), width=max(1, int(0.6 * u)))
    else:
        raise ValueError(f"unknown background {kind!r}; valid: {', '.join(BACKGROUND_RGB)}")
    return img


@lru_cache(maxsize=8)
def _pattern_masks(s: int) -> dict[str, Image.Image]:
    """Full-canvas masks (255 = pattern colour) of diagonal stripes and a dot lattice; period ~0.2 of a cell."""
    cell = s / GRID
    stripes = Image.new("L", (s, s), 0)
    d = ImageDraw.Draw(stripes)
    period = 0.2 * cell
    width = 0.35 * period
    k = -s
    while k < 2 * s:
        # A band along y = x - k (45 degrees), drawn as a polygon of horizontal width 2 * width.
        d.polygon([(k, 0), (k + 2 * width, 0), (k + 2 * width + s, s), (k + s, s)], fill=255)
        k += period * math.sqrt(2)
    dots = Image.new("L", (s, s), 0)
    d = ImageDraw.Draw(dots)
    step = 0.2 * cell
    rr = 0.25 * step
    y, j = step / 2, 0
    while y < s:
        x = step / 2 + (j % 2) * step / 2
        while x < s:
            d.ellipse((x - rr, y - rr, x + rr, y + rr), fill=255)
            x += step
        y += step
        j += 1
    return {"striped": stripes, "dotted": dots}


# ---------------------------------------------------------------------------------------------------------------------


def object_box(o: Obj) -> tuple[float, float, float]:
    """Centre (x, y) and radius of an object in unit image coordinates."""
    cell = 1.0 / GRID
    return (o.col + 0.5) * cell, (o.row + 0.5) * cell, SIZE_EXTENT[o.size] * cell / 2


def render(scene: Scene, size: int) -> Image.Image:
    """Render ``scene`` as an RGB ``size x size`` image (deterministic in the scene and size)."""
    s = _canvas_size(size)
    rng = random.Random(f"render-{scene.id}-{scene.background}")
    ox, oy = rng.randrange(s), rng.randrange(s)
    img = _texture_tile(scene.background, s).crop((ox, oy, ox + s, oy + s))
    masks = _pattern_masks(s)
    draw = ImageDraw.Draw(img)
    outline = max(1, round(s * 0.012))
    for o in scene.objects:
        cx, cy, r = (v * s for v in object_box(o))
        fill = COLOR_RGB[o.color]
        if o.pattern is None:
            _draw_shape(draw, o.shape, cx, cy, r, fill=fill, outline=OUTLINE_RGB, width=outline)
            continue
        # Work in the object's bounding box only (pattern masks are full-canvas, so the stripes line up).
        x0, y0 = max(0, int(cx - r * 1.2)), max(0, int(cy - r * 1.2))
        x1, y1 = min(s, int(cx + r * 1.2) + 1), min(s, int(cy + r * 1.2) + 1)
        box = (x0, y0, x1, y1)
        mask = Image.new("L", (x1 - x0, y1 - y0), 0)
        _draw_shape(ImageDraw.Draw(mask), o.shape, cx - x0, cy - y0, r, fill=255)
        layer = Image.new("RGB", mask.size, fill)
        layer.paste(_shade(fill, 0.4), mask=masks[o.pattern].crop(box))
        img.paste(layer, box, mask=mask)
        _draw_shape(draw, o.shape, cx, cy, r, outline=OUTLINE_RGB, width=outline)
    if s != size:
        img = img.reduce(s // size)  # box-filter downscale by the integer supersampling factor (antialiasing)
    return img
