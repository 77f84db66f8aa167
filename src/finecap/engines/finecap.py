"""finecap's own generation engine (``decode.engine=finecap``, the default): the captioner decodes itself with
finecap's batched decoder (:mod:`finecap.decode`), for every backbone.

:class:`FinecapEngine` wraps the captioner: its :meth:`~FinecapEngine.generate` is the captioner's ``generate``, its
collator inputs are the captioner's (tokenizer, the encoder's preprocessing, the frozen-feature cache when the
encoder is frozen), it decodes in the captioner's process and device (:meth:`~FinecapEngine.decoding`: eval mode,
full parameters when sharded, no gradient, the run's autocast) and its log-probs are the trainer's own, so RL
rollouts need no importance correction and :meth:`~FinecapEngine.sync` has nothing to send.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch

from finecap.engines.base import GenerationEngine
from finecap.models import sharding

if TYPE_CHECKING:
    from finecap.config import Config, DecodeConfig
    from finecap.decode import Generation


@contextlib.contextmanager
def module_decoding(model: torch.nn.Module, autocast: AbstractContextManager[Any]) -> Iterator[None]:
    """Within the block, ``model`` decodes as every captioning loop needs: in eval mode, with full parameters when it
    is sharded (:func:`finecap.models.sharding.decoding`), without gradient, under ``autocast`` (the run's); its mode
    is restored after, also after an error."""
    was_training = model.training
    model.eval()
    try:
        with sharding.decoding(model), torch.no_grad(), autocast:
            yield
    finally:
        model.train(was_training)


class FinecapEngine(GenerationEngine):
    """The captioner ``model`` decoding itself (module docstring). Attribute: ``model``."""

    def __init__(self, model: Any) -> None:
        self.model = model

    @classmethod
    def open(cls, model: Any, cfg: Config | None = None, *, tempered: bool = False) -> FinecapEngine:
        """The engine of ``model``; ``cfg`` and ``tempered`` change nothing (the rollouts score their captions with
        the trainer's forward)."""
        return cls(model)

    def generate(self, batch: dict[str, Any], decode: DecodeConfig, seeds: torch.Tensor | None = None) -> Generation:
        return self.model.generate(batch, decode, seeds=seeds)

    def decoding(self, autocast: AbstractContextManager[Any]) -> AbstractContextManager[Any]:
        """:func:`module_decoding` of the captioner (a torch module; anything else decodes as it is)."""
        if not isinstance(self.model, torch.nn.Module):
            return contextlib.nullcontext()
        return module_decoding(self.model, autocast)

    def sync(self, policy: Any) -> None:
        """Decode with ``policy`` from now on (the captioner being trained is its own weights: nothing to send)."""
        self.model = policy

    # ---- the captioner's inputs, as the captioning loops read them -------------------------------------------------

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return self.model.device

    @property
    def tokenizer(self) -> Any:  # type: ignore[override]
        return self.model.tokenizer

    @property
    def encoder(self) -> Any:
        return self.model.encoder

    @property
    def train_encoder(self) -> bool:  # type: ignore[override]
        return self.model.train_encoder

    @property
    def cache_features(self) -> bool:  # type: ignore[override]
        return self.model.cache_features


def as_engine(model_or_engine: Any) -> GenerationEngine:
    """``model_or_engine`` itself when it is a :class:`GenerationEngine`, else the captioner it is, decoding itself
    (:class:`FinecapEngine`): what the captioning loops decode with."""
    if isinstance(model_or_engine, GenerationEngine):
        return model_or_engine
    return FinecapEngine(model_or_engine)
