import re

import numpy as np
import pytest

from finecap.world.render import BACKGROUND_RGB, COLOR_RGB, object_box, render
from finecap.world.scene import BACKGROUNDS, COLORS, SHAPES, Obj, Scene


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
