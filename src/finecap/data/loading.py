"""The input pipeline: how batches are made from a data set, in DataLoader workers, in one place.

Every loop that reads images (training, captioning and the validation loss, the image-feature cache) gets its
batches from :meth:`LoaderSettings.loader`: a ``torch.utils.data.DataLoader`` whose workers (``data.num_workers``)
decode the images (:func:`finecap.data.images.load_record_image`) and run the collator, which tokenises the
captions and applies the model's image processor. The main process only moves finished batches to the device. What
a batch holds does not depend on the number of workers: batches are given as lists of indices (a batch sampler), so
workers only change *where* a batch is made; ``tests/data/test_loading.py`` checks that 0 and 2 workers give equal
batches.

Settings (``data.*``, :meth:`LoaderSettings.of`):

- ``num_workers``: worker processes; 0 makes batches in the main process. Loops over cached features (nothing to
  decode) use none, except training, whose one DataLoader per run (:class:`finecap.train.engine.Engine`) also
  tokenises in them;
- ``persistent_workers``: the training DataLoader keeps its workers between epochs (it is built once per run);
- ``pin_memory``: batches in page-locked memory, copied to a CUDA device without blocking; only on a CUDA device
  (torch warns and ignores it elsewhere);
- ``jpeg_draft`` (:func:`draft_size`): JPEGs decoded at a reduced scale when the image processor downsizes anyway.

Workers are started by the platform's default ``multiprocessing`` method: ``fork`` on Linux, which shares the data
set and the collator with the workers without copying them. Under ``spawn`` (macOS, Windows) the data set and
collator are pickled to each worker: records of a Hugging Face data set pickle as file paths
(:class:`finecap.data.formats.hf.ArrowImages`), but a collator holding an encoder's ``preprocess`` pickles the encoder.

**JPEG draft** (a choice, measured in docs/data.md): libjpeg can decode a JPEG at 1/2, 1/4 or 1/8 of its size by
scaling in the DCT domain, for a fraction of the work (``PIL.Image.draft``). :func:`draft_size` asks for it only
down to the size the image processor resizes to (both sides stay at least that), so the processor still resizes
*down*, never up. The result is close to, not equal to, the processor's output for the full decode: the DCT scaling
is another low-pass filter than the processor's antialiased resize. On photo-like 640x480 JPEGs and the CLIP
processor the difference is about 1 grey level on average (0-255), at most 8; on pure noise, whose detail is all
above the new Nyquist limit, 11 on average. Images no larger than twice the processor's size are decoded in full
(bit-identical). ``data.jpeg_draft=false`` turns it off; the image-feature cache keys on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, Dataset

from finecap.data.images import DEFAULT_LIMITS, ImageLimits, load_record_image

if TYPE_CHECKING:
    from finecap.config import DataConfig


@dataclass(frozen=True)
class LoaderSettings:
    """How a DataLoader is set up (module docstring); the default makes batches in the main process."""

    num_workers: int = 0
    pin_memory: bool = False
    persistent_workers: bool = False

    @classmethod
    def of(
        cls, data: DataConfig, device: torch.device | str, *, workers: bool = True, per_run: bool = False
    ) -> LoaderSettings:
        """``data.*``'s settings for batches bound for ``device``; ``workers=False`` (nothing to decode) makes them
        in the main process. ``pin_memory`` only for a CUDA device; ``persistent_workers`` only with workers and for
        a loader iterated again and again (``per_run``: training's, one per run); a loader iterated once (captioning,
        the validation loss, the feature cache) lets its workers go when done."""
        n = data.num_workers if workers else 0
        return cls(num_workers=n, pin_memory=data.pin_memory and torch.device(device).type == "cuda",
                   persistent_workers=data.persistent_workers and per_run and n > 0)  # fmt: skip

    def loader(
        self,
        dataset: Any,
        batches: Any,
        collate: Callable[[list], Any],
        *,
        generator: torch.Generator | None = None,
    ) -> DataLoader:
        """A DataLoader of ``dataset`` yielding ``collate(items)`` for each list of indices of ``batches`` (a list,
        or a batch sampler), in order. ``generator`` draws the workers' seeds (a private one keeps the global RNG
        untouched)."""
        return DataLoader(
            dataset,
            batch_sampler=batches,
            collate_fn=collate,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.persistent_workers,
            generator=generator if generator is not None else torch.Generator().manual_seed(0),
        )


def chunks(indices: Sequence[int], size: int) -> list[list[int]]:
    """``indices`` cut into consecutive batches of ``size`` (the last may be shorter).

    Example::

        >>> chunks(range(5), 2)
        [[0, 1], [2, 3], [4]]
    """
    indices = list(indices)
    return [indices[i : i + size] for i in range(0, len(indices), size)]


# ---------------------------------------------------------------------------------------------------------------------
# Images of records, for the feature cache
# ---------------------------------------------------------------------------------------------------------------------


class RecordImages(Dataset):
    """The images of ``records``, decoded when an item is read (in a worker): ``dataset[i]`` is record ``i``'s RGB
    image (:func:`~finecap.data.images.load_record_image`, with ``draft`` and the image budget ``limits``)."""

    def __init__(self, records: Sequence[Any], draft: int | None = None, limits: ImageLimits = DEFAULT_LIMITS) -> None:
        self.records, self.draft, self.limits = list(records), draft, limits

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> Any:
        return load_record_image(self.records[index], self.draft, self.limits)


@dataclass
class Preprocess:
    """Collator of :class:`RecordImages`: ``preprocess(images)`` (an encoder's image processing) or, without one,
    the list of images."""

    preprocess: Callable[[list], Any] | None = None

    def __call__(self, images: list) -> Any:
        return self.preprocess(images) if self.preprocess is not None else list(images)


# ---------------------------------------------------------------------------------------------------------------------
# JPEG draft
# ---------------------------------------------------------------------------------------------------------------------


def draft_size(image_processor: Any) -> int | None:
    """The side (pixels) a JPEG may be draft-decoded down to for ``image_processor`` (module docstring), or ``None``
    when it cannot be told: the processor does not resize, or resizes by pixel count (Qwen2-VL's ``min_pixels`` /
    ``max_pixels``, which it also stores as ``size``'s ``shortest_edge`` / ``longest_edge``: a ``size`` with both is
    not trusted), or its ``size`` is of an unknown kind.

    From ``size``: ``shortest_edge`` (CLIP: the short side is resized to it), ``height``/``width`` (BLIP: resized to
    exactly that; the larger of the two, so that any orientation works), ``longest_edge`` alone (Idefics3: a square
    box of that side keeps the long side at least that; conservative), or a plain number.

    Example::

        >>> from types import SimpleNamespace as P
        >>> draft_size(P(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224}))
        224
        >>> draft_size(P(size={"height": 384, "width": 384})), draft_size(P(size={"longest_edge": 1456}))
        (384, 1456)
        >>> draft_size(P(size={"shortest_edge": 3136, "longest_edge": 12845056})) is None  # Qwen2-VL: pixel counts
        True
    """
    if image_processor is None or not getattr(image_processor, "do_resize", True):
        return None
    if getattr(image_processor, "min_pixels", None) or getattr(image_processor, "max_pixels", None):
        return None  # sizes by area: no side to keep
    size = getattr(image_processor, "size", None)
    if isinstance(size, int) and not isinstance(size, bool):
        return size if size > 0 else None
    keys = ("shortest_edge", "longest_edge", "height", "width")
    if isinstance(size, dict):
        edges = {k: size.get(k) for k in keys}
    elif size is not None:  # transformers' SizeDict
        edges = {k: getattr(size, k, None) for k in keys}
    else:
        return None
    shortest, longest, height, width = (edges[k] for k in keys)
    if shortest and longest:  # Qwen2-VL names its min_pixels / max_pixels so: not sides
        return None
    if shortest:
        return int(shortest)
    if height and width:
        return int(max(height, width))
    if longest:
        return int(longest)
    return None


def encoder_draft(encoder: Any, data: DataConfig) -> int | None:
    """:func:`draft_size` of a captioner's ``encoder`` (its ``image_processor``) when ``data.jpeg_draft`` is on;
    ``None`` (full decodes) otherwise, or when the encoder shows no image processor."""
    if not data.jpeg_draft or encoder is None:
        return None
    return draft_size(getattr(encoder, "image_processor", None))
