"""Thinking-variant chat templates, real ones (tests/models/chat_templates/, sources in its README.md) set on the tiny
random models of the family contract (tests/helpers/vlm_families.py): the prompt finecap builds, where its loss
starts, and whether finecap and the template agree on the whole conversation ``[user, assistant(caption)]``.

- Qwen3-VL-Thinking: the generation prompt opens ``<think>\\n`` and the template writes ``\\n</think>\\n\\n`` before
  every final answer; finecap's prompt ends with that empty block closed, so a caption is trained and decoded as the
  answer (its first label is the caption's first word, after ``</think>``), not as the model's reasoning.
- Qwen3-VL-Instruct: no reasoning block; the prompt is the template's generation prompt unchanged.
- GLM-4.1V-Thinking: the template prints an assistant's ``content`` as it is (a string; a list of parts would be its
  Python repr) and writes no reasoning block: the model's own ``<think>``/``<answer>`` format is not in it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from finecap.data.targets import IGNORE_INDEX
from finecap.models.vlm import ANSWER_MARKER, REASONING_TAGS, Vlm, answer_context
from helpers.vlm import batch_of
from helpers.vlm_families import tiny_family

TEMPLATES = Path(__file__).parent / "chat_templates"
CAPTION = "a red circle on the left of a big blue square"
FAMILY = {"qwen3-vl-thinking": "qwen3_vl", "qwen3-vl-instruct": "qwen3_vl", "glm-4.1v-9b-thinking": "glm4v"}


def real(name: str) -> Vlm:
    """The tiny model of the template's family with the real template ``name`` and the reasoning tags as tokens
    (Qwen3's tokenizer holds ``<think>`` and ``</think>`` as added tokens; the tiny world tokenizer would read them
    as unknown)."""
    model, processor = tiny_family(FAMILY[name])
    processor.chat_template = (TEMPLATES / f"{name}.jinja").read_text()
    processor.tokenizer.add_tokens(list(REASONING_TAGS))
    model.resize_token_embeddings(len(processor.tokenizer))
    return Vlm(model, processor, source=name).eval()


def user_turn(vlm: Vlm) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": vlm.section.prompt}]}]


def rendered(vlm: Vlm, answer: str | None = None, **options) -> str:
    turns = user_turn(vlm) + ([{"role": "assistant", "content": answer}] if answer is not None else [])
    return vlm.processor.apply_chat_template(turns, tokenize=False, **options)


def test_qwen3_vl_thinking_prompt_closes_the_empty_reasoning_block():
    vlm = real("qwen3-vl-thinking")
    generation = rendered(vlm, add_generation_prompt=True)
    assert generation.endswith("<|im_start|>assistant\n<think>\n")  # the template's own generation prompt
    assert vlm.prompt_text == generation + "\n</think>\n\n"
    # the template's rendering of the conversation with the caption as the answer: finecap's prompt, the caption and
    # the turn end, nothing between
    assert rendered(vlm, CAPTION) == vlm.prompt_text + CAPTION + "<|im_end|>\n"
    assert answer_context(vlm.processor, user_turn(vlm), vlm.prompt_text) == ("", "<|im_end|>\n")


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_the_loss_starts_at_the_caption_and_the_tokens_are_the_templates(name):
    """The template's rendering of ``[user, assistant(caption)]`` is finecap's prompt, the caption and the turn's end,
    and its tokens are the prompt's, the caption labels' (the collated batch: the caption's tokens, then its end
    token) and the end's, which starts with the caption's end token where the template writes one (GLM-4.1V's writes
    none: the model's stop tokens end its turn). For Qwen3-VL-Thinking the prompt's last token is ``</think>``."""
    vlm = real(name)
    tok = vlm.tokenizer

    def ids(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])

    labels = [t for t in batch_of(vlm, [CAPTION])["labels"][0].tolist() if t != IGNORE_INDEX]
    assert labels == [*ids(vlm.caption_prefix + CAPTION), vlm.eos_token_id]
    whole = rendered(vlm, CAPTION)
    assert whole.startswith(vlm.prompt_text + CAPTION)
    after = whole[len(vlm.prompt_text + CAPTION) :]
    assert ids(whole) == ids(vlm.prompt_text) + labels[:-1] + ids(after)
    assert ids(after)[:1] == ([vlm.eos_token_id] if after else [])
    if name == "qwen3-vl-thinking":
        assert tok.convert_ids_to_tokens(ids(vlm.prompt_text))[-1] == "</think>"


def test_instruct_and_glm_prompts_are_the_templates_generation_prompts():
    for name in ("qwen3-vl-instruct", "glm-4.1v-9b-thinking"):
        vlm = real(name)
        assert vlm.prompt_text == rendered(vlm, add_generation_prompt=True), name
        assert REASONING_TAGS[0] not in vlm.prompt_text


def test_glm41v_answer_context_reads_the_answer_as_plain_text():
    """GLM-4.1V's template prints an assistant's ``content`` as it is: read as a list of text parts, the answer
    would be framed by its Python repr (``[{'type': 'text', 'text': '`` before it), which is no text of the chat
    format. Read as text, the answer follows the generation prompt directly and nothing follows it (the model's
    stop tokens end its turn)."""
    vlm = real("glm-4.1v-9b-thinking")
    assert answer_context(vlm.processor, user_turn(vlm), vlm.prompt_text) == ("", "")
    assert rendered(vlm, ANSWER_MARKER) == vlm.prompt_text + ANSWER_MARKER
