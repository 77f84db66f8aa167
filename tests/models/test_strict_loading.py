"""Issue 48, class 4: weights that are not what they claim. Every load of a captioner checkpoint is strict
(:mod:`finecap.models.strict`): a weight file with a tensor removed, one added, one of another shape or kind, or
NaN / infinity in one tensor is refused with one line naming the file and the tensor, by ``finecap caption``,
``finecap export`` (which writes nothing) and ``finecap.Captioner.from_pretrained``, for ClipCap (language model,
mapper, LoRA adapters), a VLM (model, adapters) and BLIP. A tampered ``adapter_config.json`` (fewer target modules,
alpha infinite, NaN or huge, a rank, ``layer_replication``, DoRA), a ``captioner.json`` recording a non-finite alpha,
and adapters found outside the checkpoint folder (an absolute path, ``..``, a link) are refused the same way; so is
``train.init_from`` of another backbone's checkpoint, or of one with other mapper settings, naming both.

The checkpoints are tiny (a 1-layer GPT-2 over a random tiny CLIP, a tiny LLaVA, a tiny BLIP), saved once per module
by the checkpoint writer; each test tampers with a copy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from finecap import Captioner
from finecap.config import ClipCapBackboneConfig, load
from finecap.models import lora, memory
from finecap.models.backbones import load_captioner
from finecap.models.blip import Blip
from finecap.models.clipcap import ClipCap
from finecap.models.presets import VLM_FAMILIES, build_world_lm, save_tiny_blip, save_tiny_clip, save_tiny_vlm
from finecap.models.vision import VisionEncoder
from finecap.models.vlm import Vlm
from finecap.runs import CheckpointError, model_dir
from finecap.train.checkpoint import save_checkpoint
from finecap.train.setup import build_model
from helpers.cli import refused, run_cli

INFO = {"step": 1, "epoch": 0, "total_steps": 1, "metric": "loss", "values": {"loss": 1.0}}
PLANTED = "finecap_planted.weight"


def randomise_adapters(model) -> None:
    """Non-zero LoRA B factors, so that adapters change the captioner (a lost adapter would show)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """The pristine checkpoints (``clipcap``, ``vlm``: LoRA on the language model; ``blip``: plain), an image to
    caption (``image``) and the tiny CLIP (``clip``)."""
    root = tmp_path_factory.mktemp("strict")
    clip = save_tiny_clip(root / "clip", image_size=16, patch_size=8)
    (root / "images").mkdir()
    Image.new("RGB", (16, 16), (200, 30, 30)).save(root / "images" / "red.png")
    common = ["lora.rank=4", "lora.alpha=8", "decode.max_length=3", "decode.batch_size=4"]

    torch.manual_seed(0)
    cfg = load(None, [f"model.encoder={clip}", "clipcap.prefix_length=2", "lora.lm=true", *common])
    lm, tok = build_world_lm(layers=1, hidden=32, heads=2)
    encoder = VisionEncoder.from_pretrained(clip)
    model = ClipCap(lm, tok, encoder.feature_dim, ClipCapBackboneConfig(prefix_length=2), encoder=encoder,
                    encoder_source=encoder.source)  # fmt: skip
    lora.configure_training(model, cfg)
    randomise_adapters(model)
    save_checkpoint(root / "clipcap", model=model.eval(), cfg=cfg, info=INFO)

    vlm_base = save_tiny_vlm(root / "vlm_base", "llava", std=0.2)
    cfg = load(None, ["model.kind=vlm", f"vlm.name={vlm_base}", "lora.lm=true", *common])
    model = Vlm.from_pretrained(vlm_base, section=cfg.vlm)
    lora.configure_training(model, cfg)
    randomise_adapters(model)
    save_checkpoint(root / "vlm", model=model.eval(), cfg=cfg, info=INFO)

    blip_base = save_tiny_blip(root / "blip_base", image_size=32, layers=1, vision_layers=1)
    cfg = load(None, ["model.kind=blip", f"blip.name={blip_base}", *common])
    save_checkpoint(root / "blip", model=Blip.from_pretrained(blip_base).eval(), cfg=cfg, info=INFO)
    return {"clipcap": root / "clipcap", "vlm": root / "vlm", "blip": root / "blip", "clip": clip,
            "image": root / "images" / "red.png"}  # fmt: skip


def copy_of(made: dict[str, Path], backbone: str, tmp_path: Path) -> Path:
    """A copy of a pristine checkpoint to tamper with: ``tmp_path/<backbone>``."""
    return Path(shutil.copytree(made[backbone], tmp_path / backbone))


def refusal_everywhere(checkpoint: Path, made: dict[str, Path], tmp_path: Path, *expected: str) -> str:
    """``finecap caption`` and ``finecap export`` of ``checkpoint`` each end in one error line holding every
    ``expected`` text, writing nothing; ``Captioner.from_pretrained`` raises a CheckpointError with the same
    message. Returns the message."""
    captions = tmp_path / "captions.json"
    line = refused(["caption", "--checkpoint", str(checkpoint), "--images", str(made["image"]), "--out",
                           str(captions)])  # fmt: skip
    assert not captions.exists()
    exported = tmp_path / "exported"
    assert refused(["export", str(checkpoint), "--merged", str(exported)]) == line
    assert not exported.exists() and not any(p.name.startswith(".exported") for p in tmp_path.iterdir())
    with pytest.raises(CheckpointError) as e:
        Captioner.from_pretrained(checkpoint, device="cpu")
    message = line.removeprefix("finecap: error: ")
    assert str(e.value) == message
    for text in expected:
        assert text in message, (text, message)
    return message


@pytest.mark.slow
def test_pristine_checkpoints_load_and_caption(made, tmp_path):
    """The fixtures are sound: each checkpoint captions through the command and the API, and exports; a tied head
    (the world GPT-2's, tied to its embeddings and not saved) is not a missing tensor."""
    for backbone in ("clipcap", "vlm", "blip"):
        out = tmp_path / f"{backbone}.json"
        code, _, err = run_cli(["caption", "--checkpoint", str(made[backbone]), "--images", str(made["image"]),
                             "--out", str(out)])  # fmt: skip
        assert code == 0 and out.exists(), err
        assert len(Captioner.from_pretrained(made[backbone], device="cpu").caption(made["image"])) == 1
        code, _, err = run_cli(["export", str(made[backbone]), "--merged", str(tmp_path / f"{backbone}-merged")])
        assert code == 0, err
    lm = load_captioner(model_dir(made["clipcap"])).lm.get_base_model()
    assert lm.config.tie_word_embeddings and lm.lm_head.weight is lm.transformer.wte.weight
    with safe_open(str(model_dir(made["clipcap"]) / "lm" / "model.safetensors"), framework="pt") as f:
        assert "lm_head.weight" not in f.keys()  # noqa: SIM118


@pytest.mark.parametrize("family", VLM_FAMILIES)
def test_every_vlm_family_saves_and_loads_strictly(family, tmp_path):
    """Each VLM family's own ties and renamings (transformers stores LLaVA's head as ``language_model.lm_head``)
    load as an exact fit: nothing missing or unexpected, the same outputs."""
    model = Vlm.from_pretrained(save_tiny_vlm(tmp_path / "base", family, std=0.2)).eval()
    again = load_captioner(model.save(tmp_path / "ckpt")).eval()
    for (name, mine), (_, theirs) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(mine, theirs), name


# --------------------------------------------------------------------------------------------------------------------
# Weight files
# --------------------------------------------------------------------------------------------------------------------

WEIGHT_FILES = [
    ("clipcap", "lm/model.safetensors"),
    ("clipcap", "mapper.safetensors"),
    ("clipcap", "lm_lora/adapter_model.safetensors"),
    ("vlm", "model.safetensors"),
    ("vlm", "lm_lora/adapter_model.safetensors"),
    ("blip", "model.safetensors"),
]
VARIANTS = {
    "missing": "missing: ",
    "unexpected": f"unexpected: {PLANTED}",
    "shape": "of another shape: ",
    "integer": "of another kind: ",
    "nan": "non-finite values",
    "inf": "non-finite values",
}
"""How each tampering is named in the error."""


def tamper_tensor(file: Path, variant: str) -> str:
    """Tamper with one tensor of the safetensors ``file`` (the first 2-D one by name): remove it, plant another,
    grow it by a row, store it as integers, put one NaN or infinity in it. Returns the tensor's name."""
    with safe_open(str(file), framework="pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(file))
    name = min(k for k, t in tensors.items() if t.ndim == 2)
    tensor = tensors[name].clone()
    if variant == "missing":
        del tensors[name]
    elif variant == "unexpected":
        tensors[PLANTED] = torch.zeros(3)
    elif variant == "shape":
        tensors[name] = torch.cat([tensor, tensor[:1]])
    elif variant == "integer":
        tensors[name] = (tensor * 100).to(torch.int32)
    else:
        tensor[0, 0] = float("nan") if variant == "nan" else float("inf")
        tensors[name] = tensor
    save_file(tensors, str(file), metadata=metadata)
    return name


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize(("backbone", "file"), WEIGHT_FILES, ids=[f"{b}-{f.split('/')[0]}" for b, f in WEIGHT_FILES])
def test_tampered_weights_are_refused_naming_the_file_and_tensor(made, tmp_path, backbone, file, variant):
    checkpoint = copy_of(made, backbone, tmp_path)
    name = tamper_tensor(checkpoint / "model" / file, variant)
    shown = PLANTED if variant == "unexpected" else ".".join(name.split(".")[-2:])  # transformers may rename a prefix
    refusal_everywhere(checkpoint, made, tmp_path, f"model/{file}: ", VARIANTS[variant], shown)


PICKLED_IN_PLACE = [("clipcap", "lm"), ("vlm", ""), ("blip", "")]
"""The ``save_pretrained`` folders of each checkpoint (under ``model/``) whose weights are swapped for a pickle."""


@pytest.mark.parametrize(("backbone", "folder"), PICKLED_IN_PLACE, ids=[b for b, _ in PICKLED_IN_PLACE])
def test_a_pickled_weights_file_in_place_of_safetensors_is_never_unpickled(made, tmp_path, monkeypatch, backbone,
                                                                           folder):  # fmt: skip
    """The same tensors as a ``pytorch_model.bin`` (a pickle that only holds tensors, which torch's
    ``weights_only=True`` unpickler accepts): transformers loaded it and the checkpoint captioned; the load is refused,
    naming the file, and torch never unpickles anything."""
    checkpoint = copy_of(made, backbone, tmp_path)
    weights = checkpoint / "model" / folder / "model.safetensors"
    torch.save(load_file(str(weights)), weights.with_name("pytorch_model.bin"))
    weights.unlink()
    unpickled: list[str] = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda f, *a, **k: unpickled.append(str(f)) or real_load(f, *a, **k))
    named = Path("model", folder, "pytorch_model.bin").as_posix()
    refusal_everywhere(checkpoint, made, tmp_path, f"{named}: ", "never unpickles")
    assert unpickled == []


@pytest.mark.parametrize("where", ["parent", "absolute"])
def test_a_weights_index_naming_a_shard_outside_the_checkpoint_is_refused(made, tmp_path, where):
    """``model.safetensors.index.json`` naming its shard by ``..`` or an absolute path: transformers read the weights
    from there and the checkpoint captioned with another folder's weights; refused naming the index and the entry.
    A shard named inside the folder loads."""
    checkpoint = copy_of(made, "blip", tmp_path)
    folder = checkpoint / "model"
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        names = list(f.keys())  # noqa: SIM118 (no __iter__)
    inside = {name: "model.safetensors" for name in names}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": inside}))
    assert len(Captioner.from_pretrained(checkpoint, device="cpu").caption(made["image"])) == 1
    outside = tmp_path / "elsewhere" / "shard.safetensors"
    outside.parent.mkdir()
    shutil.move(folder / "model.safetensors", outside)
    shard = str(outside) if where == "absolute" else "../../elsewhere/shard.safetensors"
    weight_map = dict.fromkeys(names, shard)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    refusal_everywhere(checkpoint, made, tmp_path, "model/model.safetensors.index.json: weight_map[",
                       f"names {shard!r}, outside the checkpoint folder")  # fmt: skip


def test_an_adapter_planted_at_the_top_of_a_model_folder_is_refused(made, tmp_path):
    """transformers' ``from_pretrained`` loads a peft adapter it finds beside a model's weights, unasked."""
    checkpoint = copy_of(made, "vlm", tmp_path)
    shutil.copy(checkpoint / "model" / "lm_lora" / "adapter_config.json", checkpoint / "model" / "adapter_config.json")
    refusal_everywhere(checkpoint, made, tmp_path, "model/adapter_config.json: a peft adapter at the top")


def test_float32_master_weights_are_loaded_strictly(made, tmp_path):
    """``float32_weights/model.safetensors`` (what a 16-bit run resumes from) names parameters of the model, of their
    shapes, and finite."""
    folder = model_dir(copy_of(made, "clipcap", tmp_path))
    model = load_captioner(folder)
    name, param = next((n, p) for n, p in model.named_parameters() if n.startswith("mapper."))
    for tensors, expected in (({name: torch.full_like(param, float("nan"))}, "non-finite values"),
                              ({name: torch.zeros(3)}, "of another shape"),
                              ({"mapper.nothing": torch.zeros(3)}, "unexpected: mapper.nothing")):  # fmt: skip
        (folder / memory.MASTERS).parent.mkdir(exist_ok=True)
        save_file(tensors, str(folder / memory.MASTERS))
        with pytest.raises(CheckpointError, match=f"float32_weights/model.safetensors: .*{expected}"):
            memory.load_float32_masters(model, folder)
    shutil.rmtree((folder / memory.MASTERS).parent)
    save_file({name: torch.zeros(3)}, str(folder / memory.OLD_MASTERS))  # where checkpoints before 2026-11-27 have it
    with pytest.raises(CheckpointError, match="float32_weights.safetensors: .*of another shape"):
        memory.load_float32_masters(model, folder)


# --------------------------------------------------------------------------------------------------------------------
# Adapters: their configuration and where they are
# --------------------------------------------------------------------------------------------------------------------


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))  # Infinity and NaN as JSON's extensions, as Python and peft read them


def halve_targets(config: dict) -> None:
    config["target_modules"] = sorted(config["target_modules"])[: len(config["target_modules"]) // 2]


def outside_copy(model: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(model / "lm_lora", tmp_path / "elsewhere" / "lm_lora"))


ADAPTER_VARIANTS = {
    "target-subset": ("adapter_config.json", halve_targets, "target_modules leave out trained modules"),
    "alpha-infinity": ("adapter_config.json", lambda c: c.update(lora_alpha=float("inf")), "lora_alpha is inf"),
    "alpha-nan": ("adapter_config.json", lambda c: c.update(lora_alpha=float("nan")), "lora_alpha is nan"),
    "alpha-huge": ("adapter_config.json", lambda c: c.update(lora_alpha=1e30), "lora_alpha is 1e+30"),
    "rank": ("adapter_config.json", lambda c: c.update(r=8), "r is 8, trained with 4"),
    "layer-replication": ("adapter_config.json", lambda c: c.update(layer_replication=[[0, 1], [0, 1]]),
                          "layer_replication is [[0, 1], [0, 1]], trained with None"),
    "dora": ("adapter_config.json", lambda c: c.update(use_dora=True), "use_dora is True"),
    "rank-pattern": ("adapter_config.json", lambda c: c.update(rank_pattern={"q_proj": 2, "c_attn": 2}),
                     "rank_pattern is"),
    "init-pissa": ("adapter_config.json", lambda c: c.update(init_lora_weights="pissa"), "init_lora_weights"),
    "peft-type": ("adapter_config.json", lambda c: c.update(peft_type="LOHA"), "peft_type is 'LOHA'"),
    "recorded-alpha-infinity": ("captioner.json", lambda m: m["lora"]["lm"].update(alpha=float("inf")),
                                "captioner.json: lora.lm: lora.alpha must be a finite number"),
    "recorded-rank-text": ("captioner.json", lambda m: m["lora"]["lm"].update(rank="4"), "rank (an integer)"),
}  # fmt: skip
"""Edits of ``adapter_config.json`` or ``captioner.json`` (relative to the model folder) and how they are named."""


@pytest.mark.parametrize("backbone", ["clipcap", "vlm"])
@pytest.mark.parametrize("variant", list(ADAPTER_VARIANTS))
def test_tampered_adapter_configurations_are_refused(made, tmp_path, backbone, variant):
    checkpoint = copy_of(made, backbone, tmp_path)
    file, change, expected = ADAPTER_VARIANTS[variant]
    edited = checkpoint / "model" / ("lm_lora/" if file == "adapter_config.json" else "") / file
    edit_json(edited, change)
    refusal_everywhere(checkpoint, made, tmp_path, f"model/{'lm_lora/' if 'adapter' in file else ''}{file}", expected)


def test_a_captioner_json_that_is_not_an_object_is_refused(made, tmp_path):
    checkpoint = copy_of(made, "clipcap", tmp_path)
    (checkpoint / "model" / "captioner.json").write_text("[]")
    refusal_everywhere(checkpoint, made, tmp_path, "model/captioner.json: expected a JSON object")


@pytest.mark.parametrize("backbone", ["clipcap", "vlm"])
def test_fewer_targets_without_a_record_are_refused_as_unexpected_adapter_weights(made, tmp_path, backbone):
    """A checkpoint that did not record its targets in captioner.json (before finecap did): the adapter weights of
    the modules left out of target_modules are unexpected tensors, refused, never dropped silently."""
    checkpoint = copy_of(made, backbone, tmp_path)
    edit_json(checkpoint / "model" / "captioner.json", lambda m: m["lora"]["lm"].pop("targets"))
    edit_json(checkpoint / "model" / "lm_lora" / "adapter_config.json", halve_targets)
    refusal_everywhere(checkpoint, made, tmp_path, "model/lm_lora/adapter_model.safetensors: ", "unexpected: ",
                       "lora_A.weight")  # fmt: skip


def adapters_outside(model: Path, tmp_path: Path, how: str) -> None:
    """Make ``captioner.json`` lead the language model's adapters out of the model folder."""
    if how == "absolute":
        elsewhere = outside_copy(model, tmp_path)
        edit_json(model / "captioner.json", lambda m: m["lora"]["lm"].update(dir=str(elsewhere)))
    elif how == "dotdot":
        shutil.copytree(model / "lm_lora", model.parent / "lm_lora")
        edit_json(model / "captioner.json", lambda m: m["lora"]["lm"].update(dir="../lm_lora"))
    elif how == "dotdot-deep":
        edit_json(model / "captioner.json", lambda m: m["lora"]["lm"].update(dir="lm_lora/../../model/../.."))
    elif how == "linked-folder":
        elsewhere = outside_copy(model, tmp_path)
        shutil.rmtree(model / "lm_lora")
        (model / "lm_lora").symlink_to(elsewhere, target_is_directory=True)
    else:  # a link to a weights file outside
        elsewhere = outside_copy(model, tmp_path)
        (model / "lm_lora" / "adapter_model.safetensors").unlink()
        (model / "lm_lora" / "adapter_model.safetensors").symlink_to(elsewhere / "adapter_model.safetensors")


@pytest.mark.parametrize("backbone", ["clipcap", "vlm"])
@pytest.mark.parametrize("how", ["absolute", "dotdot", "dotdot-deep", "linked-folder", "linked-file"])
def test_adapters_outside_the_checkpoint_folder_are_refused(made, tmp_path, backbone, how):
    checkpoint = copy_of(made, backbone, tmp_path)
    adapters_outside(checkpoint / "model", tmp_path, how)
    message = refusal_everywhere(checkpoint, made, tmp_path, "captioner.json: lora.lm.dir: ",
                                 "outside the checkpoint folder")  # fmt: skip
    assert str((checkpoint / "model").resolve()) in message


# --------------------------------------------------------------------------------------------------------------------
# train.init_from: the checkpoint's captioner.json against the configuration
# --------------------------------------------------------------------------------------------------------------------

INIT_FROM = {
    "vlm-into-clipcap": ("vlm", [], "is a vlm captioner, but model.kind=clipcap"),
    "clipcap-into-vlm": ("clipcap", ["model.kind=vlm"], "is a clipcap captioner, but model.kind=vlm"),
    "clipcap-into-blip": ("clipcap", ["model.kind=blip"], "is a clipcap captioner, but model.kind=blip"),
    "blip-into-vlm": ("blip", ["model.kind=vlm"], "is a blip captioner, but model.kind=vlm"),
    "prefix-length": ("clipcap", ["clipcap.prefix_length=10"],
                      "clipcap.prefix_length=2 in the checkpoint, 10 configured); set clipcap.prefix_length=2"),
    "mapper": ("clipcap", ["clipcap.mapper=transformer", "clipcap.prefix_length=2"],
               "clipcap.mapper='mlp' in the checkpoint, 'transformer' configured"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(INIT_FROM))
def test_init_from_another_captioner_is_refused_naming_both(made, case):
    source, overrides, expected = INIT_FROM[case]
    cfg = load(None, [f"model.encoder={made['clip']}", f"train.init_from={made[source]}", *overrides])
    with pytest.raises(CheckpointError) as e:
        build_model(cfg)
    assert f"{model_dir(made[source]) / 'captioner.json'}: train.init_from " in str(e.value)
    assert expected in str(e.value)


def test_init_from_another_backbone_ends_the_train_command_in_one_line(made, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for i in range(4):
        shutil.copy(made["image"], data / f"{i}.png")
        (data / f"{i}.txt").write_text("a red square\n")
    # the data's splits are read before any model (half the images held out for validation: a split of each)
    line = refused(["train", "data.format=folder", f"data.path={data}", "data.val_fraction=0.5",
                    f"model.encoder={made['clip']}",
                           f"train.init_from={made['vlm']}", f"run.cache_dir={tmp_path / 'cache'}", "--out",
                           str(tmp_path / "run")])  # fmt: skip
    assert "is a vlm captioner, but model.kind=clipcap" in line
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_the_same_captioner_starts_a_run(made):
    """The check refuses only what differs: the checkpoint's own backbone and settings load (its LM's world-tiny
    sizes included: ``made`` builds a 1-layer GPT-2 of width 32)."""
    cfg = load(None, [f"model.encoder={made['clip']}", "clipcap.prefix_length=2", "lora.lm=true", "lora.rank=4",
                      "lora.alpha=8", f"train.init_from={made['clipcap']}", "clipcap.tiny_layers=1",
                      "clipcap.tiny_hidden=32", "clipcap.tiny_heads=2"])  # fmt: skip
    model = build_model(cfg)
    assert lora.adapter_spec(model, "lm") is not None and model.section.prefix_length == 2
