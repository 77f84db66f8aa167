"""The activation memory of one training step of a decoder-only VLM, forecast from the shapes of its backbone
(issue 65): what autograd keeps for the backward pass, counted tensor by tensor for the ``transformers``
implementations finecap trains (Llama / SmolLM2 / Qwen2 decoder layers: RMSNorm, rotary attention through
``sdpa``, a gated SiLU MLP), never fitted to a measurement. :func:`finecap.models.memory.training_memory` gives the
exact rest (weights, gradients, AdamW's moments); ``finecap train --dry-run`` prints both (:func:`forecast_text`),
and docs/memory.md says how close the forecast came to measured peaks.

**Per decoder layer and token** (bytes; ``h`` hidden, ``i`` intermediate, ``q = heads x head_dim``, ``kv =
kv_heads x head_dim``; ``r`` the residual stream's bytes (4 in float32 weights, 2 in bfloat16 weights), ``l`` a
projection's output bytes (2 under bf16 autocast or bfloat16 weights, else 4)); "saved" means held by a backward
node until the backward pass reaches it:

- each of the two RMSNorms (``x.to(float32)``, ``pow``, ``mean``, ``rsqrt``, ``*``, ``weight *``): the float32 input
  (``pow`` and ``*`` save it: ``4h``, the input itself when ``r = 4``), and, when the norm's weight trains, the
  normalised ``hn`` in the input dtype (``weight * hn`` saves it: ``r h``);
- the projections' inputs (:func:`_inputs`): a projection whose weight trains saves its input (one tensor for
  ``q/k/v`` or ``gate/up``, which read the same one; under autocast each call saves its own bf16 cast, ``2w``); a
  frozen projection with a LoRA adapter saves the adapter's input, which peft casts to the adapter's float32 (a copy
  per adapted projection, ``4w``; under autocast the bf16 cast of that copy, ``2w``), plus the ``rank``-wide
  adapter hidden state; a frozen projection without one saves nothing;
- attention (``sdpa``, whose flash / memory-efficient kernels save query, key, value, output and the log-sum-exp):
  ``l (q + 2 k' + q) + 4 heads``, with ``k' = q`` when an attention mask is passed (padding: ``transformers``
  repeats the key/value heads before ``sdpa``) and ``k' = kv`` without one (``enable_gqa``); with a mask, ``sdpa``
  also saves that layer's float copy of it, ``l x (query positions) x (key positions)`` per row;
- the MLP ``down(silu(gate(x)) * up(x))``: ``silu`` saves ``gate``, ``*`` saves ``silu(gate)`` and ``up``: ``3 l i``,
  and ``down``'s input as a projection input above.

**Around the layers**: the final norm (as one norm) over every position; the vocabulary: a scored token's float32
log-softmax (``4V``) is saved and the first backward nodes hold two more float32 gradients of that size, ``12V`` at the
step's peak (the vocabulary in chunks under checkpointing: one chunk of
:data:`~finecap.models.captioner.VOCAB_CHUNK_ELEMENTS` logits), and a trained head's weight gradient as it is formed
(``4 V h``, before it is added to the gradient kept: counted here although the first micro-step of a run that zeroes
gradients to ``None`` keeps that very tensor); with the prompt shared (one prompt pass per image, its KV cache repeated
to its captions), each caption's attention also saves its rows' keys and values over the prompt (``2 l k' P`` per
layer); the image inputs (``pixel_values``, float32; Idefics's int64 pixel mask: :func:`pixel_input_bytes`) and the
projector's input (trained: saved) per image, and per caption where the prompt is not shared (each caption's row then
runs the model's own forward, vision tower included); a frozen vision tower runs without a graph, before the language
model runs: its residual stream and one layer's temporaries at a time (:func:`frozen_tower_bytes`, by the layer's kind;
Pixtral's block-diagonal mask over all the patches too), over what the model made of the pixels before it ran
(:func:`pixel_copy_bytes`: Idefics's selected images, LLaVA-NeXT's crops, Qwen's cast) and the embeddings of the ids it
embedded first (``w h_lm`` a position of that pass). **Under gradient checkpointing** (non-reentrant, per layer) only
each layer's input (``r h`` a token) is kept, and one layer's activations are recomputed at a time in the backward
pass; with the prompt shared (it is under checkpointing too: :class:`finecap.models.kvcache.PromptCache`) also every
layer's keys and values over the prompt, once per image (the cache the captions read: ``(r + l) kv`` a prompt token,
the keys in the residual stream's dtype after rope), the captions' rows of them formed only inside a recomputed layer;
the two passes are recomputed one after the other (the captions' first), so the larger one's layer is the recomputed
peak.

**A trained vision tower** (``model.train_encoder``: LoRA or the whole tower) keeps, beyond the frozen tower's
counts above, what each of its layers saves per patch (:func:`tower_layer_bytes`, a layer of the tower's kind by
the rules above: SigLIP's, or with RMSNorm, QuickGELU, a gated MLP, the Qwen towers' fused rotary ``qkv``,
InternViT's layer scale and query and key norms) and, once, what its layers save of the tensors they all read
(:func:`tower_shared_bytes`: the rotary tables, Pixtral's block mask) and, when the whole tower trains, what its patch
embedding saves (:func:`tower_embedding_bytes`: its input), or under checkpointing each layer's input, from
its forward pass, which runs first, to its backward pass, which runs last: the language model's activations are freed
by then, so the tower's backward pass is a peak of its own: what the tower keeps, one recomputed layer (under
checkpointing) and the gradients that layer's backward pass forms at its MLP's output projection
(:func:`tower_gradient_bytes`), beside the images.

**The reference pass** of the GRPO family's KL term (``grpo.kl_coef > 0``, :mod:`finecap.objectives.reference`)
scores the step's captions once more before the step, without gradient and in eval mode: the logits (``l`` bytes:
bf16 under autocast or bf16 weights), their float32 copy divided by the temperature and its float32 log-softmax,
``(l + 8) V`` a scored position (every position of every caption, padding included); under checkpointing it scores
in the policy's vocabulary chunks, so only one chunk's positions at a time, beside the last hidden states
(``l H`` a position). Both measured on the CPU (``tests/models/test_memory_forecast.py``).

The peak is taken at the start of the backward pass: everything saved, plus the vocabulary's gradients (or, under
checkpointing, one recomputed layer), or the vision tower's temporaries if larger, or a trained tower's backward
pass, or the reference pass's logits if larger still (the pass's KV cache, freed before its log-softmax, aside). Not
counted: the allocator's rounding and fragmentation, the optimizer step's temporaries, a data-parallel wrapper's
buckets, and decoding (rollouts run without a graph, before the step's forward).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from finecap.models.captioner import VOCAB_CHUNK_ELEMENTS
from finecap.models.kvcache import prompt_shareable
from finecap.models.memory import weight_count
from finecap.registry import GRPO_OBJECTIVES, RL_OBJECTIVES

GIB = 1024**3
CHUNKED = ("mle", "reinforce", "grpo")
"""Objectives that score their captions through the head in vocabulary chunks under checkpointing (``grpo`` is
``reinforce`` with options: one implementation)."""
LM_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TOWER_TARGETS = ("q_proj", "k_proj", "v_proj", "qkv", "out_proj", "fc1", "fc2", "gate_proj", "up_proj", "down_proj")
"""The linear layers of the tower layers :func:`tower_layer_bytes` counts (:func:`tower_linears`: SigLIP's and
CLIP's ``q/k/v_proj``, ``out_proj``, ``fc1``, ``fc2``, finecap's LoRA targets there,
:data:`finecap.models.vlm.VIT_TARGETS`; the fused ``qkv`` of the Qwen towers; the gated MLP's ``gate/up/down_proj``):
every one a layer of its kind has, when no targets are given."""
TOWER_ROLES = {"attn.qkv": ("qkv",), "attn.proj": ("out_proj",), "proj": ("out_proj",), "o_proj": ("out_proj",),
               "projection_layer": ("out_proj",), "mlp.gate_proj": ("gate_proj",), "mlp.up_proj": ("up_proj",),
               "mlp.down_proj": ("down_proj",), "linear_fc1": ("fc1",), "linear_fc2": ("fc2",)}  # fmt: skip
"""Other towers' LoRA targets (:data:`finecap.models.vlm.FAMILIES`' ``vision_targets``: the Qwen towers' ``attn.qkv``
and ``attn.proj``, the gated MLPs' ``mlp.gate_proj`` ..., InternViT's ``projection_layer``, Pixtral's ``o_proj``,
Qwen3-VL's ``linear_fc1``) by the names of :data:`TOWER_TARGETS` they are counted as."""
TOWER_OUTSIDE = ("patch_embed", "merger", "deepstack_merger_list", "head")
"""The parts of a tower outside its layers whose modules bear a layer's names (the Qwen towers' and GLM-4.1V's patch
embedding ``patch_embed.proj``, a convolution; the mergers' ``proj``, ``gate_proj``, ``down_proj``, ``linear_fc1``
...; SigLIP's pooling ``head``, its ``attention.out_proj`` and ``mlp.fc1``): a target under one of them adapts no
layer :func:`tower_layer_bytes` counts (:func:`tower_targets_of`)."""
FUSED = {"attention": "fused", "rotary": "float32", "embeddings_kept": 0}
"""The Qwen towers' and GLM-4.1V's layers: the fused rotary ``qkv``, float32 ``cos``/``sin`` tables, the blocks run in
the tower's own forward (no embeddings kept beside the stream)."""
TOWER_KINDS = {"qwen2_vl_vision": FUSED, "qwen3_vl_vision": {**FUSED, "position_taps": 4},
               "qwen2_5_vl_vision": {"norm": "rms", "mlp": "gated", **FUSED},
               "glm4v_vision": {"norm": "rms", "mlp": "gated", **FUSED},
               "pixtral": {"norm": "rms", "mlp": "gated", "block_mask": True, "rotary": "weights",
                           "embeddings_kept": 2},
               "internvl_vision": {"layer_scale": True}}  # fmt: skip
"""The towers whose layers are not SigLIP's, by their vision config's ``model_type``: their :class:`VisionShapes`
``norm``, ``mlp``, ``attention`` and ``layer_scale`` (read from ``transformers``' modeling code: Qwen2.5-VL's,
GLM-4.1V's and Pixtral's RMSNorm and gated MLP, the Qwen towers' and GLM-4.1V's fused ``qkv`` with rotary, run image
by image, InternViT's layer scale, Pixtral's one sequence of every image's patches under a block-diagonal mask), and
what their frozen forward holds beside the layers (``rotary``, ``embeddings_kept``, ``position_taps``: Qwen3-VL's
bilinear position embedding; :func:`frozen_tower_bytes`); a QuickGELU MLP is read from ``hidden_act`` (CLIP's,
Qwen2-VL's), an RMSNorm from ``norm_type`` and the query and key norms from ``use_qk_norm`` (InternViT's:
``rms_norm`` and QK norms in InternViT-6B, ``layer_norm`` without in InternViT-300M), and Qwen3-VL's DeepStack
features from ``deepstack_visual_indexes`` (:func:`deepstack_values`)."""
PIXEL_COPIES = {"idefics2": "select", "idefics3": "select", "smolvlm": "select", "llava_next": "crops",
                "llava_onevision": "crops", "qwen2_vl": "cast", "qwen2_5_vl": "cast", "qwen3_vl": "cast",
                "glm4v": "cast", "internvl": "cast"}  # fmt: skip
"""What the model's ``get_image_features`` makes of the batch's pixels before its tower runs and holds while it runs,
by the VLM config's ``model_type`` (read from ``transformers`` 5.24's code; :func:`pixel_copy_bytes`): ``"select"``
(Idefics2, Idefics3, SmolVLM2: the real images' copy ``pixel_values[real_images_inds]`` in the weights' dtype and their
``pixel_attention_mask``'s copy, the processor's int64), ``"crops"`` (LLaVA-NeXT, LLaVA-OneVision: ``torch.cat`` of
each image's crops, float32), ``"cast"`` (the Qwen towers, GLM-4.1V, InternVL: ``pixel_values`` cast to the weights'
dtype, no copy in float32); the others (LLaVA, Pixtral, Gemma 3) cast inside the patch embedding only, freed before the
first layer."""
MLP_WIDTH = {"glm4v_vision": "out_hidden_size"}
"""Towers whose MLP is not ``intermediate_size`` wide, by their config's ``model_type``: the field that gives its
width (GLM-4.1V's vision MLP is ``out_hidden_size`` wide; its ``intermediate_size`` is the merger's)."""


@dataclass(frozen=True)
class LmShapes:
    """The language model's shapes (``transformers`` config names)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    head_dim: int = 0  # 0: hidden // heads

    @property
    def q(self) -> int:
        return self.heads * (self.head_dim or self.hidden // self.heads)

    @property
    def kv(self) -> int:
        return self.kv_heads * (self.head_dim or self.hidden // self.heads)

    @classmethod
    def of(cls, config: Any) -> LmShapes:
        """The shapes of a ``transformers`` config (its ``text_config`` where it has one)."""
        text = getattr(config, "text_config", None) or config
        heads = int(text.num_attention_heads)
        return cls(int(text.num_hidden_layers), int(text.hidden_size), int(text.intermediate_size), heads,
                   int(getattr(text, "num_key_value_heads", None) or heads), int(text.vocab_size),
                   int(getattr(text, "head_dim", None) or 0))  # fmt: skip


def mlp_width(vision: Any, hidden: int) -> int:
    """The width of a vision tower's MLP from its config ``vision`` (:data:`MLP_WIDTH`, else ``intermediate_size``,
    else ``mlp_ratio`` x ``hidden``, 4 by default)."""
    field = MLP_WIDTH.get(getattr(vision, "model_type", ""), "intermediate_size")
    return int(getattr(vision, field, 0) or hidden * getattr(vision, "mlp_ratio", 4))


def tower_kind(vision: Any) -> dict[str, Any]:
    """The kind of a vision tower's layers from its config ``vision`` (:class:`VisionShapes`' ``norm``, ``mlp`` and
    ``attention``, and ``layer_scale`` and ``qk_norm`` where it has them): :data:`TOWER_KINDS` by ``model_type``, else
    a SigLIP layer, whose MLP is QuickGELU's where ``hidden_act`` says so, whose norm is an RMSNorm where
    ``norm_type`` does, and whose queries and keys are normalised where ``use_qk_norm`` says so."""
    kind = {"norm": "rms" if getattr(vision, "norm_type", "") == "rms_norm" else "layer",
            "mlp": "quick_gelu" if getattr(vision, "hidden_act", "") == "quick_gelu" else "gelu",
            "attention": "split", "embeddings_kept": 1,
            **({"qk_norm": True} if getattr(vision, "use_qk_norm", False) else {})}  # fmt: skip
    deepstack = deepstack_values(vision)
    return {**kind, **TOWER_KINDS.get(getattr(vision, "model_type", ""), {}),
            **({"deepstack": deepstack} if deepstack else {})}  # fmt: skip


def deepstack_values(vision: Any) -> int:
    """Values per patch of the DeepStack features a tower's forward keeps while its later layers run, from its
    config ``vision`` (Qwen3-VL's, ``transformers`` 5.24: the output of each layer of ``deepstack_visual_indexes``
    goes through its ``deepstack_merger_list`` merger, ``out_hidden_size`` values a merged token of
    ``spatial_merge_size`` squared patches, appended to a list returned at the end): those of every index a later
    layer follows (of ``depth`` layers; all of them where the depth is not known); 0 for a tower without."""
    indexes = list(getattr(vision, "deepstack_visual_indexes", None) or ())
    if not indexes:
        return 0
    depth = int(getattr(vision, "depth", 0) or 0)
    followed = sum(1 for j in indexes if not depth or j < depth - 1)
    return followed * int(vision.out_hidden_size) // int(vision.spatial_merge_size) ** 2


@dataclass(frozen=True)
class VisionShapes:
    """A vision tower's shapes per image: ``patches`` (all crops) of width ``hidden`` (``intermediate`` in its MLP),
    the float32 values of its ``pixel_values`` (``pixels``) and of the projector's input (``projector_in``: the
    tower's output, pixel-shuffled or merged: ``patches x hidden``); its ``layers`` and attention ``heads``, and its
    layers' kind (read only when the tower trains: :func:`tower_layer_bytes`): ``norm`` (``"layer"``: LayerNorm;
    ``"rms"``: RMSNorm), ``mlp`` (``"gelu"``: ``fc2(act(fc1(x)))`` with an activation that saves its input, GELU or
    its tanh form; ``"quick_gelu"``: the same with ``x * sigmoid(1.702 x)``; ``"gated"``:
    ``down_proj(act(gate_proj(x)) * up_proj(x))``) and ``attention`` (``"split"``: ``q/k/v_proj`` and ``out_proj``
    over the whole batch; ``"fused"``: the Qwen towers' one ``qkv`` projection, rotary ``q`` and ``k``, attention run
    image by image and the outputs concatenated before ``out_proj``); ``layer_scale``: each branch's output is
    multiplied by a learned per-channel scale before the residual addition (InternViT's ``lambda_1`` and
    ``lambda_2``); ``qk_norm``: RMSNorms over the whole query and key projections' outputs before attention
    (InternViT-6B's ``q_norm`` and ``k_norm``); ``block_mask``: the tower runs every image's patches as one sequence
    under a block-diagonal attention mask of ``(all patches)^2`` values in the weights' dtype, held through its
    layers (Pixtral's ``generate_block_attention_mask`` without flash attention); ``pixel_copy``: what the model makes
    of the pixels before its tower runs (:data:`PIXEL_COPIES`, ``"none"`` for none). What a frozen forward holds
    beside its layers (:func:`frozen_tower_bytes`): ``rotary``: the rotary tables, ``cos`` and ``sin`` of
    ``hidden // heads`` values a patch each (``"float32"``: the Qwen towers' and GLM-4.1V's; ``"weights"``: in the
    weights' dtype, Pixtral's; ``"none"``: no rotary), and the int64 position ids they are made of (two a patch);
    ``embeddings_kept``: the tensors of ``hidden`` values a patch that the tower's forward keeps beside its residual
    stream while its second and later layers run (1: the embeddings, alive as the encoder's ``inputs_embeds`` in
    SigLIP's, CLIP's and InternViT's towers; 2 in Pixtral's: ``ln_pre``'s output so, and the ``patch_conv`` output
    that ``patch_embeds_list``'s views keep; 0: the Qwen towers and GLM-4.1V run their blocks in the tower's own
    forward); ``position_taps``: a learned position embedding interpolated from ``position_taps`` rows a patch
    (Qwen3-VL's bilinear ``pos_embed``, 4); ``deepstack``: values a patch of the DeepStack features kept to the
    tower's end (:func:`deepstack_values`)."""

    hidden: int
    intermediate: int
    patches: int
    pixels: int
    layers: int = 0
    heads: int = 0
    norm: str = "layer"
    mlp: str = "gelu"
    attention: str = "split"
    layer_scale: bool = False
    qk_norm: bool = False
    block_mask: bool = False
    pixel_copy: str = "none"
    rotary: str = "none"
    embeddings_kept: int = 0
    position_taps: int = 0
    deepstack: int = 0

    def __post_init__(self) -> None:
        for field, valid in (("norm", ("layer", "rms")), ("mlp", ("gelu", "quick_gelu", "gated")),
                             ("attention", ("split", "fused")),
                             ("pixel_copy", ("none", "select", "crops", "cast")),
                             ("rotary", ("none", "float32", "weights"))):  # fmt: skip
            if getattr(self, field) not in valid:
                raise ValueError(f"VisionShapes.{field}={getattr(self, field)!r}; valid: {', '.join(valid)}")
        if self.rotary != "none" and self.heads <= 0:
            raise ValueError(f"VisionShapes.rotary={self.rotary!r} needs the attention heads (its tables' width)")

    @property
    def projector_in(self) -> int:
        return self.patches * self.hidden

    @classmethod
    def of(cls, config: Any, pixel_values: Any, images: int) -> VisionShapes:
        """The shapes of a VLM's ``vision_config`` and one batch's ``pixel_values`` of ``images`` images (a patch of
        ``patch_size`` squared pixels, or ``patch_size`` = ``(height, width)``, times ``temporal_patch_size``)."""
        vision = config.vision_config
        hidden = int(getattr(vision, "embed_dim", 0) or vision.hidden_size)  # Qwen2-VL: embed_dim is the tower's
        intermediate = mlp_width(vision, hidden)
        size = vision.patch_size  # an int, or (height, width): InternViT's
        high, wide = (size, size) if isinstance(size, int) else size
        patch = int(high) * int(wide) * int(getattr(vision, "temporal_patch_size", 1) or 1)
        pixels = pixel_values.numel() // images
        layers = int(getattr(vision, "depth", 0) or getattr(vision, "num_hidden_layers", 0) or 0)
        heads = int(getattr(vision, "num_heads", 0) or getattr(vision, "num_attention_heads", 0) or 0)
        copy = PIXEL_COPIES.get(getattr(config, "model_type", ""), "none")
        return cls(hidden, intermediate, pixels // (3 * patch), pixels, layers, heads, **tower_kind(vision),
                   pixel_copy=copy)  # fmt: skip


@dataclass(frozen=True)
class Training:
    """How the step trains: ``lm`` = ``"full"`` (the language model's weights train), ``"lora"`` (adapters of
    ``rank`` on ``targets``, base and norms frozen) or ``"frozen"``; ``weights_bytes`` of the frozen base (2 or 4);
    bf16 ``autocast``; gradient ``checkpointing``; whether an attention ``mask`` is passed (padded batches); the
    vision ``tower`` likewise (``"frozen"``, ``"lora"`` with adapters of ``rank`` on ``tower_targets``, SigLIP's
    names of :data:`TOWER_TARGETS`, or ``"full"``); ``cpu``: the step runs on the CPU, whose LayerNorm keeps its
    mean and rstd in the input's dtype and which autocast leaves in bf16 (CUDA keeps them in float32, and its
    autocast runs LayerNorm in float32: the default, the GPU a run is sized for)."""

    lm: str = "full"
    weights_bytes: int = 4
    autocast: bool = False
    checkpointing: bool = False
    rank: int = 16
    targets: tuple[str, ...] = LM_TARGETS
    mask: bool = True
    projector_trains: bool = True
    tower: str = "frozen"
    tower_targets: tuple[str, ...] = ()
    cpu: bool = False

    def __post_init__(self) -> None:
        for part in ("lm", "tower"):
            if getattr(self, part) not in ("full", "lora", "frozen"):
                raise ValueError(f"Training.{part}={getattr(self, part)!r}; valid: full, lora, frozen")

    @property
    def residual(self) -> int:
        """Bytes of the residual stream: the weights' dtype (float32 weights stay float32 under autocast: the
        embedding and the residual additions are not autocast)."""
        return 4 if self.lm == "full" else self.weights_bytes

    @property
    def linear(self) -> int:
        """Bytes of a projection's output."""
        return 2 if self.autocast or self.residual == 2 else 4


@dataclass(frozen=True)
class Step:
    """One step's shapes, per process: ``images``, each with a prompt of ``prompt`` tokens (padding included) and
    ``captions`` scored captions of ``tokens`` tokens; ``shared``: one prompt pass per image feeding its captions (the
    KV cache repeated; RL objectives, checkpointed or not), else the prompt is run again for each caption;
    ``chunked``: under checkpointing the captions are scored through the head in vocabulary chunks (MLE and the RL
    objectives; SMILE's subset softmax reads whole logits); ``reference``: the GRPO KL's reference pass scores the
    captions once more before the step (module docstring); ``own_forward``: a caption's row is scored by the model's
    own forward over its image's pixels, so without the shared prompt the vision tower runs for every row (the
    transformers families since 2026-11-26, a4857391), else the rows read prompt embeddings made once per image
    (the world VLM; every VLM before that commit, as the first H200 run measured it:
    ``benchmarks/memory_forecast.py``)."""

    images: int
    prompt: int
    captions: int
    tokens: int
    shared: bool = False
    chunked: bool = True  # under checkpointing the vocabulary is scored in chunks (MLE, RL; not SMILE's subsets)
    reference: bool = False  # grpo.kl_coef > 0: the captions scored again without gradient, their whole logits held
    own_forward: bool = True  # rows scored by the model's own forward over the pixels (False: prompt embeddings)


def _inputs(train: Training, width: int, x_bytes: int, names: tuple[str, ...], saved: bool) -> int:
    """Bytes saved for the projections ``names`` reading one input of ``width`` features and ``x_bytes`` a feature
    (``saved``: that input is already counted as saved by another node)."""
    if train.lm == "full":
        if train.autocast and x_bytes != 2:
            return 2 * width * len(names)  # one bf16 cast per call
        return 0 if saved else x_bytes * width
    if train.lm == "frozen":
        return 0
    adapted = [n for n in names if n in train.targets]
    if not adapted:
        return 0
    hidden = train.rank * (2 if train.autocast else 4) * len(adapted)  # lora_B saves lora_A's output
    if train.autocast:
        return 2 * width * len(adapted) + hidden
    if x_bytes == 4:
        return (0 if saved else 4 * width) + hidden
    return 4 * width * len(adapted) + hidden  # peft's float32 copy per adapter


def layer_bytes(lm: LmShapes, train: Training) -> int:
    """Bytes one decoder layer saves per token (module docstring), the attention mask aside
    (:func:`mask_bytes`)."""
    h, r, lb = lm.hidden, train.residual, train.linear
    norm_trains = train.lm == "full"
    norm = 4 * h + 4 + (r * h if norm_trains else 0)  # float32 input, rsqrt (one float), hn
    kv = lm.q if train.mask else lm.kv
    attention = lb * (lm.q + 2 * kv + lm.q) + 4 * lm.heads
    mlp = 3 * lb * lm.intermediate
    projections = (
        _inputs(train, h, r, ("q_proj", "k_proj", "v_proj"), False)
        + _inputs(train, lm.q, lb, ("o_proj",), saved=True)  # sdpa's output, saved by sdpa
        + _inputs(train, h, r, ("gate_proj", "up_proj"), False)
        + _inputs(train, lm.intermediate, lb, ("down_proj",), False)
    )
    return 2 * norm + attention + mlp + projections


def linear_weights(lm: LmShapes) -> int:
    """Weights of one decoder layer's projections."""
    return lm.hidden * (2 * lm.q + 2 * lm.kv + 3 * lm.intermediate)


def lora_weights(lm: LmShapes, train: Training) -> int:
    """Weights of one decoder layer's LoRA adapters (``rank x (in + out)`` per adapted projection)."""
    h, q, kv, i = lm.hidden, lm.q, lm.kv, lm.intermediate
    sizes = {"q_proj": h + q, "k_proj": h + kv, "v_proj": h + kv, "o_proj": q + h, "gate_proj": h + i,
             "up_proj": h + i, "down_proj": i + h}  # fmt: skip
    return train.rank * sum(sizes[t] for t in train.targets if t in sizes) if train.lm == "lora" else 0


def autocast_bytes(lm: LmShapes, train: Training) -> int:
    """The bf16 copies of float32 weights that autocast makes for each projection it runs and the backward pass
    keeps (the input's gradient reads the weight): per layer, the float32 projections (a full fine-tune's, or a
    float32 base's) and the LoRA adapters (float32 by ``model.trainable_dtype``), and the output head when it trains
    in float32; 0 without autocast."""
    if not train.autocast:
        return 0
    base = linear_weights(lm) if train.lm == "full" or train.weights_bytes == 4 else 0
    return 2 * (base + lora_weights(lm, train))


def mask_bytes(train: Training, rows: int, queries: int, keys: int) -> int:
    """The float copy of the attention mask ``sdpa`` saves per layer (``rows`` x ``queries`` x ``keys``)."""
    return train.linear * rows * queries * keys if train.mask else 0


def vocab_bytes(lm: LmShapes, train: Training, scored: int, chunked: bool = True) -> int:
    """The vocabulary's bytes at the step's peak for ``scored`` tokens: float32 log-softmax saved and two float32
    gradients of its size (``12 V`` a token), or under checkpointing one chunk's (module docstring)."""
    if train.checkpointing and chunked:
        return 12 * lm.vocab * min(scored, max(1, VOCAB_CHUNK_ELEMENTS // lm.vocab))
    return 12 * lm.vocab * scored


def reference_bytes(lm: LmShapes, train: Training, scored: int) -> int:
    """The peak of the GRPO KL's reference pass over ``scored`` positions: the logits in the projections' output
    dtype, their float32 copy divided by the temperature and its float32 log-softmax, of every position, or under
    checkpointing of one vocabulary chunk's positions (the policy's chunks) beside the last hidden states of all
    (module docstring)."""
    if train.checkpointing:
        rows = min(scored, max(1, VOCAB_CHUNK_ELEMENTS // lm.vocab))
        return (train.linear + 8) * lm.vocab * rows + train.linear * lm.hidden * scored
    return (train.linear + 8) * lm.vocab * scored


def tower_training(train: Training) -> Training:
    """The vision tower's own :class:`Training`: its mode (``train.tower``) and adapters (``train.tower_targets``,
    every linear layer when empty), the step's dtype and autocast, no attention mask."""
    return replace(train, lm=train.tower, targets=train.tower_targets or TOWER_TARGETS, mask=False,
                   tower="frozen", tower_targets=())  # fmt: skip


def tower_targets_of(names: Any) -> tuple[str, ...]:
    """``lora.encoder_targets`` as the SigLIP layer's names :func:`tower_layer_bytes` counts (:data:`TOWER_ROLES`);
    empty: every linear layer. A target is a module name or a dot-separated suffix of one (:mod:`finecap.models.lora`),
    so each is read by its longest suffix that names a counted layer (``self_attn.q_proj`` and ``mlp.fc1`` are
    ``q_proj`` and ``fc1``); a name none of whose suffixes does (e.g. the merger's ``mlp.0``), or whose suffix does
    but under a part of the tower outside its layers (:data:`TOWER_OUTSIDE`: ``patch_embed.proj`` is the patch
    embedding, not an attention's ``proj``), is kept as it is, adapting no layer counted here."""
    return tuple(dict.fromkeys(t for name in names for t in _tower_role(name)))


def _tower_role(name: str) -> tuple[str, ...]:
    """The names of :data:`TOWER_TARGETS` the target ``name`` is counted as (:func:`tower_targets_of`)."""
    parts = name.split(".")
    for start in range(len(parts)):
        suffix = ".".join(parts[start:])
        if suffix in TOWER_ROLES or suffix in TOWER_TARGETS:
            if any(part in TOWER_OUTSIDE for part in parts[:start]):
                return (name,)
            return TOWER_ROLES.get(suffix, (suffix,))
    return (name,)


def tower_linears(vision: VisionShapes) -> dict[str, tuple[int, int]]:
    """The linear layers of one tower layer of ``vision``'s kind, by the names of :data:`TOWER_TARGETS`: each one's
    inputs and outputs."""
    h, i = vision.hidden, vision.intermediate
    attention = {"qkv": (h, 3 * h)} if vision.attention == "fused" else {"q_proj": (h, h), "k_proj": (h, h),
                                                                         "v_proj": (h, h)}  # fmt: skip
    gated = {"gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
    mlp = gated if vision.mlp == "gated" else {"fc1": (h, i), "fc2": (i, h)}
    return {**attention, "out_proj": (h, h), **mlp}


def tower_layer_bytes(vision: VisionShapes, train: Training) -> int:
    """Bytes one trained vision-tower layer saves per patch (``train.tower``: ``"lora"`` or ``"full"``), a layer of
    ``vision``'s kind (:class:`VisionShapes`: ``x + attn(norm(x))``, then ``+ mlp(norm(x))``, attention through
    ``sdpa`` without a mask), by the rules of :func:`layer_bytes`:

    - a LayerNorm saves its input (under CUDA's autocast the float32 cast it runs on, whose float32 output the
      projections then read) and its mean and rstd (float32 on CUDA, the input's dtype on the CPU); an RMSNorm (which
      casts to float32 itself, on the CPU and CUDA alike) its float32 input and rsqrt, and when its weight trains the
      normalised input in the residual's dtype, the dtype of its output;
    - attention saves query, key, value, output and the log-sum-exp; with the fused ``qkv`` the value is a view of
      that projection's output, whose ``3h`` it holds whole (query and key are rotary's own tensors), and the
      per-image outputs are concatenated, so that ``out_proj`` reads (and saves, when it trains) a copy, not
      ``sdpa``'s output;
    - GELU saves ``fc1``'s output; QuickGELU (``x * sigmoid(1.702 x)``) that and the sigmoid's output; the gated MLP
      ``down(act(gate(x)) * up(x))`` ``gate``'s output, ``act(gate)`` and ``up``'s output (``3 l i``);
    - the projections their inputs (:func:`_inputs`, :func:`tower_linears`' names);
    - a layer scale (``lambda * branch``), when its scale trains (the whole tower), the branch's output: ``out_proj``'s
      and the MLP's, ``2 l h``;
    - the query and key RMSNorms (``qk_norm``) each their float32 input and rsqrt, and when their weights train the
      normalised input in the projections' output dtype, the dtype of their output.

    Measured per family by ``benchmarks/tower_forecast.py`` (docs/memory.md). Under autocast the layer's bf16 weight
    copies come on top (:func:`tower_autocast_bytes`, per layer, not per patch)."""
    t = tower_training(train)
    h, i, lb = vision.hidden, vision.intermediate, t.linear
    if vision.norm == "rms":
        normed = t.residual  # weight * x.to(input dtype)
        norm = 4 * h + 4 + (t.residual * h if t.lm == "full" else 0)  # float32 input, rsqrt, hn
    else:
        normed = 4 if t.autocast and not t.cpu else t.residual  # the norm's input as saved, and its output
        norm = normed * h + (2 * normed if t.cpu else 8)  # mean and rstd: float32 on CUDA
    if vision.attention == "fused":
        attention = lb * (h + h + 3 * h + h) + 4 * vision.heads  # q, k, the fused output (v), output, log-sum-exp
        qkv = _inputs(t, h, normed, ("qkv",), False)
    else:
        attention = lb * 4 * h + 4 * vision.heads
        qkv = _inputs(t, h, normed, ("q_proj", "k_proj", "v_proj"), False)
    out = _inputs(t, h, lb, ("out_proj",), saved=vision.attention == "split")  # sdpa's output, saved by sdpa
    if vision.mlp == "gated":
        mlp = 3 * lb * i + _inputs(t, h, normed, ("gate_proj", "up_proj"), False)
        mlp += _inputs(t, i, lb, ("down_proj",), False)  # the product, saved by nothing else
    else:
        mlp = (2 if vision.mlp == "quick_gelu" else 1) * lb * i + _inputs(t, h, normed, ("fc1",), False)
        mlp += _inputs(t, i, lb, ("fc2",), False)  # the activation's output, saved by nothing else
    scale = 2 * lb * h if vision.layer_scale and t.lm == "full" else 0
    qk_norm = 2 * (4 * h + 4 + (lb * h if t.lm == "full" else 0)) if vision.qk_norm else 0
    return 2 * norm + attention + qkv + out + mlp + scale + qk_norm


def tower_autocast_bytes(vision: VisionShapes, train: Training) -> int:
    """The bf16 copies of a trained tower layer's float32 weights that autocast makes and the backward pass keeps
    (as :func:`autocast_bytes`): its projections' (:func:`tower_linears`) when they train whole or are stored in
    float32, and its LoRA adapters' (``rank x (in + out)`` each); 0 without autocast."""
    t = tower_training(train)
    if not t.autocast:
        return 0
    linears = tower_linears(vision)
    base = sum(a * b for a, b in linears.values()) if t.lm == "full" or t.weights_bytes == 4 else 0
    lora = t.rank * sum(a + b for n, (a, b) in linears.items() if n in t.targets) if t.lm == "lora" else 0
    return 2 * (base + lora)


def tower_gradient_bytes(vision: VisionShapes, train: Training) -> int:
    """Bytes per patch of the gradients a trained tower layer's backward pass holds at once, counted where they are
    largest, at the MLP's output projection (``fc2``, the gated MLP's ``down_proj``): the gradient of the MLP's
    intermediate from the base projection (in the projections' output dtype) and, with an adapter there, the float32
    gradient of the copy peft casts its input to and that gradient cast back (measured on SigLIP's layer,
    docs/memory.md; the gated MLP is counted the same way, at ``down_proj``, not measured)."""
    t = tower_training(train)
    adapted = t.lm == "lora" and ("down_proj" if vision.mlp == "gated" else "fc2") in t.targets
    return vision.intermediate * (t.linear + (4 + t.linear if adapted else 0))


def rotary_table_bytes(vision: VisionShapes, element_bytes: int) -> int:
    """Bytes a patch of a tower's rotary tables, ``cos`` and ``sin`` of ``d = hidden / heads`` values each: float32
    (``vision.rotary`` ``"float32"``, the Qwen towers' and GLM-4.1V's) or of ``element_bytes`` (``"weights"``,
    Pixtral's); 0 without rotary (:func:`tower_shared_bytes`, :func:`frozen_tower_bytes`)."""
    if vision.rotary == "none":
        return 0
    return 2 * (4 if vision.rotary == "float32" else element_bytes) * (vision.hidden // vision.heads)


def tower_shared_bytes(vision: VisionShapes, train: Training, patches: int) -> tuple[int, int]:
    """What a trained tower's layers save beyond :func:`tower_layer_bytes` over ``patches`` patches in all, from
    ``transformers`` 5.24's code: ``(once, per_layer)``, the bytes saved once for all the layers (tensors every layer
    reads) and the bytes each layer saves of its own. The rotary tables, ``cos`` and ``sin`` (``2 d`` values a patch,
    ``d = hidden / heads``: every layer's rotary multiplies by the same two and saves them), float32 in the Qwen towers
    and GLM-4.1V, and Pixtral's in the dtype of ``ln_pre``'s output (its weight's: float32 for a whole tower, even
    under autocast); Pixtral's block mask over all the patches (``patches^2`` values, made in that dtype too), which
    ``sdpa`` saves: once, the same tensor in every layer, when it runs in the mask's dtype; under autocast with a
    float32 mask each layer's ``sdpa`` casts it to bf16 and saves its own copy (``2 patches^2`` a layer), the float32
    mask itself then saved by none (but under checkpointing, where each layer's inputs are kept, the mask among them,
    and only the recomputed layer's copy is formed)."""
    t = tower_training(train)
    tables = rotary_table_bytes(vision, t.residual)
    if not vision.block_mask:
        return patches * tables, 0
    made = t.residual * patches**2
    per_layer = 2 * patches**2 if t.autocast and t.residual != 2 else 0
    once = made if t.checkpointing or not per_layer else 0
    return patches * tables + once, per_layer


def tower_embedding_bytes(vision: VisionShapes, train: Training, images: int) -> int:
    """Bytes a trained patch embedding (a ``Conv2d``, the Qwen towers' and GLM-4.1V's ``Conv3d``) saves over
    ``images`` images as the tower sees them, once (not per layer), measured on every family's tiny model: only when
    the whole tower trains (``train.tower == "full"``: the convolution's weight trains, so it saves its input; a LoRA
    tower's embedding is frozen and saves nothing). Its input is the pixels as the model passes them, in the trained
    tower's float32: the batch's own ``pixel_values`` (counted by :func:`pixel_input_bytes`, nothing more) or the
    family's copy (``pixel_copy`` ``"select"``: Idefics's selected images, made in the model's dtype, the trained
    tower's float32; ``"crops"``: LLaVA-NeXT's and LLaVA-OneVision's float32 crops): ``4 p`` an image, the very copy
    :func:`pixel_copy_bytes` holds through the forward pass. Under autocast the convolution saves the bf16 cast of its
    input instead (``2 p`` an image, every family) and the bf16 copy of its weight (``2 x 3 x patch pixels x h``, once;
    as :func:`tower_autocast_bytes`)."""
    if tower_training(train).lm != "full":
        return 0
    p = vision.pixels
    if train.autocast:
        weight = vision.pixels // max(vision.patches, 1) * vision.hidden  # (3 x patch pixels) inputs, h outputs
        return images * 2 * p + 2 * weight
    return images * 4 * p if vision.pixel_copy in ("select", "crops") else 0


def frozen_tower_bytes(vision: VisionShapes, weights_bytes: int, patches: int) -> int:
    """Bytes a frozen tower of ``vision``'s kind holds at its forward pass's peak, beyond its inputs, running
    ``patches`` patches in one call without a graph (``w`` = ``weights_bytes``, the dtype of its activations; ``h``
    its width, ``i`` its MLP's, ``d = h / heads``), read from ``transformers`` 5.24's modeling code, a patch: the
    larger of its layers' phase and, in Qwen3-VL, its position embedding's. **The layers' phase**: the residual
    stream (the layer's input, ``w h``), what the tower holds beside it while its later layers run
    (:class:`VisionShapes`: the ``embeddings_kept``, ``w h`` each; the rotary tables, ``cos`` and ``sin``, ``2 x 4d``
    in float32 or ``2 w d`` in the weights' dtype, and their int64 position ids, ``16``; Qwen3-VL's interpolation
    indices and weights, int64 and float32, ``12`` a tap, and its float32 position embeddings, ``4h``; the DeepStack
    features, ``w`` a value), and
    the largest of one layer's phases above them:

    - attention, split (``q/k/v_proj``): the normed input, query, key, value, and the output and its transposed
      copy (``out_proj`` then reads the copy): ``6 w h``; Pixtral's rotary (in ``w``, below its MLP's at ``i = 4h``)
      not counted;
    - attention, fused (the Qwen towers' and GLM-4.1V's ``qkv``): the normed input and ``qkv``'s output (``4 w h``),
      then rotary in float32 (``apply_rotary_pos_emb_vision``): the float32 casts of query and key (``8h``; none in
      float32 weights, where ``.float()`` returns the tensor itself), the rotated query (``4h``) and, while the key
      is rotated, ``k * cos``, ``rotate_half(k) * sin`` and their sum (``12h``);
    - the MLP: the stream after attention and the normed input (``2 w h``; with a layer scale also the scaled
      attention branch, still referenced: ``w h``) and ``fc1``'s output and the activation's (GELU: ``2 w i``),
      or with QuickGELU's ``x * sigmoid(1.702 x)`` the sigmoid and the product too (``3 w i``), or the gated MLP's
      ``act(gate)``, ``up`` and their product (``3 w i``);
    - an RMSNorm (it casts to float32): the stream after attention, its float32 copy and ``pow``'s output, then in
      its place the normed product (``w h + 8h``; its cast back and ``weight *``'s output, ``2 w h``, come after the
      copy is freed); in float32 weights (no copy: ``.to`` returns the stream) the stream, the normed product and
      ``weight *``'s output, all float32 (``12h``).

    **Qwen3-VL's position embedding** (``position_taps``, before the first layer): the patch embedding (``w h``), the
    position ids and the interpolation's indices and weights, the embedding rows looked up (``taps x w h``), their
    float32 cast as the float32 weights multiply them (``taps x 4h``; none in float32) and the product (``taps x 4h``).

    With a ``block_mask`` the tower also holds the mask over all ``patches`` (``w patches^2``). Not counted: the
    tower's fixed buffers and small tables (Qwen2.5-VL's window order, the sequence lengths), the DeepStack mergers'
    own temporaries (four of ``w h`` at most, below a layer's), the CPU kernels' scratch buffers (oneDNN's, and
    ``sdpa``'s CPU flash kernel with a mask: threads x blocks of up to 256 x 512 float32 and bf16 scores, which grow
    with the sequence up to that size), and autocast (the activations counted in ``w``). Measured on the CPU per
    family by ``benchmarks/tower_forecast.py --frozen`` (docs/memory.md, "The frozen vision tower")."""
    w, h, i = weights_bytes, vision.hidden, vision.intermediate
    cast = w != 4  # a float32 copy of a tensor in the weights' dtype (none in float32)
    rotary = (8 * h if cast else 0) + 16 * h  # the fused attention's float32 rotary
    attention = 4 * w * h + rotary if vision.attention == "fused" else 6 * w * h
    mlp = (2 + vision.layer_scale) * w * h + (2 if vision.mlp == "gelu" else 3) * w * i
    norm = w * h + (8 * h if cast else 4 * h + w * h) if vision.norm == "rms" else 0  # float32: product and output
    ids = 16 if vision.rotary != "none" else 0  # int64 (row, column) a patch
    tables = ids + rotary_table_bytes(vision, w) if ids else 0
    interpolation = 12 * vision.position_taps  # int64 indices and float32 weights, a tap
    # one layer: the embeddings are its stream (a tower keeping none keeps none: until 2026-11-29 it was -1)
    embedded = max(vision.embeddings_kept - (vision.layers == 1), 0)
    beside = embedded * w * h + tables + (interpolation + 4 * h if vision.position_taps else 0) + w * vision.deepstack
    layers = w * h + beside + max(attention, mlp, norm)
    taps = vision.position_taps
    position = w * h + ids + interpolation + taps * (w * h + (4 * h if cast else 0) + 4 * h) if taps else 0
    return patches * max(layers, position) + (w * patches**2 if vision.block_mask else 0)


def pixel_copy_bytes(vision: VisionShapes, weights_bytes: int) -> int:
    """Bytes per image that the model's ``get_image_features`` makes of the batch's pixels before the tower runs and
    holds while it runs (its locals; ``w`` = ``weights_bytes``, ``p`` = ``vision.pixels``, float32 values from the
    processor), by ``vision.pixel_copy`` (:data:`PIXEL_COPIES`): ``"select"``: the real images' copy in the weights'
    dtype (boolean indexing copies, float32 too: ``w p``), their int64 pixel mask's copy (one value a pixel position:
    ``8 p / 3``) and the patch mask (a bool a patch); ``"crops"``: the crops concatenated, float32 (``4 p``);
    ``"cast"``: the cast to the weights' dtype (``w p``; none in float32). Not counted: what is freed before the
    tower's first layer (Idefics's padding-image test ``pixel_values == 0.0``, its first cast, the patch mask's sums;
    the patch embedding's cast) and the batch's own inputs (:func:`pixel_input_bytes`)."""
    w, p = weights_bytes, vision.pixels
    if vision.pixel_copy == "select":
        return w * p + 8 * p // 3 + vision.patches
    if vision.pixel_copy == "crops":
        return 4 * p
    if vision.pixel_copy == "cast":
        return w * p if w != 4 else 0
    return 0


def pixel_input_bytes(vision: VisionShapes) -> int:
    """Bytes per image of the batch's image inputs on the device: the float32 ``pixel_values`` (``4 p``) and, for the
    families that read one (``pixel_copy`` ``"select"``), the processor's int64 ``pixel_attention_mask`` (``8 p / 3``:
    one value a pixel position)."""
    return 4 * vision.pixels + (8 * vision.pixels // 3 if vision.pixel_copy == "select" else 0)


def activation_forecast(lm: LmShapes, train: Training, step: Step, vision: VisionShapes | None = None) -> dict:
    """Bytes of one step's activations at its peak, by part: ``lm`` (the decoder layers and final norm, per the
    prompt and the captions), ``mask``, ``vocab``, ``images`` (pixel values and the projector's input), ``tower``
    (the frozen vision tower's temporaries), ``reference`` (the KL's reference pass, before the step), and ``peak``
    (the sum of the first five, or the tower's temporaries and the images, or the reference pass, whichever is
    largest); ``per_image`` and ``per_caption``: what one more image (with its captions) or one more caption per
    image adds."""
    out = _forecast(lm, train, step, vision)
    if step.images > 1:
        fewer = replace(step, images=step.images - 1)
        out["per_image"] = out["peak"] - _forecast(lm, train, fewer, vision)["peak"]
    if step.captions > 1:
        fewer = replace(step, captions=step.captions - 1)
        out["per_caption"] = (out["peak"] - _forecast(lm, train, fewer, vision)["peak"]) // step.images
    return out


def _forecast(lm: LmShapes, train: Training, step: Step, vision: VisionShapes | None) -> dict:
    """:func:`activation_forecast` by part, without the increments."""
    rows = step.images * step.captions
    caption_positions = step.tokens - 1  # the last token is scored, never read
    if step.shared:
        sequences = [(step.images, step.prompt, step.prompt), (rows, caption_positions, step.prompt + step.tokens)]
    else:
        sequences = [(rows, step.prompt + caption_positions, step.prompt + caption_positions)]
    per_token = layer_bytes(lm, train)
    tokens = sum(n * q for n, q, _ in sequences)
    norm_final = 4 * lm.hidden + (train.residual * lm.hidden if train.lm == "full" else 0)
    mask = sum(mask_bytes(train, n, q, k) for n, q, k in sequences)
    extra_kv = 0
    if step.shared:  # each caption's attention saves its rows' keys and values over the prompt
        kv = lm.q if train.mask else lm.kv
        extra_kv = rows * step.prompt * 2 * train.linear * kv
    casts = autocast_bytes(lm, train)
    head_cast = 2 * lm.vocab * lm.hidden if train.autocast and train.lm == "full" else 0
    if train.checkpointing:
        kept = tokens * train.residual * lm.hidden * lm.layers  # each layer's input
        if step.shared:  # the prompt's keys and values, once per image, in the cache the captions read
            kept += step.images * step.prompt * (train.residual + train.linear) * lm.kv * lm.layers
        # one layer of one pass at a time (the captions' pass, then the prompt's: each its own checkpoint)
        passes = [n * q * per_token + mask_bytes(train, n, q, k) for n, q, k in sequences]
        passes[-1] += extra_kv  # the captions' rows of the prompt's keys and values
        recomputed = max(passes) + casts
        layers = kept + recomputed + tokens * norm_final
        mask_total = 0
    else:
        layers = lm.layers * (tokens * per_token + extra_kv + casts) + tokens * norm_final
        mask_total = lm.layers * mask
    vocab = vocab_bytes(lm, train, rows * step.tokens, step.chunked)
    if train.lm == "full":  # the head's weight gradient as the backward pass forms it, before it is accumulated
        vocab += 4 * lm.vocab * lm.hidden
    images = tower = tower_saved = tower_backward = held = 0
    if vision is not None:
        # without the shared prompt each caption's row runs the model's own forward, vision tower included: the
        # image's pixel values are copied per row and the tower and projector see every row (not where the rows read
        # prompt embeddings made once per image: Step.own_forward)
        seen = step.images if step.shared or step.captions == 1 or not step.own_forward else rows
        copies = seen if seen != step.images else 0
        images = pixel_input_bytes(vision) * (step.images + copies)
        if train.projector_trains:  # its input, cast to the projector's float32 (bf16 under autocast)
            images += (2 if train.autocast else 4) * vision.projector_in * seen
        # the stream and one layer, over what the model made of the pixels before the tower ran (held through it;
        # a trained tower's forward peaks with them too, freed before its backward pass but where a whole tower's patch
        # embedding saves that copy: tower_embedding_bytes)
        tower = frozen_tower_bytes(vision, train.weights_bytes, seen * vision.patches)
        copy = pixel_copy_bytes(vision, 4 if train.tower == "full" else train.weights_bytes)  # a whole tower: float32
        tower += seen * copy
        rows_run, positions, _ = sequences[0]  # the pass that runs the tower embeds its ids first (held through it)
        tower += rows_run * positions * lm.hidden * train.weights_bytes
        if train.tower != "frozen":
            if vision.layers <= 0 or vision.heads <= 0:
                raise ValueError(f"a trained vision tower needs its layers and heads: {vision}")
            patches = seen * vision.patches
            once, own = tower_shared_bytes(vision, train, patches)  # rotary tables, Pixtral's block mask
            layer = patches * tower_layer_bytes(vision, train) + tower_autocast_bytes(vision, train) + own
            gradients = patches * tower_gradient_bytes(vision, train)
            embedding = tower_embedding_bytes(vision, train, seen)  # a whole tower's patch embedding saves its input
            once += embedding
            if train.checkpointing:  # each layer's input kept; one layer recomputed at a time in the backward pass
                tower_saved = vision.layers * patches * tower_training(train).residual * vision.hidden + once
                tower_backward = layer + gradients
            else:
                tower_saved, tower_backward = vision.layers * layer + once, gradients
            if not train.autocast:  # the embedding saves the very copy the forward pass holds (select, crops)
                held = embedding
    total = layers + head_cast + mask_total + vocab + images + tower_saved
    reference = reference_bytes(lm, train, rows * step.tokens) if step.reference else 0
    # the tower's backward pass runs after the language model's, whose activations are freed by then
    peak = max(total, tower + images + tower_saved - held, tower_saved + tower_backward + images, reference)
    out = {
        "lm": layers + head_cast,
        "mask": mask_total,
        "vocab": vocab,
        "images": images,
        "tower": tower,
        "tower_saved": tower_saved,
        "tower_backward": tower_backward,
        "reference": reference,
        "peak": peak,
    }
    return out


def training_of(cfg: Any, padded: bool = True) -> Training:
    """The :class:`Training` of a run's configuration (``model``, ``lora``, ``train``); ``padded``: whether its
    batches pass an attention mask (captions of different lengths do)."""
    lm = ("lora" if cfg.lora.lm else "full") if cfg.model.train_lm else "frozen"
    weights = 2 if cfg.model.dtype in ("bfloat16", "float16") else 4
    targets = tuple(cfg.lora.lm_targets) or LM_TARGETS
    tower = ("lora" if cfg.lora.encoder else "full") if cfg.model.train_encoder else "frozen"
    return Training(lm, weights, cfg.train.mixed_precision in ("bf16", "fp16"), cfg.train.gradient_checkpointing,
                    cfg.lora.rank, targets, padded, tower=tower,
                    tower_targets=tower_targets_of(cfg.lora.encoder_targets))  # fmt: skip


def step_of(cfg: Any, batch: dict[str, Any], rl: Any | None, shares_prompt: bool) -> Step:
    """The :class:`Step` of a run's first batch (``prompt_ids``, ``input_ids``): an RL objective (``rl``: its
    ``rl`` section) scores ``rl.samples`` captions of up to ``decode.max_length`` tokens per image (EOS included),
    after one prompt pass per image when the model ``shares_prompt`` and samples several; else one teacher-forced
    caption per image."""
    images, prompt = batch["prompt_ids"].shape
    chunked = cfg.train.objective in CHUNKED
    if rl is None:
        return Step(int(images), int(prompt), 1, int(batch["input_ids"].shape[1]), chunked=chunked)
    shared = shares_prompt and rl.samples > 1  # one caption per image: teacher forcing (Vlm.sequence_logits)
    return Step(int(images), int(prompt), int(rl.samples), int(cfg.decode.max_length), shared, chunked,
                has_reference(cfg))  # fmt: skip


def has_reference(cfg: Any) -> bool:
    """Whether a run's objective scores its captions under the KL's reference policy (``grpo.kl_coef > 0``)."""
    return cfg.train.objective in GRPO_OBJECTIVES and cfg.grpo.kl_coef > 0


def forecast_of_run(model: Any, cfg: Any, batch: dict[str, Any], objective: Any,
                    cpu: bool = False) -> dict[str, Any] | None:  # fmt: skip
    """The activation forecast (:func:`activation_forecast`) of a run's first batch, for a VLM whose own forward
    reads prompt ids (``model.kind=vlm`` with a pretrained checkpoint), stepping on the CPU (``cpu``: ``Training.cpu``)
    or CUDA; ``None`` for other captioners (no model of their shapes here)."""
    config = getattr(getattr(model, "model", None), "config", None)
    if cfg.model.kind != "vlm" or config is None or "prompt_ids" not in batch or not hasattr(config, "text_config"):
        return None
    padded = any(not bool(batch[k].bool().all()) for k in ("prompt_mask", "attention_mask") if k in batch)
    rl = getattr(objective, "rl", None)
    shares = bool(getattr(model, "share_prompt", False)) and prompt_shareable(cfg.train.gradient_checkpointing)
    train = training_of(cfg, padded or rl is not None)  # sampled captions end at different lengths
    step = step_of(cfg, batch, rl, shares)
    vision = VisionShapes.of(config, batch["pixel_values"], step.images) if "pixel_values" in batch else None
    train = replace(train, projector_trains=bool(getattr(cfg.vlm, "train_projector", True)), cpu=cpu)
    return {"step": step, "training": train, "bytes": activation_forecast(LmShapes.of(config), train, step, vision)}


def size(n: int | float) -> str:
    """Bytes as GiB (from 1 GiB) or MiB."""
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / 2**20:.1f} MiB"


def vllm_share(vllm: Any, device_bytes: int | None, weights: int = 0) -> int:
    """Bytes a colocated vLLM engine reserves by its section ``vllm`` (:meth:`VllmEngine.device_share
    <finecap.engines.vllm.VllmEngine.device_share>`): ``vllm.gpu_memory_utilization`` of the device's memory (its
    weights and KV cache), or, when ``vllm.kv_cache_memory_bytes`` is set (vLLM then ignores the utilization and sizes
    only its KV cache so), that KV cache plus the engine's own copy of the weights (``weights``:
    :func:`engine_weights`); 0 with the utilization on a device of unknown size."""
    if vllm.kv_cache_memory_bytes:
        return int(vllm.kv_cache_memory_bytes) + weights
    return int(vllm.gpu_memory_utilization * device_bytes) if device_bytes else 0


def engine_weights(model: Any, element_bytes: int) -> int:
    """Bytes of a vLLM engine's copy of the transformers ``model`` it serves, in a dtype of ``element_bytes``: every
    weight once (tied ones once), LoRA adapters merged into their base weights (so not counted themselves)."""
    return element_bytes * sum(weight_count(p) for name, p in model.named_parameters() if "lora_" not in name)


def forecast_text(memory: dict[str, int], forecast: dict[str, Any] | None, device_bytes: int | None,
                  measured: bool, vllm: int = 0, beside: dict[str, int] | None = None,
                  asleep: bool = False) -> list[str]:  # fmt: skip
    """The lines ``--dry-run`` prints: the activation forecast by part, per image and per caption, the total with
    weights, gradients and optimizer state (``memory``: :func:`finecap.models.memory.training_memory`), what else the
    run keeps on the device (``beside``: bytes by what they are, e.g. the frozen retrievers, the KL reference's copy
    of the trained weights) and the vLLM share (``vllm`` bytes: the engine's
    :meth:`~finecap.engines.base.GenerationEngine.device_share`) against the device's memory (``device_bytes``;
    ``None``: unknown), and whether the activation line is a forecast only (``measured``: a CUDA step's peak
    follows). ``asleep``: the engine sleeps between rollouts (``vllm.enable_sleep_mode``: its weights and KV cache
    off the device while the step runs), so its share and the step's activations are never held together: the total
    counts the larger of the two, not both."""
    if forecast is None:
        return ["activations: no forecast for this captioner (a model of VLM shapes only): the step below measures"]
    b, step = forecast["bytes"], forecast["step"]
    what = "forecast (a CUDA step below measures the peak)" if measured else "a forecast, not a measurement"
    per = ", ".join(f"{k.replace('_', ' ')} {size(b[k])}" for k in ("per_image", "per_caption") if k in b)
    rows = [
        f"activations ({what}): {step.images} images x {step.captions} captions, prompt {step.prompt} tokens"
        f"{' shared' if step.shared else ''}, caption {step.tokens} tokens: language model {size(b['lm'])}, "
        f"attention mask {size(b['mask'])}, vocabulary {size(b['vocab'])}, images {size(b['images'])}, "
        f"vision tower {size(b['tower'])}"
        + (
            f", the trained tower's saved activations {size(b['tower_saved'])} and its backward pass "
            f"{size(b['tower_backward'])}"
            if b.get("tower_saved")
            else ""
        )  # fmt: skip
        + (f", the KL's reference pass {size(b['reference'])}" if b.get("reference") else "")
        + f"; peak {size(b['peak'])}"
        + (f" ({per})" if per else ""),
    ]
    beside = {k: v for k, v in (beside or {}).items() if v}
    if beside:
        rows.append("kept beside the model: " + ", ".join(f"{k} {size(v)}" for k, v in beside.items()))
    engine_and_step = max(b["peak"], vllm) if asleep else b["peak"] + vllm
    total = memory["total"] + sum(beside.values()) + engine_and_step
    if vllm:
        rows.append(
            f"vLLM share (weights and KV cache): {size(vllm)}"
            + (" (asleep during the step: the larger of it and the activations counted)" if asleep else "")
        )
    against = f" of {size(device_bytes)} on this device ({total / device_bytes:.0%})" if device_bytes else ""
    rows.append(f"forecast total per process (weights, gradients, AdamW, activations): {size(total)}{against}")
    return rows


@dataclass(frozen=True)
class Backbone:
    """A reference backbone for sizing recipes without loading it: its language model's and vision tower's shapes,
    the prompt's tokens per image under a recipe's pixel budget (:data:`BUDGET_PIXELS`), its parameter counts
    (language model with its head, vision tower, projector), and each linear layer of the vision tower's layers
    (``vision.layers``) a LoRA adapter may target there (``vision_linears``: name, inputs + outputs; the family's
    default targets, all of them)."""

    name: str
    lm: LmShapes
    vision: VisionShapes
    prompt: int
    lm_params: int
    vision_params: int
    projector_params: int
    vision_linears: tuple[tuple[str, int], ...]

    def lm_layers_lora(self, train: Training) -> int:
        """The language model's LoRA parameters (:func:`lora_weights` of every layer)."""
        return self.lm.layers * lora_weights(self.lm, train)

    def vision_lora(self, rank: int, targets: tuple[str, ...] = ()) -> int:
        """The vision tower's LoRA parameters: ``rank x (in + out)`` of each targeted linear layer of every layer
        (``targets`` empty: the family's defaults, every one of :attr:`vision_linears`); ``ValueError`` naming
        ``lora.encoder_targets`` for a target this backbone's sizing does not know."""
        sizes = dict(self.vision_linears)
        unknown = [t for t in targets if t not in sizes]
        if unknown:
            raise ValueError(f"lora.encoder_targets: {unknown[0]!r} is not a vision linear layer the sizing of "
                             f"{self.name} knows ({', '.join(sizes)})")  # fmt: skip
        return self.vision.layers * rank * sum(sizes[t] for t in (targets or tuple(sizes)))


BUDGET_PIXELS = 512 * 512
"""The pixel budget (``vlm.image_max_pixels``) the ``coco/*_vlm`` recipes set and :data:`BACKBONES` assume."""
BACKBONES = {
    # SmolVLM-256M-Instruct (config.json): one 512 px crop under the budget: 64 image tokens + 14 of text (78, the
    # prompt gpu_check measured); SigLIP 512 px / 16 = 1,024 patches of 768; parameters counted on the model built
    # from this config on the meta device (language model 134.6 M + its untied head 28.4 M, tower, connector); the
    # tower's LoRA targets (finecap.models.vlm.VIT_TARGETS) per layer: attention 4 x 768 -> 768, fc1 768 -> 3,072, fc2
    "SmolVLM-256M": Backbone("SmolVLM-256M", LmShapes(30, 576, 1536, 9, 3, 49_280),
                             VisionShapes(768, 3072, 1024, 3 * 512 * 512, 12, 12, pixel_copy="select",
                                          embeddings_kept=1), 78,
                             162_974_016, 86_433_024,
                             7_077_888, (("q_proj", 1536), ("k_proj", 1536), ("v_proj", 1536), ("out_proj", 1536),
                                  ("fc1", 3840), ("fc2", 3840))),
    # Qwen2-VL-2B-Instruct (config.json): 640 x 480 under 262,144 pixels -> 588 x 420 = 42 x 30 patches of 14 px
    # (1,260 of width 1,280, 1,176 floats each), merged 2 x 2 into 315 image tokens + about 20 of text; head tied;
    # parameters counted as SmolVLM's (2.209 B in all; the projector is visual.merger)
    # the tower's LoRA targets (QWEN_VIT_TARGETS) per layer: qkv 1,280 -> 3,840, proj, fc1 1,280 -> 5,120, fc2; its
    # layers' kind (tower_kind of its vision config): LayerNorm, the fused rotary qkv run image by image, QuickGELU,
    # float32 rotary tables; get_image_features casts the pixels to the weights' dtype (PIXEL_COPIES)
    "Qwen2-VL-2B": Backbone("Qwen2-VL-2B", LmShapes(28, 1536, 8960, 12, 2, 151_936),
                            VisionShapes(1280, 5120, 1260, 1260 * 1176, 32, 16, mlp="quick_gelu", attention="fused",
                                         pixel_copy="cast", rotary="float32"),
                            335, 1_543_714_304, 631_183_360, 34_087_936,
                            (("qkv", 5120), ("attn.proj", 2560), ("fc1", 6400), ("fc2", 6400))),
}  # fmt: skip


def recipe_state(cfg: Any, backbone: Backbone) -> dict[str, int]:
    """Bytes of weights, gradients and AdamW state of a VLM recipe's configuration on ``backbone`` (as
    :func:`finecap.models.memory.training_memory` counts them on the built model): frozen weights in
    ``model.dtype``, what trains (LoRA adapters of ``lora.rank`` on ``lora.lm_targets`` per layer, or the whole
    language model; with ``model.train_encoder`` the vision tower's adapters on ``lora.encoder_targets``, or the
    whole tower; the projector with ``vlm.train_projector``) in float32 (``model.trainable_dtype``)."""
    train = training_of(cfg)
    frozen_bytes = 2 if cfg.model.dtype in ("bfloat16", "float16") else 4
    lm_trains = cfg.model.train_lm and not cfg.lora.lm
    tower_trains = cfg.model.train_encoder and not cfg.lora.encoder
    trainable = backbone.lm_layers_lora(train) if cfg.model.train_lm and cfg.lora.lm else 0
    trainable += backbone.lm_params if lm_trains else 0
    if cfg.model.train_encoder:
        trainable += backbone.vision_params if tower_trains else backbone.vision_lora(
            cfg.lora.rank, tuple(cfg.lora.encoder_targets))  # fmt: skip
    trainable += backbone.projector_params if cfg.vlm.train_projector else 0
    frozen = (0 if tower_trains else backbone.vision_params) + (0 if lm_trains else backbone.lm_params)
    frozen += 0 if cfg.vlm.train_projector else backbone.projector_params
    weights = 4 * trainable + frozen_bytes * frozen
    out = {"weights": weights, "gradients": 4 * trainable, "optimizer": 8 * trainable}
    return {**out, "total": sum(out.values())}


RETRIEVERS = {"openai/clip-vit-base-patch32": 4 * 151_277_313 + 8 * (77 + 50)}
"""Bytes of a retriever checkpoint's model as :func:`finecap.models.retriever.load_retriever` holds it, for sizing
recipes without loading it: CLIP ViT-B/32's 151,277,313 parameters in float32 (the dtype it is stored in, which
``from_pretrained`` keeps) and its two int64 position-id buffers (77 text, 50 image positions); 0.56 GiB
(:meth:`finecap.models.retriever.Retriever.weight_bytes` of its configuration on the meta device)."""


def recipe_beside(cfg: Any, backbone: Backbone, state: dict[str, int]) -> dict[str, int]:
    """What a VLM recipe keeps on the device beside the captioner and its training state (``state``:
    :func:`recipe_state`): ``retrievers``, one frozen copy of ``retriever.checkpoint`` (:data:`RETRIEVERS`) when the
    self-retrieval reward (``rl.rewards`` with ``retrieval``, on the device when training starts) or the retrieval
    validator (``train.validators``, from its first evaluation) reads it: a run loads it once and both share it
    (:class:`finecap.models.retriever.SharedRetrievers`); and
    ``reference``, the GRPO KL's copy of the trained weights in their float32 (:mod:`finecap.objectives.reference`):
    every trained parameter but fresh LoRA adapters (adapters continued from ``train.init_from`` are copied: a
    checkpoint with the same adapter settings keeps its adapters, which then add something)."""
    rewarded = cfg.train.objective in RL_OBJECTIVES and "retrieval" in cfg.rl.rewards
    copies = int(rewarded or "retrieval" in cfg.train.validators)
    retrievers = 0
    if copies:
        if cfg.retriever.checkpoint not in RETRIEVERS:
            raise ValueError(f"retriever.checkpoint={cfg.retriever.checkpoint!r}: the sizing knows the bytes of "
                             f"{', '.join(RETRIEVERS)} only")  # fmt: skip
        retrievers = copies * RETRIEVERS[cfg.retriever.checkpoint]
    reference = 0
    if has_reference(cfg):
        reference = state["gradients"]  # a float32 copy of each trained parameter, as its gradient
        if not cfg.train.init_from:  # fresh adapters: the reference runs with them off, not copied
            train = training_of(cfg)
            adapters = backbone.lm_layers_lora(train) if cfg.model.train_lm and cfg.lora.lm else 0
            if cfg.model.train_encoder and cfg.lora.encoder:
                adapters += backbone.vision_lora(cfg.lora.rank, tuple(cfg.lora.encoder_targets))
            reference -= 4 * adapters
    return {"retrievers": retrievers, "reference": reference}


def recipe_forecast(cfg: Any, backbone: Backbone) -> dict[str, Any]:
    """A ``coco/*_vlm`` recipe's configuration sized on ``backbone`` without building it: its state
    (:func:`recipe_state`), what it keeps beside (:func:`recipe_beside`) and the activations of one step of
    ``train.batch_size`` images (:func:`activation_forecast`; ``reinforce``: ``rl.samples`` captions of
    ``decode.max_length`` tokens per image, else one of ``data.max_tokens``; batches padded), and their ``total`` per
    process."""
    rl = cfg.train.objective in RL_OBJECTIVES
    # Vlm.sequence_logits: shared where an image has several captions
    shared = rl and cfg.rl.samples > 1 and prompt_shareable(cfg.train.gradient_checkpointing)
    captions, tokens = (cfg.rl.samples, cfg.decode.max_length) if rl else (1, cfg.data.max_tokens)
    step = Step(cfg.train.batch_size, backbone.prompt, captions, tokens, shared, cfg.train.objective in CHUNKED,
                rl and has_reference(cfg))  # fmt: skip
    train = Training(**{**training_of(cfg).__dict__, "projector_trains": bool(cfg.vlm.train_projector)})
    state = recipe_state(cfg, backbone)
    beside = recipe_beside(cfg, backbone, state)
    act = activation_forecast(backbone.lm, train, step, backbone.vision)
    total = state["total"] + sum(beside.values()) + act["peak"]
    return {"state": state, "beside": beside, "activations": act, "total": total, "step": step}


CARD_80GB = 80 * 10**9
"""The card the ``coco/*_vlm`` recipes are sized for, "80 GB", read as 80 x 10^9 bytes (74.5 GiB)."""
UNDER_FORECAST = 0.75
"""The forecast's tolerated error: a forecast total with activations below this fraction of a measured CUDA peak is
wrong (``benchmarks/gpu_check.py``'s ``memory:*`` lines fail then; the quarter ``tests/models/test_memory_forecast.py``
holds it to on the CPU). So a measured peak may come to ``1 / UNDER_FORECAST`` (4/3) of a forecast that stands."""
OUTSIDE_ALLOCATOR = 2**30
"""Bytes a CUDA process holds outside torch's allocator (its context, the libraries' handles and workspaces), which a
forecast of ``max_memory_allocated`` leaves out: 0.75-0.76 GiB in each ``memory:*`` line of the 2026-11-28 H200 run
(``device_used_gib_after`` less ``max_reserved_gib``; torch 2.11, CUDA 13), rounded up to 1 GiB."""


def fits(total: int, card: int = CARD_80GB) -> bool:
    """Whether a forecast ``total`` (bytes, :func:`recipe_forecast`'s) fits ``card`` with the margin a claim of fitting
    states: the peak the forecast's tolerated error allows (``total / UNDER_FORECAST``) and what the process holds
    outside torch's allocator (:data:`OUTSIDE_ALLOCATOR`) under the card's bytes. Not counted: the allocator's cache
    over the peak (``max_memory_reserved``, 1.13-1.34x of it on the H200), which it frees and retries before an
    out-of-memory error, fragmentation aside."""
    return total / UNDER_FORECAST + OUTSIDE_ALLOCATOR < card
