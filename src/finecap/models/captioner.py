"""What a captioner is to the rest of finecap (the typed contract :class:`Captioner`), and the helpers every backbone
shares: scoring given captions, the teacher-forced attention mask.

A captioner (:class:`finecap.models.clipcap.ClipCap`, :class:`finecap.models.blip.Blip`,
:class:`finecap.models.vlm.Vlm`) is an ``nn.Module`` with every member of :class:`Captioner`. Every backbone
subclasses :class:`finecap.models.base.CaptionerBase`, which implements the members that do not depend on the
backbone once; a new backbone writes the base's hooks and is listed in :mod:`finecap.models.backbones`.
Objectives, rewards, decoding, the feature cache, LoRA, checkpoints and the training engine use these members and
nothing else, without ``getattr`` fallbacks; ``tests/models/test_contract.py`` runs one contract test module on every
backbone. In short:

- ``forward(batch)`` -> teacher-forced logits ``(B, T, V)`` of ``batch["input_ids"]`` (the caption tokens only: a
  prefix, a start token, a chat prompt or image tokens are never among them), aligned so that ``logits[:, t]``
  predicts ``batch["labels"][:, t]``;
- ``forward(batch, sequences=S, mask=M, image_index=I, temperature=T, with_entropy=E)`` -> :class:`TokenScores` of
  the given captions ``S (N, L)`` (e.g. sampled ones): their per-token log-probs ``(N, L)``, with gradient, and the
  next-token entropies when ``E`` is true. Row ``n`` of ``S`` describes image ``I[n]`` of the batch.

``forward`` is the *only* differentiable entry point: it is what ``accelerator.prepare`` wraps (DDP), so every
gradient that an objective or a reward needs flows through it and is synchronised by the wrapper. Decoding (the
:class:`finecap.decode.Stepper` methods ``start``/``step``/``select`` and ``generate``) runs on the *unwrapped* model
under ``torch.no_grad`` (see :func:`finecap.objectives.base.unwrap`), the pattern TRL uses for generation in its
online trainers. Objectives never touch a captioner's private members.

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
from pathlib import Path
from typing import Any, Protocol, Self, runtime_checkable

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from PIL import Image
from torch import nn

from finecap.decode import Conditioning, Generation

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
    frozen outputs that :func:`finecap.data.features.model_features` caches."""

    def preprocess(self, images: Sequence[Image.Image]) -> torch.Tensor | dict[str, torch.Tensor]: ...

    def set_trainable(self, trainable: bool) -> None: ...


@runtime_checkable
class Captioner(Protocol):
    """The contract every backbone implements (``isinstance(model, Captioner)`` checks that the members exist;
    ``tests/models/test_contract.py`` checks what they do). Besides these, a captioner is an ``nn.Module``
    (``parameters``, ``state_dict``, ``to``, ``train``/``eval``).

    Attributes:
        tokenizer: the captions' tokenizer (its EOS ends every caption; its pad id pads them).
        train_lm: whether the text side learns (fully, or through its LoRA adapters).
        train_encoder: whether the vision side learns; then batches carry pixel inputs, never cached features.
    """

    tokenizer: Any
    train_lm: bool
    train_encoder: bool

    # ---- what it is -------------------------------------------------------------------------------------------------

    @property
    def pad_token_id(self) -> int:
        """Id padding captions (``Generation.sequences`` after the stop token)."""
        ...

    @property
    def eos_token_id(self) -> int:
        """Id ending every caption (the target's last token and the decoders' stop token)."""
        ...

    @property
    def device(self) -> torch.device:
        """Where the weights are (batches are moved there)."""
        ...

    @property
    def encoder(self) -> ImageSide | None:
        """The vision side (``None``: a captioner reading cached features only)."""
        ...

    @property
    def cache_features(self) -> bool:
        """Whether frozen vision outputs go through the feature cache (``batch["features"]``) instead of being
        recomputed from pixels at every step."""
        ...

    @property
    def max_caption_tokens(self) -> int | None:
        """The longest caption (tokens, stop token included) it can score and decode after its conditioning;
        ``None`` when only the batch's own prompt length limits it (then ``forward``/``generate`` check)."""
        ...

    # ---- the differentiable entry point ----------------------------------------------------------------------------

    def forward(
        self,
        batch: dict[str, Any],
        sequences: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        image_index: torch.Tensor | None = None,
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> torch.Tensor | TokenScores:
        """Teacher-forced logits ``(B, T, V)`` of the caption tokens, or :class:`TokenScores` of ``sequences``."""
        ...

    def __call__(self, batch: dict[str, Any], **kwargs: Any) -> torch.Tensor | TokenScores: ...

    # ---- decoding (finecap.decode.Stepper), on the bare model under no_grad ---------------------------------------

    def start(self, features: Conditioning) -> tuple[torch.Tensor, Any]:
        """First-token logits ``(B, V)`` and the decoding state (KV cache) of B images' conditioning."""
        ...

    def step(self, tokens: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        """Feed one token per row ``(N,)``; next logits ``(N, V)`` and the state."""
        ...

    def select(self, state: Any, index: torch.Tensor) -> Any:
        """Keep / repeat / reorder the state's rows (beams, samples)."""
        ...

    def generate(
        self,
        batch_or_features: Any,
        decode_cfg: Any = None,
        generator: torch.Generator | None = None,
        seeds: torch.Tensor | None = None,
    ) -> Generation:
        """Decode captions of a batch (or of a conditioning) with ``decode_cfg`` (greedy, beam, sampling)."""
        ...

    # ---- what trains (finecap.models.lora) --------------------------------------------------------------------------

    def lora_module(self, part: str) -> nn.Module | None:
        """The module LoRA wraps for ``part`` (:data:`PARTS`), ``None`` when the captioner has no such part."""
        ...

    def set_lora_module(self, part: str, module: nn.Module) -> None:
        """Put ``module`` (the part wrapped in a ``PeftModel``, or unwrapped again) in ``part``'s place."""
        ...

    def lora_default_targets(self, part: str) -> tuple[str, ...]:
        """Module names (or dot-suffixes) LoRA adapts in ``part`` when ``lora.<part>_targets`` is empty; ``()`` =
        every linear layer of the part except the output head."""
        ...

    def apply_trainable(self) -> None:
        """``requires_grad`` of every parameter from ``train_lm`` / ``train_encoder`` (through a part's adapters when
        it has some, :func:`finecap.models.lora.train_part`) and the backbone's always-trained parts."""
        ...

    def train(self, mode: bool = True) -> Self:
        """nn.Module's ``train``, keeping frozen parts in eval mode (no dropout in what does not learn)."""
        ...

    # ---- saving ------------------------------------------------------------------------------------------------

    def config_dict(self) -> dict[str, Any]:
        """What ``save`` records in ``captioner.json`` (``"kind"``: the backbone)."""
        ...

    def save(self, out: str | Path, state_dict: dict[str, torch.Tensor] | None = None) -> Path:
        """Write a checkpoint folder in the backbone's own format (``state_dict``: the weights to write, e.g.
        gathered from a sharded model); :meth:`from_checkpoint` reads it back."""
        ...

    @classmethod
    def from_checkpoint(cls, path: str | Path, load_encoder: bool = True) -> Captioner:
        """Load a folder written by :meth:`save` (``load_encoder=False``: skip a frozen encoder it refers to)."""
        ...

    # ---- what a run must prepare and fingerprint (static: asked before any model exists) ------------------------

    @staticmethod
    def reads_world_encoder(model_cfg: Any) -> bool:
        """Whether a fresh captioner built from the ``model`` section reads the world encoder (a run then prepares
        it first)."""
        ...

    @staticmethod
    def external_encoder(meta: dict[str, Any]) -> str | None:
        """The vision encoder a saved captioner loads from outside its folder, from its ``captioner.json`` (``meta``):
        a Hub name or path, or ``None`` when the folder holds everything."""
        ...


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
    whether each token is the distribution's most likely one (:attr:`TokenScores.top`)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logp = F.log_softmax(logits.float() / temperature, dim=-1)  # (N, L, V)
    keep = mask.to(logp.device, logp.dtype)  # (N, L)
    sequences = sequences.to(logp.device)
    token = logp.gather(-1, sequences.unsqueeze(-1)).squeeze(-1) * keep  # (N, L)
    entropy = entropy_of(logp) * keep if with_entropy else None  # (N, L)
    top = (logp.detach().argmax(-1) == sequences) & mask.to(logp.device).bool() if with_top else None  # (N, L)
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
    columns = iter(torch.cat(column).reshape(N, L) for column in zip(*parts, strict=True))
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
