"""A run started from another run's weights (``train.init_from``) trains what its configuration says, or is refused
in one line naming the option, the checkpoint's value and the configured one: never the checkpoint's model under a
``config.yaml`` that names another (which ``finecap caption`` of the new run would then load)."""

import json
import shutil

import pytest
import torch

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


RL = ["train.objective=reinforce", "rl.rewards={cider: 1.0}", "rl.samples=2", "train.batch_size=8"]
SHIFT = {"form": "token", "token_id": 2}  # SMILE's shift, recorded by the start's next save only


def test_a_start_saved_again_while_the_run_reads_it_is_read_as_one_save(make_cfg, monkeypatch):
    # a run started from a run still training read the start's captioner.json (check_backbone) outside the start's
    # swap guard and its 16-bit weights inside it, then its float32 master weights and, after the data, its
    # first-token shift outside it again: a save of the start in between gave the run step 9's masters and shift on
    # step 1's 16-bit weights; every read of the start is now one hold, and the save waits for it
    from safetensors.torch import load_file

    import finecap.train.run as run
    import finecap.train.setup as setup
    from finecap.models import memory
    from finecap.models.first_token import unshift_as
    from finecap.train.checkpoint import load_info, save_checkpoint
    from helpers.swaps import NextSave

    levers = ["model.dtype=bfloat16", "decode.max_length=8"]
    start = checkpoint_dir(train(make_cfg(*levers, "train.max_steps=1", "train.eval_every=0", run="first")), "last")
    masters = load_file(str(model_dir(start) / memory.MASTERS))  # the float32 values of the 16-bit run's weights
    assert masters and load_info(start)["step"] == 1
    cfg = make_cfg(*levers, *RL, f"train.init_from={start}", "train.max_steps=1", "train.eval_every=0", run="second")
    following = setup.build_model(cfg)  # the start's next save: every weight 1 more, shifted
    with torch.no_grad():
        for p in following.parameters():
            p.add_(1.0)
    unshift_as(following, SHIFT)

    def save_next() -> None:
        save_checkpoint(start, model=following, cfg=make_cfg(*levers, run="first"), info={"step": 9})

    built = []
    real_build = run.build_model

    def build(*args, **kwargs):
        model = real_build(*args, **kwargs)
        built.append({n: p.detach().clone() for n, p in model.named_parameters() if n in masters})
        return model

    with NextSave(save_next) as next_save:  # the start saved again once the run has loaded its 16-bit weights
        monkeypatch.setattr(setup, "check_loaded", next_save.after(setup.check_loaded))
        monkeypatch.setattr(run, "build_model", build)
        second = train(cfg)
    assert [sorted(b) for b in built] == [sorted(masters)]
    assert all(torch.equal(built[0][n], masters[n]) for n in masters)  # step 1's float32 masters, not step 9's
    meta = json.loads((model_dir(checkpoint_dir(second, "last")) / "captioner.json").read_text())
    assert "first_token_shift" not in meta  # step 1's weights shift nothing, so the run records no shift
    assert next_save.waited and load_info(start)["step"] == 9  # the save went through after the reads


def test_a_start_saved_again_after_the_run_read_it_is_fingerprinted_as_the_save_it_read(make_cfg, monkeypatch):
    # the run recorded its start's encoder (fingerprints.json's captioner) from the start's captioner.json read again
    # when it wrote its fingerprints, after the data, outside the hold its weights were read under: a save of the start
    # in between (here by its run resumed with model.train_encoder=true, so its next save holds the encoder) gave the
    # run the next save's "in-checkpoint" while it loads step 1's frozen encoder from outside; it is now the
    # captioner.json read with the weights
    import finecap.train.run as run
    import finecap.train.setup as setup
    from finecap.train.checkpoint import load_info, save_checkpoint
    from helpers.swaps import NextSave

    first = train(make_cfg("train.max_steps=1", "train.eval_every=0", run="first"))
    start = checkpoint_dir(first, "last")
    recorded = json.loads((first / "fingerprints.json").read_text())["captioner"]
    assert recorded["kind"] == "checkpoint"  # the frozen tiny encoder, loaded from outside the checkpoint
    cfg = make_cfg(f"train.init_from={start}", "train.max_steps=1", "train.eval_every=0", run="second")
    following = setup.build_model(cfg)  # the start's next save, its encoder trained and saved with it
    following.train_encoder = True

    def save_next() -> None:
        saved_cfg = make_cfg("model.train_encoder=true", run="first")
        save_checkpoint(start, model=following, cfg=saved_cfg, info={"step": 9})

    with NextSave(save_next) as next_save:
        monkeypatch.setattr(run, "build_model", next_save.after(run.build_model))  # saved once the weights are read
        second = train(cfg)
    meta = json.loads((model_dir(start) / "captioner.json").read_text())
    assert load_info(start)["step"] == 9 and meta["encoder_saved"]  # the save went through before the fingerprints
    assert json.loads((second / "fingerprints.json").read_text())["captioner"] == recorded
