"""Decoder-only vision-language models (``model.kind=vlm``): every family of :data:`FAMILIES` (LLaVA, LLaVA-NeXT /
OneVision, Idefics2/3, SmolVLM2, Qwen2/2.5/3-VL, GLM-4V, InternVL, Gemma 3, Mistral 3) behind the captioner contract
(:class:`finecap.models.base.CaptionerBase`).

:class:`Vlm` wraps an ``AutoModelForImageTextToText`` and its ``AutoProcessor``, loaded by Hub name or local path
(``HuggingFaceTB/SmolVLM-256M-Instruct``, ``llava-hf/llava-1.5-7b-hf``, ``Qwen/Qwen2-VL-2B-Instruct``) or built from
small configs (:func:`finecap.models.presets.save_tiny_vlm`, for tests). Shapes, vocabulary, tokenizer, chat template
and image processing all come from the checkpoint.

**Prompt and caption.** Every image is captioned after the same chat prompt: a user turn holding the image and
``vlm.prompt`` (default ``Describe the image.``), rendered with the processor's chat template and its
generation prompt (``... Assistant:``), the image placeholder expanded by the processor to the model's image tokens;
where the template writes an empty reasoning block before every answer (Qwen3-VL-Thinking's ``\n</think>\n\n``
after a generation prompt ending ``<think>\n``: :func:`empty_reasoning`), the prompt ends with it, so that captions
are the answer, not the reasoning (docs/vlm.md#thinking-variants).
The caption is the assistant's answer: the caption tokens followed by the token that ends an assistant turn
(:attr:`Vlm.eos_token_id`: read from the chat template, the first token after an answer that is one of
``generation_config.eos_token_id``: ``<end_of_utterance>`` for SmolVLM, ``<|im_end|>`` for Qwen2-VL,
``<end_of_turn>`` for Gemma 3, whose tokenizer's EOS is ``<eos>``; else the special token the template ends an
answer with, added to the stop tokens and the model's ``generation_config``: Idefics3-8B-Llama3's
``<end_of_utterance>``; else the tokenizer's EOS, ``</s>`` for LLaVA-1.5, which must then be one of them: checked,
:func:`caption_end`). Decoding stops at it and at the model's other stop tokens (:attr:`Vlm.end_token_ids`), where
``generate`` stops. The collator
pre-processes images into ``prompt_ids`` / ``prompt_mask`` (left-padded, as ``generate`` pads a batch of prompts) plus
the family's image inputs (``pixel_values`` and ``pixel_attention_mask`` / ``image_grid_thw`` / ``image_sizes``); the
captions are the batch's ``input_ids`` as for every backbone.

**Masking.** ``forward`` runs the model on ``[prompt, caption[:-1]]`` and returns the logits of the caption positions
only (``logits_to_keep``), aligned with ``input_ids`` as for ClipCap and BLIP; prompt, image and padding tokens
therefore never enter a loss, a log-prob, an entropy or SMILE's vocabulary subset (which is drawn from the labels,
i.e. caption tokens). Padding: prompts are left-padded (masked), captions right-padded (labels -100).

**Positions.** Every call passes explicit ``position_ids``, computed as ``generate`` computes them: ``cumsum(mask) -
1`` over the prompt (text rope), or for Qwen2-VL's multimodal rope the model's own ``get_rope_index`` on the prompt
(temporal / height / width rows, plus the text row that ``generate`` prepends), caption token ``j`` then sitting at
``start + j`` (``+ rope delta`` on the rope rows). So teacher forcing, scoring and finecap's batched decoder see the
same positions as ``generate``, whatever the padding, and Qwen2-VL's cached ``rope_deltas`` are never relied on.

**The prompt pass is the model's own forward** (issue 62): ``start``, teacher forcing and the scoring of sampled
captions run the model's ``forward`` on the prompt ids with the family's image and per-token inputs
(:class:`Family`) and ``use_cache=True``, so image merging, Qwen3-VL's DeepStack, Gemma 3's bidirectional image
attention and rope are the model's; caption tokens are then fed from its ``DynamicCache`` at the positions above.
Teacher forcing is one own forward over prompt and caption (with or without gradient checkpointing); a batch where a
caption holds the image token (a sampled one can), which that forward would read as an image slot, is scored after
the prompt's cache instead, as sampled captions are. Only the world VLM scatters image features into the prompt
embeddings itself.

**Under gradient checkpointing** the sampled captions are still scored after one prompt pass per image: transformers
drops the KV cache of a checkpointed layer in training, so that pass and the captions' pass after it are checkpointed
by finecap (:func:`memory.checkpointing_with_cache`) over a cache that a layer's recomputation in the backward pass
reads without writing it twice (:class:`finecap.models.kvcache.PromptCache`); losses and gradients equal those of
the prompt repeated per caption, checkpointed or not (``tests/models/test_vlm_shared_prompt.py``;
docs/memory.md#the-prompt-shared-under-checkpointing).

**Decoding** runs the :class:`finecap.decode.Stepper` protocol: ``start`` pre-fills the cache with that prompt pass;
``step`` feeds one token per row with its position; ``select`` reorders cache rows for beams and samples. Greedy,
beam search and sampling equal ``generate`` on the same model and settings (tests).

**What trains** (``apply_trainable``): ``"lm"`` = the language model and its output head (``model.train_lm``),
``"encoder"`` = the vision tower (``model.train_encoder``), and the projector between them
(``vlm.train_projector``, default on: like ClipCap's mapper it learns whatever else does). LoRA adapters
(:mod:`finecap.models.lora`) wrap the language model and / or the vision tower; default targets per family
(:data:`FAMILIES`) are the attention and MLP projections of the language model (``q_proj``, ``k_proj``, ``v_proj``,
``o_proj``, ``gate_proj``, ``up_proj``, ``down_proj``: Llama, SmolLM2 and Qwen2 share these names) and of the vision
tower (CLIP / SigLIP: ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``, ``fc1``, ``fc2``; Qwen2-VL's ViT: ``qkv``,
``attn.proj``, ``fc1``, ``fc2``), never the projector (Qwen2-VL's ``visual.merger`` sits inside its vision tower
and is excluded by these names) nor the output head.

**Checkpoints** (:meth:`Vlm.save`): the model with ``save_pretrained`` (base weights, adapters' wrappers removed)
and the processor in the folder itself, so ``AutoModelForImageTextToText.from_pretrained(folder)`` and
``AutoProcessor.from_pretrained(folder)`` load a fine-tuned VLM outside finecap; LoRA adapters in peft's format
beside it (``lm_lora/`` on the language model, ``encoder_lora/`` on the vision tower, at the family's paths,
:attr:`Family.language_model`: ``PeftModel.from_pretrained(model.model.language_model, folder / "lm_lora")`` for
LLaVA or Qwen2-VL, ``model.model.text_model`` for SmolVLM / Idefics3); ``captioner.json`` (``"kind": "vlm"``, the
family, the prompt, what trains).

Processors load with :func:`finecap.models.processors.load_processor` (``AutoProcessor``, or Qwen2-VL's processor
class without its video processor where ``transformers`` cannot build one without ``torchvision``).

**World VLM** (``vlm.name=world-tiny``): pretrained VLM weights cannot be downloaded here, so the world VLM is a tiny
LLaVA-architecture model (:func:`finecap.models.presets.world_vlm`: a Llama-style language model with LLaVA-1.5's chat
template, random init) whose projector reads the *frozen world encoder's* image tokens
(:class:`finecap.models.blip.FeatureMapTokens`, 5 tokens of width 256 at the default world), as the world BLIP does;
LLaVA's ``vision_tower`` slot holds a placeholder without layers (never run). These tokens are few and frozen, so they
go through the feature cache (``cache_features``), and the prompt, whose number of image tokens is then fixed, is
built once. The checkpoint records the world encoder it reads, as ClipCap's and the world BLIP's do.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from PIL import Image
from torch import nn
from transformers import AutoModelForImageTextToText
from transformers.cache_utils import Cache

from finecap.config import VlmBackboneConfig
from finecap.config.paths import recorded_source
from finecap.data.images import ImageRefused
from finecap.models import lora, memory
from finecap.models.base import TEXT_TINY_SIZES, CaptionerBase, module_path, same_source
from finecap.models.captioner import encode_images, last_positions
from finecap.models.chat_templates import apply_chat_template
from finecap.models.image_budget import PIXEL_BOUNDS, budget_kwargs, check_limits, own_size, unsaved_options
from finecap.models.kvcache import LAYERED, PromptCache, cache_kwargs, prompt_shareable, returned_cache
from finecap.models.processors import load_processor
from finecap.models.tokenizer import ensure_pad_token
from finecap.models.vision import FeatureMapTokens, load_frozen_tokens, reached_parameters

if TYPE_CHECKING:
    from finecap.config import Config

KIND = "vlm"
SECTION_KEYS = ("prompt", "train_projector", "processor_kwargs", "image_max_pixels")
"""The ``vlm`` options a checkpoint records (``captioner.json``) and is rebuilt with (absent in an old one: the
section's defaults)."""
PROCESSOR_KEYS = ("processor_kwargs", "image_max_pixels")
"""The :data:`SECTION_KEYS` set on the processor when a VLM is built, which a run from its checkpoint cannot change
(:meth:`Vlm.loaded_setting_differences`)."""
WORLD_VLM = "world-tiny"
TINY = "tiny:"
"""``vlm.name=tiny:<family>``: a tiny random VLM of a supported family built here (:func:`finecap.models.tiny.
tiny_family`, heads vLLM's CPU attention takes), to try a family or vLLM offline (docs/vlm.md#tiny-models)."""

LM_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""LoRA's default targets in the language model of every family (Llama / SmolLM2 / Qwen2 projection names)."""
VIT_TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2")
"""LoRA's default targets in a CLIP or SigLIP vision tower (LLaVA, Idefics3)."""


# --------------------------------------------------------------------------------------------------------------------
# Families
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """A VLM family: where it keeps its parts (attribute paths from the ``...ForConditionalGeneration``), what its
    forward reads besides the prompt's ids and mask, and how its image inputs map to images. Adding a family is adding
    a row to :data:`FAMILIES` (``docs/architecture.md``); the prompt pass is the model's own forward, so merging image
    features, DeepStack, bidirectional image attention and rope stay the model's.

    Attributes:
        language_model: the decoder without its head (LoRA's ``"lm"`` part).
        vision: the vision tower (LoRA's ``"encoder"`` part).
        projector: the module from vision features to the language model's embeddings.
        more_projectors: other modules from vision features into the language model, trained with the projector
            (``vlm.train_projector``): Qwen3-VL's DeepStack mergers, which project intermediate vision layers into
            its first decoder layers.
        image_inputs: the processor outputs that the model's forward reads for the images.
        mrope: multimodal rope positions (``get_rope_index``: temporal / height / width rows), else 1-D positions.
        lm_targets, vision_targets: LoRA's default targets (names or dot-suffixes) in the two parts.
        token_inputs: processor outputs of one value per prompt token that the forward reads besides the ids and
            mask (Gemma 3's ``token_type_ids``: bidirectional attention among an image's tokens); caption tokens get 0.
        image_rows: how the image inputs hold the batch's images: ``"image"``, one row of every image input per image;
            ``"tokens"``, ``pixel_values`` rows in proportion to each image's image tokens (Qwen's patches,
            InternVL's tiles, Gemma 3's pan-and-scan crops), the other inputs one row per image.
        name: the family's name in the documentation.
        examples: checkpoints of the family (``vlm.name=...``).
        vllm: the architecture that vLLM's model registry serves the family by (documentation; ``""``: none).
        image_budget: how ``vlm.image_max_pixels`` maps to the family's processor options: a rule of
            :data:`finecap.models.image_budget.RULES` (``"pixels"``: Qwen's ``max_pixels``; ``"crops"``: SmolVLM's
            ``longest_edge`` / splitting; ``"grid"``: LLaVA-NeXT's grids; ``"tiles"``: InternVL's tiles; ...).
        processor_reads: image options that the family's processor reads from its image processor's own settings,
            not from the call, when it writes the image tokens (Idefics2's ``do_image_splitting``: 5 images' tokens
            per image): :class:`Vlm` sets them there too, so that the prompt's image tokens match the features.
        features_in_first_dtype: the model casts its image features to the dtype of its first parameter (the vision
            tower's) before scattering them into the prompt's embeddings (SmolVLM2 in ``transformers`` 5.24; the
            other families cast them to the embeddings' dtype): :func:`check_merge_dtypes`.
        one_token_fails: the model's forward fails on a batch of one image of one image token (Mistral 3 in
            ``transformers`` 5.24: ``get_image_features`` squeezes the image's single feature row away,
            "split_with_sizes expects split_sizes to sum exactly to ..."), and its processor has no minimum size to
            upscale such an image to: :func:`check_image_tokens` refuses the image.
        image_shapes: the image shapes the family's processor fails on, before any model runs: a rule of
            :data:`SHAPE_RULES` (``"pixtral"``: a side scaled to 0 pixels; ``"smart_resize"``: an aspect ratio over
            200), which :func:`check_image_shapes` refuses images by; ``""``: none known.
    """

    language_model: str
    vision: str
    projector: str
    image_inputs: tuple[str, ...]
    mrope: bool = False
    lm_targets: tuple[str, ...] = LM_TARGETS
    vision_targets: tuple[str, ...] = VIT_TARGETS
    token_inputs: tuple[str, ...] = ()
    image_rows: str = "image"
    name: str = ""
    examples: tuple[str, ...] = ()
    vllm: str = ""
    image_budget: str = "fixed"
    more_projectors: tuple[str, ...] = ()
    processor_reads: tuple[str, ...] = ()
    features_in_first_dtype: bool = False
    one_token_fails: bool = False
    image_shapes: str = ""

    @property
    def projectors(self) -> tuple[str, ...]:
        """Every module ``vlm.train_projector`` trains: :attr:`projector` and :attr:`more_projectors`."""
        return (self.projector, *self.more_projectors)


QWEN_VIT_TARGETS = ("qkv", "attn.proj", "fc1", "fc2")
"""LoRA's default targets in Qwen2-VL's ViT (its merger, the projector, is left out by these names)."""
GATED_VIT_TARGETS = ("attn.qkv", "attn.proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
"""LoRA's default targets in the gated-MLP ViTs of Qwen2.5-VL and GLM-4V (dot-suffixes: GLM-4V's merger also has a
``down_proj``)."""

FAMILIES: dict[str, Family] = {
    "llava": Family(
        "model.language_model", "model.vision_tower", "model.multi_modal_projector", ("pixel_values", "image_sizes"),
        name="LLaVA-1.5, Pixtral", examples=("llava-hf/llava-1.5-7b-hf", "mistral-community/pixtral-12b"),
        vllm="LlavaForConditionalGeneration", image_budget="edge", image_shapes="pixtral",
    ),
    "llava_next": Family(
        "model.language_model", "model.vision_tower", "model.multi_modal_projector", ("pixel_values", "image_sizes"),
        name="LLaVA-NeXT", examples=("llava-hf/llava-v1.6-mistral-7b-hf",), vllm="LlavaNextForConditionalGeneration",
        image_budget="grid",
    ),
    "llava_onevision": Family(
        "model.language_model", "model.vision_tower", "model.multi_modal_projector",
        ("pixel_values", "image_sizes", "batch_num_images"), name="LLaVA-OneVision",
        examples=("llava-hf/llava-onevision-qwen2-0.5b-ov-hf",), vllm="LlavaOnevisionForConditionalGeneration",
        image_budget="grid",
    ),
    "idefics2": Family(
        "model.text_model", "model.vision_model", "model.connector", ("pixel_values", "pixel_attention_mask"),
        name="Idefics2", examples=("HuggingFaceM4/idefics2-8b",), image_budget="splitting",
        processor_reads=("do_image_splitting",),
    ),
    "idefics3": Family(
        "model.text_model", "model.vision_model", "model.connector", ("pixel_values", "pixel_attention_mask"),
        name="SmolVLM, Idefics3", examples=("HuggingFaceTB/SmolVLM-256M-Instruct", "HuggingFaceM4/Idefics3-8B-Llama3"),
        vllm="Idefics3ForConditionalGeneration", image_budget="crops",
    ),
    "smolvlm": Family(
        "model.text_model", "model.vision_model", "model.connector", ("pixel_values", "pixel_attention_mask"),
        name="SmolVLM2", examples=("HuggingFaceTB/SmolVLM2-256M-Video-Instruct",),
        vllm="SmolVLMForConditionalGeneration", image_budget="crops", features_in_first_dtype=True,
    ),
    "qwen2_vl": Family(
        "model.language_model", "model.visual", "model.visual.merger", ("pixel_values", "image_grid_thw"),
        mrope=True, vision_targets=QWEN_VIT_TARGETS, image_rows="tokens", name="Qwen2-VL",
        examples=("Qwen/Qwen2-VL-2B-Instruct",), vllm="Qwen2VLForConditionalGeneration", image_budget="pixels",
        image_shapes="smart_resize",
    ),
    "qwen2_5_vl": Family(
        "model.language_model", "model.visual", "model.visual.merger", ("pixel_values", "image_grid_thw"),
        mrope=True, vision_targets=GATED_VIT_TARGETS, image_rows="tokens", name="Qwen2.5-VL",
        examples=("Qwen/Qwen2.5-VL-3B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct"),
        vllm="Qwen2_5_VLForConditionalGeneration", image_budget="pixels", image_shapes="smart_resize",
    ),
    "qwen3_vl": Family(
        "model.language_model", "model.visual", "model.visual.merger", ("pixel_values", "image_grid_thw"),
        mrope=True, vision_targets=("attn.qkv", "attn.proj", "mlp.linear_fc1", "mlp.linear_fc2"), image_rows="tokens",
        name="Qwen3-VL (DeepStack)", examples=("Qwen/Qwen3-VL-2B-Instruct", "Qwen/Qwen3-VL-8B-Instruct"),
        vllm="Qwen3VLForConditionalGeneration", image_budget="pixels", image_shapes="smart_resize",
        more_projectors=("model.visual.deepstack_merger_list",),
    ),
    "glm4v": Family(
        "model.language_model", "model.visual", "model.visual.merger", ("pixel_values", "image_grid_thw"),
        mrope=True, lm_targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj"),
        vision_targets=GATED_VIT_TARGETS, image_rows="tokens", name="GLM-4.1V",
        examples=("zai-org/GLM-4.1V-9B-Thinking",), vllm="Glm4vForConditionalGeneration", image_budget="frames",
        image_shapes="smart_resize_upscaled",
    ),
    "internvl": Family(
        "model.language_model", "model.vision_tower", "model.multi_modal_projector", ("pixel_values",),
        vision_targets=("q_proj", "k_proj", "v_proj", "projection_layer", "fc1", "fc2"), image_rows="tokens",
        name="InternVL 3 / 3.5 (transformers-native)", examples=("OpenGVLab/InternVL3-1B-hf",),
        vllm="InternVLForConditionalGeneration", image_budget="tiles",
    ),
    "gemma3": Family(
        "model.language_model", "model.vision_tower", "model.multi_modal_projector", ("pixel_values",),
        token_inputs=("token_type_ids",), image_rows="tokens", name="Gemma 3", examples=("google/gemma-3-4b-it",),
        vllm="Gemma3ForConditionalGeneration", image_budget="fixed",
    ),
    "mistral3": Family(
        "model.language_model", "model.vision_tower", "model.multi_modal_projector", ("pixel_values", "image_sizes"),
        vision_targets=LM_TARGETS, name="Mistral Small 3.1 / 3.2 (Pixtral vision)",
        examples=("mistralai/Mistral-Small-3.1-24B-Instruct-2503",), vllm="Mistral3ForConditionalGeneration",
        image_budget="edge", one_token_fails=True, image_shapes="pixtral",
    ),
}  # fmt: skip
"""The supported families by ``config.model_type`` (SmolVLM-256M/500M/2B-Instruct are ``idefics3``, SmolVLM2
``smolvlm``; Pixtral-12B is a ``llava``)."""

REFUSED: dict[str, tuple[str, str]] = {
    "blip-2": ("its language model reads a Q-Former's query tokens (an encoder-decoder or OPT reader)",
               "idefics2 (a resampler's queries into a decoder-only LM), or model.kind=blip"),
    "instructblip": ("its language model reads a Q-Former's query tokens", "idefics2, or model.kind=blip"),
    "mllama": ("its language model reads the image through cross-attention layers, not image tokens",
               "llava_next or qwen2_5_vl"),
    "florence2": ("it is an encoder-decoder (BART-style) model", "idefics3 (SmolVLM), or model.kind=blip"),
    "paligemma": ("it is a prefix-LM (bidirectional attention over image and prompt)",
                  "gemma3 (bidirectional attention among an image's tokens only)"),
}  # fmt: skip
"""Designs finecap refuses by ``model_type``: (the reason, the nearest supported family)."""

UNQUANTIZED = tuple(sorted({p for f in FAMILIES.values() for p in (f.vision, f.projector)} | {"lm_head"}))
"""What ``model.quantization`` leaves unquantised in every family: the vision tower, the projector and the output
head (module prefixes; the quantized part is the language model, as in LLaVA's QLoRA)."""


def family_of(config: Any, source: str = "") -> Family:
    """The :class:`Family` of a model config (its ``model_type``); an unsupported or refused type is one line naming
    ``vlm.name``, the reason and the nearest supported family."""
    model_type = getattr(config, "model_type", None) if not isinstance(config, dict) else config.get("model_type")
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    name = source or model_type
    if model_type in REFUSED:
        reason, nearest = REFUSED[model_type]
        raise ValueError(f"vlm.name={name}: model_type {model_type!r} is not supported: {reason}; nearest supported "
                         f"family: {nearest}")  # fmt: skip
    raise ValueError(
        f"vlm.name={name}: model_type {model_type!r} is not a supported VLM family; "
        f"supported: {', '.join(sorted(FAMILIES))}"
    )


def check_family(name: str) -> Family:
    """The family of the checkpoint ``name`` (Hub name or folder) from its ``config.json`` alone, before any weight or
    processor is read: an unsupported or refused ``model_type``, or one that exists only as remote code (finecap runs
    none), is one line naming ``vlm.name``."""
    from transformers import PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    try:
        config, _ = PretrainedConfig.get_config_dict(name)
    except OSError as e:
        raise OSError(f"vlm.name={name}: cannot load the VLM or its processor: {e}") from None
    model_type = config.get("model_type")
    if model_type not in CONFIG_MAPPING_NAMES and model_type not in FAMILIES and model_type not in REFUSED:
        remote = (
            " and exists only as remote code (auto_map); finecap runs no remote code" if "auto_map" in config else ""
        )
        raise ValueError(
            f"vlm.name={name}: model_type {model_type!r} is not a transformers model{remote}; nearest supported "
            "families: qwen2_5_vl, internvl (InternVL's -hf checkpoints), idefics3"
        )
    return family_of(config, name)


FULLY_TESTED = ("idefics3", "llava", "qwen2_vl")
"""The families on which every objective (MLE, SMILE, REINFORCE, SLE, SR-L / SR-V / SR-LV) has its own test
(``tests/models/test_vlm_objectives.py``); every family passes the family contract
(``tests/models/test_vlm_families.py``) and ``coco/grpo_cider_vlm`` from a saved folder
(``tests/train/test_vlm_recipe_families.py``), and shares that code."""

FAMILY_TABLE_BEGIN = "<!-- family table: generated by finecap.models.vlm.family_table(); do not edit -->"
FAMILY_TABLE_END = "<!-- end of the family table -->"


def family_table() -> str:
    """The Markdown table of docs/vlm.md (between :data:`FAMILY_TABLE_BEGIN` and :data:`FAMILY_TABLE_END`): every
    supported family of :data:`FAMILIES` and every refused one of :data:`REFUSED`, generated here so the page and the
    code cannot disagree (``tests/models/test_vlm_families.py``)."""

    def code(items: Sequence[str]) -> str:
        return ", ".join(f"`{x}`" for x in items)

    lines = [
        "| family | `model_type` | checkpoints (examples) | supported in finecap | forward reads besides ids and "
        "mask | `vlm.image_max_pixels` rule | vLLM architecture |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for model_type, f in sorted(FAMILIES.items()):
        supported = "family contract; coco/grpo_cider_vlm from a folder" + (
            "; every objective (test_vlm_objectives)" if model_type in FULLY_TESTED else ""
        )
        reads = code([*f.image_inputs, *f.token_inputs]) + (", multimodal rope positions" if f.mrope else "")
        vllm = f"`{f.vllm}`" if f.vllm else "not in vLLM's registry"
        budget = f"`{f.image_budget}`"
        lines.append(f"| {f.name} | `{model_type}` | {code(f.examples)} | {supported} | {reads} | {budget} | {vllm} |")
    for model_type, (reason, nearest) in sorted(REFUSED.items()):
        lines.append(f"| refused | `{model_type}` | | no: {reason} | nearest: {nearest} | | |")
    return "\n".join([FAMILY_TABLE_BEGIN, *lines, FAMILY_TABLE_END])


def check_processor_kwargs(processor: Any, kwargs: dict[str, Any]) -> None:
    """An error naming the key and the valid ones unless the image processor takes each of ``kwargs``
    (``vlm.processor_kwargs``; its ``valid_kwargs``): transformers would ignore a misspelt ``max_pixel`` silently."""
    image_processor = getattr(processor, "image_processor", None)
    valid = sorted(getattr(getattr(image_processor, "valid_kwargs", None), "__annotations__", {}))
    unknown = [k for k in kwargs if valid and k not in valid]
    if unknown:
        raise ValueError(
            f"vlm.processor_kwargs: {unknown[0]!r} is not an argument of {type(image_processor).__name__}; "
            f"valid: {', '.join(valid)}"
        )


def processor_call_kwargs(processor: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``vlm.processor_kwargs`` as transformers 5 wants them in a processor call: ``max_pixels`` / ``min_pixels``
    moved into ``size`` (``longest_edge`` / ``shortest_edge``) when the image processor's size has those keys, so the
    budget is the same and no deprecation warning is printed at every batch; a ``size`` (given, or made so) completed
    with the processor's own keys (Qwen2-VL refuses a size without both edges); anything else unchanged. Older
    checkpoints recording ``max_pixels`` thus caption as before."""
    size = getattr(getattr(processor, "image_processor", None), "size", None)
    try:  # a dict, or transformers 5's SizeDict (its unset keys left out)
        size = {k: v for k, v in dict(size).items() if v is not None}
    except (TypeError, ValueError):
        size = {}
    given = kwargs.get("size") if isinstance(kwargs.get("size"), dict) else None
    bounds = {k: v for k, v in kwargs.items() if k in PIXEL_BOUNDS and set(PIXEL_BOUNDS.values()) <= set(size)}
    if not bounds and given is None:
        return dict(kwargs)
    merged = {**size, **(given or {}), **{PIXEL_BOUNDS[k]: v for k, v in bounds.items()}}  # a size is whole
    return {**{k: v for k, v in kwargs.items() if k not in bounds}, "size": merged}


def processor_before_weights(name: str, section: VlmBackboneConfig | None) -> Any:
    """What is checked of a checkpoint before its weights are read: its family (``config.json``,
    :func:`check_family`), its processor (built, or one line naming what it lacks) and ``vlm.processor_kwargs`` /
    ``vlm.image_max_pixels`` against it (:func:`processor_options`). Returns the processor."""
    family = check_family(name)
    try:
        processor = load_processor(name)
    except OSError as e:
        raise OSError(f"vlm.name={name}: cannot load the VLM or its processor: {e}") from None
    except (ImportError, TypeError) as e:  # a processor piece that needs a package not installed here
        first = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise ValueError(f"vlm.name={name}: cannot build its processor: {first}") from None
    from transformers import PretrainedConfig

    processor_options(family, processor, section or VlmBackboneConfig(), PretrainedConfig.get_config_dict(name)[0])
    return processor


def processor_options(family: Family, processor: Any, section: VlmBackboneConfig,
                      config: Any = None) -> dict[str, Any]:  # fmt: skip
    """The options of every processor call: ``vlm.image_max_pixels`` mapped by the family's rule
    (:attr:`Family.image_budget`, :mod:`finecap.models.image_budget`) under ``vlm.processor_kwargs``, whose keys win;
    both checked against the image processor, and their bounds against each other and the processor's own
    (:func:`finecap.models.image_budget.check_limits`: a lower bound over an upper one is an error naming both), and
    the budget against the model's ``config`` (:func:`check_image_budget`: one that would refuse every image; not
    without a ``config``)."""
    check_processor_kwargs(processor, section.processor_kwargs)
    budget, given = section.image_max_pixels, section.processor_kwargs
    if config is not None:
        check_image_budget(family, config, budget, given)
    options = budget_kwargs(family.image_budget, processor, budget, given)
    check_processor_kwargs(processor, options)
    check_limits(processor, budget, budget_kwargs(family.image_budget, processor, budget, {}), given,
                 processor_call_kwargs(processor, options))  # fmt: skip
    return options


ANSWER_MARKER = "a red circle"
"""The assistant answer :func:`answer_context` renders to find what the chat template writes around an answer."""


def answer_context(processor: Any, messages: list[dict[str, Any]], prompt_text: str) -> tuple[str, str]:
    """What the chat template writes around an assistant answer: ``(before, after)``, the text between the generation
    prompt (``prompt_text``, rendered from ``messages``) and the answer, and the text after the answer (the end of the
    assistant turn: ``"<end_of_turn>\n"`` for Gemma 3), from ``messages`` followed by an assistant turn holding
    :data:`ANSWER_MARKER` as a list of text parts, or as plain text where the template prints that list as it is
    (GLM-4.1V's writes an assistant's ``content`` unread: the list's Python repr, ``[{'type': 'text', ...}]``, would
    frame the answer). ``("", "")`` where the template does not render that conversation or the answer."""
    parts = [{"type": "text", "text": ANSWER_MARKER}]
    for content in (parts, ANSWER_MARKER):
        try:
            full = apply_chat_template(processor, [*messages, {"role": "assistant", "content": content}],
                                       tokenize=False)  # fmt: skip
        except ValueError:  # a template that refuses an assistant turn: the tokenizer's EOS ends captions
            return "", ""
        if content is not parts or str(parts) not in full:  # the list printed as it is: the template reads text
            break
    at = full.find(ANSWER_MARKER, len(prompt_text) if full.startswith(prompt_text) else 0)
    if at < 0:
        return "", ""
    before = full[len(prompt_text) : at] if full.startswith(prompt_text) else ""
    return before, full[at + len(ANSWER_MARKER) :]


REASONING_TAGS = ("<think>", "</think>")
"""The tags of a reasoning ("thinking") block that a chat template writes before the answer."""


def empty_reasoning(before: str) -> bool:
    """Whether ``before`` (what the chat template writes between the generation prompt and the answer,
    :func:`answer_context`) closes an empty reasoning block: ``</think>`` with nothing but white space and
    ``<think>`` around it. Qwen3-VL-Thinking's generation prompt opens ``<think>\n`` for the model to reason in and its
    template writes ``\n</think>\n\n`` before every final answer, so :class:`Vlm` ends the prompt with that block
    (:meth:`Vlm._render_prompt`): captions are then trained and decoded as the answer, where the template puts it,
    not as the reasoning."""
    rest = before
    for tag in REASONING_TAGS:
        rest = rest.replace(tag, "")
    return REASONING_TAGS[1] in before and not rest.strip()


def answer_prefix(tokenizer: Any, prompt_text: str, before: str, answer: str = ANSWER_MARKER) -> str:
    """The text a caption is tokenised after as a training target (:attr:`Vlm.caption_prefix`), so that its tokens
    are the ones the chat format gives the answer: ``before`` (what the template writes between the generation prompt
    and the answer, :func:`answer_context`: SmolVLM's space after ``Assistant:``, which a byte-level BPE merges into
    the first word, ``Ġa``) when the answer's tokens after ``prompt_text`` are those of ``before + answer``; else
    ``""`` (the answer alone: a SentencePiece tokenizer's ``▁a`` already, a prompt ending in a newline). Only white
    space merged into the answer's tokens (as many as the answer's alone) is a prefix: a template writing other text
    there (the tiny Mistral 3's ``[INST]`` for every role) would put tokens of its own into every caption target."""
    if not before or not before.isspace():
        return ""

    def ids(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    prompt, full = ids(prompt_text), ids(prompt_text + before + answer)
    chat = full[len(prompt) :] if full[: len(prompt)] == prompt else None
    merged = ids(before + answer)
    return (
        before
        if chat is not None and merged == chat and ids(answer) != chat and len(merged) == len(ids(answer))
        else ""
    )


def model_stop_tokens(model: Any) -> list[int]:
    """The model's stop tokens, ``generation_config.eos_token_id`` as a list (``[]``: none set)."""
    stops = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return [int(stops)] if isinstance(stops, int) else [int(t) for t in stops or []]


def caption_end(tokenizer: Any, after: str, stops: Sequence[int], source: str = "", before: str = "") -> int:
    """The token that ends a caption: the first token of ``after`` (what the chat template writes after an assistant
    answer, :func:`answer_context`) that is among the model's ``stops``; else, where the tokenizer's EOS is among
    ``stops`` and the answer continues the generation prompt (``before``, what the template writes between them, is
    white space), the special token the template ends the answer with when it is not among ``stops``
    (Idefics3-8B-Llama3's ``<end_of_utterance>``, its stops being Llama 3's EOS ids: :class:`Vlm` adds it to the stop
    tokens and to the model's ``generation_config``, so that captions end, and decoding stops, where the chat format
    ends an answer); else the tokenizer's EOS, which must then be among ``stops`` when there are any (one line naming
    ``vlm.name``), so that decoding stops where ``generate`` does."""
    ids = [int(t) for t in tokenizer(after, add_special_tokens=False)["input_ids"]] if after else []
    end = next((t for t in ids if t in stops), None)
    if end is not None:
        return end
    eos = tokenizer.eos_token_id
    turn_end = next((t for t in ids if tokenizer.decode([t]).strip()), None)  # the first token that is not a space
    if eos in stops and not before.strip() and turn_end in tokenizer.all_special_ids:
        return turn_end
    if stops and eos not in stops:
        raise ValueError(
            f"vlm.name={source}: the tokenizer's EOS {tokenizer.eos_token!r} (id {eos}) is not among the model's stop "
            f"tokens (generation_config.eos_token_id={list(stops)}), nor is a token the chat template writes after an "
            f"assistant answer ({after!r}); captions end with the token that ends an assistant turn"
        )
    return int(eos)


# --------------------------------------------------------------------------------------------------------------------
# The prompt and the decoding state
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class Prompt:
    """The conditioning of B rows: the chat prompt of each row's image, its positions and the image inputs.

    Attributes:
        ids: ``(B, P)`` prompt ids, image tokens expanded (left-padded).
        mask: ``(B, P)`` attention mask (0 on the left padding).
        positions: ``(B, P)`` 1-D positions, or ``(4, B, P)`` for multimodal rope (text row, then t / h / w).
        start: ``(B,)`` text position of the first caption token (the number of real prompt tokens).
        delta: ``(B,)`` multimodal-rope offset of caption tokens (0 for 1-D positions).
        embeds: ``(B, P, H)`` prompt embeddings with the image features in place: the world VLM only (its projector
            reads tokens from outside the model); ``None`` where the model's own forward reads ``ids`` and ``images``.
        tokens: the family's per-token inputs (:attr:`Family.token_inputs`), ``(B, P)`` each.
        images: the family's image inputs of the batch's images (not rows: :meth:`Vlm.row_images` selects them).
        rows: ``(B,)`` the image of each row.
        pixel_rows: ``(n_images,)`` ``pixel_values`` rows of each image (:attr:`Family.image_rows` ``"tokens"``).
    """

    ids: torch.Tensor
    mask: torch.Tensor
    positions: torch.Tensor
    start: torch.Tensor
    delta: torch.Tensor
    embeds: torch.Tensor | None = None
    tokens: dict[str, torch.Tensor] = field(default_factory=dict)
    images: dict[str, torch.Tensor] = field(default_factory=dict)
    rows: torch.Tensor | None = None
    pixel_rows: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.ids.shape[0]

    def __getitem__(self, index: torch.Tensor | slice) -> Prompt:
        """Rows of images (``index``: a slice or a ``(N,)`` index tensor, e.g. ``Generation.image_index``)."""
        positions = self.positions[:, index] if self.mrope else self.positions[index]
        return replace(self, ids=self.ids[index], mask=self.mask[index], positions=positions, start=self.start[index],
                       delta=self.delta[index], embeds=None if self.embeds is None else self.embeds[index],
                       tokens={k: v[index] for k, v in self.tokens.items()},
                       rows=None if self.rows is None else self.rows[index])  # fmt: skip

    @property
    def length(self) -> int:
        """P, the prompt's length (padding included)."""
        return self.ids.shape[1]

    @property
    def mrope(self) -> bool:
        return self.positions.ndim == 3

    def caption_positions(self, first: int, n: int) -> torch.Tensor:
        """Positions of caption tokens ``first .. first + n - 1``: ``(B, n)`` or ``(4, B, n)``."""
        return caption_positions(self.start, self.delta, self.mrope, first, n)


def caption_positions(start: torch.Tensor, delta: torch.Tensor, mrope: bool, first: int, n: int) -> torch.Tensor:
    """Positions of caption tokens ``first .. first + n - 1`` of rows whose first caption token sits at text position
    ``start (B,)`` (and rope offset ``delta (B,)``): ``(B, n)``, or ``(4, B, n)`` for multimodal rope."""
    text = start[:, None] + torch.arange(first, first + n, device=start.device)  # (B, n)
    if not mrope:
        return text
    rope = (text + delta[:, None])[None].expand(3, -1, -1)  # (3, B, n)
    return torch.cat([text[None], rope], dim=0)  # (4, B, n)


@dataclass
class DecodeState:
    """The Stepper state: the language model's KV cache, the attention mask so far ``(N, P + t)``, each row's
    ``start`` / ``delta`` (:class:`Prompt`) and the number ``t`` of caption tokens fed so far."""

    cache: Cache
    mask: torch.Tensor
    start: torch.Tensor
    delta: torch.Tensor
    mrope: bool
    t: int = 0


# --------------------------------------------------------------------------------------------------------------------
# The vision side
# --------------------------------------------------------------------------------------------------------------------


class VlmImages:
    """A VLM's ``encoder`` (:class:`finecap.models.captioner.ImageSide`): pre-processing through the processor (prompt
    ids and image inputs) and the vision tower's trainability. A view on the :class:`Vlm`, not a submodule."""

    def __init__(self, vlm: Vlm) -> None:
        self.vlm = vlm
        self._reached: frozenset[str] | None = None

    @property
    def model(self) -> nn.Module:
        return self.vlm.lora_module("encoder")

    @property
    def refuses_images(self) -> bool:
        """Whether :meth:`preprocess` may refuse an image (:func:`check_image_tokens`: the family's
        :attr:`Family.one_token_fails`; :func:`check_image_shapes`: a rule of :attr:`Family.image_shapes` that applies
        to this processor), so that ``data.skip_bad_images`` asks it about every image up front
        (:func:`finecap.data.datasets.refused_images`)."""
        vlm = self.vlm
        return vlm.family.one_token_fails or shape_check(vlm.family, vlm.processor, vlm.processor_kwargs) is not None

    @property
    def refuses_processed_images(self) -> bool:
        """Whether :meth:`preprocess` may refuse an image that :meth:`check_images` takes, by the processor's output
        (:func:`check_image_tokens`: the family's :attr:`Family.one_token_fails`, Mistral 3): where it is false,
        ``data.skip_bad_images`` asks :meth:`check_images` alone up front, and no image runs through the processor
        there (:func:`finecap.data.datasets.refused_images`)."""
        return self.vlm.family.one_token_fails

    def check_images(self, images: Sequence[Image.Image]) -> None:
        """Refuse, by its size alone and without the processor, an image :meth:`preprocess` refuses before its
        processor runs (:func:`check_image_shapes`): the same :class:`~finecap.data.images.ImageRefused`."""
        vlm = self.vlm
        check_image_shapes(vlm.family, vlm.processor, vlm.processor_kwargs, images)

    def preprocess(self, images: Sequence[Image.Image]) -> dict[str, torch.Tensor]:
        """PIL images -> ``prompt_ids`` / ``prompt_mask`` ``(B, P)`` (the chat prompt with the image tokens expanded,
        left-padded) and the family's image inputs (``pixel_values``, ...), with the checkpoint's processor: the ids
        of transformers' ``apply_chat_template(tokenize=True)`` (the tokenizer's special tokens added unless the
        rendered prompt starts with its BOS: :attr:`Vlm.prompt_special_tokens`). An image the model's forward cannot
        take is refused (:func:`check_image_shapes` before the processor runs, :func:`check_image_tokens` after it:
        :class:`~finecap.data.images.ImageRefused`, which the collator names the image in)."""
        images = [im.convert("RGB") for im in images]
        vlm = self.vlm
        self.check_images(images)  # before the processor fails on the image
        special = {} if vlm.prompt_special_tokens else {"add_special_tokens": False}  # a BOS the template wrote
        enc = vlm.processor(text=[vlm.prompt_text] * len(images), images=[[im] for im in images], padding=True,
                            return_tensors="pt", **special, **vlm.processor_kwargs)  # fmt: skip
        check_image_tokens(vlm.family, vlm.model.config, images, enc.get("image_sizes"))
        out = {"prompt_ids": enc["input_ids"], "prompt_mask": enc["attention_mask"]}
        out.update({k: enc[k] for k in (*vlm.family.image_inputs, *vlm.family.token_inputs) if k in enc})
        return out

    def image_parameters(self) -> list[nn.Parameter]:
        """The vision tower's parameters (its adapters' too) that what the language model reads from an image
        depends on: LLaVA reads a hidden layer (``vision_feature_layer``), so its tower's ``post_layernorm`` (and
        the layers after that layer) never reach the loss, nor does Gemma 3's or LLaVA-OneVision's SigLIP pooling
        head. Training those would count weights that never learn as trained (``--dry-run``) and stop a
        multi-process run at its second step (DDP: parameters that were not used in producing the loss). An
        adapter's parameters reach when its layer's weight does (:meth:`reached_names`)."""
        reached = self.reached_names()
        return [p for n, p in self.model.named_parameters() if p.is_floating_point() and _owner(n) in reached]

    def reached_names(self) -> frozenset[str]:
        """The plain tower's names (:func:`finecap.models.lora.plain_name`; adapters left out) of the weights the
        language model's inputs depend on. Found by the gradient of those inputs (its embeddings with the image
        features merged, Qwen3-VL's DeepStack features) for one blank image: finecap's prompt pass, stopped where
        the language model starts; in eval mode, so that no gradient checkpointing hides a weight. Probed once per
        captioner and kept: the answer depends only on the architecture and its config, not on the weights, the
        adapters or what trains. Not on the meta device (no forward runs there)."""
        if self._reached is not None:
            return self._reached
        vlm = self.vlm
        named = [(n, p) for n, p in self.model.named_parameters() if p.is_floating_point()]
        batch = self.preprocess([Image.new("RGB", (32, 32))])
        read: list[Any] = []

        def stop(_module: nn.Module, args: tuple, kwargs: dict) -> None:
            read.append((args, kwargs))
            raise _LanguageModelReached

        modes = [(m, m.training) for m in vlm.model.modules()]
        handle = module_path(vlm.model, vlm.family.language_model).register_forward_pre_hook(stop, with_kwargs=True)

        def run() -> Any:
            with contextlib.suppress(_LanguageModelReached):
                vlm.prompt_pass(vlm.prompt_of(batch), use_cache=False)
            if not read:
                raise RuntimeError(f"{vlm.family.name}: the model's forward never called its language model "
                                   f"({vlm.family.language_model})")  # fmt: skip
            return read[0]

        try:
            vlm.model.eval()
            ids = {id(p) for p in reached_parameters([p for _, p in named], run)}
        finally:
            handle.remove()
            for m, mode in modes:
                m.training = mode
        self._reached = frozenset(lora.plain_name(n) for n, p in named if id(p) in ids and "lora_" not in n)
        return self._reached

    def unreached_modules(self) -> frozenset[str] | None:
        """The plain tower's modules none of whose own weights the image features reach (:meth:`reached_names`):
        what LoRA leaves unadapted (:meth:`Vlm.lora_unreached`); ``None`` on the meta device, where no probe runs."""
        if any(p.is_meta for p in self.model.parameters()):
            return None
        return lora.unreached_modules(self.model, self.reached_names())

    def set_trainable(self, trainable: bool) -> None:
        """The vision tower (through its adapters when it has some) as far as the image features reach
        (:meth:`image_parameters`), or nothing."""
        lora.train_part(self.model, trainable)
        # on the meta device (a sharded run's other processes) no probe runs: the main process's flags are taken
        # (finecap.models.sharding.match_main)
        if trainable and not any(p.is_meta for p in self.model.parameters()):
            reached = {id(p) for p in self.image_parameters()}
            for p in self.model.parameters():
                if id(p) not in reached:
                    p.requires_grad_(False)


LEAVE_IT_OUT = "leave it out (data.skip_bad_images=true; finecap caption --skip-bad-images)"
"""How a refusal of an image (:func:`check_image_tokens`, :func:`check_image_shapes`) ends: the options that leave
such an image out."""


def check_image_tokens(family: Family, config: Any, images: Sequence[Image.Image],
                       image_sizes: torch.Tensor | None) -> None:  # fmt: skip
    """Refuse an image of one image token in a family whose forward fails on it (:attr:`Family.one_token_fails`:
    Mistral 3): an :class:`~finecap.data.images.ImageRefused` naming its size, its size after the processor and the
    smallest the family takes. The processor resizes an image to whole merge units of ``vision_config.patch_size x
    spatial_merge_size`` pixels (28 for Mistral Small 3.1, 8 for the tiny model) and the model counts an image's
    tokens as transformers' own split sizes, ``(height // unit) * (width // unit)`` of ``image_sizes`` (the processed
    sizes): an image both of whose sides are at most one unit after the processor's resize gives one. It is refused in
    any batch (the model fails only on a batch of that image alone, but which batch an image lands in, or which rows
    a step scores, is no reason for a run to pass or fail). ``images``: the processor's input (PIL), in order."""
    if not family.one_token_fails or image_sizes is None:
        return
    patch, merge = merge_unit(config)
    unit = patch * merge
    for k, (height, width) in enumerate(torch.as_tensor(image_sizes).tolist()):
        if (height // unit) * (width // unit) < 2:
            w, h = images[k].size
            raise ImageRefused(
                f"{w} x {h} pixels ({width} x {height} after the processor) gives {family.name} one image token, "
                f"which transformers' Mistral3Model.get_image_features fails on; it takes images with a side over "
                f"{unit} pixels after its processor's resize (patch_size={patch} x spatial_merge_size={merge}), and "
                f"its processor has no minimum size to upscale to: enlarge or pad the image, or {LEAVE_IT_OUT}",
                k,
            )


SMART_RESIZE_RATIO = 200
"""The largest aspect ratio transformers' ``smart_resize`` takes (Qwen2-VL's, Qwen2.5-VL's, Qwen3-VL's and GLM-4V's
image processors: "absolute aspect ratio must be smaller than 200")."""


def pixtral_shapes(processor: Any, options: dict[str, Any]) -> Callable[[int, int], str | None] | None:
    """Pixtral's resize (Mistral 3, Pixtral-12B as a LLaVA) scales an image's longest side down to
    ``size.longest_edge`` (``L``) pixels and the other side with it, ``floor(side / ratio)``: an image whose longer
    side is more than ``L`` times its shorter gets a side of 0 pixels, which transformers' resize fails on ("Size must
    contain 'height' and 'width'"). ``None`` for a processor that does not resize so (LLaVA-1.5's CLIP resize)."""
    size = options.get("size") if isinstance(options.get("size"), dict) else own_size(processor)
    if not size.get("longest_edge") or getattr(processor.image_processor, "patch_size", None) is None:
        return None
    edge = int(size["longest_edge"])

    def check(width: int, height: int) -> str | None:
        ratio = max(height / edge, width / edge)  # as transformers computes it
        if ratio <= 1 or min(math.floor(height / ratio), math.floor(width / ratio)) >= 1:
            return None
        return (f"its processor scales the longest side to {edge} pixels (size.longest_edge) and the shorter to 0, "
                "which transformers' Pixtral resize fails on; it takes images whose longer side is at most "
                f"{edge} times the shorter")  # fmt: skip

    return check


def smart_resize_shapes(processor: Any, options: dict[str, Any],
                        upscaled: bool = False) -> Callable[[int, int], str | None]:  # fmt: skip
    """transformers' ``smart_resize`` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) fails on an image whose longer side is more
    than :data:`SMART_RESIZE_RATIO` times its shorter; GLM-4V's (``upscaled``) first scales an image with a side under
    ``factor = patch_size x merge_size`` pixels up, ``int(side * factor / shortest)``, and checks that size."""
    image_processor = processor.image_processor
    factor = int(image_processor.patch_size) * int(getattr(image_processor, "merge_size", 1) or 1)

    def check(width: int, height: int) -> str | None:
        if upscaled and min(height, width) < factor:  # as GLM-4V's smart_resize computes it
            scale = max(factor / height, factor / width)
            height, width = int(height * scale), int(width * scale)
        if max(height, width) / min(height, width) <= SMART_RESIZE_RATIO:
            return None
        return (f"its processor ({type(image_processor).__name__}, transformers' smart_resize) fails on an aspect "
                f"ratio over {SMART_RESIZE_RATIO}:1; it takes images whose longer side is at most "
                f"{SMART_RESIZE_RATIO} times the shorter")  # fmt: skip

    return check


SHAPE_RULES: dict[str, Callable[[Any, dict[str, Any]], Callable[[int, int], str | None] | None]] = {
    "pixtral": pixtral_shapes,
    "smart_resize": smart_resize_shapes,
    "smart_resize_upscaled": functools.partial(smart_resize_shapes, upscaled=True),
}
"""The image shapes a family's processor fails on (:attr:`Family.image_shapes`), by name: ``rule(processor, call
options)`` -> ``check(width, height)``, what the family takes when it does not take that image (``None``: taken),
or ``None`` when the processor does not resize so."""


def shape_check(family: Family, processor: Any, options: dict[str, Any]) -> Callable[[int, int], str | None] | None:
    """The family's :data:`SHAPE_RULES` check for ``processor`` under the call ``options`` (``None``: no shape is
    refused)."""
    return SHAPE_RULES[family.image_shapes](processor, options) if family.image_shapes else None


def check_image_shapes(family: Family, processor: Any, options: dict[str, Any],
                       images: Sequence[Image.Image]) -> None:  # fmt: skip
    """Refuse, before the processor runs, an image whose shape the family's processor fails on
    (:attr:`Family.image_shapes`, :data:`SHAPE_RULES`): an :class:`~finecap.data.images.ImageRefused` naming its size,
    the family and the shapes it takes (the collator adds the image's name), so that ``data.skip_bad_images`` leaves
    it out instead of a transformers error in the middle of a run. ``options``: the processor call's."""
    check = shape_check(family, processor, options)
    if check is None:
        return
    for k, image in enumerate(images):
        w, h = image.size
        takes = check(w, h)
        if takes is not None:
            raise ImageRefused(
                f"{w} x {h} pixels: {family.name} cannot take it: {takes}: crop or pad the image, or {LEAVE_IT_OUT}",
                k,
            )


def merge_unit(config: Any) -> tuple[int, int]:
    """``(vision_config.patch_size, spatial_merge_size)`` of a model's config (the object, or ``config.json``'s dict):
    an image token covers a merge unit of ``patch_size x spatial_merge_size`` pixels on a side."""

    def get(obj: Any, key: str, default: Any = None) -> Any:
        return obj.get(key, default) if isinstance(obj, dict) else getattr(obj, key, default)

    return int(get(get(config, "vision_config"), "patch_size")), int(get(config, "spatial_merge_size", 1) or 1)


def check_image_budget(family: Family, config: Any, budget: int | None, given: dict[str, Any]) -> None:
    """Refuse, when the model is set up, a ``vlm.image_max_pixels`` under which a family whose forward fails on an
    image of one image token (:attr:`Family.one_token_fails`: Mistral 3) would refuse every image
    (:func:`check_image_tokens`): its ``"edge"`` rule caps the longest side at ``isqrt(budget)`` pixels, so a budget
    of one merge unit (``patch_size x spatial_merge_size`` pixels a side, from ``config``: the object or
    ``config.json``'s dict) or less leaves every image one token or none. A ``ValueError`` naming the option and the
    smallest value that works, ``(unit + 1) ** 2``; nothing when ``vlm.processor_kwargs`` (``given``) sets the
    longest side itself."""
    size = given.get("size")
    if not family.one_token_fails or budget is None or (isinstance(size, dict) and "longest_edge" in size):
        return
    patch, merge = merge_unit(config)
    unit = patch * merge
    side = math.isqrt(int(budget))
    if side <= unit:
        raise ValueError(
            f"vlm.image_max_pixels={budget}: {family.name} would resize every image to at most {side} pixels a side, "
            f"one image token or none, which its forward fails on (every image refused); the smallest value that "
            f"works is vlm.image_max_pixels={(unit + 1) ** 2} (a side over {unit} pixels: patch_size={patch} x "
            f"spatial_merge_size={merge})"
        )


def _owner(name: str) -> str:
    """The plain name of the weight a tower parameter stands for: its own (:func:`finecap.models.lora.plain_name`),
    or for an adapter's (``x.lora_A.default.weight``) its layer's ``x.weight``."""
    name = lora.plain_name(name)
    return name.split(".lora_", 1)[0] + ".weight" if ".lora_" in name else name


class _LanguageModelReached(Exception):
    """Stops :meth:`VlmImages.image_parameters`' forward where the language model would start."""


# --------------------------------------------------------------------------------------------------------------------
# The captioner
# --------------------------------------------------------------------------------------------------------------------


class Vlm(CaptionerBase):
    """A decoder-only VLM captioner. See the module docstring; build it with :meth:`build`,
    :meth:`from_pretrained` or :meth:`from_checkpoint`.

    Args:
        model: an ``AutoModelForImageTextToText`` of a supported family (:data:`FAMILIES`).
        processor: its processor (chat template, image processor, tokenizer).
        section: the ``vlm`` section (default: its defaults): ``prompt``, the user's text after the image;
            ``train_projector``; ``processor_kwargs``, keyword arguments of every processor call (the image-token
            budget, e.g. Qwen2-VL's ``max_pixels``, Idefics3's ``do_image_splitting``; checked against the
            processor here) over what ``image_max_pixels`` maps to by the family's rule (:func:`processor_options`;
            LLaVA-NeXT's grids are set on the processor and the model's config alike, Idefics2's splitting on its
            image processor: :attr:`Family.processor_reads`). Its ``name`` and ``tiny_*`` options built ``model``
            (:meth:`build`), not read here.
        train_encoder: train the vision tower.
        train_lm: train the language model and its head.
        source: where the model came from (recorded in checkpoints).
        world: the world VLM's image tokens (a frozen dual encoder's), read by the projector in place of the
            model's own vision tower (module docstring).
    """

    def __init__(
        self,
        model: nn.Module,
        processor: Any,
        section: VlmBackboneConfig | None = None,
        *,
        train_encoder: bool = False,
        train_lm: bool = True,
        source: str = "",
        world: FeatureMapTokens | None = None,
    ) -> None:
        super().__init__()
        self.section = section or VlmBackboneConfig()
        self.family = family_of(model.config, source)
        options = processor_options(self.family, processor, self.section, model.config)
        pinpoints = options.pop("image_grid_pinpoints", None)
        if pinpoints is not None:  # the processor counts image tokens and the model packs features by one list
            processor.image_processor.image_grid_pinpoints = pinpoints
            model.config.image_grid_pinpoints = pinpoints
        for key in self.family.processor_reads:  # the processor counts image tokens by these, not by the call's
            if key in options:
                setattr(processor.image_processor, key, options[key])
        self.processor_kwargs = processor_call_kwargs(processor, options)
        if world is not None and self.family is not FAMILIES["llava"]:
            raise ValueError(f"vlm.name={source}: world image tokens need a LLaVA-architecture model")
        self.world = world
        self.model = model
        self.processor = processor
        self.tokenizer = ensure_pad_token(processor.tokenizer)
        self.tokenizer.padding_side = "left"  # prompts are left-padded, as generate pads them
        self.image_token_id = int(model.config.image_token_id)
        self.source = source
        self._render_prompt()
        self.train_encoder = bool(train_encoder)
        self.train_lm = bool(train_lm)
        self._images = VlmImages(self)
        self.apply_trainable()
        self.train(self.training)

    def _render_prompt(self) -> None:
        """The chat prompt of ``section.prompt`` and what follows from it: the rendered text, whether the processor
        adds special tokens to it, the caption's prefix and end token (and the stop tokens of ``generate``)."""
        processor, model, source = self.processor, self.model, self.source
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": self.section.prompt}]}]
        if getattr(processor, "chat_template", None) is None:
            raise ValueError(f"vlm.name={source}: the processor has no chat template to build the prompt with")
        # rendered once, under bounds: a checkpoint's template is code (finecap.models.chat_templates)
        self.prompt_text = apply_chat_template(processor, messages, add_generation_prompt=True, tokenize=False)
        # whether the processor adds the tokenizer's special tokens to the rendered prompt: not when the template wrote
        # the BOS itself (Gemma 3's, Pixtral's {{ bos_token }}), as transformers' apply_chat_template(tokenize=True)
        # decides, so that the prompt holds one BOS
        bos = self.tokenizer.bos_token
        self.prompt_special_tokens = not (bos is not None and self.prompt_text.startswith(bos))
        stops = model_stop_tokens(model)
        before, after = answer_context(processor, messages, self.prompt_text)
        if empty_reasoning(before):  # the template's empty reasoning block before every answer ends the prompt
            self.prompt_text, before = self.prompt_text + before, ""
        self.caption_prefix = answer_prefix(self.tokenizer, self.prompt_text, before)
        self._eos = caption_end(self.tokenizer, after, stops, source, before)
        self._ends = (self._eos, *(t for t in stops if t != self._eos))
        if stops and self._eos not in stops:  # the template's turn end, added: generate and a saved folder stop there
            model.generation_config.eos_token_id = list(self._ends)
        self._fixed_prompt: dict[str, torch.Tensor] | None = None  # the blank image's prompt, made again when read

    # ------------------------------------------------------------------------------------------------------------
    # What it is
    # ------------------------------------------------------------------------------------------------------------

    kind = KIND
    TRANSFORMERS_CLASS = "AutoModelForImageTextToText"
    PIPELINE_TAG = "image-text-to-text"

    @property
    def eos_token_id(self) -> int:
        """The token that ends a caption: the one that ends an assistant turn in the chat template, among the model's
        stop tokens (:func:`caption_end`: Gemma 3's ``<end_of_turn>``, SmolVLM's ``<end_of_utterance>``, Qwen's
        ``<|im_end|>``) or added to them (Idefics3-8B-Llama3's ``<end_of_utterance>``), else the tokenizer's EOS."""
        return self._eos

    caption_prefix: str = ""
    """What the chat template writes between the generation prompt and the answer, where the answer's tokens in the
    chat format include it (:func:`answer_prefix`: SmolVLM's space with a byte-level BPE); ``""`` elsewhere. The
    collator tokenises each caption after it, so training targets are the tokens the chat format gives the answer."""

    @property
    def end_token_ids(self) -> tuple[int, ...]:
        """:attr:`eos_token_id`, then the model's other stop tokens (``generation_config.eos_token_id``): decoding
        stops where ``generate`` stops."""
        return self._ends

    @property
    def encoder(self) -> VlmImages | FeatureMapTokens:
        """The processor's pre-processing (prompt ids and image inputs), or the world VLM's image tokens."""
        return self.world if self.world is not None else self._images

    @property
    def cache_features(self) -> bool:
        """Only for the world VLM (5 frozen tokens per image); a VLM's own vision tower gives many tokens per image
        (and the prompt is built with them), so they are recomputed from the pixel inputs."""
        return self.world is not None

    @property
    def max_positions(self) -> int | None:
        value = getattr(self.model.config.get_text_config(), "max_position_embeddings", None)
        return int(value) if value else None

    @property
    def max_caption_tokens(self) -> None:
        """``None``: the prompt's length depends on the image (Qwen2-VL, Idefics3 with image splitting), so
        ``forward`` and ``generate`` check prompt + caption against the language model's positions per batch."""
        return None

    # ------------------------------------------------------------------------------------------------------------
    # What trains
    # ------------------------------------------------------------------------------------------------------------

    def part_path(self, part: str) -> str:
        """``"lm"``: the language model (without its head); ``"encoder"``: the vision tower (the world VLM: its dual
        encoder)."""
        if part == "encoder" and self.world is not None:
            return "world.model"
        return "model." + (self.family.language_model if part == "lm" else self.family.vision)

    def lora_default_targets(self, part: str) -> tuple[str, ...]:
        """The family's attention and MLP projections of the part (module docstring); for the world VLM's dual
        encoder every linear layer of its image side, as for ClipCap's."""
        if part == "encoder" and self.world is not None:
            return ()
        return self.family.lm_targets if part == "lm" else self.family.vision_targets

    def lora_unreached(self, part: str) -> frozenset[str] | None:
        """The tower's modules the image features never reach (:meth:`VlmImages.unreached_modules`); the world VLM's
        dual encoder's those its tokens never read (:meth:`CaptionerBase.lora_unreached`)."""
        if part == "encoder" and self.world is None:
            return self._images.unreached_modules()
        return super().lora_unreached(part)

    def apply_trainable(self) -> None:
        """``requires_grad``: the language model and head from ``train_lm``, the vision tower from ``train_encoder``
        (through their adapters when they have some), then the projector from ``train_projector``."""
        self.model.requires_grad_(False)
        lm = self.lora_module("lm")
        lora.train_part(lm, self.train_lm)
        if not lora.is_peft(lm):  # the head trains with a fully trained LM, never beside its adapters
            self.model.get_output_embeddings().requires_grad_(self.train_lm)
        if self.world is not None:  # the placeholder vision tower stays frozen; the text side of the world's too
            self.world.set_trainable(self.train_encoder)
        else:
            self._images.set_trainable(self.train_encoder)  # only what the image features reach
        for path in self.family.projectors:
            module_path(self.model, path).requires_grad_(self.section.train_projector)

    def frozen_modules(self) -> list[nn.Module]:
        """The parts whose flag is off, and the projectors unless ``vlm.train_projector``."""
        frozen = super().frozen_modules()
        if self.section.train_projector:
            return frozen
        return [*frozen, *(module_path(self.model, path) for path in self.family.projectors)]

    def dual_encoder(self) -> FeatureMapTokens | None:
        return self.world

    def adapter_root(self) -> str | None:
        """A VLM with its own vision tower is one transformers model: a LoRA run also saves one adapter for it (the
        world VLM reads tokens from outside it, so it has none)."""
        return "model" if self.world is None else None

    def adapter_modules_to_save(self) -> tuple[str, ...]:
        """The projectors when they train (``vlm.train_projector``); a list of them (Qwen3-VL's DeepStack mergers)
        as its members, the modules peft's ``modules_to_save`` can wrap."""
        if not self.section.train_projector:
            return ()
        out: list[str] = []
        for path in self.family.projectors:
            module = module_path(self.model, path)
            out += [f"{path}.{i}" for i in range(len(module))] if isinstance(module, nn.ModuleList) else [path]
        return tuple(out)

    def own_config(self) -> dict[str, Any]:
        return {
            "family": self.model.config.model_type,
            **{key: getattr(self.section, key) for key in SECTION_KEYS},
            "source": self.source,
            "world_source": self.world.source if self.world is not None else "",
        }

    # ------------------------------------------------------------------------------------------------------------
    # The prompt
    # ------------------------------------------------------------------------------------------------------------

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(ids.to(self.device))  # (B, T, H)

    def image_features(self, batch: dict[str, Any]) -> torch.Tensor:
        """The world VLM's projected image features ``(B*P, H)``, one row per image token of the batch's prompts,
        from its image tokens (cached ``features`` or computed from ``pixel_values``)."""
        tokens = encode_images(batch, self.world, self.train_encoder, self.device)  # (B, P, D)
        projector = module_path(self.model, self.family.projector)
        feats = projector(tokens.to(next(projector.parameters()).dtype))  # (B, P, H)
        return feats.reshape(-1, feats.shape[-1])  # (B*P, H)

    def prompt_of(self, batch: dict[str, Any]) -> Prompt:
        """The batch's :class:`Prompt`: the prompt ids with the family's image and per-token inputs, which the
        model's own forward reads (the world VLM: prompt embeddings with its image features scattered into the
        image-token slots), and ``generate``'s positions (module docstring)."""
        if "prompt_ids" in batch:
            ids = batch["prompt_ids"].to(self.device)  # (B, P)
            mask = batch["prompt_mask"].to(self.device)  # (B, P)
        elif self.world is not None:  # a fixed number of image tokens: the same prompt for every image
            n = len(batch["features"] if "features" in batch else batch["pixel_values"])
            fixed = self.fixed_prompt()
            ids, mask = (fixed[k].to(self.device).expand(n, -1) for k in ("prompt_ids", "prompt_mask"))
        else:
            raise ValueError(f"model.kind=vlm: the batch has no prompt_ids (keys: {sorted(batch)})")
        slots = ids == self.image_token_id  # (B, P)
        extra: dict[str, Any] = {}
        if self.world is not None:
            embeds = self.embed_tokens(ids)  # (B, P, H)
            feats = self.image_features(batch)  # (n, H)
            if int(slots.sum()) != feats.shape[0]:
                raise ValueError(f"VLM prompt: {int(slots.sum())} image tokens but {feats.shape[0]} image features")
            extra["embeds"] = embeds.masked_scatter(slots[..., None], feats.to(embeds.dtype))  # (B, P, H)
        else:
            images = {k: batch[k].to(self.device) for k in self.family.image_inputs if batch.get(k) is not None}
            if "pixel_values" not in images:
                raise ValueError(
                    f"model.kind=vlm: batches carry the processor's pixel inputs (keys: {sorted(batch)}); the "
                    "collator builds them with model.encoder.preprocess"
                )
            missing = [k for k in self.family.token_inputs if batch.get(k) is None]
            if missing:
                raise ValueError(f"model.kind=vlm: the {self.model.config.model_type} family's forward reads "
                                 f"{missing[0]!r}, which the batch lacks (keys: {sorted(batch)})")  # fmt: skip
            extra["tokens"] = {k: batch[k].to(self.device) for k in self.family.token_inputs}
            extra["images"], extra["rows"] = images, torch.arange(len(ids), device=self.device)
            if self.family.image_rows == "tokens":
                n_pixels, n_tokens = images["pixel_values"].shape[0], int(slots.sum())
                if n_tokens == 0 or n_pixels % n_tokens and n_tokens % n_pixels:
                    raise ValueError(f"VLM prompt: {n_tokens} image tokens for {n_pixels} pixel rows")
                extra["pixel_rows"] = slots.sum(1) * n_pixels // n_tokens  # (B,)
        text = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)  # (B, P), generate's positions
        start = mask.long().sum(-1)  # (B,)
        delta = torch.zeros_like(start)
        positions = text
        if self.family.mrope:
            rope_index = self.model.model.get_rope_index
            rope, deltas = rope_index(ids, mm_token_type_ids=slots.int(), image_grid_thw=batch["image_grid_thw"].to(
                self.device), attention_mask=mask)  # fmt: skip  # (3, B, P), (B, 1)
            positions = torch.cat([text[None], rope.to(text.dtype)], dim=0)  # (4, B, P): text row first, as generate
            delta = deltas.view(-1).to(start)
        return Prompt(ids, mask, positions, start, delta, **extra)

    def row_images(self, prompt: Prompt) -> dict[str, torch.Tensor]:
        """The image inputs of ``prompt``'s rows (the batch's own when the rows are its images in order), laid out as
        the processor lays out a batch of these images (:attr:`Family.image_rows`)."""
        rows, images = prompt.rows, prompt.images
        n = len(images["image_grid_thw"] if "image_grid_thw" in images else images["pixel_values"])
        if prompt.pixel_rows is not None:
            n = len(prompt.pixel_rows)
        if len(rows) == n and bool((rows == torch.arange(n, device=rows.device)).all()):
            return images
        out = {k: v[rows] for k, v in images.items() if k != "pixel_values"}
        pixels = images["pixel_values"]
        if prompt.pixel_rows is None:
            out["pixel_values"] = pixels[rows]
        else:  # each image's block of pixel rows, in the rows' order
            ends = prompt.pixel_rows.cumsum(0)  # (n_images,)
            index = torch.cat([torch.arange(int(ends[r]) - int(prompt.pixel_rows[r]), int(ends[r])) for r in rows])
            out["pixel_values"] = pixels[index.to(pixels.device)]
        return out

    def own_inputs(self, prompt: Prompt, n_more: int = 0) -> dict[str, Any]:
        """What the model's own forward reads besides ids, mask and positions for ``prompt``'s rows followed by
        ``n_more`` caption tokens: the image inputs and the per-token inputs (0 over caption tokens: text)."""
        tokens = {k: torch.cat([v, v.new_zeros(v.shape[0], n_more)], 1) for k, v in prompt.tokens.items()}
        return {**self.row_images(prompt), **tokens}

    def prompt_pass(self, prompt: Prompt, **kwargs: Any) -> Any:
        """The model's forward over the prompt (the world VLM: over its prompt embeddings); ``kwargs`` to the call
        (``use_cache``, ``logits_to_keep``)."""
        if prompt.embeds is not None:
            return self.model(inputs_embeds=prompt.embeds, attention_mask=prompt.mask, position_ids=prompt.positions,
                              **kwargs)  # fmt: skip
        return self.model(input_ids=prompt.ids, attention_mask=prompt.mask, position_ids=prompt.positions,
                          **self.own_inputs(prompt), **kwargs)  # fmt: skip

    def fixed_prompt(self) -> dict[str, torch.Tensor]:
        """The world VLM's prompt ``(1, P)`` (ids and mask), the same for every image: built once with the processor
        on a blank image of the world's size."""
        if self._fixed_prompt is None:
            crop = self.world.image_processor.crop_size
            blank = Image.new("RGB", (int(crop["width"]), int(crop["height"])))
            self._fixed_prompt = {k: v[:1] for k, v in self._images.preprocess([blank]).items()
                                  if k in ("prompt_ids", "prompt_mask")}  # fmt: skip
        return self._fixed_prompt

    def check_length(self, prompt: Prompt, n_tokens: int, what: str) -> None:
        limit = self.max_positions
        need = prompt.length + n_tokens - 1
        if limit is not None and need > limit:
            raise ValueError(
                f"a prompt of {prompt.length} tokens + {what}={n_tokens} needs {need} positions but the "
                f"language model has {limit}"
            )

    # ------------------------------------------------------------------------------------------------------------
    # Forward
    # ------------------------------------------------------------------------------------------------------------

    def image_conditioning(self, batch: dict[str, Any]) -> Prompt:
        """The batch's :class:`Prompt` (:meth:`prompt_of`): what decoding starts from and teacher forcing reads."""
        return self.prompt_of(batch)

    def output_head(self) -> nn.Module:
        """The model's ``lm_head``: the module :meth:`CaptionerBase.output_head` asks for."""
        return self.model.get_output_embeddings()

    def caption_logits(self, prompt: Prompt, input_ids: torch.Tensor,
                       attention_mask: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """Teacher-forced logits ``(B, T, V)`` of the caption ``input_ids (B, T)`` after the prompt: the model reads
        ``[prompt, caption[:-1]]`` and only the last T positions are kept (``logits[:, t]`` predicts ``input_ids[:,
        t]``; the prompt's last position predicts the first caption token)."""
        B, T = input_ids.shape
        if T < 1:
            raise ValueError("input_ids must hold at least one token (the EOS)")
        self.check_length(prompt, T, "caption length (data.max_tokens)")
        caption_mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        mask = torch.cat([prompt.mask, caption_mask[:, :-1].to(prompt.mask)], dim=1)  # (B, P+T-1)
        positions = torch.cat([prompt.positions, prompt.caption_positions(0, T - 1)], dim=-1)
        keep = last_positions(T, mask.shape[1], self.device)
        if prompt.embeds is None:
            # a masked caption position (padding after the EOS) is never read: given the EOS id, so that a padding id
            # that is an image token is not counted as an image slot
            text = input_ids[:, :-1].to(self.device).masked_fill(~caption_mask[:, :-1].to(self.device).bool(),
                                                                  self.eos_token_id)  # fmt: skip
            if bool((text == self.image_token_id).any()):
                # the own forward would read a caption's image token as an image slot: the caption is continued
                # from the prompt pass's cache instead (as generate reads it)
                rows = torch.arange(B, device=self.device)
                return self._shared_prompt_logits(prompt, rows, input_ids.to(self.device),
                                                  caption_mask.to(self.device))  # fmt: skip
            # one own forward over prompt and caption: the same operations with and without checkpointing, so that
            # checkpointing changes no value (tests/models/test_memory.py)
            ids = torch.cat([prompt.ids, text.to(prompt.ids)], dim=1)  # (B, P+T-1)
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False,
                             logits_to_keep=keep, **self.own_inputs(prompt, T - 1))  # fmt: skip
            return out.logits  # (B, T, V)
        tokens = self.embed_tokens(input_ids[:, :-1])  # (B, T-1, H)
        x = torch.cat([prompt.embeds.to(tokens.dtype), tokens], dim=1)  # (B, P+T-1, H)
        out = self.model(inputs_embeds=x, attention_mask=mask, position_ids=positions, use_cache=False,
                         logits_to_keep=keep)  # fmt: skip
        return out.logits  # (B, T, V)

    def sequence_logits(self, prompt: Prompt, sequences: torch.Tensor, mask: torch.Tensor,
                        image_index: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
        """Logits ``(N, L, V)`` of given sequences, rows mapped to images by ``image_index``: the vision tower runs
        once per image (:meth:`image_conditioning`), and so does the language model over each image's prompt
        (:meth:`_shared_prompt_logits`) when :meth:`shares_prompt` and some image has several sequences (with one
        sequence per image sharing saves nothing, and under checkpointing would keep the prompt's keys and values)."""
        if image_index is not None and self.shares_prompt() and len(image_index) > prompt.mask.shape[0]:
            return self._shared_prompt_logits(prompt, image_index.to(self.device), sequences, mask)
        return super().sequence_logits(prompt, sequences, mask, image_index)

    share_prompt: bool = True
    """Score the S sequences of an image after one pass over its prompt (:meth:`_shared_prompt_logits`); ``False``
    repeats the prompt for every sequence, as teacher forcing does (kept for tests and benchmarks to compare)."""

    def shares_prompt(self) -> bool:
        """Whether :meth:`forward` scores sequences after one prompt pass per image: :attr:`share_prompt`, with or
        without gradient checkpointing (:meth:`_shared_prompt_logits` checkpoints its passes itself); only with a
        ``transformers`` older than layered caches (:data:`finecap.models.kvcache.LAYERED`) does a model training
        under checkpointing repeat the prompt per sequence."""
        return self.share_prompt and prompt_shareable(self.training and memory.gradient_checkpointing(self))

    def _shared_prompt_logits(self, prompt: Prompt, image_index: torch.Tensor, sequences: torch.Tensor,
                              mask: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """Logits ``(N, L, V)`` of ``sequences (N, L)`` (row ``n`` after the prompt of image ``image_index[n]``),
        aligned as :meth:`caption_logits` gives them, with one language-model pass over each image's prompt: its
        KV cache (with gradient wherever the prompt has one: the projector's image features, LoRA on the language
        model) is repeated to the image's rows and only the caption tokens are run after it. The prompt's hundreds
        of image tokens are computed once per image instead of once per sample (SCST's S = 5: ~5x less prompt work);
        the result equals the per-sequence computation up to floating-point rounding
        (``tests/models/test_vlm_shared_prompt.py``). Under gradient checkpointing both passes are checkpointed by
        finecap over a :class:`~finecap.models.kvcache.PromptCache` (:func:`memory.checkpointing_with_cache`: the
        module docstring)."""
        N, L = sequences.shape
        self.check_length(prompt, L, "sampled caption length")
        last = last_positions(1, prompt.length, self.device)
        given = cache_kwargs(self.model, PromptCache(config=self.model.config)) if LAYERED else {}
        with memory.checkpointing_with_cache(self, by_hand=LAYERED):  # an older cache: checkpointing paused
            out = self.prompt_pass(prompt, use_cache=True, logits_to_keep=last, **given)  # once per image: (B, 1, V)
            first = out.logits[:, -1][image_index]  # (N, V): the prompt's last position predicts the first token
            if L == 1:
                return first[:, None]  # (N, 1, V)
            # (B, ...) prompt rows read as (N, ...) by the captions, differentiable (index_select)
            cache = returned_cache(out).read_rows(image_index) if LAYERED else returned_cache(out)
            if not LAYERED:
                cache.reorder_cache(image_index)
            rows = prompt[image_index]
            tokens = self.embed_tokens(sequences[:, :-1])  # (N, L-1, H)
            attention = torch.cat([rows.mask, mask[:, :-1].to(rows.mask)], dim=1)  # (N, P+L-1)
            positions = rows.caption_positions(0, L - 1)  # (N, L-1) or (4, N, L-1)
            rest = self.model(inputs_embeds=tokens, attention_mask=attention, position_ids=positions,
                              use_cache=True, **cache_kwargs(self.model, cache))  # fmt: skip
        return torch.cat([first[:, None], rest.logits], dim=1)  # (N, L, V)

    # ------------------------------------------------------------------------------------------------------------
    # Decoding (Stepper protocol)
    # ------------------------------------------------------------------------------------------------------------

    def start(self, prompt: Prompt) -> tuple[torch.Tensor, DecodeState]:
        """Pre-fill the language model's cache with the prompt; first-token logits ``(B, V)``."""
        last = last_positions(1, prompt.length, self.device)
        out = self.prompt_pass(prompt, use_cache=True, logits_to_keep=last)
        state = DecodeState(returned_cache(out), prompt.mask, prompt.start, prompt.delta, prompt.mrope)
        return out.logits[:, -1], state  # (B, V)

    def step(self, tokens: torch.Tensor, state: DecodeState) -> tuple[torch.Tensor, DecodeState]:
        """Feed one token per row ``(N,)`` at its position; next logits ``(N, V)``."""
        mask = torch.cat([state.mask, state.mask.new_ones(state.mask.shape[0], 1)], dim=1)  # (N, P+t+1)
        positions = caption_positions(state.start, state.delta, state.mrope, state.t, 1)  # (N, 1) or (4, N, 1)
        out = self.model(inputs_embeds=self.embed_tokens(tokens[:, None]), attention_mask=mask, position_ids=positions,
                         use_cache=True, **cache_kwargs(self.model, state.cache))  # fmt: skip
        return out.logits[:, -1], replace(state, cache=returned_cache(out), mask=mask, t=state.t + 1)  # (N, V)

    @staticmethod
    def select(state: DecodeState, index: torch.Tensor) -> DecodeState:
        """Keep / repeat / reorder rows of the cache, the mask and the prompt's positions."""
        index = index.to(state.mask.device)
        state.cache.reorder_cache(index)
        return replace(state, mask=state.mask[index], start=state.start[index], delta=state.delta[index])

    # ------------------------------------------------------------------------------------------------------------
    # Saving and loading
    # ------------------------------------------------------------------------------------------------------------

    def save_weights(self, out: Path, state: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The model (``save_pretrained``, base weights without adapters) and its processor in ``out`` itself:
        ``AutoModelForImageTextToText.from_pretrained(out)`` and ``AutoProcessor.from_pretrained(out)`` load it. The
        processor is saved with the run's image budget (``vlm.image_max_pixels``, ``vlm.processor_kwargs``: the call
        arguments finecap passes) as its image processor's own settings, so that a plain transformers load reads the
        images into as many tokens as the run did. An option the processor class's call defaults pass over those
        settings (:func:`finecap.models.image_budget.unsaved_options`: Gemma 3's ``do_pan_and_scan``) cannot be
        saved so: a warning names it (finecap's own load, which reads ``captioner.json``, still passes it)."""
        unsaved = unsaved_options(self.processor, self.processor_kwargs)
        if unsaved:
            given = ", ".join(f"{k}={v!r}" for k, v in unsaved.items())
            warnings.warn(
                f"vlm.processor_kwargs: {given}: {type(self.processor).__name__} passes its own default over the "
                f"saved image processor's setting, so a plain AutoProcessor.from_pretrained({out}) does not read "
                "images as this run did; pass the same to its calls (finecap's own load does)",
                stacklevel=2,
            )
        self.save_plain_model(out, state)
        image_processor = getattr(self.processor, "image_processor", None)
        kept = {k: getattr(image_processor, k) for k in self.processor_kwargs if hasattr(image_processor, k)}
        try:
            for key in kept:
                setattr(image_processor, key, self.processor_kwargs[key])
            self.processor.save_pretrained(out)
        finally:
            for key, value in kept.items():
                setattr(image_processor, key, value)
        return {}

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, options: memory.LoadOptions | None = None,
                        **kwargs: Any) -> Vlm:  # fmt: skip
        """An ``AutoModelForImageTextToText`` checkpoint (Hub name or folder) with its processor; ``options``: the
        weights' dtype (default float32), attention and quantization (``model.*``)."""
        name = str(name_or_path)
        options = options or memory.LoadOptions()
        processor = processor_before_weights(name, kwargs.get("section"))
        try:
            model = options.load(AutoModelForImageTextToText, name, f"vlm.name={name}", skip=UNQUANTIZED)
        except OSError as e:
            raise OSError(f"vlm.name={name}: cannot load the VLM or its processor: {e}") from None
        return cls(model, processor, source=recorded_source(name), **kwargs)

    @classmethod
    def build(cls, cfg: Config) -> Vlm:
        """A VLM captioner from ``cfg.model`` and ``cfg.vlm`` (``model.kind=vlm``): ``vlm.name`` loaded by Hub name or
        path with its processor, prompted with ``vlm.prompt``; ``vlm.name=world-tiny`` builds the world VLM (a LLaVA of
        ``vlm.tiny_*`` sizes, random init, over the image tokens of ``model.encoder``: ``world`` = the trained world
        encoder, or a dual-encoder path)."""
        m, v = cfg.model, cfg.vlm
        kwargs = dict(train_encoder=m.train_encoder, train_lm=m.train_lm)
        options = memory.LoadOptions.of(m)
        if v.name.startswith(TINY):
            return cls.tiny(v, options, **kwargs)
        if v.name != WORLD_VLM:
            return cls.from_pretrained(v.name, options, section=v, **kwargs)
        # deferred: the tiny presets (which import GPT-2, BLIP, CLIP and the retriever) build a fresh world VLM only;
        # a pretrained VLM and reading a checkpoint (its fingerprint, loading it) need none of them
        from finecap.models.presets import world_vlm

        world = load_frozen_tokens(cfg, options, f"vlm.name={WORLD_VLM}")
        image_size = int(world.image_processor.crop_size["height"])
        n_tokens, width = world.token_shape(image_size)
        positions = 64 + max(cfg.data.max_tokens, cfg.decode.max_length)  # the prompt (~25 tokens) and the caption
        model, processor = world_vlm(width, n_tokens, world.image_processor, layers=v.tiny_layers,
                                     hidden=v.tiny_hidden, heads=v.tiny_heads, positions=positions)  # fmt: skip
        model = options.fresh(model, f"vlm.name={WORLD_VLM}")
        return cls(model, processor, v, source=WORLD_VLM, world=world, **kwargs)

    @classmethod
    def tiny(cls, v: VlmBackboneConfig, options: memory.LoadOptions, **kwargs: Any) -> Vlm:
        """``vlm.name=tiny:<family>`` (:data:`TINY`): the family's tiny random VLM, the same weights at every build
        (seed 0; the process's random generators are left as they were)."""
        from finecap.models.tiny import BUILDERS, tiny_family
        from finecap.utils.rng import rng_preserved

        family = v.name.removeprefix(TINY)
        if family not in BUILDERS:
            raise ValueError(f"vlm.name={v.name}: no tiny {family!r} VLM; valid: "
                             f"{', '.join(TINY + f for f in BUILDERS)}")  # fmt: skip
        with rng_preserved():
            model, processor = tiny_family(family)
        model = options.fresh(model, f"vlm.name={v.name}")
        return cls(model, processor, v, source=v.name, **kwargs)

    TINY_SIZES = TEXT_TINY_SIZES
    """The world VLM's sizes (``vlm.tiny_*``) and its language model config's fields that hold them."""

    def loaded_setting_differences(self, cfg: Config) -> list[tuple[str, Any, Any]]:
        """Per key of the ``vlm`` section, on a checkpoint: ``name`` and, for the world VLM, ``tiny_layers``,
        ``tiny_hidden``, ``tiny_heads`` built the weights and cannot apply (the world VLM has no dropout option);
        nor can ``processor_kwargs`` and ``image_max_pixels``, set on the checkpoint's processor when it was loaded
        (how many image tokens a prompt holds); ``prompt`` and ``train_projector`` apply (:meth:`apply_settings`)."""
        v = cfg.vlm
        if not same_source(self.source, v.name):
            return [("vlm.name", self.source, v.name)]
        fixed = [(f"vlm.{key}", getattr(self.section, key), getattr(v, key)) for key in PROCESSOR_KEYS
                 if getattr(self.section, key) != getattr(v, key)]  # fmt: skip
        if v.name != WORLD_VLM:
            return fixed
        config = getattr(self.model.config, "text_config", self.model.config)
        return fixed + [(f"vlm.{key}", getattr(config, attr), getattr(v, key)) for key, attr in self.TINY_SIZES.items()
                        if getattr(config, attr, None) not in (None, getattr(v, key))]  # fmt: skip

    def apply_settings(self, cfg: Config) -> list[str]:
        """``vlm.prompt`` (the chat prompt rendered again) and ``vlm.train_projector`` (the projectors' flags) of
        ``cfg`` on a VLM loaded from a checkpoint, which was rebuilt with the ones its ``captioner.json`` records:
        they change no weight, and the checkpoints the run saves record the configured ones."""
        v, applied = cfg.vlm, []
        if v.prompt != self.section.prompt:
            self.section = replace(self.section, prompt=v.prompt)
            self._render_prompt()
            applied.append(f"vlm.prompt={v.prompt!r}")
        if v.train_projector != self.section.train_projector:
            self.section = replace(self.section, train_projector=v.train_projector)
            self.apply_trainable()
            applied.append(f"vlm.train_projector={str(v.train_projector).lower()}")
        return applied

    @staticmethod
    def reads_world_encoder(cfg: Config) -> bool:
        """The world VLM (``vlm.name=world-tiny``) reads the world encoder when ``model.encoder=world``; a VLM
        otherwise brings its own vision tower (``model.encoder`` is not read)."""
        return cfg.vlm.name == WORLD_VLM and cfg.model.encoder == "world"

    @staticmethod
    def encoder_source(cfg: Config) -> str | None:
        """The world VLM reads ``model.encoder`` from outside its checkpoint; a VLM brings its own vision tower."""
        return cfg.model.encoder if cfg.vlm.name == WORLD_VLM else None

    @staticmethod
    def built_here(cfg: Config) -> str | None:
        """``vlm.name=world-tiny`` / ``tiny:<family>``: the world VLM or a tiny VLM is built here with random
        weights."""
        return f"vlm.name={cfg.vlm.name}" if cfg.vlm.name == WORLD_VLM or cfg.vlm.name.startswith(TINY) else None

    @classmethod
    def load_weights(cls, path: Path, meta: dict[str, Any], load_encoder: bool,
                     options: memory.LoadOptions) -> Vlm:  # fmt: skip
        """The model and processor of the folder, and the world VLM's dual encoder (``load_encoder`` false: without
        it, for cached image tokens; a VLM's own vision tower is always part of the folder)."""
        section = VlmBackboneConfig(**{key: meta[key] for key in SECTION_KEYS if meta.get(key) is not None})
        processor = processor_before_weights(str(path), section)
        model = options.load(AutoModelForImageTextToText, path, str(path), skip=UNQUANTIZED, checkpoint=True)
        world = cls.load_dual_encoder(path, meta, load_encoder, options.torch_dtype or "auto", FeatureMapTokens)
        return cls(model, processor, section, train_encoder=meta["train_encoder"],
                   train_lm=meta["train_lm"], source=meta.get("source", ""), world=world)  # fmt: skip


def check_merge_dtypes(model: Any) -> None:
    """Refuse a VLM whose forward would fail merging its image features into the prompt: a family that casts them to
    its first parameter's dtype (:attr:`Family.features_in_first_dtype`, SmolVLM2) with its vision tower and its
    language model's embeddings in different dtypes, which ``model.trainable_dtype`` makes when only one of them
    trains whole on a 16-bit ``model.dtype`` (``transformers``' ``masked_scatter`` then fails: "expected self and
    source to have same dtypes"). Not fixed here: the cast is inside the model's own forward. Other captioners pass."""
    if not isinstance(model, Vlm) or not model.family.features_in_first_dtype:
        return
    inner = module_path(model.model, "model")  # the model whose forward merges the features
    first = next(p.dtype for p in inner.parameters() if p.is_floating_point())
    embeds = model.model.get_input_embeddings().weight.dtype
    if first != embeds:
        raise ValueError(
            f"{model.family.name}: transformers casts the image features to its first parameter's dtype (the vision "
            f"tower's, {str(first).removeprefix('torch.')}) and scatters them into the prompt's embeddings (the "
            f"language model's, {str(embeds).removeprefix('torch.')}), which fails when the two differ; train both "
            "in one dtype: model.trainable_dtype=same, LoRA (lora.lm=true, lora.encoder=true), or model.dtype=float32"
        )
