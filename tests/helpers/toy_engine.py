"""A generation engine written as a user would write one, on :class:`finecap.engines.base.GenerationEngine`: only its
facts and hooks, following "Generation engines" in ``docs/architecture.md``.

``ColourEngine`` captions each image with the colour of tests/helpers/shapes.py nearest its mean pixel (``"the red
one"``), from the batch's PIL images (``reads_images``), as token ids of the captioner's tokenizer ending in its EOS,
each token given log-prob 0 (``external_logprobs``: they are not the trainer's). It refuses BLIP by name. It is
registered nowhere: ``decode.engine=helpers.toy_engine:ColourEngine`` names it (tests/engines/test_toy_engine.py).
Every engine it opens is recorded in :data:`OPENED` (with the times it was synced and whether it was closed).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from finecap.config import Config
from finecap.decode import Generation
from finecap.engines.base import GenerationEngine, images_of
from helpers.shapes import COLORS

NAME = "helpers.toy_engine:ColourEngine"
OPENED: list[ColourEngine] = []


def colour_caption(image: Any) -> str:
    """``"the <colour> one"`` for the colour of :data:`helpers.shapes.COLORS` nearest ``image``'s mean RGB."""
    mean = np.asarray(image.convert("RGB"), dtype=np.float64).reshape(-1, 3).mean(0)
    name = min(COLORS, key=lambda c: float(((mean - np.array(COLORS[c])) ** 2).sum()))
    return f"the {name} one"


class ColourEngine(GenerationEngine):
    reads_images: ClassVar[bool] = True
    external_logprobs: ClassVar[bool] = True

    def __init__(self, tokenizer: Any, tempered: bool) -> None:
        self.tokenizer, self.tempered = tokenizer, tempered
        self.synced, self.closed = 0, False

    @classmethod
    def refusal(cls, model_or_cfg: Any) -> str | None:
        kind = model_or_cfg.model.kind if isinstance(model_or_cfg, Config) else getattr(model_or_cfg, "kind", "")
        return f"decode.engine={NAME}: model.kind=blip is not served by the toy engine" if kind == "blip" else None

    @classmethod
    def open(cls, model: Any, cfg: Config, *, tempered: bool = False) -> ColourEngine:
        engine = cls(model.tokenizer, tempered)
        OPENED.append(engine)
        return engine

    def generate(self, batch: dict[str, Any], decode: Any, seeds: torch.Tensor | None = None) -> Generation:
        n = decode.num_return_sequences
        texts = [colour_caption(im) for im in images_of(batch, f"decode.engine={NAME}") for _ in range(n)]
        eos = self.tokenizer.eos_token_id
        rows = [self.tokenizer(t, add_special_tokens=False)["input_ids"] + [eos] for t in texts]
        L = max(len(r) for r in rows)
        sequences = torch.full((len(rows), L), eos, dtype=torch.long)
        for i, r in enumerate(rows):
            sequences[i, : len(r)] = torch.tensor(r)
        lengths = torch.tensor([len(r) for r in rows])
        return Generation(sequences=sequences, token_logprobs=torch.zeros(len(rows), L), lengths=lengths,
                          image_index=torch.arange(len(rows) // n).repeat_interleave(n),
                          scores=torch.zeros(len(rows)), texts=texts)  # fmt: skip

    def sync(self, policy: Any) -> None:
        self.synced += 1

    def close(self) -> None:
        self.closed = True


class NoTokenEngine(ColourEngine):
    """:class:`ColourEngine` whose first caption of each call has no token, not even its stop token (as an engine
    that returns an empty answer as nothing): against the contract (``GenerationEngine.generate``), refused by RL
    rollouts naming it (``decode.engine=helpers.toy_engine:NoTokenEngine``)."""

    def generate(self, batch: dict[str, Any], decode: Any, seeds: torch.Tensor | None = None) -> Generation:
        gen = super().generate(batch, decode, seeds)
        gen.lengths[0], gen.texts[0] = 0, ""
        gen.sequences[0] = self.tokenizer.eos_token_id  # padding only
        return gen


class NotAnEngine:
    """A class that is no :class:`GenerationEngine` (``decode.engine`` refuses it)."""
