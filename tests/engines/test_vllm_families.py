"""The other VLM families through vLLM: greedy captions token-identical to finecap's decoder (float32). vLLM's LLaVA
and Qwen2-VL import torchvision, of which PyPI has no CPU build: without it they skip, saying so (they run on GPU
machines, where torchvision is installed with vLLM). The run's processor options reach vLLM's processor (Idefics3's
image splitting)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from helpers.vllm_engines import NOT_HERE, served_as_decoded

pytest.importorskip("vllm", reason=NOT_HERE)

from finecap.config import DecodeConfig, VllmConfig  # noqa: E402
from finecap.engines.vllm import VllmEngine  # noqa: E402
from finecap.models.presets import save_tiny_vlm  # noqa: E402
from finecap.models.vlm import Vlm  # noqa: E402
from helpers.vlm import images  # noqa: E402

pytestmark = pytest.mark.slow

NO_TORCHVISION = ("vLLM's LLaVA and Qwen2-VL import torchvision, which is not installed (PyPI has no CPU build of it; "
                  "these families run on GPU machines)")  # fmt: skip


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
def test_greedy_captions_are_token_identical(family, tmp_path):
    if importlib.util.find_spec("torchvision") is None:
        pytest.skip(NO_TORCHVISION)
    folder = save_tiny_vlm(tmp_path / family, family, std=0.1, hidden=64, heads=2, kv_heads=1)
    served_as_decoded(Vlm.from_pretrained(folder).eval(), images(4))


def test_the_family_rows_name_what_vllms_own_registry_serves():
    """Each family row's ``vllm`` is its transformers class where vLLM's ``ModelRegistry`` has that architecture,
    else empty (docs/vlm.md's table shows it)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
    from vllm import ModelRegistry

    from finecap.models.vlm import FAMILIES

    served = set(ModelRegistry.get_supported_archs())
    for model_type, family in FAMILIES.items():
        architecture = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES[model_type]
        assert family.vllm == (architecture if architecture in served else ""), model_type
    assert any(not f.vllm for f in FAMILIES.values())  # the refusal below has a family to refuse


def test_a_family_vllms_registry_lacks_is_refused_by_name_at_start(monkeypatch):
    """``decode.engine=vllm`` on a family vLLM has no implementation of (Idefics2): one line naming the architecture
    and vLLM's registry, before the captioner is saved for vLLM or an engine starts."""
    from finecap.config import ConfigError
    from finecap.engines import vllm as engines_vllm
    from helpers.vlm_families import tiny_family

    model, processor = tiny_family("idefics2")
    captioner = Vlm(model, processor, source="tiny-idefics2")
    saved = []
    monkeypatch.setattr(engines_vllm, "save_engine_folder", lambda *a: saved.append(a))
    with pytest.raises(ConfigError) as e:
        VllmEngine.from_captioner(captioner, VllmConfig(max_model_len=128))
    message = str(e.value)
    assert message.startswith("decode.engine=vllm: vlm.name=tiny-idefics2: Idefics2ForConditionalGeneration")
    assert "model registry; it generates with decode.engine=finecap" in message and "\n" not in message
    assert e.value.key == "decode.engine" and saved == []


def test_heads_vllms_cpu_attention_lacks_are_refused_in_one_line_before_it_starts(tmp_path):
    """save_tiny_vlm's default width (2 heads of 16) on vLLM's own CPU attention: one line naming the head width
    (vLLM's refusal, once the engine is half built, is a 60-line traceback)."""
    from vllm.platforms import current_platform

    from finecap.config import ConfigError

    if not current_platform.is_cpu():
        pytest.skip("vLLM runs on a GPU here: the CPU attention's head sizes do not apply")
    captioner = Vlm.from_pretrained(save_tiny_vlm(tmp_path / "narrow", "idefics3"))
    with pytest.raises(ConfigError) as e:
        VllmEngine.from_captioner(captioner, VllmConfig(max_model_len=128, kv_cache_memory_bytes=2**28))
    message = str(e.value)
    assert "attention heads are 16 wide" in message and "32, 64" in message and "\n" not in message


def test_the_runs_processor_options_reach_vllms_processor(tmp_path):
    """``vlm.processor_kwargs`` (and what ``vlm.image_max_pixels`` maps to) are every processor call's options in
    finecap; vLLM's processor gets them too (``mm_processor_kwargs``): Idefics3 with image splitting turned on reads
    a 32 px image as 2 x 2 crops of 16 px plus the whole image, 20 image tokens where its saved processor gives 4, in
    finecap's prompt and vLLM's alike, and the greedy captions are token-identical."""
    from PIL import Image

    from finecap.config import VlmBackboneConfig

    folder = save_tiny_vlm(tmp_path / "idefics3", "idefics3", std=0.1, hidden=64, heads=2, kv_heads=1)
    options = {"do_image_splitting": True, "size": {"longest_edge": 32}}
    captioner = Vlm.from_pretrained(folder, section=VlmBackboneConfig(processor_kwargs=options)).eval()
    g = torch.Generator().manual_seed(0)
    ims = [Image.fromarray((torch.rand(32, 32, 3, generator=g) * 255).byte().numpy()) for _ in range(3)]
    batch = captioner.encoder.preprocess(ims)
    assert int((batch["prompt_ids"][0] == captioner.image_token_id).sum()) == 20
    cfg = DecodeConfig(max_length=8)
    engine = VllmEngine.from_captioner(captioner, VllmConfig(max_model_len=128, kv_cache_memory_bytes=2**28))
    try:
        request = {"prompt": engine.prompt_text, "multi_modal_data": {"image": ims[0]}}
        sent = engine.llm.generate([request], use_tqdm=False)[0].prompt_token_ids
        theirs = engine.generate_images(ims, cfg)
    finally:
        engine.close()
    assert sent == batch["prompt_ids"][0].tolist()
    ours = captioner.generate(batch, cfg)
    assert torch.equal(theirs.sequences, ours.sequences)
    torch.testing.assert_close(theirs.token_logprobs, ours.token_logprobs, atol=1e-5, rtol=0)
