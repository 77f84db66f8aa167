"""What decodes an RL objective's rollouts: the generation engine ``decode.engine`` names
(:class:`~finecap.engines.base.GenerationEngine`), opened at the first rollout to serve the policy and kept in step
with it: the policy itself (``finecap``), or a colocated vLLM engine (TRL's ``vllm_mode="colocate"``).

:class:`RolloutEngine` is what REINFORCE and the GRPO family (:mod:`finecap.objectives.reinforce`,
:mod:`finecap.objectives.grpo`) decode their samples and greedy captions with. It reads the engine class's declared
facts only: ``external_logprobs`` (:attr:`RolloutEngine.external`: the objective's importance correction and
sync timing apply), ``reads_images`` (the batch must carry its PIL images) and ``check_processes``. With
``decode.engine=finecap`` the policy decodes itself. With ``vllm``:

- **one engine per training process**, built in that process at the first rollout from the policy as it is then (a
  resumed run's restored weights, LoRA adapters merged, sent from memory into an engine started without weights:
  :meth:`VllmEngine.from_captioner <finecap.engines.vllm.VllmEngine.from_captioner>`), freed by
  :meth:`RolloutEngine.close` (the objective's ``close``, after training);
- **weight sync**: after an optimizer step (:meth:`RolloutEngine.policy_changed`, which the objective's ``end_step``
  calls) the next rollout first loads the policy's current weights into the engine (:meth:`VllmEngine.sync
  <finecap.engines.vllm.VllmEngine.sync>`: full weights, adapters merged, ``collective_rpc("reload_weights")``,
  the engine's encoder and prefix caches dropped): once per rollout however many optimizer steps came between
  (the ``rl.iterations`` steps of a GRPO cycle share one rollout), as TRL syncs when the step changed since its last
  sync. The weights are streamed from the policy's parameters, not copied; under FSDP2 its state dict's shards are
  gathered tensor by tensor as the engine loads them (:func:`~finecap.engines.vllm.streamed_weights`: one tensor
  whole at a time, every process taking part; the rollout does not gather the policy for decoding as finecap's decoder
  needs, :func:`finecap.models.sharding.decoding`);
- **log-probs** (the rollout's ``token_logprobs``, which the importance-sampling correction compares with the
  trainer's: :mod:`finecap.objectives.engine_mismatch`): of the distribution the loss scores, the model's own
  (``raw_logprobs``), or with ``tempered=True`` (``rl.scaled_logprob`` with sampling) the temperature-scaled one
  sampled from (``processed_logprobs``, as TRL's rollouts);
- **sleep** (``vllm.enable_sleep_mode``, TRL's ``vllm_enable_sleep_mode``; CUDA only): after each generation the
  engine releases its GPU memory (vLLM's sleep level 1: weights offloaded to the CPU, KV cache dropped) for the
  training step; the next sync wakes its weights, then its KV cache, and the next generation whatever still sleeps.
  A rollout that decodes twice (samples, then SCST's greedy baseline) sleeps and wakes between the two;
- generation runs with autocast off (:func:`~finecap.engines.vllm.autocast_off`: the engine computes in its own
  dtype, the captioner's; a bf16 autocast of the training step must not reach vLLM's kernels, which run in this
  process), and the captions come back on the policy's device.

**Several training processes** (DDP, FSDP2 under ``accelerate launch``): every process builds an engine of its own
at the first rollout (all at once: they join the training's process group, vLLM's ``external_launcher`` executor,
as TRL's colocate mode builds them: :func:`finecap.engines.vllm.external_launcher`), rolls out its own micro-batch's
images on it, and syncs it from its own copy of the policy: under DDP every process holds the full weights; under
FSDP2 the rollout's :func:`~finecap.models.sharding.decoding` block gathers them once, every process taking part,
and each loads the full state into its engine. A tensor-parallel engine (``vllm.tensor_parallel_size > 1``) is not
built: its processes would have to send the same requests together (TRL gathers the prompts of a tensor-parallel
group); :meth:`RolloutEngine.check_processes` refuses it in one line when training starts.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from finecap.engines.base import GenerationEngine, check_lengths, engine_class

if TYPE_CHECKING:
    from collections.abc import Sequence

    from finecap.config import Config, DecodeConfig
    from finecap.decode import Generation


class RolloutEngine:
    """Decodes a policy's rollouts with the engine ``cfg.decode.engine`` names (module docstring).

    Args:
        cfg: the configuration the engine is opened with (``decode.engine``, the ``vllm`` section, ``run.seed``: vLLM's
            seed of unseeded sampling).
        tempered: the engine returns the log-probs of the temperature-scaled distribution it samples from, not the
            model's own (``rl.scaled_logprob`` with sampling).

    Attributes: ``kind`` (the engine class), ``engine`` (the open :class:`~finecap.engines.base.GenerationEngine`,
    once built), ``sync_seconds`` (seconds spent so far building the engine and sending it the policy's weights).
    """

    def __init__(self, cfg: Config, *, tempered: bool = False) -> None:
        self.cfg = cfg
        self.kind: type[GenerationEngine] = engine_class(cfg.decode)
        self.tempered = tempered
        self.engine: GenerationEngine | None = None
        self.stale = False  # the policy changed since the engine last received its weights
        self.sync_seconds = 0.0

    @property
    def external(self) -> bool:
        """Whether rollouts come from another engine than the policy (their log-probs are that engine's)."""
        return self.kind.external_logprobs

    def check_processes(self, processes: int) -> None:
        """Refuse, in one line, what the engine cannot do in ``processes`` training processes, each of which builds
        an engine of its own (:meth:`GenerationEngine.check_processes <finecap.engines.base.GenerationEngine.
        check_processes>`: vLLM's tensor-parallel engine)."""
        self.kind.check_processes(self.cfg, processes, rollouts=True)

    def check_model(self, policy: Any, decodes: Sequence[DecodeConfig]) -> None:
        """Refuse, with a :class:`~finecap.config.ConfigError` in one line, rollouts of ``policy`` (the captioner to
        train) with settings ``decodes`` (a step's samples, greedy captions) that the engine cannot decode its
        captions with (:meth:`GenerationEngine.decode_refusal <finecap.engines.base.GenerationEngine.
        decode_refusal>`: vLLM's beam search of a captioner ending captions besides its EOS), at the run's setup:
        the engine itself is built at the first rollout."""
        from finecap.config import ConfigError

        for decode in decodes:
            reason = self.kind.decode_refusal(policy, decode)
            if reason is not None:
                raise ConfigError(reason, key="decode.engine")

    def policy_changed(self) -> None:
        """The policy's weights changed (an optimizer step): the next rollout syncs them into the engine first."""
        self.stale = True

    def generator(self, policy: Any) -> GenerationEngine:
        """The engine serving ``policy`` (the bare captioner, full parameters): built at the first call
        (:meth:`GenerationEngine.open <finecap.engines.base.GenerationEngine.open>`), synced when the policy changed
        since."""
        start = time.perf_counter()
        if self.engine is None:
            self.engine = self.kind.open(policy, self.cfg, tempered=self.tempered)
        elif self.stale:
            self.engine.sync(policy)
        self.stale = False
        self.sync_seconds += time.perf_counter() - start
        return self.engine

    def generate(self, policy: Any, batch: dict[str, Any], decode: DecodeConfig,
                 seeds: torch.Tensor | None = None) -> Generation:  # fmt: skip
        """``policy``'s captions of ``batch`` decoded with ``decode`` (per-image sampling ``seeds``), on the policy's
        device. An engine that ``reads_images`` reads the batch's PIL ``images`` (the training collator keeps them
        for it: :func:`finecap.train.setup.build_training_data`). The engine then sleeps
        (:meth:`GenerationEngine.sleep <finecap.engines.base.GenerationEngine.sleep>`: ``vllm.enable_sleep_mode``).
        A caption of no token is a ``ValueError`` naming the engine (:func:`~finecap.engines.base.check_lengths`)."""
        engine = self.generator(policy)
        gen = engine.generate(batch, decode, seeds=seeds)
        engine.sleep()  # its device memory back to the training step until the next rollout (vllm.enable_sleep_mode)
        check_lengths(gen, decode)
        return gen.to(policy.device) if self.external else gen  # the policy's own are on its device already

    def close(self) -> None:
        """Free the engine (it is built again at the next rollout). The reference is dropped even when the engine's
        ``close`` raises (its error raised here): a later close does not close it again, and this object does not
        keep a half-closed engine, and the memory it still holds, alive."""
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()
