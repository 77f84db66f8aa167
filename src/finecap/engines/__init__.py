"""Generation engines: who decodes a captioner's captions (``decode.engine``).

- ``finecap`` (default): the captioner itself, through finecap's batched decoder (:mod:`finecap.decode`), for every
  backbone;
- ``vllm``: a colocated ``vllm.LLM`` serving the captioner's transformers model (:mod:`finecap.engines.vllm`), for
  the decoder-only VLMs vLLM implements; refused in one line naming the backbone for the others.

Both take the ``decode`` section and return a :class:`finecap.decode.Generation` (tokens, their log-probs under the
model's own distribution, lengths, texts). :func:`generating` gives the object whose ``generate(batch, decode)`` the
captioning loops (:func:`finecap.caption.generate_captions`, :func:`finecap.inference.caption_images`) call, and whose
``encoder.preprocess`` their collator runs; :class:`finecap.engines.rollouts.RolloutEngine` is what the RL objectives
roll out with (a vLLM engine kept in step with the policy being trained). Nothing is imported from vLLM until a
``vllm`` engine is built.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from finecap.config import Config


def generator_for(model: Any, cfg: Config) -> Any:
    """What decodes for ``cfg.decode.engine``: ``model`` itself (``finecap``), or a new
    :class:`finecap.engines.vllm.VllmEngine` serving it (``vllm``, with ``cfg.vllm``; the caller closes it)."""
    if cfg.decode.engine == "finecap":
        return model
    from finecap.engines.vllm import VllmEngine

    return VllmEngine.from_captioner(model, cfg.vllm, seed=cfg.run.seed)


@contextlib.contextmanager
def generating(model: Any, cfg: Config) -> Iterator[Any]:
    """:func:`generator_for` within the block; an engine it built is closed after (its temporary folder removed)."""
    generator = generator_for(model, cfg)
    try:
        yield generator
    finally:
        if generator is not model:
            generator.close()
