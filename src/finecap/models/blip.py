"""BLIP: a vision transformer + a text decoder cross-attending to its image tokens (Li et al., 2022).

:class:`Blip` wraps ``transformers``' ``BlipForConditionalGeneration`` (``vision_model``: ``BlipVisionModel``;
``text_decoder``: ``BlipTextLMHeadModel``, a BERT-style decoder with cross-attention) behind the captioner protocol
(:mod:`finecap.models.captioner`). It is loaded by Hub name or path (``Salesforce/blip-image-captioning-base``,
``-large``) with the checkpoint's own image processor and tokenizer, or built from a small ``BlipConfig``
(:func:`finecap.models.presets.tiny_blip_config`, for tests).

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

from finecap.config import DecodeConfig
from finecap.decode import Generation
from finecap.models import lora, memory
from finecap.models.captioner import (
    TokenScores,
    encode_images,
    generate_in_chunks,
    logits_or_scores,
    shifted_mask,
    strip_prefix,
)
from finecap.models.presets import BlipImageProcessor, world_blip
from finecap.models.vision import VisionEncoder
from finecap.models.world_encoder import world_encoder_path
from finecap.utils import read_json, write_json

if TYPE_CHECKING:
    from finecap.config import Config

CONFIG_NAME = "captioner.json"
WORLD_DIR = "world_encoder"
KIND = "blip"
UNQUANTIZED = ("vision_model", "text_decoder.cls.predictions.decoder")
"""What ``model.quantization`` leaves unquantised in a BLIP: the vision tower and the output head (the quantized
part is the text decoder)."""


# --------------------------------------------------------------------------------------------------------------------
# Vision sides: BLIP's own ViT, or the world encoder's feature map
# --------------------------------------------------------------------------------------------------------------------


class FeatureMapTokens(VisionEncoder):
    """Image tokens ``(B, 1 + h*w, D)`` of a dual encoder: its projected image feature (a global token) followed by
    the cells of the last spatial feature map with more than one cell (a ConvNet's stage map, ``(B, D, h, w)``); for
    a ViT tower (``(B, P, H)`` hidden states) its last hidden state. The global token and the map cells must have
    the same width."""

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        vision = getattr(self.model, "vision_model", None)
        if vision is None:
            raise TypeError(f"vision encoder {self.source}: no vision_model to take image tokens from")
        out = vision(pixel_values=pixel_values.to(self.dtype), output_hidden_states=True)
        states = out.hidden_states
        if states[-1].ndim == 3:  # ViT: (B, 1+P, H)
            return out.last_hidden_state
        maps = [s for s in states if s.ndim == 4 and s.shape[-1] * s.shape[-2] > 1]
        if not maps:
            raise ValueError(f"vision encoder {self.source}: no spatial feature map with more than one cell")
        fmap = maps[-1]  # (B, C, h, w)
        projection = getattr(self.model, "visual_projection", None)
        if projection is not None and out.pooler_output is not None:  # get_image_features, without a second pass
            pooled = projection(out.pooler_output)  # (B, D)
        else:
            pooled = super().forward(pixel_values)  # (B, D)
        if fmap.shape[1] != pooled.shape[1]:
            raise ValueError(
                f"vision encoder {self.source}: feature map width {fmap.shape[1]} != projection dim {pooled.shape[1]}"
            )
        cells = fmap.flatten(2).transpose(1, 2)  # (B, h*w, D)
        return torch.cat([pooled[:, None, :], cells], dim=1)  # (B, 1+h*w, D)

    def token_shape(self, image_size: int) -> tuple[int, int]:
        """``(P, D)`` of the tokens of an ``image_size`` px image."""
        param = next(self.model.parameters())
        with torch.no_grad():
            out = self(torch.zeros(1, 3, image_size, image_size, device=param.device, dtype=param.dtype))
        return int(out.shape[1]), int(out.shape[2])


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


class Blip(nn.Module):
    """BLIP captioner. See the module docstring; build it with :func:`build_blip` or :meth:`from_checkpoint`.

    Args:
        model: a ``BlipForConditionalGeneration``.
        tokenizer: its tokenizer (EOS = the decoder's ``[SEP]``).
        image_processor: its image processor (BLIP's own vision; ``None`` with ``world``).
        world: image tokens from a dual encoder instead of ``model.vision_model`` (the world BLIP).
        train_encoder: train the vision side (batches carry ``pixel_values``); otherwise it is frozen.
        train_lm: train the text decoder.
        source: where the BLIP came from (recorded in checkpoints).
    """

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
    # Properties, modes, what trains
    # ------------------------------------------------------------------------------------------------------------

    @property
    def encoder(self) -> FeatureMapTokens | BlipVision:
        """The vision side: image tokens ``(B, P, H)`` from ``pixel_values``."""
        return self.world if self.world is not None else self._native

    @property
    def decoder(self) -> nn.Module:
        return self.model.text_decoder

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

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

    @property
    def pad_token_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    @property
    def eos_token_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    def lora_module(self, part: str) -> nn.Module | None:
        """``"lm"``: the text decoder; ``"encoder"``: BLIP's vision model, or the world dual encoder."""
        if part == "lm":
            return self.model.text_decoder
        return self.world.model if self.world is not None else self.model.vision_model

    def set_lora_module(self, part: str, module: nn.Module) -> None:
        if part == "lm":
            self.model.text_decoder = module
        elif self.world is not None:
            self.world.model = module
        else:
            self.model.vision_model = module

    def lora_default_targets(self, part: str) -> tuple[str, ...]:
        """Every linear layer of the part (``()``; module docstring)."""
        return ()

    def apply_trainable(self) -> None:
        """``requires_grad`` from ``train_lm`` / ``train_encoder``, through adapters when a part has some (nothing
        else in BLIP learns)."""
        lora.train_part(self.model.text_decoder, self.train_lm)
        if self.world is not None:
            self.model.vision_model.requires_grad_(False)  # the unused placeholder
            self.world.set_trainable(self.train_encoder)  # its adapters only, if any; the text side stays frozen
        else:
            lora.train_part(self.model.vision_model, self.train_encoder)

    def train(self, mode: bool = True) -> Blip:
        super().train(mode)
        if not self.train_encoder:
            self.lora_module("encoder").eval()
        if not self.train_lm:
            self.model.text_decoder.eval()
        return self

    def config_dict(self) -> dict[str, Any]:
        return {
            "kind": KIND,
            "train_encoder": self.train_encoder,
            "train_lm": self.train_lm,
            "source": self.source,
            "world_source": self.world.source if self.world is not None else "",
        }

    # ------------------------------------------------------------------------------------------------------------
    # Forward
    # ------------------------------------------------------------------------------------------------------------

    def image_tokens(self, batch: dict[str, Any]) -> torch.Tensor:
        """Image tokens ``(B, P, H)``: cached ``features`` or the vision side applied to ``pixel_values``."""
        tokens = encode_images(batch, self.encoder, self.train_encoder, self.device)
        if tokens.ndim != 3:
            raise ValueError(f"BLIP image tokens must be (B, P, H), got {tuple(tokens.shape)}")
        return tokens

    def _decoder_logits(self, tokens: torch.Tensor, input_ids: torch.Tensor,
                        attention_mask: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """Teacher-forced logits ``(B, T, V)`` of ``input_ids (B, T)`` given image tokens ``(B, P, H)``: the decoder
        reads ``[bos] + input_ids[:, :-1]``, so ``logits[:, t]`` predicts ``input_ids[:, t]``."""
        B, T = input_ids.shape
        if T < 1:
            raise ValueError("input_ids must hold at least one token (the [SEP])")
        if self.max_positions < T:
            raise ValueError(f"caption length {T} (data.max_tokens) exceeds BLIP's {self.max_positions} positions")
        input_ids = input_ids.to(self.device)
        bos = torch.full((B, 1), self.bos_token_id, dtype=input_ids.dtype, device=self.device)
        dec_in = torch.cat([bos, input_ids[:, :-1]], dim=1)  # (B, T)
        mask = shifted_mask(attention_mask, 1, self.device)  # (B, T): [bos] + input_ids[:, :-1]
        dtype = next(self.model.text_decoder.parameters()).dtype
        out = self.model.text_decoder(input_ids=dec_in, attention_mask=mask, encoder_hidden_states=tokens.to(dtype),
                                      use_cache=False)  # fmt: skip
        return out.logits  # (B, T, V)

    def forward(
        self,
        batch: dict[str, Any],
        sequences: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        image_index: torch.Tensor | None = None,
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> torch.Tensor | TokenScores:
        """The one differentiable entry point, as :meth:`finecap.models.clipcap.ClipCap.forward`: teacher-forced
        logits ``(B, T, V)`` of ``batch['input_ids']``, or :class:`TokenScores` of ``sequences (N, L)`` (rows mapped
        to images by ``image_index``; the vision side runs once per image)."""
        tokens = self.image_tokens(batch)  # (B, P, H)
        return logits_or_scores(tokens, self._decoder_logits, batch, sequences, mask, image_index, temperature,
                                with_entropy, self.device)  # fmt: skip

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
        out = self.model.text_decoder(input_ids=bos, encoder_hidden_states=tokens, past_key_values=cache,
                                      use_cache=True)  # fmt: skip
        return out.logits[:, -1], (out.past_key_values, tokens)  # (B, V)

    def step(self, ids: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        """Feed one token per row ``(N,)``; cross-attention reuses the cached K/V of the image tokens (which are
        passed only so that the decoder takes its cross-attention path)."""
        cache, tokens = state
        out = self.model.text_decoder(input_ids=ids[:, None], encoder_hidden_states=tokens, past_key_values=cache,
                                      use_cache=True)  # fmt: skip
        return out.logits[:, -1], (out.past_key_values, tokens)  # (N, V)

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

    @torch.no_grad()
    def generate(
        self,
        batch_or_tokens: dict[str, Any] | torch.Tensor,
        decode_cfg: DecodeConfig | None = None,
        generator: torch.Generator | None = None,
        seeds: torch.Tensor | None = None,
    ) -> Generation:
        """Decode captions for a batch (``features`` = image tokens, or ``pixel_values``) or image tokens
        ``(B, P, H)``; as :meth:`finecap.models.clipcap.ClipCap.generate`."""
        cfg = decode_cfg or DecodeConfig()
        if cfg.max_length + 1 > self.max_positions:
            raise ValueError(
                f"decode.max_length={cfg.max_length} + [bos] exceeds BLIP's {self.max_positions} text positions"
            )
        tokens = batch_or_tokens if isinstance(batch_or_tokens, torch.Tensor) else self.image_tokens(batch_or_tokens)
        tokens = tokens.to(self.device)
        return generate_in_chunks(self, tokens, cfg, self.tokenizer, self.pad_token_id, generator, seeds)

    # ------------------------------------------------------------------------------------------------------------
    # Saving and loading
    # ------------------------------------------------------------------------------------------------------------

    def save(self, out: str | Path, state_dict: dict[str, torch.Tensor] | None = None) -> Path:
        """Write the ``BlipForConditionalGeneration`` (``save_pretrained``, base weights without adapters), its
        tokenizer and image processor into ``out``; the world encoder into ``out/world_encoder`` when it was trained;
        adapters in peft's format; ``captioner.json``. ``state_dict``: the weights to write (default: this
        module's own). Reload with :meth:`from_checkpoint`, or ``BlipForConditionalGeneration.from_pretrained``."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        state = self.state_dict() if state_dict is None else state_dict
        with lora.plain_parts(self):  # save_pretrained of the plain model: adapters' wrappers swapped out
            self.model.save_pretrained(out, state_dict=lora.plain_state(strip_prefix(state, "model.")))
        self.tokenizer.save_pretrained(out)
        if self.image_processor is not None:
            self.image_processor.save_pretrained(out)
        meta = self.config_dict()
        meta["world_saved"] = bool(self.world is not None and self.train_encoder)
        if meta["world_saved"]:
            lora.save_encoder(self.world, out / WORLD_DIR, strip_prefix(state, "world.model."))
        vision_prefix = "world.model." if self.world is not None else "model.vision_model."
        parts = {"lm": strip_prefix(state, "model.text_decoder."), "encoder": strip_prefix(state, vision_prefix)}
        meta["lora"] = lora.save_adapters(self, out, parts)
        meta["dtypes"] = memory.part_dtypes(self)
        memory.save_float32_masters(self, out, state)
        write_json(out / CONFIG_NAME, meta)
        return out

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, options: memory.LoadOptions | None = None,
                        **kwargs: Any) -> Blip:  # fmt: skip
        """A ``BlipForConditionalGeneration`` checkpoint (Hub name or folder) with its own tokenizer and image
        processor; ``options``: the weights' dtype, attention and quantization (``model.*``; default float32)."""
        name = str(name_or_path)
        options = options or memory.LoadOptions()
        try:
            model = BlipForConditionalGeneration.from_pretrained(
                name, trust_remote_code=False, **options.pretrained(quantize=True, skip=UNQUANTIZED)
            )
            model = options.loaded(model, f"blip.name={name}")
            tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=False)
            processor = BlipImageProcessor.from_pretrained(name, trust_remote_code=False)
        except OSError as e:
            raise OSError(f"blip.name={name}: cannot load the BLIP model, tokenizer or image processor: {e}") from None
        return cls(model, tokenizer, processor, source=name, **kwargs)

    @staticmethod
    def reads_world_encoder(cfg: Config) -> bool:
        """The world BLIP (``blip.name=world-tiny``) reads the world encoder's tokens when ``model.encoder=world``."""
        return cfg.blip.name == "world-tiny" and cfg.model.encoder == "world"

    @staticmethod
    def encoder_source(cfg: Config) -> str | None:
        """The world BLIP reads ``model.encoder`` from outside its checkpoint; a pretrained BLIP brings its own."""
        return cfg.model.encoder if cfg.blip.name == "world-tiny" else None

    @staticmethod
    def external_encoder(meta: dict[str, Any]) -> str | None:
        """The world BLIP's frozen dual encoder (``world_source``); ``None`` for a pretrained BLIP or a trained one."""
        return None if meta.get("world_saved") else (meta.get("world_source") or None)

    @classmethod
    def from_checkpoint(cls, path: str | Path, load_encoder: bool = True,
                        options: memory.LoadOptions | None = None) -> Blip:  # fmt: skip
        """Load a captioner written by :meth:`save` (``load_encoder=False``: a world BLIP without its world encoder,
        for cached image tokens; ``options``: dtype, attention and quantization, ``model.*``, default float32)."""
        path = Path(path)
        if not (path / CONFIG_NAME).exists():
            raise FileNotFoundError(f"{path}: not a captioner checkpoint (no {CONFIG_NAME})")
        meta = read_json(path / CONFIG_NAME)
        options = options or memory.LoadOptions()
        model = BlipForConditionalGeneration.from_pretrained(
            path, trust_remote_code=False, **options.pretrained(quantize=True, skip=UNQUANTIZED)
        )
        model = options.loaded(model, str(path))
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        world = None
        dtype = options.torch_dtype or "auto"
        if meta.get("world_saved"):
            world = FeatureMapTokens.from_pretrained(path / WORLD_DIR, dtype)
        elif meta.get("world_source") and load_encoder:
            try:
                world = FeatureMapTokens.from_pretrained(meta["world_source"], dtype)
            except OSError as e:
                raise OSError(
                    f"{path / CONFIG_NAME}: cannot load the world encoder {meta['world_source']!r} it refers to ({e})"
                ) from None
        processor = None
        if not meta.get("world_source"):
            processor = BlipImageProcessor.from_pretrained(path, trust_remote_code=False)
        blip = cls(model, tokenizer, processor, world=world, train_encoder=meta["train_encoder"],
                   train_lm=meta["train_lm"], source=meta.get("source", ""))  # fmt: skip
        if meta.get("lora"):
            lora.load_adapters(blip, path, meta["lora"])
        return blip


# --------------------------------------------------------------------------------------------------------------------
# Construction from the configuration
# --------------------------------------------------------------------------------------------------------------------


def build_blip(cfg: Config) -> Blip:
    """A BLIP captioner from ``cfg.model`` and ``cfg.blip`` (``model.kind=blip``): ``blip.name=world-tiny`` builds the
    world BLIP (a tiny ``BlipTextLMHeadModel`` of ``blip.tiny_*`` sizes over the world tokenizer, random init,
    cross-attending to the image tokens of ``model.encoder``: ``world`` = the trained world encoder, or a dual-encoder
    path); anything else is loaded as a ``BlipForConditionalGeneration`` checkpoint."""
    m, b = cfg.model, cfg.blip
    kwargs = {"train_encoder": m.train_encoder, "train_lm": m.train_lm}
    options = memory.LoadOptions.of(m)
    if b.name != "world-tiny":
        return Blip.from_pretrained(b.name, options, **kwargs)
    source = world_encoder_path(cfg) if m.encoder == "world" else m.encoder
    options.check_fresh("blip.name=world-tiny")  # refuses quantization before any work
    try:
        world = FeatureMapTokens.from_pretrained(source, options.torch_dtype or "auto")
    except OSError as e:
        raise OSError(f"model.encoder={m.encoder}: cannot load the vision encoder: {e}") from None
    image_size = int(world.image_processor.crop_size["height"]) if world.image_processor is not None else 64
    _, width = world.token_shape(image_size)
    positions = max(cfg.data.max_tokens, cfg.decode.max_length) + 1  # + [bos]
    model, tokenizer = world_blip(width, layers=b.tiny_layers, hidden=b.tiny_hidden, heads=b.tiny_heads,
                                  dropout=b.tiny_dropout, positions=positions)  # fmt: skip
    model = options.fresh(model, "blip.name=world-tiny")
    return Blip(model, tokenizer, world=world, source="world-tiny", **kwargs)
