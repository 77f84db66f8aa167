"""Where pretrained weights load (:func:`finecap.models.memory.loading_onto`): the ``from_pretrained`` keyword
arguments :meth:`~finecap.models.memory.LoadOptions.pretrained` gives per device, and the training path
(:func:`finecap.train.setup.build_model`) passing the process's device down to the backbone's load. No CUDA here: the
device is named (``cuda:1``) or the current CUDA device mocked; the load itself is recorded, not run on a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from finecap.config import load
from finecap.models import memory
from finecap.models.memory import LoadOptions, load_device, loading_onto
from finecap.models.presets import save_tiny_vlm
from finecap.train.setup import build_model


def test_the_cpu_loads_as_before():
    """Outside the block, and inside it for the CPU (or no device): no ``device_map`` (transformers' CPU load)."""
    plain = LoadOptions().pretrained(quantize=True)
    assert plain == {"dtype": torch.float32}
    for device in (None, "cpu", torch.device("cpu"), "meta"):
        with loading_onto(device):
            assert LoadOptions().pretrained(quantize=True) == plain
    assert LoadOptions("bfloat16", "sdpa").pretrained() == {"dtype": torch.bfloat16, "attn_implementation": "sdpa"}


def test_a_cuda_process_loads_onto_its_own_device(monkeypatch):
    with loading_onto(torch.device("cuda", 1)):
        assert LoadOptions("bfloat16").pretrained() == {
            "dtype": torch.bfloat16,
            "device_map": {"": torch.device("cuda", 1)},
        }
        with loading_onto("cuda:3"):  # nested: the inner device, then the outer one again
            assert LoadOptions().pretrained()["device_map"] == {"": torch.device("cuda", 3)}
        assert LoadOptions().pretrained()["device_map"] == {"": torch.device("cuda", 1)}
    assert "device_map" not in LoadOptions().pretrained()  # reset after the block
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)  # "cuda" without an index: the current device
    assert load_device("cuda") == torch.device("cuda", 2)
    assert load_device("cpu") is None


def test_a_quantized_load_goes_to_the_process_device(monkeypatch):
    """bitsandbytes quantizes where the weights land: the process's device inside the block, else as before (the
    current CUDA device, or the CPU without one)."""
    monkeypatch.setattr(memory, "bnb_config", lambda kind, dtype, skip: ("bnb", kind))
    options = LoadOptions(quantization="4bit")
    with loading_onto("cuda:1"):
        kwargs = options.pretrained(quantize=True)
    assert kwargs["quantization_config"] == ("bnb", "4bit")
    assert kwargs["device_map"] == {"": torch.device("cuda", 1)}
    assert "device_map" not in options.pretrained(quantize=False)  # a part loaded unquantized: the CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert options.pretrained(quantize=True)["device_map"] == {"": "cpu"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 5)
    assert options.pretrained(quantize=True)["device_map"] == {"": 5}
    with loading_onto("meta"):  # a quantized load reads its weights: where bitsandbytes quantizes
        assert options.pretrained(quantize=True)["device_map"] == {"": 5}
    with loading_onto("cpu"):  # a run on the CPU (train.cpu=true) on a GPU machine quantizes on the CPU
        assert options.pretrained(quantize=True)["device_map"] == {"": "cpu"}


@pytest.mark.parametrize("device", [torch.device("cuda", 1), torch.device("cpu")])
def test_training_passes_its_device_to_the_load(tmp_path: Path, monkeypatch, device):
    """``build_model(cfg, device=...)`` as training calls it: the VLM's ``from_pretrained`` receives
    ``device_map={"": cuda:1}`` on a CUDA process and none on the CPU (recorded, then loaded on the CPU here)."""
    import transformers

    folder = save_tiny_vlm(tmp_path / "vlm", "llava")
    real = transformers.AutoModelForImageTextToText.from_pretrained.__func__
    seen: list[dict] = []

    def recording(cls, name, **kwargs):
        seen.append(dict(kwargs))
        kwargs.pop("device_map", None)
        return real(cls, name, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForImageTextToText, "from_pretrained", classmethod(recording))
    model = build_model(load(None, ["model.kind=vlm", f"vlm.name={folder}", "model.dtype=bfloat16"]), device=device)
    assert len(seen) == 1
    assert seen[0]["dtype"] == torch.bfloat16
    assert seen[0].get("device_map") == ({"": device} if device.type == "cuda" else None)
    assert "device_map" not in LoadOptions().pretrained()  # the block ended with the build
    assert next(model.parameters()).device.type == "cpu"


def test_a_checkpoint_with_adapters_builds_on_the_meta_device_quietly(tmp_path: Path):
    """``train.init_from`` of a LoRA run built as a sharded run's other process builds it: no weight read (the base
    and the adapters on the meta device), and no warning per adapter tensor loaded into a meta layer (a no-op by
    design: the weights come from the main process); built normally, the same checkpoint holds its trained adapters."""
    import warnings

    from finecap.runs import model_dir
    from finecap.train.checkpoint import save_checkpoint

    folder = save_tiny_vlm(tmp_path / "vlm", "llava", std=0.2)
    lora = ["model.kind=vlm", f"vlm.name={folder}", "lora.lm=true", "lora.rank=4", "lora.alpha=8"]
    trained = build_model(load(None, lora))
    with torch.no_grad():
        for name, p in trained.named_parameters():
            if "lora_B" in name:
                p.normal_()
    start = model_dir(save_checkpoint(tmp_path / "ck", model=trained, cfg=load(None, lora), info={"step": 1}))
    cfg = load(None, [*lora, f"train.init_from={start}"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        empty = build_model(cfg, device="meta")
    assert not [w for w in caught if "meta parameter" in str(w.message)]
    assert {p.device.type for p in empty.parameters()} == {"meta"}
    assert sum("lora_B" in n for n, _ in empty.named_parameters()) > 0
    loaded = dict(build_model(cfg).named_parameters())
    assert all(torch.equal(loaded[n], p) for n, p in trained.named_parameters() if "lora_B" in n)
