"""Built-in training validators (``train.validators``): what the loop measures on validation images at each
evaluation, next to the validation loss.

A validator factory ``factory(cfg) -> validator`` is called once before training; ``validator(model, cfg,
accelerator) -> {name: value}`` then runs at every evaluation on every process (they share the work through
:func:`finecap.caption.generate_captions`). :data:`VALIDATORS` maps the built-in names to their import paths (looked up
with :func:`finecap.registry.lookup`, so ``"pkg.module:factory"`` plugs in user code).

- ``captions``: mean length and distinct words of the captions (:func:`finecap.caption.caption_stats`, the same word
  count as ``finecap eval``'s ``Length`` and ``Lexical diversity``);
- ``retrieval``: self-retrieval R@1 against random distractors, scored by the frozen retriever (``retriever.*``),
  plus the caption statistics.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from finecap.caption import caption_stats, generate_captions
from finecap.data.datasets import load_records
from finecap.metrics.retrieval import SelfRetrieval
from finecap.models.retriever import load_retriever

if TYPE_CHECKING:
    from accelerate import Accelerator

    from finecap.config import Config

    Validator = Callable[[Any, Config, Accelerator], dict[str, float]]

VALIDATORS: dict[str, str] = {
    "captions": "finecap.app.validators:caption_stats_validator",
    "retrieval": "finecap.app.validators:retrieval_validator",
}
"""Built-in validator factories by name (``train.validators``); each ``factory(cfg)`` returns a validator."""


def caption_stats_validator(cfg: Config) -> Validator:
    """Validator factory (``train.validators=[captions]``): captions ``train.eval_samples`` validation images with
    ``cfg.decode`` and returns :func:`~finecap.caption.caption_stats` (``length``, ``vocab``)."""

    def validator(model: Any, cfg: Config, accelerator: Accelerator) -> dict[str, float]:
        captions = generate_captions(model, cfg, "val", accelerator=accelerator, limit=cfg.train.eval_samples,
                                     progress=False)  # fmt: skip
        return caption_stats(captions)

    return validator


def retrieval_validator(cfg: Config) -> Validator:
    """Validator factory (``train.validators=[retrieval]``): captions ``train.eval_samples`` validation images and
    returns their self-retrieval ``r@1`` (and ``length``, ``vocab``) against ``min(eval.n_distractors, n - 1)``
    random distractor validation images, scored by the frozen retriever (``retriever.*``; the world encoder must have
    been trained, :func:`finecap.app.retriever.ensure_world_encoder`). With ``train.best_metric=r@1`` the loop keeps
    the checkpoint that retrieves best, as the SMILE paper selects checkpoints."""
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
