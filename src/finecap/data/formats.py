"""Caption data set files: readers for Karpathy split JSON, COCO caption annotations, JSONL, image folders and the
world, the COCO results format (the one reader and the writer), the bags file of ``finecap bags build``, and image
files.

Every reader returns :class:`Record` s (one per image). Bad input raises :class:`DataError` naming the file and
the record at fault (missing keys, wrong types, empty caption lists, image files that do not exist — reported with
a count and the first few paths).

Formats:

- ``karpathy``: ``{"images": [{"filename", "filepath"?, "split", "imgid"?, "cocoid"?, "sentences": [{"raw",
  "tokens"?}]}]}`` (``dataset_coco.json``, ``dataset_flickr30k.json``). Image path: ``<images>/<filepath>/<filename>``
  (``filepath`` optional, as in Flickr30k). ``image_id`` is ``cocoid`` when present (what COCO evaluation expects),
  else ``imgid``, else the record index. Captions are the ``raw`` strings (stripped), or the joined ``tokens`` when
  ``raw`` is missing. Splits are kept as written (``restval`` included; :mod:`finecap.data.datasets` merges it into
  training). Default image root: the JSON file's folder.
- ``world``: the Karpathy JSON written by ``finecap world make``; ``path`` is the world folder or its
  ``dataset.json``; default image root ``<world>/images``.
- ``coco``: ``{"images": [{"id", "file_name"?}], "annotations": [{"image_id", "caption"}]}``
  (``captions_val2014.json``), in every variant pycocotools reads (:func:`read_coco_captions`: ``file_name`` optional
  for text metrics, extra fields ignored, images without captions dropped). The split is inferred from the file name
  (``train``/``val``/``test``) unless given. Default image root: the JSON file's folder.
- ``jsonl``: one ``{"image": path, "captions": [str, ...], "id"?, "split"?}`` per line; ``id`` defaults to the image
  path as written; a line without ``split`` names none (:data:`NO_SPLIT`, below). Relative image paths are resolved
  against ``images`` (default: the JSONL file's folder).
- ``folder``: a folder of images (:func:`read_folder`; recursive, :data:`IMAGE_SUFFIXES` in any case, hidden files
  and folders skipped), with captions from one of: a sidecar ``captions.jsonl`` (``{"image": relative path,
  "captions": [...], "split"?}`` per line), a sidecar ``captions.csv`` (``image,caption[,split]`` header, one row per
  caption, several rows per image), or a ``.txt`` file next to each image (``cat.jpg`` + ``cat.txt``, one caption per
  line); or none. The image id is the image's path relative to the folder, with ``/`` (``"cats/001.jpg"``). Images
  without captions are records with an empty caption list (captioning reads them; training and evaluation refuse
  them, :func:`finecap.data.references.require_captions`).

Records whose data set names no split (a JSONL line without ``split``, a folder's images unless its sidecar names
one) carry :data:`NO_SPLIT`; the commands give them one when they read the data set
(:func:`finecap.data.splits.assign_splits`: ``data.val_fraction``, ``data.test_fraction``; all ``train`` by default).
- ``hf``: a Hugging Face data set (saved folder, parquet/arrow files, Hub name) with configurable columns
  (:mod:`finecap.data.hf`; ``datasets`` is imported only for it).
- results: ``[{"image_id", "caption"}]``, extra fields (``score``, ``id``) ignored (:func:`read_results`: an image
  listed several times keeps all its captions, as pycocotools' ``loadRes`` does).
- bags: ``{"bags": {size: [{"images": [id, ...], "similarity"?}, ...]}}`` (:func:`read_bags`; ``similarity`` a
  number when present).

Two rules hold for every format (docs/reliability.md, "Reading only what you named"):

- **Image paths stay inside the data set's image folder** (the image root above, ``data.images`` when given):
  every record naming a file is checked when the data set is read, on real paths (``..`` and symbolic links
  resolved), and one naming a file outside is refused, naming the data file, the record, the path and
  ``data.allow_outside_paths``, the option that allows it (:class:`ImageFolder`). A ``folder`` data set's caption
  files (``captions.jsonl``, ``captions.csv``, each ``.txt``) are checked the same way before they are opened.
- **An image file is used only as decoded pixels**: :func:`load_image` (and :func:`load_record_image`) is the one
  reader of image files; it refuses anything PIL does not decode whole as one of :data:`IMAGE_FORMATS`, images over
  the image budget (:class:`ImageLimits`: ``data.max_image_pixels``, ``data.max_aspect_ratio``) or PIL's
  decompression-bomb limit, both read from the header before decoding, and applies the EXIF orientation. What
  finecap sends or embeds is a re-encoding of the decoded pixels (:func:`encode_image`), never a file's bytes.
  :func:`find_bad_images` decodes every image of a data set up front (``data.skip_bad_images``), once per file
  version.

Data files are read within bounds (:mod:`finecap.utils`, "Bounded reads"): a JSON file is read whole only up to
:data:`~finecap.utils.DATA_FILE` (2 GiB, ``FINECAP_MAX_DATA_BYTES``), a JSONL or CSV file is streamed with each line
within :data:`~finecap.utils.LINE`, a caption ``.txt`` is at most :data:`~finecap.utils.CAPTION_TEXT` (1 MiB); a
larger file is an error naming it and the limit, never a ``MemoryError``.

Nothing here imports torch (nor PIL, until an image is loaded): ``finecap eval`` reads its inputs through this module.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import hashlib
import io
import json
import math
import os
import re
import stat
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, get_args

from finecap.config import DEFAULT_MAX_ASPECT_RATIO, DEFAULT_MAX_IMAGE_PIXELS, PIL_MAX_IMAGE_PIXELS, DataFormat
from finecap.outputs import write_output
from finecap.utils import CAPTION_TEXT, DATA_FILE, read_bounded, read_lines, read_text_bounded, short_repr

if TYPE_CHECKING:
    from PIL import Image

FORMATS = get_args(DataFormat)
MAX_LISTED = 5
ALLOW_OUTSIDE = "data.allow_outside_paths"
"""The option that lets a data set name image files outside its image folder (:class:`ImageFolder`)."""
IMAGE_FORMATS = ("PNG", "JPEG", "GIF", "BMP", "TIFF", "WEBP", "PPM", "TGA", "JPEG2000", "AVIF")
"""The image formats finecap decodes (PIL format names, those the installed PIL has; JPEG includes its MPO
variant; :func:`load_image`). Others PIL knows are refused: some run external programs (EPS runs Ghostscript) or
are not photographs (icons, fonts, scientific formats)."""


NO_SPLIT = ""
"""The split of a record whose data set names none (a JSONL line without ``"split"``, an image of a ``folder``):
given one when a command reads the data set (:func:`finecap.data.splits.assign_splits`)."""
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
"""File name endings (any case) of the images of a ``folder`` data set (:func:`read_folder`)."""
CAPTION_FILES = ("captions.jsonl", "captions.csv")
"""The sidecar caption files a ``folder`` data set may hold at its top (:func:`read_folder`; at most one)."""


class DataError(ValueError):
    """A data set or results file is malformed; the message names the file and the record."""


@dataclass
class Record:
    image_id: int | str
    path: Path
    split: str
    captions: list[str] = field(default_factory=list)
    boosted: dict[str, list[str]] = field(default_factory=dict)
    """Caption fields written by ``finecap boost`` (``original``, ``blend``, ...; :mod:`finecap.boost.output`)."""
    image_bytes: bytes | None = field(default=None, repr=False)
    """The encoded image when the data set embeds it and it was given in memory."""
    image_ref: EmbeddedImage | None = field(default=None, repr=False)
    """The embedded image read on demand (a memory-mapped Hugging Face data set, :mod:`finecap.data.hf`): records
    hold no image bytes, so a data set of any size costs the memory of its captions."""

    @property
    def embedded(self) -> bool:
        """Whether the image is embedded in the data set (bytes, or a reference to them) rather than a file."""
        return self.image_bytes is not None or self.image_ref is not None

    def encoded_image(self) -> bytes | None:
        """The embedded image's encoded bytes (read now, for a reference), or ``None`` for an image file."""
        if self.image_bytes is not None:
            return self.image_bytes
        return self.image_ref.read() if self.image_ref is not None else None


class EmbeddedImage(Protocol):
    """An image stored inside a data set file, read when asked (:class:`finecap.data.hf.ArrowImage`)."""

    def read(self) -> bytes:
        """The encoded image (PNG, JPEG, ...)."""
        ...

    def key(self) -> str | None:
        """What identifies this image's stored version without reading it (the data set files' paths, sizes and
        modification times, and the row), or ``None`` when nothing does (then its bytes are hashed)."""
        ...


# ---------------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------------


_HANDOFF: dict[tuple[Path, int], Any] = {}


def hand_over_json(path: Path, data: Any) -> None:
    """Keep ``data`` (parsed contents of ``path``) for the next :func:`_load_json` of the same unchanged file, once:
    format detection parses a file that a reader then reads again (a second parse of a large file costs as much as
    the whole evaluation of its captions)."""
    _HANDOFF.clear()
    _HANDOFF[(Path(path), Path(path).stat().st_mtime_ns)] = data


def _load_json(path: Path) -> Any:
    if _HANDOFF:
        data = _HANDOFF.pop((path, path.stat().st_mtime_ns) if path.exists() else None, None)
        _HANDOFF.clear()
        if data is not None:
            return data
    if not path.exists():
        raise DataError(f"{path}: file not found")
    try:
        return json.loads(read_bounded(path, DATA_FILE))  # at most DATA_FILE: parsed whole into memory
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not a UTF-8 text file ({e.reason})") from None


def _type(value: Any) -> str:
    return type(value).__name__


def _require(rec: Any, key: str, types: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected an object, got {_type(rec)}")
    if key not in rec:
        raise DataError(f"{where}: missing key {key!r} (keys present: {', '.join(sorted(map(str, rec))) or 'none'})")
    value = rec[key]
    if not isinstance(value, types) or isinstance(value, bool):
        names = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        raise DataError(f"{where}: {key!r} must be {names}, got {_type(value)} {short_repr(value)}")
    return value


MAX_INT_ID = 2**53 - 1
"""The largest integer image id (either sign) finecap reads or writes: RFC 8259's interoperable range, the integers
every JSON reader holds exactly (JavaScript, and any reader that parses numbers as doubles, turns
``12345678901234567891`` into ``12345678901234567000``), and within int64 (numpy, torch, Arrow). An integer id beyond
it in a data set, results or bags file is refused, naming the record (:func:`check_id`: write it as a string); a
file name whose number is beyond it keeps its name as the id (:func:`finecap.inference.image_ids`)."""


def int_id_fits(value: int) -> bool:
    """Whether the integer ``value`` is a usable image id (``|value| <= MAX_INT_ID``)."""
    return -MAX_INT_ID <= value <= MAX_INT_ID


def check_id(value: Any, where: str, key: str = "image id") -> int | str:
    """``value`` when it is an image id finecap reads and writes alike: a string, or an integer (never a bool)
    within :data:`MAX_INT_ID`; else a :class:`DataError` naming ``where`` and ``key``."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise DataError(f"{where}: {key} {short_repr(value)} must be an int or a string, got {_type(value)}")
    if isinstance(value, int) and not int_id_fits(value):
        raise DataError(
            f"{where}: {key} {short_repr(value, 40)} is an integer beyond +-(2**53 - 1), which JSON readers do not "
            f'all read back exactly (RFC 8259); write it as a string ("{short_repr(value, 40)}")'
        )
    return value


def id_from_key(key: str) -> int | str:
    """The image id a JSON object key stands for (JSON keys are strings): the integer when ``key`` is one written
    as Python writes it (``"42"``, ``"-7"``; not ``"042"`` or ``"+4"``) and within :data:`MAX_INT_ID`, else the key
    itself: ids written with ``str(id)`` read back as they were."""
    try:
        number = int(key) if len(key) <= 20 else None
    except ValueError:
        return key
    return number if number is not None and str(number) == key and int_id_fits(number) else key


def _require_id(rec: Any, key: str, where: str) -> int | str:
    """Field ``key`` of ``rec``, an image id (:func:`check_id`)."""
    return check_id(_require(rec, key, (int, str), where), where, repr(key))


def _is_id(value: Any) -> bool:
    """The fast readers' test of an image id (the checking loops name a bad one, :func:`check_id`)."""
    return type(value) is str or (type(value) is int and int_id_fits(value))


def _check_images(records: list[Record], path: Path, root: Path) -> None:
    missing = [r.path for r in records if not r.path.is_file()]
    if missing:
        shown = "\n  ".join(str(p) for p in missing[:MAX_LISTED])
        more = f"\n  ... and {len(missing) - MAX_LISTED} more" if len(missing) > MAX_LISTED else ""
        raise DataError(
            f"{path}: {len(missing)} of {len(records)} image files do not exist (image root {root}; set the image "
            f"folder with data.images=DIR, or --images DIR for finecap eval):\n  {shown}{more}"
        )


# ---------------------------------------------------------------------------------------------------------------------
# Images: one rule for every file read as an image
# ---------------------------------------------------------------------------------------------------------------------


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


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
        finecap.data.formats.DataError: strip.png: image too elongated (60,000 x 1 pixels, aspect ratio 60,000:1): over the aspect-ratio budget data.max_aspect_ratio=20; refused before decoding (an image processor scales the shorter side to a few hundred pixels and the longer one with it): crop it, or raise data.max_aspect_ratio
    """  # noqa: E501

    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    max_aspect_ratio: float = DEFAULT_MAX_ASPECT_RATIO

    @classmethod
    def of(cls, data: Any) -> ImageLimits:
        """The limits of a ``data`` section (:class:`finecap.config.DataConfig`)."""
        return cls(data.max_image_pixels, data.max_aspect_ratio)

    def check(self, width: int, height: int, name: str) -> None:
        """A :class:`DataError` beginning with ``name`` when a ``width`` x ``height`` image is over the budget."""
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


def _to_rgb(image: Image.Image) -> Image.Image:
    """``image`` as 8-bit RGB: 16-bit grey scaled to 8 bits (not clipped), palette and alpha images through RGBA
    (the colours under the alpha channel are kept, as every captioning preprocessor does), the rest converted."""
    if image.mode == "RGB":
        return image
    if image.mode.startswith("I;16") or (image.mode == "I" and image.getextrema()[1] > 255):
        image = image.convert("I").point(lambda v: v * (1 / 257)).convert("L")  # 0..65535 -> 0..255
    elif image.mode in ("P", "PA", "LA", "La", "RGBa") or "transparency" in image.info:
        image = image.convert("RGBA")
    return image.convert("RGB")


def _file_size(path: str | Path, name: str) -> int:
    """The size of the regular file ``path`` (followed through links: what would be read); a one-line
    :class:`DataError` beginning with ``name`` when it is missing, unreadable, not a regular file or empty."""
    try:
        st = os.stat(path)
    except OSError as e:
        reason = "no such file" if isinstance(e, FileNotFoundError) else (e.strerror or _one_line(e)).lower()
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
        raise DataError(f"{name}: damaged image ({type(e).__name__}: {_one_line(e)})") from None


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
        return _to_rgb(upright), fmt


def load_image(path: str | Path, draft: int | None = None, limits: ImageLimits = DEFAULT_LIMITS) -> Image.Image:
    """The image file at ``path`` decoded to RGB: the one way finecap reads an image file.

    A file is used only when PIL decodes it whole as one of :data:`IMAGE_FORMATS`; it is refused (a one-line
    :class:`DataError` naming the file) when it is missing, not a regular file, empty, not an image, damaged or
    truncated, over the image budget ``limits`` (:class:`ImageLimits`: pixels and aspect ratio, read from the
    header before decoding), or larger than ``PIL.Image.MAX_IMAGE_PIXELS`` (PIL's decompression-bomb limit; PIL
    only warns between one and two times the limit, finecap refuses there too). The EXIF orientation is applied;
    16-bit, palette, alpha, CMYK and grey images come out as 8-bit RGB.

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
    where = getattr(getattr(record, "image_ref", None), "where", None) or record.path  # the data set's row, if known
    return _decode(data, f"image of record {record.image_id!r} ({where})", draft, limits)[0]


def check_image_file(path: str | Path, limits: ImageLimits = DEFAULT_LIMITS) -> None:
    """Check, without decoding the pixels, that ``path`` is an image file :func:`load_image` may read: a regular
    file that PIL identifies as one of :data:`IMAGE_FORMATS`, within the decompression-bomb limit, whose structure
    PIL verifies (chunk checksums for PNG). A one-line :class:`DataError` naming the file otherwise. Cheaper than a
    decode (a header and a scan): for checking many files before any is used (``finecap boost``). Within
    ``limits`` too (:class:`ImageLimits`)."""
    name = str(path)
    with _opened(path, name, _file_size(path, name), limits) as image:
        image.verify()


_IMAGE_CHECKS: dict[tuple[Any, ...], str | None] = {}
"""Outcome of :func:`image_problem` per image version (real path, size, modification time; or embedded bytes)."""


def image_problem(record: Any, limits: ImageLimits = DEFAULT_LIMITS) -> str | None:
    """Why :func:`load_record_image` refuses the image of ``record`` within ``limits`` (its one-line message, naming
    the file), or ``None`` when it decodes. The image is decoded whole (a truncated or damaged file fails; a header
    check would pass some), once per file version, budget and process."""
    data = _encoded(record)
    if data is not None:
        key: tuple[Any, ...] | None = ("bytes", hashlib.blake2b(data, digest_size=16).digest(), limits)
    else:
        try:
            st = os.stat(record.path)
            key = (os.path.realpath(record.path), st.st_size, st.st_mtime_ns, limits)
        except OSError:
            key = None  # missing: load_record_image names it
    if key is not None and key in _IMAGE_CHECKS:
        return _IMAGE_CHECKS[key]
    try:
        load_record_image(record, limits=limits)
        problem = None
    except DataError as e:
        problem = str(e)
    if key is not None:
        _IMAGE_CHECKS[key] = problem
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


class ImageFolder:
    """Where a data set's records may name image files: inside its image folder(s) ``roots`` (the ``images`` root
    the reader resolves relative paths against), after resolving ``..`` and symbolic links (real paths). A record
    naming a file elsewhere (``../secret.png``, ``/home/me/.ssh/id_rsa``, a link leading out) is refused with a
    :class:`DataError` naming the record (``where``: the data file and the entry), the path and
    ``data.allow_outside_paths``, which (``allow``) turns the check off. Records with embedded images (no file) are
    not checked.

    Example::

        >>> folder = ImageFolder("/data/coco")
        >>> folder.check("/data/coco/val/1.jpg", "/data/coco/captions.jsonl, line 1", "val/1.jpg")
        >>> folder.check("/data/coco/../secret.png", "/data/coco/captions.jsonl, line 2", "../secret.png")
        Traceback (most recent call last):
        ...
        finecap.data.formats.DataError: /data/coco/captions.jsonl, line 2: image path '../secret.png' resolves to /data/secret.png, outside the data set's image folder /data/coco; refused (a data set names only files inside its folder): set data.images to the folder holding the images, or data.allow_outside_paths=true to allow it
    """  # noqa: E501

    def __init__(self, roots: str | Path | tuple[str | Path, ...], allow: bool = False) -> None:
        roots = roots if isinstance(roots, tuple) else (roots,)
        self.allow = allow
        self.reals = [os.path.realpath(r) for r in roots]
        self.prefixes = tuple(r.rstrip(os.sep) + os.sep for r in self.reals)
        self._dirs: dict[str, str] = {}

    def real_path(self, path: str | Path) -> str:
        """``os.path.realpath(path)``, resolving each folder once (a data set holds many files per folder)."""
        text = os.fspath(path)
        head, tail = os.path.split(text)
        if tail in ("", os.curdir, os.pardir):
            return os.path.realpath(text)
        folder = self._dirs.get(head)
        if folder is None:
            folder = self._dirs[head] = os.path.realpath(head or os.curdir)
        real = os.path.join(folder, tail)
        return os.path.realpath(real) if os.path.islink(real) else real

    def inside(self, path: str | Path) -> bool:
        real = self.real_path(path)
        return real in self.reals or real.startswith(self.prefixes)

    def check(self, path: str | Path, where: str, written: Any, what: str = "image path") -> None:
        """Refuse ``path`` (of record ``where``, written ``written`` in the data file) unless it lies inside;
        ``what`` names the file in the error (an image path, a caption file of a ``folder`` data set)."""
        if self.allow or self.inside(path):
            return
        raise DataError(
            f"{where}: {what} {str(written)!r:.300} resolves to {self.real_path(path)}, outside the data set's "
            f"image folder {' or '.join(self.reals)}; refused (a data set names only files inside its folder): set "
            f"data.images to the folder holding the images, or {ALLOW_OUTSIDE}=true to allow it"
        )


def _captions(items: list[Any], where: str) -> list[str]:
    if not items:
        raise DataError(f"{where}: empty caption list")
    out = []
    for j, c in enumerate(items):
        if not isinstance(c, str):
            raise DataError(f"{where}: caption {j} must be a string, got {_type(c)} {short_repr(c)}")
        if not c.strip():
            raise DataError(f"{where}: caption {j} is empty")
        out.append(c.strip())
    return out


def _boosted(rec: dict[str, Any], where: str) -> dict[str, list[str]]:
    """The ``"boost": {field: [caption, ...]}`` object ``finecap boost`` adds to a record (empty when absent)."""
    raw = rec.get("boost")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise DataError(f"{where}: 'boost' must be an object {{field: [caption, ...]}}, got {_type(raw)}")
    return {str(k): _captions(v if isinstance(v, list) else [v], f"{where}: boost.{k}") for k, v in raw.items()}


# ---------------------------------------------------------------------------------------------------------------------
# Readers
# ---------------------------------------------------------------------------------------------------------------------


def read_karpathy(
    path: str | Path, images: str | Path | None = None, check_images: bool = True, allow_outside: bool = False
) -> list[Record]:
    """Read a Karpathy split JSON (``dataset_coco.json`` / ``dataset_flickr30k.json`` layout). Image paths must lie
    inside ``images`` (:class:`ImageFolder`) unless ``allow_outside`` (``data.allow_outside_paths``)."""
    path = Path(path)
    root = Path(images) if images is not None else path.parent
    folder = ImageFolder(root, allow_outside)
    data = _load_json(path)
    entries = _require(data, "images", list, f"{path}")
    records = []
    for i, img in enumerate(entries):
        where = f"{path}: images[{i}]"
        filename = _require(img, "filename", str, where)
        where = f"{path}: images[{i}] ({filename})"
        split = _require(img, "split", str, where)
        filepath = _require(img, "filepath", str, where) if "filepath" in img else ""
        if "cocoid" in img:
            image_id = _require_id(img, "cocoid", where)
        elif "imgid" in img:
            image_id = _require_id(img, "imgid", where)
        else:
            image_id = i
        sentences = _require(img, "sentences", list, where)
        texts = []
        for j, s in enumerate(sentences):
            swhere = f"{where}: sentences[{j}]"
            if isinstance(s, dict) and "raw" not in s and "tokens" in s:
                tokens = _require(s, "tokens", list, swhere)
                if not all(isinstance(t, str) for t in tokens):
                    raise DataError(f"{swhere}: 'tokens' must be a list of strings")
                texts.append(" ".join(tokens))
            else:
                texts.append(_require(s, "raw", str, swhere))
        image_path = root / filepath / filename
        folder.check(image_path, where, os.path.join(filepath, filename))
        records.append(Record(image_id, image_path, split, _captions(texts, where), _boosted(img, where)))
    check_unique_ids(records, path, "images")
    if check_images:
        _check_images(records, path, root)
    return records


def check_unique_ids(records: list[Record], path: Path, what: str = "records") -> None:
    """Raise :class:`DataError` naming the image ids that several ``records`` share: each image has one record
    holding all its references, and which of two would be meant cannot be guessed."""
    if len({r.image_id for r in records}) == len(records):
        return
    where: dict[int | str, list[int]] = {}
    for k, r in enumerate(records):
        where.setdefault(r.image_id, []).append(k)
    dups = {i: ks for i, ks in where.items() if len(ks) > 1}
    shown = "; ".join(f"id {i!r} in {what}[{', '.join(map(str, ks[:3]))}{', ...' if len(ks) > 3 else ''}]"
                      for i, ks in list(dups.items())[:MAX_LISTED])  # fmt: skip
    raise DataError(
        f"{path}: {len(dups)} image id(s) appear in several {what}: {shown}"
        f"{' ...' if len(dups) > MAX_LISTED else ''}; give each image one entry (with all its captions)"
    )


def read_world(
    path: str | Path, images: str | Path | None = None, check_images: bool = True, allow_outside: bool = False
) -> list[Record]:
    """Read a world data set (``path`` = the world folder or its ``dataset.json``); its image folder is
    ``<world>/images`` (or ``images``)."""
    path = Path(path)
    if path.is_dir():
        path = path / "dataset.json"
    if not path.exists():
        raise DataError(f"{path}: file not found; create the world with `finecap world make --out {path.parent}`")
    return read_karpathy(path, images if images is not None else path.parent / "images", check_images, allow_outside)


def _infer_split(path: Path) -> str:
    name = path.name.lower()
    for split in ("train", "val", "test"):
        if split in name:
            return split
    return "test"


def read_coco_captions(
    path: str | Path,
    images: str | Path | None = None,
    check_images: bool = True,
    split: str | None = None,
    allow_outside: bool = False,
) -> list[Record]:
    """Read COCO caption annotations (``captions_val2014.json`` layout); one record per image, in file order.

    Accepts every variant pycocotools' ``COCO`` class (hence pycocoevalcap) reads: ``images`` entries with only an
    ``id`` (text metrics need no image file; such a record's path is ``<images>/<id>`` and ``check_images`` names
    the missing ``file_name``), extra fields anywhere (ignored), images without annotations (dropped: nothing to
    evaluate or train on), and no ``images`` list at all (images are then those of the annotations, in order).
    Image paths must lie inside ``images`` (:class:`ImageFolder`) unless ``allow_outside``.
    """
    path = Path(path)
    root = Path(images) if images is not None else path.parent
    folder = ImageFolder(root, allow_outside)
    split = split or _infer_split(path)
    data = _load_json(path)
    anns = _require(data, "annotations", list, f"{path}")
    imgs = _require(data, "images", list, f"{path}") if "images" in data else None
    by_id: dict[int | str, tuple[str | None, list[str]]] = {}
    boosts: dict[int | str, dict[str, list[str]]] = {}
    checked = True
    try:  # well-formed images in one tight loop (no boosted captions); the checking loop below names the first bad one
        for img in imgs or ():
            image_id, file_name = img["id"], img.get("file_name")
            if (
                not _is_id(image_id)
                or image_id in by_id
                or "boost" in img
                or (type(file_name) is not str and (file_name is not None or "file_name" in img))
            ):
                raise TypeError
            by_id[image_id] = (file_name, [])
    except (KeyError, TypeError, AttributeError):
        checked = False
    if not checked:
        by_id.clear()
        for i, img in enumerate(imgs):
            where = f"{path}: images[{i}]"
            image_id = _require_id(img, "id", where)
            file_name = _require(img, "file_name", str, f"{where} (id {image_id})") if "file_name" in img else None
            if image_id in by_id:
                raise DataError(f"{where}: duplicate image id {short_repr(image_id)}")
            by_id[image_id] = (file_name, [])
            boosts[image_id] = _boosted(img, where)
    bad = False
    try:  # well-formed annotations in one tight loop; the checking loop below names the first bad one
        if imgs is None:
            for ann in anns:
                by_id.setdefault(ann["image_id"], (None, []))
        for ann in anns:
            caption = ann["caption"]
            if type(caption) is not str or not _is_id(ann["image_id"]):
                raise TypeError
            by_id[ann["image_id"]][1].append(caption)
    except (KeyError, TypeError):
        bad = True
    if bad:
        for entry in by_id.values():
            entry[1].clear()
        for i, ann in enumerate(anns):
            where = f"{path}: annotations[{i}]"
            image_id = _require_id(ann, "image_id", where)
            caption = _require(ann, "caption", str, where)
            if image_id not in by_id:
                if imgs is not None:
                    raise DataError(f"{where}: image_id {short_repr(image_id)} is not in 'images'")
                by_id[image_id] = (None, [])
            by_id[image_id][1].append(caption)
    records = []
    no_file = []
    for image_id, (file_name, caps) in by_id.items():
        if not caps:
            continue
        stripped = [c.strip() for c in caps]
        if not all(stripped):  # an empty caption: the error names the image
            _captions(caps, f"{path}: image id {image_id}" + (f" ({file_name})" if file_name else ""))
        if file_name is None:
            no_file.append(image_id)
        image_path = root / (file_name or str(image_id))
        folder.check(image_path, f"{path}: image id {image_id!r}", file_name or image_id)
        records.append(Record(image_id, image_path, split, stripped, boosts.get(image_id) or {}))
    if not records:
        raise DataError(f"{path}: no image has a caption annotation")
    if check_images:
        if no_file:
            raise DataError(
                f"{path}: {len(no_file)} image(s) have no 'file_name', e.g. ids {no_file[:MAX_LISTED]}; image "
                "metrics and training from images need it (text metrics do not)"
            )
        _check_images(records, path, root)
    return records


def _json_lines(path: Path) -> Iterator[tuple[str, Any]]:
    """``(where, record)`` of every non-blank line of the JSONL file ``path`` (``where``: ``"<path>, line <n>"``),
    streamed: each line is read within :data:`~finecap.utils.LINE` (:func:`~finecap.utils.read_lines`), the file's
    size is not bounded. A line that is not JSON, or a file that is not UTF-8, is a :class:`DataError` naming it."""
    lines = read_lines(path)
    try:
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{path}, line {lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: invalid JSON at column {e.colno}: {e.msg}") from None
            yield where, record
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not a UTF-8 text file ({e.reason})") from None
    finally:
        lines.close()


def read_jsonl(
    path: str | Path,
    images: str | Path | None = None,
    check_images: bool = True,
    split: str = NO_SPLIT,
    allow_outside: bool = False,
) -> list[Record]:
    """Read ``{"image": path, "captions": [...], "id"?, "split"?}`` per line (blank lines are skipped); a line without
    ``split`` gets ``split`` (default :data:`NO_SPLIT`: the commands split such records by
    :func:`finecap.data.splits.assign_splits`). Image paths, absolute ones too, must lie inside ``images``
    (:class:`ImageFolder`) unless ``allow_outside``."""
    path = Path(path)
    root = Path(images) if images is not None else path.parent
    folder = ImageFolder(root, allow_outside)
    if not path.exists():
        raise DataError(f"{path}: file not found")
    records = []
    seen: set[int | str] = set()
    for where, rec in _json_lines(path):
        image = _require(rec, "image", str, where)
        caps = _require(rec, "captions", list, where)
        image_id = _require_id(rec, "id", where) if "id" in rec else image
        rec_split = _require(rec, "split", str, where) if "split" in rec else split
        if image_id in seen:
            raise DataError(f"{where}: duplicate image id {short_repr(image_id)}")
        seen.add(image_id)
        p = Path(image)
        path_ = p if p.is_absolute() else root / p
        folder.check(path_, where, image)
        records.append(Record(image_id, path_, rec_split, _captions(caps, where), _boosted(rec, where)))
    if check_images:
        _check_images(records, path, root)
    return records


def _walk_error(error: OSError) -> None:
    raise DataError(f"{error.filename}: cannot list the folder ({(error.strerror or _one_line(error)).lower()})")


def folder_images(root: str | Path) -> list[str]:
    """The image files under ``root`` (:data:`IMAGE_SUFFIXES`, any case), as sorted paths relative to ``root`` with
    ``/``: every subfolder, linked ones too (each real folder once), but hidden files and folders (``.name``:
    ``.git``, macOS ``._photo.jpg`` files) skipped. A folder that cannot be listed is a :class:`DataError`."""
    found = []
    seen: set[str] = set()
    for dirpath, dirs, files in os.walk(root, onerror=_walk_error, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:  # a link back up, or a second link to one folder
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        rel = Path(os.path.relpath(dirpath, root)).as_posix()
        for name in files:
            if not name.startswith(".") and name.lower().endswith(IMAGE_SUFFIXES):
                found.append(name if rel == "." else f"{rel}/{name}")
    return sorted(found)


@dataclass
class _Entry:
    """What a folder's caption file says about one image."""

    captions: list[str]
    split: str
    where: str


def _relative_image(image: str, where: str) -> str:
    if os.path.isabs(image):
        raise DataError(f"{where}: image {short_repr(image)} must be a path relative to the folder")
    return Path(os.path.normpath(image)).as_posix()


def _sidecar_jsonl(path: Path) -> dict[str, _Entry]:
    entries: dict[str, _Entry] = {}
    for where, rec in _json_lines(path):
        image = _relative_image(_require(rec, "image", str, where), where)
        caps = _require(rec, "captions", list, where)
        split = _require(rec, "split", str, where) if "split" in rec else NO_SPLIT
        if "id" in rec:
            raise DataError(
                f"{where}: 'id' is not read here: a folder's image ids are the images' relative paths (to keep your "
                f"ids, read the file as JSONL: data.format=jsonl data.path={path})"
            )
        if image in entries:
            raise DataError(f"{where}: image {image!r} is listed again (first at {entries[image].where}); give each "
                            "image one line with all its captions")  # fmt: skip
        entries[image] = _Entry(_captions(caps, where) if caps else [], split, where)
    return entries


def _sidecar_csv(path: Path) -> dict[str, _Entry]:
    entries: dict[str, _Entry] = {}
    try:  # line by line, each within LINE; -sig: the byte-order mark spreadsheets write
        with contextlib.closing(read_lines(path, encoding="utf-8-sig", newline="")) as lines:
            reader = csv.DictReader(lines)
            columns = reader.fieldnames or []
            missing = [c for c in ("image", "caption") if c not in columns]
            if missing:
                raise DataError(
                    f"{path}: no column {' or '.join(map(repr, missing))} in the header (columns: "
                    f"{', '.join(map(repr, columns)) or 'none'}); expected image,caption[,split]: one row per caption"
                )
            for row in reader:
                where = f"{path}, line {reader.line_num}"
                written = (row.get("image") or "").strip()
                if not written:
                    raise DataError(f"{where}: empty 'image' cell")
                image = _relative_image(written, where)
                caption = (row.get("caption") or "").strip()
                split = (row.get("split") or "").strip() if "split" in columns else NO_SPLIT
                entry = entries.setdefault(image, _Entry([], split, where))
                if split != entry.split:
                    raise DataError(f"{where}: image {image!r} has split {split!r} here but {entry.split!r} at "
                                    f"{entry.where}; give each image one split")  # fmt: skip
                if caption:  # an empty cell lists the image (and its split) without a caption
                    entry.captions.append(caption)
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not a UTF-8 text file ({e.reason})") from None
    except csv.Error as e:
        raise DataError(f"{path}: not a CSV file ({e})") from None
    return entries


def _caption_txt(path: Path) -> list[str]:
    try:
        text = read_text_bounded(path, CAPTION_TEXT)  # one image's captions: a 10 GB .txt is not read
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not a UTF-8 text file ({e.reason})") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


def read_folder(
    path: str | Path, images: str | Path | None = None, check_images: bool = True, allow_outside: bool = False
) -> list[Record]:
    """Read a folder of images (module docstring, ``folder``): one record per image file under ``path``
    (:func:`folder_images`) and per image a caption file names, sorted by image id, the path relative to the folder
    (``"cats/001.jpg"``). Captions come from ``captions.jsonl`` or ``captions.csv`` at the top of the folder, else
    from a ``.txt`` file next to each image; an image without any has none. Splits are those the sidecar names, else
    :data:`NO_SPLIT`. Every file read, linked ones too (images, ``captions.jsonl`` / ``captions.csv``, each
    ``.txt``), must lie inside the folder (:class:`ImageFolder`: checked before a caption file is opened) unless
    ``allow_outside``; ``images`` (``data.images``), when given, must be the folder itself."""
    path = Path(path)
    if not path.is_dir():
        what = "no such folder" if not path.exists() else "a file, not a folder"
        raise DataError(f"{path}: {what} (data.format=folder reads a folder of images)")
    if images is not None and os.path.realpath(images) != os.path.realpath(path):
        raise DataError(f"{path}: data.format=folder: the folder is the image root; data.images (or --images) must be "
                        f"empty or the folder itself, got {images}")  # fmt: skip
    folder = ImageFolder(path, allow_outside)
    scanned = folder_images(path)
    sidecars = [path / name for name in CAPTION_FILES if (path / name).is_file()]
    if len(sidecars) > 1:
        raise DataError(f"{path}: holds both {' and '.join(p.name for p in sidecars)}; keep one (an image's captions "
                        "come from one place)")  # fmt: skip
    entries: dict[str, _Entry] = {}
    if sidecars:
        sidecar = sidecars[0]
        folder.check(sidecar, str(path), sidecar.name, what="caption file")  # a link out is refused, as an image's
        entries = _sidecar_jsonl(sidecar) if sidecar.suffix == ".jsonl" else _sidecar_csv(sidecar)
    by_txt: dict[str, list[str]] = {}
    for image in scanned:
        by_txt.setdefault(image.rsplit(".", 1)[0] + ".txt", []).append(image)
    txts = {t: imgs for t, imgs in by_txt.items() if (path / t).is_file()}
    if txts and sidecars:
        raise DataError(
            f"{path}: captions in both {sidecars[0].name} and per-image .txt files (e.g. {next(iter(txts))}); keep "
            "one (an image's captions come from one place)"
        )
    for txt, imgs in txts.items():
        if len(imgs) > 1:
            raise DataError(f"{path / txt}: the captions of several images ({', '.join(imgs)}); rename the images so "
                            "that each has its own .txt")  # fmt: skip
        folder.check(path / txt, f"{path}: {txt}", txt, what="caption file")  # read only inside, as images are
        entries[imgs[0]] = _Entry(_caption_txt(path / txt), NO_SPLIT, str(path / txt))
    known = set(scanned)
    extra = [image for image in entries if image not in known]  # named by the sidecar, not found by the scan
    if not scanned and not extra:
        raise DataError(f"{path}: no image files in this folder or below it (file names ending in "
                        f"{', '.join(IMAGE_SUFFIXES)}, any case; hidden files and folders are skipped)")  # fmt: skip
    records = []
    for image in sorted([*scanned, *extra]):
        entry = entries.get(image)
        image_path = path / image
        folder.check(image_path, entry.where if entry else f"{path}: {image}", image)
        records.append(Record(image, image_path, entry.split if entry else NO_SPLIT, entry.captions if entry else []))
    missing = [r.image_id for r in records if not r.path.is_file()] if check_images else []
    if missing:  # named by the caption file but not there, or a broken link
        shown = ", ".join(map(str, missing[:MAX_LISTED])) + (", ..." if len(missing) > MAX_LISTED else "")
        raise DataError(
            f"{sidecars[0] if sidecars else path}: {len(missing)} of {len(records)} images are not image files in "
            f"the folder {path} ({shown}); image paths are relative to the folder"
        )
    return records


def read_dataset(
    fmt: str,
    path: str | Path,
    images: str | Path | None = None,
    check_images: bool = True,
    allow_outside: bool = False,
) -> list[Record]:
    """Read a data set of format ``fmt`` (one of :data:`FORMATS` but ``hf``, which needs its column options: see
    :func:`finecap.data.references.read_records`, the reader for every format). ``allow_outside``
    (``data.allow_outside_paths``) lets records name image files outside the image folder (:class:`ImageFolder`)."""
    readers = {"world": read_world, "karpathy": read_karpathy, "coco": read_coco_captions, "jsonl": read_jsonl,
               "folder": read_folder}  # fmt: skip
    if fmt == "hf":
        raise DataError("data.format=hf: read it with finecap.data.references.read_records (it needs data.* columns)")
    if fmt not in readers:
        raise DataError(f"unknown data set format {fmt!r}; valid formats: {', '.join(FORMATS)}")
    return readers[fmt](path, images, check_images, allow_outside=allow_outside)


def hf_options(cfg: Any) -> dict[str, str]:
    """The ``data.*`` column options of ``data.format=hf`` (:func:`finecap.data.hf.read_hf`)."""
    d = cfg.data
    return {"image_column": d.image_column, "caption_column": d.caption_column, "split_column": d.split_column,
            "id_column": d.id_column}  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------------
# COCO results
# ---------------------------------------------------------------------------------------------------------------------


def read_results(path: str | Path) -> dict[int | str, list[str]]:
    """Read COCO results ``[{"image_id", "caption"}]`` into ``{image_id: [caption, ...]}``, in file order.

    An image listed several times keeps every caption, in the order of the file: this is what pycocotools'
    ``COCO.loadRes`` does (it numbers every entry and ``imgToAnns[image_id]`` lists them all). Its caption scorers
    (pycocoevalcap's BLEU, ROUGE-L, CIDEr) then assert exactly one caption per image, so they reject such a file;
    ``finecap eval`` refuses it too, naming the ids, unless the ``diversity`` group is asked for: an image's captions
    are then its samples, and its first caption is scored by the other groups (:mod:`finecap.app.eval`). An empty
    list gives ``{}``.
    """
    path = Path(path)
    data = _load_json(path)
    if not isinstance(data, list):
        raise DataError(f"{path}: COCO results must be a list of {{'image_id', 'caption'}} objects, got {_type(data)}")
    out: dict[int | str, list[str]] = {}
    try:  # well-formed entries in one tight loop; the checking loop below names the first bad one
        for rec in data:
            image_id, caption = rec["image_id"], rec["caption"]
            if not _is_id(image_id) or type(caption) is not str:
                raise TypeError
            out.setdefault(image_id, []).append(caption)
        return out
    except (KeyError, TypeError):
        out.clear()
    for i, rec in enumerate(data):
        where = f"{path}: [{i}]"
        image_id = _require_id(rec, "image_id", where)
        out.setdefault(image_id, []).append(_require(rec, "caption", str, where))
    return out


def write_results(path: str | Path, captions: dict[int | str, str]) -> None:
    """Write ``{image_id: caption}`` as COCO results ``[{"image_id", "caption"}]`` (atomically, in dict order; never
    through a link; remembered as finecap's, :func:`finecap.outputs.write_output`)."""
    rows = []
    for image_id, caption in captions.items():
        if not isinstance(caption, str):
            raise DataError(f"{path}: caption of image {short_repr(image_id)} must be a string, got {_type(caption)}")
        check_id(image_id, str(path))
        rows.append({"image_id": image_id, "caption": caption})
    write_output(path, json.dumps(rows, indent=None) + "\n", "results")


# ---------------------------------------------------------------------------------------------------------------------
# TrueMatch bags
# ---------------------------------------------------------------------------------------------------------------------


def _finite(value: float) -> bool:
    """Whether ``value`` is a finite float (a 400-digit integer is not: formatting it overflows)."""
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def read_bags(path: str | Path) -> dict[int, list[list[int | str]]]:
    """Read a bags file of ``finecap bags build`` into ``{size: [[image_id, ...], ...]}``.

    Accepts ``{"bags": {size: [bag, ...]}}`` where a bag is ``{"images": [...], ...}`` (what the command writes,
    :mod:`finecap.data.truematch`) or a plain list of image ids; every bag holds at least two images, and a bag's
    ``similarity``, when present, is a number (the review page and the report print it as one).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: bags file not found (build one with `finecap bags build`)")
    data = _load_json(path)
    raw = data.get("bags") if isinstance(data, dict) else None
    if not isinstance(raw, dict):
        raise DataError(f"{path}: expected an object with 'bags': {{size: [{{'images': [...]}}, ...]}}")
    out: dict[int, list[list[int | str]]] = {}
    for key, items in raw.items():
        try:
            size = int(key)
        except ValueError:
            raise DataError(f"{path}: bags key {short_repr(key)} is not a bag size") from None
        if not isinstance(items, list):
            raise DataError(f"{path}: bags[{key!r}] must be a list")
        bags = []
        for j, b in enumerate(items):
            images = b.get("images") if isinstance(b, dict) else b
            if not isinstance(images, list) or len(images) < 2:
                raise DataError(f"{path}: bags[{key!r}][{j}] must hold a list of at least two image ids")
            for item in images:
                check_id(item, f"{path}: bags[{key!r}][{j}]")
            similarity = b.get("similarity") if isinstance(b, dict) else None
            if similarity is not None and (isinstance(similarity, bool) or not isinstance(similarity, int | float)
                                           or not _finite(similarity)):  # fmt: skip
                raise DataError(
                    f"{path}: bags[{key!r}][{j}]: 'similarity' must be a number (finite: the bag's mean cosine "
                    "similarity), "
                    f"got {_type(similarity)} {short_repr(similarity)}"
                )
            bags.append(images)
        out[size] = bags
    return out
