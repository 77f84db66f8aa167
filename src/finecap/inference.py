"""Caption images that belong to no data set: files named on a command line, folders of them, PIL images in a notebook.

One path, shared by ``finecap caption --images`` (:mod:`finecap.app.caption`) and the Python API
(:class:`finecap.api.Captioner`):

- :func:`load_for_captioning`: a checkpoint's captioner on a device, its weights checked;
- :func:`image_files`: the image files under the folders and files named, each with its image id (:func:`image_ids`);
- :func:`caption_images`: image files or PIL images captioned in batches, on the model's device, under the run's
  autocast, with a progress bar, bad images named (or skipped and counted).

**Image ids** (:func:`image_ids`; a choice, made for COCO results): when the file name of *every* image, without its
extension, is a number (COCO 2017's ``000000391895.jpg``, Flickr30k's ``1000092795.jpg``) or COCO 2014's
``COCO_<set>_<number>`` (``COCO_val2014_000000391895.jpg``), and no two images share a number, the ids are those
numbers as integers (``391895``): the ids COCO's annotations and its evaluation server use, when every one is within
:data:`~finecap.data.records.MAX_INT_ID` (2**53 - 1, what every JSON reader holds exactly). Otherwise (a 29-digit
name, ``cat.jpg`` among them; ``red/0.png`` beside ``blue/0.png``) every id is the image's path relative to the
folder it was found in, with ``/`` (``"cats/001.jpg"``: the id the ``folder`` data format gives,
:func:`finecap.data.formats.folder.read_folder`), or its file name when it was named as a file. Two images with one
such id are an error naming both files (``a/x.jpg`` and ``b/x.jpg`` given as the folders ``a`` and ``b``: pass their
common folder instead).

Images are read by :func:`finecap.data.images.load_image` (the one reader of image files: EXIF orientation honoured,
16-bit, palette, alpha and CMYK images converted, decompression bombs and images over the image budget refused:
``data.max_image_pixels``, ``data.max_aspect_ratio``, :class:`~finecap.data.images.ImageLimits`); a PIL image is
used as given, within the same budget, turned upright by its EXIF orientation and converted to 8-bit RGB the same
way.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from finecap.config import RunConfig
from finecap.data.containment import ImageFolder
from finecap.data.formats.folder import folder_images, utf8_name
from finecap.data.images import DEFAULT_LIMITS, IMAGE_SUFFIXES, ImageLimits, load_image, url_note
from finecap.data.records import MAX_LISTED, DataError, file_number
from finecap.home import runs_root, start_path
from finecap.utils.text import one_line

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator
    from PIL import Image

    from finecap.config import Config, DecodeConfig

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------------------------------
# The checkpoint's captioner
# --------------------------------------------------------------------------------------------------------------------


def load_for_captioning(checkpoint: str | Path, cfg: Config, device: torch.device | str) -> Any:
    """The captioner of ``checkpoint`` (a folder :func:`finecap.runs.find_checkpoint` gave) loaded with
    ``cfg.model``'s options (dtype, attention, quantization), on ``device``, in evaluation mode. On a CUDA device the
    pretrained weights are read straight onto it (:func:`finecap.models.memory.loading_onto`: no copy of the model in
    host memory first), then the rest (a ClipCap's mapper) is moved there; on any other device the captioner loads
    on the CPU and is moved. Every entry point that captions loads through here (``finecap caption``,
    :class:`finecap.api.Captioner`). Loading is strict (:mod:`finecap.models.strict`): weights that do not fit the
    model, or hold NaN or infinity (a diverged run's weights caption nothing, silently), are a
    :class:`~finecap.runs.CheckpointError` naming the file. A captioner whose weights were trained with SMILE's
    first-token shifting (``cfg`` says so, or its ``captioner.json`` records it: an RL run started from such weights,
    an export) writes its captions without the shift token (:func:`finecap.models.first_token.decode_unshifted`).
    """
    from finecap.models.backbones import load_captioner
    from finecap.models.first_token import decode_unshifted
    from finecap.models.memory import LoadOptions, loading_onto
    from finecap.runs import model_dir

    with loading_onto(device):
        encoder_at = None if cfg.model.encoder == "world" else cfg.model.encoder  # a frozen encoder that moved
        model = load_captioner(model_dir(checkpoint), options=LoadOptions.of(cfg.model), encoder_at=encoder_at)
    return decode_unshifted(model, cfg).to(device).eval()


# --------------------------------------------------------------------------------------------------------------------
# Image files and their ids
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageFile:
    """One image to caption: its id (module docstring) and its file."""

    image_id: int | str
    path: Path


def image_files(sources: Sequence[str | os.PathLike[str]], *, allow_outside: bool = False) -> list[ImageFile]:
    """The images of ``sources``, in order: each folder's image files (recursive, :data:`IMAGE_SUFFIXES` in any case,
    hidden files and folders skipped: :func:`~finecap.data.formats.folder.folder_images`), sorted, and each file as
    named (whatever its name ends in: it must decode as an image when read). Their ids follow :func:`image_ids`.

    A folder's images must lie inside it once links are followed (:class:`~finecap.data.containment.ImageFolder`, as
    for a ``folder`` data set) unless ``allow_outside`` (``data.allow_outside_paths``). A source that does not exist, a
    folder without images, no source at all and an image whose name is not UTF-8
    (:func:`~finecap.data.formats.folder.utf8_name`) are a :class:`~finecap.data.records.DataError` naming it."""
    if not sources:
        raise DataError("no images to caption: name image files or folders of images")
    found: list[tuple[str, Path]] = []  # (path relative to the folder named, or the file's name; the file)
    for source in sources:
        path = Path(source)
        if path.is_dir():
            folder = ImageFolder(path, allow_outside)
            names = folder_images(path, say_unread=True)
            if not names:
                suffixes = ", ".join(IMAGE_SUFFIXES)
                raise DataError(f"{path}: no image files in this folder or below it (names ending in {suffixes}, any "
                                "case; hidden files and folders skipped)")  # fmt: skip
            for name in names:
                folder.check(path / name, f"{path}: {name}", name)
                found.append((name, path / name))
        elif path.exists():
            found.append((utf8_name(path.name, path.parent), path))
        else:
            raise DataError(f"{source}: no such image file or folder{url_note(source)}")
    return [ImageFile(i, p) for i, (_, p) in zip(image_ids(found), found, strict=True)]


def image_ids(images: Sequence[tuple[str, Path]]) -> list[int | str]:
    """The ids of ``images`` (``(relative name, file)`` pairs; the rule of the module docstring): integers when every
    file stem is a number or ``COCO_<set>_<number>``, no number is beyond
    :data:`~finecap.data.records.MAX_INT_ID` (a 29-digit name stays a name) and no two are equal, else the relative
    names, with a warning naming the files that made them names when some are numbers (:func:`_why_paths`). Two
    images with one relative name are a :class:`~finecap.data.records.DataError` naming both files.

    Example::

        >>> from pathlib import Path
        >>> image_ids([("000000391895.jpg", Path("coco/000000391895.jpg")),
        ...            ("COCO_val2014_000000000042.jpg", Path("old/COCO_val2014_000000000042.jpg"))])
        [391895, 42]
        >>> image_ids([("cats/001.jpg", Path("photos/cats/001.jpg")), ("dog.png", Path("photos/dog.png"))])
        ['cats/001.jpg', 'dog.png']
        >>> image_ids([("red/0.png", Path("shapes/red/0.png")), ("blue/0.png", Path("shapes/blue/0.png"))])
        ['red/0.png', 'blue/0.png']
        >>> image_ids([("x.png", Path("a/x.png")), ("x.png", Path("b/x.png"))])
        Traceback (most recent call last):
        ...
        finecap.data.records.DataError: a/x.png and b/x.png both have the image id 'x.png' (the same name relative to the folders named); pass the folder holding both instead
    """  # noqa: E501
    numbers = [file_number(name) for name, _ in images]
    if images and None not in numbers and len(set(numbers)) == len(numbers):
        return numbers  # type: ignore[return-value]
    if any(n is not None for n in numbers):  # numbered names, but not all: say which files made the ids paths
        log.warning("image ids: %s", _why_paths(images, numbers))
    first: dict[str, Path] = {}
    for name, path in images:
        if name in first:
            raise DataError(f"{first[name]} and {path} both have the image id {name!r} (the same name relative to "
                            "the folders named); pass the folder holding both instead")  # fmt: skip
        first[name] = path
    return [name for name, _ in images]


def _why_paths(images: Sequence[tuple[str, Path]], numbers: Sequence[int | None]) -> str:
    """Why the ids of ``images`` are paths though some of their names are numbers (``numbers``: each one's
    :func:`~finecap.data.records.file_number`): the files named by no number and those sharing a number (at most
    :data:`MAX_LISTED` of each), and what the ids would have been (docs/caption.md)."""

    def listed(items: list[str]) -> str:
        return ", ".join(items[:MAX_LISTED]) + (
            f" and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else ""
        )

    unnumbered = [str(path) for (_, path), n in zip(images, numbers, strict=True) if n is None]
    by_number: dict[int, list[str]] = {}
    for (_, path), n in zip(images, numbers, strict=True):
        if n is not None:
            by_number.setdefault(n, []).append(str(path))
    shared = [f"{' and '.join(paths)} (both {n})" if len(paths) == 2 else f"{', '.join(paths)} (all {n})"
              for n, paths in by_number.items() if len(paths) > 1]  # fmt: skip
    causes = []
    if unnumbered:
        causes.append(f"{len(unnumbered)} file name(s) are no number ({listed(unnumbered)})")
    if shared:
        causes.append(f"{len(shared)} number(s) name several files ({listed(shared)})")
    name, n = next((name, n) for (name, _), n in zip(images, numbers, strict=True) if n is not None)
    return (f"every image id is the image's path, not its number ({name!r}, not {n}), because "
            f"{' and '.join(causes)}; results matched to references by number (COCO's) will find none: rename or "
            "move those files to keep the numbers")  # fmt: skip


# --------------------------------------------------------------------------------------------------------------------
# Captioning
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class ImageCaptions:
    """What :func:`caption_images` returns: per image, in the order given, its captions
    (``decode.num_return_sequences`` of them) or ``None`` when it was skipped; and ``(index, reason)`` of each
    skipped image (the reason names its file)."""

    captions: list[list[str] | None]
    skipped: list[tuple[int, str]] = field(default_factory=list)


def upright_rgb(image: Image.Image, name: str = "the image") -> Image.Image:
    """A PIL image as :func:`~finecap.data.images.load_image` would give its file: turned upright by its EXIF
    orientation (none: as it is; an image already turned has none left), as 8-bit RGB. An image whose pixels cannot
    be read is a :class:`DataError` beginning with ``name``: one closed before its pixels were read (``with
    Image.open(path) as image:`` left before ``image.load()``, or ``image.close()``: PIL's bare ``AssertionError`` or
    ``ValueError``), or a file opened lazily that does not decode (truncated, damaged: PIL's ``OSError``)."""
    from PIL import ImageOps

    from finecap.data.images import to_rgb  # the one conversion of 16-bit, palette, alpha and CMYK images

    try:
        image.load()  # the pixels read now (already read: nothing to do), so that what fails is said as what it is
    except (AssertionError, AttributeError, ValueError):
        if getattr(image, "fp", None) is not None:  # its file is open: another problem, PIL's own
            raise
        raise DataError(f"{name}: the image is closed: its file was closed before its pixels were read (a `with "
                        "Image.open(...)` block left, or .close()); pass its path, or call .load() on it before "
                        "closing it") from None  # fmt: skip
    except OSError as e:
        raise DataError(f"{name}: the image does not decode: {one_line(e)}") from None
    return to_rgb(ImageOps.exif_transpose(image), name)


class _Images:
    """Items of the collator (:func:`finecap.data.datasets.model_collator`) for images or their files, decoded when
    read (in a DataLoader worker with ``num_workers``) within the image budget ``limits`` (a PIL image too: the
    image processor would resize a 1 x 60,000 strip as it would the file); a bad image raises its
    :class:`DataError`, or with ``skip`` becomes ``{"index", "problem"}``."""

    def __init__(self, images: Sequence[Any], indices: Sequence[int], skip: bool, limits: ImageLimits,
                 draft: int | None = None) -> None:  # fmt: skip
        self.images, self.indices, self.skip, self.limits, self.draft = images, list(indices), skip, limits, draft

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int) -> dict[str, Any]:
        from PIL import Image

        index = self.indices[k]
        source = self.images[index]
        try:
            if isinstance(source, Image.Image):
                name = f"image {index} of the list (a PIL image)"
                self.limits.check(*source.size, name)
                image = upright_rgb(source, name)
            else:
                name = str(source)
                image = load_image(source, draft=self.draft, limits=self.limits)
        except DataError as e:
            if not self.skip:
                raise
            return {"index": index, "problem": str(e)}
        return {"index": index, "image_id": index, "caption": "", "references": [], "image": image, "image_name": name}


class _Collate:
    """A batch of the good items (``None`` when none is) and ``(index, reason)`` of the bad ones: those that did not
    decode (:class:`_Images`) and, with ``skip``, those whose image the model's preprocessing refuses
    (:func:`~finecap.data.datasets.collate_without_refused`; without ``skip`` the refusal is the error)."""

    def __init__(self, collator: Any, skip: bool = False) -> None:
        self.collator, self.skip = collator, skip

    def __call__(self, items: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, list[tuple[int, str]]]:
        from finecap.data.datasets import collate_without_refused

        good = [it for it in items if "problem" not in it]
        bad = [(it["index"], it["problem"]) for it in items if "problem" in it]
        if not self.skip:
            return (self.collator(good) if good else None), bad
        batch, refused = collate_without_refused(self.collator, good)
        return batch, bad + [(it["index"], reason) for it, reason in refused]


def caption_images(
    model: Any,
    images: Sequence[Any],
    decode: DecodeConfig,
    *,
    mixed_precision: str = "no",
    skip_bad_images: bool = False,
    num_workers: int = 0,
    accelerator: Accelerator | None = None,
    progress: bool = True,
    limits: ImageLimits = DEFAULT_LIMITS,
    draft: int | None = None,
    seed: int | None = None,
    done: Mapping[int, list[str]] | None = None,
    on_batch: Callable[[dict[int, list[str]]], None] | None = None,
) -> ImageCaptions:
    """Caption ``images`` (PIL images or image file paths, mixed freely) with ``model`` (a captioner, decoding itself,
    or a generation engine serving one: :func:`finecap.engines.open_engine`), decoded with ``decode``.

    Images are read and preprocessed by the model's own preprocessing in batches of
    :func:`~finecap.decode.chunk_images` images (``decode.batch_size`` counts sequences: images x beams or samples),
    in ``num_workers`` DataLoader worker processes (0: in this process), then decoded on the model's device under
    the run's autocast (``accelerator.autocast()``, else ``mixed_precision``:
    :func:`~finecap.caption.mixed_precision_autocast`) with the encoder run on pixels (a data set's frozen-feature
    cache is not used: these images belong to none). With an ``accelerator`` of several processes each captions a
    contiguous part and every process gets all captions.

    A file that does not decode as an image (:func:`~finecap.data.images.load_image`: missing, empty, damaged,
    truncated, over the image budget ``limits`` or the decompression-bomb limit; a PIL image over ``limits`` too),
    and an image the model's preprocessing refuses (:class:`~finecap.data.images.ImageRefused`: Mistral 3 an image
    of one image token), is a :class:`~finecap.data.records.DataError` naming it; a JPEG file is decoded at
    ``draft`` pixels as the run's data loading decodes it (``data.jpeg_draft``:
    :func:`finecap.data.loading.encoder_draft`); with ``skip_bad_images`` it is left out (``None``) and counted in
    ``skipped`` with its reason, and it is an error only when every image is left out. Reading the images draws
    nothing from torch's global random generator; sampling draws from it, or with ``seed`` from per-image seeds of
    ``(seed, the image's position in images)`` (:func:`finecap.caption.batch_captions`: the same samples in any
    batch size and process count).

    ``done``: the captions of the images already captioned, by index (a resumed ``finecap caption``; the same on
    every process): not read again and returned with the rest, as a run without them would return them, the images
    left shared evenly among the processes (:func:`~finecap.data.samplers.process_left`); ``on_batch`` is called
    with each batch's captions, ``{index: captions}``, as they are made (the images it skipped are not among them: a
    resumed run reads them again)."""
    import torch
    from accelerate.utils import gather_object
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm

    from finecap.caption import batch_captions, mixed_precision_autocast
    from finecap.data.datasets import model_collator
    from finecap.data.samplers import process_left
    from finecap.decode import chunk_images
    from finecap.engines.finecap import as_engine
    from finecap.utils.system import progress_enabled

    if not images:
        raise DataError("no images to caption")
    model = as_engine(model)  # a captioner decodes itself
    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator is not None else (0, 1)
    done = done or {}
    mine = process_left(len(images), rank, world, done.__contains__)  # what is left, shared evenly
    loader = DataLoader(
        _Images(images, mine, skip_bad_images, limits, draft),
        batch_size=chunk_images(decode),
        num_workers=num_workers,
        collate_fn=_Collate(model_collator(model, 1), skip_bad_images),  # one token: the empty caption's EOS
        generator=torch.Generator().manual_seed(0),  # the workers' seeds: a private one keeps the global RNG untouched
    )
    device = model.device
    autocast = accelerator.autocast() if accelerator is not None else mixed_precision_autocast(mixed_precision, device)
    out: dict[int, list[str] | None] = dict(done) if rank == 0 else {}
    skipped: list[tuple[int, str]] = []
    with model.decoding(autocast):  # a captioner: eval, full parameters if sharded, no gradient, the run's autocast
        shown = progress_enabled(progress and rank == 0)
        for batch, bad in tqdm(loader, desc="caption [images]", unit="batch", disable=not shown):
            made = batch_captions(model, batch, decode, seed) if batch is not None else {}
            skipped += bad
            out.update(dict.fromkeys((i for i, _ in bad), None))
            out.update(made)
            if on_batch is not None and made:
                on_batch(made)
    if world > 1:
        merged: dict[int, list[str] | None] = {}
        gathered_skips: list[tuple[int, str]] = []
        for part, part_skipped in gather_object([(out, skipped)]):
            merged.update(part)
            gathered_skips += part_skipped
        out, skipped = merged, sorted(gathered_skips)
    skipped.sort()
    if skipped and len(skipped) == len(images):
        reasons = "; ".join(reason for _, reason in skipped[:MAX_LISTED])
        raise DataError(f"none of the {len(images)} images decodes (every one skipped as bad): {reasons}")
    return ImageCaptions([out[i] for i in range(len(images))], skipped)


def describe_skipped(skipped: Sequence[tuple[Any, str]], total: int, images: str = "images") -> str:
    """``skipped 2 of 12 images: REASON; REASON`` of ``skipped`` (``(key, reason)`` pairs: an :class:`ImageCaptions`'
    ``skipped``) among ``total`` ``images`` (at most :data:`MAX_LISTED` reasons): the one warning of ``finecap caption
    --skip-bad-images``. Each reason says why its image was left out (it does not decode, or the model refuses it).

    >>> describe_skipped([(0, "a.png: damaged image"), (2, "c.png: 8 x 8 pixels gives one image token")], 3)
    'skipped 2 of 3 images: a.png: damaged image; c.png: 8 x 8 pixels gives one image token'
    >>> describe_skipped([(0, "a.png: damaged image")], 3, "images of split 'test'")
    "skipped 1 of 3 images of split 'test': a.png: damaged image"
    """
    shown = "; ".join(reason for _, reason in skipped[:MAX_LISTED])
    more = "; ..." if len(skipped) > MAX_LISTED else ""
    return f"skipped {len(skipped)} of {total} {images}: {shown}{more}"


def checkpoint_where(checkpoint: str | Path, root: str = "", option: str = "--checkpoint") -> Path:
    """A checkpoint or run named as ``train.init_from`` is (:func:`finecap.home.start_path`): as given when absolute or
    when it exists from the working directory, else under the runs root (``root``: ``run.root``; empty:
    ``<home>/runs``): ``finecap caption --checkpoint demo/mle`` and ``Captioner.from_pretrained("demo/mle")`` read the
    run ``finecap train demo/mle`` wrote. Found nowhere: a ``FileNotFoundError`` naming ``option``, where it was looked
    for and, when a packaged recipe writes there, the command that makes it."""
    run = RunConfig(root=root)
    path = start_path(str(checkpoint), run)
    if path.exists():
        return path
    from finecap.train.setup import maker_of  # only here: it imports the training stack

    looked = "" if Path(checkpoint).is_absolute() else f" (looked in the working directory and in {runs_root(run)})"
    maker = maker_of(path, root)
    how = f"; make it with `{maker}`" if maker else ""
    raise FileNotFoundError(f"{option} {checkpoint}: checkpoint or run directory not found{looked}{how}")
