"""benchmarks/tower_forecast.py: docs/memory.md's per-family table of a trained tower layer's saved bytes is the
script's output, and a tower of each layer kind measures exactly what the forecast counts, with and without autocast:
SigLIP's (Idefics3's, SmolVLM's), a gated MLP with RMSNorm and the fused rotary qkv (Qwen2.5-VL's), a gated MLP with
RMSNorm (Pixtral's, Mistral 3's) and CLIP's QuickGELU (LLaVA's, with its class token)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.markdown_tables import table_lines
from helpers.scripts import benchmark

MEMORY_PAGE = Path(__file__).resolve().parents[2] / "docs" / "memory.md"


@pytest.fixture(scope="module")
def script():
    return benchmark("tower_forecast")


def test_the_per_family_tower_table_is_the_scripts(script):
    assert table_lines(MEMORY_PAGE.read_text(), "**Per family, on the CPU.**") == script.table()[2:]


TOWERS = {"idefics3": ("Idefics3VisionTransformer", 4 * 16),
          "qwen2_5_vl": ("Qwen2_5_VisionTransformerPretrainedModel", 4 * 16),
          "mistral3": ("PixtralVisionModel", 4 * 16), "llava": ("CLIPVisionModel", 4 * 5)}  # fmt: skip


@pytest.mark.parametrize("autocast", [False, True], ids=["bf16", "autocast"])
@pytest.mark.parametrize("family", list(TOWERS))
def test_a_tower_layer_of_each_kind_saves_exactly_the_forecast(script, family, autocast):
    tower, patches, measured, forecast = script.row(family, autocast)
    assert (tower, patches) == TOWERS[family]
    assert measured == forecast


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava", "idefics3", "qwen3_vl"])
def test_a_frozen_towers_forward_peak_is_forecast_within_a_tenth(script, family):
    """The frozen tower's peak per patch (:func:`finecap.models.forecast.frozen_tower_bytes`) within 10 % of its
    forward pass's allocation peak on the CPU, differenced between 64 and 256 or 80 and 320 patches (bf16,
    ``--frozen``): a gated MLP with the fused rotary ``qkv`` (Qwen2.5-VL: the count it replaced, ``5h + 2i``, came to
    0.72 of it) and CLIP's QuickGELU (LLaVA: 0.81-0.84), both outside the bound, and SigLIP's GELU (Idefics3: 1.10-1.12
    then, at the bound's edge; the measured peak moves by a few percent from one process to another). LLaVA's tower,
    which LLaVA reads a hidden layer of (``vision_feature_layer``, ``output_hidden_states``), peaks no higher with two
    more layers: ``transformers`` keeps only the selected layer's output. Qwen3-VL peaks at its bilinear position
    embedding, before its first layer (0.79 until 2026-11-28, when that phase was not counted; 1.00 since)."""
    row = script.frozen_row(family)
    assert 0.9 <= row["forecast"] / row["measured"] <= 1.1, row
    assert row["deeper"] == 0, row


@pytest.mark.parametrize("family", ["idefics3", "llava_next"])
def test_the_models_forward_up_to_its_tower_is_forecast_within_a_tenth_with_the_pixels_copies(script, family):
    """From the entry of the model's own forward (as finecap's prompt pass calls it) to the tower's exit, the peak per
    patch on the CPU (bf16, ``--frozen``, differenced between 16 and 64 images) is forecast within 10 % by the frozen
    tower's count, what ``get_image_features`` makes of the pixels and holds while the tower runs
    (:func:`finecap.models.forecast.pixel_copy_bytes`: Idefics3's selected images in bf16 and their int64 pixel
    mask's copy; LLaVA-NeXT's float32 crops) and the prompt's embeddings. Without the pixels' copies the forecast
    comes to 0.83 (Idefics3) and 0.74 (LLaVA-NeXT) of it, and to 0.76 and 0.66 without the embeddings too."""
    row = script.frozen_row(family)
    assert 0.9 <= (row["forecast"] + row["copies"] + row["embeds"]) / row["entry"] <= 1.1, row


@pytest.mark.parametrize("family", ["gemma3", "qwen3_vl"])
def test_a_frozen_towers_peak_at_the_larger_image_count_is_forecast_within_two_percent(script, family):
    """The peak per patch at 64 images (``--frozen``'s larger count, not differenced) against the forecast at that
    count: SigLIP's (Gemma 3's) tower keeps its embeddings as the encoder's ``inputs_embeds`` while its second layer
    runs (``embeddings_kept``), which the differenced peak reads 1.09 of (the smaller count's peak holds a oneDNN
    scratch buffer the larger's does not) and the forecast without it came to 0.92 of; Qwen3-VL's position embedding
    (0.79 without it). Both measured at exactly the forecast on the AMD EPYC (docs/memory.md)."""
    row = script.frozen_row(family)
    assert 0.98 <= row["whole_forecast"] / row["whole"] <= 1.02, row


@pytest.mark.parametrize("family", ["idefics3", "smolvlm"])
def test_the_selected_images_copies_count_their_bool_patch_mask(script, family):
    """``--frozen``'s shapes are ``VisionShapes.of``'s, with an image's patches (16 x 16 pixels, patch 4: 16, as the
    layers see them), so that the *+ pixel copies* column of the families that select their real images counts the
    bool patch mask :func:`finecap.models.forecast.pixel_copy_bytes` holds with them: 48 more images of 768 float32
    pixel values, each a bf16 copy (1,536 B), the int64 pixel mask's copy (2,048 B) and 16 bools, over 768 more
    patches, is 225 B a patch (224 until 2026-11-28, when the shapes carried no patches and the mask was left out)."""
    row = script.frozen_row(family)
    assert row["patches"] == (16 * 16, 64 * 16)
    assert row["copies"] == 48 * (2 * 768 + 8 * 256 + 16) / 768 == 225
    assert row["shapes"].patches == 16
