"""A checkpoint's whole-model adapter (``model/adapter/``, :func:`finecap.models.lora.save_whole_adapter`) served by
vLLM's own LoRA loading on the original base model, as docs/caption.md says a user can: ``LLM(base,
enable_lora=True)`` and a ``LoRARequest`` naming the folder give finecap's greedy captions of the adapted captioner
token for token (float32, the tiny Idefics3 of tests/engines/conftest.py, LoRA on its language model, the projector
frozen), and the base's own without it. An adapter carrying the trained projector (peft's ``modules_to_save``, what
``vlm.train_projector=true`` writes) is refused by vLLM's reading of its configuration, as the page says."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch

from helpers.vllm_engines import NOT_HERE, tiny_captioner

pytest.importorskip("vllm", reason=NOT_HERE)

from finecap.config import DecodeConfig, VllmConfig  # noqa: E402
from finecap.config.sections.backbones import VlmBackboneConfig  # noqa: E402
from finecap.engines.vllm import served_prompt, shutdown_llm, start_llm  # noqa: E402
from finecap.models.base import module_path  # noqa: E402
from finecap.models.vlm import Vlm  # noqa: E402
from helpers.adapters import adapted as with_adapters  # noqa: E402
from helpers.vlm import images  # noqa: E402

pytestmark = pytest.mark.slow

IMAGES = images(4)
GREEDY = DecodeConfig(strategy="greedy", max_length=12)


def adapted(base, train_projector: bool) -> Vlm:
    """The captioner of the base folder with LoRA on its language model, B drawn at random (the adapters change its
    captions); with ``train_projector`` its projector moved too (a fully trained module of the adapter)."""
    model = Vlm.from_pretrained(base, section=VlmBackboneConfig(train_projector=train_projector))
    projector = module_path(model.model, model.family.projector) if train_projector else None
    return with_adapters(model, projector, parts=("lm",))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The base model's folder: the tiny Idefics3 (its EOS row scaled, so some captions stop early) as saved."""
    root = tmp_path_factory.mktemp("lora")
    return tiny_captioner(root / "tiny").save(root / "base")


def served(base, adapter, captioner: Vlm) -> list:
    """vLLM's greedy completions of :data:`IMAGES` on the ``base`` folder, with the peft ``adapter`` folder as a
    ``LoRARequest`` (``None``: the base alone); the captioner gives the prompt and stop tokens."""
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    environment = contextlib.ExitStack()
    llm = start_llm(base, VllmConfig(max_model_len=128, kv_cache_memory_bytes=2**28), dtype="float32", seed=0,
                    environment=environment, enable_lora=True, max_lora_rank=8, max_loras=1,
                    limit_mm_per_prompt={"image": 1})  # fmt: skip
    try:
        prompts = [{"prompt": served_prompt(captioner), "multi_modal_data": {"image": im}} for im in IMAGES]
        params = SamplingParams(temperature=0.0, max_tokens=GREEDY.max_length, ignore_eos=True, logprobs=0,
                                detokenize=False, stop_token_ids=list(captioner.end_token_ids))  # fmt: skip
        request = LoRARequest("run", 1, str(adapter))
        return [
            llm.generate(prompts, params, lora_request=request, use_tqdm=False),
            llm.generate(prompts, params, use_tqdm=False),
        ]
    finally:
        shutdown_llm(llm, environment)


def test_vllm_serves_the_whole_model_adapter_on_the_base_as_finecap_decodes(base, tmp_path):
    model = adapted(base, train_projector=False)
    folder = model.save(tmp_path / "ckpt")
    config = json.loads((folder / "adapter" / "adapter_config.json").read_text())
    assert config["modules_to_save"] is None and config["base_model_name_or_path"] == str(base)
    pixels = model.encoder.preprocess(IMAGES)
    ours = model.generate(pixels, GREEDY)
    plain = Vlm.from_pretrained(base).eval().generate(pixels, GREEDY)
    with_adapter, without = served(base, folder / "adapter", model)
    for row in range(len(IMAGES)):
        n, m = int(ours.lengths[row]), int(plain.lengths[row])
        assert list(with_adapter[row].outputs[0].token_ids) == ours.sequences[row, :n].tolist()
        assert list(without[row].outputs[0].token_ids) == plain.sequences[row, :m].tolist()
        c = with_adapter[row].outputs[0]
        theirs = torch.tensor([c.logprobs[t][tok].logprob for t, tok in enumerate(c.token_ids)])
        torch.testing.assert_close(theirs, ours.token_logprobs[row, :n], atol=1e-5, rtol=0)
    assert ours.sequences.tolist() != plain.sequences.tolist()  # the adapter changes the captions: vLLM applied it


def test_vllm_refuses_an_adapter_carrying_the_trained_projector(base, tmp_path):
    """docs/caption.md: vLLM 0.32 refuses ``modules_to_save`` other than a classifier head's, so a run that trains
    the projector (the default) is served through its merged export instead."""
    from vllm.config.lora import LoRAConfig
    from vllm.lora.peft_helper import PEFTHelper

    folder = adapted(base, train_projector=True).save(tmp_path / "ckpt") / "adapter"
    helper = PEFTHelper.from_local_dir(str(folder), max_position_embeddings=128)
    with pytest.raises(ValueError, match="modules_to_save"):
        helper.validate_legal(LoRAConfig(max_lora_rank=8))
