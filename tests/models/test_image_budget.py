"""``vlm.image_max_pixels`` (finecap.models.image_budget): one pixel budget mapped by each family's row to its own
processor's option; the VLM recipes give SmolVLM exactly the processor options they wrote before the budget existed;
a ``vlm.processor_kwargs`` key wins over the budget's; every family's own forward still agrees with finecap's prompt
pass on the budget's inputs."""

from __future__ import annotations

import warnings

import pytest
import torch
from PIL import Image

from finecap.config import VlmBackboneConfig, load
from finecap.models.vlm import FAMILIES, Vlm, processor_options
from helpers.vlm_families import tiny_family

IMAGE = Image.fromarray((torch.rand(48, 64, 3, generator=torch.Generator().manual_seed(0)) * 255).byte().numpy())
FIXED = {"gemma3", "llava"}
"""Families whose tiny processor resizes every image to one size (the budget has no option to map to)."""

SMOLVLM = {"HuggingFaceTB/SmolVLM-256M-Instruct": (2048, 512), "HuggingFaceTB/SmolVLM-Instruct": (1536, 384)}
"""SmolVLM checkpoints' ``size.longest_edge`` and ``max_image_size.longest_edge`` (their preprocessor_config.json)."""


def splitting_like(processor, longest: int, crop: int):
    """``processor`` (an Idefics3 / SmolVLM processor) with a checkpoint's splitting settings."""
    ip = processor.image_processor
    ip.do_image_splitting, ip.size, ip.max_image_size = True, {"longest_edge": longest}, {"longest_edge": crop}
    return processor


@pytest.mark.parametrize("checkpoint", sorted(SMOLVLM))
def test_vlm_recipes_give_smolvlm_the_processor_options_they_wrote_before(checkpoint):
    """The RL and SR recipes said ``processor_kwargs: {do_image_splitting: false}``; their ``image_max_pixels``
    (512 x 512) maps to exactly that for SmolVLM's settings, and a recipe without a budget to nothing (since issue 65
    every ``coco/*_vlm`` recipe sets the budget: tests/config/test_vlm_recipe_sizing.py)."""
    processor = splitting_like(tiny_family("idefics3")[1], *SMOLVLM[checkpoint])
    for recipe in ("mle_vlm", "smile_vlm", "discritune_vlm", "sr_l_vlm", "sr_lv_bagcurri_vlm", "grpo_cider_vlm",
                   "grpo_sr_cider_vlm"):  # fmt: skip
        section = load(f"coco/{recipe}").vlm
        before = {"do_image_splitting": False} if section.image_max_pixels else {}
        assert processor_options(FAMILIES["idefics3"], processor, section) == before, recipe
        assert section.processor_kwargs == {}, recipe


def pixels_seen(model: Vlm) -> tuple[int, torch.Tensor]:
    """The pixel inputs' size for :data:`IMAGE` and finecap's first-token logits ``(V,)``, each checked against the
    model's own forward on the processor's output with the captioner's options (1e-5 relative): transformers'
    ``apply_chat_template(tokenize=True)`` of the prompt (one BOS where the template writes it)."""
    batch = model.encoder.preprocess([IMAGE])
    messages = [{"role": "user", "content": [{"type": "image", "image": IMAGE},
                                             {"type": "text", "text": model.section.prompt}]}]  # fmt: skip
    options = dict(model.processor_kwargs)
    enc = model.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                              return_tensors="pt", processor_kwargs=options)  # fmt: skip
    assert torch.equal(enc["input_ids"], batch["prompt_ids"])
    with torch.no_grad():
        reference = model.model(**enc).logits[0, -1]
        first, _ = model.start(model.prompt_of(batch))
    assert float((first[0] - reference).abs().max() / reference.abs().max()) < 1e-5
    return batch["pixel_values"].numel(), first[0]


@pytest.mark.parametrize("family", sorted(FAMILIES), ids=[f"budget-{f}" for f in sorted(FAMILIES)])
def test_a_budget_maps_to_each_familys_own_option(family):
    """A budget under the processor's own setting shrinks what the vision tower sees (the family's rule: Qwen's
    pixels, SmolVLM's crops, LLaVA-NeXT's grids, InternVL's tiles, Pixtral's edge, ...) and the model's own forward
    reads it as finecap does; a processor of one fixed size is left as it is, with a warning naming the size."""
    model, processor = tiny_family(family)
    if family in ("idefics3", "smolvlm"):  # the tiny processors make one 16 px crop: split like SmolVLM does
        processor = splitting_like(processor, 64, 16)
    if family == "idefics2":  # split like idefics2-8b: the budget turns it off, and its processor writes an image's
        processor.image_processor.do_image_splitting = True  # tokens by its image processor's setting (5x when on)
    plain = Vlm(model, processor, source=family).eval()
    size, logits = pixels_seen(plain)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        small = Vlm(model, processor, VlmBackboneConfig(image_max_pixels=100), source=family).eval()
    budget_size, budget_logits = pixels_seen(small)
    named = [w for w in caught if "vlm.image_max_pixels=100" in str(w.message)]
    if family in FIXED:
        assert small.processor_kwargs == plain.processor_kwargs and budget_size == size
        assert named and "16x16" in str(named[0].message)
    else:
        assert budget_size < size, (small.processor_kwargs, budget_size, size)
        assert not named
        assert not torch.allclose(budget_logits, logits)  # the image tokens the language model reads changed


def test_processor_kwargs_win_over_the_budget_key_by_key():
    model, processor = tiny_family("internvl")
    section = VlmBackboneConfig(image_max_pixels=300, processor_kwargs={"max_patches": 2})
    # the budget's one tile is max_patches = min_patches = 1: the user's max_patches wins, its min_patches stays
    assert processor_options(FAMILIES["internvl"], processor, section) == {"max_patches": 2, "min_patches": 1}
    section = VlmBackboneConfig(image_max_pixels=300, processor_kwargs={"crop_to_patches": True, "max_patches": 2})
    assert processor_options(FAMILIES["internvl"], processor, section) == {"crop_to_patches": True, "max_patches": 2,
                                                                           "min_patches": 1}  # fmt: skip


@pytest.mark.parametrize("budget", [300, 600], ids=["one-tile", "two-tiles"])
def test_a_saved_internvl_reads_images_into_the_runs_tokens_on_a_plain_load(budget, tmp_path):
    """The checkpoint's processor, loaded by transformers alone (``AutoProcessor.from_pretrained``: finecap's
    ``load_processor`` builds the same class), reads an image into as many image tokens as the run did: InternVL's
    one tile is ``max_patches = min_patches = 1`` on the image processor, which a plain load keeps
    (``crop_to_patches=False`` it did not: the processor class's call default ``crop_to_patches=True`` wins)."""
    from finecap.models.image_budget import unsaved_options
    from finecap.models.processors import load_processor

    model, processor = tiny_family("internvl")
    vlm = Vlm(model, processor, VlmBackboneConfig(image_max_pixels=budget), source="tiny-internvl")
    assert unsaved_options(processor, vlm.processor_kwargs) == {}
    wide = Image.fromarray((torch.rand(16, 40, 3, generator=torch.Generator().manual_seed(0)) * 255).byte().numpy())
    run = int((vlm.encoder.preprocess([wide])["prompt_ids"] == vlm.image_token_id).sum())
    plain = load_processor(vlm.save(tmp_path / "ckpt"))
    enc = plain(text=[vlm.prompt_text], images=[[wide]], return_tensors="pt")
    assert int((enc["input_ids"] == vlm.image_token_id).sum()) == run
    full = processor(text=[vlm.prompt_text], images=[[wide]], return_tensors="pt")["input_ids"]
    everything = int((full == vlm.image_token_id).sum())
    assert run < everything  # the budget did cut the tiles


def test_an_option_a_saved_processor_cannot_carry_is_named_when_saving(tmp_path):
    """Gemma 3's ``do_pan_and_scan`` is a call default of its processor class (``False``), which a plain load passes
    over any image-processor setting: saving warns, naming the option; finecap's own load passes it again."""
    from finecap.models.backbones import load_captioner

    kw = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 4, "pan_and_scan_max_num_crops": 3}
    model, processor = tiny_family("gemma3")
    vlm = Vlm(model, processor, VlmBackboneConfig(processor_kwargs=kw), source="tiny-gemma3")
    with pytest.warns(UserWarning, match=r"vlm.processor_kwargs: do_pan_and_scan=True.*Gemma3Processor.*plain "
                                         r"AutoProcessor.from_pretrained"):  # fmt: skip
        out = vlm.save(tmp_path / "ckpt")
    wide = Image.fromarray((torch.rand(16, 48, 3, generator=torch.Generator().manual_seed(0)) * 255).byte().numpy())
    back = load_captioner(out)
    assert torch.equal(back.encoder.preprocess([wide])["prompt_ids"], vlm.encoder.preprocess([wide])["prompt_ids"])


def test_crops_count_the_global_image():
    """SmolVLM's rule: n x n crops of ``max_image_size`` plus the global image fit the budget."""
    processor = splitting_like(tiny_family("idefics3")[1], 2048, 512)
    crop = 512 * 512

    def options(budget: int) -> dict:
        return processor_options(FAMILIES["idefics3"], processor, VlmBackboneConfig(image_max_pixels=budget))

    assert options(5 * crop - 1) == {"do_image_splitting": False}  # 2 x 2 + 1 does not fit
    assert options(5 * crop) == {"size": {"longest_edge": 1024}}
    assert options(10 * crop) == {"size": {"longest_edge": 1536}}  # 3 x 3 + 1
    assert options(17 * crop) == {}  # 4 x 4 + 1: the checkpoint's own 2048


def test_the_budget_is_recorded_and_bounded(tmp_path):
    from finecap.config import ConfigError

    model, processor = tiny_family("qwen2_5_vl")
    vlm = Vlm(model, processor, VlmBackboneConfig(image_max_pixels=300), source="tiny")
    assert vlm.own_config()["image_max_pixels"] == 300
    with pytest.raises(ConfigError, match="vlm.image_max_pixels"):
        load(None, ["vlm.image_max_pixels=0"])


CONTRADICTIONS = {
    "qwen2_5_vl": ({"min_pixels": 2048}, "vlm.processor_kwargs.min_pixels=2048 is over vlm.image_max_pixels=256 "
                   r"\(size.longest_edge=256\)"),
    "qwen3_vl": ({"size": {"shortest_edge": 2048}}, r"vlm.processor_kwargs.size.shortest_edge=2048 is over "
                 r"vlm.image_max_pixels=256 \(size.longest_edge=256\)"),
    "glm4v": ({"size": {"shortest_edge": 1024}}, r"vlm.processor_kwargs.size.shortest_edge=1024 is over "
              r"vlm.image_max_pixels=256 \(size.longest_edge=512\)"),  # GLM-4V's bound counts 2 frames
    "idefics2": ({"size": {"shortest_edge": 16}}, r"vlm.processor_kwargs.size.shortest_edge=16 is over "
                 r"vlm.image_max_pixels=144 \(size.longest_edge=12\)"),
    "internvl": ({"min_patches": 4}, r"vlm.processor_kwargs.min_patches=4 is over vlm.image_max_pixels=1024 "
                 r"\(max_patches=3\)"),
}  # fmt: skip
"""Per family whose budget rule sets an upper bound with a lower one beside it: a ``vlm.processor_kwargs`` lower
bound over the bound ``vlm.image_max_pixels`` maps to, and the error naming both."""
BUDGETS = {"idefics2": 144, "internvl": 1024}


@pytest.mark.parametrize("family", sorted(CONTRADICTIONS), ids=[f"bounds-{f}" for f in sorted(CONTRADICTIONS)])
def test_a_lower_bound_over_the_budgets_upper_one_is_refused_naming_both(family):
    """Qwen applies its cap and ignores a minimum above it (``size: {longest_edge: 256, shortest_edge: 2048}``),
    Idefics2 applies the minimum over the cap, InternVL takes one tile: finecap refuses such limits when the processor
    options are made (before any weight is read on a load), naming both options; a lower bound under the cap passes
    and is passed on."""
    model, processor = tiny_family(family)
    budget = BUDGETS.get(family, 256)
    given, message = CONTRADICTIONS[family]
    with pytest.raises(ValueError, match=f"^{message}: a lower bound over the upper one"):
        Vlm(model, processor, VlmBackboneConfig(image_max_pixels=budget, processor_kwargs=given), source=family)
    key, value = next(iter(given.items()))
    low = {k: 1 for k in value} if isinstance(value, dict) else 1
    vlm = Vlm(model, processor, VlmBackboneConfig(image_max_pixels=budget, processor_kwargs={key: low}), source=family)
    if family.startswith("qwen") or family == "glm4v":
        assert vlm.processor_kwargs["size"]["shortest_edge"] == 1  # the budget's cap kept beside the user's minimum
        assert vlm.processor_kwargs["size"]["longest_edge"] == budget * (2 if family == "glm4v" else 1)
