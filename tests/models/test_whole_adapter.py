"""Adapters other tools load: a LoRA run on BLIP or a VLM also saves one standard peft adapter for the whole
transformers model (``adapter/``), which ``PeftModel.from_pretrained`` puts on the *original* base model to give
finecap's captions, and ``finecap.models.export.export_merged`` writes a plain merged folder that transformers loads
alone."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from peft import PeftModel
from PIL import Image
from transformers import AutoModelForImageTextToText, BlipForConditionalGeneration

from finecap.config import DecodeConfig
from finecap.config.sections.backbones import VlmBackboneConfig
from finecap.models import lora
from finecap.models.base import module_path
from finecap.models.blip import Blip
from finecap.models.export import export_merged
from finecap.models.presets import VLM_FAMILIES, save_tiny_blip, save_tiny_vlm
from finecap.models.vlm import Vlm
from helpers.adapters import adapted

GREEDY = DecodeConfig(strategy="greedy", max_length=8)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bases")
    out = {"blip": save_tiny_blip(root / "blip", image_size=32, layers=1, vision_layers=1)}
    for family in VLM_FAMILIES:
        out[family] = save_tiny_vlm(root / family, family, std=0.2)
    return out


def images(n: int, size: int = 16) -> list[Image.Image]:
    g = torch.Generator().manual_seed(0)
    return [Image.fromarray((torch.rand(size, size, 3, generator=g) * 255).byte().numpy()) for _ in range(n)]


def vlm_inputs(model: Vlm, n: int) -> dict:
    ims = [[im] for im in images(n)]
    return dict(model.processor(text=[model.prompt_text] * n, images=ims, padding=True, return_tensors="pt"))


def new_tokens(out: torch.Tensor, start: int) -> list[list[int]]:
    return [row.tolist() for row in out[:, start:]]


def assert_same_greedy(ours, theirs: list[list[int]], pad: int, eos: int) -> None:
    for row, seq in enumerate(theirs):
        n = int(ours.lengths[row])
        assert ours.sequences[row, :n].tolist() == seq[:n]
        assert all(t in (pad, eos) for t in seq[n:])


@pytest.mark.parametrize("family", VLM_FAMILIES)
def test_vlm_whole_model_adapter_on_the_original_base_gives_finecaps_captions(dirs, family, tmp_path):
    model = Vlm.from_pretrained(dirs[family])
    model = adapted(model, module_path(model.model, model.family.projector))
    inputs = vlm_inputs(model, 4)
    ours = model.generate(
        inputs | {"prompt_ids": inputs["input_ids"], "prompt_mask": inputs["attention_mask"]}, GREEDY
    )
    out = model.save(tmp_path / "ckpt")
    meta = json.loads((out / "captioner.json").read_text())
    assert meta["adapter"] == "adapter"
    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert config["modules_to_save"] == [model.family.projector]
    base = AutoModelForImageTextToText.from_pretrained(dirs[family])
    start = inputs["input_ids"].shape[1]
    plain = new_tokens(base.generate(**inputs, max_new_tokens=8, do_sample=False), start)
    theirs_model = PeftModel.from_pretrained(base, str(out / "adapter")).eval()
    theirs = new_tokens(theirs_model.generate(**inputs, max_new_tokens=8, do_sample=False), start)
    assert theirs != plain  # the adapter changes the captions: it was applied
    assert_same_greedy(ours, theirs, model.pad_token_id, model.eos_token_id)
    # the merged export is a plain transformers folder giving the same captions without peft
    merged = AutoModelForImageTextToText.from_pretrained(export_merged(out, tmp_path / "merged")).eval()
    assert_same_greedy(ours, new_tokens(merged.generate(**inputs, max_new_tokens=8, do_sample=False), start),
                       model.pad_token_id, model.eos_token_id)  # fmt: skip


def test_blip_whole_model_adapter_on_the_original_base_gives_finecaps_captions(dirs, tmp_path):
    model = adapted(Blip.from_pretrained(dirs["blip"]))
    pv = model.encoder.preprocess(images(4, 32))
    ours = model.generate({"pixel_values": pv}, GREEDY)
    out = model.save(tmp_path / "ckpt")
    base = BlipForConditionalGeneration.from_pretrained(dirs["blip"])
    plain = [s[1:] for s in base.generate(pixel_values=pv, max_new_tokens=8, do_sample=False).tolist()]
    theirs_model = PeftModel.from_pretrained(base, str(out / "adapter")).eval()
    theirs = [s[1:] for s in theirs_model.generate(pixel_values=pv, max_new_tokens=8, do_sample=False).tolist()]
    assert theirs != plain
    assert_same_greedy(ours, theirs, model.pad_token_id, model.eos_token_id)  # generate's first token is [bos]


def test_no_whole_model_adapter_when_one_would_not_reproduce_the_captioner(dirs, tmp_path):
    """A part trained fully (no adapters) changes base weights an adapter does not carry: no ``adapter/`` then."""
    model = Vlm.from_pretrained(dirs["llava"], train_encoder=True)
    lora.apply_lora(model, "lm", lora.LoraSpec(rank=4, alpha=8.0))
    out = model.save(tmp_path / "ckpt")
    assert "adapter" not in json.loads((out / "captioner.json").read_text())
    assert not (out / "adapter").exists() and (out / "lm_lora").is_dir()


def test_a_stage_started_from_a_checkpoint_writes_an_adapter_only_while_its_base_is_the_sources(dirs, tmp_path):
    """An earlier stage's adapters merged into the base (new LoRA settings: ``configure_training``), or its projector
    trained fully, are base weights an adapter on the *source* does not carry: ``adapter/`` was written anyway, naming
    the source, and lost the earlier stage (coco/sr_l_vlm starts from mle_vlm with another alpha)."""
    first = adapted(Vlm.from_pretrained(dirs["llava"]))
    stage1 = first.save(tmp_path / "stage1")
    kept = Vlm.from_checkpoint(stage1)  # the same adapters go on (a resumed or continued LoRA run)
    assert (kept.save(tmp_path / "kept") / "adapter").is_dir()
    merged = Vlm.from_checkpoint(stage1)
    lora.merge_part(merged, "lm")  # what configure_training does with other settings, before new adapters
    lora.apply_lora(merged, "lm", lora.LoraSpec(rank=4, alpha=4.0))
    out = merged.save(tmp_path / "stage2")
    meta = json.loads((out / "captioner.json").read_text())
    assert "adapter" not in meta and meta["base_changed"] is True and not (out / "adapter").exists()
    assert (Vlm.from_checkpoint(out).save(tmp_path / "stage3") / "lm_lora").is_dir()  # and the stage after it
    assert not (tmp_path / "stage3" / "adapter").exists()
    # a start whose projector an earlier stage trained fully: an adapter now must carry it again
    trains_projector = Vlm.from_pretrained(dirs["llava"], section=VlmBackboneConfig(train_projector=True))
    with_projector = adapted(trains_projector, module_path(trains_projector.model, first.family.projector))
    stage1p = with_projector.save(tmp_path / "stage1p")
    assert json.loads((stage1p / "captioner.json").read_text())["adapter_modules"] == [first.family.projector]
    assert (Vlm.from_checkpoint(stage1p).save(tmp_path / "stage2p") / "adapter").is_dir()  # it still trains
    frozen = Vlm.from_checkpoint(stage1p)
    frozen.section = dataclasses.replace(frozen.section, train_projector=False)  # a next stage freezing it
    assert not (frozen.save(tmp_path / "stage3p") / "adapter").exists()


def test_a_saved_vlm_keeps_the_runs_image_budget_for_a_plain_transformers_load(dirs, tmp_path):
    """vlm.image_max_pixels / vlm.processor_kwargs are call arguments finecap passes; the folder's processor was saved
    without them, so AutoProcessor on an export or a checkpoint read images into other (more) tokens than the run."""
    from finecap.models.vlm import load_processor

    model = Vlm.from_pretrained(dirs["qwen2_vl"], section=VlmBackboneConfig(image_max_pixels=64))
    image = [[Image.new("RGB", (64, 48), (200, 10, 10))]]
    run = model.processor(text=[model.prompt_text], images=image, return_tensors="pt", **model.processor_kwargs)
    plain = load_processor(str(model.save(tmp_path / "ckpt")))(text=[model.prompt_text], images=image,
                                                                 return_tensors="pt")  # fmt: skip
    assert plain["input_ids"].tolist() == run["input_ids"].tolist()
    again = model.processor(text=[model.prompt_text], images=image, return_tensors="pt", **model.processor_kwargs)
    assert again["input_ids"].tolist() == run["input_ids"].tolist()  # the in-memory processor is as it was


def test_a_saved_qwen2_vl_keeps_its_video_processor_settings_for_autoprocessor(dirs, tmp_path):
    """Without torchvision finecap builds Qwen2-VL's processor without its video processor, and its checkpoints and
    merged exports were saved without the video processor's settings: ``AutoProcessor.from_pretrained`` then refused
    them on every machine ("Can't load video processor", raised while reading the folder, before torchvision is
    needed), vLLM serving the export included. Found by loading a tiny run's export with transformers alone."""
    import shutil

    from transformers.video_processing_utils import BaseVideoProcessor

    from finecap.models.processors import load_processor

    def video(folder):
        return BaseVideoProcessor.get_video_processor_dict(str(folder))[0]

    source = shutil.copytree(dirs["qwen2_vl"], tmp_path / "source")
    planted = {"video_processor_type": "Qwen2VLVideoProcessor", "fps": 2.0, "temporal_patch_size": 2}
    config = json.loads((source / "processor_config.json").read_text())  # a Hub checkpoint's, as transformers 5 saves
    (source / "processor_config.json").write_text(json.dumps(config | {"video_processor": planted}))
    saved = Vlm.from_pretrained(source).save(tmp_path / "ckpt")
    export = export_merged(saved, tmp_path / "merged")
    for folder in (saved, export):  # the source's settings, through the checkpoint into its export
        assert {k: video(folder).get(k) for k in planted} == planted, folder
    # a source holding none (the tiny folders): the image processor's, as transformers reads a video processor from
    # a folder holding only the image processor's file
    plain = Vlm.from_pretrained(dirs["qwen2_vl"]).save(tmp_path / "plain")
    image = json.loads((plain / "processor_config.json").read_text())["image_processor"]
    assert video(plain) == image
    image_in = [[Image.new("RGB", (32, 24), (10, 200, 10))]]
    ours, again = Vlm.from_pretrained(dirs["qwen2_vl"]), load_processor(plain)  # the saved folder still loads here
    call = {"text": [ours.prompt_text], "images": image_in, "return_tensors": "pt"}
    assert again(**call)["input_ids"].tolist() == ours.processor(**call)["input_ids"].tolist()


@pytest.mark.parametrize("family", ["blip", *VLM_FAMILIES])
def test_the_whole_adapter_names_a_base_read_from_a_relative_folder_by_its_absolute_path(dirs, family, tmp_path,
                                                                                      monkeypatch):  # fmt: skip
    """``vlm.name=models/vlm`` (``blip.name``) given where that folder exists: ``adapter/adapter_config.json`` said
    ``base_model_name_or_path: models/vlm`` (and the card its base model so), which from any other working directory
    peft and transformers look up as a Hub repository: ``AutoModelForImageTextToText.from_pretrained("adapter")``
    there failed offline (or would load another model). Found exporting a tiny VLM run trained on a relative
    ``vlm.name`` and loading its adapter from another folder."""
    monkeypatch.chdir(dirs[family].parent)
    if family == "blip":
        model, auto = adapted(Blip.from_pretrained(family)), BlipForConditionalGeneration
        inputs = {"pixel_values": model.encoder.preprocess(images(2, 32))}
        ours, start = model.generate(inputs, GREEDY), 1  # generate's first token is [bos]
    else:
        model = Vlm.from_pretrained(family)
        model, auto = adapted(model, module_path(model.model, model.family.projector)), AutoModelForImageTextToText
        inputs = vlm_inputs(model, 2)
        ours = model.generate(inputs | {"prompt_ids": inputs["input_ids"], "prompt_mask": inputs["attention_mask"]},
                              GREEDY)  # fmt: skip
        start = inputs["input_ids"].shape[1]
    out = model.save(tmp_path / "ckpt")
    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(dirs[family].resolve())
    assert json.loads((out / "captioner.json").read_text())["source"] == str(dirs[family].resolve())
    # the per-part adapters adapt a part inside the model (its language model, its vision tower), which no folder
    # holds alone: they name no base (the source would have peft load that part's class from the whole model's
    # folder, every weight fresh); the whole model's adapter is the one other tools load (docs/caption.md)
    for part in ("lm_lora", "encoder_lora"):
        assert json.loads((out / part / "adapter_config.json").read_text())["base_model_name_or_path"] is None
    monkeypatch.chdir(tmp_path)  # another working directory: the base is found by the adapter's record alone
    loaded = auto.from_pretrained(out / "adapter").eval()  # transformers reads base_model_name_or_path
    with torch.no_grad():
        theirs = new_tokens(loaded.generate(**inputs, max_new_tokens=8, do_sample=False), start)
    assert_same_greedy(ours, theirs, model.pad_token_id, model.eos_token_id)
