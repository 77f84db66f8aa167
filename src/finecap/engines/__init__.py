"""Generation engines: who decodes a captioner's captions (``decode.engine``; docs/architecture.md#generation-engines).

Every engine is a :class:`~finecap.engines.base.GenerationEngine` (``generate(batch, decode, seeds) -> Generation``,
``sync(policy)``, ``close()``, and declared facts: ``reads_images``, ``external_logprobs``, the backbones it serves
through its ``refusal``), registered in :data:`finecap.registry.ENGINES` or given as a dotted path
``decode.engine=pkg.module:Class``:

- ``finecap`` (default, :class:`~finecap.engines.finecap.FinecapEngine`): the captioner itself, through finecap's
  batched decoder (:mod:`finecap.decode`), for every backbone;
- ``vllm`` (:class:`~finecap.engines.vllm.VllmEngine`): a colocated ``vllm.LLM`` serving the captioner's transformers
  model, for the decoder-only VLMs vLLM implements; refused in one line naming the backbone for the others.

:func:`open_engine` is the one place that reads ``decode.engine``: the captioning command and the Python API caption
through the engine it opens (:func:`finecap.caption.generate_captions`, :func:`finecap.inference.caption_images`,
which also take a bare captioner: :func:`~finecap.engines.finecap.as_engine`), and
:class:`finecap.engines.rollouts.RolloutEngine` is what the RL objectives roll out with (an engine kept in step with
the policy being trained). Nothing is imported from vLLM until a ``vllm`` engine is built.
"""

from __future__ import annotations

from finecap.engines.base import GenerationEngine, engine_class, open_engine

__all__ = ["GenerationEngine", "engine_class", "open_engine"]
