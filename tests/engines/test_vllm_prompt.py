"""What ``decode.engine=vllm`` sends vLLM for a captioner, checked without vLLM (these run in every venv): the prompt
text (:func:`finecap.engines.vllm.served_prompt`) that vLLM's processor call, which adds the tokenizer's special
tokens, reads into finecap's prompt ids: one BOS where the chat template writes it and the tokenizer adds one too
(Gemma 3), the rendered prompt unchanged elsewhere."""

from __future__ import annotations

import pytest
import torch

from finecap.engines.vllm import served_prompt
from finecap.models.vlm import Vlm
from helpers.vlm import images
from helpers.vlm_families import tiny_family


@pytest.mark.parametrize("family", ["gemma3", "qwen2_vl", "idefics3", "llava"])
def test_vllm_reads_the_served_prompt_into_finecaps_prompt_ids(family):
    model, processor = tiny_family(family)
    vlm = Vlm(model, processor, source=family)
    image = images(1)[0]
    sent = processor(text=[served_prompt(vlm)], images=[[image]], return_tensors="pt")["input_ids"]  # (1, P)
    assert torch.equal(sent, vlm.encoder.preprocess([image])["prompt_ids"])
    assert (served_prompt(vlm) == vlm.prompt_text) == (family != "gemma3")
