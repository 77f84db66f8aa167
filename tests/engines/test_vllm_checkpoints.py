"""Checkpoints whose files vLLM reads otherwise than transformers and finecap do, served as finecap's decoder
decodes them (greedy captions token for token, float32, a tiny Idefics3 as tests/engines/conftest.py's): a config
whose text config says the output head is tied to the embeddings while its top level (what transformers reads) says
not, and a tokenizer whose EOS is none of the captioner's end tokens (vLLM stops at it by itself). One engine at a
time in this process (each closed before the next starts)."""

from __future__ import annotations

import json

import pytest
import torch

from helpers.vllm_engines import NOT_HERE, served_as_decoded

pytest.importorskip("vllm", reason=NOT_HERE)

from finecap.models.presets import save_tiny_vlm  # noqa: E402
from finecap.models.vlm import Vlm  # noqa: E402
from helpers.vlm import images  # noqa: E402

pytestmark = pytest.mark.slow

IMAGES = images(4)


def edited_folder(out, file, change):
    """The tiny Idefics3's folder with ``change`` (a function editing a dict in place) made to its JSON ``file``."""
    folder = save_tiny_vlm(out, "idefics3", std=0.1, hidden=64, heads=2, kv_heads=1)
    data = json.loads((folder / file).read_text())
    change(data)
    (folder / file).write_text(json.dumps(data))
    return folder


def test_a_head_tied_by_the_text_config_alone_is_served_untied_as_transformers_loads_it(tmp_path):
    def text_tied(config):
        config["tie_word_embeddings"], config["text_config"]["tie_word_embeddings"] = False, True

    captioner = Vlm.from_pretrained(edited_folder(tmp_path / "vlm", "config.json", text_tied)).eval()
    model = captioner.model
    assert model.lm_head.weight is not model.get_input_embeddings().weight  # transformers reads the top level
    assert not torch.equal(model.lm_head.weight, model.get_input_embeddings().weight)
    served_as_decoded(captioner, IMAGES)


def test_a_tokenizer_eos_that_ends_no_caption_does_not_stop_the_engine(tmp_path):
    def eos_elsewhere(tokenizer):
        tokenizer["eos_token"] = "<mask>"  # the captions end with <end_of_utterance> (the turn end, its stop token)

    captioner = Vlm.from_pretrained(edited_folder(tmp_path / "vlm", "tokenizer_config.json", eos_elsewhere))
    captioner.eval()
    eos = captioner.tokenizer.eos_token_id
    assert eos not in captioner.end_token_ids
    with torch.no_grad():
        captioner.model.lm_head.weight[eos] *= 4  # the model writes the tokenizer's EOS often
    ours = served_as_decoded(captioner, IMAGES)
    assert (ours.sequences[:, :-1] == eos).any()  # written within captions that go on after it
