"""The activation forecast (issue 65, :mod:`finecap.models.forecast`): its per-layer count equals the bytes of the
tensors autograd saves in a ``transformers`` decoder layer (an independent reference: ``saved_tensors_hooks``), by
hand on one shape, and at SmolVLM-256M's real shapes within 25 % of ``benchmarks/memory.py``'s measured CPU
allocation peaks (slow)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from types import SimpleNamespace

import pytest
import torch
from peft import LoraConfig, get_peft_model, inject_adapter_in_model
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from finecap.models.captioner import VOCAB_CHUNK_ELEMENTS
from finecap.models.forecast import (
    LmShapes,
    Step,
    Training,
    VisionShapes,
    activation_forecast,
    autocast_bytes,
    deepstack_values,
    forecast_text,
    frozen_tower_bytes,
    layer_bytes,
    mask_bytes,
    pixel_copy_bytes,
    pixel_input_bytes,
    tower_autocast_bytes,
    tower_embedding_bytes,
    tower_gradient_bytes,
    tower_kind,
    tower_layer_bytes,
    tower_shared_bytes,
    tower_targets_of,
    training_of,
)
from helpers.scripts import benchmark

B, T, RANK = 2, 16, 8
SHAPES = {"hidden_size": 64, "intermediate_size": 160, "num_attention_heads": 4, "num_key_value_heads": 2,
          "vocab_size": 50, "attn_implementation": "sdpa"}  # fmt: skip


@functools.cache
def _storage_counter():
    """``benchmarks/saved_tensors.py``'s ``saved_bytes``, loaded once: the one counter of saved storages."""
    return benchmark("saved_tensors").saved_bytes


def saved_bytes(model: torch.nn.Module, forward) -> int:
    """Bytes of the distinct non-parameter storages that ``forward()`` saves for backward (each storage once, held
    until the end so that no address is reused: ``benchmarks/saved_tensors.py``)."""
    return _storage_counter()(forward, model)


def layers_saved(family: str, layers: int, train: Training) -> int:
    """What a ``layers``-layer model of ``family`` saves for one forward of B rows of T tokens."""
    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[
        family
    ]
    torch.manual_seed(0)
    dtype = torch.bfloat16 if train.weights_bytes == 2 else torch.float32
    model = model_cls(config_cls(num_hidden_layers=layers, **SHAPES)).to(dtype)
    if train.lm == "lora":
        model.requires_grad_(False)
        model = get_peft_model(model, LoraConfig(r=RANK, target_modules=list(train.targets)))
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.data = p.data.float()  # model.trainable_dtype
    model.train()
    ids = torch.randint(0, 50, (B, T), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(B, T, dtype=torch.long)
    if train.mask:
        mask[0, :3] = 0  # left padding: transformers passes the mask to sdpa

    def forward() -> None:
        x = model.get_input_embeddings()(ids).detach().requires_grad_(True)  # the layers' input needs a gradient
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=train.autocast):
            model(inputs_embeds=x, attention_mask=mask, logits_to_keep=1)

    return saved_bytes(model, forward)


CASES = [
    Training("full", 4),
    Training("lora", 4, rank=RANK),
    Training("lora", 2, rank=RANK),
    Training("lora", 2, autocast=True, rank=RANK),
    Training("full", 4, autocast=True),
    Training("lora", 2, autocast=True, rank=RANK, targets=("q_proj", "v_proj")),
]


PAIRS = [("llama", t, m) for t in CASES for m in (False, True)] + [
    ("qwen2", CASES[0], True),
    ("qwen2", CASES[3], True),
]


@pytest.mark.parametrize(("family", "train", "mask"), PAIRS, ids=[
    f"{f}-{t.lm}-{t.weights_bytes}B-{'autocast' if t.autocast else 'plain'}-{len(t.targets)}-{'mask' if m else 'no'}"
    for f, t, m in PAIRS])  # fmt: skip
def test_one_layer_saves_what_the_formula_counts(family, train, mask):
    """Qwen2's projections carry biases, which save nothing more."""
    train = Training(**{**train.__dict__, "mask": mask})
    measured = layers_saved(family, 3, train) - layers_saved(family, 2, train)  # one more layer
    shapes = LmShapes(3, 64, 160, 4, 2, 50)
    forecast = layer_bytes(shapes, train) * B * T + mask_bytes(train, B, T, T) + autocast_bytes(shapes, train)
    assert forecast == measured


def test_layer_bytes_by_hand():
    """float32, every weight training, no mask: h = 64, i = 160, q = 64, kv = 32, 4 heads."""
    norms = 2 * (4 * 64 + 4 + 4 * 64)  # float32 input, rsqrt, hn: 1032
    attention = 4 * (64 + 32 + 32 + 64) + 4 * 4  # q, k, v, output, log-sum-exp: 784
    mlp = 3 * 4 * 160  # gate, silu(gate), up: 1920
    projections = 4 * 64 + 4 * 64 + 4 * 160  # the norms' outputs (q/k/v, gate/up) and down's input: 1152
    assert layer_bytes(LmShapes(1, 64, 160, 4, 2, 50), Training("full", 4, mask=False)) == (
        norms + attention + mlp + projections
    )  # 4888


def tower_saved(layers: int, train: Training) -> int:
    """What a ``layers``-layer Idefics3 (SigLIP) vision encoder trained as ``train.tower`` saves for one forward of
    B images of T patches (LoRA r8 on ``train.tower_targets``, adapters in float32 as ``model.trainable_dtype``)."""
    from transformers import Idefics3VisionConfig
    from transformers.models.idefics3 import modeling_idefics3

    from finecap.models.forecast import TOWER_TARGETS

    torch.manual_seed(0)
    config = Idefics3VisionConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=layers,
                                  num_attention_heads=4, attn_implementation="sdpa")  # fmt: skip
    tower = modeling_idefics3.Idefics3VisionTransformer._from_config(config).to(
        torch.bfloat16 if train.weights_bytes == 2 else torch.float32
    )
    if train.tower == "lora":
        tower.requires_grad_(False)
        adapted = get_peft_model(tower, LoraConfig(r=RANK, target_modules=list(train.tower_targets or TOWER_TARGETS)))
        for name, p in adapted.named_parameters():
            if "lora_" in name:
                p.data = p.data.float()
    tower.train()
    x = torch.randn(B, T, 64, generator=torch.Generator().manual_seed(0)).to(next(tower.parameters()).dtype)

    def forward() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=train.autocast):
            tower.encoder(inputs_embeds=x.detach().requires_grad_(True))

    return saved_bytes(tower, forward)


TOWER_CASES = [
    Training(tower="lora", weights_bytes=2, rank=RANK, cpu=True),
    Training(tower="lora", weights_bytes=2, autocast=True, rank=RANK, cpu=True),
    Training(tower="lora", weights_bytes=2, autocast=True, rank=RANK, tower_targets=("fc1", "v_proj"), cpu=True),
    Training(tower="lora", weights_bytes=4, rank=RANK, cpu=True),
    Training(tower="full", weights_bytes=4, cpu=True),
    Training(tower="full", weights_bytes=4, autocast=True, cpu=True),
]


@pytest.mark.parametrize("train", TOWER_CASES, ids=[
    f"{t.tower}-{t.weights_bytes}B-{'autocast' if t.autocast else 'plain'}-{len(t.tower_targets) or 'all'}"
    for t in TOWER_CASES])  # fmt: skip
def test_one_tower_layer_saves_what_the_formula_counts(train):
    """A trained SigLIP layer, as SmolVLM's and Idefics3's towers are: on the CPU (``Training.cpu``: LayerNorm's
    statistics in the input's dtype, and autocast leaves it in bf16), the bf16 weight copies under autocast once a
    layer."""
    measured = tower_saved(3, train) - tower_saved(2, train)  # one more layer
    vision = VisionShapes(64, 160, T, 0, 3, 4)
    assert tower_layer_bytes(vision, train) * B * T + tower_autocast_bytes(vision, train) == measured


def test_tower_targets_written_as_module_suffixes_count_as_the_layers_they_adapt():
    """``lora.encoder_targets`` are module names or dot-separated suffixes of them, as peft matches them:
    ``self_attn.q_proj`` and ``mlp.fc1`` adapt SigLIP's ``q_proj`` and ``fc1``, and the forecast of a run so
    configured (:func:`training_of`) counts what those adapters save, measured on the CPU (it counted them as adapting
    nothing)."""
    names = ("self_attn.q_proj", "mlp.fc1")
    cfg = SimpleNamespace(model=SimpleNamespace(train_lm=False, train_encoder=True, dtype="bfloat16"),
                          lora=SimpleNamespace(lm=False, encoder=True, lm_targets=[], encoder_targets=list(names),
                                               rank=RANK),
                          train=SimpleNamespace(mixed_precision="no", gradient_checkpointing=False))  # fmt: skip
    train = dataclasses.replace(training_of(cfg), cpu=True)
    assert train.tower_targets == ("q_proj", "fc1")
    as_peft = dataclasses.replace(train, tower_targets=names)  # peft matches the suffixes themselves
    measured = tower_saved(3, as_peft) - tower_saved(2, as_peft)  # one more layer
    vision = VisionShapes(64, 160, T, 0, 3, 4)
    assert tower_layer_bytes(vision, train) * B * T + tower_autocast_bytes(vision, train) == measured
    assert tower_targets_of(["vision_model.encoder.layers.0.self_attn.out_proj", "linear_fc2", "blocks.0.attn.qkv",
                             "merger.mlp.0"]) == ("out_proj", "fc2", "qkv", "merger.mlp.0")  # fmt: skip


INTERNVIT = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "out_proj": "projection_layer", "fc1": "fc1",
             "fc2": "fc2"}  # fmt: skip
LAYER_KINDS = {
    "qwen2_5_vl": ({"norm": "rms", "mlp": "gated", "attention": "fused"},
                   {"qkv": "attn.qkv", "out_proj": "attn.proj", "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
                    "down_proj": "mlp.down_proj"}, ("up_proj", "qkv")),
    "pixtral": ({"norm": "rms", "mlp": "gated", "attention": "split", "block_mask": True},
                {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "out_proj": "o_proj",
                 "gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj"}, ("gate_proj", "v_proj")),
    "clip": ({"norm": "layer", "mlp": "quick_gelu", "attention": "split"},
             {n: n for n in ("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2")}, ("fc1", "v_proj")),
    "internvl": ({"norm": "layer", "mlp": "gelu", "attention": "split", "layer_scale": True}, INTERNVIT,
                 ("fc1", "v_proj")),
    "internvit_6b": ({"norm": "rms", "mlp": "gelu", "attention": "split", "layer_scale": True, "qk_norm": True},
                     INTERNVIT, ("fc1", "q_proj")),
}  # fmt: skip
"""Towers whose layers are not SigLIP's, one per kind: Qwen2.5-VL's (RMSNorm, fused rotary qkv run image by image,
gated SiLU MLP; GLM-4.1V's is the same kind), Pixtral's (RMSNorm, rotary q/k/v over a block mask, gated MLP) and
CLIP's (QuickGELU; Qwen2-VL's MLP too), InternViT-300M's (SigLIP's with a layer scale, ``lambda_1`` and
``lambda_2``) and InternViT-6B's (that with RMSNorm and query and key RMSNorms): the kind ``tower_kind`` reads from the
config, each counted linear's module
name (the family's LoRA target), and two of them for an adapter on two."""


KIND_HELD = {"qwen2_5_vl": {"rotary": "float32", "embeddings_kept": 0}, "pixtral": {"rotary": "weights",
              "embeddings_kept": 2}, "clip": {"embeddings_kept": 1}, "internvl": {"embeddings_kept": 1},
              "internvit_6b": {"embeddings_kept": 1}}  # fmt: skip
"""What :data:`LAYER_KINDS`' towers hold beside their layers as ``tower_kind`` reads it (their rotary tables, the
embeddings their encoder keeps: :func:`finecap.models.forecast.frozen_tower_bytes`)."""


def kind_layers(kind: str, layers: int, dtype: torch.dtype):
    """``layers`` tower layers of ``kind`` (:data:`LAYER_KINDS`) of width 64 (MLP 160, 4 heads) in ``dtype``, the
    ``transformers`` config they are built from, and a function running them over B images of T patches."""
    torch.manual_seed(0)
    if kind == "qwen2_5_vl":
        from transformers import Qwen2_5_VLVisionConfig
        from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as modeling

        config = Qwen2_5_VLVisionConfig(hidden_size=64, intermediate_size=160, num_heads=4, depth=layers)
        block, shape = modeling.Qwen2_5_VLVisionBlock, (B * T, 64)
        cu_seqlens = torch.arange(0, B * T + 1, T, dtype=torch.int32)  # one attention per image
        rotary = (torch.randn(B * T, 16), torch.randn(B * T, 16))  # float32, shared by the layers

        def run(layer, x, autocast):
            return layer(x, cu_seqlens=cu_seqlens, position_embeddings=rotary)
    elif kind == "pixtral":
        from transformers import PixtralVisionConfig
        from transformers.models.pixtral import modeling_pixtral as modeling

        config = PixtralVisionConfig(hidden_size=64, intermediate_size=160, num_attention_heads=4, head_dim=16,
                                     num_hidden_layers=layers)  # fmt: skip
        block, shape = modeling.PixtralAttentionLayer, (1, B * T, 64)

        # the block mask over all patches (shared by the layers) and the rotary cos and sin, in the dtype of ln_pre's
        # output as PixtralVisionModel makes them: its weight's (``weight * x.to(input dtype)``), float32 in float32
        # weights even under autocast, where each layer's sdpa then casts the mask to bf16 (until 2026-11-28 made
        # here in bf16 under autocast, the conv's output dtype, which hid those copies)
        mask = modeling.generate_block_attention_mask([T] * B, torch.zeros(1, B * T, dtype=dtype))
        tables = (torch.randn(B * T, 16).to(dtype), torch.randn(B * T, 16).to(dtype))

        def run(layer, x, autocast):
            return layer(x, attention_mask=mask, position_embeddings=tables)

    elif kind.startswith("intern"):
        from transformers import InternVLVisionConfig
        from transformers.models.internvl import modeling_internvl as modeling

        big = kind == "internvit_6b"
        config = InternVLVisionConfig(hidden_size=64, intermediate_size=160, num_attention_heads=4,
                                      num_hidden_layers=layers, norm_type="rms_norm" if big else "layer_norm",
                                      use_qk_norm=big)  # fmt: skip
        block, shape = modeling.InternVLVisionLayer, (B, T, 64)

        def run(layer, x, autocast):
            return layer(x)

    else:
        from transformers import CLIPVisionConfig
        from transformers.models.clip import modeling_clip as modeling

        config = CLIPVisionConfig(hidden_size=64, intermediate_size=160, num_attention_heads=4,
                                  num_hidden_layers=layers, hidden_act="quick_gelu")  # fmt: skip
        block, shape = modeling.CLIPEncoderLayer, (B, T, 64)

        def run(layer, x, autocast):
            return layer(x, None)

    config._attn_implementation = "sdpa"
    stack = torch.nn.ModuleList([block(config) for _ in range(layers)]).to(dtype)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype)

    def forward(autocast: bool) -> torch.Tensor:
        h = x.detach().requires_grad_(True)  # the layers' input needs a gradient
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            for layer in stack:
                out = run(layer, h, autocast)
                h = out[0] if isinstance(out, tuple) else out
        return h

    return stack, config, forward


def kind_saved(kind: str, layers: int, train: Training) -> int:
    """What ``layers`` tower layers of ``kind`` trained as ``train.tower`` save for one forward of B images of T
    patches (LoRA r8 on ``train.tower_targets`` by their module names, adapters in float32)."""
    _, names, _ = LAYER_KINDS[kind]
    stack, _, forward = kind_layers(kind, layers, torch.bfloat16 if train.weights_bytes == 2 else torch.float32)
    if train.tower == "lora":
        stack.requires_grad_(False)
        targets = [names[t] for t in train.tower_targets or names]
        inject_adapter_in_model(LoraConfig(r=RANK, target_modules=targets), stack)
        for name, p in stack.named_parameters():
            if "lora_" in name:
                p.data = p.data.float()
    stack.train()
    kept = []
    return saved_bytes(stack, lambda: kept.append(forward(train.autocast)))


KIND_CASES = [(kind, c) for kind, (_, _, two) in LAYER_KINDS.items() for c in [
    Training(tower="lora", weights_bytes=2, rank=RANK, cpu=True),
    Training(tower="lora", weights_bytes=2, autocast=True, rank=RANK, cpu=True),
    Training(tower="lora", weights_bytes=2, autocast=True, rank=RANK, tower_targets=two, cpu=True),
    Training(tower="lora", weights_bytes=4, rank=RANK, cpu=True),
    Training(tower="full", weights_bytes=4, cpu=True),
    Training(tower="full", weights_bytes=4, autocast=True, cpu=True),
]]  # fmt: skip


@pytest.mark.parametrize(("kind", "train"), KIND_CASES, ids=[
    f"{k}-{t.tower}-{t.weights_bytes}B-{'autocast' if t.autocast else 'plain'}-{len(t.tower_targets) or 'all'}"
    for k, t in KIND_CASES])  # fmt: skip
def test_one_tower_layer_of_each_kind_saves_what_the_formula_counts(kind, train):
    """A trained layer of the towers that are not SigLIP's (:data:`LAYER_KINDS`), exactly, on the CPU: the kind read
    from its config, its module names mapped onto the counted ones (``tower_targets_of``)."""
    from finecap.models.forecast import tower_kind

    shapes, names, _ = LAYER_KINDS[kind]
    _, config, _ = kind_layers(kind, 1, torch.float32)
    assert tower_kind(config) == {**shapes, **KIND_HELD[kind]}
    assert tower_targets_of(names.values()) == tuple(names)
    measured = kind_saved(kind, 3, train) - kind_saved(kind, 2, train)  # one more layer
    vision = VisionShapes(64, 160, T, 0, 3, 4, **shapes, **KIND_HELD[kind])
    _, own = tower_shared_bytes(vision, train, B * T)  # Pixtral's mask cast per layer under autocast
    assert tower_layer_bytes(vision, train) * B * T + tower_autocast_bytes(vision, train) + own == measured


@pytest.mark.parametrize(("kind", "train"), KIND_CASES, ids=[
    f"{k}-{t.tower}-{t.weights_bytes}B-{'autocast' if t.autocast else 'plain'}-{len(t.tower_targets) or 'all'}"
    for k, t in KIND_CASES])  # fmt: skip
def test_a_trained_towers_layers_save_the_rotary_tables_and_pixtrals_block_mask_besides_their_own(kind, train):
    """Everything two trained tower layers of each kind save, exactly, on the CPU: two layers' counts and what the
    layers save of the tensors they all read (``tower_shared_bytes``): the rotary ``cos`` and ``sin`` (float32 in
    Qwen2.5-VL's; Pixtral's in its weights' dtype), Pixtral's block mask over all B x T patches, once in its dtype, or
    under autocast with float32 weights each layer's bf16 cast of it. Until 2026-11-28 none of these was counted
    (Pixtral at 8 images of 4,096 patches: a 2 GiB bf16 mask, and under autocast 2 GiB a layer)."""
    shapes, _, _ = LAYER_KINDS[kind]
    vision = VisionShapes(64, 160, T, 0, 2, 4, **shapes, **KIND_HELD[kind])
    once, own = tower_shared_bytes(vision, train, B * T)
    layer = tower_layer_bytes(vision, train) * B * T + tower_autocast_bytes(vision, train) + own
    assert kind_saved(kind, 2, train) == 2 * layer + once
    if kind == "pixtral":
        mask = B * T * B * T
        made = 4 if train.weights_bytes == 4 or train.tower == "full" else 2
        assert (once, own) == ((B * T * 2 * 16 * made) + (0 if train.autocast and made == 4 else made * mask),
                               2 * mask if train.autocast and made == 4 else 0)  # fmt: skip


def test_tower_layer_bytes_by_hand():
    """LoRA r8 on every linear layer of a bf16 SigLIP layer, no autocast, on CUDA (float32 LayerNorm statistics):
    h = 64, i = 160, 4 heads."""
    norms = 2 * (2 * 64 + 8)  # the bf16 input, float32 mean and rstd
    adapters = 3 * (4 * 64 + 4 * 8) + (4 * 64 + 4 * 8) + (4 * 64 + 4 * 8) + (4 * 160 + 4 * 8)  # peft's float32 copies
    attention = 2 * 4 * 64 + 4 * 4  # q, k, v, output, log-sum-exp
    gelu = 2 * 160  # fc1's output
    train = Training(tower="lora", weights_bytes=2, rank=8)
    vision = VisionShapes(64, 160, 1, 0, 1, 4)
    assert tower_layer_bytes(vision, train) == norms + adapters + attention + gelu
    assert tower_autocast_bytes(vision, train) == 0
    assert tower_gradient_bytes(vision, train) == 160 * (2 + 4 + 2)  # base's bf16, peft copy's float32, cast back
    assert tower_gradient_bytes(vision, Training(tower="full", weights_bytes=4)) == 160 * 4
    assert tower_targets_of(["attn.qkv", "attn.proj", "mlp.down_proj", "fc1"]) == (
        "qkv",
        "out_proj",
        "down_proj",
        "fc1",
    )
    # Qwen2.5-VL's layer, the same adapters: RMSNorm (float32 input and rsqrt), the fused qkv's one adapter, the
    # value a view of the fused output (3h held), the gated MLP's gate, act(gate) and up, and its three adapters
    qwen = VisionShapes(64, 160, 1, 0, 1, 4, norm="rms", mlp="gated", attention="fused")
    norms = 2 * (4 * 64 + 4)
    adapters = 2 * (4 * 64 + 4 * 8) + 2 * (4 * 64 + 4 * 8) + (4 * 160 + 4 * 8)  # qkv, out_proj; gate, up; down
    attention = 2 * (64 + 64 + 3 * 64 + 64) + 4 * 4
    assert tower_layer_bytes(qwen, train) == norms + adapters + attention + 3 * 2 * 160  # 4088
    assert tower_gradient_bytes(qwen, train) == 160 * (2 + 4 + 2)  # an adapter on down_proj
    with pytest.raises(ValueError, match="VisionShapes.mlp='swiglu'"):
        VisionShapes(64, 160, 1, 0, mlp="swiglu")
    with pytest.raises(ValueError, match="Training.tower='encoder'"):
        Training(tower="encoder")


EMBEDDING_CASES = [
    Training(tower="full", weights_bytes=4, cpu=True),
    Training(tower="full", weights_bytes=4, autocast=True, cpu=True),
    Training(tower="full", weights_bytes=2, cpu=True),
    Training(tower="full", weights_bytes=2, autocast=True, cpu=True),
    Training(tower="lora", weights_bytes=2, rank=RANK, cpu=True),
    Training(tower="lora", weights_bytes=2, autocast=True, rank=RANK, cpu=True),
]
EMBEDDING_FAMILIES = ("idefics3", "llava", "llava_next", "llava_onevision", "qwen2_5_vl", "qwen3_vl", "mistral3",
                      "internvl")  # fmt: skip
"""One family of each way the pixels reach the patch embedding: Idefics's selected copy, CLIP's and SigLIP's own
pixels, LLaVA-NeXT's and LLaVA-OneVision's crops, the Qwen towers' Conv3d over flattened patches, Pixtral's
``patch_conv``, InternVL's cast."""


def embedding_saved(family: str, train: Training) -> tuple[int, int, VisionShapes]:
    """What the patch embedding (the tower's first convolution) of ``family``'s tiny model saves in finecap's prompt
    pass of 4 images trained as ``train.tower`` (a whole tower: its weights in float32 as ``model.trainable_dtype``,
    the rest in ``train.weights_bytes``; LoRA: the family's adapters, in float32), the batch's own ``pixel_values``
    left out (``pixel_input_bytes`` counts them), the images, and the shapes ``VisionShapes.of`` reads."""
    from PIL import Image

    from finecap.models import lora
    from finecap.models.memory import apply_dtypes

    bench = benchmark("tower_forecast", neighbours=True)
    vlm = bench.tiny_vlm(family, 2, train_encoder=True)
    if train.tower == "lora":
        lora.apply_lora(vlm, "encoder", lora.LoraSpec(rank=RANK, alpha=RANK))
    apply_dtypes(vlm, "float32" if train.weights_bytes == 4 else "bfloat16", "float32")
    vlm.train()
    tower = vlm.lora_module("encoder")
    conv = next(m for m in tower.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d)))
    g = torch.Generator().manual_seed(0)
    images = [Image.fromarray((torch.rand(16, 16, 3, generator=g) * 255).byte().numpy()) for _ in range(4)]
    prompt = vlm.prompt_of(vlm._images.preprocess(images))
    pixels = prompt.images["pixel_values"]

    def stop(*_):
        raise bench._Stop()

    handle = conv.register_forward_hook(stop)  # the convolution alone: nothing after it runs

    def forward() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=train.autocast), contextlib.suppress(bench._Stop):
            vlm.prompt_pass(prompt, use_cache=False)

    try:
        saved = _storage_counter()(forward, vlm, [pixels])
    finally:
        handle.remove()
    return saved, len(images), VisionShapes.of(vlm.model.config, pixels, len(images))


@pytest.mark.parametrize("family", EMBEDDING_FAMILIES)
def test_a_whole_trained_towers_patch_embedding_saves_its_input_once(family):
    """When the whole tower trains, its patch embedding's weight trains, so the convolution saves its input: the
    family's float32 copy (Idefics's selected images, LLaVA-NeXT's crops; the batch's own pixels elsewhere, counted
    already), or under autocast its bf16 cast and the weight's bf16 copy; a LoRA tower's saves nothing. Exactly, in
    every setting, on the real tiny model's prompt pass (until 2026-11-28 none of it was counted)."""
    for train in EMBEDDING_CASES:
        saved, images, vision = embedding_saved(family, train)
        assert tower_embedding_bytes(vision, train, images) == saved, (family, train)
        if train.tower == "full":
            assert saved > 0 or vision.pixel_copy not in ("select", "crops"), (family, train)
        else:
            assert saved == 0, (family, train)


def test_a_whole_trained_towers_forecast_keeps_the_embeddings_input_to_its_backward_pass():
    """``tower_saved`` holds the patch embedding's input once (not per layer), and the forward pass's peak counts the
    copy it saves once: the held copy (``pixel_copy_bytes``, float32 in a whole trained tower) is that very tensor."""
    vision = VisionShapes(64, 160, 64, 3 * 16 * 16 * 64, 3, 4, pixel_copy="crops")
    lm, step = LmShapes(2, 64, 160, 4, 2, 50), Step(2, 8, 1, 6)
    full = Training("frozen", 2, tower="full")
    out = activation_forecast(lm, full, step, vision)
    patches = 2 * 64
    layer = patches * tower_layer_bytes(vision, full)
    assert out["tower_saved"] == 3 * layer + 2 * 4 * vision.pixels
    copy = 2 * 4 * vision.pixels
    assert out["tower"] == frozen_tower_bytes(vision, 2, patches) + copy + 2 * (8 + 5) * 64 * 2  # prompt, caption
    total = out["lm"] + out["mask"] + out["vocab"] + out["images"] + out["tower_saved"]
    backward = out["tower_saved"] + out["tower_backward"] + out["images"]
    forward = out["tower"] + out["images"] + out["tower_saved"] - copy  # the copy once
    assert out["peak"] == max(total, forward, backward) == forward
    autocast = Training("frozen", 2, autocast=True, tower="full")
    cast = activation_forecast(lm, autocast, step, vision)
    once = 2 * 2 * vision.pixels + 2 * 3 * 16 * 16 * 64  # the pixels' bf16 casts and the conv weight's bf16 copy
    layer = patches * tower_layer_bytes(vision, autocast) + tower_autocast_bytes(vision, autocast)
    assert cast["tower_saved"] == 3 * layer + once


def test_a_trained_tower_adds_its_saved_layers_and_its_backward_pass():
    """Under checkpointing the tower keeps each layer's input until its backward pass, which runs after the language
    model's: its own peak (kept inputs, one recomputed layer, its gradients, the images); without checkpointing every
    layer's saved tensors sit beside the language model's."""
    vision = VisionShapes(64, 160, 16, 3 * 32 * 32, 3, 4)
    step = Step(2, 8, 1, 6)
    frozen = Training("lora", 2, autocast=True, checkpointing=True, rank=RANK)
    lora = Training(**{**frozen.__dict__, "tower": "lora"})
    f = activation_forecast(LmShapes(2, 64, 160, 4, 2, 50), frozen, step, vision)
    t = activation_forecast(LmShapes(2, 64, 160, 4, 2, 50), lora, step, vision)
    assert f["tower_saved"] == f["tower_backward"] == 0
    patches = 2 * 16
    assert t["tower_saved"] == 3 * patches * 2 * 64  # bf16 layer inputs
    layer = patches * tower_layer_bytes(vision, lora) + tower_autocast_bytes(vision, lora)
    assert t["tower_backward"] == layer + patches * tower_gradient_bytes(vision, lora)
    backward = t["tower_saved"] + t["tower_backward"] + t["images"]
    assert t["peak"] == max(t["lm"] + t["mask"] + t["vocab"] + t["images"] + t["tower_saved"],
                            t["tower"] + t["images"] + t["tower_saved"], backward) == backward  # fmt: skip
    plain = Training(**{**lora.__dict__, "checkpointing": False})
    assert activation_forecast(LmShapes(2, 64, 160, 4, 2, 50), plain, step, vision)["tower_saved"] == 3 * layer
    with pytest.raises(ValueError, match="layers and heads"):
        activation_forecast(LmShapes(2, 64, 160, 4, 2, 50), lora, step, VisionShapes(64, 160, 16, 3 * 32 * 32))
    line = forecast_text({"total": 0}, {"bytes": t, "step": step}, None, False)[0]
    assert "the trained tower's saved activations" in line


def test_forecast_grows_with_images_and_captions_and_checkpointing_shrinks_it():
    lm = LmShapes(30, 576, 1536, 9, 3, 49_280)
    plain = activation_forecast(lm, Training("lora", 2, autocast=True), Step(16, 78, 8, 41))
    ckpt = activation_forecast(lm, Training("lora", 2, autocast=True, checkpointing=True), Step(16, 78, 8, 41))
    assert ckpt["peak"] < plain["peak"] / 5
    assert plain["per_image"] > 0 and plain["per_caption"] > 0
    shared = activation_forecast(lm, Training("lora", 2, autocast=True), Step(16, 78, 8, 41, shared=True))
    assert shared["lm"] < plain["lm"]  # the prompt's layers run once per image, not once per caption


def test_under_checkpointing_the_shared_prompt_keeps_its_keys_and_values_and_saves_the_repeats():
    """Checkpointed, the language model runs over B P + N (L - 1) positions with the prompt shared, N (P + L - 1)
    repeated; each position keeps its layer inputs (r h a layer) and the final norm's input (4 h); one layer is
    recomputed at a time, of one pass (the shared prompt's passes are recomputed one after the other, the captions'
    with their rows of the prompt's keys and values, 2 l kv a caption and prompt position); the shared prompt keeps
    its keys and values once per image ((r + l) kv a layer). SmolVLM-256M's shapes, bf16 + LoRA without a mask:
    r = l = 2, h = 576, kv = 3 x 64 = 192, 30 layers."""
    lm = LmShapes(30, 576, 1536, 9, 3, 49_280)
    train = Training("lora", 2, autocast=True, checkpointing=True, mask=False)
    B, P, S, L = 4, 900, 8, 31
    N = B * S
    per_token, casts = layer_bytes(lm, train), autocast_bytes(lm, train)
    shared = activation_forecast(lm, train, Step(B, P, S, L, shared=True))["lm"]
    repeated = activation_forecast(lm, train, Step(B, P, S, L))["lm"]
    kept = 2 * 576 * 30 + 4 * 576  # a position's layer inputs and final norm input
    recomputed = max(B * P * per_token, N * (L - 1) * per_token + N * P * 2 * 2 * 192)
    assert shared == (B * P + N * (L - 1)) * kept + B * P * (2 + 2) * 192 * 30 + recomputed + casts
    assert repeated == N * (P + L - 1) * (kept + per_token) + casts
    assert shared < repeated / 4  # 8 samples of a 900-token prompt: most of the work was the repeated prompt


def test_forecast_text_says_a_cpu_line_is_a_forecast():
    lm = LmShapes(2, 64, 160, 4, 2, 50)
    forecast = {"step": Step(2, 10, 1, 5), "bytes": activation_forecast(lm, Training(), Step(2, 10, 1, 5))}
    memory = {"weights": 100, "gradients": 50, "optimizer": 100, "total": 250}
    text = "\n".join(forecast_text(memory, forecast, None, measured=False))
    assert "a forecast, not a measurement" in text and "forecast total per process" in text
    text = "\n".join(forecast_text(memory, forecast, 80 * 2**30, measured=True, vllm=2**30))
    assert "a CUDA step below measures the peak" in text and "of 80.00 GiB" in text and "vLLM share" in text
    assert "no forecast" in forecast_text(memory, None, None, measured=False)[0]


def total_line(lines: list[str]) -> str:
    return next(x for x in lines if x.startswith("forecast total per process"))


def test_forecast_text_adds_what_is_kept_beside_and_a_sleeping_engine_or_the_step():
    """Session 35's review: the total left out what the run keeps beside the model (the frozen retrievers, the KL
    reference's copy of the trained weights), and with vllm.enable_sleep_mode added the engine's share to the step's
    activations, though the engine sleeps (weights offloaded, KV cache dropped) while the step runs: then the larger
    of the two is held, never both. State 250 bytes, retrievers 3 MiB, the KL copy 1 MiB, vLLM 1 GiB, activations
    116,288,512 bytes (110.9 MiB)."""
    lm, step = LmShapes(2, 64, 160, 4, 2, 50), Step(64, 100, 1, 50)
    forecast = {"step": step, "bytes": activation_forecast(lm, Training(), step)}
    peak = forecast["bytes"]["peak"]
    assert peak == 116_288_512
    memory = {"weights": 100, "gradients": 50, "optimizer": 100, "total": 250}
    beside = {"frozen retrievers": 3 * 2**20, "the KL reference's copy of the trained weights": 2**20}
    lines = forecast_text(memory, forecast, None, measured=False, vllm=2**30, beside=beside)
    kept = "kept beside the model: frozen retrievers 3.0 MiB, the KL reference's copy of the trained weights 1.0 MiB"
    assert kept in lines
    assert total_line(lines).endswith(" 1.11 GiB")  # 250 + 4 MiB + 110.9 MiB + 1 GiB, awake through the step
    lines = forecast_text(memory, forecast, None, measured=False, vllm=2**30, beside=beside, asleep=True)
    assert total_line(lines).endswith(" 1.00 GiB")  # 250 + 4 MiB + max(110.9 MiB, 1 GiB)
    assert any("asleep during the step" in x for x in lines)
    lines = forecast_text(memory, forecast, None, measured=False, vllm=2**20, beside=beside, asleep=True)
    assert total_line(lines).endswith(" 114.9 MiB")  # 250 + 4 MiB + max(110.9 MiB, 1 MiB)
    lines = forecast_text(memory, forecast, None, measured=False, vllm=2**20, beside=beside)
    assert total_line(lines).endswith(" 115.9 MiB")  # 250 + 4 MiB + 110.9 MiB + 1 MiB


def test_the_kl_reference_copy_counted_is_what_it_captures(tmp_path):
    """The GRPO KL's reference keeps a copy of the trained parameters (not of fresh LoRA adapters, which it turns
    off): :meth:`Reference.copy_bytes` before the capture equals the storage the capture then holds (measured:
    the snapshot's storages), on a tiny Idefics3 with LoRA (the projector alone copied) and fully fine-tuned (its
    whole language model and projector, float32)."""
    from finecap.config import load
    from finecap.models.presets import save_tiny_vlm
    from finecap.objectives.reference import Reference
    from finecap.train.setup import build_model  # the training path: what learns in float32 (model.trainable_dtype)

    folder = save_tiny_vlm(tmp_path / "vlm", "idefics3")
    for overrides, adapters_off in (([], True), (["lora.lm=false"], False)):
        cfg = load("coco/grpo_sr_cider_vlm", [f"vlm.name={folder}", "train.init_from=", *overrides])
        model = build_model(cfg)
        trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
        expected = sum(p.numel() * 4 for n, p in trained.items() if not (adapters_off and "lora_" in n))
        assert all(p.dtype == torch.float32 for p in trained.values())
        reference = Reference()
        assert reference.copy_bytes(model) == expected > 0
        reference.capture(model)
        held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in reference.snapshot.values()}
        assert reference.adapters_off is adapters_off and sum(held.values()) == expected
        assert reference.copy_bytes(model) == expected


@pytest.mark.parametrize("checkpointing", [False, True], ids=["whole", "chunks"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_kl_reference_pass_peaks_at_what_the_forecast_counts(tmp_path, dtype, checkpointing):
    """The GRPO KL's reference pass (grpo.kl_coef > 0) scores the sampled captions without gradient: measured with
    torch's profiler (benchmarks/memory.py's allocation peak) on a tiny Idefics3 whose vocabulary (20,084 words)
    dwarfs the rest, 4 images x 8 captions of 20 tokens, it peaks at (l + 8) V a position: 12 bytes in float32
    (logits, their copy over the temperature, the log-softmax), 10 in bf16 under autocast. Under gradient
    checkpointing it scores in the policy's vocabulary chunks (208 positions of the 640 here), so its peak is one
    chunk's and the hidden states, a third of the whole; its log-probs equal the policy's training pass's."""
    from PIL import Image

    from finecap.config import load
    from finecap.data.datasets import model_collator
    from finecap.decode import Generation
    from finecap.models.backbones import build_model
    from finecap.models.forecast import reference_bytes, training_of
    from finecap.models.memory import enable_gradient_checkpointing
    from finecap.models.presets import save_tiny_vlm
    from finecap.objectives.reference import Reference

    folder = save_tiny_vlm(tmp_path / "vlm", "idefics3", extra_words=20_000)
    autocast = dtype == "bfloat16"
    cfg = load("coco/grpo_sr_cider_vlm", [f"vlm.name={folder}", f"model.dtype={dtype}",
                                          f"train.mixed_precision={'bf16' if autocast else 'no'}"])  # fmt: skip
    model = build_model(cfg).train()
    if checkpointing:
        enable_gradient_checkpointing(model)
    assert model.trains_in_chunks is checkpointing
    items = [{"caption": "w1 w2", "image": Image.new("RGB", (32, 24)), "image_id": i, "references": ["w1"],
              "index": i} for i in range(4)]  # fmt: skip
    batch = model_collator(model, 8)(items)
    V, S, L = model.model.config.text_config.vocab_size, 8, 20
    N = 4 * S
    sequences = torch.randint(5, V, (N, L), generator=torch.Generator().manual_seed(0))
    gen = Generation(sequences, torch.zeros(N, L), torch.full((N,), L), torch.arange(4).repeat_interleave(S),
                     torch.zeros(N))  # fmt: skip
    reference = Reference()
    reference.capture(model)

    def score() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):  # as the training step's rollout runs
            reference.logprobs(model, batch, gen)

    measured = _memory_benchmark().allocation_peak(score, cuda=False)
    train = dataclasses.replace(training_of(cfg), checkpointing=checkpointing)
    lm = LmShapes.of(model.model.config)
    forecast = reference_bytes(lm, train, N * L)
    per_logit = 12 if dtype == "float32" else 10
    if not checkpointing:
        assert forecast == per_logit * V * N * L
        assert forecast <= measured < 1.01 * forecast, (forecast, measured)  # the rest: a tiny model's hidden states
        return
    rows = VOCAB_CHUNK_ELEMENTS // V
    assert (rows, forecast) == (208, per_logit * V * rows + train.linear * lm.hidden * N * L)
    assert 0.95 * forecast <= measured < 1.05 * forecast, (forecast, measured)
    # the same log-probs as the policy's training pass at the start (the reference is the policy, scored alike)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        policy = model(batch, gen.sequences, gen.mask, gen.image_index).logprobs
        ref = reference.logprobs(model, batch, gen)
    assert model.scores_in_chunks and torch.equal(policy.detach(), ref)


def test_a_recipe_with_the_kl_forecasts_its_reference_pass():
    """coco/grpo_sr_cider_vlm (grpo.kl_coef 0.04, gradient checkpointing) at Qwen2-VL-2B's shapes: 32 images x 8
    captions of 40 tokens scored once more without gradient, in the policy's vocabulary chunks (27 positions of
    151,936 words: bf16 logits under autocast and two float32 copies) beside the bf16 last hidden states of all
    10,240 positions (1,536 wide): 10 x 27 x 151,936 + 2 x 1,536 x 10,240 bytes, below the step's own peak; without
    checkpointing the whole logits, 10 x 10,240 x 151,936 bytes (the step's own peak is larger still); without the KL
    there is no such pass."""
    from finecap.config import load
    from finecap.models.forecast import BACKBONES, recipe_forecast, step_of

    qwen = BACKBONES["Qwen2-VL-2B"]
    act = recipe_forecast(load("coco/grpo_sr_cider_vlm"), qwen)["activations"]
    assert act["reference"] == 10 * 27 * 151_936 + 2 * 1_536 * 10_240
    assert act["peak"] == act["lm"] + act["vocab"] + act["images"] + act["mask"] > act["reference"]
    whole = recipe_forecast(load("coco/grpo_sr_cider_vlm", ["train.gradient_checkpointing=false"]), qwen)
    assert whole["activations"]["reference"] == 10 * 10_240 * 151_936 < whole["activations"]["peak"]
    without = recipe_forecast(load("coco/grpo_sr_cider_vlm", ["grpo.kl_coef=0"]), qwen)["activations"]
    assert without["reference"] == 0 and without["peak"] == act["peak"]
    # --dry-run's forecast of a run's first batch reads the same setting
    batch = {"prompt_ids": torch.zeros(32, 335), "input_ids": torch.zeros(32, 12)}
    cfg = load("coco/grpo_sr_cider_vlm")
    assert step_of(cfg, batch, cfg.rl, True).reference
    cfg = load("coco/grpo_sr_cider_vlm", ["grpo.kl_coef=0"])
    assert not step_of(cfg, batch, cfg.rl, True).reference


def test_a_vllm_kv_cache_of_a_set_size_comes_beside_the_engines_weights():
    """vLLM's kv_cache_memory_bytes sizes the KV cache alone (the utilization is then ignored): the engine holds its
    own copy of the weights besides. A 1-layer tied Llama (h = 64, i = 160, 4 heads, 2 key-value heads of 16, 50
    words) with LoRA r8 on q/v: embedding 3,200 (the head tied to it), q 4,096, k 2,048, v 2,048, o 4,096, MLP
    30,720, norms 3 x 64: 46,400 weights, the adapters merged into them; 92,800 bytes in bf16."""
    from finecap.config import load
    from finecap.engines.base import engine_class
    from finecap.models.forecast import engine_weights, vllm_share

    config = LlamaConfig(num_hidden_layers=1, tie_word_embeddings=True, **SHAPES)
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=RANK, target_modules=["q_proj", "v_proj"]))
    assert engine_weights(model, 2) == 2 * 46_400
    sized = load("coco/grpo_cider_vlm", ["decode.engine=vllm", f"vllm.kv_cache_memory_bytes={2**30}"])
    assert vllm_share(sized.vllm, None, weights=92_800) == 2**30 + 92_800
    share = load("coco/grpo_cider_vlm", ["decode.engine=vllm", "vllm.gpu_memory_utilization=0.25"])
    assert vllm_share(share.vllm, 80 * 2**30, weights=92_800) == 20 * 2**30  # the weights are inside the share
    # what --dry-run adds: the engine decode.engine names says (finecap's decoder holds nothing of its own)
    captioner = SimpleNamespace(model=model)
    assert sized.train.mixed_precision == "bf16"  # vllm.dtype=auto: the engine computes in bf16
    assert engine_class(sized.decode).device_share(captioner, sized, None, cuda=False) == 2**30 + 92_800
    fp32 = dataclasses.replace(sized, vllm=dataclasses.replace(sized.vllm, dtype="float32"))
    assert engine_class(fp32.decode).device_share(captioner, fp32, None, cuda=False) == 2**30 + 4 * 46_400
    plain = load("coco/grpo_cider_vlm")
    assert engine_class(plain.decode).device_share(captioner, plain, 80 * 2**30, cuda=True) == 0


@pytest.mark.parametrize("name", ["SmolVLM-256M", "Qwen2-VL-2B"])
def test_the_reference_towers_and_their_adapters_count_what_the_built_towers_hold(name):
    """The vision towers of SmolVLM-256M (SigLIP at 512 px) and Qwen2-VL-2B (its ViT, merger included: the
    projector) built from their config.json shapes on the meta device, and peft's LoRA r32 on the family's default
    targets (finecap.models.vlm): the parameters the recipe sizing counts; and the layer kind its trained tower's
    activations are counted as is the one its config gives (Qwen2-VL's: LayerNorm, fused rotary qkv, QuickGELU,
    float32 rotary tables; SigLIP's encoder keeps the embeddings)."""
    import transformers as tf

    from finecap.models.forecast import BACKBONES, tower_kind
    from finecap.models.vlm import QWEN_VIT_TARGETS, VIT_TARGETS

    backbone = BACKBONES[name]
    with torch.device("meta"):
        if name == "Qwen2-VL-2B":
            from transformers.models.qwen2_vl import modeling_qwen2_vl

            config = tf.Qwen2VLConfig().vision_config.__class__(
                depth=32, embed_dim=1280, hidden_size=1536, num_heads=16, mlp_ratio=4, patch_size=14,
                spatial_merge_size=2, temporal_patch_size=2)  # fmt: skip
            tower, targets = (
                modeling_qwen2_vl.Qwen2VisionTransformerPretrainedModel._from_config(config),
                QWEN_VIT_TARGETS,
            )
            extra = backbone.projector_params  # visual.merger
        else:
            from transformers.models.idefics3 import modeling_idefics3

            config = tf.Idefics3VisionConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                             num_attention_heads=12, image_size=512, patch_size=16)  # fmt: skip
            tower, targets = modeling_idefics3.Idefics3VisionTransformer._from_config(config), VIT_TARGETS
            extra = 0
        assert sum(p.numel() for p in tower.parameters()) == backbone.vision_params + extra
        v = backbone.vision
        kind = tower_kind(config)  # its layers' and what the tower holds beside them (its rotary tables, embeddings)
        assert {k: getattr(v, k) for k in kind} == kind
        adapted = get_peft_model(tower, LoraConfig(r=32, target_modules=list(targets)))
    adapters = sum(p.numel() for n, p in adapted.named_parameters() if "lora_" in n)
    assert backbone.vision_lora(32) == adapters
    assert backbone.vision_lora(32, ("fc1",)) < adapters


# --------------------------------------------------------------------------------------------------------------------
# Real size (SmolVLM-256M shapes, random weights) against benchmarks/memory.py's measured allocation peaks
# --------------------------------------------------------------------------------------------------------------------


def _memory_benchmark():
    return benchmark("memory")


SMOLVLM = LmShapes(30, 576, 1536, 9, 3, 49_152)  # benchmarks/memory.py's vocabulary: 49,152 words
REAL = [  # variant overrides, step, Training (no mask: one image size, captions of one length)
    ("fp32", [], "mle", Training("full", 4, mask=False)),
    ("lora", ["lora.lm=true", "lora.rank=16"], "scst", Training("lora", 4, rank=16, mask=False)),
    (
        "bf16+lora+ckpt",
        ["model.dtype=bfloat16", "lora.lm=true", "lora.rank=16", "train.gradient_checkpointing=true"],
        "scst",
        Training("lora", 2, rank=16, mask=False, checkpointing=True),
    ),
    (  # the tower's LoRA adapters trained too: its backward pass is the peak
        "bf16+lora+tower+ckpt",
        [
            "model.dtype=bfloat16",
            "lora.lm=true",
            "lora.rank=16",
            "train.gradient_checkpointing=true",
            "model.train_encoder=true",
            "lora.encoder=true",
        ],
        "scst",
        Training("lora", 2, rank=16, mask=False, checkpointing=True, tower="lora", cpu=True),
    ),  # fmt: skip
]


FROZEN_TOWER_LAYERS = 2
"""The SigLIP tower's depth where it is frozen (SmolVLM-256M's: 12). A frozen tower runs without a graph: what it
holds at its peak is the stream, what it keeps beside it from its second layer on (the embeddings), and one layer's
temporaries (:func:`frozen_tower_bytes`), and what it hands the language model is 64 image tokens an image, whatever
its depth from 2 layers on; no term of the forecast reads that depth (the test asserts it: a 1-layer tower, whose
embeddings are its stream, would be counted otherwise), and the tower's phase is not these cases' peak (the language
model's is; asserted too). The 12-layer frozen tower was most of these cases' work on the CPU (about 500 GFLOP a
pass at 2 images against the language model's 130): 2 layers at its real widths check the same count."""


@pytest.fixture(scope="module")
def smolvlm_checkpoint(tmp_path_factory):
    """benchmarks/memory.py's benchmark module and a function giving the overrides that load its SmolVLM-256M-shaped
    random checkpoint with a SigLIP tower of the depth asked (12, or :data:`FROZEN_TOWER_LAYERS`), each saved once for
    the cases below."""
    bench, saved = _memory_benchmark(), {}

    def loads(tower_layers: int) -> list[str]:
        if tower_layers not in saved:
            root = tmp_path_factory.mktemp(f"real{tower_layers}")
            saved[tower_layers] = bench.save_checkpoints(root, ["vlm"], vlm_tower_layers=tower_layers)["vlm"]
        return saved[tower_layers]

    return bench, loads


@pytest.mark.slow
@pytest.mark.parametrize(("name", "overrides", "step", "train"), REAL, ids=[r[0] for r in REAL])
def test_forecast_within_a_quarter_of_the_measured_cpu_peak(smolvlm_checkpoint, name, overrides, step, train):
    """SmolVLM-256M's language model at its real size; its SigLIP tower at its real widths, 12 layers where it trains
    (its saved inputs are a per-layer sum) and :data:`FROZEN_TOWER_LAYERS` where it is frozen (its depth is in no
    term of the forecast: asserted)."""
    bench, loads = smolvlm_checkpoint
    # 2 images; 1 where the tower trains (its backward pass at 1,024 patches an image is this file's costliest
    # step on the CPU: 1 image checks the same count at half the work)
    images, samples, tokens = (2 if train.tower == "frozen" else 1), 4, 24
    tower_layers = 12 if train.tower != "frozen" else FROZEN_TOWER_LAYERS
    run = [*loads(tower_layers), "train.batch_size=8", *overrides]
    row = bench.measure(run, step, images, samples, tokens, measures=["activations"])  # the others' passes left out
    shapes = Step(images, row["prompt_tokens"], samples if step == "scst" else 1, tokens,
                  shared=step == "scst")  # fmt: skip
    # SigLIP at 512 px, patch 16, one crop, of the depth measured
    vision = VisionShapes(768, 3072, 1024, 3 * 512 * 512, tower_layers, 12)
    parts = activation_forecast(SMOLVLM, train, shapes, vision)
    if train.tower == "frozen":  # its depth in no term, its phase below the language model's
        assert parts == activation_forecast(SMOLVLM, train, shapes, dataclasses.replace(vision, layers=12))
        assert parts["peak"] > parts["tower"] + parts["images"], parts
    forecast = parts["peak"] / 2**20
    print(f"{name}: prompt {row['prompt_tokens']} tokens, forecast {forecast:.0f} MB, measured "
          f"{row['activations_mb']:.0f} MB ({forecast / row['activations_mb']:.3f})")  # fmt: skip
    assert 0.75 <= forecast / row["activations_mb"] <= 1.25, (forecast, row)


def test_forecast_of_a_runs_first_batch_reads_its_shapes(tmp_path):
    """``--dry-run``'s forecast of a VLM run: the batch's images, prompt and caption lengths, the model's shapes and
    the run's levers; the MLE objective scores one teacher-forced caption per image, in vocabulary chunks."""
    from PIL import Image

    from finecap.config import load
    from finecap.data.datasets import model_collator
    from finecap.models.backbones import build_model
    from finecap.models.forecast import forecast_of_run
    from finecap.models.presets import save_tiny_vlm
    from finecap.objectives.mle import MLE

    folder = save_tiny_vlm(tmp_path / "vlm", "idefics3")
    cfg = load("coco/mle_vlm", [f"vlm.name={folder}"])
    model = build_model(cfg)
    items = [{"caption": "w1 w2", "image": Image.new("RGB", (32, 24)), "image_id": i, "references": ["w1"],
              "index": i} for i in range(3)]  # fmt: skip
    batch = model_collator(model, 8)(items)
    out = forecast_of_run(model, cfg, batch, MLE())
    step, train = out["step"], out["training"]
    assert (step.images, step.prompt, step.captions, step.tokens) == (3, batch["prompt_ids"].shape[1], 1,
                                                                      batch["input_ids"].shape[1])  # fmt: skip
    assert step.chunked and not step.shared
    assert (train.lm, train.weights_bytes, train.autocast, train.checkpointing) == ("lora", 2, True, True)
    text = model.model.config.text_config
    assert out["bytes"]["peak"] == activation_forecast(LmShapes.of(model.model.config), train, step,
                                                       VisionShapes.of(model.model.config, batch["pixel_values"], 3)
                                                       )["peak"] > 0  # fmt: skip
    assert LmShapes.of(model.model.config).hidden == text.hidden_size
    assert train.tower == "frozen" and not train.cpu and out["bytes"]["tower_saved"] == 0
    vision = VisionShapes.of(model.model.config, batch["pixel_values"], 3)
    config = model.model.config.vision_config
    assert (vision.layers, vision.heads) == (config.num_hidden_layers, config.num_attention_heads)
    # the tower's adapters trained (coco/sr_lv_bagcurri_vlm's levers), on the CPU
    tower_cfg = load("coco/mle_vlm", [f"vlm.name={folder}", "model.train_encoder=true", "lora.encoder=true"])
    towered = forecast_of_run(build_model(tower_cfg), tower_cfg, batch, MLE(), cpu=True)
    assert (towered["training"].tower, towered["training"].cpu) == ("lora", True)
    assert towered["bytes"]["tower_saved"] == vision.layers * 3 * vision.patches * 2 * vision.hidden  # bf16 inputs
    assert towered["bytes"]["peak"] > out["bytes"]["peak"]


def test_every_familys_tower_kind_is_read_and_its_targets_are_its_layers_linears_and_glm_reads_its_mlps_width():
    """Each family's tower layer kind is read from its config (tower_kind: RMSNorm and the gated MLP, the fused
    rotary qkv, QuickGELU), and its default tower targets (finecap.models.vlm.FAMILIES) map onto exactly the linear
    layers the count knows in a layer of that kind (an unmapped name matched nothing, and its adapters went
    uncounted: InternViT's projection_layer, Pixtral's o_proj, Qwen3-VL's linear_fc1/2; until 2026-11-28 the gated
    MLP's gate_proj and up_proj were counted as one fc1 and the fused qkv as three projections), and GLM-4.1V's vision
    MLP is out_hidden_size wide (its intermediate_size is the merger's)."""
    from transformers import Glm4vVisionConfig

    from finecap.models.forecast import TOWER_TARGETS, mlp_width, tower_kind, tower_linears
    from finecap.models.tiny import tiny_family
    from finecap.models.vlm import FAMILIES

    gated = {"norm": "rms", "mlp": "gated"}
    fused = {"attention": "fused", "rotary": "float32", "embeddings_kept": 0}
    kinds = {
        "glm4v": {**gated, **fused},
        "qwen2_5_vl": {**gated, **fused},
        "mistral3": {**gated, "attention": "split", "block_mask": True, "rotary": "weights", "embeddings_kept": 2},
        "qwen2_vl": {"mlp": "quick_gelu", **fused},
        # its tiny tower's 2 layers, DeepStack after both (indexes 0 and 1): layer 0's features, 64 values a merged
        # token of 2 x 2 patches, kept while layer 1 runs
        "qwen3_vl": {**fused, "position_taps": 4, "deepstack": 64 // 4},
        "llava": {"mlp": "quick_gelu"},
        "llava_next": {"mlp": "quick_gelu"},
        "internvl": {"layer_scale": True},
    }
    for name, family in FAMILIES.items():
        kind = tower_kind(tiny_family(name)[0].config.vision_config)
        split = {"norm": "layer", "mlp": "gelu", "attention": "split", "embeddings_kept": 1}
        assert kind == {**split, **kinds.get(name, {})}, name
        linears = tower_linears(VisionShapes(64, 256, 1, 0, 1, 4, **kind))
        assert set(tower_targets_of(family.vision_targets)) == set(linears) <= set(TOWER_TARGETS), name
    glm = Glm4vVisionConfig(hidden_size=1536, intermediate_size=13_696, out_hidden_size=4096)
    assert mlp_width(glm, 1536) == 4096
    assert mlp_width(SimpleNamespace(intermediate_size=3072), 768) == 3072
    assert mlp_width(SimpleNamespace(mlp_ratio=4), 1280) == 5120


def test_a_towers_modules_outside_its_layers_are_counted_as_adapting_no_layer():
    """In every family's tiny tower, each linear or convolution module named by its full path is counted as adapting
    a layer's linear (``tower_targets_of``) exactly when it is inside one of the tower's encoder layers: the Qwen
    towers' patch embedding ``patch_embed.proj`` (a convolution) was read as the attention's ``proj``, and the
    mergers' ``proj``, ``gate_proj``, ``down_proj``, ``linear_fc1`` ... and SigLIP's pooling head's ``out_proj`` and
    ``fc1`` as a layer's projections."""
    from finecap.models.base import module_path
    from finecap.models.tiny import tiny_family
    from finecap.models.vlm import FAMILIES

    assert tower_targets_of(["patch_embed.proj"]) == ("patch_embed.proj",)
    assert tower_targets_of(["visual.merger.down_proj", "merger.linear_fc1"]) == ("visual.merger.down_proj",
                                                                                  "merger.linear_fc1")  # fmt: skip
    assert tower_targets_of(["blocks.0.attn.proj", "proj"]) == ("out_proj",)
    outside = set()
    for name, family in FAMILIES.items():
        tower = module_path(tiny_family(name)[0], family.vision)
        lists = [n for n, m in tower.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m)
                 and type(m[0]).__name__.endswith(("Layer", "Block"))]  # fmt: skip
        for path, module in tower.named_modules():
            if not isinstance(module, (torch.nn.Linear, torch.nn.Conv2d, torch.nn.Conv3d)):
                continue
            in_layer = any(path.startswith(f"{prefix}.") for prefix in lists if "merger" not in prefix)
            (role,) = tower_targets_of([path])
            assert (role != path) == in_layer, (name, path, role)
            outside |= {path} - ({path} if in_layer else set())
    assert {"patch_embed.proj", "merger.proj", "merger.down_proj", "head.attention.out_proj"} <= outside


def test_the_frozen_tower_term_is_the_stream_and_one_layers_peak_and_pixtrals_block_mask():
    """The step's ``tower`` term (a frozen tower: no graph) is :func:`frozen_tower_bytes` of every patch the step
    runs through the tower, by hand at Pixtral's shapes (width 1,024, MLP 4,096, 8 images of 4,096 patches in bf16):
    the residual stream (``2h``) and the gated MLP's phase, the largest (the stream after attention and the normed
    input, ``2 w h``, ``act(gate)``, ``up`` and their product, ``3 w i``), plus the block-diagonal mask over all
    32,768 patches (``w x patches^2``, 2 GiB); the fused rotary attention in bf16 (the normed input and ``qkv``,
    ``4 w h``; float32 query and key casts, ``8h``; the rotated query and the key's three float32 temporaries,
    ``16h``) and in float32 (no casts). The count it replaced, ``(5h + 2i) w`` a patch, came to 0.81 GiB here."""
    vision = VisionShapes(1024, 4096, 4096, 3 * 1024 * 1024, 24, 16, norm="rms", mlp="gated", block_mask=True)
    patches = 8 * 4096
    per_patch = 2 * 1024 + 2 * 2 * 1024 + 3 * 2 * 4096
    assert frozen_tower_bytes(vision, 2, patches) == patches * per_patch + 2 * patches**2 == 3_154_116_608
    # what Pixtral's forward also holds through its layers: the patch_conv output and ln_pre's (2 x 2h), the int64
    # position ids (16) and the bf16 rotary cos and sin (2 x 2 x 64)
    pixtral = dataclasses.replace(vision, rotary="weights", embeddings_kept=2)
    held = 2 * 2 * 1024 + 16 + 2 * 2 * 64
    assert frozen_tower_bytes(pixtral, 2, patches) == 3_154_116_608 + patches * held == 3_297_247_232
    lm = LmShapes(2, 64, 128, 4, 2, 100)
    out = activation_forecast(lm, Training("frozen", 2, projector_trains=False), Step(8, 300, 1, 10), pixtral)
    assert out["tower"] == 3_297_247_232 + 8 * 309 * 64 * 2  # and the prompt's embeddings (Pixtral: no pixel copy)
    fused = VisionShapes(1280, 1280, 1, 0, 32, 16, norm="rms", mlp="gated", attention="fused")  # i = h: attention
    assert frozen_tower_bytes(fused, 2, 1) == 2 * 1280 + 4 * 2 * 1280 + 8 * 1280 + 16 * 1280
    assert frozen_tower_bytes(fused, 4, 1) == 4 * 1280 + 4 * 4 * 1280 + 16 * 1280


def test_qwen3_vls_frozen_tower_peaks_at_its_interpolated_position_embedding_in_bf16():
    """Qwen3-VL's tower (``transformers`` 5.24) embeds its positions before the first layer by bilinear
    interpolation of a learned table: the patch embedding (``2h``), the int64 position ids (16) and the 4 taps'
    int64 indices and float32 weights (48), the 4 bf16 rows looked up (``4 x 2h``), their float32 cast and the float32
    product (``4 x 4h`` each): 43,072 B a patch at width 1,024, above its layers' phase (the stream, the float32 rotary
    tables ``2 x 4 x 64`` and ids, the indices and weights, the float32 position embeddings ``4h``, the DeepStack
    features of 3 layers, 2,048 values a merged token of 4 patches, in bf16, and the fused attention, ``4 x 2h +
    24h``: 42,560); in float32 the MLP's phase is larger (no casts; GELU, ``2 x 4h + 2 x 4 x 4h``). Until 2026-11-28
    only the layers' phase without what is held beside it (34,816 B a patch in bf16: 0.81 of this) was counted; the
    tiny tower measures exactly this count (``benchmarks/tower_forecast.py --frozen``)."""
    h, d = 1024, 64
    qwen3 = VisionShapes(h, 4 * h, 1, 0, 24, 16, attention="fused", rotary="float32", embeddings_kept=0,
                         position_taps=4, deepstack=3 * 2048 // 4)  # fmt: skip
    position = 2 * h + 16 + 48 + 4 * 2 * h + 4 * 4 * h + 4 * 4 * h
    layers = 2 * h + (16 + 2 * 4 * d) + (48 + 4 * h) + 2 * 1536 + (4 * 2 * h + 24 * h)
    assert (position, layers) == (43_072, 42_560)
    assert frozen_tower_bytes(qwen3, 2, 10) == 10 * 43_072
    mlp = 4 * h + (16 + 2 * 4 * d) + (48 + 4 * h) + 4 * 1536 + (2 * 4 * h + 2 * 4 * 4 * h)
    assert frozen_tower_bytes(qwen3, 4, 1) == mlp == 55_872
    config = SimpleNamespace(model_type="qwen3_vl_vision", depth=24, deepstack_visual_indexes=[5, 11, 17],
                             out_hidden_size=2048, spatial_merge_size=2, hidden_act="gelu_pytorch_tanh")  # fmt: skip
    assert deepstack_values(config) == 1536
    assert deepstack_values(SimpleNamespace(**{**config.__dict__, "depth": 18})) == 1024  # layer 17's: none after
    assert tower_kind(config) == {"norm": "layer", "mlp": "gelu", "attention": "fused", "rotary": "float32",
                                  "embeddings_kept": 0, "position_taps": 4, "deepstack": 1536}  # fmt: skip
    with pytest.raises(ValueError, match="heads"):
        VisionShapes(h, 4 * h, 1, 0, rotary="float32")


def test_a_trained_pixtral_tower_keeps_its_block_mask_and_rotary_tables_to_its_backward_pass():
    """The trained tower's saved activations count, once, what all its layers save of the tensors they share
    (``tower_shared_bytes``), by hand at Pixtral's shapes (width 1,024, MLP 4,096, 16 heads, 24 layers; 8 images of
    4,096 patches): in bf16 with LoRA the bf16 mask (``2 x 32,768^2``, 2 GiB) and cos and sin (``2 x 2 x 64`` a
    patch); with float32 weights under autocast each layer's bf16 cast of the float32 mask (2 GiB a layer) and the
    float32 tables; under checkpointing the float32 mask itself (a layer's input) and the recomputed layer's cast.
    Until 2026-11-28 none of them was counted."""
    vision = VisionShapes(1024, 4096, 4096, 3 * 1024 * 1024, 24, 16, norm="rms", mlp="gated", block_mask=True,
                          rotary="weights", embeddings_kept=2)  # fmt: skip
    patches, lm, step = 8 * 4096, LmShapes(2, 64, 128, 4, 2, 100), Step(8, 300, 1, 10)
    lora = Training("frozen", 2, rank=8, projector_trains=False, tower="lora")
    layer = patches * tower_layer_bytes(vision, lora)
    assert tower_shared_bytes(vision, lora, patches) == (patches * 2 * 2 * 64 + 2 * patches**2, 0)
    out = activation_forecast(lm, lora, step, vision)
    assert out["tower_saved"] == 24 * layer + patches * 256 + 2 * patches**2 == 66_813_165_568
    cast = Training("frozen", 4, autocast=True, rank=8, projector_trains=False, tower="lora")
    assert tower_shared_bytes(vision, cast, patches) == (patches * 2 * 4 * 64, 2 * patches**2)
    out = activation_forecast(lm, cast, step, vision)
    layer = patches * tower_layer_bytes(vision, cast) + tower_autocast_bytes(vision, cast) + 2 * patches**2
    assert out["tower_saved"] == 24 * layer + patches * 512
    checkpointed = dataclasses.replace(cast, checkpointing=True)
    out = activation_forecast(lm, checkpointed, step, vision)
    assert out["tower_saved"] == 24 * patches * 4 * 1024 + patches * 512 + 4 * patches**2
    assert out["tower_backward"] == layer + patches * tower_gradient_bytes(vision, checkpointed)


def test_the_frozen_tower_term_holds_what_the_model_made_of_the_pixels_and_the_prompts_embeddings():
    """The step's ``tower`` term also counts what ``get_image_features`` makes of the pixels before the tower runs and
    holds while it runs, and the embeddings of the ids the pass embedded first; the ``images`` term, Idefics's int64
    pixel mask beside the float32 pixels. By hand at SmolVLM's shapes (Idefics3: SigLIP 768 wide, MLP 3,072, one
    512 px crop of 1,024 patches; 32 images of 78 prompt and 9 caption tokens, one caption each: the pass runs 86
    positions a row; bf16): the tower's stream and GELU MLP, ``(2h + 2 x 2h + 2 x 2i)`` = 16,896 B a patch; the real
    images' bf16 copy (``2 p``, ``p`` = 3 x 512 x 512), their pixel mask's int64 copy (``8 p / 3``) and the bool patch
    mask (1 B a patch); the prompt's embeddings, ``86 x 64 x 2`` B a row. The count before was the first alone
    (553,648,128 B: 0.82 of this) and the pixel values alone (``4 p`` an image). A cast (the Qwen towers) copies in
    bf16 only; LLaVA-NeXT's crops are float32 in either."""
    p = 3 * 512 * 512
    vision = VisionShapes(768, 3072, 1024, p, 12, 12, pixel_copy="select")
    assert pixel_copy_bytes(vision, 2) == 2 * p + 8 * p // 3 + 1024 == 3_671_040
    assert pixel_input_bytes(vision) == 4 * p + 8 * p // 3 == 5_242_880
    lm = LmShapes(2, 64, 128, 4, 2, 100)
    out = activation_forecast(lm, Training("frozen", 2, projector_trains=False), Step(32, 78, 1, 9), vision)
    assert out["tower"] == 32 * 1024 * 16_896 + 32 * 3_671_040 + 32 * 86 * 64 * 2 == 671_473_664
    assert out["images"] == 32 * 5_242_880
    cast = dataclasses.replace(vision, pixel_copy="cast")
    assert (pixel_copy_bytes(cast, 2), pixel_copy_bytes(cast, 4)) == (2 * p, 0)
    crops = dataclasses.replace(vision, pixel_copy="crops")
    assert pixel_copy_bytes(crops, 2) == pixel_copy_bytes(crops, 4) == 4 * p
    assert pixel_copy_bytes(dataclasses.replace(vision, pixel_copy="none"), 2) == 0
    with pytest.raises(ValueError, match="pixel_copy"):
        VisionShapes(768, 3072, 1024, p, pixel_copy="copied")


@pytest.mark.parametrize(
    ("model_type", "copy"),
    [
        ("idefics3", "select"),
        ("smolvlm", "select"),
        ("llava_next", "crops"),
        ("qwen2_5_vl", "cast"),
        ("llava", "none"),
    ],
)
def test_the_shapes_of_a_vlm_read_what_its_model_makes_of_the_pixels_from_its_model_type(model_type, copy):
    vision = SimpleNamespace(
        hidden_size=64,
        intermediate_size=256,
        patch_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        model_type="siglip_vision_model",
    )
    config = SimpleNamespace(model_type=model_type, vision_config=vision)
    shapes = VisionShapes.of(config, torch.zeros(2, 3, 32, 32), 2)
    assert (shapes.pixel_copy, shapes.pixels, shapes.patches) == (copy, 3 * 32 * 32, 4)


def test_every_familys_vision_config_gives_its_shapes():
    """``VisionShapes.of`` reads each family's tiny config: InternViT's ``patch_size`` is a pair (``[4, 4]`` here,
    ``[14, 14]`` in InternVL3), which ``int()`` refused until 2026-11-28, so ``finecap train --dry-run`` of an InternVL
    model failed in its forecast."""
    from finecap.models.tiny import tiny_family
    from finecap.models.vlm import FAMILIES

    for name in FAMILIES:
        config = tiny_family(name)[0].config
        size = config.vision_config.patch_size
        area = size * size if isinstance(size, int) else size[0] * size[1]
        per_patch = 3 * area * int(getattr(config.vision_config, "temporal_patch_size", 1) or 1)
        shapes = VisionShapes.of(config, torch.zeros(2, 5 * per_patch), 2)  # 2 images of 5 patches each
        assert (shapes.pixels, shapes.patches) == (5 * per_patch, 5), name


def test_rows_reading_prompt_embeddings_run_the_tower_once_per_image():
    """``Step.own_forward=False``: an unshared prompt's rows read prompt embeddings made once per image (the world
    VLM; every VLM before the prompt pass became the model's own forward), so the tower and the pixels are counted
    for the images, not for every row, and the language model is unchanged; with the own forward, every row's."""
    vision = VisionShapes(64, 256, 16, 3 * 32 * 32, 2, 4, pixel_copy="select")
    train = Training("lora", 2, autocast=True, checkpointing=True)
    own = activation_forecast(SMOLVLM, train, Step(2, 20, 8, 10), vision)
    embeds = activation_forecast(SMOLVLM, train, Step(2, 20, 8, 10, own_forward=False), vision)
    assert embeds["lm"] == own["lm"] and embeds["vocab"] == own["vocab"]
    projector = 2 * vision.projector_in if train.projector_trains else 0  # its bf16 input (autocast), per image seen
    assert own["images"] == pixel_input_bytes(vision) * (2 + 16) + projector * 16
    assert embeds["images"] == pixel_input_bytes(vision) * 2 + projector * 2
    tower_rows = frozen_tower_bytes(vision, 2, 16 * 16) + 16 * pixel_copy_bytes(vision, 2)
    tower_images = frozen_tower_bytes(vision, 2, 2 * 16) + 2 * pixel_copy_bytes(vision, 2)
    assert own["tower"] - embeds["tower"] == tower_rows - tower_images > 0


@pytest.mark.parametrize("kept", [0, 1, 2])
def test_a_one_layer_frozen_tower_holds_what_it_keeps_less_its_stream_and_never_less_than_none(kept):
    """A 1-layer tower's embeddings are its stream, so it keeps one tensor fewer beside it than a deeper one; a tower
    that keeps none (the Qwen towers', GLM-4.1V's: ``embeddings_kept=0``) kept -1 at one layer: its forecast fell a
    whole stream below a 2-layer tower's (``w h`` a patch), less than what it holds."""
    vision = VisionShapes(64, 256, 16, 3 * 32 * 32, 2, 4, attention="fused", rotary="float32",
                          embeddings_kept=kept)  # fmt: skip
    two, one = frozen_tower_bytes(vision, 2, 16), frozen_tower_bytes(dataclasses.replace(vision, layers=1), 2, 16)
    assert two - one == (2 * 64 * 16 if kept else 0)  # w h a patch, 16 patches, bf16
