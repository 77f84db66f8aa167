"""The captioner contract: :class:`CaptionerBase`, the one class every backbone stands on, writing once every member
that does not depend on the backbone.

What a captioner is to the rest of finecap. Objectives, rewards, decoding, the feature cache, LoRA, checkpoints and
the training engine use the members of :class:`CaptionerBase` and nothing else, without ``getattr`` fallbacks;
``tests/models/test_contract.py`` runs one contract test module on every backbone. In short:

- ``forward(batch)`` -> teacher-forced logits ``(B, T, V)`` of ``batch["input_ids"]`` (the caption tokens only: a
  prefix, a start token, a chat prompt or image tokens are never among them), aligned so that ``logits[:, t]``
  predicts ``batch["labels"][:, t]``;
- ``forward(batch, sequences=S, mask=M, image_index=I, temperature=T, with_entropy=E, with_top=P)`` ->
  :class:`~finecap.models.captioner.TokenScores` of the given captions ``S (N, L)`` (e.g. sampled ones): their
  per-token log-probs ``(N, L)``, with gradient, the next-token entropies when ``E`` and whether each token is the
  most likely one when ``P``. Row ``n`` of ``S`` describes image ``I[n]`` of the batch.

``forward`` is the *only* differentiable entry point: it is what ``accelerator.prepare`` wraps (DDP), so every
gradient that an objective or a reward needs flows through it and is synchronised by the wrapper. Decoding (the
:class:`finecap.decode.Stepper` methods ``start``/``step``/``select`` and ``generate``) runs on the *unwrapped* model
under ``torch.no_grad`` (see :func:`finecap.objectives.base.unwrap`), the pattern TRL uses for generation in its
online trainers. Objectives never touch a captioner's private members.

:class:`CaptionerBase` is to finecap's backbones what ``PreTrainedModel`` + ``GenerationMixin`` are to transformers'
models: it owns ``forward`` (teacher-forced logits and the scoring of given sequences), ``generate`` (chunked
decoding through :mod:`finecap.decode`), the shared properties, ``train()`` (frozen parts stay in eval mode), LoRA
part handling through module paths, and ``save`` / ``from_checkpoint`` of a checkpoint folder with its
``captioner.json``, adapters, dtypes and float32 master weights. The memory and precision levers
(:mod:`finecap.models.memory`: dtype, gradient checkpointing, quantization) act on what these members expose, so they
are written once for every backbone.

A backbone (:mod:`finecap.models.clipcap`, :mod:`finecap.models.blip`, :mod:`finecap.models.vlm`) writes only its
hooks:

- how it is made from the configuration: the classmethod :meth:`CaptionerBase.build`;
- how images condition it: :meth:`CaptionerBase.image_conditioning` (the per-image conditioning decoding starts
  from: ClipCap's feature vectors, BLIP's image tokens, a VLM's embedded prompt) and, when teacher forcing reads
  something derived from it, :meth:`CaptionerBase.scoring_conditioning` (ClipCap's mapper turns features into the
  prefix);
- how captions are read after it: :meth:`CaptionerBase.caption_logits` (teacher forcing) and the Stepper methods
  ``start`` / ``step`` / ``select`` (decoding); optionally :meth:`CaptionerBase.sequence_logits` (a VLM scores the S
  samples of an image after one pass over its prompt);
- where its parts are: :attr:`CaptionerBase.PART_PATHS` or :meth:`CaptionerBase.part_path` (the module LoRA wraps
  for ``"lm"`` and ``"encoder"``), :meth:`CaptionerBase.lora_default_targets`, :meth:`CaptionerBase.apply_trainable`;
- what it saves besides what the base saves: :meth:`CaptionerBase.own_config`, :meth:`CaptionerBase.save_weights`
  and the classmethod :meth:`CaptionerBase.load_weights`; the static questions a run asks before any model exists
  (``reads_world_encoder``, ``encoder_source``); optionally what its model card says
  (:meth:`CaptionerBase.base_models`, :meth:`CaptionerBase.card_lines`).

A fourth backbone is one file of hooks plus one row of :data:`finecap.registry.BACKBONES`, or none when it is named
by its dotted path (:mod:`finecap.models.backbones`; ``tests/helpers/toy_backbone.py``).
"""

from __future__ import annotations

import abc
import contextlib
import functools
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from finecap.config import DecodeConfig
from finecap.decode import Conditioning, Generation, decode, stop_token_ids
from finecap.models import lora, memory, strict
from finecap.models.captioner import (
    PARTS,
    VOCAB_CHUNK_ELEMENTS,
    TokenScores,
    chunked_token_scores,
    strip_prefix,
    token_scores,
)
from finecap.runs import CAPTIONER_FILE, CheckpointError
from finecap.utils.files import write_json
from finecap.utils.reading import read_json

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from finecap.config import Config
    from finecap.models.captioner import ImageSide
    from finecap.models.vision import VisionEncoder

CONFIG_NAME = CAPTIONER_FILE
"""The file naming a captioner checkpoint folder: its backbone (``"kind"``) and what the backbone records
(:data:`finecap.runs.CAPTIONER_FILE`, which readers of a run find model folders by)."""


def module_path(root: Any, path: str) -> Any:
    """``root.a.b.c`` for ``path = "a.b.c"`` (through peft wrappers, which forward attribute access)."""
    return functools.reduce(getattr, path.split("."), root)


def set_module_path(root: Any, path: str, value: Any) -> None:
    """Put ``value`` at ``root.a.b.c`` for ``path = "a.b.c"``."""
    parent, _, name = path.rpartition(".")
    setattr(module_path(root, parent) if parent else root, name, value)


SHIFT_KEY = "first_token_shift"
"""The ``captioner.json`` key of :attr:`CaptionerBase.first_token_shift` (written only for shifted weights)."""


def recorded_shift(meta: dict[str, Any], path: str | Path) -> dict[str, Any] | None:
    """The first-token shift a ``captioner.json`` (``meta``, of the folder ``path``) records
    (:attr:`CaptionerBase.first_token_shift`), ``None`` when it records none (every checkpoint written before
    2026-11-28, and every unshifted one); one that is not ``{"form": "token", "token_id": <int>}`` or
    ``{"form": "subword"}`` is a :class:`~finecap.runs.CheckpointError` naming the file."""
    shift = meta.get(SHIFT_KEY)
    if shift is None:
        return None
    ok = isinstance(shift, dict) and (
        shift == {"form": "subword"}
        or (set(shift) == {"form", "token_id"} and shift["form"] == "token" and type(shift["token_id"]) is int)
    )
    if not ok:
        raise CheckpointError(f"{Path(path) / CONFIG_NAME}: {SHIFT_KEY} is {shift!r}, not "
                              '{"form": "token", "token_id": <id>} or {"form": "subword"}')  # fmt: skip
    return dict(shift)


def shift_lines(meta: dict[str, Any]) -> list[str]:
    """A model card's line for weights that start every caption with SMILE's shift token (``captioner.json``'s
    :data:`SHIFT_KEY`), ``[]`` for others: finecap's loaders write the captions without it, transformers' ``generate``
    cannot know it is there (docs/caption.md, merged exports), so a card that only said "a plain transformers
    checkpoint" promised captions it does not give.

    >>> "(token id 7;" in shift_lines({SHIFT_KEY: {"form": "token", "token_id": 7}})[0]
    True
    >>> shift_lines({})
    []
    """
    shift = meta.get(SHIFT_KEY)
    if not isinstance(shift, dict):
        return []
    first = (f"token id {int(shift['token_id'])}" if shift.get("form") == "token"
             else "the `##` sub-word form of the caption's first word, `##a dog`")  # fmt: skip
    return [f"Its weights start every caption with SMILE's shift token ({first}; `{SHIFT_KEY}` in `captioner.json`): "
            "finecap's loaders write the captions without it, transformers' `generate` writes it first, so take it "
            "off that text."]  # fmt: skip


def read_meta(path: str | Path) -> dict[str, Any]:
    """The ``captioner.json`` of a checkpoint folder; a folder without one, or one that is not a JSON object, is
    named."""
    meta_file = Path(path) / CONFIG_NAME
    if not meta_file.exists():
        raise FileNotFoundError(f"{path}: not a captioner checkpoint (no {CONFIG_NAME})")
    meta = read_json(meta_file)
    if not isinstance(meta, dict):
        raise CheckpointError(f"{meta_file}: expected a JSON object (the captioner's kind and settings)")
    return meta


TEXT_TINY_SIZES = {
    "tiny_layers": "num_hidden_layers",
    "tiny_hidden": "hidden_size",
    "tiny_heads": "num_attention_heads",
}
"""A world-tiny model's sizes (``<section>.tiny_*``) and the transformers config fields (BLIP's text decoder, the
world VLM's language model) that hold them."""


def set_dropout(module: nn.Module, p: float) -> int:
    """Set the probability of every dropout module under ``module`` (``nn.Dropout`` and its 1d-3d, alpha kinds) to
    ``p``; returns how many were changed. Attention dropout counts: transformers' attention kernels read the
    module's ``p`` (GPT-2's ``attn_dropout``, BERT-style ``dropout`` of the attention probabilities).

    >>> net = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1), nn.Sequential(nn.Dropout1d(0.3)))
    >>> set_dropout(net, 0.0), [m.p for m in net.modules() if isinstance(m, nn.modules.dropout._DropoutNd)]
    (2, [0.0, 0.0])
    """
    changed = 0
    for m in module.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p != p:
            m.p = p
            changed += 1
    return changed


def same_source(recorded: str, configured: str) -> bool:
    """Whether a checkpoint's recorded source (a Hub name, a folder, ``world-tiny``) is the configured one: the same
    text, or two paths to the same folder; an unrecorded source (``""``, older checkpoints) is never a difference."""
    if not recorded or recorded == configured:
        return True
    a, b = Path(recorded), Path(configured)
    return a.exists() and b.exists() and a.resolve() == b.resolve()


def dtype_argument(meta: dict[str, Any]) -> str:
    """``", dtype=torch.bfloat16"`` (or ``float16``) for a model card's ``from_pretrained(base...)`` when the run
    computed in that dtype (``captioner.json``'s ``dtypes``: every part's frozen weights in it, ``model.dtype``), else
    ``""``: a base loaded in its saved dtype (float32, say) under a bf16 run's adapter does not caption as the run did.

    >>> dtype_argument({"dtypes": {"lm": {"trainable": "float32", "frozen": "bfloat16"}, "rest": {}}})
    ', dtype=torch.bfloat16'
    >>> dtype_argument({"dtypes": {"lm": {"frozen": "float32"}}})
    ''
    """
    parts = meta.get("dtypes")
    frozen = {p.get("frozen") for p in parts.values() if isinstance(p, dict)} if isinstance(parts, dict) else set()
    frozen.discard(None)
    (dtype,) = frozen if len(frozen) == 1 else (None,)
    return f", dtype=torch.{dtype}" if dtype in ("bfloat16", "float16") else ""


class CaptionerBase(nn.Module, abc.ABC):
    """The captioner contract up to the backbone's hooks (module docstring); besides its members a captioner is an
    ``nn.Module`` (``parameters``, ``state_dict``, ``to``, ``train``/``eval``). Subclasses set ``tokenizer``,
    ``train_lm``, ``train_encoder`` and ``encoder`` in ``__init__`` and call :meth:`apply_trainable` and
    ``self.train(self.training)`` at its end; a class missing one of the abstract hooks cannot be instantiated (the
    error names the hook).

    Class attributes:
        kind: the backbone's name (``model.kind``; ``captioner.json``'s ``"kind"``): its row's name in
            :data:`finecap.registry.BACKBONES`; a class that sets none is named by its dotted path
            (``pkg.module:Class``), which ``model.kind`` and :func:`finecap.models.backbones.load_captioner` resolve.
        PART_PATHS: the attribute path of each LoRA part (:data:`finecap.models.captioner.PARTS`) from the captioner;
            a backbone whose parts move (a VLM family, an optional encoder) overrides :meth:`part_path` instead.
        DUAL_ENCODER_DIR, DUAL_SAVED_KEY, DUAL_SOURCE_KEY: where a trained dual encoder read from outside the folder
            is saved, and the ``captioner.json`` keys saying whether it was and where the frozen one comes from.
        TRANSFORMERS_CLASS: the transformers class that loads the folder alone (:meth:`save_plain_model`), which the
            model card names (:meth:`card_lines`); ``""``: none.
        PIPELINE_TAG: the Hub task of the backbone's base models, the model card's ``pipeline_tag``:
            ``image-to-text`` (an image in, its caption out), ``image-text-to-text`` for a VLM (an image and a
            prompt in: transformers 5 runs ``image-to-text`` as that task, and a VLM without its prompt is refused).

    Attributes:
        tokenizer: the captions' tokenizer (its EOS ends every caption; its pad id pads them).
        train_lm: whether the text side learns (fully, or through its LoRA adapters).
        train_encoder: whether the vision side learns; then batches carry pixel inputs, never cached features.
        encoder: the vision side (:class:`~finecap.models.captioner.ImageSide`; ``None``: a captioner reading cached
            features only).
        cache_features: whether frozen vision outputs go through the feature cache (``batch["features"]``) instead of
            being recomputed from pixels at every step.
    """

    kind: ClassVar[str] = ""
    PART_PATHS: ClassVar[dict[str, str]] = {}
    base_changed: bool = False
    """Whether the base weights differ from the source's (adapters merged into them, parts trained fully, a start from
    a checkpoint whose base had changed): then no adapter on the source reproduces the captioner (:meth:`save`)."""
    dual_in_checkpoint: bool = False
    """Whether the dual encoder was loaded from the checkpoint folder (an earlier stage trained it): it differs from
    its source, so :meth:`save` writes it again even when it is frozen now (a later stage with
    ``model.train_encoder=false``), instead of a reference to the source that would load the untrained one."""
    inherited_modules: frozenset[str] = frozenset()
    """Modules (under :meth:`adapter_root`) a start checkpoint trained fully beside its adapters (its whole adapter's
    ``modules_to_save``): they differ from the source's, so an adapter written now must carry them again."""
    DUAL_ENCODER_DIR: ClassVar[str] = "world_encoder"
    DUAL_SAVED_KEY: ClassVar[str] = "world_saved"
    DUAL_SOURCE_KEY: ClassVar[str] = "world_source"
    TRANSFORMERS_CLASS: ClassVar[str] = ""
    PIPELINE_TAG: ClassVar[str] = "image-to-text"

    tokenizer: Any
    train_lm: bool
    train_encoder: bool
    encoder: ImageSide | None
    cache_features: bool

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # One's own backbone is named by its dotted path. FSDP2's ``fully_shard`` swaps a sharded captioner's class
        # for a generated subclass (``FSDPClipCap``, defined nowhere a path could import): it keeps its base's kind.
        if "kind" not in cls.__dict__ and not issubclass(cls, FSDPModule):
            cls.kind = f"{cls.__module__}:{cls.__qualname__}"

    # ================================================================================================================
    # Hooks every backbone writes
    # ================================================================================================================

    @classmethod
    @abc.abstractmethod
    def build(cls, cfg: Config) -> CaptionerBase:
        """A fresh captioner from the configuration: ``model`` (what every captioner reads) and the backbone's own
        section, when it has one (:class:`finecap.config.Config`)."""
        ...

    @abc.abstractmethod
    def image_conditioning(self, batch: dict[str, Any]) -> Conditioning:
        """The per-image conditioning of a batch (cached ``features`` or pixel inputs): what :meth:`generate` decodes
        from and ``start`` receives, row ``b`` for image ``b`` (a tensor, or a row-indexable object with ``len()``)."""
        ...

    def scoring_conditioning(self, conditioning: Conditioning) -> Conditioning:
        """What teacher forcing reads, from :meth:`image_conditioning`'s output (default: the same; ClipCap: the
        mapper's prefix). Runs once per image, with gradient where it trains."""
        return conditioning

    @abc.abstractmethod
    def caption_logits(self, conditioning: Conditioning, input_ids: torch.Tensor,
                       attention_mask: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """Teacher-forced logits ``(B, T, V)`` of ``input_ids (B, T)`` after ``conditioning`` (row for row), aligned
        so that ``logits[:, t]`` predicts ``input_ids[:, t]``."""
        ...

    @abc.abstractmethod
    def start(self, conditioning: Conditioning) -> tuple[torch.Tensor, Any]:
        """Stepper: first-token logits ``(B, V)`` and the decoding state of B images' conditioning."""
        ...

    @abc.abstractmethod
    def step(self, tokens: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        """Stepper: feed one token per row ``(N,)``; next logits ``(N, V)`` and the state."""
        ...

    @abc.abstractmethod
    def select(self, state: Any, index: torch.Tensor) -> Any:
        """Stepper: keep / repeat / reorder the state's rows."""
        ...

    @abc.abstractmethod
    def apply_trainable(self) -> None:
        """``requires_grad`` of every parameter from ``train_lm`` / ``train_encoder`` (through a part's adapters when
        it has some, :func:`finecap.models.lora.train_part`) and the backbone's always-trained parts."""
        ...

    def own_config(self) -> dict[str, Any]:
        """What the backbone records in ``captioner.json`` besides ``kind`` and the two training flags."""
        return {}

    @abc.abstractmethod
    def save_weights(self, out: Path, state: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Write the backbone's own files into ``out`` (base weights without adapters, tokenizer, processor) from
        ``state`` (the captioner's state dict); return what ``captioner.json`` records about them."""
        ...

    @classmethod
    @abc.abstractmethod
    def load_weights(cls, path: Path, meta: dict[str, Any], load_encoder: bool,
                     options: memory.LoadOptions) -> CaptionerBase:  # fmt: skip
        """A captioner from the files :meth:`save_weights` wrote and ``captioner.json`` (``meta``), without its
        adapters (the base loads those)."""
        ...

    @staticmethod
    @abc.abstractmethod
    def reads_world_encoder(cfg: Config) -> bool:
        """Whether a fresh captioner built from the configuration reads the world encoder (a run then prepares it
        first)."""
        ...

    @staticmethod
    @abc.abstractmethod
    def encoder_source(cfg: Config) -> str | None:
        """The vision encoder a fresh captioner of the configuration loads from outside its checkpoint, or ``None``."""
        ...

    # ---- optional hooks ------------------------------------------------------------------------------------------

    @staticmethod
    def built_here(cfg: Config) -> str | None:
        """The option by which a fresh captioner of ``cfg`` builds a part with random weights here (``clipcap.lm=
        world-tiny``), or ``None`` when every part loads a checkpoint: what runs can check before anything is
        prepared (``model.quantization`` only quantizes checkpoints). Default ``None``."""
        return None

    def sequence_logits(self, conditioning: Conditioning, sequences: torch.Tensor, mask: torch.Tensor,
                        image_index: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
        """Logits ``(N, L, V)`` of given ``sequences (N, L)``, row ``n`` after image ``image_index[n]``'s
        conditioning (or image ``n``): by default :meth:`caption_logits` on the rows of the conditioning."""
        if image_index is not None:
            conditioning = conditioning[image_index.to(self.device)]  # (N, ...)
        elif len(conditioning) != sequences.shape[0]:
            raise ValueError(
                f"{len(conditioning)} images for {sequences.shape[0]} sequences; pass image_index to map them"
            )
        return self.caption_logits(conditioning, sequences, mask.long())  # (N, L, V)

    def output_head(self) -> nn.Module | None:
        """The module mapping the language model's last hidden states to the vocabulary's logits (the transformers
        model's ``get_output_embeddings()``), which :meth:`forward` defers and runs in chunks while training with
        gradient checkpointing (:attr:`scores_in_chunks`); ``None`` (the default): the backbone exposes none and its
        scoring always holds the whole logits."""
        return None

    def check_length(self, conditioning: Conditioning, n_tokens: int, what: str) -> None:
        """Refuse a caption of ``n_tokens`` (``what``: the option or quantity it comes from) that cannot fit after
        the conditioning; by default against :attr:`max_caption_tokens`."""
        limit = self.max_caption_tokens
        if limit is not None and n_tokens > limit:
            raise ValueError(f"{what}={n_tokens} exceeds the {limit} caption tokens this {self.kind} can read")

    def part_path(self, part: str) -> str | None:
        """The attribute path of the module LoRA wraps for ``part`` (``None``: no such part)."""
        return self.PART_PATHS.get(part)

    def lora_default_targets(self, part: str) -> tuple[str, ...]:
        """Module names (or dot-suffixes) LoRA adapts in ``part`` when ``lora.<part>_targets`` is empty; ``()`` (the
        default) = every linear layer of the part except the output head."""
        return ()

    def lora_unreached(self, part: str) -> frozenset[str] | None:
        """Modules of ``part`` (names in its plain module) whose output never reaches the captioner's: LoRA leaves
        them unadapted, as their adapters could never learn (a VLM tower's layers past the one its language model
        reads, its pooling head: :meth:`finecap.models.vlm.VlmImages.unreached_modules`); ``None``: unknown here (a
        build on the meta device). The default: for the encoder of a :meth:`dual_encoder`, the modules of its image
        side that its output never reads (the probe of its ``image_parameters``: a ViT's ``visual_projection``
        under the world BLIP's / VLM's image tokens, :meth:`finecap.models.vision.FeatureMapTokens.image_parameters`;
        :func:`finecap.models.lora.unreached_modules`); none elsewhere."""
        dual = self.dual_encoder() if part == "encoder" else None
        if dual is None:
            return frozenset()
        module = self.lora_module(part)
        if any(p.is_meta for p in module.parameters()):
            return None
        reached = {id(p) for p in dual.image_parameters()}
        return lora.unreached_modules(
            module, {lora.plain_name(n) for n, p in module.named_parameters() if id(p) in reached and "lora_" not in n}
        )

    def frozen_modules(self) -> list[nn.Module]:
        """Modules kept in eval mode when the captioner trains: the parts whose flag is off (for the vision side, the
        whole :meth:`dual_encoder` when there is one)."""
        frozen = [] if self.train_lm else [self.lora_module("lm")]
        if not self.train_encoder:
            dual = self.dual_encoder()
            frozen.append(self.lora_module("encoder") if dual is None else dual)
        return [m for m in frozen if m is not None]

    def adapter_root(self) -> str | None:
        """The attribute path of the one transformers model other tools load for this captioner (BLIP's, a VLM's),
        under which a LoRA run also saves one peft adapter for the whole model (``adapter/``); ``None`` (the
        default): there is none (ClipCap's language model alone has its standard adapter, ``lm_lora/``)."""
        return None

    def adapter_modules_to_save(self) -> tuple[str, ...]:
        """Modules (paths under :meth:`adapter_root`) trained fully beside the adapters, which the whole-model adapter
        carries as peft's ``modules_to_save`` (a VLM's projector)."""
        return ()

    def dual_encoder(self) -> VisionEncoder | None:
        """The dual encoder read from outside the folder (ClipCap's encoder, the world BLIP's / VLM's image tokens),
        saved into the folder only when it trains or was read from one (:attr:`dual_in_checkpoint`); ``None`` when the
        backbone brings its own vision side."""
        return None

    # ================================================================================================================
    # What the base owns
    # ================================================================================================================

    @property
    def device(self) -> torch.device:
        """Where the weights are (batches are moved there)."""
        return next(self.parameters()).device

    @property
    def pad_token_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    @property
    def eos_token_id(self) -> int:
        """The token that ends a caption: the last token of every training target (the collator's,
        :func:`finecap.data.datasets.model_collator`), the first of :attr:`end_token_ids` and the EOS that SMILE's
        ``smile.include_eos`` reads; the tokenizer's EOS unless a backbone says otherwise (a VLM: the token that ends
        an assistant turn in its chat template)."""
        return int(self.tokenizer.eos_token_id)

    @property
    def end_token_ids(self) -> tuple[int, ...]:
        """Every token that ends a generated caption, :attr:`eos_token_id` first: that one alone unless a backbone
        says otherwise (a VLM adds the other stop tokens of its ``generation_config.eos_token_id``)."""
        return (self.eos_token_id,)

    caption_prefix: str = ""
    """Text a caption is tokenised after as a training target, merged into its first token (a VLM's chat template may
    write a space between the generation prompt and the answer: :attr:`finecap.models.vlm.Vlm.caption_prefix`);
    ``""`` for ClipCap and BLIP. Decoded captions are stripped (:func:`finecap.decode.texts_of`)."""

    first_token_unshift: Mapping[int, int | None] | None = None
    """How the first token of each decoded caption is written in its text (:func:`finecap.decode.texts_of`:
    ``{id: id written instead, or None: left out}``): set from :attr:`first_token_shift` for a captioner whose weights
    start their captions with SMILE's shift token (:func:`finecap.models.first_token.decode_unshifted`); ``None`` (the
    default): captions as decoded. finecap's decoder and the vLLM engine both read it."""

    first_token_shift: dict[str, Any] | None = None
    """What these weights were trained to put first in every caption (SMILE's first-token shifting,
    :func:`finecap.models.first_token.shift_of`): ``{"form": "token", "token_id": id}`` or ``{"form": "subword"}``;
    ``None``: a caption's own first word. :meth:`save` records it in ``captioner.json`` (:data:`SHIFT_KEY`, only when
    set) and :meth:`from_checkpoint` reads it back, so it travels with the weights to every later loader, export and
    run started from them; :func:`finecap.models.first_token.decode_unshifted` turns it into
    :attr:`first_token_unshift`."""

    checkpoint_meta: dict[str, Any] | None = None
    """The ``captioner.json`` of the checkpoint folder :meth:`from_checkpoint` loaded these weights from, as read with
    them (``None``: a captioner built, not loaded). What is taken of the checkpoint after the load comes from here, not
    from the folder read again, which a run still training may have replaced since (a run started from it records its
    start's encoder so: :func:`finecap.train.fingerprint.captioner_fingerprint`)."""

    def stop_token_ids(self, stop_at_period: bool = False) -> list[int]:
        """The tokens decoding stops at: :attr:`end_token_ids` and, with ``decode.stop_at_period``, the tokenizer's
        period tokens (:func:`finecap.decode.stop_token_ids`), :attr:`eos_token_id` first. finecap's decoder, the
        vLLM engine and the saved ``generation_config.json`` all read these."""
        return stop_token_ids(self.tokenizer, stop_at_period, self.end_token_ids)

    @property
    def max_caption_tokens(self) -> int | None:
        """The longest caption (tokens, stop token included) after the conditioning; ``None``: per batch."""
        return None

    def lora_module(self, part: str) -> nn.Module | None:
        """The module LoRA wraps for ``part`` (:data:`PARTS`), ``None`` when the captioner has no such part."""
        if part not in PARTS:
            raise ValueError(f"unknown captioner part {part!r}; valid: {', '.join(PARTS)}")
        path = self.part_path(part)
        return None if path is None else module_path(self, path)

    def set_lora_module(self, part: str, module: nn.Module) -> None:
        """Put ``module`` (the part wrapped in a ``PeftModel``, or unwrapped again) in ``part``'s place."""
        path = self.part_path(part)
        if path is None:
            raise ValueError(f"this {self.kind} has no {part!r} part")
        set_module_path(self, path, module)

    def part_state(self, state: dict[str, torch.Tensor], part: str) -> dict[str, torch.Tensor]:
        """The entries of ``state`` (the captioner's state dict) belonging to ``part``, relative to its module."""
        path = self.part_path(part)
        return {} if path is None else strip_prefix(state, path + ".")

    def train(self, mode: bool = True) -> CaptionerBase:
        """nn.Module's ``train``, keeping :meth:`frozen_modules` in eval mode (no dropout in what does not learn)."""
        super().train(mode)
        for module in self.frozen_modules():
            module.eval()
        return self

    vocab_chunk_elements: int = VOCAB_CHUNK_ELEMENTS
    """Logits per chunk when :attr:`scores_in_chunks` (:func:`finecap.models.captioner.chunked_token_scores`)."""

    @property
    def trains_in_chunks(self) -> bool:
        """Whether this captioner's training scores given sequences in vocabulary chunks (:attr:`scores_in_chunks`
        while training): gradient checkpointing is on (``train.gradient_checkpointing``: the memory lever that
        trades compute for activations covers the head too) and the backbone has an :meth:`output_head`."""
        return memory.gradient_checkpointing(self) and self.output_head() is not None

    @property
    def scores_in_chunks(self) -> bool:
        """Whether :meth:`forward` scores given sequences through the vocabulary head in chunks of positions,
        recomputed one at a time in the backward pass, instead of holding their whole logits: while training with
        gradient enabled when :attr:`trains_in_chunks`. Objectives ask it through
        :func:`finecap.objectives.base.unwrap` (MLE then scores its captions as given sequences)."""
        return self.training and torch.is_grad_enabled() and self.trains_in_chunks

    @contextlib.contextmanager
    def _head_deferred(self, head: nn.Module) -> Iterator[None]:
        """Within: ``head`` is replaced by the identity in its parent module, so the backbone's forward returns the
        last hidden states ``(..., H)`` where it returned logits ``(..., V)``; restored on exit, errors too. The
        module's true path is found by identity (through peft wrappers, which forward attribute access but not
        assignment)."""
        path = next(name for name, module in self.named_modules() if module is head)
        set_module_path(self, path, nn.Identity())
        try:
            yield
        finally:
            set_module_path(self, path, head)

    def forward(
        self,
        batch: dict[str, Any],
        sequences: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        image_index: torch.Tensor | None = None,
        temperature: float = 1.0,
        with_entropy: bool = False,
        with_top: bool = False,
        chunks: bool | None = None,
    ) -> torch.Tensor | TokenScores:
        """The one differentiable entry point (module docstring).

        Without ``sequences``: teacher-forced logits ``(B, T, V)`` of ``batch['input_ids']``, ``logits[:, t]``
        predicting ``labels[:, t]``. With ``sequences (N, L)`` (e.g. sampled captions, stop token included, padded
        after it) and ``mask (N, L)`` (true up to and including the stop token; default all true): their per-token
        log-probs under ``softmax(logits / temperature)`` with gradient, 0 where ``mask`` is false, the
        next-token entropies when ``with_entropy`` and whether each token is the most likely one when ``with_top``.
        ``image_index (N,)`` maps rows to batch images (e.g. ``Generation.image_index``), so the image side runs
        once per image; without it row ``n`` is image ``n``. When ``chunks`` (default :attr:`scores_in_chunks`), the
        sequences' logits are never held whole (:func:`~finecap.models.captioner.chunked_token_scores`): the GRPO
        KL's reference pass, in eval mode without gradient, passes :attr:`trains_in_chunks`, so that it scores as
        the policy's training pass does (the same chunks: equal log-probs) and never holds the whole logits.
        """
        conditioning = self.scoring_conditioning(self.image_conditioning(batch))
        if sequences is None:
            return self.caption_logits(conditioning, batch["input_ids"], batch.get("attention_mask"))
        sequences = sequences.to(self.device)
        mask = torch.ones_like(sequences, dtype=torch.bool) if mask is None else mask.to(self.device)
        if not (self.scores_in_chunks if chunks is None else chunks):
            logits = self.sequence_logits(conditioning, sequences, mask, image_index)  # (N, L, V)
            return token_scores(logits, sequences, mask, temperature, with_entropy, with_top)
        head = self.output_head()
        with self._head_deferred(head):
            hidden = self.sequence_logits(conditioning, sequences, mask, image_index)  # (N, L, H): the head deferred
        return chunked_token_scores(head, hidden, sequences, mask, temperature, with_entropy, with_top,
                                    self.vocab_chunk_elements)  # fmt: skip

    @torch.no_grad()
    def generate(
        self,
        batch_or_conditioning: dict[str, Any] | Conditioning,
        decode_cfg: DecodeConfig | None = None,
        generator: torch.Generator | None = None,
        seeds: torch.Tensor | None = None,
    ) -> Generation:
        """Decode captions for a batch (cached ``features`` or pixel inputs) or for an :meth:`image_conditioning`.

        Runs in the module's current mode (call ``.eval()`` for deterministic decoding) in chunks of at most
        ``decode.batch_size`` sequences (images x beams or samples). ``seeds (B,)``: per-image sampling seeds
        (:func:`finecap.decode.sample`). See :mod:`finecap.decode` for strategies and the log-prob convention. The
        texts' first tokens are written as :attr:`first_token_unshift` says.
        """
        cfg = decode_cfg or DecodeConfig()
        x = batch_or_conditioning
        conditioning = self.image_conditioning(x) if isinstance(x, dict) else x
        if isinstance(conditioning, torch.Tensor):
            conditioning = conditioning.to(self.device)
        self.check_length(conditioning, cfg.max_length, "decode.max_length")
        stop_ids = self.stop_token_ids(cfg.stop_at_period)
        return decode(self, conditioning, cfg, self.tokenizer, generator, seeds, stop_ids, self.first_token_unshift)

    # ---- saving and loading -------------------------------------------------------------------------------------

    def config_dict(self) -> dict[str, Any]:
        """What :meth:`save` records in ``captioner.json``: the kind, the training flags and :meth:`own_config`."""
        return {"kind": self.kind, "train_encoder": self.train_encoder, "train_lm": self.train_lm,
                **self.own_config()}  # fmt: skip

    def save(self, out: str | Path, state_dict: dict[str, torch.Tensor] | None = None, masters: bool = True) -> Path:
        """Write a checkpoint folder: the backbone's own files (:meth:`save_weights`), a trained dual encoder
        (:meth:`dual_encoder`), LoRA adapters in peft's format (``lm_lora/``, ``encoder_lora/``), the float32 master
        weights of 16-bit trained weights, and ``captioner.json`` (what :meth:`config_dict` says, the adapters and the
        parts' dtypes). ``state_dict``: the weights to write (``accelerator.get_state_dict`` of a wrapped or sharded
        model; default: this module's own). ``masters``: write the float32 master weights (what a resume reads; an
        export, which is not resumed, writes none). Reload with :meth:`from_checkpoint`."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        state = self.state_dict() if state_dict is None else state_dict
        meta = self.config_dict()
        meta.update(self.save_weights(out, state))
        dual = self.dual_encoder()
        if dual is not None:
            meta[self.DUAL_SAVED_KEY] = bool(self.train_encoder or self.dual_in_checkpoint)
            if meta[self.DUAL_SAVED_KEY]:
                lora.save_encoder(dual, out / self.DUAL_ENCODER_DIR, self.part_state(state, "encoder"))
        part_states = {p: self.part_state(state, p) for p in PARTS}
        meta["lora"] = lora.save_adapters(self, out, part_states)
        reproduces = self._adapter_reproduces()
        if meta["lora"] and reproduces:
            root = self.adapter_root()
            adapter = lora.save_whole_adapter(self, root, out, part_states, self.adapter_modules_to_save(),
                                              lora.plain_state(strip_prefix(state, root + ".")),
                                              meta.get("source", ""))  # fmt: skip
            if adapter is not None:
                meta["adapter"] = adapter
                meta["adapter_modules"] = sorted(self.adapter_modules_to_save())
        # the base weights saved here are the source's only when adapters alone (and the modules they carry) learned
        meta["base_changed"] = bool(self.base_changed or not reproduces or self.train_lm and "lm" not in meta["lora"])
        meta["dtypes"] = memory.part_dtypes(self)
        if self.first_token_shift is not None:  # absent otherwise: an unshifted captioner's file is as before
            meta[SHIFT_KEY] = dict(self.first_token_shift)
        if masters:
            memory.save_float32_masters(self, out, state)
        write_json(out / CONFIG_NAME, meta)
        return out

    def _adapter_reproduces(self) -> bool:
        """Whether one peft adapter on the base model reproduces this captioner: it has an :meth:`adapter_root` and
        no part learns without adapters (fully trained weights would be missing from an adapter)."""
        if self.adapter_root() is None or self.base_changed:
            return False
        if not self.inherited_modules <= set(self.adapter_modules_to_save()):
            return False  # a module an earlier stage trained fully, which this adapter would not carry
        flags = {"lm": self.train_lm, "encoder": self.train_encoder}
        return not any(on and not lora.is_peft(self.lora_module(p)) for p, on in flags.items())

    def save_plain_model(self, out: Path, state: dict[str, torch.Tensor]) -> None:
        """``save_pretrained`` of ``self.model`` (a backbone that wraps one transformers model: BLIP, a VLM) from the
        ``model.`` entries of ``state``, adapters' wrappers swapped out: the base weights, which transformers alone
        loads from ``out``."""
        with lora.plain_parts(self):
            self.model.save_pretrained(out, state_dict=lora.plain_state(strip_prefix(state, "model.")))

    @classmethod
    def from_checkpoint(cls, path: str | Path, load_encoder: bool = True, options: memory.LoadOptions | None = None,
                        encoder_at: str | None = None) -> CaptionerBase:  # fmt: skip
        """Load a folder written by :meth:`save`. ``load_encoder=False`` skips a frozen dual encoder the folder
        refers to (batches must then carry cached ``features``); ``encoder_at``: where that encoder is now, read
        instead when the local folder the checkpoint records is gone (a run or export copied to another machine;
        ``model.encoder`` when captioning); ``options``: dtype, attention and quantization of the
        loaded models (``model.*``; default float32). Adapters are loaded unmerged and trainable
        (:func:`finecap.models.lora.merge_lora` merges them). Loading is strict (:mod:`finecap.models.strict`): a
        weight file that does not fit the model exactly or holds NaN or infinity, and adapters that are not what
        ``captioner.json`` records or lie outside the folder, are a :class:`~finecap.runs.CheckpointError` naming the
        file."""
        path = Path(path)
        meta = cls.relocated_encoder(read_meta(path), encoder_at)
        model = cls.load_weights(path, meta, load_encoder, options or memory.LoadOptions())
        if meta.get("lora"):
            lora.load_adapters(model, path, meta["lora"])
        # the folder's base is the source's when it recorded so, or (written before the record) held a whole adapter
        model.base_changed = bool(meta.get("base_changed", "adapter" not in meta))
        model.inherited_modules = frozenset(meta.get("adapter_modules", ()))
        model.dual_in_checkpoint = bool(meta.get(cls.DUAL_SAVED_KEY))
        model.first_token_shift = recorded_shift(meta, path)
        model.checkpoint_meta = dict(meta)
        return model

    def loaded_setting_differences(self, cfg: Config) -> list[tuple[str, Any, Any]]:
        """``(option, the checkpoint's value, the configuration's)`` for each setting of this captioner's section that
        built its weights (its source, a world-tiny model's sizes), read from the loaded model itself, which ``cfg``
        sets otherwise: such a setting cannot apply to a checkpoint (``train.init_from``, ``--resume``), so the run is
        refused rather than record a value that did not train (:func:`finecap.models.backbones.check_loaded`).
        Default: none."""
        return []

    def apply_settings(self, cfg: Config) -> list[str]:
        """Make this captioner, loaded from a checkpoint, follow the settings of ``cfg`` that can change on trained
        weights (a world-tiny model's dropout: :func:`set_dropout`); returns ``"key=value"`` of each that changed the
        model (logged). Default: none."""
        return []

    @classmethod
    def setting_differences(cls, meta: dict[str, Any], cfg: Config) -> list[tuple[str, Any, Any]]:
        """``(option, the checkpoint's value, the configuration's)`` for each setting that shapes the backbone's
        weights which a checkpoint (``captioner.json``: ``meta``) records and ``cfg`` configures otherwise: a run
        starting from the checkpoint would train the checkpoint's model under a configuration naming another
        (:func:`finecap.models.backbones.check_backbone`). Default: none."""
        return []

    @classmethod
    def relocated_encoder(cls, meta: dict[str, Any], encoder_at: str | None) -> dict[str, Any]:
        """``meta`` (a ``captioner.json``) with its frozen dual encoder's source replaced by ``encoder_at`` when the
        source recorded is a local folder that no longer exists (logged); unchanged otherwise: an encoder still where
        the checkpoint says is the one it was trained with."""
        source = cls.external_encoder(meta)
        if not (source and encoder_at) or encoder_at == source:
            return meta
        if not Path(source).is_absolute() or Path(source).exists():
            return meta
        log.info("the frozen encoder %s the checkpoint records is gone: reading model.encoder=%s", source, encoder_at)
        return {**meta, cls.DUAL_SOURCE_KEY: encoder_at}

    @classmethod
    def external_encoder(cls, meta: dict[str, Any]) -> str | None:
        """The vision encoder a saved captioner loads from outside its folder, from its ``captioner.json``: the frozen
        dual encoder's source, ``None`` when the folder holds everything."""
        return None if meta.get(cls.DUAL_SAVED_KEY) else (meta.get(cls.DUAL_SOURCE_KEY) or None)

    # ---- the model card (finecap.train.model_card) ------------------------------------------------------------------

    @classmethod
    def base_models(cls, meta: dict[str, Any]) -> dict[str, str]:
        """What a saved captioner was built on, from its ``captioner.json``: ``{role: source}``, empty sources dropped
        by the card. Default: its ``source`` as the model and its dual encoder's source as the vision encoder."""
        return {"model": meta.get("source", ""), "vision encoder": meta.get(cls.DUAL_SOURCE_KEY, "")}

    @classmethod
    def transformers_loads(cls, meta: dict[str, Any]) -> bool:
        """Whether transformers alone loads the saved folder of this ``captioner.json`` as the captioner: a
        :attr:`TRANSFORMERS_CLASS` and no dual encoder (the world BLIP or VLM, which only finecap reads). The model
        card then says ``library_name: transformers`` and names the class (:meth:`card_lines`)."""
        return bool(cls.TRANSFORMERS_CLASS) and not meta.get(cls.DUAL_SOURCE_KEY)

    @classmethod
    def card_lines(cls, meta: dict[str, Any]) -> list[str]:
        """Markdown lines the model card adds to its "Loading" section after finecap's own: how other tools load the
        folder. Default: where :meth:`transformers_loads` it, its :attr:`TRANSFORMERS_CLASS` (base weights when
        ``captioner.json`` lists LoRA adapters, else the captioner's own: a merged export's) and the whole-model peft
        adapter (``captioner.json``'s ``adapter``) if any."""
        auto = cls.TRANSFORMERS_CLASS
        if not cls.transformers_loads(meta):
            return []
        # with adapters the folder's weights are those under them; without (a merged export, full fine-tuning) they
        # are the captioner's own
        weights = "base weights without adapters" if meta.get("lora") else "the captioner's weights; no adapter to add"
        lines = ["", f"The folder is also a plain transformers checkpoint (`{auto}.from_pretrained(folder)`, "
                 f"{weights})."]  # fmt: skip
        if meta.get("adapter"):
            adapter = meta["adapter"]
            lines += [f"`{adapter}/` is one peft LoRA adapter for the whole model: "
                      f"`PeftModel.from_pretrained({auto}.from_pretrained(base{dtype_argument(meta)}), "
                      f"\"{adapter}\")`."]  # fmt: skip
        return lines + shift_lines(meta)

    @classmethod
    def load_dual_encoder(cls, path: Path, meta: dict[str, Any], load_encoder: bool, dtype: Any,
                          encoder_cls: type[VisionEncoder]) -> VisionEncoder | None:  # fmt: skip
        """The dual encoder of a checkpoint (``encoder_cls`` from the folder when it was trained and saved, strictly,
        else from the source it refers to unless ``load_encoder`` is false, its weights checked to be finite);
        ``None`` when there is none to load."""
        if meta.get(cls.DUAL_SAVED_KEY):
            return encoder_cls.from_pretrained(path / cls.DUAL_ENCODER_DIR, dtype, checkpoint=True)
        source = meta.get(cls.DUAL_SOURCE_KEY)
        if not (source and load_encoder):
            return None
        if Path(source).is_absolute() and not Path(source).exists():  # else transformers reads it as a Hub id
            raise CheckpointError(
                f"{path / CONFIG_NAME}: the frozen encoder it refers to, {source}, is not there (moved, or the "
                "checkpoint came from another machine): finecap caption takes where it is now as model.encoder=PATH "
                "(Python: encoder_at=PATH, or load_encoder=False to use cached features); for other commands, copy "
                "or link the folder back to that path"
            )
        try:
            encoder = encoder_cls.from_pretrained(source, dtype)
        except OSError as e:
            raise OSError(
                f"{path / CONFIG_NAME}: cannot load the frozen encoder {source!r} it refers to ({e}); pass "
                "load_encoder=False to use cached features"
            ) from None
        strict.check_finite_weights(encoder, source)
        return encoder
