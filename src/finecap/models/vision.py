"""The captioner's vision encoder: the image side of any CLIP-style dual encoder, as a trainable ``nn.Module``.

:class:`VisionEncoder` loads a checkpoint by Hugging Face name or local path (``openai/clip-vit-base-patch32``, the
world encoder folder, any ``VisionTextDualEncoderModel``) and returns ``get_image_features(...).pooler_output``:
the *projected*, unnormalised image embedding (the same features :meth:`finecap.models.retriever.Retriever.
vision_features` returns, so a frozen-feature cache computed by the retriever of the same checkpoint feeds the
captioner directly).

The whole dual encoder is kept (so ``save_pretrained`` round-trips and the checkpoint stays loadable by anyone), but
only its image path is ever run or trained: :meth:`VisionEncoder.set_trainable` leaves the text tower, text
projection and logit scale frozen. Module names are the checkpoint's own (``model.vision_model....q_proj``), so
``peft`` LoRA can target them; restrict the target to the vision tower with a regex such as
``r".*vision_model.*\\.(q_proj|v_proj)"``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import transformers
from PIL import Image
from torch import nn

from finecap.config.paths import recorded_source
from finecap.models import memory, strict
from finecap.models.world_encoder_cache import world_encoder_path

TEXT_SIDE = ("text_model", "text_projection", "logit_scale")
"""Attributes of a dual encoder that belong to the text side (never trained through the captioner)."""


def load_dual_encoder(name_or_path: str | Path, dtype: torch.dtype | str = "auto", checkpoint: bool = False) -> Any:
    """Load a dual encoder with ``get_image_features``; the class is the checkpoint's recorded architecture, the
    weights in ``dtype`` (``"auto"``: the checkpoint's own; a captioner passes ``model.dtype``). ``checkpoint``: the
    folder is part of a captioner checkpoint (a trained encoder saved in it), loaded strictly
    (:func:`finecap.models.strict.load_pretrained`). Inside :func:`finecap.models.memory.loading_onto` a CUDA device,
    the weights are read straight onto it (:func:`~finecap.models.memory.placement`), as the captioner's are.

    Falls back to ``AutoModel``; raises ``TypeError`` naming the checkpoint if the loaded model has no
    ``get_image_features`` (e.g. a bare ``CLIPVisionModel``).
    """
    name = str(name_or_path)
    config = transformers.AutoConfig.from_pretrained(name, trust_remote_code=False)
    archs = list(getattr(config, "architectures", None) or [])
    model_cls = next(
        (getattr(transformers, a) for a in archs if hasattr(getattr(transformers, a, None), "get_image_features")),
        transformers.AutoModel,
    )
    load = functools.partial(strict.load_pretrained, model_cls) if checkpoint else model_cls.from_pretrained
    model = load(name, trust_remote_code=False, dtype=dtype, **memory.placement())  # onto a CUDA device: loading_onto
    if not hasattr(model, "get_image_features"):
        raise TypeError(
            f"model.encoder={name}: {type(model).__name__} (architectures={archs}) has no get_image_features; "
            "give a CLIP-style dual encoder checkpoint (CLIPModel, VisionTextDualEncoderModel)"
        )
    return model


class VisionEncoder(nn.Module):
    """Projected image features ``(B, D)`` of a dual encoder's vision tower.

    Args:
        model: a ``transformers`` model with ``get_image_features`` (e.g. ``CLIPModel``).
        image_processor: the checkpoint's image processor (``None``: :meth:`preprocess` is unavailable).
        source: where it came from (Hub name or local path), recorded in captioner checkpoints.
    """

    def __init__(self, model: Any, image_processor: Any = None, source: str = "") -> None:
        super().__init__()
        if not hasattr(model, "get_image_features"):
            raise TypeError(f"vision encoder {source or type(model).__name__} has no get_image_features")
        self.model = model
        self.image_processor = image_processor
        self.source = source

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, dtype: torch.dtype | str = "auto",
                        checkpoint: bool = False) -> VisionEncoder:  # fmt: skip
        """Load model (weights in ``dtype``, ``"auto"``: the checkpoint's) and image processor (if the checkpoint has
        one) from a Hub name or local folder (``checkpoint``: a folder of a captioner checkpoint, loaded strictly). A
        local folder is read by its absolute path (:func:`~finecap.config.paths.recorded_source`), the source
        recorded, so that the model's ``name_or_path``, which peft writes as an ``encoder_lora/`` adapter's
        ``base_model_name_or_path``, names it from any working directory (``models/clip`` was looked up as a Hub
        name there)."""
        name = recorded_source(str(name_or_path))
        model = load_dual_encoder(name, dtype, checkpoint)
        try:
            processor = transformers.AutoImageProcessor.from_pretrained(name, trust_remote_code=False)
        except (OSError, ValueError):
            processor = None
        return cls(model, processor, source=name)

    @property
    def feature_dim(self) -> int:
        """Dimension D of the projected image features."""
        dim = getattr(self.model.config, "projection_dim", None)
        if not dim:
            dim = self.model.visual_projection.out_features
        return int(dim)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the vision tower's weights (pixel values are cast to it)."""
        tower = getattr(self.model, "vision_model", None)
        tower = self.model if tower is None else tower
        return next((p.dtype for p in tower.parameters() if p.is_floating_point()), torch.float32)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Pixel values ``(B, 3, H, W)`` -> projected image features ``(B, D)`` (respects the grad mode)."""
        out = self.model.get_image_features(pixel_values=pixel_values.to(self.dtype))
        feats = out.pooler_output if hasattr(out, "pooler_output") else out
        return feats.flatten(1)  # (B, D)

    def preprocess(self, images: Sequence[Image.Image]) -> torch.Tensor:
        """PIL images -> pixel values ``(B, 3, H, W)`` with the checkpoint's image processor."""
        if self.image_processor is None:
            raise ValueError(f"vision encoder {self.source}: the checkpoint has no image processor")
        images = [im.convert("RGB") for im in images]
        return self.image_processor(images=images, return_tensors="pt")["pixel_values"]

    def image_parameters(self) -> list[nn.Parameter]:
        """Parameters on the image path (everything except the text tower, text projection and logit scale)."""
        skip = {id(p) for a in TEXT_SIDE if (m := getattr(self.model, a, None)) is not None
                for p in (m.parameters() if isinstance(m, nn.Module) else [m])}  # fmt: skip
        return [p for p in self.model.parameters() if id(p) not in skip]

    def set_trainable(self, trainable: bool) -> None:
        """Freeze everything, then unfreeze the image path when ``trainable``: its LoRA adapters when the model is
        wrapped in some (:mod:`finecap.models.lora`; they sit on the image side only), else every image-side weight."""
        self.model.requires_grad_(False)
        if trainable:
            image = self.image_parameters()
            adapters = {id(p) for name, p in self.model.named_parameters() if "lora_" in name}
            for p in [p for p in image if id(p) in adapters] or image:
                p.requires_grad_(True)

    def save(self, out: str | Path) -> None:
        """``save_pretrained`` of the dual encoder (+ image processor) into ``out``."""
        out = Path(out)
        self.model.save_pretrained(out)
        if self.image_processor is not None:
            self.image_processor.save_pretrained(out)


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

    @property
    def image_size(self) -> int:
        """The side of the square images the tower reads: its image processor's crop, else its config's
        ``image_size``, else 64."""
        crop = getattr(self.image_processor, "crop_size", None)
        if isinstance(crop, dict) and crop.get("height"):
            return int(crop["height"])
        vision = getattr(self.model.config, "vision_config", self.model.config)
        return int(getattr(vision, "image_size", None) or 64)

    def image_parameters(self) -> list[nn.Parameter]:
        """The image-side parameters that the tokens depend on: a ViT tower's tokens are its last hidden state, which
        neither its pooled output's layers (CLIP's ``post_layernorm``) nor ``visual_projection`` read. Training
        those would count weights that never learn as trained (``--dry-run``) and stop a multi-process run at its
        second step (DDP: parameters that were not used in producing the loss). Found by the gradient of the
        tokens of one blank image (:attr:`image_size`) through the tower."""
        params = [p for p in super().image_parameters() if p.is_floating_point()]
        size = self.image_size
        # (1, P, D): the tokens of one blank image
        return reached_parameters(params, lambda: self(torch.zeros(1, 3, size, size, device=params[0].device,
                                                                   dtype=self.dtype)))  # fmt: skip


def reached_parameters(params: Sequence[nn.Parameter], run: Callable[[], Any]) -> list[nn.Parameter]:
    """Those of ``params`` that the floating tensors ``run()`` returns (a tensor, or lists / tuples / dicts of them)
    depend on: the gradient of their sum, with every one of ``params`` made to require a gradient for the call (its
    flag restored after). What a part trains when only some of its weights reach the loss
    (:meth:`FeatureMapTokens.image_parameters`, :meth:`finecap.models.vlm.VlmImages.image_parameters`)."""
    params = list(params)
    if not params:
        return []
    flags = [p.requires_grad for p in params]
    try:
        for p in params:
            p.requires_grad_(True)
        with torch.enable_grad():
            outs = [t for t in _tensors(run()) if t.is_floating_point() and t.requires_grad]
            if not outs:
                return []
            total = torch.stack([t.float().sum() for t in outs]).sum()
            grads = torch.autograd.grad(total, params, allow_unused=True)
    finally:
        for p, flag in zip(params, flags, strict=True):
            p.requires_grad_(flag)
    return [p for p, g in zip(params, grads, strict=True) if g is not None]


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


def load_frozen_tokens(cfg: Any, options: Any, what: str) -> FeatureMapTokens:
    """The image tokens a world BLIP or world VLM (``what``: its option) reads: ``model.encoder`` (``world`` = the
    trained world encoder of ``cfg``, else a dual-encoder name or path), weights in ``model.dtype``; quantization
    (which only a pretrained checkpoint can have) is refused first."""
    options.check_fresh(what)
    source = world_encoder_path(cfg) if cfg.model.encoder == "world" else cfg.model.encoder
    try:
        return FeatureMapTokens.from_pretrained(source, options.torch_dtype or "auto")
    except OSError as e:
        raise OSError(f"model.encoder={cfg.model.encoder}: cannot load the vision encoder: {e}") from None
