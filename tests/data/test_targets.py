"""Caption targets' tokenizer ids: EOS required (the message says what needs it), pad falls back to EOS."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from finecap.data.targets import encode_captions, eos_and_pad
from finecap.models.tokenizer import encode_for_clip


def test_pad_falls_back_to_eos():
    assert eos_and_pad(SimpleNamespace(eos_token_id=4, pad_token_id=0), "x") == (4, 0)
    assert eos_and_pad(SimpleNamespace(eos_token_id=4, pad_token_id=None), "x") == (4, 4)  # GPT-2: no pad token


@pytest.mark.parametrize("encode, needed_by", [(encode_captions, "captions need one"),
                                               (encode_for_clip, "CLIP pooling needs one")])  # fmt: skip
def test_a_tokenizer_without_eos_is_refused_saying_what_needs_it(encode, needed_by):
    tokenizer = SimpleNamespace(eos_token_id=None, pad_token_id=0)
    with pytest.raises(ValueError, match=f"SimpleNamespace has no EOS token; {needed_by}"):
        encode(tokenizer, ["a red circle"], 8)


def test_a_captions_end_token_other_than_the_tokenizers_eos_ends_every_target():
    """Gemma 3's captions end with ``<end_of_turn>`` (the captioner's end token), not the tokenizer's ``<eos>``."""
    from finecap.models.tokenizer import world_tokenizer

    tok = world_tokenizer(["a", "red", "circle"])
    end = tok.convert_tokens_to_ids("circle")  # a stand-in end token
    enc = encode_captions(tok, ["a red", "a"], max_tokens=8, eos_token_id=end)
    assert enc["input_ids"].tolist() == [[5, 6, end], [5, end, tok.pad_token_id]]
