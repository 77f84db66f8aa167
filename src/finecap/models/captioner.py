"""What a captioner is to the rest of finecap, and the one way of scoring given captions under it.

A captioner (:class:`finecap.models.clipcap.ClipCap`, :class:`finecap.models.blip.Blip`; a third backbone implements
the same, see :mod:`finecap.models.backbones`) is an ``nn.Module`` with:

- ``forward(batch)`` -> teacher-forced logits ``(B, T, V)`` of ``batch["input_ids"]``, aligned so that
  ``logits[:, t]`` predicts ``batch["labels"][:, t]``;
- ``forward(batch, sequences=S, mask=M, image_index=I, temperature=T, with_entropy=E)`` -> :class:`TokenScores` of
  the given captions ``S (N, L)`` (e.g. sampled ones): their per-token log-probs ``(N, L)``, with gradient, and the
  next-token entropies when ``E`` is true. Row ``n`` of ``S`` describes image ``I[n]`` of the batch.

``forward`` is the *only* differentiable entry point: it is what ``accelerator.prepare`` wraps (DDP, FSDP), so every
gradient that an objective or a reward needs flows through it and is synchronised by the wrapper. Decoding (the
:class:`finecap.decode.Stepper` methods ``start``/``step``/``select`` and ``generate``) runs on the *unwrapped* model
under ``torch.no_grad`` (see :func:`finecap.objectives.base.unwrap`), the pattern TRL uses for generation in its
online trainers. Objectives never touch a captioner's private members.

Besides ``forward`` and the Stepper methods a captioner has ``tokenizer``, ``pad_token_id``, ``eos_token_id``,
``generate(batch, decode_cfg, ...)``, ``save(folder, state_dict=None)`` and ``from_checkpoint(folder)``; the flags
``train_lm`` / ``train_encoder`` and the hooks :mod:`finecap.models.lora` uses to choose what trains:
``lora_module(part)`` / ``set_lora_module(part, module)`` (``part`` = ``"lm"``, the text side, or ``"encoder"``, the
vision side) and ``apply_trainable()``; ``encoder`` (the vision side: ``preprocess(images)``, ``set_trainable``) and
``cache_features`` (whether frozen vision outputs go through the feature cache).

Example (the arithmetic of :func:`token_scores`)::

    >>> import torch
    >>> logits = torch.log(torch.tensor([[[0.5, 0.5], [0.25, 0.75]]]))  # (1, 2, 2)
    >>> out = token_scores(logits, torch.tensor([[0, 1]]), torch.tensor([[True, True]]), with_entropy=True)
    >>> [round(v, 4) for v in out.logprobs[0].tolist()]  # log 0.5, log 0.75
    [-0.6931, -0.2877]
    >>> round(out.entropy[0, 0].item(), 4)  # ln 2
    0.6931
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from finecap.decode import concat, decode


@dataclass
class TokenScores:
    """Per-token log-probs ``(N, L)`` of given captions (0 where the mask is false) and, when asked, the entropies
    ``(N, L)`` of the next-token distributions at those positions (0 elsewhere)."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None


class Captioner(Protocol):
    """The interface every backbone implements (see the module docstring)."""

    tokenizer: Any

    def __call__(self, batch: dict[str, Any], **kwargs: Any) -> torch.Tensor | TokenScores: ...

    def generate(self, batch: dict[str, Any], decode_cfg: Any = None, **kwargs: Any) -> Any: ...

    def save(self, out: Any, state_dict: dict[str, torch.Tensor] | None = None) -> Any: ...


def entropy_of(logp: torch.Tensor) -> torch.Tensor:
    """``-sum p log p`` over the last axis of log-probs ``(..., V)`` -> ``(...)``, with ``0 * log 0 = 0``."""
    p = logp.exp()
    return -(p * logp.masked_fill(p == 0, 0.0)).sum(-1)


def token_scores(
    logits: torch.Tensor,
    sequences: torch.Tensor,
    mask: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> TokenScores:
    """Log-probs of ``sequences (N, L)`` under ``softmax(logits / temperature)`` (logits ``(N, L, V)`` aligned with
    the tokens), zeroed where ``mask (N, L)`` is false, and optionally the entropies of the same distributions."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logp = F.log_softmax(logits.float() / temperature, dim=-1)  # (N, L, V)
    keep = mask.to(logp.device, logp.dtype)  # (N, L)
    token = logp.gather(-1, sequences.to(logp.device).unsqueeze(-1)).squeeze(-1) * keep  # (N, L)
    entropy = entropy_of(logp) * keep if with_entropy else None  # (N, L)
    return TokenScores(token, entropy)


def logits_or_scores(
    conditioning: torch.Tensor,
    logits_fn: Any,
    batch: dict[str, Any],
    sequences: torch.Tensor | None,
    mask: torch.Tensor | None,
    image_index: torch.Tensor | None,
    temperature: float,
    with_entropy: bool,
    device: torch.device,
) -> torch.Tensor | TokenScores:
    """The body of every backbone's ``forward``: ``logits_fn(conditioning, input_ids, attention_mask) -> (B, T, V)``
    gives the teacher-forced logits of ``batch['input_ids']``; given ``sequences (N, L)``, the per-image
    ``conditioning (B, ...)`` (ClipCap's prefix, BLIP's image tokens) is mapped to rows by ``image_index (N,)`` (or
    row ``n`` is image ``n``) and the sequences' :func:`token_scores` are returned."""
    if sequences is None:
        return logits_fn(conditioning, batch["input_ids"], batch.get("attention_mask"))
    if image_index is not None:
        conditioning = conditioning[image_index.to(conditioning.device)]  # (N, ...)
    elif conditioning.shape[0] != sequences.shape[0]:
        raise ValueError(
            f"{conditioning.shape[0]} images for {sequences.shape[0]} sequences; pass image_index to map them"
        )
    sequences = sequences.to(device)
    mask = torch.ones_like(sequences, dtype=torch.bool) if mask is None else mask.to(device)
    logits = logits_fn(conditioning, sequences, mask.long())  # (N, L, V)
    return token_scores(logits, sequences, mask, temperature, with_entropy)


def shifted_mask(attention_mask: torch.Tensor | None, k: int, device: torch.device) -> torch.Tensor | None:
    """Attention mask of a teacher-forced input that reads ``k`` always-visible positions (a prefix, a start token)
    and then the caption without its last token: ``(B, k + T - 1)`` from the caption's ``(B, T)``; ``None`` stays
    ``None``."""
    if attention_mask is None:
        return None
    ones = torch.ones(attention_mask.shape[0], k, dtype=attention_mask.dtype, device=device)
    return torch.cat([ones, attention_mask[:, :-1].to(device)], dim=1)


def strip_prefix(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The entries of a state dict under ``prefix``, with the prefix removed (one part of a captioner's weights)."""
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def encode_images(batch: dict[str, Any], encoder: Any, trained: bool, device: torch.device) -> torch.Tensor:
    """What a captioner conditions on: the batch's cached ``features`` (frozen encoder), or ``encoder`` applied to
    ``pixel_values`` (with gradient only when the encoder is ``trained``). Shapes are the encoder's: ``(B, D)``
    feature vectors for ClipCap, ``(B, P, H)`` image tokens for BLIP."""
    if trained:
        if "pixel_values" not in batch:
            raise ValueError("model.train_encoder=true: batches must carry pixel_values, not cached features")
        return encoder(batch["pixel_values"].to(device))
    if "features" in batch:
        return batch["features"].to(device, torch.float32)
    if "pixel_values" in batch:
        if encoder is None:
            raise ValueError("this captioner was loaded without its vision encoder; pass cached features")
        with torch.no_grad():
            return encoder(batch["pixel_values"].to(device)).float()
    raise ValueError(f"batch has neither 'features' nor 'pixel_values' (keys: {sorted(batch)})")


def generate_in_chunks(
    stepper: Any,
    conditioning: torch.Tensor,
    decode_cfg: Any,
    tokenizer: Any,
    pad_id: int,
    generator: torch.Generator | None = None,
    seeds: torch.Tensor | None = None,
) -> Any:
    """:func:`finecap.decode.decode` over ``decode.batch_size`` images at a time (rows of ``conditioning``: ClipCap
    features ``(B, D)``, BLIP image tokens ``(B, P, H)``), concatenated."""
    size = decode_cfg.batch_size
    chunks = [
        decode(stepper, conditioning[i : i + size], decode_cfg, tokenizer, generator,
               None if seeds is None else seeds[i : i + size])
        for i in range(0, conditioning.shape[0], size)
    ]  # fmt: skip
    if not chunks:
        raise ValueError("generate got an empty batch")
    return concat(chunks, pad_id)
