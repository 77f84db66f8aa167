"""Caption a data split with a trained captioner and write COCO results (``[{"image_id", "caption"}]``).

``finecap caption --checkpoint DIR --split test --out results.json [decode.strategy=beam decode.beam_size=3 ...]``
calls :func:`main`: the model (architecture, weights, tokenizer) comes from the checkpoint; the data (``data.*``,
``world.out``) and the decoding options (``decode.*``) from the configuration given on the command line. A
checkpoint with a frozen encoder reads images through the frozen-feature cache (the training run's, when the data
set is the same); one whose encoder was trained encodes pixels.

:func:`generate_captions` is the batched, multi-process generation every evaluation uses (validators, the demo):
each process decodes a contiguous part of the images and the results are gathered on every process.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from finecap.data.datasets import CaptionDataset, load_records, model_collator, to_device
from finecap.data.samplers import process_slice

if TYPE_CHECKING:
    from accelerate import Accelerator

    from finecap.config import Config, DecodeConfig


@torch.no_grad()
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
) -> dict[Any, list[str]]:
    """``{image_id: [caption, ...]}`` (``decode.num_return_sequences`` per image) for the first ``limit`` images of
    ``split`` (0 = all), decoded with ``decode`` (default ``cfg.decode``).

    ``use_features`` (default: unless the model trains its encoder) encodes images through the frozen-feature cache.
    With an ``accelerator`` of several processes the images are split between them and the result gathered.
    """
    from finecap.data.features import model_features

    decode = decode or cfg.decode
    use_features = (not model.train_encoder) if use_features is None else use_features
    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator else (0, 1)
    main = rank == 0
    records = load_records(cfg, split)
    if limit:
        records = records[:limit]
    features = None
    if use_features:  # the main process fills the cache first, the others then read it
        with accelerator.main_process_first() if accelerator is not None else contextlib.nullcontext():
            features = model_features(model, records, cfg, split, progress=progress and main)
    dataset = CaptionDataset(records, per_caption=False, features=features)
    collator = model_collator(model, cfg.data.max_tokens)
    device = model.device
    mine = list(process_slice(len(dataset), rank, world))
    n = decode.num_return_sequences
    was_training = model.training
    model.eval()
    out: dict[Any, list[str]] = {}
    starts = range(0, len(mine), decode.batch_size)
    for start in tqdm(starts, desc=f"caption [{split}]", disable=not (progress and main), unit="batch"):
        batch = collator([dataset[i] for i in mine[start : start + decode.batch_size]])
        generation = model.generate(to_device(batch, device), decode)
        for b, image_id in enumerate(batch["image_ids"]):
            out[image_id] = list(generation.texts[b * n : (b + 1) * n])
    model.train(was_training)
    if world > 1:
        from accelerate.utils import gather_object

        merged: dict[Any, list[str]] = {}
        for part in gather_object([out]):
            merged.update(part)
        out = merged
    return out


def caption_stats(captions: dict[Any, list[str]]) -> dict[str, float]:
    """Mean length in words and number of distinct words of the first caption of each image.

    Example::

        >>> caption_stats({1: ["a red circle"], 2: ["a circle"]})
        {'length': 2.5, 'vocab': 3.0}
    """
    texts = [caps[0] for caps in captions.values() if caps]
    words = [t.split() for t in texts]
    length = sum(len(w) for w in words) / max(1, len(words))
    return {"length": length, "vocab": float(len({x for w in words for x in w}))}


def caption_stats_validator(cfg: Config):
    """Validator factory (``train.validators=[captions]``): captions ``train.eval_samples`` validation images with
    ``cfg.decode`` and returns :func:`caption_stats` (``length``, ``vocab``)."""

    def validator(model: Any, cfg: Config, accelerator: Accelerator) -> dict[str, float]:
        captions = generate_captions(model, cfg, "val", accelerator=accelerator, limit=cfg.train.eval_samples,
                                     progress=False)  # fmt: skip
        return caption_stats(captions)

    return validator


def retrieval_validator(cfg: Config):
    """Validator factory (``train.validators=[retrieval]``): captions ``train.eval_samples`` validation images and
    returns their self-retrieval ``r@1`` (and ``length``) against ``min(eval.n_distractors, n - 1)`` random distractor
    validation images, scored by the frozen retriever (``retriever.*``). With ``train.best_metric=r@1`` the loop keeps
    the checkpoint that retrieves best, as the SMILE paper selects checkpoints."""
    from finecap.metrics.retrieval import SelfRetrieval
    from finecap.models.retriever import load_retriever

    retriever = load_retriever(cfg)
    records = load_records(cfg, "val")
    if cfg.train.eval_samples:
        records = records[: cfg.train.eval_samples]
    if len(records) < 2:
        raise ValueError("train.validators=[retrieval] needs at least 2 validation images (world.n_val)")
    scorer = SelfRetrieval(
        retriever,
        records,
        cache_dir=cfg.run.cache_dir,
        n_distractors=min(cfg.eval.n_distractors, len(records) - 1),
        draws=cfg.eval.draws,
        seed=cfg.eval.seed,
        protocols=("rd",),
    )

    def validator(model: Any, cfg: Config, accelerator: Accelerator) -> dict[str, float]:
        captions = generate_captions(model, cfg, "val", accelerator=accelerator, limit=cfg.train.eval_samples,
                                     progress=False)  # fmt: skip
        scores = scorer({i: c[0] for i, c in captions.items()})
        r1 = next(v for k, v in scores.items() if k.endswith("/R@1"))
        return {"r@1": r1, **caption_stats(captions)}

    return validator


def main(
    cfg: Config, *, checkpoint: str | Path, split: str = "test", out: str | Path, data: str | None = None
) -> Path:
    """Caption ``split`` with the captioner in ``checkpoint``; write COCO results JSON to ``out``; return ``out``.

    ``data`` overrides ``data.path``. Runs on every process of an ``accelerate launch``; only the main process
    writes.
    """
    from finecap.data.formats import write_results
    from finecap.models.clipcap import ClipCap
    from finecap.train.checkpoint import model_dir
    from finecap.app.train import make_accelerator

    if data:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, path=str(data)))
    accelerator = make_accelerator(cfg)
    model = ClipCap.from_checkpoint(model_dir(checkpoint)).to(accelerator.device)
    captions = generate_captions(model, cfg, split, accelerator=accelerator)
    out = Path(out)
    if accelerator.is_main_process:
        write_results(out, {image_id: caps[0] for image_id, caps in captions.items()})
        accelerator.print(f"wrote {len(captions)} captions of split {split!r} to {out}")
    accelerator.wait_for_everyone()
    return out
