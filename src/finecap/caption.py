"""Caption a data split with a captioner: the batched, multi-process generation every evaluation uses.

:func:`generate_captions` decodes the images of a split (the training validators, the demo and the ``finecap
caption`` command, :mod:`finecap.app.caption`, call it): each process decodes a contiguous part of the images and
the results are gathered on every process. A captioner with a frozen encoder reads images through the image-feature
cache (:mod:`finecap.data.features`, built by every process on its part); one whose encoder is trained encodes
pixels, its images decoded and preprocessed in ``data.num_workers`` DataLoader workers (:mod:`finecap.data.loading`).
:func:`caption_stats` summarises captions with the package's one definition of a caption's words
(:func:`finecap.metrics.diversity.caption_words`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from accelerate.utils import gather_object
from tqdm.auto import tqdm

from finecap.data.datasets import (
    CaptionDataset,
    collate_without_refused,
    load_records,
    model_collator,
    split_places,
    to_device,
    whole_split,
)
from finecap.data.features import model_features
from finecap.data.images import ImageLimits
from finecap.data.loading import LoaderSettings, chunks, encoder_draft
from finecap.data.records import MAX_LISTED, DataError
from finecap.data.samplers import process_left
from finecap.decode import chunk_images, step_seeds
from finecap.engines.finecap import as_engine
from finecap.metrics.diversity import lexical_diversity, mean_length
from finecap.utils.system import progress_enabled

if TYPE_CHECKING:
    from accelerate import Accelerator

    from finecap.config import Config, DecodeConfig
    from finecap.engines import GenerationEngine


def autocast_dtype(mixed_precision: str, device: torch.device | str) -> torch.dtype | None:
    """The dtype ``train.mixed_precision`` autocasts to on ``device`` as accelerate sets it up, ``None`` for no
    autocast: ``bf16``: bfloat16; ``fp16``: float16 on a GPU, nothing on the CPU (accelerate has no CPU float16
    autocast and trains there in float32); ``no``: nothing.

    >>> autocast_dtype("fp16", "cpu") is None, autocast_dtype("bf16", "cpu")
    (True, torch.bfloat16)
    """
    if mixed_precision == "bf16":
        return torch.bfloat16
    if mixed_precision == "fp16" and torch.device(device).type != "cpu":
        return torch.float16
    return None


def mixed_precision_autocast(mixed_precision: str, device: torch.device | str) -> contextlib.AbstractContextManager:
    """The autocast that ``train.mixed_precision`` gives on ``device`` (:func:`autocast_dtype`), for captioning
    without the run's ``Accelerator`` (``accelerator.autocast()`` otherwise)."""
    dtype = autocast_dtype(mixed_precision, device)
    return contextlib.nullcontext() if dtype is None else torch.autocast(torch.device(device).type, dtype=dtype)


def batch_captions(engine: GenerationEngine, batch: dict[str, Any], decode: DecodeConfig,
                   seed: int | None = None) -> dict[Any, list[str]]:  # fmt: skip
    """``{image_id: [caption, ...]}`` of one collated batch (its ``image_ids``), ``decode.num_return_sequences`` per
    image, decoded by ``engine`` on its device (:mod:`finecap.engines`). ``seed``: sampling draws from per-image
    seeds of ``(seed, the image's index)`` (:func:`~finecap.decode.step_seeds`, as RL rollouts draw; the batch's
    ``index``: the image's place in the list or split, images left out counted), so an image's samples depend on the
    seed and its place only, not on the batch, the process count, what ran before or what was skipped; ``None``:
    from torch's random generator."""
    seeds = None
    if seed is not None and decode.strategy == "sample":
        seeds = step_seeds(seed, 0, batch["index"]).to(engine.device)  # (B,)
    texts = engine.generate(to_device(batch, engine.device), decode, seeds).texts
    n = decode.num_return_sequences
    return {image_id: list(texts[b * n : (b + 1) * n]) for b, image_id in enumerate(batch["image_ids"])}


class _LeavingOutRefused:
    """The collator's batch without the items whose image the model's preprocessing refuses, their ``(image_id,
    reason)`` under ``"refused"`` (that key alone when none is left): made where the batch is, in a DataLoader
    worker too (:func:`~finecap.data.datasets.collate_without_refused`)."""

    def __init__(self, collator: Callable[[list], dict[str, Any]]) -> None:
        self.collator = collator

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        batch, refused = collate_without_refused(self.collator, items)
        return {**(batch or {}), "refused": [(it["image_id"], reason) for it, reason in refused]}


def generate_captions(
    model: Any,
    cfg: Config,
    split: str,
    *,
    accelerator: Accelerator | None = None,
    limit: int = 0,
    decode: DecodeConfig | None = None,
    use_features: bool | None = None,
    progress: bool = True,
    seed: int | None = None,
    done: Mapping[Any, list[str]] | None = None,
    on_batch: Callable[[dict[Any, list[str]]], None] | None = None,
    refused: list[tuple[Any, str]] | None = None,
) -> dict[Any, list[str]]:
    """``{image_id: [caption, ...]}`` (``decode.num_return_sequences`` per image) for the first ``limit`` images of
    ``split`` (0 = all), decoded with ``decode`` (default ``cfg.decode``); ``seed``: sampling's per-image seeds
    (:func:`batch_captions`; ``None``: torch's random generator), of each image's place in the whole split, those
    ``data.skip_bad_images`` leaves out counted (:func:`~finecap.data.datasets.split_places`).

    ``done``: captions of images already captioned (a resumed ``finecap caption``; the same on every process), not
    decoded again and returned with the rest in the split's order, as a run without them would return them, the
    images left shared evenly among the processes (:func:`~finecap.data.samplers.process_left`); ``on_batch`` is
    called with each batch's captions as they are made.

    With ``data.skip_bad_images`` the split's images are :func:`~finecap.data.datasets.load_records`' with the model:
    those that do not decode and those an encoder that declares refusals (``refuses_images``: Mistral 3's, an image
    of one image token) refuses are left out up front (:func:`~finecap.data.datasets.skipped_images` with the model
    lists them), as training and its validators leave them out. ``refused``: a list (``finecap caption
    --skip-bad-images`` passes one) to which the ``(image_id, reason)`` of every image of the split left out is
    appended, for the caller to say in one warning: first those left out up front, in the split's order (then not
    said by :func:`~finecap.data.datasets.load_records`), then, in the split's order, every other image the model's
    preprocessing refuses (:class:`~finecap.data.images.ImageRefused` from an encoder that does not declare it), that
    image left out (no captions; the rest of its batch is captioned), and an error only when no image is left;
    ``None``: the up-front ones are said in ``load_records``' warning, and the first other refused image is the error
    naming it.

    ``model``: a captioner (decoding itself: :class:`~finecap.engines.finecap.FinecapEngine`), or a generation
    engine serving one (:func:`finecap.engines.open_engine`). ``use_features`` (default: unless the
    model trains its encoder) encodes images through the frozen-feature cache.
    With an ``accelerator`` of several processes the images are split between them and the result gathered.
    Decoding runs under the run's autocast (``accelerator.autocast()``, else ``cfg.train.mixed_precision`` on the
    model's device: :func:`mixed_precision_autocast`), in batches of at most
    ``decode.batch_size`` sequences (:func:`finecap.decode.chunk_images` images).
    """
    decode = decode or cfg.decode
    model = as_engine(model)
    if use_features is None:  # frozen encoders through the cache, when the backbone caches its vision outputs
        use_features = not model.train_encoder and model.cache_features
    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator else (0, 1)
    main = rank == 0
    up_front: list[tuple[Any, str]] | None = None if refused is None else []  # said by the caller, with the rest
    records = load_records(cfg, split, captioned=False, model=model, left_out=up_front)  # images the model refuses out
    if limit:
        records = records[:limit]
    features = None
    if use_features:  # every process computes its part of a missing cache file (model_features)
        features = model_features(model, records, cfg, split, progress=progress and main, processes=accelerator)
    draft = encoder_draft(model.encoder, cfg.data) if features is None else None
    # sampling's seeds follow each image's place in the whole split, those left out counted (as --images' follow
    # the files'): a good image's samples do not depend on whether an earlier one was skipped
    places = split_places(whole_split(cfg, split)) if cfg.data.skip_bad_images else None
    dataset = CaptionDataset(records, per_caption=False, features=features, draft=draft,
                             limits=ImageLimits.of(cfg.data),
                             places=None if places is None else [places[r.image_id] for r in records])  # fmt: skip
    collator = model_collator(model, cfg.data.max_tokens)
    if refused is not None:
        collator = _LeavingOutRefused(collator)
    own_refused: list[tuple[Any, str]] = []
    device = model.device
    done = done or {}
    mine = process_left(len(dataset), rank, world, lambda i: dataset.image_id(i) in done)  # the rest, shared evenly
    out: dict[Any, list[str]] = {}
    batches = chunks(mine, chunk_images(decode))  # decode.batch_size counts sequences (images x beams or samples)
    loader = LoaderSettings.of(cfg.data, device, workers=features is None).loader(dataset, batches, collator)
    autocast = (
        accelerator.autocast()
        if accelerator is not None
        else mixed_precision_autocast(cfg.train.mixed_precision, device)
    )
    with model.decoding(autocast):  # a captioner: eval, full parameters if sharded, no gradient, the run's autocast
        for batch in tqdm(loader, total=len(batches), desc=f"caption [{split}]",
                          disable=not progress_enabled(progress and main), unit="batch"):  # fmt: skip
            if refused is not None:
                own_refused += batch.pop("refused")
                if "image_ids" not in batch:  # every image of the batch refused
                    continue
            made = batch_captions(model, batch, decode, seed)
            out.update(made)
            if on_batch is not None:
                on_batch(made)
    if world > 1:
        merged: dict[Any, list[str]] = {}
        gathered: list[tuple[Any, str]] = []
        for part, part_refused in gather_object([(out, own_refused)]):
            merged.update(part)
            gathered += part_refused
        out, own_refused = merged, gathered
    if done:
        every = {**done, **out}
        out = {r.image_id: every[r.image_id] for r in records if r.image_id in every}
    if refused is not None:
        order = {r.image_id: k for k, r in enumerate(records)}
        own_refused.sort(key=lambda pair: order[pair[0]])
        if own_refused and not out:
            reasons = "; ".join(reason for _, reason in own_refused[:MAX_LISTED])
            raise DataError(f"none of the {len(records)} images of split {split!r} is left to caption (the model "
                            f"refuses every one that decodes; data.skip_bad_images=true): {reasons}")  # fmt: skip
        refused += [(r.image_id, reason) for r, reason in up_front or ()] + own_refused
    return out


def caption_stats(captions: dict[Any, list[str]]) -> dict[str, float]:
    """Mean length in words (:func:`~finecap.metrics.diversity.mean_length`) and number of distinct words
    (:func:`~finecap.metrics.diversity.lexical_diversity`) of the first caption of each image: the ``length`` and
    ``vocab`` of the training log, equal to the ``Length`` and ``Lexical diversity`` of ``finecap eval``.

    Example::

        >>> caption_stats({1: ["A red circle."], 2: ["a circle"]})
        {'length': 2.5, 'vocab': 3.0}
    """
    first = [caps[0] for caps in captions.values() if caps]
    return {"length": mean_length(first), "vocab": float(lexical_diversity(first))}
