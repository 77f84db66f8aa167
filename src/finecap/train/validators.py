"""What training measures on validation images at each evaluation: the teacher-forced validation loss
(:func:`validation_loss`, always), sample captions (:func:`caption_samples`) and the validators of
``train.validators``.

A validator factory ``factory(cfg) -> validator`` is called once before training; ``validator(model, cfg,
accelerator) -> {name: value}`` then runs at every evaluation on every process (they share the work through
:func:`finecap.caption.generate_captions`), under the run's autocast (:meth:`finecap.train.engine.Engine.evaluate`).
:data:`finecap.registry.VALIDATORS` (re-exported here) maps the built-in names to their import paths (looked up with
:func:`finecap.registry.lookup`, so ``"pkg.module:factory"`` plugs in user code).

- ``captions``: mean length and distinct words of the captions (:func:`finecap.caption.caption_stats`, the same word
  count as ``finecap eval``'s ``Length`` and ``Lexical diversity``);
- ``retrieval``: self-retrieval R@1 against random distractors, scored by the frozen retriever (``retriever.*``),
  plus the caption statistics;
- ``cider``: CIDEr-D of the captions against the validation references (``cider_d``; :func:`cider_validator`), plus
  the caption statistics: what RL runs select their checkpoint by (``train.best_metric=cider_d``), as the
  sequence-level exploration paper reports validation-selected models.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from finecap.caption import caption_stats, generate_captions
from finecap.config import DecodeConfig
from finecap.data.datasets import CaptionDataset, to_device, validation_records
from finecap.data.loading import LoaderSettings, chunks
from finecap.data.samplers import process_slice
from finecap.data.targets import IGNORE_INDEX
from finecap.home import cache_dir
from finecap.metrics.retrieval import SelfRetrieval
from finecap.metrics.suite import evaluate
from finecap.models.retriever import load_retriever
from finecap.objectives.mle import mle_loss
from finecap.objectives.smile import shift_first_tokens
from finecap.registry import VALIDATORS, requires

if TYPE_CHECKING:
    from accelerate import Accelerator

    from finecap.config import Config

    Validator = Callable[[Any, Config, Accelerator], dict[str, float]]

__all__ = ["VALIDATORS", "caption_samples", "caption_stats_validator", "cider_validator", "retrieval_validator",
           "validation_loss"]  # fmt: skip


def caption_stats_validator(cfg: Config) -> Validator:
    """Validator factory (``train.validators=[captions]``): captions ``train.eval_samples`` validation images with
    ``cfg.decode`` and returns :func:`~finecap.caption.caption_stats` (``length``, ``vocab``)."""

    def validator(model: Any, cfg: Config, accelerator: Accelerator) -> dict[str, float]:
        captions = generate_captions(model, cfg, "val", accelerator=accelerator, limit=cfg.train.eval_samples,
                                     progress=False)  # fmt: skip
        return caption_stats(captions)

    return validator


@requires("retriever")
def retrieval_validator(cfg: Config) -> Validator:
    """Validator factory (``train.validators=[retrieval]``): captions ``train.eval_samples`` validation images and
    returns their self-retrieval ``r@1`` (and ``length``, ``vocab``) against ``min(eval.n_distractors, n - 1)``
    random distractor validation images, scored by the frozen retriever (``retriever.*``; the world encoder must have
    been prepared: the factory declares ``needs = {"retriever"}``). With ``train.best_metric=r@1`` the loop keeps
    the checkpoint that retrieves best, as the SMILE paper selects checkpoints. The retriever is loaded here (a
    missing one stops the run before training; in a run, the object the self-retrieval reward then shares:
    :class:`finecap.models.retriever.SharedRetrievers`) and runs on the accelerator's device, in float32, from the
    first evaluation on, where the validation images are embedded once (cached on disk).

    The images are those :func:`~finecap.caption.generate_captions` captions, targets and distractors alike: the
    validation records with the model (:func:`~finecap.data.datasets.validation_records`), so that with
    ``data.skip_bad_images`` an image the model refuses is neither captioned nor embedded and drawn as a
    distractor; fewer than 2 images left is a ``ValueError`` (before training for those that do not decode, at the
    first evaluation for those the model refuses)."""
    retriever = load_retriever(cfg)
    # before training: the images that decode (not said here: the run's read with the model says every one left out)
    _at_least_two(validation_records(cfg, left_out=[]))
    scorers: list[SelfRetrieval] = []

    def scorer_on(model: Any, device: torch.device) -> SelfRetrieval:
        if not scorers:
            records = _at_least_two(validation_records(cfg, model))  # those the model takes
            retriever.model.to(device)
            scorers.append(SelfRetrieval(retriever, records, cache_dir=cache_dir(cfg.run),
                                         n_distractors=min(cfg.eval.n_distractors, len(records) - 1),
                                         draws=cfg.eval.draws, seed=cfg.eval.seed, protocols=("rd",)))  # fmt: skip
        return scorers[0]

    def validator(model: Any, cfg: Config, accelerator: Accelerator) -> dict[str, float]:
        captions = generate_captions(model, cfg, "val", accelerator=accelerator, limit=cfg.train.eval_samples,
                                     progress=False)  # fmt: skip
        # The metric in float32 whatever the run's mixed precision (the evaluation's autocast is off here): r@1 stays
        # comparable between runs, and the image embeddings it caches on disk are float32 ones.
        with torch.autocast(accelerator.device.type, enabled=False):
            scores = scorer_on(model, accelerator.device)({i: c[0] for i, c in captions.items()})
        r1 = next(v for k, v in scores.items() if k.endswith("/R@1"))
        return {"r@1": r1, **caption_stats(captions)}

    return validator


def _at_least_two(records: list) -> list:
    """``records``, or the ``ValueError`` of the retrieval validator when fewer than 2 are left: an image alone is
    retrieved whatever its caption says."""
    if len(records) < 2:
        raise ValueError(f"train.validators=[retrieval] needs at least 2 validation images, got {len(records)} "
                         "(world.n_val; data.skip_bad_images leaves out those that do not decode or the model "
                         "refuses)")  # fmt: skip
    return records


def cider_validator(cfg: Config) -> Validator:
    """Validator factory (``train.validators=[cider]``): captions ``train.eval_samples`` validation images with
    ``cfg.decode`` (the demo's test decoding: beam 5) and returns their CIDEr-D ``cider_d`` (and ``length``,
    ``vocab``). With ``train.best_metric=cider_d`` the loop keeps the checkpoint of the best validation CIDEr-D.

    The score is ``finecap eval``'s ``CIDEr-D`` of these captions against the validation split (the same function,
    :func:`finecap.metrics.suite.evaluate`, captions in the data set's order): the first caption of each image
    against **all** of the image's references (``data.captions``' field, the one the CIDEr-D reward reads from the
    training images), PTB-tokenised, with document frequencies from those validation references (pycocoevalcap's
    default, N = the images scored). All references rather than the demo's "other four" (the demo keeps the first
    for its human row): a validator on COCO or any data set scores against everything the image has, and which
    checkpoint is best does not hinge on that choice. Several processes share the captioning through
    :func:`~finecap.caption.generate_captions` (each gets every caption back) and each scores them, a few
    milliseconds of numpy, so every process holds the same value for the best-checkpoint choice."""

    def validator(model: Any, cfg: Config, accelerator: Accelerator) -> dict[str, float]:
        captions = generate_captions(model, cfg, "val", accelerator=accelerator, limit=cfg.train.eval_samples,
                                     progress=False)  # fmt: skip
        # the images generate_captions captioned: data.skip_bad_images leaves out those the model refuses
        references = {r.image_id: list(r.captions) for r in validation_records(cfg, model)}
        first = {i: captions[i][0] for i in references}  # the data set's order, as finecap eval scores them
        score = evaluate(first, references, metrics=["cider"], cfg=cfg)["CIDEr-D"]
        return {"cider_d": score, **caption_stats(captions)}

    return validator


@torch.no_grad()
def validation_loss(model: Any, data: CaptionDataset, collator: Any, batch_size: int, accelerator: Accelerator, *,
                    loader: LoaderSettings | None = None,
                    shift_token_id: int | torch.Tensor | None = None) -> dict[str, float]:  # fmt: skip
    """Teacher-forced MLE token loss on the validation images (first reference each), summed over processes;
    batches made by ``loader`` (:class:`~finecap.data.loading.LoaderSettings`; default: in this process). With
    ``shift_token_id`` (SMILE's first-token shifting: :func:`~finecap.objectives.smile.validation_shift_token`, one
    id or a table of each token's form) each caption's first token is shifted, input and label, as the model was
    trained to emit it."""
    mine = process_slice(len(data), accelerator.process_index, accelerator.num_processes)
    totals = torch.zeros(2, dtype=torch.float64, device=accelerator.device)  # (nll sum, tokens)
    for batch in (loader or LoaderSettings()).loader(data, chunks(mine, batch_size), collator):
        batch = to_device(batch, accelerator.device)
        if shift_token_id is not None:
            batch = shift_first_tokens(batch, shift_token_id)
        with accelerator.autocast():
            logits = model(batch)  # (B, T, V)
        labels = batch["labels"]  # (B, T)
        nll = mle_loss(logits, labels, reduction="sum")
        totals += torch.stack([nll.double(), (labels != IGNORE_INDEX).sum().double()])
    totals = accelerator.reduce(totals, reduction="sum")
    loss = float(totals[0] / totals[1])
    return {"loss": loss, "perplexity": perplexity(loss)}


def perplexity(loss: float) -> float:
    """``exp(loss)`` of a mean token loss (nats), uncapped: ``inf`` where it exceeds a float (``loss`` above about
    709.78, or ``inf``), NaN for a NaN loss. Until 2026-11-29 it was ``exp(min(loss, 50))``, silently e^50 = 5.2e21
    for every loss above 50: not the model's perplexity, and every such evaluation tied for ``train.best_metric=
    perplexity``; an honest value keeps the order of the losses (an ``inf`` is logged as such, ``null`` named in
    ``"nonfinite"`` in ``metrics.jsonl``, and never becomes the best checkpoint, as no value that is not finite does).

    >>> perplexity(0.0), round(perplexity(60.0) / math.exp(60.0), 6), perplexity(800.0), perplexity(float("inf"))
    (1.0, 1.0, inf, inf)
    """
    if math.isnan(loss):
        return float("nan")
    try:
        return math.exp(loss)
    except OverflowError:
        return float("inf")


@torch.no_grad()
def caption_samples(model: Any, data: CaptionDataset, collator: Any, n: int, max_length: int,
                    accelerator: Accelerator) -> str:  # fmt: skip
    """Greedy captions of the first ``n`` validation images, one ``image_id: caption`` per line (main process)."""
    n = min(n, len(data))
    if n == 0 or not accelerator.is_main_process:
        return ""
    batch = to_device(collator([data[i] for i in range(n)]), accelerator.device)
    gen = model.generate(batch, DecodeConfig(strategy="greedy", max_length=max_length))
    return "\n".join(f"{i}: {t}" for i, t in zip(batch["image_ids"], gen.texts, strict=True))
