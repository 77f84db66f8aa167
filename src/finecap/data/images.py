"""Image files: the one rule for every file read as an image.

**An image file is used only as decoded pixels**: :func:`load_image` (and :func:`load_record_image`) is the one
reader of image files; it refuses anything PIL does not decode whole as one of :data:`IMAGE_FORMATS`, images over
the image budget (:class:`ImageLimits`: ``data.max_image_pixels``, ``data.max_aspect_ratio``) or PIL's
decompression-bomb limit, both read from the header before decoding, and applies the EXIF orientation. What finecap
sends or embeds is a re-encoding of the decoded pixels (:func:`encode_image`), never a file's bytes.
:func:`find_bad_images` decodes every image of a data set up front (``data.skip_bad_images``), once per file version.

Where a data set's images may lie is :mod:`finecap.data.containment`'s rule. Nothing here imports PIL until an image
is loaded (``finecap eval`` on text metrics never does), nor torch.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import os
import re
import stat
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from finecap.config import DEFAULT_MAX_ASPECT_RATIO, DEFAULT_MAX_IMAGE_PIXELS, PIL_MAX_IMAGE_PIXELS
from finecap.data.hashing import file_version
from finecap.data.records import DataError
from finecap.utils.text import one_line

if TYPE_CHECKING:
    from PIL import Image

IMAGE_FORMATS = ("PNG", "JPEG", "GIF", "BMP", "TIFF", "WEBP", "PPM", "TGA", "JPEG2000", "AVIF")
"""The image formats finecap decodes (PIL format names, those the installed PIL has; JPEG includes its MPO
variant; :func:`load_image`). Others PIL knows are refused: some run external programs (EPS runs Ghostscript) or
are not photographs (icons, fonts, scientific formats)."""

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff",
                  ".jfif", ".jpe", ".avif", ".jp2", ".j2k", ".tga", ".ppm", ".pgm", ".pbm", ".pnm")  # fmt: skip
"""File name endings (any case) of image files: the images of a ``folder`` data set
(:func:`finecap.data.formats.folder.folder_images`) and of a folder given to ``finecap caption --images``. Those
of every one of :data:`IMAGE_FORMATS`: a ``.jfif`` (a JPEG, as browsers save one) or ``.avif`` in a folder was left
out, silently, though the same file named alone decodes."""

UNREAD_IMAGE_SUFFIXES = (".heic", ".heif", ".jxl", ".svg", ".psd", ".dng", ".cr2", ".cr3", ".nef", ".arw", ".raw")
"""File name endings (any case) of images in formats finecap does not decode (a phone's HEIC, a camera's raw files,
vector drawings): a folder's such files are left out with a warning naming them
(:func:`finecap.data.formats.folder.folder_images`), not silently."""


def _bomb(name: str, detail: str) -> DataError:
    from PIL import Image

    found = re.search(r"\((\d+) pixels\)", detail)
    size = f"{int(found.group(1)):,} pixels" if found else detail
    return DataError(
        f"{name}: image too large ({size}): more than the decompression-bomb limit PIL.Image.MAX_IMAGE_PIXELS="
        f"{Image.MAX_IMAGE_PIXELS:,} pixels, the most {PIXELS_OPTION} can be raised to; refused before decoding: "
        "scale it down first"
    )


PIXELS_OPTION, ASPECT_OPTION = "data.max_image_pixels", "data.max_aspect_ratio"


class ImageRefused(DataError):
    """An image a model's preprocessing refuses (``preprocess(images)``: the ``index``-th image it was given; the
    message says why, without the image's name, which only the caller knows): the collator raises it again naming
    the image, with the same ``index`` (:class:`finecap.data.datasets.CaptionCollator`), which captioning images
    with ``data.skip_bad_images`` leaves out (:func:`finecap.data.datasets.collate_without_refused`)."""

    def __init__(self, message: str, index: int = 0) -> None:
        super().__init__(message)
        self.index = index


@dataclass(frozen=True)
class ImageLimits:
    """The image budget: what an image may measure to be decoded, checked from its header before any pixel is
    (:func:`load_image` and every reader of images take one; the defaults are ``data.*``'s, whose docs in
    :mod:`finecap.config.sections` say why they are where they are).

    - ``max_pixels`` (``data.max_image_pixels``): width x height. A decoded image takes 3 bytes a pixel, and a batch
      holds one per example until the image processor resizes them: an 81-megapixel PNG (243 MB decoded, from a
      file of kilobytes) per example exhausts memory. At most PIL's own decompression-bomb limit, which PIL enforces
      when it opens a file.
    - ``max_aspect_ratio`` (``data.max_aspect_ratio``): the longer side over the shorter. Image processors resize
      the shorter side to a few hundred pixels and keep the aspect ratio, so a 1 x 60,000 PNG of 320 bytes became
      224 x 13,440,000 pixels: 2.9 GB in the processor.

    An image over either is a :class:`DataError` naming it (the file, or the data set row), its size, the limit
    and the option that raises it.

    Example::

        >>> ImageLimits().check(60000, 1, "strip.png")
        Traceback (most recent call last):
        ...
        finecap.data.records.DataError: strip.png: image too elongated (60,000 x 1 pixels, aspect ratio 60,000:1): over the aspect-ratio budget data.max_aspect_ratio=20; refused before decoding (an image processor scales the shorter side to a few hundred pixels and the longer one with it): crop it, or raise data.max_aspect_ratio
    """  # noqa: E501

    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    max_aspect_ratio: float = DEFAULT_MAX_ASPECT_RATIO

    @classmethod
    def of(cls, data: Any) -> ImageLimits:
        """The limits of a ``data`` section (:class:`finecap.config.DataConfig`)."""
        return cls(data.max_image_pixels, data.max_aspect_ratio)

    def check(self, width: int, height: int, name: str) -> None:
        """A :class:`DataError` beginning with ``name`` when a ``width`` x ``height`` image is empty or over the
        budget."""
        if width < 1 or height < 1:  # a crop of nothing: image processors divide by its sides
            raise DataError(f"{name}: empty image ({width} x {height} pixels)")
        pixels = width * height
        if pixels > self.max_pixels:
            raise DataError(
                f"{name}: image too large ({width:,} x {height:,} = {pixels:,} pixels): over the pixel budget "
                f"{PIXELS_OPTION}={self.max_pixels:,}; refused before decoding (decoded, it takes "
                f"{3 * pixels / 2**20:,.0f} MB, and a batch holds several): scale it down, or raise "
                f"{PIXELS_OPTION} (at most {PIL_MAX_IMAGE_PIXELS:,}, PIL's own limit)"
            )
        ratio = max(width, height) / max(min(width, height), 1)
        if ratio > self.max_aspect_ratio:
            shown = f"{ratio:,.0f}" if ratio >= 100 else f"{ratio:.3g}"  # 60,000; 25; 20.3
            raise DataError(
                f"{name}: image too elongated ({width:,} x {height:,} pixels, aspect ratio {shown}:1): over the "
                f"aspect-ratio budget {ASPECT_OPTION}={self.max_aspect_ratio:g}; refused before decoding (an image "
                "processor scales the shorter side to a few hundred pixels and the longer one with it): crop it, or "
                f"raise {ASPECT_OPTION}"
            )


DEFAULT_LIMITS = ImageLimits()
"""The default image budget (``data.*``'s defaults), for readers given none."""


@functools.cache
def _formats() -> tuple[str, ...]:
    """:data:`IMAGE_FORMATS` that the installed PIL opens (AVIF is recent)."""
    from PIL import Image

    Image.init()
    return tuple(f for f in IMAGE_FORMATS if f in Image.OPEN)


RGB_CONVERSION = "alpha-on-white, every tRNS"
"""How :func:`to_rgb` treats transparency, part of every image-feature cache key (features computed before
2026-11-27 kept the colours under the alpha channel, before 2026-11-28 the transparent colour of an RGB or 16-bit grey
PNG: a cache of them is not reused)."""


FLOAT_MODES = ("F",)
"""PIL modes of floating-point samples (a float TIFF): :func:`to_rgb` refuses them."""


def to_rgb(image: Image.Image, name: str = "the image") -> Image.Image:
    """``image`` as 8-bit RGB: 16-bit grey scaled to 8 bits (not clipped); an image with transparency (an alpha
    band, a transparent palette index, grey level or RGB colour: PNG's ``tRNS``, a 16-bit level matched before
    scaling) composited onto white, as transformers' image processors do
    (``transformers.image_transforms.convert_to_rgb``, their ``do_convert_rgb``), so a transparent PNG reaches the
    model as it reaches an exported checkpoint under plain transformers (the colours under a transparent pixel,
    often black, are not what a viewer shows); the rest converted.

    A floating-point image (PIL mode ``F``: a float TIFF, a depth or scientific map) is a :class:`DataError`
    beginning with ``name``: its samples have no one scale (0..1, 0..255, any range), and PIL's conversion clips
    them to 0..255, so a 0..1 image became black, silently."""
    from PIL import Image

    transparent = image.info.get("transparency")  # a palette index, a grey level or an RGB colour (PNG's tRNS)
    if image.mode == "RGB" and transparent is None:
        return image
    if image.mode in FLOAT_MODES:
        low, high = image.getextrema()
        raise DataError(
            f"{name}: floating-point image (PIL mode {image.mode}, values {low:g} to {high:g}): it has no one scale "
            "to 8-bit colour (0..1 would read as black); save it as an 8- or 16-bit image (PNG, JPEG, TIFF) first"
        )
    if image.mode == "La":  # premultiplied grey + alpha (made in memory, e.g. by a caller): PIL converts it only to LA
        image = image.convert("LA")
    if image.mode.startswith("I;16") or (image.mode == "I" and image.getextrema()[1] > 255):
        wide = image.convert("I")
        image = wide.point(lambda v: v * (1 / 257)).convert("L")  # 0..65535 -> 0..255
        image.info.pop("transparency", None)  # a 16-bit level: PIL would match it against the 8-bit ones
        if isinstance(transparent, int):  # its transparent level, matched before scaling (257 levels become one)
            import numpy as np

            image.putalpha(Image.fromarray(np.where(np.asarray(wide) == transparent, 0, 255).astype(np.uint8), "L"))
        transparent = None
    if "A" in image.getbands() or "a" in image.getbands() or transparent is not None:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image.convert("RGB")


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]+:/")
"""The start of a URL (a scheme of two characters or more, then ``:/``; ``C:/`` is a drive)."""


def url_note(source: str | os.PathLike[str]) -> str:
    """What an error about a missing image file adds when ``source`` is a URL (``https://...``, ``s3://...``): finecap
    downloads no image, so it was looked for as a file of that name; ``""`` for any other text."""
    if not _URL.match(os.fspath(source)):
        return ""
    return "; it is a URL: finecap reads image files on this machine and downloads none: download the image first"


def _file_size(path: str | Path, name: str) -> int:
    """The size of the regular file ``path`` (followed through links: what would be read); a one-line
    :class:`DataError` beginning with ``name`` when it is missing, unreadable, not a regular file or empty."""
    try:
        st = os.stat(path)
    except OSError as e:
        missing = isinstance(e, FileNotFoundError)
        reason = "no such file" + url_note(name) if missing else (e.strerror or one_line(e)).lower()
        raise DataError(f"{name}: cannot read image: {reason}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file (a device, pipe or socket)"
        raise DataError(f"{name}: cannot read image: {kind}")
    if st.st_size == 0:
        raise DataError(f"{name}: not an image: the file is empty (0 bytes)")
    return st.st_size


@contextlib.contextmanager
def _opened(source: Any, name: str, size: int, limits: ImageLimits) -> Iterator[Image.Image]:
    """``PIL.Image.open(source)`` restricted to :data:`IMAGE_FORMATS`, its size checked against the decompression-bomb
    limit and ``limits`` from the header (``Image.open`` reads the header alone: no pixel is decoded yet); what goes
    wrong there or in the ``with`` body is a one-line :class:`DataError` beginning with ``name``; running out of
    memory while decoding is named as such, not as a damaged file."""
    from PIL import Image  # here, not at the top: text-only evaluation reads its files through this module

    limit = Image.MAX_IMAGE_PIXELS
    width = height = 0
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)  # the warning level is refused too
            with Image.open(source, formats=_formats()) as image:
                width, height = image.size
                if limit is not None and width * height > limit:  # again: warning filters are not per thread
                    raise _bomb(name, f"({width * height} pixels)")
                limits.check(width, height, name)
                yield image
    except DataError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise _bomb(name, str(e)) from None
    except MemoryError:
        raise DataError(
            f"{name}: not enough memory to decode this image ({width:,} x {height:,} pixels, {size:,} bytes); lower "
            f"{PIXELS_OPTION} (now {limits.max_pixels:,}) to refuse such images before decoding, or scale it down"
        ) from None
    except Image.UnidentifiedImageError:
        raise DataError(
            f"{name}: not an image: PIL reads no {', '.join(_formats())} image in it ({size:,} bytes)"
        ) from None
    except Exception as e:  # noqa: BLE001 - PIL's decoders raise many kinds on damaged files
        raise DataError(f"{name}: damaged image ({type(e).__name__}: {one_line(e)})") from None


def _decode(
    source: Path | bytes, name: str, draft: int | None = None, limits: ImageLimits = DEFAULT_LIMITS
) -> tuple[Image.Image, str]:
    """The image in ``source`` (a file, or encoded bytes) decoded to RGB, upright, and its PIL format, when within
    ``limits``; every error is a one-line :class:`DataError` beginning with ``name``. ``draft``: see
    :func:`load_image`."""
    from PIL import ImageOps

    if isinstance(source, bytes):
        if not source:
            raise DataError(f"{name}: not an image: the file is empty (0 bytes)")
        fp: Any = io.BytesIO(source)
        size = len(source)
    else:
        fp, size = source, _file_size(source, name)
    with _opened(fp, name, size, limits) as image:
        if draft and image.format == "JPEG":  # DCT scaling by 1/2, 1/4 or 1/8 while both sides stay >= draft
            image.draft(None, (draft, draft))  # a square box: the same scale whatever the EXIF orientation
        image.load()  # decodes every pixel: a truncated or damaged file fails here, not later
        fmt = image.format or ""
        try:
            upright = ImageOps.exif_transpose(image)  # EXIF orientation honoured
        except Exception:  # noqa: BLE001 - unreadable EXIF: the pixels as stored (they decoded)
            upright = image
        return to_rgb(upright, name), fmt


def load_image(path: str | Path, draft: int | None = None, limits: ImageLimits = DEFAULT_LIMITS) -> Image.Image:
    """The image file at ``path`` decoded to RGB: the one way finecap reads an image file.

    A file is used only when PIL decodes it whole as one of :data:`IMAGE_FORMATS`; it is refused (a one-line
    :class:`DataError` naming the file) when it is missing, not a regular file, empty, not an image, damaged or
    truncated, over the image budget ``limits`` (:class:`ImageLimits`: pixels and aspect ratio, read from the
    header before decoding), or larger than ``PIL.Image.MAX_IMAGE_PIXELS`` (PIL's decompression-bomb limit; PIL
    only warns between one and two times the limit, finecap refuses there too). The EXIF orientation is applied;
    16-bit, palette, alpha, CMYK and grey images come out as 8-bit RGB; a floating-point image (a float TIFF) is
    refused (:func:`to_rgb`).

    ``draft`` (pixels; ``data.jpeg_draft``, :func:`finecap.data.loading.draft_size`): a JPEG is decoded at the
    smallest of 1/1, 1/2, 1/4, 1/8 of its size (libjpeg's DCT scaling, ``PIL.Image.draft``) whose both sides are
    still at least ``draft``: the size an image processor resizes to, which then still downsizes. Other formats
    ignore it. The budget is checked on the size the header declares, before any draft."""
    return _decode(Path(path), str(path), draft, limits)[0]


def decode_image(path: str | Path, limits: ImageLimits = DEFAULT_LIMITS) -> tuple[Image.Image, str]:
    """:func:`load_image` and the PIL format of the file (``"JPEG"``, ``"PNG"``, ...)."""
    return _decode(Path(path), str(path), limits=limits)


def _encoded(record: Any) -> bytes | None:
    """The embedded image bytes of ``record`` (a :class:`Record`, or anything with ``path``), ``None`` for a file."""
    encoded = getattr(record, "encoded_image", None)
    return encoded() if encoded is not None else getattr(record, "image_bytes", None)


def load_record_image(record: Any, draft: int | None = None, limits: ImageLimits = DEFAULT_LIMITS) -> Image.Image:
    """The image of ``record`` (a :class:`Record`, or anything with ``path``) as RGB, by :func:`load_image`'s rule
    (``draft`` and ``limits`` too): its embedded bytes when it has them (read now from a memory-mapped data set;
    errors name the record and its row), else its file."""
    data = _encoded(record)
    if data is None:
        return load_image(record.path, draft, limits)
    return _decode(data, record_label(record), draft, limits)[0]


def record_label(record: Any) -> str:
    """How errors name the image of ``record``: its id and its data set's row (else its path)."""
    where = getattr(getattr(record, "image_ref", None), "where", None) or record.path  # the data set's row, if known
    return f"image of record {record.image_id!r} ({where})"


def check_image_file(path: str | Path, limits: ImageLimits = DEFAULT_LIMITS) -> None:
    """Check, without decoding the pixels, that ``path`` is an image file :func:`load_image` may read: a regular
    file that PIL identifies as one of :data:`IMAGE_FORMATS`, within the decompression-bomb limit, whose structure
    PIL verifies (chunk checksums for PNG). A one-line :class:`DataError` naming the file otherwise. Cheaper than a
    decode (a header and a scan): for checking many files before any is used (``finecap boost``). Within
    ``limits`` too (:class:`ImageLimits`)."""
    name = str(path)
    with _opened(path, name, _file_size(path, name), limits) as image:
        image.verify()


_IMAGE_CHECKS: dict[tuple[Any, ...], tuple[str, str | None]] = {}
"""Outcome of :func:`image_problem` per image version (real path and :func:`~finecap.data.hashing.file_version`; or
embedded bytes): the label its message names the image by, and the message (``None``: it decodes)."""


def image_problem(record: Any, limits: ImageLimits = DEFAULT_LIMITS) -> str | None:
    """Why :func:`load_record_image` refuses the image of ``record`` within ``limits`` (its one-line message, naming
    the file, or the record and its row for embedded bytes), or ``None`` when it decodes. The image is decoded whole
    (a truncated or damaged file fails; a header check would pass some), once per file version, budget and process."""
    data = _encoded(record)
    label = record_label(record) if data is not None else str(Path(record.path))
    if data is not None:
        key: tuple[Any, ...] | None = ("bytes", hashlib.blake2b(data, digest_size=16).digest(), limits)
    else:
        try:
            key = (os.path.realpath(record.path), file_version(os.stat(record.path)), limits)
        except OSError:
            key = None  # missing: load_record_image names it
    if key is not None and key in _IMAGE_CHECKS:
        first, problem = _IMAGE_CHECKS[key]
        # the same image under another record (embedded bytes in another row): the message names this one
        return problem.replace(first, label, 1) if problem is not None else None
    try:
        load_record_image(record, limits=limits)
        problem = None
    except DataError as e:
        problem = str(e)
    if key is not None:
        _IMAGE_CHECKS[key] = (label, problem)
    return problem


def find_bad_images(
    records: Sequence[Any], workers: int | None = None, limits: ImageLimits = DEFAULT_LIMITS
) -> list[tuple[Any, str]]:
    """``(record, reason)`` of each of ``records`` whose image does not decode (:func:`image_problem`: corrupt,
    truncated, empty, missing, not an image, over the budget ``limits`` or the decompression-bomb limit), in order.
    Images are decoded in ``workers`` threads (default: up to 8, one per core; PIL decodes outside the GIL)."""
    workers = workers or max(1, min(8, os.cpu_count() or 1))
    check = functools.partial(image_problem, limits=limits)
    if workers == 1 or len(records) < 2:
        problems = [check(r) for r in records]
    else:
        with ThreadPoolExecutor(workers) as pool:
            problems = list(pool.map(check, records, chunksize=16))
    return [(r, p) for r, p in zip(records, problems, strict=True) if p is not None]


def encode_image(image: Image.Image, source_format: str = "") -> tuple[bytes, str]:
    """``(bytes, MIME type)`` of a decoded image re-encoded to be sent or embedded: JPEG when it was read from a JPEG
    (quality 95: near the original size), PNG otherwise (lossless). What finecap sends is always such a re-encoding
    of decoded pixels, never the bytes of a file."""
    buf = io.BytesIO()
    if source_format in ("JPEG", "MPO"):
        image.save(buf, format="JPEG", quality=95)
        return buf.getvalue(), "image/jpeg"
    image.save(buf, format="PNG")
    return buf.getvalue(), "image/png"


# ---------------------------------------------------------------------------------------------------------------------
# Image paths: only inside the data set's image folder
# ---------------------------------------------------------------------------------------------------------------------
