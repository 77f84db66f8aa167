"""What decodes an RL objective's rollouts (``decode.engine``): the policy itself, or a colocated vLLM engine kept in
step with it (TRL's ``vllm_mode="colocate"``).

:class:`RolloutEngine` is what REINFORCE and the GRPO family (:mod:`finecap.objectives.reinforce`,
:mod:`finecap.objectives.policy`) decode their samples and greedy captions with. With ``decode.engine=finecap`` it
calls the policy's own ``generate``. With ``vllm``:

- **one engine per training process**, built in that process at the first rollout from the policy as it is then (a
  resumed run's restored weights, LoRA adapters merged: :meth:`VllmEngine.from_captioner
  <finecap.engines.vllm.VllmEngine.from_captioner>`), freed by :meth:`RolloutEngine.close` (the objective's
  ``close``, after training);
- **weight sync**: after an optimizer step (:meth:`RolloutEngine.policy_changed`, which the objective's ``end_step``
  calls) the next rollout first loads the policy's current weights into the engine (:meth:`VllmEngine.sync
  <finecap.engines.vllm.VllmEngine.sync>`: full weights, adapters merged, ``collective_rpc("reload_weights")``,
  the engine's encoder and prefix caches dropped): once per rollout however many optimizer steps came between
  (the ``rl.iterations`` steps of a GRPO cycle share one rollout), as TRL syncs when the step changed since its last
  sync. Under FSDP2 the engine is built from and synced with the full state dict, gathered once per sync
  (:func:`~finecap.engines.vllm.hf_weights`; the rollout does not gather the policy for decoding as finecap's decoder
  needs, :func:`finecap.models.sharding.decoding`);
- **log-probs** (the rollout's ``token_logprobs``, which the importance-sampling correction compares with the
  trainer's: :mod:`finecap.objectives.engine_mismatch`): of the distribution the loss scores, the model's own
  (``raw_logprobs``), or with ``tempered=True`` (``rl.scaled_logprob`` with sampling) the temperature-scaled one
  sampled from (``processed_logprobs``, as TRL's rollouts);
- generation runs with autocast off (the engine computes in its own dtype, the captioner's; a bf16 autocast of the
  training step must not reach vLLM's kernels, which run in this process), and the captions come back on the
  policy's device.

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

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from finecap.config import ConfigError

if TYPE_CHECKING:
    from finecap.config import DecodeConfig, VllmConfig
    from finecap.decode import Generation
    from finecap.engines.vllm import VllmEngine


@contextlib.contextmanager
def autocast_off() -> Iterator[None]:
    """Within the block no autocast is active (on the CPU, nor on CUDA when there is one)."""
    with contextlib.ExitStack() as stack:
        for device in ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",):
            stack.enter_context(torch.autocast(device, enabled=False))
        yield


class RolloutEngine:
    """Decodes a policy's rollouts with ``decode.engine`` (module docstring).

    Args:
        engine: ``decode.engine``: ``"finecap"`` or ``"vllm"``.
        section: the ``vllm`` section (memory and parallelism of the engine).
        seed: ``run.seed`` (vLLM's seed of unseeded sampling).
        tempered: the engine returns the log-probs of the temperature-scaled distribution it samples from, not the
            model's own (``rl.scaled_logprob`` with sampling).

    Attributes: ``engine`` (the :class:`~finecap.engines.vllm.VllmEngine`, once built), ``sync_seconds`` (seconds
    spent so far building the engine and sending it the policy's weights).
    """

    def __init__(self, engine: str = "finecap", section: VllmConfig | None = None, *, seed: int = 0,
                 tempered: bool = False) -> None:  # fmt: skip
        from finecap.config import VllmConfig

        self.kind = engine
        self.section = section or VllmConfig()
        self.seed = seed
        self.tempered = tempered
        self.engine: VllmEngine | None = None
        self.stale = False  # the policy changed since the engine last received its weights
        self.sync_seconds = 0.0

    @property
    def external(self) -> bool:
        """Whether rollouts come from another engine than the policy (their log-probs are that engine's)."""
        return self.kind != "finecap"

    def check_processes(self, processes: int) -> None:
        """Refuse, in one line, what the colocated engines cannot do (module docstring): a tensor-parallel engine.
        ``processes``: the training's processes, each of which builds an engine of its own."""
        if not self.external:
            return
        if self.section.tensor_parallel_size > 1:
            raise ConfigError(
                f"vllm.tensor_parallel_size={self.section.tensor_parallel_size}: RL rollouts run on one engine per "
                f"training process ({processes} here), each generating its own images, and a tensor-parallel engine "
                "spans processes that would have to send the same requests together; use vllm.tensor_parallel_size=1 "
                "for training",
                key="vllm.tensor_parallel_size",
            )

    def policy_changed(self) -> None:
        """The policy's weights changed (an optimizer step): the next rollout syncs them into the engine first."""
        self.stale = True

    def generator(self, policy: Any) -> Any:
        """What decodes for ``policy`` (the bare captioner, full parameters): itself (``finecap``), or the engine,
        built at the first call, synced when the policy changed since."""
        if not self.external:
            return policy
        start = time.perf_counter()
        if self.engine is None:
            from finecap.engines.vllm import VllmEngine

            mode = "processed_logprobs" if self.tempered else "raw_logprobs"
            self.engine = VllmEngine.from_captioner(policy, self.section, seed=self.seed, logprobs_mode=mode)
        elif self.stale:
            self.engine.sync(policy)
        self.stale = False
        self.sync_seconds += time.perf_counter() - start
        return self.engine

    def generate(self, policy: Any, batch: dict[str, Any], decode: DecodeConfig,
                 seeds: torch.Tensor | None = None) -> Generation:  # fmt: skip
        """``policy``'s captions of ``batch`` decoded with ``decode`` (per-image sampling ``seeds``), on the policy's
        device. The engine reads the batch's PIL ``images`` (the collator keeps them with ``decode.engine=vllm``)."""
        generator = self.generator(policy)
        if generator is policy:
            return policy.generate(batch, decode, seeds=seeds)
        if "images" not in batch:
            raise ValueError("decode.engine=vllm: the batch has no 'images' (PIL images) for the engine to caption; "
                             "collate it with keep_images=True (finecap.data.datasets.CaptionCollator)")  # fmt: skip
        with autocast_off():
            gen = generator.generate(batch, decode, seeds=None if seeds is None else seeds.cpu())
        return gen.to(policy.device)

    def close(self) -> None:
        """Free the engine (it is built again at the next rollout)."""
        if self.engine is not None:
            self.engine.close()
            self.engine = None
