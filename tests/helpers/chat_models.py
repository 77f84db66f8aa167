"""A tiny Llama chat model for boost's in-process backends (``transformers``, ``vllm``), built from a config with
random weights and saved as a Hub checkpoint would be: the world tokenizer with the chat roles' words and a chat
template of its own (or ChatML's, with its special tokens ``<|im_start|>`` and ``<|im_end|>``), nothing
downloaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from finecap.data.targets import text_ids

CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} <eos>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHATML_WORDS = ["system", "user", "assistant", "<|", "|>", "im_start", "im_end"]
"""Words of the ChatML model's vocabulary: its roles, and its special tokens' text read as text (``<|im_end|>``:
``<|``, ``im_end``, ``|>``)."""


def save_chat_lm(out: Path, *, hidden: int = 32, heads: int = 4, kv_heads: int = 2, seed: int = 0,
                 std: float = 0.0, chatml: bool = False, mistral: bool = False) -> Path:  # fmt: skip
    """A 2-layer Llama chat model of width ``hidden`` (``hidden / heads`` per head) saved into ``out``; ``std > 0``
    redraws every weight matrix from ``N(0, std)`` (at the initial 0.02 the answers barely depend on the prompt);
    ``chatml``: ChatML's template and special tokens (:data:`CHATML_TEMPLATE`), ``<|im_end|>`` ending an answer;
    ``mistral``: the same model as a Mistral (``model_type`` ``mistral``, whose tokenizer ``AutoTokenizer`` reads
    with mistral-common where it is installed and the folder holds ``tekken.json``)."""
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    from finecap.models.tokenizer import world_tokenizer
    from finecap.world.captions import vocabulary

    tok = world_tokenizer(vocabulary() + ["<system>", "<user>", "<assistant>", "here", "are", "descriptions"]
                          + (CHATML_WORDS if chatml else []))  # fmt: skip
    tok.chat_template = CHAT_TEMPLATE
    if chatml:
        tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
        tok.eos_token, tok.chat_template = "<|im_end|>", CHATML_TEMPLATE
    tok.model_max_length = 512
    tok.save_pretrained(out)
    torch.manual_seed(seed)
    config_class, model_class = (MistralConfig, MistralForCausalLM) if mistral else (LlamaConfig, LlamaForCausalLM)
    config = config_class(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
                         pad_token_id=0, bos_token_id=3, eos_token_id=tok.eos_token_id)  # fmt: skip
    model = model_class(config)
    if std > 0:
        with torch.no_grad():
            for p in model.parameters():
                if p.ndim == 2:
                    p.normal_(0.0, std)
    model.save_pretrained(out)
    return out


def chatml_ids(tok: Any, messages: Any) -> list[int]:
    """The ids a ChatML prompt of ``messages`` must have, built by hand: each turn ``<|im_start|>``, the role and
    the content as text (the world tokenizer's words), ``<|im_end|>``; then the assistant's turn."""
    start, end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    ids = []
    for m in messages:
        ids += [start, *text_ids(tok, [f"{m['role']}\n{m['content']}"])[0], end]
    return ids + [start, *text_ids(tok, ["assistant\n"])[0]]
