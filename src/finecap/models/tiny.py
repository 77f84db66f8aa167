"""Tiny random-weight models of every kind finecap builds, for trying finecap and its engines offline (``finecap
models tiny KIND --out DIR``, docs/vlm.md#tiny-models) and for tests and benchmarks: a CLIP dual encoder and a BLIP
over the world tokenizer, and a decoder-only VLM of every supported family (``finecap.models.vlm.FAMILIES``), each
saved as a transformers ``save_pretrained`` folder (config, safetensors weights, processor and tokenizer) that
``vlm.name=DIR`` / ``model.encoder=DIR`` / transformers' ``Auto`` classes load.

Each VLM is built from transformers' own config classes: a language model of 2 layers (:class:`Sizes`: ``hidden``
wide with ``heads`` query heads and one key/value head; the default head width, 32, is one vLLM's CPU attention takes,
see :func:`finecap.engines.vllm.head_size_refusal`) and a vision tower of 2 layers, every weight matrix redrawn from
``N(0, std)`` so that the image matters, and the family's processor class over the world tokenizer with the family's
special tokens and a chat template shaped like the family's own (LLaVA-OneVision's keeps LLaVA-1.5's ``USER:`` /
``ASSISTANT:`` and ``<eos>``; its checkpoints write ChatML, docs/vlm.md#tiny-models). Images are resized to 16 px (4
image tokens).

Two processors need a package that captioning never touches; the builders put a stand-in in its place
(:data:`STAND_INS`), in the process that builds them: SmolVLM2's processor refuses to build without ``num2words``
(read only for videos), so ``num2words`` becomes ``str`` in its module when it is missing; Pixtral's processor module
(Mistral 3) imports the torchvision image processor for one size function, so, without torchvision, the PIL image
processor's module is registered under that name. A saved folder of either then loads back, in another process, only
where the package is installed (:data:`LOAD_NEEDS`: ``pip install num2words`` for SmolVLM, torchvision for
Mistral 3). Everything else is the family's own code.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers as tf
from tokenizers import processors

from finecap.models.presets import PROMPT_WORDS, save_tiny_blip, save_tiny_clip, tiny_vlm
from finecap.models.processors import image_only_processor
from finecap.models.tokenizer import world_tokenizer
from finecap.utils.rng import torch_seeded
from finecap.world.captions import vocabulary

S = 16  # image side (px) the image processors resize to
STAND_INS = {"smolvlm": "num2words-placeholder", "mistral3": "pixtral-processor-pil-import"}
"""Families whose processor builds only with a stand-in (module docstring), and the stand-in's name."""
LOAD_NEEDS = {"smolvlm": "num2words", "mistral3": "torchvision"}
"""The package a saved folder of these families needs to load back in another process (its processor class's
requirement, which the stand-in stood for while it was built)."""
VIDEO_FAMILIES = ("glm4v", "internvl", "llava_onevision", "mistral3", "qwen2_5_vl", "qwen2_vl", "qwen3_vl", "smolvlm")
AUTO_PROCESSOR_NEEDS = dict.fromkeys(VIDEO_FAMILIES, "torchvision")
"""The package transformers' ``AutoProcessor.from_pretrained`` needs for a folder of these families (a Hub
checkpoint's as much as a tiny one's): their processors hold a video processor, and Pixtral's an image processor,
that transformers builds with torchvision only. finecap's own loader builds the image-only processor without it
(:func:`finecap.models.processors.image_only_processor`), but for :data:`LOAD_NEEDS`."""


@dataclass(frozen=True)
class Sizes:
    """A tiny language model's width: ``hidden`` (divisible by ``heads``) and ``heads`` query heads of width
    ``hidden // heads`` (:attr:`head_dim`). The default, 64 x 2 heads of 32, is what vLLM's CPU attention takes."""

    hidden: int = 64
    heads: int = 2

    def __post_init__(self) -> None:
        if self.hidden <= 0 or self.heads <= 0 or self.hidden % self.heads or (self.hidden // self.heads) % 4:
            raise ValueError(f"tiny model: --hidden {self.hidden} must be a positive multiple of --heads "
                             f"{self.heads} with heads of a width divisible by 4 (rotary sections)")  # fmt: skip

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}{% if c['type'] == 'image' %}"
    "IMAGE{% else %}{{ c['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAVA_TEMPLATE = (
    "{% for m in messages %}{{ m['role'].upper() + ': ' }}{% for c in m['content'] %}{% if c['type'] == 'image' %}"
    "{{ '<image>\n' }}{% else %}{{ c['text'] + ' ' }}{% endif %}{% endfor %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)
IDEFICS_TEMPLATE = (
    "<|im_start|>{% for m in messages %}{{ m['role'] | capitalize }}{% if m['content'][0]['type'] == 'image' %}"
    "{{ ':' }}{% else %}{{ ': ' }}{% endif %}{% for c in m['content'] %}"
    "{% if c['type'] == 'text' %}{{ c['text'] }}{% elif c['type'] == 'image' %}{{ '<image>' }}{% endif %}"
    "{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
GEMMA_TEMPLATE = (
    "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{% for c in m['content'] %}{% if c['type'] == 'image' %}"
    "<start_of_image>{% else %}{{ c['text'] }}{% endif %}{% endfor %}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
MISTRAL_TEMPLATE = (
    "{% for m in messages %}[INST]{% for c in m['content'] %}{% if c['type'] == 'image' %}[IMG]{% else %}"
    "{{ c['text'] }}{% endif %}{% endfor %}[/INST]{% endfor %}"
)
GLM_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{% for c in m['content'] %}{% if c['type'] == 'image' %}"
    "<|begin_of_image|><|image|><|end_of_image|>{% else %}{{ c['text'] }}{% endif %}{% endfor %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
QWEN_TOKENS = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
IDEFICS_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>", "<|im_start|>"]
TWO_LAYERS = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2)
"""The vision towers of the family builders: 2 layers of width 16, 2 heads."""
PINPOINTS = [[S, S], [S, 2 * S], [2 * S, S]]


def tokenizer(specials: list[str], eos: str | None, named: dict[str, str] | None = None) -> Any:
    """The world tokenizer with the prompt words, the family's special tokens (``named``: those its processor reads
    by attribute, e.g. Gemma 3's ``boi_token``) and EOS = the token ending an assistant turn."""
    tok = world_tokenizer([*vocabulary(), *PROMPT_WORDS])
    tok.add_special_tokens({"additional_special_tokens": specials})
    if named:
        tok._set_model_specific_special_tokens(named)
    if eos is not None:
        tok.eos_token = eos
    return tok


def text_config(tok: Any, sizes: Sizes, **extra: Any) -> tuple[dict, dict]:
    """A 2-layer language model of ``sizes`` over ``tok`` (feed-forward ``2 * hidden``, one key/value head), and the
    special ids every config takes."""
    ids = {"pad_token_id": tok.pad_token_id, "eos_token_id": tok.eos_token_id, "bos_token_id": tok.bos_token_id}
    text = dict(vocab_size=len(tok), hidden_size=sizes.hidden, intermediate_size=2 * sizes.hidden,
                num_hidden_layers=2, num_attention_heads=sizes.heads, num_key_value_heads=1,
                max_position_embeddings=256, **ids, **extra)  # fmt: skip
    return text, ids


def mrope_section(pairs: int) -> list[int]:
    """Multimodal rotary sections (temporal, height, width) of ``pairs`` rotary frequency pairs: half, a quarter,
    a quarter (Qwen2-VL's split of 64 pairs is 16, 24, 24; any split summing to the pairs is a valid one).

    >>> mrope_section(8), mrope_section(16)
    ([4, 2, 2], [8, 4, 4])
    """
    return [pairs - 2 * (pairs // 4), pairs // 4, pairs // 4]


def qwen(family: str, sizes: Sizes) -> tuple[Any, Any]:
    tok = tokenizer(QWEN_TOKENS, "<|im_end|>")
    text, ids = text_config(tok, sizes)
    ids.update(image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
               video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
               vision_start_token_id=tok.convert_tokens_to_ids("<|vision_start|>"),
               vision_end_token_id=tok.convert_tokens_to_ids("<|vision_end|>"))  # fmt: skip
    rope = {"rope_type": "default", "mrope_section": mrope_section(sizes.head_dim // 2), "rope_theta": 10000.0}
    vision = dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=sizes.hidden,
                  patch_size=4, spatial_merge_size=2, temporal_patch_size=2)  # fmt: skip
    if family == "qwen2_5_vl":
        config = tf.Qwen2_5_VLConfig(vision_config=dict(vision, window_size=8, fullatt_block_indexes=[1]),
                                     text_config=dict(text, rope_parameters=rope), **ids)  # fmt: skip
        model, cls = tf.Qwen2_5_VLForConditionalGeneration(config), tf.Qwen2_5_VLProcessor
    else:  # DeepStack: features of both vision layers are added to the first two language-model layers
        config = tf.Qwen3VLConfig(
            vision_config=dict(vision, num_position_embeddings=16, deepstack_visual_indexes=[0, 1]),
            text_config=dict(text, head_dim=sizes.head_dim, rope_parameters={**rope, "mrope_interleaved": True}),
            **ids,
        )  # fmt: skip
        model, cls = tf.Qwen3VLForConditionalGeneration(config), tf.Qwen3VLProcessor
    image_processor = tf.Qwen2VLImageProcessorPil(min_pixels=S * S, max_pixels=4 * S * S, patch_size=4, merge_size=2,
                                                  temporal_patch_size=2)  # fmt: skip
    template = QWEN_TEMPLATE.replace("IMAGE", "<|vision_start|><|image_pad|><|vision_end|>")
    return model, image_only_processor(cls)(image_processor=image_processor, tokenizer=tok, chat_template=template)


def llava_next(family: str, sizes: Sizes) -> tuple[Any, Any]:
    tok = tokenizer(["<image>", "<video>"], None)
    text, ids = text_config(tok, sizes)
    image_token = tok.convert_tokens_to_ids("<image>")
    if family == "llava_next":
        vision = dict(model_type="clip_vision_model", image_size=S, patch_size=8, **TWO_LAYERS)
        config = tf.LlavaNextConfig(vision_config=vision, text_config=dict(model_type="llama", **text),
                                    image_token_id=image_token, image_grid_pinpoints=PINPOINTS,
                                    vision_feature_layer=-1, **ids)  # fmt: skip
        image_processor = tf.LlavaNextImageProcessorPil(size={"shortest_edge": S}, crop_size={"height": S, "width": S},
                                                        image_grid_pinpoints=PINPOINTS)  # fmt: skip
        processor = tf.LlavaNextProcessor(image_processor=image_processor, tokenizer=tok, patch_size=8,
                                          vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                          chat_template=LLAVA_TEMPLATE)  # fmt: skip
        return tf.LlavaNextForConditionalGeneration(config), processor
    vision = dict(model_type="siglip_vision_model", image_size=S, patch_size=8, **TWO_LAYERS)
    config = tf.LlavaOnevisionConfig(vision_config=vision, text_config=dict(model_type="qwen2", **text),
                                     image_token_id=image_token, video_token_id=tok.convert_tokens_to_ids("<video>"),
                                     image_grid_pinpoints=PINPOINTS, vision_feature_layer=-1,
                                     vision_feature_select_strategy="full", **ids)  # fmt: skip
    image_processor = tf.LlavaOnevisionImageProcessorPil(
        size={"height": S, "width": S}, image_grid_pinpoints=PINPOINTS
    )
    processor = image_only_processor(tf.LlavaOnevisionProcessor)(
        image_processor=image_processor,
        tokenizer=tok,
        num_image_tokens=4,
        vision_feature_select_strategy="full",
        chat_template=LLAVA_TEMPLATE,
    )
    return tf.LlavaOnevisionForConditionalGeneration(config), processor


def idefics(family: str, sizes: Sizes) -> tuple[Any, Any]:
    tok = tokenizer(IDEFICS_TOKENS, "<end_of_utterance>")
    text, ids = text_config(tok, sizes)
    vision = dict(image_size=S, patch_size=4, **TWO_LAYERS)
    image_token = tok.convert_tokens_to_ids("<image>")
    if family == "idefics2":
        perceiver = dict(hidden_size=sizes.hidden, resampler_n_latents=4, resampler_depth=2, resampler_n_heads=2,
                         resampler_head_dim=8, num_key_value_heads=1)  # fmt: skip
        config = tf.Idefics2Config(
            vision_config=vision,
            perceiver_config=perceiver,
            text_config=dict(model_type="mistral", **text),
            image_token_id=image_token,
            **ids,
        )
        image_processor = tf.Idefics2ImageProcessorPil(do_image_splitting=False,
                                                       size={"shortest_edge": S, "longest_edge": S})  # fmt: skip
        processor = tf.Idefics2Processor(image_processor=image_processor, tokenizer=tok, image_seq_len=4,
                                         chat_template=IDEFICS_TEMPLATE)  # fmt: skip
        return tf.Idefics2ForConditionalGeneration(config), processor
    import transformers.models.smolvlm.processing_smolvlm as smolvlm_processing

    smolvlm_processing.num2words = smolvlm_processing.num2words or str  # stand-in: read for videos only
    config = tf.SmolVLMConfig(vision_config=vision, text_config=dict(model_type="llama", **text),
                              image_token_id=image_token, scale_factor=2, **ids)  # fmt: skip
    edge = {"longest_edge": S}
    image_processor = tf.SmolVLMImageProcessorPil(do_image_splitting=False, size=edge, max_image_size=edge)
    processor = image_only_processor(tf.SmolVLMProcessor)(image_processor=image_processor, tokenizer=tok,
                                                          video_processor=None, image_seq_len=4,
                                                          chat_template=IDEFICS_TEMPLATE)  # fmt: skip
    return tf.SmolVLMForConditionalGeneration(config), processor


def gemma3(family: str, sizes: Sizes) -> tuple[Any, Any]:
    """Gemma 3 with its output head untied from the embeddings: tied (Gemma 3's own setting), the random model's
    embeddings, scaled by sqrt(hidden) on the way in, make it repeat its last prompt token at every step (a special
    token: every caption empty), which no decoding comparison can read. As ``google/gemma-3-*-it``: the tokenizer's
    EOS is ``<eos>``, the chat template ends an assistant turn with ``<end_of_turn>``, and the model stops at both
    (:data:`MORE_STOPS`); the tokenizer adds ``<bos>`` and the chat template writes it too (``{{ bos_token }}``)."""
    specials = ["<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<image_soft_token>", "<end_of_image>"]
    named = {"boi_token": "<start_of_image>", "image_token": "<image_soft_token>", "eoi_token": "<end_of_image>"}
    tok = tokenizer(specials, None, named)
    tok._tokenizer.post_processor = processors.TemplateProcessing(  # <bos> first, as Gemma's tokenizer adds it
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", tok.bos_token_id)]
    )
    text, ids = text_config(
        tok, sizes, head_dim=sizes.head_dim, sliding_window=8, layer_types=["sliding_attention", "full_attention"]
    )
    config = tf.Gemma3Config(vision_config=dict(model_type="siglip_vision_model", image_size=S, patch_size=4,
                                                **TWO_LAYERS),
                             text_config=text, mm_tokens_per_image=4,
                             boi_token_index=tok.convert_tokens_to_ids("<start_of_image>"),
                             eoi_token_index=tok.convert_tokens_to_ids("<end_of_image>"),
                             image_token_id=tok.convert_tokens_to_ids("<image_soft_token>"),
                             tie_word_embeddings=False, **ids)  # fmt: skip
    image_processor = tf.Gemma3ImageProcessorPil(size={"height": S, "width": S})
    processor = tf.Gemma3Processor(image_processor=image_processor, tokenizer=tok, image_seq_length=4,
                                   chat_template="{{ bos_token }}" + GEMMA_TEMPLATE)  # fmt: skip
    return tf.Gemma3ForConditionalGeneration(config), processor


def internvl(family: str, sizes: Sizes) -> tuple[Any, Any]:
    named = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
             "video_token": "<video>"}  # fmt: skip
    tok = tokenizer(["<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>", "<video>"], "<|im_end|>", named)
    text, ids = text_config(tok, sizes)
    config = tf.InternVLConfig(vision_config=dict(image_size=[S, S], patch_size=[4, 4], **TWO_LAYERS),
                               text_config=dict(model_type="qwen2", **text), downsample_ratio=0.5,
                               image_token_id=tok.convert_tokens_to_ids("<IMG_CONTEXT>"), **ids)  # fmt: skip
    image_processor = tf.GotOcr2ImageProcessorPil(size={"height": S, "width": S}, max_patches=4)  # tiles + thumbnail
    template = QWEN_TEMPLATE.replace("IMAGE", "<IMG_CONTEXT>\n")
    processor = image_only_processor(tf.InternVLProcessor)(image_processor=image_processor, tokenizer=tok,
                                                           image_seq_length=4, chat_template=template)  # fmt: skip
    return tf.InternVLForConditionalGeneration(config), processor


def mistral3(family: str, sizes: Sizes) -> tuple[Any, Any]:
    tok = tokenizer(["[IMG]", "[IMG_BREAK]", "[IMG_END]", "[INST]", "[/INST]"], None)
    text, ids = text_config(tok, sizes)
    vision = dict(model_type="pixtral", image_size=2 * S, patch_size=4, head_dim=8, **TWO_LAYERS)
    config = tf.Mistral3Config(vision_config=vision, text_config=dict(model_type="mistral", **text),
                               image_token_id=tok.convert_tokens_to_ids("[IMG]"), spatial_merge_size=2,
                               vision_feature_layer=-1, **ids)  # fmt: skip
    image_processor = tf.PixtralImageProcessorPil(size={"longest_edge": 2 * S}, patch_size=4)
    from transformers.utils import is_torchvision_available

    name = "transformers.models.pixtral.image_processing_pixtral"
    if (
        name not in sys.modules and not is_torchvision_available()
    ):  # stand-in: the torchvision module is imported for get_resize_output_image_size
        sys.modules[name] = importlib.import_module("transformers.models.pixtral.image_processing_pil_pixtral")
    cls = importlib.import_module("transformers.models.pixtral.processing_pixtral").PixtralProcessor
    processor = cls(image_processor=image_processor, tokenizer=tok, patch_size=4, spatial_merge_size=2,
                    chat_template=MISTRAL_TEMPLATE)  # fmt: skip
    return tf.Mistral3ForConditionalGeneration(config), processor


def glm4v(family: str, sizes: Sizes) -> tuple[Any, Any]:
    specials = ["<|user|>", "<|assistant|>", "<|begin_of_image|>", "<|end_of_image|>", "<|image|>",
                "<|begin_of_video|>", "<|end_of_video|>", "<|video|>"]  # fmt: skip
    tok = tokenizer(specials, "<|user|>")  # GLM-4V's turns end where the next user turn begins
    text, ids = text_config(tok, sizes)
    rope = {"rope_type": "default", "mrope_section": mrope_section(sizes.head_dim // 4), "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5}  # fmt: skip
    config = tf.Glm4vConfig(
        vision_config=dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=sizes.hidden,
                           patch_size=4, spatial_merge_size=2, temporal_patch_size=2, image_size=S),
        text_config=dict(text, rope_parameters=rope), image_token_id=tok.convert_tokens_to_ids("<|image|>"),
        video_token_id=tok.convert_tokens_to_ids("<|video|>"),
        image_start_token_id=tok.convert_tokens_to_ids("<|begin_of_image|>"),
        image_end_token_id=tok.convert_tokens_to_ids("<|end_of_image|>"), **ids,
    )  # fmt: skip
    image_processor = tf.Glm4vImageProcessorPil(size={"shortest_edge": S * S, "longest_edge": 4 * S * S},
                                                patch_size=4, merge_size=2, temporal_patch_size=2)  # fmt: skip
    processor = image_only_processor(tf.Glm4vProcessor)(image_processor=image_processor, tokenizer=tok,
                                                        chat_template=GLM_TEMPLATE)  # fmt: skip
    return tf.Glm4vForConditionalGeneration(config), processor


def presets(family: str, sizes: Sizes) -> tuple[Any, Any]:
    """The three families :func:`finecap.models.presets.tiny_vlm` builds, with 2 + 2 layers."""
    return tiny_vlm(family, layers=2, hidden=sizes.hidden, heads=sizes.heads, vision={"num_hidden_layers": 2})


BUILDERS = {"llava": presets, "idefics3": presets, "qwen2_vl": presets, "qwen2_5_vl": qwen, "qwen3_vl": qwen,
            "llava_next": llava_next, "llava_onevision": llava_next, "idefics2": idefics, "smolvlm": idefics,
            "gemma3": gemma3, "internvl": internvl, "mistral3": mistral3, "glm4v": glm4v}  # fmt: skip
"""A tiny builder per supported family (``model_type``)."""

MORE_STOPS = {"gemma3": ("<end_of_turn>",)}
"""Stop tokens of a family's ``generation_config.eos_token_id`` besides the tokenizer's EOS (Gemma 3's
``[<eos>, <end_of_turn>]``)."""

ENCODERS = ("clip", "blip")
"""The kinds that are not a VLM family: a CLIP dual encoder (``model.encoder=DIR``, the retriever) and a BLIP
captioner (``blip.name=DIR``), both over the world tokenizer."""

KINDS = (*ENCODERS, *BUILDERS)
"""Every kind :func:`save_tiny` writes."""


def tiny_family(family: str, *, seed: int = 0, std: float = 0.2, sizes: Sizes | None = None) -> tuple[Any, Any]:
    """A random tiny model of ``family`` (module docstring; weights redrawn from N(0, ``std``) after seeding torch's
    global RNG with ``seed``) and its processor. The process's random states are as before afterwards
    (:func:`finecap.utils.rng.torch_seeded`)."""
    if family not in BUILDERS:
        raise ValueError(f"tiny VLM family {family!r}; valid: {', '.join(BUILDERS)}")
    with torch_seeded(seed):
        model, processor = BUILDERS[family](family, sizes or Sizes())
        with torch.no_grad():
            for p in model.parameters():
                if p.ndim == 2:
                    p.normal_(0.0, std)
    tok = processor.tokenizer
    stops = [tok.eos_token_id, *tok.convert_tokens_to_ids(list(MORE_STOPS.get(family, ())))]
    model.generation_config.eos_token_id = stops[0] if len(stops) == 1 else stops
    model.generation_config.pad_token_id = processor.tokenizer.pad_token_id
    return model, processor


def save_family(out: str | Path, family: str, *, seed: int = 0, std: float = 0.2, sizes: Sizes | None = None) -> Path:
    """:func:`tiny_family` saved like a Hub checkpoint (``save_pretrained`` of the model and of its processor):
    a folder for ``vlm.name=<out>``."""
    model, processor = tiny_family(family, seed=seed, std=std, sizes=sizes)
    out = Path(out)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def save_tiny(kind: str, out: str | Path, *, seed: int = 0, sizes: Sizes | None = None) -> Path:
    """Write a tiny random model of ``kind`` (:data:`KINDS`) into the folder ``out`` (module docstring): a VLM
    family's :func:`save_family`; ``clip``: :func:`finecap.models.presets.save_tiny_clip`; ``blip``:
    :func:`finecap.models.presets.save_tiny_blip`, both ``sizes.hidden`` wide with ``sizes.heads`` heads."""
    sizes = sizes or Sizes()
    if kind == "clip":
        return save_tiny_clip(out, hidden=sizes.hidden, heads=sizes.heads, seed=seed)
    if kind == "blip":
        return save_tiny_blip(out, hidden=sizes.hidden, heads=sizes.heads, vision_hidden=sizes.hidden, seed=seed)
    if kind not in BUILDERS:
        raise ValueError(f"tiny model kind {kind!r}; valid: {', '.join(KINDS)}")
    return save_family(out, kind, seed=seed, sizes=sizes)
