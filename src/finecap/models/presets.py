"""Tiny model presets for the embedded world: a small GPT-2 over the world tokenizer (random initialisation), and
tiny CLIP, BLIP and decoder-only VLMs (LLaVA, Idefics3, Qwen2-VL) saved like Hub checkpoints for tests and benchmarks.

These are real ``transformers`` architectures at toy sizes, trained from scratch here. Nothing else in finecap
assumes them: a captioner built on ``gpt2`` takes every shape from the loaded checkpoint.

Example::

    >>> lm, tok = build_world_lm(layers=2, hidden=64, heads=2, vocab=["a", "red", "circle"])
    >>> lm.config.vocab_size, lm.config.eos_token_id, lm.config.pad_token_id
    (8, 4, 0)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import (
    BlipConfig,
    BlipForConditionalGeneration,
    CLIPConfig,
    CLIPModel,
    GPT2Config,
    GPT2LMHeadModel,
)

from finecap.models.processors import BlipImageProcessor, CLIPImageProcessor, image_only_processor
from finecap.models.retriever import Retriever
from finecap.models.tokenizer import world_tokenizer
from finecap.utils.rng import torch_seeded
from finecap.world.captions import vocabulary

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
        raise ValueError(f"tiny LM hidden size {hidden} is not divisible by its {heads} heads (clipcap.tiny_heads)")
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
    experiments that need a dual encoder without training one. The weights are drawn after ``torch.manual_seed(seed)``
    and the process's random states are as before afterwards (:func:`finecap.utils.rng.torch_seeded`)."""
    tok = world_tokenizer()
    config = tiny_clip_config(
        len(tok), tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
        image_size=image_size, patch_size=patch_size, hidden=hidden, layers=layers, heads=heads,
        projection_dim=projection_dim, max_text_length=max_text_length,
    )  # fmt: skip
    size = {"shortest_edge": image_size}
    processor = CLIPImageProcessor(size=size, crop_size={"height": image_size, "width": image_size})
    with torch_seeded(seed):
        model = CLIPModel(config)
    Retriever(model, tok, processor).save(out)
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
        raise ValueError(f"world BLIP hidden size {hidden} is not divisible by its {heads} heads (blip.tiny_heads)")
    tokenizer = world_tokenizer()
    sizes = dict(hidden=hidden, layers=layers, heads=heads, positions=positions, dropout=dropout)
    config = tiny_blip_config(
        tokenizer, image_size=8, patch_size=8, vision_hidden=token_width, vision_layers=0, **sizes
    )
    return BlipForConditionalGeneration(config), tokenizer


def save_tiny_blip(out: str | Path, *, image_size: int = 32, seed: int = 0, **sizes: Any) -> Path:
    """Save a random tiny ``BlipForConditionalGeneration`` over the world tokenizer, with a ``BlipImageProcessor``
    sized for ``image_size`` px (its default is 384) and the tokenizer, laid out like a Hub checkpoint
    (``blip.name=<out>`` and ``BlipForConditionalGeneration.from_pretrained(out)`` load it). For tests and
    benchmarks. Seeded like :func:`save_tiny_clip`, leaving the process's random states as they were."""
    tok = world_tokenizer()
    with torch_seeded(seed):
        model = BlipForConditionalGeneration(tiny_blip_config(tok, image_size=image_size, **sizes))
    out = Path(out)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    BlipImageProcessor(size={"height": image_size, "width": image_size}).save_pretrained(out)
    return out


# --------------------------------------------------------------------------------------------------------------------
# Tiny decoder-only VLMs (tests, benchmarks)
# --------------------------------------------------------------------------------------------------------------------

VLM_FAMILIES = ("llava", "idefics3", "qwen2_vl")
"""The families :func:`save_tiny_vlm` builds (``config.model_type``)."""

PROMPT_WORDS = ("user", "assistant", "describe", "image", ":")
"""Words of the chat prompts added to the world vocabulary of tiny VLMs, so prompts are not all ``<unk>``."""

CHAT_TEMPLATES = {
    "llava": (
        "{% for m in messages %}{{ m['role'].upper() + ': ' }}{% for c in m['content'] %}{% if c['type'] == 'image' %}"
        "{{ '<image>\n' }}{% else %}{{ c['text'] + ' ' }}{% endif %}{% endfor %}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
    ),
    "idefics3": (
        "<|im_start|>{% for m in messages %}{{ m['role'] | capitalize }}{% if m['content'][0]['type'] == 'image' %}"
        "{{ ':' }}{% else %}{{ ': ' }}{% endif %}{% for c in m['content'] %}"
        "{% if c['type'] == 'text' %}{{ c['text'] }}{% elif c['type'] == 'image' %}{{ '<image>' }}{% endif %}"
        "{% endfor %}<end_of_utterance>\n{% endfor %}"
        "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
    ),
    "qwen2_vl": (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}{% if c['type'] == 'image' %}"
        "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
}
"""Chat templates of the tiny VLMs, shaped like their families' own (LLaVA-1.5, SmolVLM, Qwen2-VL-Instruct)."""

VLM_SPECIAL_TOKENS = {
    "llava": (["<image>"], None),
    "idefics3": (["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>", "<|im_start|>"],
                 "<end_of_utterance>"),
    "qwen2_vl": (["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                  "<|video_pad|>"], "<|im_end|>"),
}  # fmt: skip
"""Per family: the special tokens its processor and config use, and the token ending an assistant turn (the EOS of
captions; ``None``: the world tokenizer's ``<eos>``, as LLaVA-1.5's ``</s>``)."""


def vlm_tokenizer(family: str, extra_words: int = 0) -> Any:
    """The world tokenizer with the prompt words and the family's special tokens; EOS = the end of an assistant
    turn. ``extra_words`` made-up words enlarge the vocabulary to a real model's size (benchmarks)."""
    specials, eos = VLM_SPECIAL_TOKENS[family]
    tok = world_tokenizer([*vocabulary(), *PROMPT_WORDS, *(f"w{i}" for i in range(extra_words))])
    tok.add_special_tokens({"additional_special_tokens": specials})
    if eos is not None:
        tok.eos_token = eos
    return tok


def tiny_vlm(family: str, *, image_size: int = 16, hidden: int = 32, layers: int = 1, heads: int = 2,
             kv_heads: int = 1, intermediate: int = 0, positions: int = 128, patch: int = 0, scale: int = 2,
             vision: dict[str, int] | None = None, extra_words: int = 0) -> tuple[Any, Any]:  # fmt: skip
    """A random tiny ``...ForConditionalGeneration`` of ``family`` (:data:`VLM_FAMILIES`, current torch RNG) and its
    processor (tokenizer: :func:`vlm_tokenizer`; chat template: :data:`CHAT_TEMPLATES`). Images of ``image_size`` px
    give 4 image tokens in every family. The language model has ``layers`` x ``hidden``, ``heads`` query and
    ``kv_heads`` key/value heads and a feed-forward width ``intermediate`` (0: ``2 * hidden``). For real-size shapes
    (benchmarks): ``patch``, the LLaVA / Idefics3 vision tower's patch size (0: 4 image tokens), giving ``(image_size
    / patch) ** 2`` LLaVA image tokens (64 px, patch 4: 256) or that over ``scale ** 2`` for Idefics3 (its pixel
    shuffle: SmolVLM's 512 px, patch 16, scale 4: 64); ``vision``: the vision tower's ``hidden_size``,
    ``intermediate_size``, ``num_hidden_layers``, ``num_attention_heads`` (default a 1-layer tower of width 16);
    ``extra_words``: :func:`vlm_tokenizer`'s."""
    import transformers as tf

    if family not in VLM_FAMILIES:
        raise ValueError(f"tiny VLM family {family!r}; valid: {', '.join(VLM_FAMILIES)}")
    tok = vlm_tokenizer(family, extra_words)
    ids = {"pad_token_id": tok.pad_token_id, "eos_token_id": tok.eos_token_id, "bos_token_id": tok.bos_token_id}
    text = dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=intermediate or 2 * hidden,
                num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                max_position_embeddings=positions, **ids)  # fmt: skip
    vision = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              **(vision or {})}  # fmt: skip
    template = CHAT_TEMPLATES[family]
    if family == "llava":
        patch = patch or image_size // 2  # 2 x 2 patches + CLS; the default strategy drops CLS: 4 image tokens
        config = tf.LlavaConfig(
            vision_config=dict(model_type="clip_vision_model", image_size=image_size, patch_size=patch,
                               projection_dim=16, **vision),
            text_config=dict(model_type="llama", **text), image_token_id=tok.convert_tokens_to_ids("<image>"),
            vision_feature_layer=-1, vision_feature_select_strategy="default", **ids,
        )  # fmt: skip
        model = tf.LlavaForConditionalGeneration(config)
        size = {"height": image_size, "width": image_size}
        image_processor = CLIPImageProcessor(size={"shortest_edge": image_size}, crop_size=size)
        processor = tf.LlavaProcessor(image_processor=image_processor, tokenizer=tok, patch_size=patch,
                                      vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                      chat_template=template)  # fmt: skip
    elif family == "idefics3":
        patch = patch or image_size // 4  # 4 x 4 patches, pixel-shuffled by 2: 4 image tokens
        config = tf.Idefics3Config(
            vision_config=dict(image_size=image_size, patch_size=patch, **vision),
            text_config=dict(model_type="llama", **text), image_token_id=tok.convert_tokens_to_ids("<image>"),
            scale_factor=scale, **ids,
        )  # fmt: skip
        model = tf.Idefics3ForConditionalGeneration(config)
        edge = {"longest_edge": image_size}
        image_processor = tf.Idefics3ImageProcessor(do_image_splitting=False, size=edge, max_image_size=edge)
        tokens = (image_size // patch // scale) ** 2
        processor = tf.Idefics3Processor(image_processor=image_processor, tokenizer=tok, image_seq_len=tokens,
                                         chat_template=template)  # fmt: skip
    else:
        head_dim = hidden // heads
        section = [head_dim // 2 - 2 * (head_dim // 6), head_dim // 6, head_dim // 6]  # t, h, w halves of rope
        config = tf.Qwen2VLConfig(
            vision_config=dict(depth=vision["num_hidden_layers"], embed_dim=16, hidden_size=hidden, num_heads=2,
                               mlp_ratio=2, patch_size=image_size // 4, spatial_merge_size=2, temporal_patch_size=2,
                               in_chans=3),
            text_config=dict(**text, rope_parameters={"rope_type": "default", "mrope_section": section,
                                                      "rope_theta": 10000.0}),
            image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
            video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
            vision_start_token_id=tok.convert_tokens_to_ids("<|vision_start|>"),
            vision_end_token_id=tok.convert_tokens_to_ids("<|vision_end|>"), **ids,
        )  # fmt: skip
        model = tf.Qwen2VLForConditionalGeneration(config)
        pixels = image_size * image_size
        image_processor = tf.Qwen2VLImageProcessor(min_pixels=pixels, max_pixels=pixels, patch_size=image_size // 4,
                                                   merge_size=2, temporal_patch_size=2)  # fmt: skip
        cls = tf.Qwen2VLProcessor
        try:
            from transformers.utils import is_torchvision_available

            video = tf.Qwen2VLVideoProcessor() if is_torchvision_available() else None
        except ImportError:  # pragma: no cover
            video = None
        if video is None:
            processor = image_only_processor(cls)(image_processor=image_processor, tokenizer=tok,
                                                  chat_template=template)  # fmt: skip
        else:  # pragma: no cover - torchvision installed
            processor = cls(image_processor=image_processor, tokenizer=tok, video_processor=video,
                            chat_template=template)  # fmt: skip
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, processor


def save_tiny_vlm(out: str | Path, family: str, *, seed: int = 0, std: float = 0.0, **sizes: Any) -> Path:
    """Save a random tiny VLM of ``family`` with its processor into ``out``, laid out like a Hub checkpoint
    (``vlm.name=<out>``, ``AutoModelForImageTextToText.from_pretrained(out)`` and ``AutoProcessor`` load it).
    ``std > 0`` redraws every weight matrix from ``N(0, std)`` (at the default 0.02 a random tiny model's next-token
    distribution barely depends on the image). Seeded like :func:`save_tiny_clip`, leaving the process's random
    states as they were."""
    with torch_seeded(seed):
        model, processor = tiny_vlm(family, **sizes)
        if std > 0:
            with torch.no_grad():
                for p in model.parameters():
                    if p.ndim == 2:
                        p.normal_(0.0, std)
    out = Path(out)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def world_vlm(token_width: int, n_tokens: int, image_processor: Any, *, layers: int = 3, hidden: int = 128,
              heads: int = 4, positions: int = 128) -> tuple[Any, Any]:  # fmt: skip
    """The world VLM (random init, current torch RNG): a tiny LLaVA-architecture model whose Llama-style language
    model (``layers`` x ``hidden``, ``heads`` heads, feed-forward ``4 * hidden``, over :func:`vlm_tokenizer`) reads
    ``n_tokens`` image tokens of width ``token_width`` through LLaVA's projector (Linear-GELU-Linear), with
    LLaVA-1.5's chat template; and its ``LlavaProcessor`` over ``image_processor`` (the world encoder's).

    The image tokens are the frozen world encoder's (:class:`finecap.models.blip.FeatureMapTokens`: its projected
    feature and the cells of its 2x2 map, ``(5, 256)`` at the default world), which finecap's
    :class:`finecap.models.vlm.Vlm` feeds to the projector; the ``vision_tower`` slot holds a placeholder CLIP tower
    without layers whose patch grid makes the processor expand ``<image>`` into ``n_tokens`` tokens (``n_tokens - 1``
    patches + the class slot, ``vision_feature_select_strategy="full"``), as the world BLIP keeps BLIP's structure."""
    import transformers as tf

    side = math.isqrt(n_tokens - 1)
    if side * side != n_tokens - 1:
        raise ValueError(f"world VLM: {n_tokens} image tokens are not a square grid of cells plus one global token")
    if hidden % heads:
        raise ValueError(f"world VLM hidden size {hidden} is not divisible by its {heads} heads (vlm.tiny_heads)")
    crop = getattr(image_processor, "crop_size", None) or {}
    image_size = int(crop.get("height") or image_processor.size.get("height") or image_processor.size["shortest_edge"])
    tok = vlm_tokenizer("llava")
    ids = {"pad_token_id": tok.pad_token_id, "eos_token_id": tok.eos_token_id, "bos_token_id": tok.bos_token_id}
    vision = dict(
        model_type="clip_vision_model",
        hidden_size=token_width,
        intermediate_size=token_width,
        num_hidden_layers=0,
        num_attention_heads=1,
        image_size=image_size,
        patch_size=image_size // side,
    )
    text = dict(
        model_type="llama",
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=positions,
        **ids,
    )
    image_token = tok.convert_tokens_to_ids("<image>")
    config = tf.LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=image_token,
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
        **ids,
    )
    model = tf.LlavaForConditionalGeneration(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    processor = tf.LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tok,
        patch_size=image_size // side,
        vision_feature_select_strategy="full",
        num_additional_image_tokens=1,
        chat_template=CHAT_TEMPLATES["llava"],
    )
    return model, processor
