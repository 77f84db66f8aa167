"""Where inference loads its pretrained weights (:func:`finecap.models.memory.loading_onto`): ``finecap caption``
(:func:`finecap.app.caption.main`, the library function), the Python API (:class:`finecap.api.Captioner`), the
retriever (``finecap eval``'s self-retrieval, the reward server's and training's retrieval reward), a ClipCap's frozen
dual encoder and ``finecap eval``'s perplexity language model: for a CUDA device ``from_pretrained`` receives
``device_map={"": device}`` (no copy of the model in host memory first); on the CPU it receives no ``device_map``, as
before. No CUDA here: the device the entry point picks is mocked, what ``from_pretrained`` receives is recorded and the
load stopped there (a CUDA load cannot run); on the CPU the load runs to the end."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import transformers
from PIL import Image

from finecap.config import load
from finecap.models.memory import LoadOptions, loading_onto
from finecap.models.presets import save_tiny_clip, save_tiny_vlm
from finecap.models.vlm import Vlm

CUDA0 = torch.device("cuda", 0)


class Recorded(Exception):
    """Raised by the recording ``from_pretrained`` of a mocked CUDA load, once it has seen its arguments."""


def record(monkeypatch, cls, *, stop: bool) -> list[dict]:
    """Replace ``cls.from_pretrained`` by one recording its keyword arguments, then raising :class:`Recorded`
    (``stop``) or loading as the real one does (on the CPU)."""
    real = cls.from_pretrained.__func__
    seen: list[dict] = []

    def recording(klass, name, *args, **kwargs):
        seen.append(dict(kwargs))
        if stop:
            raise Recorded(name)
        return real(klass, name, *args, **kwargs)

    monkeypatch.setattr(cls, "from_pretrained", classmethod(recording))
    return seen


def mock_cuda(monkeypatch, index: int = 0) -> None:
    """A machine whose accelerator is CUDA device ``index`` of two or more (``torch.accelerator``,
    ``torch.cuda.current_device``)."""
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: max(2, index + 1))
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: index)


@pytest.fixture(scope="module")
def captioner_folder(tmp_path_factory) -> Path:
    """A bare captioner folder (a tiny random LLaVA saved by finecap), which both entry points load."""
    tmp = tmp_path_factory.mktemp("placement")
    return Vlm.from_pretrained(save_tiny_vlm(tmp / "llava", "llava")).save(tmp / "model")


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "images" / "red.png"
    path.parent.mkdir()
    Image.new("RGB", (16, 16), "red").save(path)
    return path


# --------------------------------------------------------------------------------------------------------------------
# finecap caption
# --------------------------------------------------------------------------------------------------------------------


def test_caption_loads_onto_the_processes_cuda_device(captioner_folder, image, tmp_path, monkeypatch):
    """``finecap caption`` on a CUDA process: the captioner's ``from_pretrained`` receives the accelerator's device."""
    from finecap.app import caption

    accelerator = type("Accelerator", (), {"device": CUDA0, "is_main_process": True, "num_processes": 1})()
    monkeypatch.setattr(caption, "make_accelerator", lambda train: accelerator)
    seen = record(monkeypatch, transformers.AutoModelForImageTextToText, stop=True)
    with pytest.raises(Recorded):
        caption.main(checkpoint=captioner_folder, images=[image.parent], out=tmp_path / "out.json")
    assert len(seen) == 1 and seen[0].get("device_map") == {"": CUDA0}
    assert seen[0]["dtype"] == torch.float32  # the load options as before
    assert "device_map" not in LoadOptions().pretrained()  # the block ended with the load
    assert not (tmp_path / "out.json").exists()


def test_caption_on_the_cpu_loads_as_before(captioner_folder, image, tmp_path, monkeypatch):
    from finecap.app import caption

    seen = record(monkeypatch, transformers.AutoModelForImageTextToText, stop=False)
    out = caption.main(checkpoint=captioner_folder, images=[image.parent], out=tmp_path / "out.json",
                       overrides=["train.cpu=true", "decode.max_length=3"])  # fmt: skip
    assert len(seen) == 1 and "device_map" not in seen[0]
    assert seen[0]["dtype"] == torch.float32
    assert out.exists()


# --------------------------------------------------------------------------------------------------------------------
# The Python API
# --------------------------------------------------------------------------------------------------------------------


def test_the_api_loads_onto_the_accelerator_it_picks(captioner_folder, monkeypatch):
    """``Captioner.from_pretrained(path)`` with no device picks the machine's accelerator (mocked: CUDA, current
    device 0) and loads onto it; a device named is used as named."""
    from finecap import Captioner

    mock_cuda(monkeypatch, 0)
    seen = record(monkeypatch, transformers.AutoModelForImageTextToText, stop=True)
    with pytest.raises(Recorded):
        Captioner.from_pretrained(captioner_folder)
    with pytest.raises(Recorded):
        Captioner.from_pretrained(captioner_folder, device="cuda:1")
    assert [kwargs.get("device_map") for kwargs in seen] == [{"": CUDA0}, {"": torch.device("cuda", 1)}]


def test_the_api_on_the_cpu_loads_as_before(captioner_folder, monkeypatch):
    from finecap import Captioner

    seen = record(monkeypatch, transformers.AutoModelForImageTextToText, stop=False)
    cap = Captioner.from_pretrained(captioner_folder, device="cpu")
    assert len(seen) == 1 and "device_map" not in seen[0]
    assert {p.device.type for p in cap.model.parameters()} == {"cpu"}
    mock_cuda(monkeypatch)
    Captioner.from_pretrained(captioner_folder, device="cpu")  # a CUDA machine, the CPU named: as before
    assert len(seen) == 2 and "device_map" not in seen[1]


# --------------------------------------------------------------------------------------------------------------------
# The retriever, a ClipCap's dual encoder, the perplexity language model
# --------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory) -> Path:
    return save_tiny_clip(tmp_path_factory.mktemp("clip") / "clip")


def test_the_retriever_loads_onto_its_cuda_device(clip_folder, monkeypatch):
    """``finecap eval``'s retriever (on :func:`~finecap.models.memory.eval_device`, mocked CUDA) and a run's
    (``RewardInputs.of_run``: the reward server's and training's device) load onto it; on the CPU or with no device,
    as before."""
    from finecap.models.memory import eval_device
    from finecap.models.retriever import Retriever, load_retriever
    from finecap.rewards.inputs import RewardInputs

    cfg = load(None, [f"retriever.checkpoint={clip_folder}"])
    seen = record(monkeypatch, transformers.CLIPModel, stop=False)
    assert Retriever.from_pretrained(clip_folder).device.type == "cpu"
    assert Retriever.from_pretrained(clip_folder, device="cpu").device.type == "cpu"
    assert all("device_map" not in kwargs for kwargs in seen) and len(seen) == 2
    seen = record(monkeypatch, transformers.CLIPModel, stop=True)
    mock_cuda(monkeypatch, 0)
    with pytest.raises(Recorded):
        load_retriever(cfg, device=eval_device(cfg))
    with pytest.raises(Recorded):
        RewardInputs.of_run(cfg, [], frozenset({"retriever"}), device=torch.device("cuda", 2))
    assert [kwargs.get("device_map") for kwargs in seen] == [{"": CUDA0}, {"": torch.device("cuda", 2)}]
    on_cpu = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, cpu=True))
    with pytest.raises(Recorded):
        load_retriever(on_cpu, device=eval_device(on_cpu))
    assert len(seen) == 3 and "device_map" not in seen[2]  # train.cpu: eval's device is the CPU


def test_a_clipcap_dual_encoder_loads_where_the_captioner_does(clip_folder, monkeypatch):
    from finecap.models.vision import load_dual_encoder

    seen = record(monkeypatch, transformers.CLIPModel, stop=True)
    for device in ("cuda:1", "cpu", None):
        with loading_onto(device), pytest.raises(Recorded):
            load_dual_encoder(clip_folder, torch.float32)
    assert seen[0].get("device_map") == {"": torch.device("cuda", 1)}
    assert "device_map" not in seen[1] and "device_map" not in seen[2]


def test_the_perplexity_model_loads_onto_its_cuda_device(tmp_path, monkeypatch):
    from finecap.metrics.perplexity import Perplexity
    from finecap.models.tokenizer import world_tokenizer

    tok = world_tokenizer()
    folder = tmp_path / "lm"
    config = transformers.GPT2Config(vocab_size=len(tok), n_layer=1, n_embd=8, n_head=2, n_positions=16)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    seen = record(monkeypatch, transformers.AutoModelForCausalLM, stop=False)
    assert Perplexity(folder, tok, device="cpu").model.device.type == "cpu"
    assert "device_map" not in seen[0]
    seen = record(monkeypatch, transformers.AutoModelForCausalLM, stop=True)
    with pytest.raises(Recorded):
        Perplexity(folder, tok, device="cuda:3")
    assert seen[0].get("device_map") == {"": torch.device("cuda", 3)}
