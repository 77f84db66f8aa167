"""The retriever: a frozen CLIP-style dual encoder that scores how well a caption picks out its image.

:class:`Retriever` wraps any ``transformers`` dual encoder exposing ``get_image_features`` /
``get_text_features`` / ``logit_scale`` (``CLIPModel`` checkpoints such as ``openai/clip-vit-base-patch32``, or the
world encoder, a ``VisionTextDualEncoderModel`` with a ConvNeXt vision tower, see
:mod:`finecap.models.world_encoder`). Every checkpoint brings its own tokenizer and image processor; nothing here
assumes the tiny world models.

Example (``clip_dir``: a folder saved like a Hub checkpoint, here a tiny random CLIP, where a user would name
``"openai/clip-vit-base-patch32"``; ``image``: a red square)::

    >>> r = Retriever.from_pretrained(clip_dir)
    >>> img = r.embed_images(r.preprocess([image]))  # (1, D), unit norm
    >>> txt = r.embed_texts(["a red circle on grass"])  # (1, D), unit norm
    >>> img.shape, round(float(img.norm()), 4)
    (torch.Size([1, 8]), 1.0)
    >>> r.similarity(txt, img)  # (1, 1) = logit_scale * cosine
    tensor([[5.32...]])
    >>> round(r.logit_scale * float(txt @ img.T), 2)
    5.32

Choices left open by the papers:

- The text window is the text tower's ``max_position_embeddings``, read from the loaded config (77 for CLIP, 248
  for Long-CLIP converted to a plain ``CLIPModel``: its two masked position tables sum into one), never assumed. Its
  tokenizer's ``model_max_length`` bounds it only for other towers (a RoBERTa-style one, whose position ids start
  after the padding index, reads two fewer tokens than its table has rows); a CLIP text tower uses every position,
  even when its tokenizer files, copied from CLIP's, still say 77.
- A text longer than the window is cut to it (``long_text="truncate"``, the default and what CLIP's tokenizer does),
  refused (``"error"``, naming it, its length and the window, as OpenAI's ``clip.tokenize`` refuses by default) or
  encoded whole as overlapping windows (``"chunks"``, :meth:`Retriever.text_features` says how);
  :meth:`Retriever.encode_texts` also returns each text's length, which every reward and metric reports
  (:mod:`finecap.models.text_window`).
- Texts are padded on the right whatever the tokenizer's ``padding_side``: the text tower numbers positions from 0
  and pools at the (first) EOS, so a left-padded batch would move a short text's tokens to other positions and, where
  the pad is the EOS (OpenAI's CLIP), pool at a pad: a text's embedding would depend on the longest text of its batch.
- When the text tower pools at the first EOS token (``CLIPTextModel`` with ``eos_token_id != 2``) and a tokenised
  text lacks that token (a tokenizer without an EOS post-processor, or truncation), the EOS is appended (or replaces
  the last token), so pooling never silently falls back to position 0. Texts are tokenised as text
  (:func:`finecap.data.targets.as_text`): a caption holding ``<|endoftext|>`` (CLIP's EOS) is scored whole, never
  pooled at that string.
- Image features (:meth:`Retriever.image_features`) go through the package's one image-feature cache
  (:mod:`finecap.data.features`), keyed by the model fingerprint (weights, class and image-processor settings,
  :meth:`Retriever.identity`), the data fingerprint (image ids, resolved paths, file sizes and modification times)
  and the records' split, so a different model or a regenerated data set never reuses a stale file. The weights
  are hashed on every call, so in-place fine-tuning can never leave a stale key.

:func:`load_retriever` only loads: the world encoder is trained by the application layer (``finecap retriever
train``, :func:`finecap.train.world_encoder.ensure_world_encoder`), never as a side effect of building a retriever.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
import transformers
from PIL import Image
from tqdm.auto import tqdm

from finecap.data.features import (
    cached_features,
    cached_tensor,
    compute_features,
    image_encoder_key,
    text_cache_file,
)
from finecap.data.images import DEFAULT_LIMITS, ImageLimits
from finecap.data.loading import draft_size
from finecap.data.targets import as_text
from finecap.models import memory
from finecap.models.text_window import LONG_TEXT, TextEncoding
from finecap.models.world_encoder_cache import world_encoder_path
from finecap.utils.system import progress_enabled
from finecap.utils.text import short_repr

if TYPE_CHECKING:
    from finecap.config import Config

CLIP_TEXT = "clip_text_model"
"""``model_type`` of ``transformers``' CLIP text tower (every position usable; pools at EOS)."""
FIRST_WORDS = 8
"""Words of a refused text shown in the message."""


class Retriever:
    """L2-normalised image/text embeddings, logit-scaled similarities and cached image features of a dual encoder.

    Args:
        model: a ``transformers`` model with ``get_image_features``, ``get_text_features`` and ``logit_scale``.
        tokenizer: the checkpoint's tokenizer.
        image_processor: the checkpoint's image processor (resize, crop, normalise).
        name: name or path the model came from (for messages and cache metadata only; the cache key uses weights).
        batch_size: images or texts per forward pass.
        device: torch device (default: the model's).
        long_text: what to do with a text longer than the text window (``retriever.long_text``: ``truncate``,
            ``error`` or ``chunks``; module docstring).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        image_processor: Any,
        name: str = "",
        batch_size: int = 256,
        device: str | torch.device | None = None,
        long_text: str = "truncate",
    ) -> None:
        for attr in ("get_image_features", "get_text_features", "logit_scale"):
            if not hasattr(model, attr):
                raise TypeError(f"retriever model {name or type(model).__name__} has no {attr!r}; need a dual encoder")
        if batch_size < 1:
            raise ValueError(f"retriever batch_size must be >= 1, got {batch_size}")
        if long_text not in LONG_TEXT:
            valid = ", ".join(LONG_TEXT)
            raise ValueError(f"retriever.long_text: invalid value {long_text!r}; valid choices: {valid}")
        self.model = model.eval()
        if device is not None:
            self.model.to(device)
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.name = name
        self.batch_size = batch_size
        self.long_text = long_text
        text_cfg = getattr(model.config, "text_config", model.config)
        self.max_length = self._max_length(tokenizer, text_cfg, name or type(model).__name__)  # the text window
        # CLIPTextTransformer pools at the first eos_token_id unless that id is the legacy 2 (argmax pooling).
        eos = getattr(text_cfg, "eos_token_id", None)
        pools_at_eos = getattr(text_cfg, "model_type", "") == CLIP_TEXT and eos is not None and eos != 2
        self.pool_eos_id: int | None = int(eos) if pools_at_eos else None

    # ----------------------------------------------------------------------------------------------------------------
    # Construction and saving
    # ----------------------------------------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path,
        batch_size: int = 256,
        device: str | torch.device | None = None,
        long_text: str = "truncate",
    ) -> Retriever:
        """Load a dual encoder, its tokenizer and image processor from a Hub name or a local folder.

        The model class is the one recorded in the checkpoint's ``config.json`` (``architectures``), e.g.
        ``CLIPModel`` or ``VisionTextDualEncoderModel``; the text window is its text config's. ``device``: where the
        model runs (``None``: the CPU); a CUDA device's weights are read straight onto it
        (:func:`finecap.models.memory.loading_onto`), any other's are loaded on the CPU and moved.
        """
        name = str(name_or_path)
        config = transformers.AutoConfig.from_pretrained(name, trust_remote_code=False)
        archs = list(getattr(config, "architectures", None) or [])
        model_cls = _model_class(config)
        with memory.loading_onto(device):
            model = model_cls.from_pretrained(name, trust_remote_code=False, **memory.placement())
        if not (hasattr(model, "get_image_features") and hasattr(model, "get_text_features")):
            raise TypeError(
                f"{name}: {type(model).__name__} (architectures={archs}) is not a dual encoder with "
                "get_image_features/get_text_features; use a CLIP-style checkpoint"
            )
        tokenizer = transformers.AutoTokenizer.from_pretrained(name, trust_remote_code=False)
        image_processor = transformers.AutoImageProcessor.from_pretrained(name, trust_remote_code=False)
        return cls(model, tokenizer, image_processor, name=name, batch_size=batch_size, device=device,
                   long_text=long_text)  # fmt: skip

    @staticmethod
    def weight_bytes(name_or_path: str | Path) -> int:
        """Bytes of the model :meth:`from_pretrained` loads from ``name_or_path`` (its parameters in the dtype the
        checkpoint records, which ``from_pretrained`` keeps, float32 where it records none, and its buffers), counted
        on the meta device from the configuration alone: what the memory forecast adds per frozen copy a run keeps on
        its device (``finecap train --dry-run``)."""
        config = transformers.AutoConfig.from_pretrained(str(name_or_path), trust_remote_code=False)
        dtype = getattr(config, "dtype", None) or torch.float32
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        model_cls = _model_class(config)
        with torch.device("meta"):
            model = model_cls.from_config(config) if model_cls is transformers.AutoModel else model_cls._from_config(
                config)  # fmt: skip
        floats = sum(p.numel() for p in model.parameters() if p.is_floating_point()) * dtype.itemsize
        rest = sum(p.numel() * p.element_size() for p in model.parameters() if not p.is_floating_point())
        return floats + rest + sum(b.numel() * b.element_size() for b in model.buffers())

    def save(self, out: str | Path) -> Path:
        """Write model, tokenizer and image processor so that :meth:`from_pretrained` reloads them."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        self.image_processor.save_pretrained(out)
        return out

    @staticmethod
    def _max_length(tokenizer: Any, text_cfg: Any, name: str) -> int:
        """The text window (module docstring): the text config's positions; for a tower other than CLIP's, at most
        the tokenizer's ``model_max_length``."""
        positions = getattr(text_cfg, "max_position_embeddings", None)
        tok = getattr(tokenizer, "model_max_length", None)
        tok = tok if isinstance(tok, int) and 0 < tok < 1_000_000 else None  # "no limit" is recorded as 1e30
        if positions and (tok is None or getattr(text_cfg, "model_type", "") == CLIP_TEXT):
            return int(positions)
        limits = [int(x) for x in (positions, tok) if x]
        if limits:
            return min(limits)
        raise ValueError(
            f"retriever {name}: cannot tell its text window: the text config has no max_position_embeddings and the "
            "tokenizer no model_max_length"
        )

    # ----------------------------------------------------------------------------------------------------------------
    # Properties
    # ----------------------------------------------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def logit_scale(self) -> float:
        """The model's temperature ``exp(logit_scale)`` multiplying cosine similarities."""
        return float(self.model.logit_scale.detach().exp())

    @property
    def dim(self) -> int:
        return int(getattr(self.model.config, "projection_dim", 0) or self.model.visual_projection.out_features)

    jpeg_draft: bool = True
    """Decode JPEGs in draft mode down to the processor's size (``data.jpeg_draft``, :func:`load_retriever` sets it),
    the rule the captioner's frozen features follow (:func:`finecap.data.features.model_features`), so that both
    compute, and share, the same cached features."""

    image_limits: ImageLimits = DEFAULT_LIMITS
    """The image budget images are read within (``data.max_image_pixels``, ``data.max_aspect_ratio``;
    :func:`load_retriever` sets it; :class:`finecap.data.images.ImageLimits`)."""

    @property
    def draft(self) -> int | None:
        """The JPEG draft size images are decoded at (:func:`finecap.data.loading.draft_size`), ``None``: full."""
        return draft_size(self.image_processor) if self.jpeg_draft else None

    def identity(self) -> str:
        """The model fingerprint (:func:`finecap.data.features.fingerprint_module`): class, weights,
        image-processor settings, how images become RGB (:data:`~finecap.data.images.RGB_CONVERSION`) and the JPEG
        draft size, as the captioner's frozen features key them. Keys the image-feature cache."""
        return image_encoder_key(self.model, self.image_processor, self.draft)

    # ----------------------------------------------------------------------------------------------------------------
    # Images
    # ----------------------------------------------------------------------------------------------------------------

    def preprocess(self, images: Sequence[Image.Image]) -> torch.Tensor:
        """Resize/crop/normalise PIL images with the checkpoint's image processor -> pixel values ``(B, 3, H, W)``."""
        images = [im.convert("RGB") for im in images]
        return self.image_processor(images=images, return_tensors="pt")["pixel_values"]

    def vision_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Unnormalised projected image features ``(B, D)`` (``get_image_features(...).pooler_output``).

        Runs in one pass and respects the caller's grad mode (the captioner may train through it).
        """
        out = self.model.get_image_features(pixel_values=pixel_values.to(self.device))
        return out.pooler_output if hasattr(out, "pooler_output") else out  # (B, D)

    @torch.no_grad()
    def embed_images(self, images: torch.Tensor | Sequence[Image.Image]) -> torch.Tensor:
        """L2-normalised image embeddings ``(B, D)`` from pixel values or PIL images, batched, without gradient."""
        return F.normalize(self._batched_image_features(images), dim=-1)

    def _batched_image_features(self, images: torch.Tensor | Sequence[Image.Image], desc: str = "") -> torch.Tensor:
        n = len(images)
        out = []
        starts = range(0, n, self.batch_size)
        show = progress_enabled(bool(desc) and n > 4 * self.batch_size)
        for i in tqdm(starts, desc=desc, disable=not show, leave=False):
            chunk = images[i : i + self.batch_size]
            pv = chunk if isinstance(chunk, torch.Tensor) else self.preprocess(chunk)
            with torch.no_grad():
                out.append(self.vision_features(pv).float().cpu())
        if not out:
            return torch.zeros(0, self.dim)
        return torch.cat(out)  # (N, D)

    def image_features(
        self, records: Sequence[Any], cache_dir: str | Path | None = None, normalize: bool = False
    ) -> torch.Tensor:
        """Projected features ``(N, D)`` of the images of ``records`` (objects with ``image_id`` and ``path``).

        With ``cache_dir``, features go through the image-feature cache (:mod:`finecap.data.features`; split label:
        the records' common ``split``, else ``mixed``). ``normalize=True`` returns unit-norm embeddings (what
        :meth:`image_embeddings` returns).
        """
        records = list(records)
        progress = len(records) > 4 * self.batch_size
        if cache_dir is None:
            feats = compute_features(records, self._encode_images, batch_size=self.batch_size,
                                     desc="image features", progress=progress, draft=self.draft,
                                     limits=self.image_limits)  # fmt: skip
        else:
            splits = {getattr(r, "split", None) for r in records}
            split = splits.pop() if len(splits) == 1 and None not in splits else "mixed"
            feats = cached_features(records, self._encode_images, cache_dir=cache_dir, encoder_key=self.identity(),
                                    split=split, batch_size=self.batch_size, progress=progress,
                                    draft=self.draft, limits=self.image_limits)  # fmt: skip
        if not len(feats):
            feats = torch.zeros(0, self.dim)
        return F.normalize(feats, dim=-1) if normalize else feats

    def image_embeddings(self, records: Sequence[Any], cache_dir: str | Path | None = None) -> torch.Tensor:
        """L2-normalised image embeddings ``(N, D)`` of ``records``, cached per model and data set."""
        return self.image_features(records, cache_dir, normalize=True)

    def _encode_images(self, images: list[Image.Image]) -> torch.Tensor:
        """Unnormalised features ``(b, D)`` of a batch of PIL images (the cache's ``encode``)."""
        return self.vision_features(self.preprocess(images))

    # ----------------------------------------------------------------------------------------------------------------
    # Texts
    # ----------------------------------------------------------------------------------------------------------------

    def tokenize(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and attention mask ``(B, T)``, padded on the right (module docstring), cut to the text window,
        EOS guaranteed."""
        enc = self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_length,
                             padding_side="right", return_tensors="pt", **as_text(self.tokenizer))  # fmt: skip
        return self._with_eos(enc["input_ids"], enc["attention_mask"])  # (B, T)

    def _with_eos(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``ids``, ``mask`` ``(B, T)`` with the pooling EOS appended to (or replacing the last token of, at the
        window's end) every row that lacks it."""
        eos = self.pool_eos_id
        if eos is not None and len(ids):
            missing = ~(ids == eos).any(dim=1)  # (B,)
            if missing.any():
                pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
                ids = torch.cat([ids, torch.full_like(ids[:, :1], pad)], dim=1)  # (B, T+1)
                mask = torch.cat([mask, torch.zeros_like(mask[:, :1])], dim=1)
                lengths = mask.sum(dim=1)  # (B,)
                for b in missing.nonzero().flatten().tolist():
                    pos = min(int(lengths[b]), self.max_length - 1)
                    ids[b, pos] = eos
                    mask[b, pos] = 1
                keep = int(mask.sum(dim=1).max())
                ids, mask = ids[:, :keep], mask[:, :keep]
        return ids, mask

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text read whole: its BOS and EOS included (and the EOS the retriever appends when the
        tokenizer adds none), before any cut. A text is longer than the window when its count exceeds
        :attr:`max_length`."""
        if not len(texts):
            return []
        rows = self.tokenizer(list(texts), truncation=False, verbose=False, **as_text(self.tokenizer))["input_ids"]
        eos = self.pool_eos_id
        return [len(row) + int(eos is not None and eos not in row) for row in rows]

    def _refuse_long(self, texts: Sequence[str], tokens: Sequence[int], names: Sequence[Any] | None) -> None:
        """``long_text="error"``: a ``ValueError`` naming the first text longer than the window (``names[i]``: its
        image id), its length and the window."""
        long = [b for b, n in enumerate(tokens) if n > self.max_length]
        if not long:
            return
        b = long[0]
        words = texts[b].split()
        first = short_repr(" ".join(words[:FIRST_WORDS]) + (" ..." if len(words) > FIRST_WORDS else ""))
        who = f"the caption of image {names[b]!r}" if names is not None else f"text {b}"
        more = f" (and {len(long) - 1} more)" if len(long) > 1 else ""
        raise ValueError(
            f"retriever.long_text=error: {who} ({first}) has {tokens[b]} tokens, more than the "
            f"{self.max_length}-token text window of {self.name or type(self.model).__name__}{more}; set "
            "retriever.long_text=truncate or chunks, or use a checkpoint with a longer window (Long-CLIP: 248)"
        )

    def text_features(
        self, texts: Sequence[str], names: Sequence[Any] | None = None, tokens: Sequence[int] | None = None
    ) -> torch.Tensor:
        """Projected text features ``(B, D)`` of one batch (respects the caller's grad mode); ``tokens``: the texts'
        :meth:`token_counts`, when known. A text longer than the window is, by :attr:`long_text`:

        - ``truncate``: its first window's feature (unnormalised, as every text that fits);
        - ``error``: refused, naming it (``names[i]``: its image id), its length and the window;
        - ``chunks``: the mean of the L2-normalised features of its windows (:meth:`windows`: as many tokens as the
          window holds, BOS and EOS added to each by the tokenizer, so each pools at its own EOS; consecutive windows
          overlap by half their text tokens), weighted by the text tokens of each window.

        Why this pooling: CLIP scores by cosine, so each window enters as a direction (a window's feature norm says
        nothing of its match), and weighting by its text tokens makes the mean an average over the caption's tokens,
        a short tail window counting for what it reads; it is the OpenAI cookbook's recipe for texts longer than an
        embedding model's context ("Embedding texts that are longer than the model's maximum context length":
        chunk, embed, average weighted by chunk length). The half-window overlap puts every span of up to half a
        window whole inside one window, so a detail cut at a window's edge is still read together, at about twice
        the windows of cutting end to end. Long-CLIP (Zhang et al. 2024) instead stretches the position table to
        248 and fine-tunes; such a checkpoint loads here with its full window, and ``chunks`` is for checkpoints
        whose window is shorter than the captions. A text that fits is one window: its feature is exactly the one
        ``truncate`` gives, bit for bit.
        """
        texts = list(texts)
        if self.long_text != "truncate" and tokens is None:
            tokens = self.token_counts(texts)
        if self.long_text == "error":
            self._refuse_long(texts, tokens, names)
        ids, mask = self.tokenize(texts)
        feats = self._text_tower(ids, mask)  # (B, D)
        if self.long_text == "chunks":
            rows = [b for b, n in enumerate(tokens) if n > self.max_length]
            if rows:
                index = torch.tensor(rows, device=feats.device)
                pooled = self._pooled_windows([texts[b] for b in rows], feats[index])  # (L, D)
                feats = feats.index_copy(0, index, pooled)  # (B, D)
        return feats

    def _text_tower(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Projected features ``(B, D)`` of token ids and mask ``(B, T)``."""
        out = self.model.get_text_features(input_ids=ids.to(self.device), attention_mask=mask.to(self.device))
        return out.pooler_output if hasattr(out, "pooler_output") else out  # (B, D)

    def windows(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The overlapping windows of ``texts``: token ids and mask ``(W, T)`` and the text of each window
        ``(W,)``, a text's windows in order. The tokenizer makes them (``return_overflowing_tokens`` with a
        ``stride`` of half the window's text tokens): each holds up to :attr:`max_length` tokens with the BOS and EOS
        its post-processor adds to a whole text (or the EOS the retriever appends, room kept for it, when it adds
        none); the first is what :meth:`tokenize` gives."""
        eos = self.pool_eos_id
        appended = int(eos is not None and eos not in self.tokenizer("")["input_ids"])  # the tokenizer adds no EOS
        length = self.max_length - appended
        text_tokens = length - self.tokenizer.num_special_tokens_to_add()
        enc = self.tokenizer(list(texts), padding=True, truncation=True, max_length=length, stride=text_tokens // 2,
                             padding_side="right", return_overflowing_tokens=True, return_tensors="pt",
                             **as_text(self.tokenizer))  # fmt: skip
        if "overflow_to_sample_mapping" not in enc:
            raise ValueError(
                f"retriever.long_text=chunks: the tokenizer of {self.name or type(self.model).__name__} "
                f"({type(self.tokenizer).__name__}) does not return overflowing windows; use a fast (tokenizers) one"
            )
        ids, mask = self._with_eos(enc["input_ids"], enc["attention_mask"])  # (W, T)
        return ids, mask, enc["overflow_to_sample_mapping"].long()

    def _pooled_windows(self, texts: list[str], first: torch.Tensor) -> torch.Tensor:
        """``chunks`` (:meth:`text_features`): the pooled features ``(L, D)`` of L long texts whose first windows'
        features are ``first`` ``(L, D)`` (computed already); their other windows are encoded here."""
        ids, mask, owner = self.windows(texts)  # (W, T), (W, T), (W,)
        starts = torch.ones_like(owner, dtype=torch.bool)
        starts[1:] = owner[1:] != owner[:-1]  # (W,) a text's first window
        if bool(starts.all()):  # one window each (the EOS the retriever appends was all that overflowed)
            return first
        rest = self._text_tower(ids[~starts], mask[~starts])  # (W - L, D)
        feats = torch.zeros(len(owner), first.shape[1], dtype=first.dtype, device=first.device)
        feats = feats.index_copy(0, starts.nonzero().flatten().to(first.device), first)
        feats = feats.index_copy(0, (~starts).nonzero().flatten().to(first.device), rest.to(first.dtype))  # (W, D)
        marks = torch.tensor([t for t in (self.tokenizer.bos_token_id, self.tokenizer.eos_token_id,
                                          self.pool_eos_id) if t is not None], dtype=ids.dtype)  # fmt: skip
        weights = (mask.bool() & ~torch.isin(ids, marks)).sum(dim=1).to(first)  # (W,) text tokens of each window
        owner = owner.to(first.device)
        summed = torch.zeros_like(first).index_add(0, owner, F.normalize(feats, dim=-1) * weights[:, None])  # (L, D)
        total = torch.zeros(len(first), dtype=first.dtype, device=first.device).index_add(0, owner, weights)  # (L,)
        return summed / total[:, None]  # (L, D)

    def _embed(self, texts: list[str], tokens: list[int] | None, names: Sequence[Any] | None) -> torch.Tensor:
        """L2-normalised embeddings ``(N, D)``, batched (progress bar on long lists); refused before any forward pass
        when ``long_text="error"`` and a text is too long."""
        if self.long_text != "truncate" and tokens is None:
            tokens = self.token_counts(texts)
        if self.long_text == "error":
            self._refuse_long(texts, tokens, names)
        out = []
        show = progress_enabled(len(texts) > 4 * self.batch_size)
        for i in tqdm(range(0, len(texts), self.batch_size), desc="text features", disable=not show, leave=False):
            part = slice(i, i + self.batch_size)
            batch_names = names[part] if names is not None else None
            batch_tokens = tokens[part] if tokens is not None else None
            out.append(self.text_features(texts[part], names=batch_names, tokens=batch_tokens).float().cpu())
        if not out:
            return torch.zeros(0, self.dim)
        return F.normalize(torch.cat(out), dim=-1)  # (N, D)

    @torch.no_grad()
    def embed_texts(self, texts: Sequence[str], names: Sequence[Any] | None = None) -> torch.Tensor:
        """L2-normalised text embeddings ``(N, D)``, batched, without gradient (progress bar on long lists); long
        texts as :attr:`long_text` says (:meth:`text_features`; ``names``: the texts' image ids, for the refusal)."""
        return self._embed(list(texts), None, names)

    @torch.no_grad()
    def encode_texts(self, texts: Sequence[str], names: Sequence[Any] | None = None) -> TextEncoding:
        """:meth:`embed_texts` with each text's :meth:`token_counts` and the window, which say how many texts were
        longer than the window (:class:`finecap.models.text_window.TextEncoding`)."""
        texts = list(texts)
        tokens = self.token_counts(texts)
        return TextEncoding(self._embed(texts, tokens, names), tuple(tokens), self.max_length, self.long_text)

    def text_embeddings(self, texts: Sequence[str], cache_dir: str | Path | None = None) -> torch.Tensor:
        """:meth:`embed_texts`, through the feature cache when ``cache_dir`` is given: the embeddings of the same
        ordered texts under the same model and tokenizer are computed once
        (:func:`finecap.data.features.text_cache_file`, keyed by :meth:`text_identity`)."""
        texts = list(texts)
        if cache_dir is None:
            return self.embed_texts(texts)
        if self.long_text == "error":  # truncate's embeddings, cached under its key: a long text is refused anyway
            self._refuse_long(texts, self.token_counts(texts), None)
        path, meta = text_cache_file(cache_dir, self.text_identity(), texts)
        return cached_tensor(path, meta, lambda: self.embed_texts(texts))

    def text_identity(self) -> str:
        """What keys a cache of :meth:`embed_texts`' embeddings (SHA-256 hex): :meth:`identity`, the tokenizer's
        vocabulary, the text window, the pooling EOS and, for ``chunks``, :attr:`long_text` (``error`` embeds as
        ``truncate`` does, refusing a long text instead). The text-embedding cache (:meth:`text_embeddings`) and
        every cache of something computed from text embeddings (BagCurri's neighbour table,
        :func:`finecap.data.bags.neighbour_table`) use it."""
        vocab = self.tokenizer.get_vocab()
        tokenizer = hashlib.sha256(json.dumps(sorted(vocab.items())).encode()).hexdigest()
        key = f"{self.identity()}|tokenizer {tokenizer}|max_length {self.max_length}|eos {self.pool_eos_id}"
        if self.long_text == "chunks":  # other embeddings of long texts (the key of the others is unchanged)
            key += "|long_text chunks"
        return hashlib.sha256(key.encode()).hexdigest()

    # ----------------------------------------------------------------------------------------------------------------
    # Scores
    # ----------------------------------------------------------------------------------------------------------------

    def similarity(self, text_emb: torch.Tensor, image_emb: torch.Tensor) -> torch.Tensor:
        """Logit-scaled cosine similarities ``(T, I)`` of unit-norm text ``(T, D)`` and image ``(I, D)`` embeddings."""
        return self.logit_scale * text_emb @ image_emb.T  # (T, I)


def _model_class(config: Any) -> Any:
    """The dual-encoder class a checkpoint's ``config.json`` names (``architectures``), else ``AutoModel``."""
    for arch in getattr(config, "architectures", None) or []:
        c = getattr(transformers, arch, None)
        if c is not None and hasattr(c, "get_image_features") and hasattr(c, "get_text_features"):
            return c
    return transformers.AutoModel


def retriever_path(cfg: Config) -> str | Path:
    """The retriever a run loads (:func:`load_retriever`): ``retriever.checkpoint`` if set, else the world encoder."""
    return cfg.retriever.checkpoint or world_encoder_path(cfg)


class SharedRetrievers:
    """While one of its ``with`` blocks runs, :func:`load_retriever` loads a retriever of given settings (checkpoint,
    batch size, ``retriever.long_text``, ``data.jpeg_draft``, the image budget) once and returns that same object to
    every later call asking for the same settings, across all the blocks of this object: a training run loads the
    frozen retriever once for the self-retrieval reward and the retrieval validator, which share it
    (:func:`finecap.train.run.kept_beside` counts one copy). A call naming a ``device`` moves the shared model there
    (the reward asks for the accelerator's device, where the validator moves it at its first evaluation anyway).
    Sharing changes no value: both only read the frozen model (no gradient, eval mode). Outside any block every call
    loads its own copy.

    Example (``clip_dir``: a tiny CLIP checkpoint)::

        >>> from finecap.config import load
        >>> cfg = load(None, [f"retriever.checkpoint={clip_dir}"])
        >>> shared = SharedRetrievers()
        >>> with shared:
        ...     first = load_retriever(cfg)
        >>> with shared:
        ...     load_retriever(cfg) is first, load_retriever(cfg, batch_size=1) is first
        (True, False)
        >>> load_retriever(cfg) is first
        False
    """

    def __init__(self) -> None:
        self.loaded: dict[tuple[Any, ...], Retriever] = {}
        self._tokens: list[contextvars.Token] = []

    def __enter__(self) -> SharedRetrievers:
        self._tokens.append(_SHARED.set(self))
        return self

    def __exit__(self, *exc: object) -> None:
        _SHARED.reset(self._tokens.pop())


_SHARED: contextvars.ContextVar[SharedRetrievers | None] = contextvars.ContextVar("finecap_shared_retrievers",
                                                                                   default=None)  # fmt: skip
"""The :class:`SharedRetrievers` whose block is running (``None``: none; every load its own)."""


def load_retriever(cfg: Config, batch_size: int | None = None, device: str | torch.device | None = None) -> Retriever:
    """The retriever a run uses: ``retriever.checkpoint`` if set, else the world encoder of ``cfg``, which must have
    been trained already (:func:`finecap.models.world_encoder_cache.world_encoder_path` names the command otherwise);
    on ``device`` (default: where ``from_pretrained`` puts it, the CPU; a CUDA device's weights are read straight onto
    it: :meth:`Retriever.from_pretrained`). Inside a :class:`SharedRetrievers` block, the one already loaded there
    with the same settings (moved to ``device`` when one is given)."""
    path = retriever_path(cfg)
    batch_size = batch_size or cfg.retriever.batch_size_eval
    limits = ImageLimits.of(cfg.data)
    shared = _SHARED.get()
    key = (str(path), batch_size, cfg.retriever.long_text, cfg.data.jpeg_draft, limits)
    if shared is not None and key in shared.loaded:
        retriever = shared.loaded[key]
        if device is not None:
            retriever.model.to(device)
        return retriever
    retriever = Retriever.from_pretrained(path, batch_size=batch_size, device=device,
                                          long_text=cfg.retriever.long_text)  # fmt: skip
    retriever.jpeg_draft = cfg.data.jpeg_draft
    retriever.image_limits = limits
    if shared is not None:
        shared.loaded[key] = retriever
    return retriever
