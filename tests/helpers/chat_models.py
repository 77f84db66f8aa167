"""A tiny Llama chat model for boost's in-process backends (``transformers``, ``vllm``), built from a config with
random weights and saved as a Hub checkpoint would be: the world tokenizer with the chat roles' words and a chat
template of its own, nothing downloaded."""

from __future__ import annotations

from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} <eos>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def save_chat_lm(out: Path, *, hidden: int = 32, heads: int = 4, kv_heads: int = 2, seed: int = 0,
                 std: float = 0.0) -> Path:  # fmt: skip
    """A 2-layer Llama chat model of width ``hidden`` (``hidden / heads`` per head) saved into ``out``; ``std > 0``
    redraws every weight matrix from ``N(0, std)`` (at the initial 0.02 the answers barely depend on the prompt)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from finecap.models.tokenizer import world_tokenizer
    from finecap.world.captions import vocabulary

    tok = world_tokenizer(vocabulary() + ["<system>", "<user>", "<assistant>", "here", "are", "descriptions"])
    tok.chat_template = CHAT_TEMPLATE
    tok.model_max_length = 512
    tok.save_pretrained(out)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
                         pad_token_id=0, bos_token_id=3, eos_token_id=4)  # fmt: skip
    model = LlamaForCausalLM(config)
    if std > 0:
        with torch.no_grad():
            for p in model.parameters():
                if p.ndim == 2:
                    p.normal_(0.0, std)
    model.save_pretrained(out)
    return out
