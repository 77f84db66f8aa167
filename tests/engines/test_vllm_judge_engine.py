"""The ``vllm`` judge on a real ``vllm.LLM`` (``.venv-vllm``; issue 66): a tiny Llama chat LM (random weights, 2
heads of 32 as vLLM's CPU attention takes) asked through the judge's prompts answers, greedy, exactly what
transformers' ``generate`` answers to the same chat prompt, and the same text when asked again (its prefix then
cached), which is why an answer that is no option (random weights) is counted failed at once, never asked again nor
made up."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers.vllm_engines import NOT_HERE

pytest.importorskip("vllm", reason=NOT_HERE)

from finecap.config import load  # noqa: E402
from finecap.judges import get_judge  # noqa: E402
from finecap.judges.base import CANNOT_ANSWER, Ask, JudgeFailed, Question  # noqa: E402
from helpers.chat_models import save_chat_lm  # noqa: E402

pytestmark = pytest.mark.slow

Q = Question("0/color", "What colour is the circle?", ("red", "blue", "green"), "red")
OPTIONS = ("blue", "red", "green", CANNOT_ANSWER)
TOKENS = 8


def test_the_vllm_judge_answers_as_transformers_generates(tmp_path):
    folder = save_chat_lm(tmp_path / "lm", hidden=64, heads=2, kv_heads=1, std=0.1)
    cfg = load(None, ["judge.name=vllm", f"judge.model={folder}", f"judge.max_tokens={TOKENS}",
                      "judge.cache=false", "vllm.max_model_len=512",
                      "vllm.kv_cache_memory_bytes=67108864"])  # fmt: skip
    judge = get_judge("vllm", cfg)
    try:
        options = "\n".join(f"{k}. {o}" for k, o in zip("ABCD", OPTIONS, strict=True))
        messages = judge._messages("answer", caption="a red circle", question=Q.text, cannot_answer=CANNOT_ANSWER,
                                   options=options)  # fmt: skip
        raw = judge._call("raw", ["a red circle"], messages, lambda text: text)
        again = judge._call("raw", ["a red circle"], messages, lambda text: text)  # no cache: asked again
        (answer,) = judge.answer([Ask(Q, OPTIONS, "a red circle")])
    finally:
        judge.close()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=TOKENS, do_sample=False)
    expected = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert raw == expected and again == raw
    # random weights answer no option letter: counted failed, not asked again
    assert isinstance(answer, JudgeFailed) or answer in OPTIONS
    if isinstance(answer, JudgeFailed):
        assert judge.counts["failed"] == 1 and judge.counts["unparsable"] == 1
        assert judge.counts["requests"] == 3  # the two raw asks and the answer's one
