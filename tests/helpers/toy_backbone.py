"""A fourth backbone written as a user would write one, on :class:`finecap.models.base.CaptionerBase`: only its hooks,
following "How to add a backbone" in ``docs/architecture.md``.

``ShowTell`` conditions a causal language model as Show and Tell (Vinyals et al., 2015) does: a linear projection of
the image feature is the first input embedding, and the caption follows. Everything else of the captioner contract
(``forward`` and sequence scoring, ``generate``, the properties, LoRA part handling, ``train()``, ``save`` /
``from_checkpoint`` with adapters, dtypes and master weights) comes from the base; ``tests/models/test_contract.py``
runs the whole contract on it. It is registered nowhere: ``model.kind=helpers.toy_backbone:ShowTell`` names it (its
dotted path, which its checkpoints record as their kind), and its own options are class attributes, as a backbone
named by dotted path has no configuration section (:class:`finecap.config.Config`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.cache_utils import Cache

from finecap.config import Config
from finecap.models import lora, memory
from finecap.models.base import CaptionerBase
from finecap.models.captioner import encode_images, shifted_mask, strip_prefix
from finecap.models.kvcache import cache_kwargs, returned_cache
from finecap.models.presets import build_world_lm
from finecap.models.vision import VisionEncoder
from finecap.models.world_encoder_cache import world_encoder_path

PROJECTION = "projection.safetensors"


class ShowTell(CaptionerBase):
    PART_PATHS = {"lm": "lm", "encoder": "encoder.model"}
    DUAL_ENCODER_DIR, DUAL_SAVED_KEY, DUAL_SOURCE_KEY = "encoder", "encoder_saved", "encoder_source"

    def __init__(self, lm: nn.Module, tokenizer: Any, encoder: VisionEncoder, *, train_encoder: bool = False,
                 train_lm: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.lm, self.tokenizer, self.encoder = lm, tokenizer, encoder
        self.projection = nn.Linear(encoder.feature_dim, lm.get_input_embeddings().embedding_dim)
        self.train_encoder, self.train_lm = train_encoder, train_lm
        self.apply_trainable()
        self.train(self.training)

    cache_features = True
    LAYERS, HIDDEN, HEADS = 1, 32, 2
    """The world-tiny language model a fresh one builds (its own options: it has no configuration section)."""

    @classmethod
    def build(cls, cfg: Config) -> ShowTell:
        """A fresh Show and Tell from ``model``: the vision encoder ``model.encoder`` (``world``: the world encoder)
        and a world-tiny GPT-2 of the class's sizes, random weights."""
        m = cfg.model
        options = memory.LoadOptions.of(m)
        source = world_encoder_path(cfg) if m.encoder == "world" else m.encoder
        encoder = VisionEncoder.from_pretrained(source, options.torch_dtype or "auto")
        lm, tokenizer = build_world_lm(layers=cls.LAYERS, hidden=cls.HIDDEN, heads=cls.HEADS, dropout=0.0)
        return cls(options.fresh(lm, cls.built_here(cfg)), tokenizer, encoder, train_encoder=m.train_encoder,
                   train_lm=m.train_lm)  # fmt: skip

    def apply_trainable(self) -> None:
        self.projection.requires_grad_(True)
        lora.train_part(self.lm, self.train_lm)
        self.encoder.set_trainable(self.train_encoder)

    def dual_encoder(self) -> VisionEncoder:
        return self.encoder

    def image_conditioning(self, batch: dict[str, Any]) -> torch.Tensor:
        return encode_images(batch, self.encoder, self.train_encoder, self.device)  # (B, D)

    def _first(self, features: torch.Tensor) -> torch.Tensor:
        return self.projection(features.to(self.device))[:, None]  # (B, 1, H)

    def caption_logits(self, features: torch.Tensor, input_ids: torch.Tensor,
                       attention_mask: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        tokens = self.lm.get_input_embeddings()(input_ids[:, :-1].to(self.device))  # (B, T-1, H)
        x = torch.cat([self._first(features), tokens], dim=1)  # (B, T, H)
        return self.lm(inputs_embeds=x, attention_mask=shifted_mask(attention_mask, 1, self.device)).logits

    def start(self, features: torch.Tensor) -> tuple[torch.Tensor, Any]:
        out = self.lm(inputs_embeds=self._first(features), use_cache=True)
        return out.logits[:, -1], returned_cache(out)

    def step(self, tokens: torch.Tensor, cache: Cache) -> tuple[torch.Tensor, Any]:
        embeds = self.lm.get_input_embeddings()(tokens[:, None])
        out = self.lm(inputs_embeds=embeds, use_cache=True, **cache_kwargs(self.lm, cache))
        return out.logits[:, -1], returned_cache(out)

    def select(self, cache: Cache, index: torch.Tensor) -> Cache:
        cache.reorder_cache(index)
        return cache

    def own_config(self) -> dict[str, Any]:
        return {"encoder_source": self.encoder.source}

    def save_weights(self, out: Path, state: dict[str, torch.Tensor]) -> dict[str, Any]:
        lora.save_base(self.lm, out / "lm", self.part_state(state, "lm"))
        self.tokenizer.save_pretrained(out / "lm")
        save_file({k: v.contiguous() for k, v in strip_prefix(state, "projection.").items()}, str(out / PROJECTION))
        return {}

    @classmethod
    def load_weights(cls, path: Path, meta: dict[str, Any], load_encoder: bool,
                     options: memory.LoadOptions) -> ShowTell:  # fmt: skip
        lm = options.load(AutoModelForCausalLM, path / "lm", str(path / "lm"))
        tokenizer = AutoTokenizer.from_pretrained(path / "lm")
        # always with its encoder: the projection's width comes from it
        encoder = cls.load_dual_encoder(path, meta, True, options.torch_dtype or "auto", VisionEncoder)
        model = cls(lm, tokenizer, encoder, train_encoder=meta["train_encoder"], train_lm=meta["train_lm"])
        model.projection.load_state_dict(load_file(str(path / PROJECTION)))
        return model

    @staticmethod
    def reads_world_encoder(cfg: Config) -> bool:
        return cfg.model.encoder == "world"

    @staticmethod
    def encoder_source(cfg: Config) -> str | None:
        return cfg.model.encoder

    @staticmethod
    def built_here(cfg: Config) -> str:
        return f"model.kind={cfg.model.kind}"  # its language model: random weights
