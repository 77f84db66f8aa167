import re

import numpy as np
import pytest
from PIL import Image

from finecap.config import WorldConfig
from finecap.world.make import generate_scenes
from finecap.world.render import BACKGROUND_RGB, COLOR_RGB, object_box, render
from finecap.world.scene import BACKGROUNDS, COLORS, SHAPES, Obj, Scene, scene_diff


def _scene(**kw) -> Scene:
    objs = kw.pop("objects", [Obj("circle", "red", "large", 1, 1)])
    return Scene(kw.pop("id", 0), kw.pop("background", "grass"), objs)


@pytest.mark.parametrize("size", [16, 33, 64, 96])
def test_render_size_mode_and_determinism(size):
    scene = _scene(objects=[Obj("star", "blue", "large", 0, 0, "striped"), Obj("cross", "pink", "small", 2, 2)])
    a, b = render(scene, size), render(scene, size)
    assert a.mode == "RGB" and a.size == (size, size)
    assert np.array_equal(np.asarray(a), np.asarray(b))


def test_background_texture_varies_with_id_only():
    a, b = render(_scene(id=1), 64), render(_scene(id=2), 64)
    assert not np.array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("size", [64, 96])
def test_every_shape_and_colour_fills_its_cell_centre(size):
    for i, shape in enumerate(SHAPES):
        for j, color in enumerate(COLORS):
            obj = Obj(shape, color, "small", (i + j) % 3, j % 3)
            img = np.asarray(render(Scene(i, BACKGROUNDS[j % len(BACKGROUNDS)], [obj]), size)).astype(int)
            cx, cy, _ = object_box(obj)
            y, x = int(cy * size), int(cx * size)
            patch = img[y - 1 : y + 2, x - 1 : x + 2].reshape(-1, 3).mean(0)
            assert np.abs(patch - COLOR_RGB[color]).max() < 40, (shape, color, patch)


def test_object_sizes_scale_with_the_cell():
    # Count object pixels (colour far from the background) of a large and a small square in the middle cell.
    def area(size_word: str, px: int) -> float:
        img = np.asarray(render(_scene(background="snow", objects=[Obj("square", "blue", size_word, 1, 1)]), px))
        diff = np.abs(img.astype(int) - np.array(BACKGROUND_RGB["snow"])).sum(-1)
        return (diff > 120).mean()

    for px in (64, 96):
        # square half side 0.82 * radius; radius = extent * cell / 2 with cell = 1/3 of the image:
        # large: side = 0.82 * 0.9 / 3 = 0.246 -> area 0.0605; small: 0.82 * 0.6 / 3 = 0.164 -> 0.0269
        assert area("large", px) == pytest.approx(0.0605, abs=0.012)
        assert area("small", px) == pytest.approx(0.0269, abs=0.008)


def test_backgrounds_have_distinct_colours():
    means = []
    for b in BACKGROUNDS:
        img = np.asarray(render(_scene(background=b, objects=[Obj("circle", "red", "small", 0, 0)]), 64))
        means.append(img[40:, 40:].reshape(-1, 3).mean(0))  # bottom-right corner, no object
    for i in range(len(means)):
        for j in range(i):
            assert np.abs(means[i] - means[j]).sum() > 50, (BACKGROUNDS[i], BACKGROUNDS[j])


def test_patterns_change_the_object_pixels():
    plain = np.asarray(render(_scene(objects=[Obj("square", "yellow", "large", 1, 1)]), 64)).astype(int)
    for pattern in ("striped", "dotted"):
        img = np.asarray(render(_scene(objects=[Obj("square", "yellow", "large", 1, 1, pattern)]), 64)).astype(int)
        box = (slice(26, 38), slice(26, 38))  # inside the square
        assert np.abs(img[box] - plain[box]).sum(-1).mean() > 20


@pytest.mark.parametrize("size", [64, 96])
def test_the_docstring_states_the_pattern_masks_shares(size):
    # The docstring said stripes cover ~35% of an object, while the masks every world is drawn with cover ~54%.
    import finecap.world.render as render_module

    stated = re.search(r"stripes ~(\d+)% of the area, dots ~(\d+)%", render_module.__doc__)
    assert stated is not None
    masks = render_module._pattern_masks(render_module._canvas_size(size))
    for name, percent in zip(("striped", "dotted"), stated.groups(), strict=True):
        share = np.asarray(masks[name]).mean() / 255
        assert share == pytest.approx(int(percent) / 100, abs=0.02), (name, share)


def _hue(rgb) -> np.ndarray:
    return np.asarray(Image.fromarray(np.asarray(rgb, np.uint8).reshape(-1, 1, 3)).convert("HSV")).astype(int)


def test_generated_scenes_show_what_their_scene_graphs_state():
    # Every metric of the world trusts the scene graph; check it against the pixels of generated 64 px scenes. An
    # object's pixels are those that removing it from the scene changes (same id and background: same texture crop).
    scenes = [r["scene"] for r in generate_scenes(WorldConfig(seed=5, n_train=40, n_val=0, n_test=0))]
    # What each colour word names, in hue degrees, independent of the renderer's COLOR_RGB (on Pillow's 0-255 scale).
    degrees = {"red": 0, "orange": 30, "yellow": 55, "green": 125, "cyan": 185, "blue": 228, "purple": 275,
               "pink": 325}  # fmt: skip
    hues = {c: round(d * 256 / 360) % 256 for c, d in degrees.items()}
    assert set(hues) == set(COLORS)
    extents: dict[str, list[int]] = {"small": [], "large": []}
    for scene in scenes:
        full = np.asarray(render(scene, 64)).astype(int)
        bare = np.asarray(render(Scene(scene.id, scene.background, []), 64)).astype(int)
        for o in scene.objects:
            without = Scene(scene.id, scene.background, [x for x in scene.objects if x is not o])
            mine = np.abs(full - np.asarray(render(without, 64))).sum(-1) > 0
            alone = np.abs(np.asarray(render(Scene(scene.id, scene.background, [o]), 64)) - bare).sum(-1) > 0
            assert np.array_equal(mine, alone), (scene.id, o)  # nothing hides it, it hides nothing of the others
            ys, xs = np.nonzero(mine)
            assert min(xs.min(), ys.min()) > 0 and max(xs.max(), ys.max()) < 63, (scene.id, o)  # in frame
            assert (int(ys.mean() * 3 // 64), int(xs.mean() * 3 // 64)) == (o.row, o.col), (scene.id, o)
            hsv = _hue(full[mine])[:, 0]
            saturated = hsv[(hsv[:, 1] > 100) & (hsv[:, 2] > 60), 0]
            dist = {c: np.minimum(np.abs(saturated - h), 256 - np.abs(saturated - h)) for c, h in hues.items()}
            nearest = np.array(list(dist))[np.argmin(np.stack(list(dist.values())), 0)]
            colours, counts = np.unique(nearest, return_counts=True)
            assert colours[counts.argmax()] == o.color, (scene.id, o, dict(zip(colours, counts, strict=True)))
            extents[o.size].append(max(xs.max() - xs.min(), ys.max() - ys.min()) + 1)
    assert extents["small"] and extents["large"]
    assert max(extents["small"]) < min(extents["large"]), extents  # small and large never overlap in pixels


def _coverage(o: Obj, size: int) -> np.ndarray:
    """Share (0..1) of each pixel of a ``size`` px image, and of a one-pixel ring around it, that ``o``'s ideal shape
    covers, drawn 16 times larger and box-averaged (no outline, no pattern): ``(size + 2, size + 2)``, the image at
    ``[1:-1, 1:-1]``. Centred in its grid cell and spanning 0.9 (large) or 0.6 (small) of it, as render's docstring
    says, independently of :func:`object_box`; only the shape's outline polygon is the renderer's."""
    from PIL import ImageDraw

    from finecap.world.render import _draw_shape

    big = Image.new("L", (16 * (size + 2), 16 * (size + 2)), 0)
    cell = 16 * size / 3
    cx, cy, r = (o.col + 0.5) * cell, (o.row + 0.5) * cell, {"large": 0.45, "small": 0.3}[o.size] * cell
    _draw_shape(ImageDraw.Draw(big), o.shape, cx + 16, cy + 16, r, fill=255)
    return np.asarray(big.reduce(16)).astype(float) / 255


@pytest.mark.parametrize("size", [16, 32])
def test_tiny_images_draw_each_object_where_and_as_its_scene_graph_says(size):
    # The pixel check above runs at 64 px; tests and recipes render smaller worlds (world.image_size >= 16, a recipe
    # at 32), where an object is a few pixels wide. Each object's pixels (those that removing it changes) must cover
    # its ideal shape at its cell and stop within one pixel of it (so no other object and no image border touches
    # it), its shape must lie inside the frame, and the pixels it mostly covers must show its colour's hue.
    scenes = [
        r["scene"] for r in generate_scenes(WorldConfig(seed=3, n_train=25, n_val=0, n_test=0, pattern_prob=0.5))
    ]
    degrees = {"red": 0, "orange": 30, "yellow": 55, "green": 125, "cyan": 185, "blue": 228, "purple": 275,
               "pink": 325}  # fmt: skip
    hues = {c: round(d * 256 / 360) % 256 for c, d in degrees.items()}
    for scene in scenes:
        full = np.asarray(render(scene, size)).astype(int)
        for o in scene.objects:
            without = Scene(scene.id, scene.background, [x for x in scene.objects if x is not o])
            mine = np.abs(full - np.asarray(render(without, size))).sum(-1) > 30
            padded = _coverage(o, size)
            assert not padded[[0, -1]].any() and not padded[:, [0, -1]].any(), (size, scene.id, o)  # not cut
            cover = padded[1:-1, 1:-1]
            near = cover > 0
            near[1:] |= near[:-1].copy()
            near[:-1] |= near[1:].copy()
            near[:, 1:] |= near[:, :-1].copy()
            near[:, :-1] |= near[:, 1:].copy()
            assert mine[cover > 0.999].all(), (size, scene.id, o)  # drawn where its shape is
            assert not mine[~near].any(), (size, scene.id, o)  # and nowhere else
            hsv = _hue(full[cover >= 0.75])[:, 0]
            saturated = hsv[(hsv[:, 1] > 80) & (hsv[:, 2] > 60), 0]
            assert len(saturated), (size, scene.id, o)
            dist = {c: np.minimum(np.abs(saturated - h), 256 - np.abs(saturated - h)) for c, h in hues.items()}
            nearest = np.array(list(dist))[np.argmin(np.stack(list(dist.values())), 0)]
            colours, counts = np.unique(nearest, return_counts=True)
            assert colours[counts.argmax()] == o.color, (size, scene.id, o, dict(zip(colours, counts, strict=True)))


def test_family_members_images_differ_in_their_detail_and_the_texture_crop_only():
    # A family member differs from its base scene in one detail (scene graph) and, its id being another, in the crop
    # of the background texture (render's docstring). Drawn with the base's id, the images differ only in the cells
    # of the objects the detail touches (everywhere for a background change); with its own id, the crop moves.
    records = generate_scenes(WorldConfig(seed=0, n_train=20, n_val=0, n_test=0, families=10))
    kinds = set()
    for base_record in (records[0], records[10]):
        base = base_record["scene"]
        a = np.asarray(render(base, 48)).astype(int)
        for r in records[base_record["imgid"] + 1 : base_record["imgid"] + 10]:
            s, kinds = r["scene"], kinds | {r["variant"]}
            b = np.asarray(render(Scene(base.id, s.background, s.objects), 48)).astype(int)
            changed = np.abs(a - b).sum(-1) > 0
            if r["variant"] == "background":
                assert changed.mean() > 0.5
                continue
            shapes = {d.split(":")[1] for d in scene_diff(base, s)}
            cells = {o.cell for o in base.objects + s.objects if o.shape in shapes}
            allowed = np.zeros_like(changed)
            for cell in cells:
                row, col = divmod(cell, 3)
                allowed[row * 16 : row * 16 + 16, col * 16 : col * 16 + 16] = True
            assert changed.any() and not changed[~allowed].any(), (r["variant"], scene_diff(base, s))
            own = np.asarray(render(s, 48)).astype(int)
            assert (np.abs(a - own).sum(-1) > 0)[~allowed].mean() > 0.3  # the texture crop moved (documented)
    assert len(kinds) >= 5, kinds
