"""How an image becomes 8-bit RGB (finecap.data.images.to_rgb, the one conversion of files and PIL images): an image
with transparency is composited onto white, pixel for pixel as transformers' image processors do
(``transformers.image_transforms.convert_to_rgb``), so a transparent PNG reaches the model as it reaches an exported
checkpoint under plain transformers; images without transparency convert as PIL converts them."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from finecap.data.images import load_image, to_rgb
from finecap.data.records import DataError

transformers_rgb = pytest.importorskip("transformers.image_transforms").convert_to_rgb


def transparent_images() -> dict[str, Image.Image]:
    """Each way a file holds transparency, over colours a viewer does not show (black, red under alpha 0)."""
    rng = np.random.default_rng(0)
    rgba = rng.integers(0, 256, (6, 5, 4), dtype=np.uint8)
    rgba[0, :, 3] = 0  # fully transparent, colours underneath
    rgba[1, :, 3] = 128  # half
    palette = Image.new("P", (5, 6), 1)
    palette.putpalette([0, 0, 0, 30, 200, 30] + [0] * 762)
    palette.putpixel((0, 0), 0)
    grey = Image.new("L", (5, 6), 90)
    grey.putpixel((1, 1), 0)
    colour = Image.new("RGB", (5, 6), (30, 200, 30))
    colour.putpixel((2, 3), (200, 0, 0))
    return {
        "RGBA": Image.fromarray(rgba, "RGBA"),
        "LA": Image.fromarray(rgba[..., [0, 3]], "LA"),
        "P with a transparent colour": (palette, 0),
        "L with a transparent colour": (grey, 0),
        "RGB with a transparent colour": (colour, (200, 0, 0)),  # came out red: RGB was returned as it was
        "PA": Image.fromarray(rgba, "RGBA").convert("PA"),
    }


@pytest.mark.parametrize("name", list(transparent_images()))
def test_transparency_is_composited_onto_white_as_transformers_does(name, tmp_path):
    image = transparent_images()[name]
    if isinstance(image, tuple):  # a palette or grey image whose one colour is transparent: as a PNG stores it
        image, colour = image
        image.save(tmp_path / "t.png", transparency=colour)
        image = Image.open(tmp_path / "t.png")
        image.load()
    ours = np.asarray(to_rgb(image))
    assert np.array_equal(ours, np.asarray(transformers_rgb(image, return_numpy=True))), name
    assert (ours == 255).any()  # some pixel shows the white background (the colours under it were not kept)
    if image.mode != "PA":  # (PNG stores no PA) the file's reading agrees with the image's
        image.save(tmp_path / "file.png", **({"transparency": image.info["transparency"]} if "transparency" in
                                             image.info else {}))  # fmt: skip
        assert np.array_equal(np.asarray(load_image(tmp_path / "file.png")), ours)


def test_a_16_bit_grey_images_transparent_level_is_composited_onto_white(tmp_path):
    """A 16-bit grey PNG's transparent level (tRNS) is a 16-bit value: it was dropped when the image was scaled to 8
    bits, so its transparent pixels kept their grey; it is matched before scaling, its neighbour level is not."""
    levels = np.array([[40000, 40001, 1000]], dtype=np.uint16)
    Image.fromarray(levels).save(tmp_path / "grey16.png", transparency=40000)
    assert Image.open(tmp_path / "grey16.png").mode == "I;16"
    got = np.asarray(load_image(tmp_path / "grey16.png"))
    assert got[0].tolist() == [[255] * 3, [40001 // 257] * 3, [1000 // 257] * 3]


def test_a_premultiplied_grey_and_alpha_image_converts_as_its_plain_alpha_one():
    # PIL converts mode La (made in memory, e.g. by a caller of the Python API) only to LA: to_rgb raised PIL's
    # "conversion from La to L not supported"
    plain = transparent_images()["LA"]
    premultiplied = plain.convert("La")
    assert np.array_equal(np.asarray(to_rgb(premultiplied)), np.asarray(to_rgb(premultiplied.convert("LA"))))
    assert (np.asarray(to_rgb(premultiplied)) == 255).any()  # composited onto white


def test_images_without_transparency_convert_as_pil_does():
    for mode, colour in (("L", 90), ("CMYK", (0, 255, 255, 0)), ("P", 3)):
        image = Image.new(mode, (3, 2), colour)
        assert np.array_equal(np.asarray(to_rgb(image)), np.asarray(image.convert("RGB"))), mode


def test_a_floating_point_image_is_refused_naming_the_file(tmp_path):
    """A float TIFF (PIL mode F) has no one scale to 8 bits: PIL's conversion clips, so 0..1 samples decoded black
    (all zeros) and reached the model silently; it is refused, naming the file and what to do."""
    path = tmp_path / "depth.tif"
    Image.fromarray(np.linspace(0, 1, 24, dtype=np.float32).reshape(4, 6)).save(path)
    refused = r"depth\.tif: floating-point image \(PIL mode F, values 0 to 1\).*8- or 16-bit"
    with pytest.raises(DataError, match=refused):
        load_image(path)
    with pytest.raises(DataError, match="floating-point image"):  # a PIL image given to the API: the same rule
        to_rgb(Image.open(path))
