"""``finecap models tiny KIND --out DIR`` (finecap.models.tiny, finecap.app.models): every kind's folder loads back
with transformers' Auto classes and finecap's loader (a VLM's processor: finecap's, which builds the image-only
processors transformers' ``AutoProcessor`` wants a video processor for; the command says which need torchvision),
with the weights that were written, at the default head width vLLM's CPU attention takes (32); a non-empty --out is
refused."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from PIL import Image

from finecap.models import presets, tiny
from finecap.models.vlm import FAMILIES
from helpers.cli import refused, run_cli


def test_the_kinds_are_clip_blip_and_every_supported_family():
    assert set(tiny.KINDS) == {"clip", "blip", *FAMILIES} and len(FAMILIES) == 13


def same_weights(ours: torch.nn.Module, theirs: torch.nn.Module) -> None:
    a, b = ours.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_family_folder_loads_back_with_auto_classes_and_as_a_captioner(family, tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from transformers.utils import is_torchvision_available

    from finecap.config import DecodeConfig
    from finecap.models.vlm import Vlm

    code, out, err = run_cli(["models", "tiny", family, "--out", str(tmp_path / family)])
    assert code == 0, err
    assert out == "" and f"model.kind=vlm vlm.name={tmp_path / family}" in err  # a status line: the finecap logger
    assert ("its processor loads with" in err) == (family in tiny.LOAD_NEEDS)
    assert family not in tiny.LOAD_NEEDS or f"loads with {tiny.LOAD_NEEDS[family]} installed" in err
    model, _ = tiny.tiny_family(family)  # the same seed: the same weights
    loaded = AutoModelForImageTextToText.from_pretrained(tmp_path / family)
    assert loaded.config.model_type == family
    text = loaded.config.get_text_config()
    head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    assert (text.hidden_size, text.num_attention_heads, head) == (64, 2, 32)
    same_weights(model, loaded)
    # transformers' AutoProcessor: the families said to need torchvision are those it refuses without
    auto = tiny.AUTO_PROCESSOR_NEEDS.get(family)
    assert (f"AutoProcessor reads the folder only with {auto} installed" in err) == (
        auto is not None and auto != tiny.LOAD_NEEDS.get(family)
    ), err
    if not is_torchvision_available() and family not in tiny.STAND_INS:  # stand-ins change this process's classes
        try:
            AutoProcessor.from_pretrained(tmp_path / family)
            refused = None
        except (ImportError, ValueError) as e:
            refused = str(e)
        assert (refused is not None and "orchvision" in refused) == (auto == "torchvision"), refused
    if family == "mistral3" and not is_torchvision_available():  # the weights are checked; the processor is not
        pytest.skip("PixtralProcessor loads from a folder only with torchvision (built here through a stand-in)")
    captioner = Vlm.from_pretrained(tmp_path / family).eval()
    images = [Image.new("RGB", (16, 16), c) for c in ("red", "blue")]
    gen = captioner.generate(captioner.encoder.preprocess(images), DecodeConfig(strategy="greedy", max_length=4))
    assert gen.sequences.shape[0] == 2 and 1 <= int(gen.lengths.max()) <= 4


def test_a_clip_folder_loads_back_as_the_retriever_and_with_auto_classes(tmp_path):
    from transformers import AutoModel, AutoProcessor

    from finecap.models.retriever import Retriever

    code, out, err = run_cli(["models", "tiny", "clip", "--out", str(tmp_path / "clip"), "--hidden", "32"])
    assert code == 0 and f"model.encoder={tmp_path / 'clip'}" in err, err
    # the key of CLIPScore and self-retrieval too: model.encoder alone (said as "the retriever") gave finecap eval none
    assert f"or retriever.checkpoint={tmp_path / 'clip'} (CLIPScore" in err, err
    theirs = AutoModel.from_pretrained(tmp_path / "clip")
    assert type(theirs).__name__ == "CLIPModel" and theirs.config.text_config.hidden_size == 32
    AutoProcessor.from_pretrained(tmp_path / "clip")
    retriever = Retriever.from_pretrained(tmp_path / "clip")
    same_weights(retriever.model, theirs)


def test_a_blip_folder_loads_back_with_auto_classes(tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    code, _, err = run_cli(["models", "tiny", "blip", "--out", str(tmp_path / "blip")])
    assert code == 0, err
    model = AutoModelForImageTextToText.from_pretrained(tmp_path / "blip")
    assert type(model).__name__ == "BlipForConditionalGeneration" and model.config.text_config.hidden_size == 64
    AutoProcessor.from_pretrained(tmp_path / "blip")


def test_an_occupied_out_or_an_unknown_kind_is_refused_and_nothing_is_written(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    refused(["models", "tiny", "llava", "--out", str(tmp_path / "mine")], "--out", "not an empty folder")
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]
    refused(["models", "tiny", "gpt5", "--out", str(tmp_path / "new")], "KIND 'gpt5'", "smolvlm")
    assert not (tmp_path / "new").exists()
    # a mistyped KIND gets the closest one, as mistyped choices, keys and stages do (docs/cli.md, "Did you mean")
    refused(["models", "tiny", "clipp", "--out", str(tmp_path / "new")], "KIND 'clipp' (did you mean 'clip'?)")
    refused(["models", "tiny", "qwen2vl", "--out", str(tmp_path / "new")], "(did you mean 'qwen2_vl'?)")
    assert not (tmp_path / "new").exists()
    refused(["models", "tiny", "llava", "--out", str(tmp_path / "odd"), "--hidden", "60"], "--hidden 60", "--heads")
    assert not (tmp_path / "odd").exists()


def test_vlm_name_tiny_builds_the_familys_tiny_vlm_and_leaves_the_random_generators_alone():
    from finecap.config import load
    from finecap.models.vlm import Vlm

    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    captioner = Vlm.build(load(None, ["model.kind=vlm", "vlm.name=tiny:idefics3"]))
    assert torch.equal(torch.rand(2), expected)
    assert captioner.source == "tiny:idefics3" and captioner.model.config.model_type == "idefics3"
    same_weights(tiny.tiny_family("idefics3")[0], captioner.model)
    assert Vlm.built_here(load(None, ["model.kind=vlm", "vlm.name=tiny:idefics3"])) == "vlm.name=tiny:idefics3"
    with pytest.raises(ValueError, match=r"vlm.name=tiny:gpt5: no tiny 'gpt5' VLM; valid: tiny:llava"):
        Vlm.build(load(None, ["model.kind=vlm", "vlm.name=tiny:gpt5"]))


BUILDS = {
    "save_tiny_clip": lambda out, seed: presets.save_tiny_clip(out, seed=seed),
    "save_tiny_blip": lambda out, seed: presets.save_tiny_blip(out, seed=seed),
    "save_tiny_vlm": lambda out, seed: presets.save_tiny_vlm(out, "llava", seed=seed),
    "save_tiny_vlm std": lambda out, seed: presets.save_tiny_vlm(out, "qwen2_vl", seed=seed, std=0.2),
    "tiny_family": lambda out, seed: tiny.tiny_family("idefics3", seed=seed)[0].save_pretrained(out),
    "save_tiny": lambda out, seed: tiny.save_tiny("gemma3", out, seed=seed),
}


def global_draws() -> tuple:
    """A draw from each of the process's global generators (torch, numpy, python), from wherever they stand."""
    return torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)]


def saved_weights(folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_a_tiny_model_is_drawn_from_its_seed_and_leaves_the_global_generators_where_they_were(build, tmp_path):
    """A notebook that builds a tiny model (docs/training.md) keeps its later draws: torch's, numpy's and python's
    generators are where they were before the call; the weights depend on ``seed`` alone, not on those states."""
    states = []
    for run, (global_seed, seed) in enumerate([(11, 0), (12, 0), (11, 1)]):
        torch.manual_seed(global_seed), np.random.seed(global_seed), random.seed(global_seed)
        BUILDS[build](tmp_path / str(run), seed)
        after = global_draws()
        torch.manual_seed(global_seed), np.random.seed(global_seed), random.seed(global_seed)
        assert after == global_draws(), f"{build} moved the global random generators"
        states.append(saved_weights(tmp_path / str(run)))
    same, other_seed = states[0], states[2]
    assert same.keys() == states[1].keys() and all(torch.equal(same[k], states[1][k]) for k in same)
    assert any(not torch.equal(same[k], other_seed[k]) for k in same if same[k].is_floating_point())


def test_a_failed_write_into_an_empty_folder_leaves_it_empty_and_a_complete_one_fills_it(tmp_path, monkeypatch):
    """The model is built beside --out and renamed onto it when complete: a failure half-way (here after the
    weights) leaves the user's empty folder empty and no folder of finecap's behind."""
    from finecap.app.models import tiny_main

    out = tmp_path / "empty"
    out.mkdir()
    out.chmod(0o2770)  # the user's folder: its mode (a shared group's setgid) and identity are kept
    inode = out.stat().st_ino
    real = tiny.save_tiny

    def fails_half_way(kind, folder, **kw):
        real(kind, folder, **kw)
        raise OSError("disk full")

    monkeypatch.setattr(tiny, "save_tiny", fails_half_way)
    with pytest.raises(OSError, match="disk full"):
        tiny_main("blip", out)
    assert list(out.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["empty"]
    monkeypatch.setattr(tiny, "save_tiny", real)
    tiny_main("blip", out)
    assert (out / "config.json").is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["empty"]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no folder of finecap's left inside
    assert (out.stat().st_ino, out.stat().st_mode & 0o7777) == (inode, 0o2770)
    # named relatively (tempfile gives absolute paths on Python 3.12+: finecap's own folder was taken for the user's)
    (tmp_path / "rel").mkdir()
    monkeypatch.chdir(tmp_path)
    tiny_main("blip", "rel")
    assert (tmp_path / "rel" / "config.json").is_file()
    from finecap.utils.files import file_mode

    assert {p.stat().st_mode & 0o777 for p in out.iterdir() if p.is_file()} == {file_mode()}  # as the umask says
