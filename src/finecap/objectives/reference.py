"""The reference policy of the GRPO family's KL term (``grpo.kl_coef > 0``): the policy at the start of training.

TRL keeps a frozen copy of the whole model (or, for a PEFT model, disables the adapters). finecap copies only what
changes: the parameters that train. At the first rollout of a run (before any optimizer step) :meth:`Reference.capture`
takes

- under LoRA with adapters that still add nothing (fresh adapters: one factor zero), **no copy of the adapters**: the
  reference pass runs with them off (peft's ``disable_adapter()``, :func:`finecap.models.lora.adapters_disabled`),
  which computes exactly what the starting policy computes;
- a frozen copy of every other trainable parameter, in its own training dtype (ClipCap's mapper or a VLM's projector
  beside LoRA adapters; the whole trained part under full fine-tuning; adapters continued from a checkpoint). The
  reference pass runs the *same* module with these values swapped in (``torch.func.functional_call``); the frozen
  weights (the vision encoder, a LoRA base) are shared, never copied.

Why the training dtype and not ``model.dtype``: the copy is then bit-equal to the starting policy (a bfloat16 copy of
float32 master weights would not be), so the KL is exactly 0 before the first step (without dropout).

The reference log-probs are computed once per rollout (at the first of its ``grpo.iterations`` steps; their
seconds are logged as ``time/reference``), without gradient and in eval mode (no dropout: the reference is a fixed
function), with the same temperature as the policy's, and, under gradient checkpointing, in the vocabulary chunks
the policy's training pass scores in
(:attr:`~finecap.models.base.CaptionerBase.trains_in_chunks`): the same log-probs as the policy's at the start, and
never the whole logits of the step's captions (``(N, L, V)``: 14 GiB for 256 captions of 40 tokens over Qwen2-VL's
151,936 words in bf16 with their float32 copies).
The copy is part of the objective's state (every resumable checkpoint holds it), so a resumed run keeps the
reference of its start; a run resumed from a checkpoint without one (KL switched on later) takes the policy at the
resume as its reference.

Under FSDP2 sharding (``train.strategy=fsdp`` on several processes), swapping parameters into a sharded module is
not supported: the KL term then needs LoRA adapters as the only trained parameters (their reference is the
adapters off, no copy); anything else is refused with one line naming ``grpo.kl_coef``.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from finecap.decode import Generation
from finecap.models import lora, sharding
from finecap.objectives.base import unwrap


class Reference:
    """The starting policy's per-token log-probs (module docstring)."""

    def __init__(self) -> None:
        self.captured = False
        self.adapters_off = False  # reference = the model with its (identity) LoRA adapters disabled
        self.snapshot: dict[str, torch.Tensor] = {}  # trainable parameters at the start, by name

    def capture(self, model: torch.nn.Module) -> None:
        """Remember the policy as it is now (the start of training), unless a checkpoint's reference was loaded."""
        if self.captured:
            return
        bare = unwrap(model)
        self.adapters_off, trainable = _to_copy(bare)
        if trainable and sharding.is_sharded(bare):
            raise ValueError(
                f"grpo.kl_coef: the reference policy needs a copy of {len(trainable)} trained parameters, which "
                "finecap cannot swap into an FSDP2-sharded model; train through fresh LoRA adapters only (lora.*), "
                "use train.strategy=ddp, or set grpo.kl_coef=0"
            )
        self.snapshot = {name: p.detach().clone() for name, p in trainable.items()}
        self.captured = True

    def copy_bytes(self, model: torch.nn.Module) -> int:
        """Bytes of the copy :meth:`capture` keeps (or would keep) of ``model``'s trained parameters: what the KL
        holds on the device beside the policy (``finecap train --dry-run``'s forecast)."""
        if self.captured:
            return sum(t.numel() * t.element_size() for t in self.snapshot.values())
        return sum(p.numel() * p.element_size() for p in _to_copy(unwrap(model))[1].values())

    def logprobs(self, model: torch.nn.Module, batch: dict[str, Any], gen: Generation, temperature: float = 1.0):
        """``(N, L)`` per-token log-probs of ``gen``'s captions under the reference (0 at padding), no gradient."""
        self.capture(model)
        bare = unwrap(model)
        kwargs = dict(sequences=gen.sequences, mask=gen.mask, image_index=gen.image_index, temperature=temperature)
        if getattr(bare, "trains_in_chunks", False):  # scored as the policy's training pass: in vocabulary chunks
            kwargs["chunks"] = True
        was_training = bare.training
        bare.eval()
        try:
            off = lora.adapters_disabled(bare) if self.adapters_off else contextlib.nullcontext()
            with torch.no_grad(), off:
                if not self.snapshot:
                    return bare(batch, **kwargs).logprobs.detach()
                self._to_devices(bare)
                return torch.func.functional_call(bare, self.snapshot, (batch,), kwargs).logprobs.detach()
        finally:
            bare.train(was_training)

    def _to_devices(self, bare: torch.nn.Module) -> None:
        """Move a loaded copy next to the parameters it stands for (a checkpoint loads on the CPU)."""
        params = dict(bare.named_parameters())
        unknown = sorted(set(self.snapshot) - set(params))
        if unknown:
            raise ValueError(f"the reference policy's parameter {unknown[0]!r} is not one of the model's (the "
                             f"checkpoint's state belongs to another model); {len(unknown)} such")  # fmt: skip
        for name, value in self.snapshot.items():
            if name in params and value.device != params[name].device:
                self.snapshot[name] = value.to(params[name].device)

    def state_dict(self) -> dict[str, Any]:
        return {"captured": self.captured, "adapters_off": self.adapters_off, "snapshot": dict(self.snapshot)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; ``ValueError`` for anything but flags and a mapping of names to tensors."""
        snapshot = state.get("snapshot") or {}
        flags = (state.get("captured"), state.get("adapters_off"))
        if not all(isinstance(f, bool) for f in flags) or not isinstance(snapshot, dict):
            raise ValueError("the reference policy's state must hold two flags and a mapping of parameters")
        if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in snapshot.items()):
            raise ValueError("the reference policy's parameters must be tensors named by strings")
        self.captured, self.adapters_off = flags
        self.snapshot = dict(snapshot)


def _to_copy(bare: torch.nn.Module) -> tuple[bool, dict[str, torch.nn.Parameter]]:
    """Whether the reference is ``bare`` with its adapters off (they add nothing yet), and the trained parameters the
    reference keeps a copy of (module docstring)."""
    trainable = {name: p for name, p in bare.named_parameters() if p.requires_grad}
    has_parts = callable(getattr(bare, "lora_module", None))
    adapters_off = has_parts and lora.has_adapters(bare) and lora.adapters_are_identity(bare)
    if adapters_off:
        trainable = {n: p for n, p in trainable.items() if not lora.is_adapter_parameter(n)}
    return adapters_off, trainable
