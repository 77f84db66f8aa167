"""The world tokenizer: fixed special ids, word-level round trips, save/load, caption and CLIP encodings."""

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, CLIPTextConfig, CLIPTextModel, PreTrainedTokenizerFast

from finecap.data.targets import encode_captions
from finecap.models.tokenizer import (
    BOS_ID,
    EOS_ID,
    MASK_ID,
    PAD_ID,
    UNK_ID,
    encode_for_clip,
    ensure_pad_token,
    world_tokenizer,
)
from finecap.world.captions import vocabulary

VOCAB = ["a", "red", "circle", "on", "grass"]  # ids 5..9


def test_special_ids_are_fixed_and_eos_is_not_2():
    tok = world_tokenizer(VOCAB)
    ids = (tok.pad_token_id, tok.unk_token_id, tok.mask_token_id, tok.bos_token_id, tok.eos_token_id)
    assert ids == (0, 1, 2, 3, 4)
    assert (PAD_ID, UNK_ID, MASK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3, 4)
    assert tok.eos_token_id != 2  # transformers' CLIP text tower uses legacy argmax pooling when eos == 2
    assert len(tok) == 5 + len(VOCAB)
    assert tok.convert_tokens_to_ids(VOCAB) == [5, 6, 7, 8, 9]


def test_default_vocabulary_is_the_world_vocabulary():
    tok = world_tokenizer()
    words = vocabulary()
    assert len(tok) == 5 + len(words)
    assert tok.convert_tokens_to_ids(words) == list(range(5, 5 + len(words)))


def test_encode_decode_round_trip_unknowns_and_punctuation():
    tok = world_tokenizer(VOCAB)
    assert tok("a red circle on grass")["input_ids"] == [5, 6, 7, 8, 9, EOS_ID]  # EOS appended like CLIP's
    assert tok("A Red  circle", add_special_tokens=False)["input_ids"] == [5, 6, 7]  # lower-cased, spaces collapse
    assert tok("a blue circle.", add_special_tokens=False)["input_ids"] == [5, UNK_ID, 7, UNK_ID]
    assert tok.decode([5, 6, 7, EOS_ID, PAD_ID, PAD_ID], skip_special_tokens=True) == "a red circle"


def test_save_and_reload_with_autotokenizer(tmp_path):
    tok = world_tokenizer(VOCAB)
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again("red circle on grass")["input_ids"] == tok("red circle on grass")["input_ids"] == [6, 7, 8, 9, 4]
    assert (again.pad_token_id, again.bos_token_id, again.eos_token_id) == (0, 3, 4)
    assert again.decode([5, 6, 4], skip_special_tokens=True) == "a red"


def test_encode_captions_truncates_appends_eos_and_pads():
    tok = world_tokenizer(VOCAB)
    enc = encode_captions(tok, ["a red circle on grass", "circle"], max_tokens=4)
    # first caption cut to max_tokens - 1 = 3 words + EOS; second padded with <pad>=0
    assert enc["input_ids"].tolist() == [[5, 6, 7, 4], [7, 4, 0, 0]]
    assert enc["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]


def _gpt2_like_tokenizer():
    """A word-level tokenizer configured like GPT-2's: no pad token, EOS not appended automatically."""
    backend = Tokenizer(models.WordLevel({"<|endoftext|>": 0, "a": 1, "cat": 2}, unk_token="<|endoftext|>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>", unk_token="<|endoftext|>")


def test_encode_captions_for_a_tokenizer_without_pad_token():
    tok = _gpt2_like_tokenizer()
    assert tok.pad_token_id is None
    enc = encode_captions(tok, ["a cat", "cat"], max_tokens=8)
    assert enc["input_ids"].tolist() == [[1, 2, 0], [2, 0, 0]]  # EOS (0) appended, padded with EOS
    assert enc["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    ensure_pad_token(tok)
    assert tok.pad_token_id == tok.eos_token_id == 0


def test_encode_for_clip_keeps_a_single_final_eos():
    tok = world_tokenizer(VOCAB)
    enc = encode_for_clip(tok, ["a red circle on grass", "red"], max_length=4)
    assert enc["input_ids"].tolist() == [[5, 6, 7, 4], [6, 4, 0, 0]]  # truncated text still ends with EOS
    gpt = _gpt2_like_tokenizer()
    assert encode_for_clip(gpt, ["a cat"], max_length=8)["input_ids"].tolist() == [[1, 2, 0]]  # EOS appended


def test_clip_text_tower_pools_at_the_world_eos():
    tok = world_tokenizer(VOCAB)
    cfg = CLIPTextConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=16, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)  # fmt: skip
    torch.manual_seed(0)
    model = CLIPTextModel(cfg).eval()
    enc = encode_for_clip(tok, ["a red circle", "grass"], max_length=8)
    with torch.no_grad():
        out = model(**enc)
    eos_pos = [3, 1]  # a red circle <eos> | grass <eos>
    assert torch.allclose(out.pooler_output, out.last_hidden_state[torch.arange(2), eos_pos])
