"""``decode.engine=vllm`` refuses in one line what it cannot do, before anything of vLLM is imported: a backbone vLLM
does not serve (naming it and the engine that serves it), also for training's RL rollouts (from the configuration,
before a run prepares anything), a machine without vLLM (naming the install; so does boost's ``vllm`` backend), RL
rollouts on vLLM with a tensor-parallel engine. These run in every venv."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from finecap.boost.backends import make_backend
from finecap.config import ConfigError, DecodeConfig, load
from finecap.data.datasets import model_collator
from finecap.engines import open_engine
from finecap.engines.finecap import FinecapEngine
from finecap.engines.rollouts import RolloutEngine
from finecap.engines.vllm import VllmEngine, config_refusal, import_vllm, unservable_reason
from finecap.models.blip import Blip, FeatureMapTokens
from finecap.models.clipcap import ClipCap
from finecap.models.presets import build_world_lm, save_tiny_blip, save_tiny_clip, save_tiny_vlm, world_vlm
from finecap.models.vision import VisionEncoder
from finecap.models.vlm import Vlm
from finecap.objectives import get_objective
from finecap.utils.system import MissingExtra
from helpers.cli import refused
from helpers.vlm import images


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("backbones")
    return {"clip": save_tiny_clip(root / "clip", image_size=16, patch_size=8), "blip": save_tiny_blip(root / "blip"),
            "idefics3": save_tiny_vlm(root / "idefics3", "idefics3")}  # fmt: skip


def clipcap(folders):
    lm, tok = build_world_lm(layers=1, hidden=32, heads=2, dropout=0.0)
    encoder = VisionEncoder.from_pretrained(folders["clip"])
    return ClipCap(lm, tok, encoder.feature_dim, encoder=encoder)


def world_tiny_vlm(folders):
    world = FeatureMapTokens.from_pretrained(folders["clip"])
    n_tokens, width = world.token_shape(16)
    model, processor = world_vlm(width, n_tokens, world.image_processor, layers=1, hidden=32, heads=2)
    return Vlm(model, processor, source="world-tiny", world=world)


@pytest.mark.parametrize(
    ("build", "named"),
    [
        (clipcap, "model.kind=clipcap is not a model vLLM serves"),
        (lambda f: Blip.from_pretrained(f["blip"]), "model.kind=blip is not a model vLLM serves"),
        (world_tiny_vlm, "vlm.name=world-tiny reads the world encoder's image tokens"),
    ],
    ids=["clipcap", "blip", "world-tiny"],
)
def test_a_backbone_vllm_does_not_serve_is_refused_by_name(folders, build, named, monkeypatch):
    captioner = build(folders)
    monkeypatch.setitem(sys.modules, "vllm", None)  # the refusal comes first, installed or not
    with pytest.raises(ConfigError) as e:
        open_engine(load(None, ["decode.engine=vllm"]), captioner)
    message = str(e.value)
    assert named in message and message.endswith("it generates with decode.engine=finecap")
    assert "\n" not in message and e.value.key == "decode.engine"


def test_a_vlm_without_vllm_installed_names_the_install(folders, monkeypatch):
    captioner = Vlm.from_pretrained(folders["idefics3"])
    assert unservable_reason(captioner) is None  # a VLM with its own vision tower is served
    monkeypatch.setitem(sys.modules, "vllm", None)  # as on a machine without the extra
    with pytest.raises(MissingExtra) as e:
        VllmEngine.from_captioner(captioner)
    message = str(e.value)
    assert message.startswith("decode.engine=vllm needs vLLM, which is not installed")
    assert "pip install 'finecap[vllm]'" in message and "\n" not in message
    with pytest.raises(MissingExtra):
        import_vllm()


def test_boost_on_vllm_without_vllm_names_the_option_and_the_install(folders, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    cfg = load(None, ["boost.vlm_backend=vllm", f"boost.vlm_model={folders['idefics3']}"])
    with pytest.raises(MissingExtra) as e:
        make_backend(cfg, "vlm")
    message = str(e.value)
    assert message.startswith("boost.vlm_backend=vllm needs vLLM, which is not installed")
    assert "pip install 'finecap[vllm]'" in message and "\n" not in message


def test_the_caption_command_refuses_in_one_line(folders, tmp_path, monkeypatch):
    """``finecap caption --engine vllm``: exit 2 and one line, for a VLM without vLLM and for a BLIP checkpoint."""
    images(1)[0].save(tmp_path / "a.png")
    Vlm.from_pretrained(folders["idefics3"]).save(tmp_path / "smolvlm")
    Blip.from_pretrained(folders["blip"]).save(tmp_path / "blip")
    monkeypatch.setitem(sys.modules, "vllm", None)
    for checkpoint, expected in [("smolvlm", "pip install 'finecap[vllm]'"), ("blip", "model.kind=blip")]:
        argv = ["caption", "--checkpoint", str(tmp_path / checkpoint), "--images", str(tmp_path / "a.png"),
                "--engine", "vllm", "--out", str(tmp_path / f"{checkpoint}.json")]  # fmt: skip
        refused(argv, "decode.engine=vllm", expected)
        assert not (tmp_path / f"{checkpoint}.json").exists()


def test_the_default_engine_is_the_captioner_itself(folders):
    captioner = Vlm.from_pretrained(folders["idefics3"])
    cfg = load(None, [])
    with open_engine(cfg, captioner) as engine:
        assert cfg.decode.engine == "finecap" and isinstance(engine, FinecapEngine) and engine.model is captioner
        assert not engine.reads_images and not engine.external_logprobs
        assert engine.device == captioner.device and engine.encoder is captioner.encoder


def test_vllm_beam_search_cannot_stop_at_a_period():
    with pytest.raises(ConfigError, match="decode.stop_at_period: vLLM's beam search"):
        DecodeConfig(engine="vllm", strategy="beam", stop_at_period=True)
    assert DecodeConfig(engine="vllm", strategy="sample", stop_at_period=True).stop_at_period  # sampling can


# --------------------------------------------------------------------------------------------------------------------
# RL rollouts on vLLM (decode.engine=vllm with an RL objective)
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("objective", ["reinforce", "sle", "grpo"])
def test_rl_with_vllm_on_clipcap_is_refused_before_anything_is_built(objective, monkeypatch):
    """The RL objectives' factory refuses a backbone vLLM does not serve from the configuration alone, before a run
    prepares its world or builds its model."""
    monkeypatch.setitem(sys.modules, "vllm", None)
    options = {
        "reinforce": [],
        "sle": ["rl.baseline=mean"],
        "grpo": ["grpo.advantage=group", "grpo.policy_loss=clipped"],
    }
    name = "sle" if objective == "sle" else "reinforce"
    cfg = load(None, [f"train.objective={name}", "decode.engine=vllm", *options[objective]])
    with pytest.raises(ConfigError) as e:
        get_objective(name, cfg)
    message = str(e.value)
    assert message == ("decode.engine=vllm: model.kind=clipcap is not a model vLLM serves (a decoder-only VLM); it "
                       "generates with decode.engine=finecap")  # fmt: skip
    assert e.value.key == "decode.engine"


def test_finecap_train_refuses_rl_with_vllm_on_clipcap_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    world = tmp_path / "world"
    argv = ["train", "train.objective=reinforce", "decode.engine=vllm", f"world.out={world}",
            f"run.dir={tmp_path / 'run'}", f"run.cache_dir={tmp_path / 'cache'}"]  # fmt: skip
    refused(argv, "decode.engine=vllm: model.kind=clipcap is not a model vLLM serves")
    assert not world.exists() and not (tmp_path / "run" / "config.yaml").exists()  # nothing prepared or written


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["model.kind=vlm", "vlm.name=world-tiny"], "vlm.name=world-tiny reads the world encoder's image tokens"),
        (["model.kind=vlm", "vlm.name=some/vlm", "model.quantization=4bit"], "the captioner's weights are quantized"),
        (["model.kind=blip"], "model.kind=blip is not a model vLLM serves"),
    ],
    ids=["world-tiny", "quantized", "blip"],
)
def test_the_configuration_names_what_vllm_cannot_serve(overrides, named):
    assert named in config_refusal(load(None, ["decode.engine=vllm", *overrides]))
    assert config_refusal(load(None, ["decode.engine=vllm", "model.kind=vlm", "vlm.name=some/vlm"])) is None
    assert config_refusal(load(None, ["model.kind=my.module:Captioner"])) is None  # checked when it is built


def test_rl_rollouts_on_vllm_are_refused_with_a_tensor_parallel_engine():
    cfg = load(None, ["model.kind=vlm", "vlm.name=some/vlm", "decode.engine=vllm", "vllm.tensor_parallel_size=2"])
    objective = get_objective("reinforce", cfg)
    with pytest.raises(ConfigError) as e:
        objective.setup(SimpleNamespace(accelerator=SimpleNamespace(num_processes=2)))
    assert str(e.value).startswith("vllm.tensor_parallel_size=2: RL rollouts run on one engine per training process "
                                   "(2 here)")  # fmt: skip
    assert "\n" not in str(e.value) and e.value.key == "vllm.tensor_parallel_size"
    RolloutEngine(load(None, ["decode.engine=vllm"])).check_processes(2)  # an engine each (test_vllm_rollouts_ddp)
    RolloutEngine(load(None, ["vllm.tensor_parallel_size=2"])).check_processes(4)  # the policy decodes itself


def test_the_collator_keeps_the_pil_images_for_vllm(folders):
    captioner = Vlm.from_pretrained(folders["idefics3"])
    pictures = images(2)
    items = [{"caption": "a b", "image": im, "image_id": i, "references": ["a b"], "index": i}
             for i, im in enumerate(pictures)]  # fmt: skip
    assert "images" not in model_collator(captioner, 8)(items)
    batch = model_collator(captioner, 8, keep_images=True)(items)
    assert batch["images"] == pictures and "pixel_values" in batch


def fake_vllm(monkeypatch, head_sizes: list[int]) -> None:
    """A stand-in ``vllm`` on a CPU whose attention backend takes ``head_sizes`` and whose registry serves every
    family (no vLLM here: the refusal must come before any engine is built)."""
    import types

    backend = types.ModuleType("vllm.v1.attention.backends.cpu_attn")
    backend.CPUAttentionBackend = SimpleNamespace(get_supported_head_sizes=lambda: list(head_sizes))
    vllm = types.ModuleType("vllm")
    vllm.__version__ = "0.0-stand-in"
    vllm.ModelRegistry = SimpleNamespace(get_supported_archs=lambda: ["Idefics3ForConditionalGeneration"])
    vllm.platforms = SimpleNamespace(current_platform=SimpleNamespace(is_cpu=lambda: True))
    for name in ("vllm.v1", "vllm.v1.attention", "vllm.v1.attention.backends"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.v1.attention.backends.cpu_attn", backend)


def test_heads_vllms_cpu_attention_does_not_take_are_refused_in_one_line_before_the_engine(folders, monkeypatch):
    """The tiny Idefics3 at save_tiny_vlm's default width (32, 2 heads of 16) on vLLM's CPU attention: one line
    naming the head width, the sizes taken and the fixes, before the captioner is saved for vLLM (vLLM's own refusal
    is a 60-line traceback from inside its attention once the engine is half built)."""
    from finecap.engines import vllm as engines_vllm

    captioner = Vlm.from_pretrained(folders["idefics3"])
    assert engines_vllm.head_size_of(captioner.model.config) == 16
    fake_vllm(monkeypatch, [32, 64, 80])
    saved = []
    monkeypatch.setattr(engines_vllm, "save_engine_folder", lambda *a: saved.append(a))
    with pytest.raises(ConfigError) as e:
        VllmEngine.from_captioner(captioner)
    message = str(e.value)
    assert message.startswith(f"decode.engine=vllm: vlm.name={folders['idefics3']}: its language model's attention "
                              "heads are 16 wide")  # fmt: skip
    assert "takes head sizes 32, 64, 80" in message and "finecap models tiny" in message
    assert message.endswith("decode.engine=finecap") and "\n" not in message and e.value.key == "decode.engine"
    assert saved == []


def test_heads_the_backend_takes_or_an_unknown_limit_are_not_refused(folders, tmp_path, monkeypatch):
    from finecap.engines.vllm import cpu_head_sizes, head_size_refusal

    wide = Vlm.from_pretrained(save_tiny_vlm(tmp_path / "wide", "idefics3", hidden=64, heads=2))
    narrow = Vlm.from_pretrained(folders["idefics3"])
    assert head_size_refusal(wide, [32, 64]) is None
    assert head_size_refusal(narrow, None) is None  # a GPU: no limit known before vLLM starts
    assert head_size_refusal(narrow, [16, 32]) is None
    fake_vllm(monkeypatch, [32])
    assert cpu_head_sizes(sys.modules["vllm"]) == [32]
    sys.modules["vllm"].platforms = SimpleNamespace(current_platform=SimpleNamespace(is_cpu=lambda: False))
    assert cpu_head_sizes(sys.modules["vllm"]) is None


# --------------------------------------------------------------------------------------------------------------------
# Decoding settings vLLM cannot decode a captioner's captions with
# --------------------------------------------------------------------------------------------------------------------


def gemma3() -> Vlm:
    """The tiny Gemma 3: its captions end with ``<end_of_turn>``, its tokenizer's EOS is ``<eos>``."""
    from helpers.vlm_families import tiny_family

    model, processor = tiny_family("gemma3")
    vlm = Vlm(model, processor, source="gemma3")
    assert vlm.end_token_ids[0] != vlm.tokenizer.eos_token_id
    return vlm


BEAM_REFUSAL = ("decode.engine=vllm: vLLM's beam search stops only at the tokenizer's EOS '<eos>' but this "
                "captioner's captions end with '<end_of_turn>'; beam search with decode.engine=finecap")  # fmt: skip


def test_vllm_beam_search_of_a_captioner_ending_besides_eos_is_refused_when_the_engine_opens(monkeypatch):
    """vLLM's beam search stops at the tokenizer's EOS only; a captioner whose captions end with another token was
    refused by the engine's generate, after vLLM started (and after a captioning run loaded its data): now by
    open_engine, before anything of vLLM is imported."""
    captioner = gemma3()
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ConfigError) as e:
        open_engine(load(None, ["decode.engine=vllm", "decode.strategy=beam"]), captioner)
    assert str(e.value) == BEAM_REFUSAL and e.value.key == "decode.engine"
    with pytest.raises(MissingExtra):  # sampling it can: the engine is built (here: vLLM is missing)
        open_engine(load(None, ["decode.engine=vllm", "decode.strategy=sample"]), captioner)


def test_rl_beam_rollouts_on_vllm_of_such_a_captioner_are_refused_at_setup(monkeypatch):
    """The RL objectives build their engine at the first rollout, after the run prepared everything: rollouts by
    vLLM's beam search (``rl.strategy=beam``) of a captioner it cannot beam-search are refused at their setup."""
    monkeypatch.setitem(sys.modules, "vllm", None)
    captioner = gemma3()
    cfg = load(None, ["train.objective=reinforce", "decode.engine=vllm", "model.kind=vlm", "vlm.name=some/vlm",
                      "rl.strategy=beam", "rl.samples=1", "decode.beam_size=2"])  # fmt: skip
    with pytest.raises(ConfigError) as e:
        get_objective("reinforce", cfg).setup(SimpleNamespace(accelerator=None, model=captioner))
    assert str(e.value) == BEAM_REFUSAL and e.value.key == "decode.engine"
    sampled = load(None, ["train.objective=reinforce", "decode.engine=vllm", "model.kind=vlm", "vlm.name=some/vlm"])
    RolloutEngine(sampled).check_model(captioner, [get_objective("reinforce", sampled).sample_cfg])  # it can sample


def test_a_beam_search_with_fewer_captions_than_asked_is_refused():
    """vLLM's ``BeamSearchOutput`` per image holds at most ``beam_width`` sequences, and fewer where its search had no
    more: rows of one image would be read as the next image's (``num_return_sequences`` per image)."""
    from finecap.engines.vllm import check_beams

    def out(*reasons):
        return SimpleNamespace(sequences=[SimpleNamespace(finish_reason=r) for r in reasons])

    check_beams([out(None, None), out(None, None, None)], 2)  # vLLM leaves a finished beam's reason None
    with pytest.raises(RuntimeError, match=r"returned 1 caption\(s\) of image 1 of the batch, not "
                                           r"decode.num_return_sequences=2$"):  # fmt: skip
        check_beams([out(None, None), out(None)], 2)
    with pytest.raises(RuntimeError, match=r"vLLM aborted the beam search of image 0 .* 1 of its beams"):
        check_beams([out(None, "abort"), out(None, None)], 2)
