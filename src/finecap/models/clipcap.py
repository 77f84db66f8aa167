"""ClipCap: vision encoder -> mapper -> prefix embeddings -> any causal language model (Mokady et al., 2021).

``ClipCap`` = a :class:`~finecap.models.vision.VisionEncoder` (projected image features of a CLIP-style dual
encoder: the world encoder or any ``CLIPModel`` checkpoint) -> a mapper turning a feature vector ``(D,)`` into ``k``
prefix embeddings ``(k, H)`` -> any ``AutoModelForCausalLM`` fed through ``inputs_embeds`` with the prefix followed
by the caption's token embeddings. Shapes, vocabulary and tokenizer always come from the loaded models.

Mappers (``clipcap.mapper``), as in ClipCap's reference code:

- ``mlp``: ``Linear(D, k*H/2) -> Tanh -> Linear(k*H/2, k*H)``, reshaped to ``(k, H)``.
- ``transformer``: ``Linear(D, k*H)`` reshaped to ``k`` tokens, concatenated with ``k`` learned prefix constants,
  a pre-norm transformer encoder (``clipcap.mapper_layers`` layers, ``clipcap.mapper_heads`` heads, feed-forward width
  2H, ReLU, no dropout), and the outputs at the constants' positions are the prefix. ClipCap lets the number of
  projected tokens differ from the prefix length; here both are ``clipcap.prefix_length``.

Choices the paper leaves open:

- Features are the *unnormalised projected* image embedding (``get_image_features(...).pooler_output``), as
  ClipCap feeds ``encode_image`` output. With a frozen encoder (default) batches carry cached ``features``; with
  ``model.train_encoder=true`` they carry ``pixel_values`` and gradients flow into the vision tower (text tower,
  text projection and logit scale always stay frozen).
- No BOS token: the prefix starts the sequence; the last prefix position predicts the first caption token, and
  logits come back aligned with the labels (``logits[:, t]`` predicts ``labels[:, t]``).
- Frozen parts (the encoder unless trained, the LM with ``model.train_lm=false``) stay in eval mode when the module
  is put in train mode, as ClipCap's prefix-only variant does, so dropout never perturbs frozen features.
- A checkpoint stores the LM (``save_pretrained``, safetensors) with its tokenizer, the mapper
  (``mapper.safetensors``), ``captioner.json`` and, only when the encoder was trained, the encoder; a frozen
  encoder is referenced by its source (Hub name or absolute path). LoRA adapters (:mod:`finecap.models.lora`) are
  saved in peft's format beside the base weights (``lm_lora/``, ``encoder_lora/``) and reloaded unmerged.

Module names stay the checkpoints' own (``lm.transformer.h.0.attn.c_attn``, ``encoder.model.vision_model....
q_proj``; the mapper uses none of these names), so ``peft`` LoRA targets only what it should.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.cache_utils import Cache

from finecap.config import ClipCapBackboneConfig
from finecap.config.paths import recorded_source
from finecap.models import lora, memory, strict
from finecap.models.base import CaptionerBase, dtype_argument, same_source, set_dropout
from finecap.models.captioner import encode_images, last_positions, shifted_mask, strip_prefix
from finecap.models.kvcache import cache_kwargs, returned_cache
from finecap.models.tokenizer import caption_vocabulary, ensure_pad_token
from finecap.models.vision import VisionEncoder
from finecap.models.world_encoder_cache import world_encoder_path

if TYPE_CHECKING:
    from finecap.config import Config

MAPPER_KEYS = ("mapper", "prefix_length", "mapper_layers", "mapper_heads")
"""The ``clipcap`` options a checkpoint records (``captioner.json``) and its mapper is rebuilt from."""
MAPPER_WEIGHTS = "mapper.safetensors"
WORLD_LM = "world-tiny"
DATA_LM = "data-tiny"
"""``clipcap.lm=data-tiny``: the world LM's architecture over a word-level vocabulary of the training captions
(:func:`data_vocabulary`), for one's own captions offline."""


# --------------------------------------------------------------------------------------------------------------------
# Mappers
# --------------------------------------------------------------------------------------------------------------------


class MLPMapper(nn.Module):
    """ClipCap's MLP mapper: ``(B, D) -> (B, k, H)`` through a Tanh hidden layer of width ``k*H/2``."""

    def __init__(self, feature_dim: int, hidden: int, k: int) -> None:
        super().__init__()
        self.k, self.hidden = k, hidden
        mid = max(1, k * hidden // 2)
        self.net = nn.Sequential(nn.Linear(feature_dim, mid), nn.Tanh(), nn.Linear(mid, k * hidden))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features).view(-1, self.k, self.hidden)  # (B, k, H)


class TransformerMapper(nn.Module):
    """ClipCap's transformer mapper: projected feature tokens + learned prefix constants through a transformer."""

    def __init__(self, feature_dim: int, hidden: int, k: int, layers: int, heads: int) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"clipcap.mapper_heads={heads} must divide the language model's hidden size {hidden}")
        self.k, self.hidden = k, hidden
        self.linear = nn.Linear(feature_dim, k * hidden)
        self.prefix_const = nn.Parameter(torch.randn(k, hidden))
        layer = nn.TransformerEncoderLayer(hidden, heads, dim_feedforward=2 * hidden, dropout=0.0, activation="relu",
                                           batch_first=True, norm_first=True)  # fmt: skip
        self.transformer = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        B, k = features.shape[0], self.k
        x = self.linear(features).view(B, k, self.hidden)  # (B, k, H)
        const = self.prefix_const.unsqueeze(0).expand(B, k, self.hidden)  # (B, k, H)
        return self.transformer(torch.cat([x, const], dim=1))[:, k:]  # (B, k, H)


def build_mapper(section: ClipCapBackboneConfig, feature_dim: int, hidden: int) -> nn.Module:
    """The mapper ``clipcap.mapper`` names, of ``clipcap.prefix_length`` tokens (``clipcap.mapper_layers`` /
    ``clipcap.mapper_heads`` for the transformer)."""
    if section.mapper == "mlp":
        return MLPMapper(feature_dim, hidden, section.prefix_length)
    return TransformerMapper(feature_dim, hidden, section.prefix_length, section.mapper_layers, section.mapper_heads)


# --------------------------------------------------------------------------------------------------------------------
# The captioner
# --------------------------------------------------------------------------------------------------------------------


class ClipCap(CaptionerBase):
    """Prefix captioner. See the module docstring; build it with :meth:`build` or :meth:`from_checkpoint`.

    Args:
        lm: any causal LM accepting ``inputs_embeds`` and a KV cache (:mod:`finecap.models.kvcache`).
        tokenizer: the LM's tokenizer (needs an EOS token; pad = EOS when it has no pad token).
        feature_dim: dimension D of the image features (the encoder's projection dim).
        section: the ``clipcap`` section: the mapper (``mapper``, ``prefix_length``, ``mapper_layers``,
            ``mapper_heads``; checked when the section is built; default: its defaults). Its ``lm`` and ``tiny_*``
            options built ``lm`` (:meth:`build`) and are not read here.
        encoder: the vision encoder; ``None`` makes a features-only captioner (batches must carry ``features``).
        train_encoder: train the encoder (batches carry ``pixel_values``); otherwise it is frozen.
        train_lm: train the LM; otherwise it is frozen and only the mapper (and encoder) learn.
        lm_source, encoder_source: where the LM / encoder came from (recorded in checkpoints).
    """

    kind = "clipcap"
    DUAL_ENCODER_DIR = "encoder"
    DUAL_SAVED_KEY = "encoder_saved"
    DUAL_SOURCE_KEY = "encoder_source"

    def __init__(
        self,
        lm: nn.Module,
        tokenizer: Any,
        feature_dim: int,
        section: ClipCapBackboneConfig | None = None,
        *,
        encoder: VisionEncoder | None = None,
        train_encoder: bool = False,
        train_lm: bool = True,
        lm_source: str = "",
        encoder_source: str = "",
    ) -> None:
        super().__init__()
        if train_encoder and encoder is None:
            raise ValueError("model.train_encoder=true needs a vision encoder (got none)")
        if encoder is not None and encoder.feature_dim != feature_dim:
            raise ValueError(f"feature_dim={feature_dim} but the encoder {encoder.source} gives {encoder.feature_dim}")
        self.section = section or ClipCapBackboneConfig()
        self.tokenizer = ensure_pad_token(tokenizer)
        self.lm = lm
        if getattr(lm.config, "pad_token_id", None) is None:
            lm.config.pad_token_id = self.tokenizer.pad_token_id
        self.hidden_size = int(lm.get_input_embeddings().embedding_dim)
        self.feature_dim = int(feature_dim)
        self.mapper = build_mapper(self.section, self.feature_dim, self.hidden_size)
        self.encoder = encoder
        self.train_encoder = bool(train_encoder)
        self.train_lm = bool(train_lm)
        self.lm_source = lm_source
        self.encoder_source = encoder_source or (encoder.source if encoder is not None else "")
        self._keep_kw = "logits_to_keep" in inspect.signature(type(lm).forward).parameters
        self.apply_trainable()
        self.train(self.training)

    # ------------------------------------------------------------------------------------------------------------
    # What it is, what trains
    # ------------------------------------------------------------------------------------------------------------

    @property
    def max_positions(self) -> int | None:
        """The LM's position limit (``n_positions`` / ``max_position_embeddings``), if it has one."""
        cfg = self.lm.config
        value = getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None)
        return int(value) if value else None

    @property
    def cache_features(self) -> bool:
        """Frozen encoder features (``(D,)`` per image) go through the feature cache."""
        return True

    @property
    def max_caption_tokens(self) -> int | None:
        """The LM's positions after the prefix: a caption of T tokens reads ``k + T - 1`` of them."""
        limit = self.max_positions
        return None if limit is None else limit - self.section.prefix_length + 1

    def part_path(self, part: str) -> str | None:
        """The LM (``"lm"``) or the dual encoder (``"encoder"``; its text side is never a target)."""
        if part == "lm":
            return "lm"
        return "encoder.model" if self.encoder is not None else None

    def apply_trainable(self) -> None:
        """``requires_grad`` from ``train_lm`` / ``train_encoder`` (through adapters when a part has some); the
        mapper always learns. Every linear layer of a part is LoRA's default target (GPT-2's ``c_attn`` /
        ``c_proj`` / ``c_fc``, the dual encoder's image side)."""
        self.mapper.requires_grad_(True)
        lora.train_part(self.lm, self.train_lm)
        if self.encoder is not None:
            self.encoder.set_trainable(self.train_encoder)  # its adapters only, if any; the text side stays frozen

    def dual_encoder(self) -> VisionEncoder | None:
        return self.encoder

    def own_config(self) -> dict[str, Any]:
        return {
            **{key: getattr(self.section, key) for key in MAPPER_KEYS},
            "feature_dim": self.feature_dim,
            "hidden_size": self.hidden_size,
            "lm_source": self.lm_source,
            "encoder_source": self.encoder_source,
        }

    # ------------------------------------------------------------------------------------------------------------
    # Conditioning and teacher forcing
    # ------------------------------------------------------------------------------------------------------------

    def image_features(self, batch: dict[str, Any]) -> torch.Tensor:
        """Image features ``(B, D)``: the batch's cached ``features`` (frozen encoder) or the encoder applied to
        ``pixel_values`` (with gradient only when the encoder is trained)."""
        return encode_images(batch, self.encoder, self.train_encoder, self.device)  # (B, D)

    def image_conditioning(self, batch: dict[str, Any]) -> torch.Tensor:
        """Image features ``(B, D)``: decoding starts from them (:meth:`start` runs the mapper)."""
        return self.image_features(batch)

    def scoring_conditioning(self, features: torch.Tensor) -> torch.Tensor:
        """The prefix embeddings ``(B, k, H)`` teacher forcing reads: the mapper runs once per image."""
        return self._prefix(features)

    def _prefix(self, features: torch.Tensor) -> torch.Tensor:
        """Features ``(B, D)`` -> prefix embeddings ``(B, k, H)``."""
        if features.ndim != 2 or features.shape[1] != self.feature_dim:
            raise ValueError(f"image features must be (B, {self.feature_dim}), got {tuple(features.shape)}")
        param = next(self.mapper.parameters())
        return self.mapper(features.to(param.device, param.dtype))  # (B, k, H)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm.get_input_embeddings()(input_ids)  # (B, T, H)

    def check_length(self, conditioning: Any, n_tokens: int, what: str) -> None:
        limit = self.max_positions
        k = self.section.prefix_length
        if limit is not None and k + n_tokens - 1 > limit:
            raise ValueError(
                f"clipcap.prefix_length={k} + {what}={n_tokens} needs {k + n_tokens - 1} positions but the language "
                f"model has {limit}"
            )

    def output_head(self) -> nn.Module:
        """GPT-2's ``lm_head`` (tied to its token embeddings): :meth:`CaptionerBase.output_head`."""
        return self.lm.get_output_embeddings()

    def caption_logits(self, prefix: torch.Tensor, input_ids: torch.Tensor,
                       attention_mask: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """Teacher-forced logits ``(B, T, V)`` of ``input_ids (B, T)`` after ``prefix (B, k, H)``, aligned so that
        ``logits[:, t]`` predicts ``input_ids[:, t]`` (the last prefix position predicts the first token)."""
        B, T = input_ids.shape
        if T < 1:
            raise ValueError("input_ids must hold at least one token (the EOS)")
        k = prefix.shape[1]
        self.check_length(prefix, T, "caption length (data.max_tokens)")
        tokens = self.embed_tokens(input_ids[:, :-1].to(self.device))  # (B, T-1, H)
        x = torch.cat([prefix.to(tokens.dtype), tokens], dim=1)  # (B, k+T-1, H)
        mask = shifted_mask(attention_mask, k, self.device)  # (B, k+T-1)
        kwargs = {"logits_to_keep": last_positions(T, x.shape[1], x.device)} if self._keep_kw else {}
        out = self.lm(inputs_embeds=x, attention_mask=mask, use_cache=False, **kwargs)
        logits = out.logits
        # not a view when logits_to_keep already kept T: FSDP2 warns of a view returned by a sharded forward (an
        # in-place op on it would skip its pre-backward all-gather)
        return logits if logits.shape[1] == T else logits[:, -T:]  # (B, T, V)

    # ------------------------------------------------------------------------------------------------------------
    # Decoding (Stepper protocol)
    # ------------------------------------------------------------------------------------------------------------

    def start(self, features: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Run the prefix, return the first token's logits ``(B, V)`` and the KV cache."""
        prefix = self._prefix(features)  # (B, k, H)
        kwargs = {"logits_to_keep": last_positions(1, prefix.shape[1], prefix.device)} if self._keep_kw else {}
        dtype = self.lm.get_input_embeddings().weight.dtype
        out = self.lm(inputs_embeds=prefix.to(dtype), use_cache=True, **kwargs)
        return out.logits[:, -1], returned_cache(out)  # (B, V)

    def step(self, tokens: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
        """Feed one token per row ``(N,)``, return the next logits ``(N, V)`` and the cache."""
        out = self.lm(inputs_embeds=self.embed_tokens(tokens[:, None]), use_cache=True, **cache_kwargs(self.lm, cache))
        return out.logits[:, -1], returned_cache(out)  # (N, V)

    @staticmethod
    def select(cache: Any, index: torch.Tensor) -> Any:
        """Keep/repeat/reorder cache rows (``DynamicCache`` and legacy tuples)."""
        if isinstance(cache, Cache):
            cache.reorder_cache(index)
            return cache
        return tuple(tuple(t.index_select(0, index.to(t.device)) for t in layer) for layer in cache)

    # ------------------------------------------------------------------------------------------------------------
    # Saving and loading
    # ------------------------------------------------------------------------------------------------------------

    def save_weights(self, out: Path, state: dict[str, torch.Tensor]) -> dict[str, Any]:
        """``lm/`` (base weights + tokenizer) and ``mapper.safetensors``; the base class adds a trained encoder
        (``encoder/``), the adapters and ``captioner.json``."""
        lora.save_base(self.lm, out / "lm", self.part_state(state, "lm"))
        self.tokenizer.save_pretrained(out / "lm")
        mapper = {k: v.detach().contiguous().cpu() for k, v in strip_prefix(state, "mapper.").items()}
        save_file(mapper, str(out / MAPPER_WEIGHTS))
        return {}

    @classmethod
    def load_weights(cls, path: Path, meta: dict[str, Any], load_encoder: bool,
                     options: memory.LoadOptions) -> ClipCap:  # fmt: skip
        """The LM and tokenizer of ``lm/``, the mapper, and the encoder (trained and saved, or the frozen one it
        refers to unless ``load_encoder`` is false: batches must then carry cached ``features``)."""
        lm = options.load(AutoModelForCausalLM, path / "lm", f"{path / 'lm'}", checkpoint=True)
        tokenizer = AutoTokenizer.from_pretrained(path / "lm", trust_remote_code=False)
        encoder = cls.load_dual_encoder(path, meta, load_encoder, options.torch_dtype or "auto", VisionEncoder)
        model = cls(
            lm,
            tokenizer,
            meta["feature_dim"],
            ClipCapBackboneConfig(**{key: meta[key] for key in MAPPER_KEYS}),
            encoder=encoder,
            train_encoder=meta["train_encoder"],
            train_lm=meta["train_lm"],
            lm_source=meta.get("lm_source", ""),
            encoder_source=meta.get("encoder_source", ""),
        )
        strict.load_module_state(model.mapper, path / MAPPER_WEIGHTS)
        return model

    @classmethod
    def build(cls, cfg: Config) -> ClipCap:
        """A fresh captioner from ``cfg.model`` and ``cfg.clipcap``: encoder (``model.encoder``: ``world`` = the
        trained/cached world encoder, else a CLIP checkpoint name/path), mapper (``clipcap.mapper``, random init) and
        LM (``clipcap.lm``: ``world-tiny`` = the preset GPT-2 of ``clipcap.tiny_*`` sizes with random init over the
        world's words, ``data-tiny`` the same over the training captions' words, else a pretrained
        ``AutoModelForCausalLM``)."""
        # deferred: the tiny presets (which import BLIP, CLIP and the retriever) build a fresh captioner only; reading
        # a checkpoint (loading it, its fingerprint's encoder) does not need them
        from finecap.models.presets import WORLD_LM_POSITIONS, build_world_lm

        m, c = cfg.model, cfg.clipcap
        options = memory.LoadOptions.of(m)
        dtype = options.torch_dtype or "auto"
        if m.encoder == "world":
            encoder = VisionEncoder.from_pretrained(world_encoder_path(cfg), dtype)
        else:
            try:
                encoder = VisionEncoder.from_pretrained(m.encoder, dtype)
            except OSError as e:
                raise OSError(f"model.encoder={m.encoder}: cannot load the vision encoder: {e}") from None
        lm_source = c.lm
        if c.lm in (WORLD_LM, DATA_LM):
            positions = max(WORLD_LM_POSITIONS, c.prefix_length + max(cfg.data.max_tokens, cfg.decode.max_length))
            vocab = data_vocabulary(cfg) if c.lm == DATA_LM else None
            lm, tokenizer = build_world_lm(c.tiny_layers, c.tiny_hidden, c.tiny_heads, n_positions=positions,
                                           vocab=vocab, dropout=c.tiny_dropout)  # fmt: skip
            lm = options.fresh(lm, f"clipcap.lm={c.lm}")
        else:  # a local folder by its absolute path: the source recorded, and the lm_lora adapter's base
            lm_source = recorded_source(c.lm)
            lm, tokenizer = load_lm(lm_source, options)
        return cls(
            lm,
            tokenizer,
            encoder.feature_dim,
            c,
            encoder=encoder,
            train_encoder=m.train_encoder,
            train_lm=m.train_lm,
            lm_source=lm_source,
            encoder_source=encoder.source,
        )

    @classmethod
    def setting_differences(cls, meta: dict[str, Any], cfg: Config) -> list[tuple[str, Any, Any]]:
        """The mapper's settings (``clipcap.mapper``, ``prefix_length``, and for the transformer mapper its
        ``mapper_layers`` and ``mapper_heads``) the checkpoint records and ``cfg`` sets otherwise."""
        keys = MAPPER_KEYS if meta.get("mapper") == "transformer" else ("mapper", "prefix_length")
        return [(f"clipcap.{key}", meta[key], getattr(cfg.clipcap, key)) for key in keys
                if key in meta and meta[key] != getattr(cfg.clipcap, key)]  # fmt: skip

    TINY_SIZES = {"tiny_layers": "n_layer", "tiny_hidden": "n_embd", "tiny_heads": "n_head"}
    """The world-tiny GPT-2's sizes (``clipcap.tiny_*``) and the ``GPT2Config`` fields that hold them."""
    DROPOUTS = ("resid_pdrop", "embd_pdrop", "attn_pdrop")
    """The ``GPT2Config`` fields of ``clipcap.tiny_dropout``."""

    def loaded_setting_differences(self, cfg: Config) -> list[tuple[str, Any, Any]]:
        """Per key of the ``clipcap`` section, on a checkpoint: ``lm`` (which language model) and, for a world-tiny
        or data-tiny LM, ``tiny_layers``, ``tiny_hidden``, ``tiny_heads`` built the weights and cannot apply: a value
        other than the checkpoint's is a difference. ``tiny_dropout`` applies (:meth:`apply_settings`); the mapper's
        settings are compared from ``captioner.json`` (:meth:`setting_differences`)."""
        c = cfg.clipcap
        if not same_source(self.lm_source, c.lm):
            return [("clipcap.lm", self.lm_source, c.lm)]
        if c.lm not in (WORLD_LM, DATA_LM):
            return []  # the tiny sizes are not used with a pretrained LM
        config = self.lm.config
        return [(f"clipcap.{key}", getattr(config, attr), getattr(c, key)) for key, attr in self.TINY_SIZES.items()
                if getattr(config, attr, None) not in (None, getattr(c, key))]  # fmt: skip

    def apply_settings(self, cfg: Config) -> list[str]:
        """``clipcap.tiny_dropout`` on a world-tiny or data-tiny LM: every dropout module of the LM (embeddings,
        residuals, attention) gets the configured p, and its config records it (so the checkpoints this run saves
        do). A pretrained LM keeps its own dropout, as a fresh one does (the option is the tiny LM's)."""
        c = cfg.clipcap
        if c.lm not in (WORLD_LM, DATA_LM) or self.lm_source not in (WORLD_LM, DATA_LM, ""):
            return []
        config = self.lm.config
        before = {getattr(config, name, None) for name in self.DROPOUTS}
        changed = set_dropout(self.lm, c.tiny_dropout)
        for name in self.DROPOUTS:
            setattr(config, name, c.tiny_dropout)
        return [f"clipcap.tiny_dropout={c.tiny_dropout:g}"] if changed or before != {c.tiny_dropout} else []

    @classmethod
    def base_models(cls, meta: dict[str, Any]) -> dict[str, str]:
        """The language model and the vision encoder it was built on."""
        return {"language model": meta.get("lm_source", ""), "vision encoder": meta.get("encoder_source", "")}

    @classmethod
    def card_lines(cls, meta: dict[str, Any]) -> list[str]:
        """``lm/`` is a plain transformers folder (with LoRA on the language model: its base weights, the adapter
        beside it, as peft loads it); the mapper is finecap's."""
        lines = ["", "`lm/` is a plain `AutoModelForCausalLM` folder; `mapper.safetensors` maps image features to its "
                 "prefix (finecap's `ClipCap` reads both)."]  # fmt: skip
        adapter = ((meta.get("lora") or {}).get("lm") or {}).get("dir")
        if adapter:  # lm/ alone is the language model without what the adapter learnt
            load = f'AutoModelForCausalLM.from_pretrained("lm"{dtype_argument(meta)})'
            lines += [f"`lm/` holds the base weights of the language model and `{adapter}/` its LoRA adapter: "
                      f'`PeftModel.from_pretrained({load}, "{adapter}")`.']  # fmt: skip
        return lines

    @staticmethod
    def reads_world_encoder(cfg: Config) -> bool:
        """A fresh ClipCap reads the world encoder when ``model.encoder=world``."""
        return cfg.model.encoder == "world"

    @staticmethod
    def encoder_source(cfg: Config) -> str | None:
        """The vision encoder a fresh ClipCap loads from outside its checkpoint: ``model.encoder``."""
        return cfg.model.encoder

    @staticmethod
    def built_here(cfg: Config) -> str | None:
        """``clipcap.lm=world-tiny`` / ``data-tiny``: a GPT-2 built here with random weights."""
        return f"clipcap.lm={cfg.clipcap.lm}" if cfg.clipcap.lm in (WORLD_LM, DATA_LM) else None


# --------------------------------------------------------------------------------------------------------------------
# Construction from the configuration
# --------------------------------------------------------------------------------------------------------------------


def load_lm(name_or_path: str, options: memory.LoadOptions | None = None) -> tuple[nn.Module, Any]:
    """Any ``AutoModelForCausalLM`` checkpoint and its own tokenizer (pad token = EOS when missing, as for GPT-2);
    ``options``: the weights' dtype, attention and quantization (``model.*``; default float32)."""
    options = options or memory.LoadOptions()
    try:
        lm = options.load(AutoModelForCausalLM, name_or_path, f"clipcap.lm={name_or_path}")
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=False)
    except OSError as e:
        raise OSError(f"clipcap.lm={name_or_path}: cannot load the language model or its tokenizer: {e}") from None
    return lm, ensure_pad_token(tokenizer)


def data_vocabulary(cfg: Config) -> list[str]:
    """``clipcap.lm=data-tiny``'s vocabulary: the words of the configured data set's training captions
    (:func:`finecap.models.tokenizer.caption_vocabulary`). Read from the data at each fresh start rather than cached
    in the finecap home: it takes a fraction of a second beside reading the data set, and every checkpoint stores
    the tokenizer it trained with (``lm/tokenizer.json``), which is what resuming, captioning and export load."""
    from finecap.data.datasets import load_records

    # the images data.skip_bad_images leaves out are said by the run's read with the model (with those it refuses)
    return caption_vocabulary(c for r in load_records(cfg, "train", left_out=[]) for c in r.captions)
