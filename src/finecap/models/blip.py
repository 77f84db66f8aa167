"""BLIP: a vision transformer + a text decoder cross-attending to its image tokens (Li et al., 2022).

:class:`Blip` wraps ``transformers``' ``BlipForConditionalGeneration`` (``vision_model``: ``BlipVisionModel``;
``text_decoder``: ``BlipTextLMHeadModel``, a BERT-style decoder with cross-attention) behind the captioner contract
(:class:`finecap.models.base.CaptionerBase`). It is loaded by Hub name or path
(``Salesforce/blip-image-captioning-base``, ``-large``) with the checkpoint's own image processor and tokenizer, or
built from a small ``BlipConfig`` (:func:`finecap.models.presets.tiny_blip_config`, for tests).

Pitfalls of the ``transformers`` model, handled here (and tested in ``tests/models/test_blip.py``):

- ``generate`` replaces the first token with ``bos_token_id`` (``[DEC]``) while ``forward`` does not: training
  therefore feeds ``[bos] + caption[:-1]`` itself, as the original BLIP does (``text.input_ids[:, 0] =
  bos_token_id``), and decoding starts from ``[bos]``.
- ``BlipTextLMHeadModel`` shifts ``labels`` inside the model; finecap computes its own losses from logits aligned
  with the caption tokens (``logits[:, t]`` predicts ``input_ids[:, t]``, the ClipCap convention), so no labels
  are passed and padding positions are -100 in the batch's ``labels`` (:mod:`finecap.objectives.mle`).
- The default special ids (bos 30522, sep 102, pad 0) assume BERT's vocabulary: a tiny config must set
  ``bos_token_id`` / ``sep_token_id`` / ``pad_token_id`` inside its own vocabulary; :class:`Blip` checks that they
  are, that the tokenizer's EOS is the decoder's ``[SEP]`` (BLIP's stop token; a BERT tokenizer gets ``eos = sep``),
  and names the offending id otherwise.
- The image processor needs ``size`` set for small images (its default is 384 px); without torchvision,
  ``BlipImageProcessor`` falls back to its PIL backend (``BlipImageProcessorPil``), which is what is used here.

Decoding runs the :class:`finecap.decode.Stepper` protocol: ``start`` encodes each image once (tokens ``(B, P, H)``)
and runs ``[bos]``; the text decoder's ``EncoderDecoderCache`` keeps the self-attention K/V and the cross-attention
K/V of the image tokens, computed at the first step only; ``select`` repeats / reorders cache rows for beams and
samples. Greedy decoding equals ``BlipForConditionalGeneration.generate``'s (tested).

**World BLIP** (``blip.name=world-tiny``): pretrained BLIP weights cannot be downloaded here, and a ViT trained from
scratch on the world learns shapes badly (a tiny ViT probed at 0.33 on shape), so the world BLIP's text decoder (a
real ``BlipTextLMHeadModel`` inside a ``BlipForConditionalGeneration``) cross-attends to the *frozen world encoder's*
image tokens (:class:`FeatureMapTokens`): its projected image feature as a global token (BLIP's ``[CLS]`` slot)
followed by the cells of its last spatial feature map (ConvNeXt's 2x2 map before the 1x1 readout), i.e. ``(B, 5,
256)`` at the default preset. BLIP's structure (vision tokens -> cross-attention decoder) is kept; the
``vision_model`` slot of the ``BlipForConditionalGeneration`` then holds a placeholder without layers (it is never
run), and the checkpoint records the world encoder it reads, as a ClipCap checkpoint does.

Checkpoints (:meth:`Blip.save`): the ``BlipForConditionalGeneration`` with ``save_pretrained`` (safetensors) and its
tokenizer and image processor in the checkpoint folder itself, so ``BlipForConditionalGeneration.from_pretrained``
loads a fine-tuned BLIP outside finecap; LoRA adapters in peft's format beside it (``lm_lora/`` on the text decoder,
``encoder_lora/`` on the vision side); ``captioner.json`` (``"kind": "blip"``).

LoRA targets (:mod:`finecap.models.lora`): ``lm`` = every linear layer of the text decoder except the output head
(BERT's ``query``/``key``/``value``/``dense`` of self- and cross-attention, ``intermediate.dense``,
``output.dense``, and the prediction head's ``transform.dense``); ``encoder`` = every linear layer of the vision side
(BLIP's ViT: ``qkv``, ``projection``, ``fc1``, ``fc2``; the world BLIP: the world encoder's image side as for
ClipCap).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from PIL import Image
from torch import nn
from transformers import AutoTokenizer, BlipConfig, BlipForConditionalGeneration
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

from finecap.config.paths import recorded_source
from finecap.models import lora, memory
from finecap.models.base import TEXT_TINY_SIZES, CaptionerBase, same_source, set_dropout
from finecap.models.captioner import encode_images, shifted_mask
from finecap.models.kvcache import cache_kwargs, returned_cache
from finecap.models.processors import BlipImageProcessor
from finecap.models.vision import FeatureMapTokens, load_frozen_tokens

if TYPE_CHECKING:
    from finecap.config import Config

KIND = "blip"
UNQUANTIZED = ("vision_model", "text_decoder.cls.predictions.decoder")
"""What ``model.quantization`` leaves unquantised in a BLIP: the vision tower and the output head (the quantized
part is the text decoder)."""


# --------------------------------------------------------------------------------------------------------------------
# Vision sides: BLIP's own ViT, or the world encoder's feature map
# --------------------------------------------------------------------------------------------------------------------


class BlipVision:
    """BLIP's own vision tower as the captioner's ``encoder``: image tokens ``(B, 1+P, H)``
    (``vision_model(...).last_hidden_state``, what BLIP's decoder cross-attends to). A view on the
    ``BlipForConditionalGeneration`` (not a registered submodule, so no weight appears twice in the state dict)."""

    def __init__(self, blip: BlipForConditionalGeneration, image_processor: Any) -> None:
        self.blip = blip
        self.image_processor = image_processor

    @property
    def model(self) -> nn.Module:
        return self.blip.vision_model

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.blip.vision_model(pixel_values=pixel_values).last_hidden_state  # (B, 1+P, H)

    def preprocess(self, images: Sequence[Image.Image]) -> torch.Tensor:
        """PIL images -> pixel values ``(B, 3, H, W)`` with the checkpoint's image processor."""
        if self.image_processor is None:
            raise ValueError("this BLIP has no image processor")
        images = [im.convert("RGB") for im in images]
        return self.image_processor(images=images, return_tensors="pt")["pixel_values"]

    def set_trainable(self, trainable: bool) -> None:
        self.blip.vision_model.requires_grad_(trainable)


# --------------------------------------------------------------------------------------------------------------------
# The captioner
# --------------------------------------------------------------------------------------------------------------------


def _prepare_tokenizer(tokenizer: Any, config: BlipConfig) -> Any:
    """Check the decoder's special ids against the vocabulary and make the tokenizer's EOS the decoder's ``[SEP]``."""
    text = config.text_config
    vocab = int(text.vocab_size)
    for name in ("bos_token_id", "sep_token_id", "pad_token_id"):
        value = getattr(text, name)
        if value is None or not 0 <= int(value) < vocab:
            raise ValueError(
                f"BLIP text_config.{name}={value} is outside the decoder's vocabulary of {vocab} tokens (the defaults "
                "assume BERT's vocabulary; a small BlipConfig must set bos/sep/pad inside its own)"
            )
    if tokenizer.eos_token_id is None:  # BERT tokenizers have [SEP] but no EOS
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(int(text.sep_token_id))
    if int(tokenizer.eos_token_id) != int(text.sep_token_id):
        raise ValueError(
            f"tokenizer EOS id {tokenizer.eos_token_id} != BLIP text_config.sep_token_id {text.sep_token_id} "
            "(BLIP stops at [SEP])"
        )
    if tokenizer.pad_token_id is None or int(tokenizer.pad_token_id) != int(text.pad_token_id):
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(int(text.pad_token_id))
    return tokenizer


class Blip(CaptionerBase):
    """BLIP captioner. See the module docstring; build it with :meth:`build` or :meth:`from_checkpoint`.

    Args:
        model: a ``BlipForConditionalGeneration``.
        tokenizer: its tokenizer (EOS = the decoder's ``[SEP]``).
        image_processor: its image processor (BLIP's own vision; ``None`` with ``world``).
        world: image tokens from a dual encoder instead of ``model.vision_model`` (the world BLIP).
        train_encoder: train the vision side (batches carry ``pixel_values``); otherwise it is frozen.
        train_lm: train the text decoder.
        source: where the BLIP came from (recorded in checkpoints).
    """

    kind = KIND
    TRANSFORMERS_CLASS = "BlipForConditionalGeneration"

    def __init__(
        self,
        model: BlipForConditionalGeneration,
        tokenizer: Any,
        image_processor: Any = None,
        *,
        world: FeatureMapTokens | None = None,
        train_encoder: bool = False,
        train_lm: bool = True,
        source: str = "",
    ) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = _prepare_tokenizer(tokenizer, model.config)
        self.image_processor = image_processor
        self.world = world
        self._native = None if world is not None else BlipVision(model, image_processor)
        self.train_encoder = bool(train_encoder)
        self.train_lm = bool(train_lm)
        self.source = source
        self.bos_token_id = int(model.config.text_config.bos_token_id)
        self.apply_trainable()
        self.train(self.training)

    # ------------------------------------------------------------------------------------------------------------
    # What it is, what trains
    # ------------------------------------------------------------------------------------------------------------

    @property
    def encoder(self) -> FeatureMapTokens | BlipVision:
        """The vision side: image tokens ``(B, P, H)`` from ``pixel_values``."""
        return self.world if self.world is not None else self._native

    @property
    def decoder(self) -> nn.Module:
        return self.model.text_decoder

    @property
    def cache_features(self) -> bool:
        """Frozen image tokens go through the feature cache for the world BLIP (5 tokens per image); BLIP's own
        ViT tokens (577 x 768 per image for the base model) are recomputed instead."""
        return self.world is not None

    @property
    def max_positions(self) -> int:
        return int(self.model.config.text_config.max_position_embeddings)

    @property
    def max_caption_tokens(self) -> int:
        """Decoding reads ``[bos]`` and then up to ``max_length`` tokens within the decoder's positions."""
        return self.max_positions - 1

    def part_path(self, part: str) -> str:
        """``"lm"``: the text decoder; ``"encoder"``: BLIP's vision model, or the world dual encoder. LoRA's default
        targets are every linear layer of the part (module docstring)."""
        if part == "lm":
            return "model.text_decoder"
        return "world.model" if self.world is not None else "model.vision_model"

    def apply_trainable(self) -> None:
        """``requires_grad`` from ``train_lm`` / ``train_encoder``, through adapters when a part has some (nothing
        else in BLIP learns)."""
        lora.train_part(self.model.text_decoder, self.train_lm)
        if self.world is not None:
            self.model.vision_model.requires_grad_(False)  # the unused placeholder
            self.world.set_trainable(self.train_encoder)  # its adapters only, if any; the text side stays frozen
        else:
            lora.train_part(self.model.vision_model, self.train_encoder)

    def dual_encoder(self) -> FeatureMapTokens | None:
        return self.world

    def adapter_root(self) -> str | None:
        """A BLIP with its own ViT is one ``BlipForConditionalGeneration``: a LoRA run also saves one adapter for it
        (the world BLIP reads tokens from outside it, so it has none)."""
        return "model" if self.world is None else None

    def own_config(self) -> dict[str, Any]:
        return {"source": self.source, "world_source": self.world.source if self.world is not None else ""}

    # ------------------------------------------------------------------------------------------------------------
    # Conditioning and teacher forcing
    # ------------------------------------------------------------------------------------------------------------

    def image_tokens(self, batch: dict[str, Any]) -> torch.Tensor:
        """Image tokens ``(B, P, H)``: cached ``features`` or the vision side applied to ``pixel_values``."""
        tokens = encode_images(batch, self.encoder, self.train_encoder, self.device)
        if tokens.ndim != 3:
            raise ValueError(f"BLIP image tokens must be (B, P, H), got {tuple(tokens.shape)}")
        return tokens

    def image_conditioning(self, batch: dict[str, Any]) -> torch.Tensor:
        """The image tokens ``(B, P, H)`` the decoder cross-attends to (the vision side runs once per image)."""
        return self.image_tokens(batch)

    def output_head(self) -> nn.Module:
        """The text decoder's ``cls.predictions.decoder`` (after its transform): :meth:`CaptionerBase.output_head`."""
        return self.model.text_decoder.get_output_embeddings()

    def caption_logits(self, tokens: torch.Tensor, input_ids: torch.Tensor,
                       attention_mask: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """Teacher-forced logits ``(B, T, V)`` of ``input_ids (B, T)`` given image tokens ``(B, P, H)``: the decoder
        reads ``[bos] + input_ids[:, :-1]``, so ``logits[:, t]`` predicts ``input_ids[:, t]``."""
        B, T = input_ids.shape
        if T < 1:
            raise ValueError("input_ids must hold at least one token (the [SEP])")
        self.check_length(tokens, T, "caption length (data.max_tokens)")
        input_ids = input_ids.to(self.device)
        bos = torch.full((B, 1), self.bos_token_id, dtype=input_ids.dtype, device=self.device)
        dec_in = torch.cat([bos, input_ids[:, :-1]], dim=1)  # (B, T)
        mask = shifted_mask(attention_mask, 1, self.device)  # (B, T): [bos] + input_ids[:, :-1]
        dtype = next(self.model.text_decoder.parameters()).dtype
        out = self.model.text_decoder(input_ids=dec_in, attention_mask=mask, encoder_hidden_states=tokens.to(dtype),
                                      use_cache=False)  # fmt: skip
        return out.logits  # (B, T, V)

    # ------------------------------------------------------------------------------------------------------------
    # Decoding (Stepper protocol)
    # ------------------------------------------------------------------------------------------------------------

    def start(self, tokens: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Run ``[bos]`` against the image tokens ``(B, P, H)``; the state is ``(cache, image tokens)``."""
        B = tokens.shape[0]
        dtype = next(self.model.text_decoder.parameters()).dtype
        tokens = tokens.to(self.device, dtype)
        bos = torch.full((B, 1), self.bos_token_id, dtype=torch.long, device=self.device)
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        decoder = self.model.text_decoder
        out = decoder(input_ids=bos, encoder_hidden_states=tokens, use_cache=True, **cache_kwargs(decoder, cache))
        return out.logits[:, -1], (returned_cache(out), tokens)  # (B, V)

    def step(self, ids: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        """Feed one token per row ``(N,)``; cross-attention reuses the cached K/V of the image tokens (which are
        passed only so that the decoder takes its cross-attention path)."""
        cache, tokens = state
        decoder = self.model.text_decoder
        kv = cache_kwargs(decoder, cache)
        out = decoder(input_ids=ids[:, None], encoder_hidden_states=tokens, use_cache=True, **kv)
        return out.logits[:, -1], (returned_cache(out), tokens)  # (N, V)

    @staticmethod
    def select(state: Any, index: torch.Tensor) -> Any:
        """Keep/repeat/reorder rows of the self- and cross-attention caches. After :meth:`start` every layer's
        cross-attention K/V are cached, so the decoder reads the image tokens only for their shape: they become a
        zero-copy view of the right batch size instead of being gathered at every beam step."""
        cache, tokens = state
        if not cache.is_updated or not all(cache.is_updated.values()):
            raise RuntimeError("BLIP decoding state: the cross-attention cache is not filled (call start first)")
        cache.reorder_cache(index.to(tokens.device))
        return cache, tokens[:1].expand(index.shape[0], -1, -1)  # (M, P, H) view

    # ------------------------------------------------------------------------------------------------------------
    # Saving and loading
    # ------------------------------------------------------------------------------------------------------------

    def save_weights(self, out: Path, state: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The ``BlipForConditionalGeneration`` (``save_pretrained``, base weights without adapters), its tokenizer
        and image processor, in ``out`` itself: ``BlipForConditionalGeneration.from_pretrained(out)`` loads it."""
        self.save_plain_model(out, state)
        self.tokenizer.save_pretrained(out)
        if self.image_processor is not None:
            self.image_processor.save_pretrained(out)
        return {}

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, options: memory.LoadOptions | None = None,
                        **kwargs: Any) -> Blip:  # fmt: skip
        """A ``BlipForConditionalGeneration`` checkpoint (Hub name or folder) with its own tokenizer and image
        processor; ``options``: the weights' dtype, attention and quantization (``model.*``; default float32)."""
        name = str(name_or_path)
        options = options or memory.LoadOptions()
        try:
            model = options.load(BlipForConditionalGeneration, name, f"blip.name={name}", skip=UNQUANTIZED)
            tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=False)
            processor = BlipImageProcessor.from_pretrained(name, trust_remote_code=False)
        except OSError as e:
            raise OSError(f"blip.name={name}: cannot load the BLIP model, tokenizer or image processor: {e}") from None
        return cls(model, tokenizer, processor, source=recorded_source(name), **kwargs)

    @classmethod
    def card_lines(cls, meta: dict[str, Any]) -> list[str]:
        """The default lines, and that BLIP's ``generate`` reads the folder's decoding only when given it (it hands
        over to its text decoder, whose own defaults are greedy, 20 tokens: docs/caption.md)."""
        lines = super().card_lines(meta)
        if lines:
            lines += ["BLIP's `generate` decodes as the run did only when passed the folder's settings: "
                      "`model.generate(**inputs, generation_config=model.generation_config)`."]  # fmt: skip
        return lines

    @classmethod
    def load_weights(cls, path: Path, meta: dict[str, Any], load_encoder: bool,
                     options: memory.LoadOptions) -> Blip:  # fmt: skip
        """The BLIP, tokenizer and image processor of the folder, and the world BLIP's dual encoder (``load_encoder``
        false: without it, for cached image tokens)."""
        model = options.load(BlipForConditionalGeneration, path, str(path), skip=UNQUANTIZED, checkpoint=True)
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        world = cls.load_dual_encoder(path, meta, load_encoder, options.torch_dtype or "auto", FeatureMapTokens)
        processor = None
        if not meta.get("world_source"):
            processor = BlipImageProcessor.from_pretrained(path, trust_remote_code=False)
        return cls(model, tokenizer, processor, world=world, train_encoder=meta["train_encoder"],
                   train_lm=meta["train_lm"], source=meta.get("source", ""))  # fmt: skip

    @classmethod
    def build(cls, cfg: Config) -> Blip:
        """A BLIP captioner from ``cfg.model`` and ``cfg.blip`` (``model.kind=blip``): ``blip.name=world-tiny``
        builds the world BLIP (a tiny ``BlipTextLMHeadModel`` of ``blip.tiny_*`` sizes over the world tokenizer,
        random init, cross-attending to the image tokens of ``model.encoder``: ``world`` = the trained world encoder,
        or a dual-encoder path); anything else is loaded as a ``BlipForConditionalGeneration`` checkpoint."""
        m, b = cfg.model, cfg.blip
        kwargs = {"train_encoder": m.train_encoder, "train_lm": m.train_lm}
        options = memory.LoadOptions.of(m)
        if b.name != "world-tiny":
            return cls.from_pretrained(b.name, options, **kwargs)
        # deferred: the tiny presets (which import GPT-2, CLIP and the retriever) build a fresh world BLIP only; a
        # pretrained BLIP and reading a checkpoint (its fingerprint, loading it) need none of them
        from finecap.models.presets import world_blip

        world = load_frozen_tokens(cfg, options, "blip.name=world-tiny")
        image_size = int(world.image_processor.crop_size["height"]) if world.image_processor is not None else 64
        _, width = world.token_shape(image_size)
        positions = max(cfg.data.max_tokens, cfg.decode.max_length) + 1  # + [bos]
        model, tokenizer = world_blip(width, layers=b.tiny_layers, hidden=b.tiny_hidden, heads=b.tiny_heads,
                                      dropout=b.tiny_dropout, positions=positions)  # fmt: skip
        model = options.fresh(model, "blip.name=world-tiny")
        return cls(model, tokenizer, world=world, source="world-tiny", **kwargs)

    TINY_SIZES = TEXT_TINY_SIZES
    """The world BLIP's sizes (``blip.tiny_*``) and the text decoder config's fields that hold them."""
    DROPOUTS = ("hidden_dropout_prob", "attention_probs_dropout_prob")
    """The text decoder config's fields of ``blip.tiny_dropout``."""

    def loaded_setting_differences(self, cfg: Config) -> list[tuple[str, Any, Any]]:
        """Per key of the ``blip`` section, on a checkpoint: ``name`` and, for the world BLIP, ``tiny_layers``,
        ``tiny_hidden``, ``tiny_heads`` built the weights and cannot apply; ``tiny_dropout`` applies
        (:meth:`apply_settings`)."""
        b = cfg.blip
        if not same_source(self.source, b.name):
            return [("blip.name", self.source, b.name)]
        if b.name != "world-tiny":
            return []
        config = self.model.config.text_config
        return [(f"blip.{key}", getattr(config, attr), getattr(b, key)) for key, attr in self.TINY_SIZES.items()
                if getattr(config, attr, None) not in (None, getattr(b, key))]  # fmt: skip

    def apply_settings(self, cfg: Config) -> list[str]:
        """``blip.tiny_dropout`` on the world BLIP: every dropout module of the text decoder gets the configured p and
        its config records it; a pretrained BLIP keeps its own, as a fresh one does."""
        p = cfg.blip.tiny_dropout
        if cfg.blip.name != "world-tiny" or self.source not in ("world-tiny", ""):
            return []
        decoder = self.model.text_decoder
        before = {getattr(decoder.config, name, None) for name in self.DROPOUTS}
        changed = set_dropout(decoder, p)
        for config in {id(c): c for c in (decoder.config, self.model.config.text_config)}.values():
            for name in self.DROPOUTS:
                setattr(config, name, p)
        return [f"blip.tiny_dropout={p:g}"] if changed or before != {p} else []

    @staticmethod
    def reads_world_encoder(cfg: Config) -> bool:
        """The world BLIP (``blip.name=world-tiny``) reads the world encoder's tokens when ``model.encoder=world``."""
        return cfg.blip.name == "world-tiny" and cfg.model.encoder == "world"

    @staticmethod
    def encoder_source(cfg: Config) -> str | None:
        """The world BLIP reads ``model.encoder`` from outside its checkpoint; a pretrained BLIP brings its own."""
        return cfg.model.encoder if cfg.blip.name == "world-tiny" else None

    @staticmethod
    def built_here(cfg: Config) -> str | None:
        """``blip.name=world-tiny``: the world BLIP is built here with random weights."""
        return "blip.name=world-tiny" if cfg.blip.name == "world-tiny" else None
