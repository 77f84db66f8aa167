"""A run started from another run's weights (``train.init_from``) trains what its configuration says, or is refused
in one line naming the option, the checkpoint's value and the configured one: never the checkpoint's model under a
``config.yaml`` that names another (which ``finecap caption`` of the new run would then load)."""

import json
import shutil

import pytest

from finecap.runs import CheckpointError, checkpoint_dir, model_dir
from finecap.train.run import train


def test_init_from_with_another_frozen_encoder_is_refused_before_anything_is_made(make_cfg, tiny_encoder, tmp_path):
    # the captioner loaded from the checkpoint keeps the frozen encoder its captioner.json records (and the run
    # encoded its features with that one), while the new run's config.yaml named the other one
    start = checkpoint_dir(train(make_cfg("train.max_steps=1", "train.eval_every=0", run="first")), "last")
    other = shutil.copytree(tiny_encoder, tmp_path / "another-encoder")
    shown = f"model.encoder='{tiny_encoder}' in the checkpoint, '{other}' configured"
    with pytest.raises(CheckpointError, match="train.init_from was trained with other settings") as e:
        train(make_cfg(f"train.init_from={start}", f"model.encoder={other}", "train.max_steps=1", run="second"))
    assert shown in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "second").exists()
    # the checkpoint's own encoder, named by another path to the same folder, is the same encoder
    linked = tmp_path / "linked-encoder"
    linked.symlink_to(tiny_encoder)
    run = train(make_cfg(f"train.init_from={start}", f"model.encoder={linked}", "train.max_steps=1", run="third"))
    meta = json.loads((model_dir(checkpoint_dir(run, "last")) / "captioner.json").read_text())
    assert meta["encoder_source"] == str(tiny_encoder)


def test_model_encoder_world_is_the_world_encoder_of_the_configured_world(make_cfg, tiny_encoder):
    # model.encoder=world names the world encoder of this configuration's world (its cache folder), which is what a
    # checkpoint built on it records; another world's encoder, or a CLIP, is another encoder
    from finecap.models.backbones import encoder_difference
    from finecap.models.clipcap import ClipCap
    from finecap.models.world_encoder_cache import encoder_dir

    cfg = make_cfg("model.encoder=world")
    mine = encoder_dir(cfg)
    mine.mkdir(parents=True)
    other = encoder_dir(make_cfg("model.encoder=world", "run.seed=1"))
    other.mkdir(parents=True)
    assert encoder_difference(ClipCap, {"encoder_source": str(mine.resolve())}, cfg) == []
    for recorded in (str(other.resolve()), str(tiny_encoder)):
        assert encoder_difference(ClipCap, {"encoder_source": recorded}, cfg) == [("model.encoder", recorded, "world")]
    assert encoder_difference(ClipCap, {"encoder_source": str(mine)}, make_cfg()) == [
        ("model.encoder", str(mine), str(tiny_encoder))
    ]


WORLD_VLM = ["model.kind=vlm", "vlm.name=world-tiny", "vlm.tiny_layers=1", "vlm.tiny_hidden=32", "vlm.tiny_heads=2"]


def test_init_from_a_vlm_trains_the_configured_prompt_and_projector(make_cfg, clip_dir):
    # the VLM loaded from a checkpoint was rebuilt with the vlm section its captioner.json records: the new run's
    # vlm.prompt and vlm.train_projector went into its config.yaml while it trained the checkpoint's prompt and
    # projector setting (and saved those, so `finecap caption` of the new run read them)
    from finecap.train.setup import build_model

    common = [f"model.encoder={clip_dir}", *WORLD_VLM, "train.max_steps=1", "train.eval_every=0"]
    start = checkpoint_dir(train(make_cfg(*common, run="first")), "last")
    changed = ["vlm.prompt=Say what you see.", "vlm.train_projector=false"]
    cfg = make_cfg(*common, f"train.init_from={start}", *changed, run="second")
    model = build_model(cfg)
    assert "Say what you see." in model.prompt_text
    projector = [p for path in model.family.projectors for p in model.model.get_submodule(path).parameters()]
    assert projector and not any(p.requires_grad for p in projector)
    meta = json.loads((model_dir(checkpoint_dir(train(cfg), "last")) / "captioner.json").read_text())
    assert (meta["prompt"], meta["train_projector"]) == ("Say what you see.", False)
    # how many image tokens a prompt holds was set on the checkpoint's processor: it cannot change here
    with pytest.raises(CheckpointError, match="vlm.image_max_pixels=None in the checkpoint, 50176 configured"):
        build_model(make_cfg(*common, f"train.init_from={start}", "vlm.image_max_pixels=50176", run="third"))


NAMES = {  # the world model, and a pretrained one (only named: nothing is loaded)
    "blip": ("world-tiny", "Salesforce/blip-image-captioning-base"),
    "vlm": ("world-tiny", "HuggingFaceTB/SmolVLM-256M-Instruct"),
}


@pytest.mark.parametrize("kind", list(NAMES))
def test_the_world_blip_and_vlm_compare_their_encoder_and_a_pretrained_one_reads_none(make_cfg, tiny_encoder, tmp_path,
                                                                                     kind):  # fmt: skip
    # the world BLIP and VLM read model.encoder (their checkpoint's world_source); a pretrained one brings its own
    # vision tower, so model.encoder names nothing there
    from finecap.models.backbones import backbone, encoder_difference

    other = shutil.copytree(tiny_encoder, tmp_path / "another-encoder")
    world, pretrained = NAMES[kind]
    cls, meta = backbone(kind), {"world_source": str(other)}
    cfg = make_cfg(f"model.kind={kind}", f"{kind}.name={world}")
    assert encoder_difference(cls, meta, cfg) == [("model.encoder", str(other), str(tiny_encoder))]
    assert encoder_difference(cls, {"world_source": str(tiny_encoder)}, cfg) == []
    assert encoder_difference(cls, meta, make_cfg(f"model.kind={kind}", f"{kind}.name={pretrained}")) == []
