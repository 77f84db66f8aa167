"""Tiny model presets for the embedded world: a small GPT-2 over the world tokenizer (random initialisation).

These are real ``transformers`` architectures (``GPT2LMHeadModel``) at toy sizes, trained from scratch here. Nothing
else in finecap assumes them: a captioner built on ``gpt2`` takes every shape from the loaded checkpoint.

Example::

    >>> lm, tok = build_world_lm(layers=2, hidden=64, heads=2, vocab=["a", "red", "circle"])
    >>> lm.config.vocab_size, lm.config.eos_token_id, lm.config.pad_token_id
    (8, 4, 0)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import (
    BlipConfig,
    BlipForConditionalGeneration,
    CLIPConfig,
    CLIPImageProcessor,
    CLIPModel,
    GPT2Config,
    GPT2LMHeadModel,
)

try:  # BLIP's PIL backend (no torchvision here); ``BlipImageProcessor`` would fall back to it with a warning
    from transformers import BlipImageProcessorPil as BlipImageProcessor
except ImportError:  # pragma: no cover - older transformers
    from transformers import BlipImageProcessor

from finecap.models.retriever import Retriever
from finecap.models.tokenizer import world_tokenizer

WORLD_LM_POSITIONS = 64
"""Default position limit of the tiny LM; enough for a prefix of 10 plus 32 caption tokens."""


def world_gpt2_config(
    tokenizer: Any,
    layers: int = 3,
    hidden: int = 128,
    heads: int = 4,
    n_positions: int = WORLD_LM_POSITIONS,
    dropout: float = 0.1,
) -> GPT2Config:
    """A small ``GPT2Config`` whose vocabulary and special ids come from ``tokenizer``.

    The feed-forward width is GPT-2's default ``4 * hidden``; dropout (residual, embedding, attention) is GPT-2's
    default 0.1.
    """
    if hidden % heads:
        raise ValueError(f"tiny LM hidden size {hidden} is not divisible by its {heads} heads (model.tiny_heads)")
    return GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=n_positions,
        n_embd=hidden,
        n_layer=layers,
        n_head=heads,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )


def build_world_lm(
    layers: int = 3,
    hidden: int = 128,
    heads: int = 4,
    n_positions: int = WORLD_LM_POSITIONS,
    vocab: Sequence[str] | None = None,
    dropout: float = 0.1,
) -> tuple[GPT2LMHeadModel, Any]:
    """The tiny world language model (random initialisation, current torch RNG) and the world tokenizer."""
    tokenizer = world_tokenizer(vocab)
    config = world_gpt2_config(tokenizer, layers=layers, hidden=hidden, heads=heads, n_positions=n_positions,
                               dropout=dropout)  # fmt: skip
    lm = GPT2LMHeadModel(config)
    tokenizer.model_max_length = n_positions
    return lm, tokenizer


def tiny_clip_config(
    vocab_size: int,
    eos_token_id: int,
    pad_token_id: int = 0,
    bos_token_id: int = 0,
    image_size: int = 32,
    patch_size: int = 8,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 2,
    projection_dim: int = 24,
    max_text_length: int = 32,
) -> CLIPConfig:
    """A minimal ``CLIPConfig`` (ViT vision tower + text tower) for tests and experiments.

    ``eos_token_id`` must not be 2 with ``transformers``' CLIP (id 2 selects the legacy argmax pooling).
    """
    if eos_token_id == 2:
        raise ValueError("CLIP eos_token_id must not be 2 (transformers then uses the legacy argmax pooling)")
    common = {"hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": layers,
              "num_attention_heads": heads}  # fmt: skip
    text = dict(common, vocab_size=vocab_size, max_position_embeddings=max_text_length, eos_token_id=eos_token_id,
                pad_token_id=pad_token_id, bos_token_id=bos_token_id)  # fmt: skip
    vision = dict(common, image_size=image_size, patch_size=patch_size)
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=projection_dim)


def save_tiny_clip(
    out: str | Path,
    *,
    image_size: int = 32,
    patch_size: int = 16,
    hidden: int = 16,
    layers: int = 1,
    heads: int = 2,
    projection_dim: int = 8,
    max_text_length: int = 48,
    seed: int = 0,
) -> Path:
    """Save a random tiny ``CLIPModel`` over the world tokenizer with a matching ``CLIPImageProcessor`` into ``out``,
    laid out like a Hub checkpoint (``Retriever.from_pretrained`` and ``model.encoder=<out>`` load it). For tests and
    experiments that need a dual encoder without training one."""
    torch.manual_seed(seed)
    tok = world_tokenizer()
    config = tiny_clip_config(
        len(tok), tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
        image_size=image_size, patch_size=patch_size, hidden=hidden, layers=layers, heads=heads,
        projection_dim=projection_dim, max_text_length=max_text_length,
    )  # fmt: skip
    size = {"shortest_edge": image_size}
    processor = CLIPImageProcessor(size=size, crop_size={"height": image_size, "width": image_size})
    Retriever(CLIPModel(config), tok, processor).save(out)
    return Path(out)


def tiny_blip_config(
    tokenizer: Any,
    *,
    image_size: int = 32,
    patch_size: int = 8,
    vision_hidden: int = 32,
    vision_layers: int = 2,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 2,
    positions: int = 40,
    dropout: float = 0.0,
) -> BlipConfig:
    """A small ``BlipConfig`` whose special ids come from ``tokenizer`` (BLIP's defaults assume BERT's vocabulary:
    ``bos`` ([DEC]) = the tokenizer's BOS, ``sep`` (BLIP's stop token) = its EOS, ``pad`` = its pad).
    ``vision_layers=0`` gives a vision tower without layers (the world BLIP's unused placeholder)."""
    ids = {"bos_token_id": tokenizer.bos_token_id, "sep_token_id": tokenizer.eos_token_id,
           "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}  # fmt: skip
    text = dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                num_attention_heads=heads, max_position_embeddings=positions, hidden_dropout_prob=dropout,
                attention_probs_dropout_prob=dropout, **ids)  # fmt: skip
    vision = dict(hidden_size=vision_hidden, intermediate_size=2 * vision_hidden, num_hidden_layers=vision_layers,
                  num_attention_heads=heads if vision_hidden % heads == 0 else 1, image_size=image_size,
                  patch_size=patch_size)  # fmt: skip
    return BlipConfig(text_config=text, vision_config=vision)


def world_blip(
    token_width: int, *, layers: int = 3, hidden: int = 128, heads: int = 4, dropout: float = 0.1, positions: int = 64
) -> tuple[BlipForConditionalGeneration, Any]:
    """The world BLIP (random init, current torch RNG) and the world tokenizer: a ``BlipTextLMHeadModel`` of the given
    sizes whose cross-attention reads image tokens of width ``token_width`` (the world encoder's), inside a
    ``BlipForConditionalGeneration`` whose vision tower is a placeholder without layers (never run)."""
    if hidden % heads:
        raise ValueError(f"world BLIP hidden size {hidden} is not divisible by its {heads} heads (model.tiny_heads)")
    tokenizer = world_tokenizer()
    sizes = dict(hidden=hidden, layers=layers, heads=heads, positions=positions, dropout=dropout)
    config = tiny_blip_config(
        tokenizer, image_size=8, patch_size=8, vision_hidden=token_width, vision_layers=0, **sizes
    )
    return BlipForConditionalGeneration(config), tokenizer


def save_tiny_blip(out: str | Path, *, image_size: int = 32, seed: int = 0, **sizes: Any) -> Path:
    """Save a random tiny ``BlipForConditionalGeneration`` over the world tokenizer, with a ``BlipImageProcessor``
    sized for ``image_size`` px (its default is 384) and the tokenizer, laid out like a Hub checkpoint
    (``model.blip=<out>`` and ``BlipForConditionalGeneration.from_pretrained(out)`` load it). For tests and
    benchmarks."""
    torch.manual_seed(seed)
    tok = world_tokenizer()
    model = BlipForConditionalGeneration(tiny_blip_config(tok, image_size=image_size, **sizes))
    out = Path(out)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    BlipImageProcessor(size={"height": image_size, "width": image_size}).save_pretrained(out)
    return out
