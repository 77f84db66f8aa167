"""What every backbone shares below the contract (:class:`finecap.models.base.CaptionerBase`): the types its members
name (:class:`TokenScores`, :class:`ImageSide`, :data:`PARTS`) and the helpers the base and the backbones' hooks use:
scoring given captions (:func:`token_scores`, in vocabulary chunks :func:`chunked_token_scores`), the teacher-forced
attention mask, reading a batch's images.

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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from PIL import Image
from torch import nn

PARTS = ("lm", "encoder")
"""The two parts of every captioner that LoRA can adapt and ``train_lm`` / ``train_encoder`` switch: the text side
(``"lm"``) and the vision side (``"encoder"``)."""


@dataclass
class TokenScores:
    """Per-token log-probs ``(N, L)`` of given captions (0 where the mask is false) and, when asked, the entropies
    ``(N, L)`` of the next-token distributions at those positions (0 elsewhere)."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None
    top: torch.Tensor | None = None
    """When asked: whether each given token is the most likely one at its position ``(N, L)``, bool (MLE's token
    accuracy when the teacher-forced loss is scored in vocabulary chunks)."""


@runtime_checkable
class ImageSide(Protocol):
    """A captioner's ``encoder``: how images enter it.

    ``preprocess(images)`` turns PIL images into model inputs: a tensor (``batch["pixel_values"]``) or a dict of
    tensors that the collator merges into the batch (a VLM's prompt ids and image inputs). When the captioner's
    ``cache_features`` is true, the encoder is also an ``nn.Module`` whose call ``encoder(pixel_values)`` gives the
    frozen outputs that :func:`finecap.data.features.model_features` caches. An encoder whose ``preprocess`` may refuse
    an image (:class:`finecap.data.images.ImageRefused`) says so with a true ``refuses_images`` (optional; absent:
    false), so that ``data.skip_bad_images`` leaves such images out up front
    (:func:`finecap.data.datasets.refused_images`), by preprocessing every image once more there. An encoder that can
    tell some refusals without preprocessing offers ``check_images(images)`` (optional): it raises the
    :class:`~finecap.data.images.ImageRefused` that ``preprocess`` would for what the images themselves show (their
    sizes: a VLM's shape rules), cheaply; with it ``refuses_processed_images`` (absent: true) says whether
    ``preprocess`` may still refuse an image ``check_images`` takes, by its output (Mistral 3's one image token).
    Up front, then, ``check_images`` is asked about every image and ``preprocess`` only where
    ``refuses_processed_images`` is true."""

    def preprocess(self, images: Sequence[Image.Image]) -> torch.Tensor | dict[str, torch.Tensor]: ...

    def set_trainable(self, trainable: bool) -> None: ...


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
    with_top: bool = False,
) -> TokenScores:
    """Log-probs of ``sequences (N, L)`` under ``softmax(logits / temperature)`` (logits ``(N, L, V)`` aligned with
    the tokens), zeroed where ``mask (N, L)`` is false, and optionally the entropies of the same distributions and
    whether each token is the distribution's most likely one (:attr:`TokenScores.top`). Padding is set to 0, not
    multiplied by 0: a ``-inf`` log-prob there (a logit of ``-inf`` at the padded token) gives 0, never NaN."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logp = F.log_softmax(logits.float() / temperature, dim=-1)  # (N, L, V)
    pad = ~mask.to(logp.device).bool()  # (N, L)
    sequences = sequences.to(logp.device)
    token = logp.gather(-1, sequences.unsqueeze(-1)).squeeze(-1).masked_fill(pad, 0.0)  # (N, L)
    entropy = entropy_of(logp).masked_fill(pad, 0.0) if with_entropy else None  # (N, L)
    top = (logp.detach().argmax(-1) == sequences) & ~pad if with_top else None  # (N, L)
    return TokenScores(token, entropy, top)


VOCAB_CHUNK_ELEMENTS = 2**22
"""Logits per chunk of :func:`chunked_token_scores` (positions x vocabulary): 16 MiB in float32, e.g. 83 positions
of GPT-2's 50,257 words. The head's matrix product stays large enough to run at full speed, and the chunk's logits,
log-softmax and their gradients (about four copies) stay far below what the checkpointed layers keep."""


def chunked_token_scores(
    head: nn.Module,
    hidden: torch.Tensor,
    sequences: torch.Tensor,
    mask: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    with_top: bool = False,
    chunk_elements: int = VOCAB_CHUNK_ELEMENTS,
) -> TokenScores:
    """:func:`token_scores` of ``head(hidden)`` without holding the logits: the positions of ``hidden (N, L, H)`` are
    scored in chunks of about ``chunk_elements`` logits, each through a non-reentrant
    ``torch.utils.checkpoint``, so that a chunk's logits and log-softmax are freed as soon as its scores exist and
    recomputed, one chunk at a time, in the backward pass (Liger-Kernel's fused linear cross-entropy and
    torchtune's chunked loss make the same trade: one more pass of the head's matrix product for not keeping
    ``(N, L, V)`` floats). The result equals :func:`token_scores` of the whole logits up to the summation order of
    the head's weight gradient (``tests/models/test_vocab_chunks.py``).

    ``head``: the module mapping hidden states to the vocabulary (a backbone's
    :meth:`~finecap.models.base.CaptionerBase.output_head`, a ``Linear`` of ``V`` outputs)."""
    N, L, H = hidden.shape
    vocabulary = int(head.weight.shape[0])
    rows = max(1, chunk_elements // vocabulary)  # positions per chunk
    flat = hidden.reshape(N * L, H)  # (N*L, H)
    tokens, keep = sequences.to(hidden.device).reshape(N * L), mask.to(hidden.device).reshape(N * L)  # (N*L,)

    def score(h: torch.Tensor, s: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = token_scores(head(h)[None], s[None], m[None], temperature, with_entropy, with_top)  # (1, n) each
        return tuple(t[0] for t in (out.logprobs, out.entropy, out.top) if t is not None)

    parts = [torch.utils.checkpoint.checkpoint(score, flat[i : i + rows], tokens[i : i + rows], keep[i : i + rows],
                                               use_reentrant=False)
             for i in range(0, N * L, rows)]  # fmt: skip
    # cloned out of the reshape's view of the concatenation: a sharded captioner's forward returns these, and FSDP2
    # warns of a view returned by a sharded forward (an in-place op on it would skip its pre-backward all-gather);
    # the copy is N*L numbers, not the logits' N*L*V, and equal bit for bit (tests/models/test_sharding.py)
    columns = iter(torch.cat(column).reshape(N, L).clone() for column in zip(*parts, strict=True))  # (N, L) each
    token = next(columns)
    entropy = next(columns) if with_entropy else None
    top = next(columns) if with_top else None
    return TokenScores(token, entropy, top)


def last_positions(keep: int, total: int, device: torch.device) -> torch.Tensor:
    """``logits_to_keep`` for a transformers language model that should compute the logits of only the last ``keep``
    of ``total`` positions, as an index tensor ``(keep,)`` rather than the int ``keep``. With the int, transformers
    slices the last hidden states into a strided view, and PyTorch's CPU ``linear`` on a strided 3-D bfloat16 input
    multiplies through a batched matrix product that copies the whole vocabulary matrix once per row: 1.2 GB instead
    of 51 MB for GPT-2's head over 16 rows (measured 2026-11-24, torch 2.13; it doubled the step peak of bf16 + LoRA
    training and multiplies the first decoding step's memory by the batch). With the index tensor transformers
    gathers the kept positions into a contiguous tensor (a ``(B, keep, H)`` copy) and the product runs as one
    matrix product; float32 results are unchanged."""
    return torch.arange(total - keep, total, device=device)


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
