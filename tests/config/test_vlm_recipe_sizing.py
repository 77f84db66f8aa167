"""The ``coco/*_vlm`` recipes are sized for one 80 GB card (issue 65): each defaults to bf16 weights, bf16 autocast,
gradient checkpointing, LoRA on the language model and a pixel budget; finecap's forecast of a step
(:func:`finecap.models.forecast.recipe_forecast`) at SmolVLM-256M's and Qwen2-VL-2B's shapes fits the card with the
margin :func:`finecap.models.forecast.fits` states; the numbers each recipe's comment states are that forecast's; the
shapes and parameter counts it sizes are what ``transformers`` builds from the backbones' configs, and its exact state
is what the H200 run counted on the model it built; full fine-tuning is one override away."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from finecap.config import load
from finecap.models.forecast import (
    BACKBONES,
    BUDGET_PIXELS,
    CARD_80GB,
    GIB,
    OUTSIDE_ALLOCATOR,
    UNDER_FORECAST,
    fits,
    recipe_forecast,
    recipe_state,
)
from finecap.recipes import resolve_recipe

VLM_RECIPES = ["mle_vlm", "smile_vlm", "discritune_vlm", "sr_l_vlm", "sr_lv_bagcurri_vlm", "grpo_cider_vlm",
               "grpo_sr_cider_vlm"]  # fmt: skip
KEPT = (("retrievers", "retrievers"), ("reference", "KL reference"))  # what a comment adds, as it names it
CLIP_B32 = 4 * 151_277_313 + 8 * (77 + 50)  # CLIP ViT-B/32 in float32 and its position ids: 605,110,268 bytes


@pytest.mark.parametrize("recipe", VLM_RECIPES)
def test_vlm_recipe_defaults_to_the_memory_levers(recipe):
    cfg = load(f"coco/{recipe}")
    assert cfg.model.dtype == "bfloat16" and cfg.train.mixed_precision == "bf16"
    assert cfg.train.gradient_checkpointing and cfg.lora.lm and cfg.model.train_lm
    assert cfg.vlm.image_max_pixels == BUDGET_PIXELS
    assert "80 GB" in resolve_recipe(f"coco/{recipe}").read_text().splitlines()[0]


@pytest.mark.parametrize("recipe", VLM_RECIPES)
def test_vlm_recipe_fits_the_card_at_both_sizes_as_its_comment_says(recipe):
    cfg = load(f"coco/{recipe}")
    text = resolve_recipe(f"coco/{recipe}").read_text()
    for backbone in BACKBONES.values():
        f = recipe_forecast(cfg, backbone)
        assert fits(f["total"]), (recipe, backbone.name, f["total"] / GIB)
        s, act, beside = f["state"], f["activations"]["peak"], f["beside"]
        stated = (
            f"{backbone.name} {f['total'] / GIB:.2f} = weights {s['weights'] / GIB:.2f} + gradients "
            f"{s['gradients'] / GIB:.2f} + AdamW {s['optimizer'] / GIB:.2f} + activations {act / GIB:.2f}"
        ) + "".join(f" + {label} {beside[k] / GIB:.2f}" for k, label in KEPT if beside[k])
        assert f["total"] == s["total"] + act + sum(beside.values())
        assert stated in text, (recipe, stated)
    assert re.search(rf"Memory per process, {cfg.train.batch_size} images", text)


def test_full_fine_tuning_is_one_override_away():
    lora = recipe_forecast(load("coco/mle_vlm"), BACKBONES["Qwen2-VL-2B"])
    full = recipe_forecast(load("coco/mle_vlm", ["lora.lm=false"]), BACKBONES["Qwen2-VL-2B"])
    # the language model (1.54 B parameters) trains in float32: 4 bytes of weights, 4 of gradients, 8 of AdamW each
    assert full["state"]["gradients"] == 4 * (1_543_714_304 + 34_087_936)
    assert full["state"]["optimizer"] == 2 * full["state"]["gradients"]
    # LoRA r32 on q/k/v/o of 28 layers: 32 x ((1536 + 1536) + 2 x (1536 + 256) + (1536 + 1536)) x 28, + the projector
    assert lora["state"]["optimizer"] == 8 * (32 * 9728 * 28 + 34_087_936)


def test_a_recipe_training_the_vision_tower_counts_its_adapters_or_the_tower():
    """coco/sr_lv_bagcurri_vlm (model.train_encoder, lora.encoder) at Qwen2-VL-2B's shapes trains, besides the
    language model's adapters (32 x 9,728 x 28) and the projector (34,087,936), LoRA r32 on the tower's qkv, proj,
    fc1 and fc2 of 32 layers: 32 x 32 x ((1,280 + 3,840) + (1,280 + 1,280) + 2 x (1,280 + 5,120)) = 20,971,520 (what
    peft puts on the tower built on the meta device: tests/models/test_memory_forecast.py)."""
    qwen = BACKBONES["Qwen2-VL-2B"]
    lv = recipe_forecast(load("coco/sr_lv_bagcurri_vlm"), qwen)["state"]
    assert lv["gradients"] == 4 * (32 * 9728 * 28 + 20_971_520 + 34_087_936)
    full = recipe_forecast(load("coco/sr_lv_bagcurri_vlm", ["lora.encoder=false"]), qwen)["state"]
    assert full["gradients"] == 4 * (32 * 9728 * 28 + 631_183_360 + 34_087_936)  # the whole tower trains
    frozen = recipe_forecast(load("coco/sr_l_vlm"), qwen)["state"]
    assert frozen["gradients"] == 4 * (32 * 9728 * 28 + 34_087_936)


def test_a_recipe_counts_the_retrievers_and_the_kl_reference_it_keeps_beside():
    """Session 35's review: the sizing left out the frozen CLIP retriever of the SR and SMILE recipes and the GRPO
    KL's copy of the trained weights. One retriever when the self-retrieval reward or the retrieval validator reads
    it (a run loads it once and both share it: tests/train/test_shared_retriever.py), 605,110,268 bytes (CLIP
    ViT-B/32: checked against the model built on the meta device in tests/models/test_retriever.py); the KL
    copy is every trained parameter in float32 but fresh LoRA adapters."""
    qwen = BACKBONES["Qwen2-VL-2B"]
    assert recipe_forecast(load("coco/mle_vlm"), qwen)["beside"] == {"retrievers": 0, "reference": 0}
    assert recipe_forecast(load("coco/smile_vlm"), qwen)["beside"]["retrievers"] == CLIP_B32  # the validator's
    assert recipe_forecast(load("coco/sr_l_vlm"), qwen)["beside"]["retrievers"] == CLIP_B32  # shared with the reward's
    lora = 32 * 9728 * 28  # LoRA r32 on q/k/v/o of 28 layers (test_full_fine_tuning_is_one_override_away)
    grpo = recipe_forecast(load("coco/grpo_sr_cider_vlm"), qwen)["beside"]
    # from coco/mle_vlm's checkpoint (train.init_from), whose adapters of the same settings continue: copied
    assert grpo == {"retrievers": CLIP_B32, "reference": 4 * (lora + 34_087_936)}
    fresh = recipe_forecast(load("coco/grpo_sr_cider_vlm", ["train.init_from="]), qwen)["beside"]
    assert fresh["reference"] == 4 * 34_087_936  # fresh adapters: the reference runs with them off
    full = recipe_forecast(load("coco/grpo_sr_cider_vlm", ["lora.lm=false"]), qwen)
    assert full["beside"]["reference"] == 4 * (1_543_714_304 + 34_087_936)  # the whole language model: 5.9 GiB
    assert round(full["beside"]["reference"] / GIB, 1) == 5.9
    assert recipe_forecast(load("coco/grpo_sr_cider_vlm", ["grpo.kl_coef=0"]), qwen)["beside"]["reference"] == 0


def test_fitting_a_card_leaves_the_forecasts_tolerated_error_and_the_cuda_context():
    """An "80 GB" card is 80 x 10^9 bytes; a forecast fits it when the peak its tolerated error allows (4/3 of it)
    and 1 GiB outside torch's allocator are under that: a total just under the card's bytes does not fit, one with
    the margin does, and a smaller card is read as given."""
    assert CARD_80GB == 80 * 10**9 and UNDER_FORECAST == 0.75 and OUTSIDE_ALLOCATOR == GIB
    room = int((CARD_80GB - GIB) * 0.75)  # the largest total the margin leaves room for
    assert fits(room - 1) and not fits(room + 1)
    assert not fits(CARD_80GB - 1)
    assert fits(10 * GIB) and not fits(10 * GIB, card=14 * 10**9)  # 10 x 4/3 + 1 = 14.3 GiB: over 14 GB


H200_RUN = sorted(
    (Path(__file__).resolve().parents[2] / "benchmarks" / "results").glob("gpu_check_h200_2026-11-28*.json")
)


def h200_memory_lines() -> list[dict]:
    """The ``memory:*`` lines the 2026-11-28 H200 run measured (each recipe's step, SmolVLM-256M-shaped model)."""
    lines = [c for f in H200_RUN for c in json.loads(f.read_text())["checks"]
             if c["name"].startswith("memory:") and "measured_peak_bytes" in c]  # fmt: skip
    assert {c["name"] for c in lines} == {f"memory:{r}" for r in VLM_RECIPES if r != "grpo_sr_cider_vlm"}
    return lines


def test_the_sizing_counts_the_state_the_h200_run_counted_on_the_model_it_built():
    """The recipe sizing (:func:`recipe_state`, nothing built) at the model the H200 run built (SmolVLM-256M's shapes,
    its vocabulary as the run's tokenizer made it: the untied head's rows) gives, byte for byte, the weights,
    gradients and AdamW state the run's ``--dry-run`` counted on that model (``forecast_bytes``), for each recipe it
    measured (LoRA on the language model; SR-LV's on the tower too)."""
    smol = BACKBONES["SmolVLM-256M"]
    for line in h200_memory_lines():
        params = line["parameters"]
        head = params["rest"]["frozen"]["bfloat16"]  # the untied head, vocabulary x hidden
        vocab, rest = divmod(head, smol.lm.hidden)
        assert rest == 0 and vocab == 49_036, (line["name"], vocab)
        lm = params["lm"]["frozen"]["bfloat16"]  # the language model's frozen weights, its adapters aside
        built = replace(smol, lm=replace(smol.lm, vocab=vocab), lm_params=lm + head)
        assert recipe_state(load(line["recipe"]), built) == line["forecast_bytes"], line["name"]


def test_outside_the_allocator_covers_what_the_h200_run_held_beside_its_cache():
    """:data:`OUTSIDE_ALLOCATOR` (1 GiB) is over what each measured ``memory:*`` line of the H200 run held on the
    device beyond torch's allocator (``device_used_gib_after`` less ``max_reserved_gib``: 0.75-0.76 GiB)."""
    for line in h200_memory_lines():
        outside = line["device_used_gib_after"] - line["max_reserved_gib"]
        assert 0 < outside * GIB < OUTSIDE_ALLOCATOR, (line["name"], outside)


def test_the_backbones_language_models_are_what_transformers_builds_from_their_configs():
    """The language-model shapes the sizing uses and their parameter counts (with the head: untied in SmolVLM-256M,
    tied in Qwen2-VL-2B), and SmolVLM's connector (the projector), against the models ``transformers`` builds on the
    meta device from the config classes at the shapes of each checkpoint's config.json (the towers:
    tests/models/test_memory_forecast.py)."""
    import torch
    import transformers as tf
    from transformers.models.idefics3 import modeling_idefics3
    from transformers.models.qwen2_vl import modeling_qwen2_vl

    def count(module: torch.nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    smol, qwen = BACKBONES["SmolVLM-256M"], BACKBONES["Qwen2-VL-2B"]
    with torch.device("meta"):
        text = tf.LlamaConfig(vocab_size=49_280, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                              num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=False)  # fmt: skip
        assert count(tf.LlamaForCausalLM(text)) == smol.lm_params
        idefics3 = tf.Idefics3Config(text_config=text.to_dict(), vision_config={"hidden_size": 768}, scale_factor=4)
        assert count(modeling_idefics3.Idefics3Connector(idefics3)) == smol.projector_params
        qtext = tf.Qwen2VLTextConfig(vocab_size=151_936, hidden_size=1536, intermediate_size=8960,
                                     num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                                     tie_word_embeddings=True)  # fmt: skip
        assert count(modeling_qwen2_vl.Qwen2VLTextModel._from_config(qtext)) == qwen.lm_params  # the head is tied
    for backbone, config in ((smol, text), (qwen, qtext)):
        lm = backbone.lm
        assert (lm.layers, lm.hidden, lm.intermediate, lm.heads, lm.kv_heads, lm.vocab) == (
            config.num_hidden_layers, config.hidden_size, config.intermediate_size, config.num_attention_heads,
            config.num_key_value_heads, config.vocab_size)  # fmt: skip
