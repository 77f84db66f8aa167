"""Caption targets' tokenizer ids: EOS required (the message says what needs it), pad falls back to EOS."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from finecap.data.targets import CutCaptions, cut_captions, encode_captions, eos_and_pad
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


def test_cut_captions_by_hand():
    # max_tokens=8 keeps 7 tokens and EOS: of 3, 7, 8, 12 tokens, 8 and 12 are cut (2 of 4); 7 fits exactly
    # the shortest 99 % of 4 captions: ceil(3.96) = 4, all of them: the 12-token one needs 12 + EOS = 13
    assert cut_captions([12, 7, 3, 8], max_tokens=8) == CutCaptions(share=0.5, longest=12, fits=13)
    # the shortest 75 %: ceil(3.0) = 3, the third shortest (8 tokens) needs 9, which cuts 1 of 4 (the 12)
    assert cut_captions([12, 7, 3, 8], max_tokens=8, keep=0.75) == CutCaptions(0.5, 12, 9)
    assert cut_captions([12, 7, 3, 8], max_tokens=9, keep=0.75).share == 0.25
    assert cut_captions([1, 1], max_tokens=1) == CutCaptions(1.0, 1, 2)  # max_tokens=1: EOS alone, every word cut
    assert cut_captions([], max_tokens=8) == CutCaptions(0.0, 0, 1)


# A caption's text is text (docs/data.md#special-token-text-in-captions): a special token's string in a caption is
# tokenised as its characters, so the only end token of a target is the one appended, and no image slot is in it.
SIGN = "a sign reading {} on a wall"


def gpt2_tokenizer():
    """GPT-2's kind (ClipCap's language model): byte-level BPE whose EOS is ``<|endoftext|>``."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2TokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([SIGN.format("red"), "a red circle"] * 3, vocab_size=300, min_frequency=1,
                            special_tokens=["<|endoftext|>"])  # fmt: skip
    end = "<|endoftext|>"
    return GPT2TokenizerFast(tokenizer_object=bpe._tokenizer, bos_token=end, eos_token=end, unk_token=end)


def bert_tokenizer():
    """BLIP's kind: BERT's WordPiece, lower-casing; captions end with ``[SEP]`` (:mod:`finecap.models.blip`)."""
    from transformers import BertTokenizer

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "sign", "reading", "on", "wall", "[", "]", "sep",
             "cl", "##s", "mask"]  # fmt: skip
    tok = BertTokenizer(vocab={w: i for i, w in enumerate(words)})
    tok.eos_token = "[SEP]"
    return tok


def byt5_tokenizer():
    """A Python (slow) tokenizer, transformers' ``PythonBackend``, which needs no file: ByT5's bytes, ``</s>`` its
    EOS. Its ``split_special_tokens`` is read by ``PythonBackend.tokenize``, not by the ``tokenizers`` library."""
    from transformers import ByT5Tokenizer

    return ByT5Tokenizer()


@pytest.mark.parametrize("make, special", [(gpt2_tokenizer, "<|endoftext|>"), (bert_tokenizer, "[SEP] [CLS] [MASK]"),
                                           (byt5_tokenizer, "</s> <pad> <unk>")],
                         ids=["gpt2", "blip", "byt5-python"])  # fmt: skip
def test_a_special_tokens_text_in_a_caption_is_text(make, special):
    tok = make()
    caption = SIGN.format(special)
    row = encode_captions(tok, [caption], max_tokens=64)["input_ids"][0].tolist()
    # Before: the caption's "<|endoftext|>" (GPT-2's EOS) and "[SEP]" (BLIP's) were that token, a caption end inside
    # the target, and "[CLS]" / "[MASK]" BERT's.
    specials = set(tok.all_special_ids)
    assert row[-1] == tok.eos_token_id and not specials & set(row[:-1]), tok.convert_ids_to_tokens(row)
    assert tok.decode(row[:-1]).replace(" ", "") == caption.lower().replace(" ", "")  # the characters, all of them
    plain = SIGN.format("red")  # a caption without such text: the ids it always had
    want = tok(plain, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert encode_captions(tok, [plain], 64)["input_ids"][0].tolist() == want


@pytest.mark.parametrize("family", ["llava", "qwen2_vl", "gemma3"])
def test_a_vlm_target_holds_no_turn_end_or_image_slot_from_the_captions_text(family):
    """LLaVA (``<image>``, ``<eos>``), Qwen2-VL (ChatML: ``<|im_end|>`` ends a caption, ``<|image_pad|>``), Gemma 3
    (``<end_of_turn>``, ``<start_of_image>``): a caption holding the text of every special token of its family gets
    a training target (the collator's labels, after the captioner's ``caption_prefix``) whose only special token is
    the turn end finecap appends."""
    from finecap.data.datasets import model_collator
    from finecap.models.vlm import Vlm
    from helpers.vlm import images
    from helpers.vlm_families import tiny_family

    model, processor = tiny_family(family)
    vlm = Vlm(model, processor, source="tiny")
    tok = vlm.tokenizer
    caption = SIGN.format(" ".join(tok.all_special_tokens))
    item = {"caption": caption, "image": images(1)[0], "image_id": 0, "references": [caption], "index": 0}
    labels = model_collator(vlm, 64)([item])["labels"][0].tolist()
    # The world tokenizer reads "<|im_end|>" as "<|", "im_end", "|>": unknown words, the only special id allowed.
    specials = set(tok.all_special_ids) - {tok.unk_token_id}
    inside = [tok.convert_ids_to_tokens(t) for t in labels[:-1] if t in specials]
    assert labels[-1] == vlm.eos_token_id and not inside, inside


def test_text_ids_reads_the_special_tokens_text_as_words():
    from finecap.data.targets import text_ids
    from finecap.models.tokenizer import world_tokenizer

    tok = world_tokenizer(["a", "red", "eos"])  # ids 5, 6, 7
    assert text_ids(tok, ["a red <eos>", "a red"]) == [[5, 6, 1, 7, 1], [5, 6]]  # "<", "eos", ">": "<" unknown
