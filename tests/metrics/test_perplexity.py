"""Perplexity under a causal LM: a tiny GPT-2 saved to disk with a word-level tokenizer, checked by hand."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from finecap.metrics.perplexity import Perplexity, perplexity

WORDS = ["a", "red", "circle", "blue", "square"]


def make_tokenizer(bos: bool = True, eos: bool = True, post_eos: bool = False) -> PreTrainedTokenizerFast:
    """Word-level: <pad>=0 <unk>=1 <bos>=2 <eos>=3, words from 4 on (a=4 red=5 circle=6 blue=7 square=8)."""
    vocab = {w: i for i, w in enumerate(["<pad>", "<unk>", "<bos>", "<eos>", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if post_eos:  # a post-processor that appends <eos> by itself (like the world tokenizer): must not double up
        backend.post_processor = processors.TemplateProcessing(single="$A <eos>", special_tokens=[("<eos>", 3)])
    specials = {"pad_token": "<pad>", "unk_token": "<unk>"}
    if bos:
        specials["bos_token"] = "<bos>"
    if eos:
        specials["eos_token"] = "<eos>"
    return PreTrainedTokenizerFast(tokenizer_object=backend, **specials)


def make_model(n_positions: int = 16) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=4 + len(WORDS), n_positions=n_positions, n_embd=16, n_layer=1, n_head=2,
                     bos_token_id=2, eos_token_id=3, pad_token_id=0)  # fmt: skip
    return GPT2LMHeadModel(cfg).eval()


def manual_nll(model: GPT2LMHeadModel, ids: list[int]) -> tuple[float, int]:
    """Summed NLL of ids[1:] given the prefix, from one unpadded forward pass."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0]  # (T, V)
    logp = F.log_softmax(logits, dim=-1)
    return -sum(float(logp[t, ids[t + 1]]) for t in range(len(ids) - 1)), len(ids) - 1


@pytest.fixture
def saved(tmp_path):
    model, tok = make_model(), make_tokenizer(post_eos=True)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    return tmp_path, model


def test_matches_manual_computation_from_logits(saved):
    path, model = saved
    captions = {1: "a red circle", 2: "blue square", 3: "a"}
    out = Perplexity(str(path), batch_size=2)(captions)  # two batches, the first padded
    # Sequences: <bos> caption <eos>: [2,4,5,6,3], [2,7,8,3], [2,4,3] -> 4 + 3 + 2 = 9 predicted tokens.
    seqs = [[2, 4, 5, 6, 3], [2, 7, 8, 3], [2, 4, 3]]
    parts = [manual_nll(model, s) for s in seqs]
    total_nll, total_tokens = sum(p[0] for p in parts), sum(p[1] for p in parts)
    assert total_tokens == 9 and out["perplexity/tokens"] == 9.0
    assert out["perplexity/nll"] == pytest.approx(total_nll / 9, rel=1e-5)
    assert out["perplexity"] == pytest.approx(math.exp(total_nll / 9), rel=1e-5)
    per = Perplexity(str(path)).per_item(captions)
    assert per[2] == pytest.approx(math.exp(parts[1][0] / 3), rel=1e-5)


def test_uniform_model_has_perplexity_vocab_size():
    # All weights zero -> final layer norm outputs 0 -> logits 0 -> uniform over V = 9 tokens: NLL = ln 9 per token,
    # perplexity exactly 9 whatever the captions.
    model = make_model()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    out = perplexity(["a red circle", "square", ""], model, make_tokenizer())
    assert out["perplexity"] == pytest.approx(9.0, rel=1e-6)
    # tokens: (3 + 1) + (1 + 1) + (0 + 1) = 7 (the empty caption still predicts EOS)
    assert out["perplexity/tokens"] == 7.0


def test_gpt2_style_tokenizer_uses_eos_as_start():
    # bos_token unset: the start token falls back to eos (GPT-2: bos == eos == <|endoftext|>).
    tok = make_tokenizer(bos=False)
    ppl = Perplexity(make_model(), tok)
    assert ppl.encode(["a red"]) == [[3, 4, 5, 3]]


def test_a_captions_eos_text_is_text():
    # "red<eos>" is one word of the whitespace split: unknown (1). Before, "<eos>" was the EOS token, predicted
    # inside the caption and again at its end: [3, 4, 5, 3, 3].
    ppl = Perplexity(make_model(), make_tokenizer(bos=False))
    assert ppl.encode(["a red<eos>"]) == [[3, 4, 1, 3]]


def test_without_start_or_eos_the_first_token_is_context():
    tok = make_tokenizer(bos=False, eos=False)
    model = make_model()
    ppl = Perplexity(model, tok, add_eos=False)
    assert ppl.encode(["a red circle"]) == [[4, 5, 6]]
    out = ppl(["a red circle"])
    nll, n = manual_nll(model, [4, 5, 6])  # predicts red and circle only: 2 tokens
    assert out["perplexity/tokens"] == 2.0 == n
    assert out["perplexity"] == pytest.approx(math.exp(nll / 2), rel=1e-5)
    with pytest.raises(ValueError, match="no eos_token_id"):
        Perplexity(model, tok)
    # an empty caption is then no token at all: a batch of such ones made a (B, 0) forward pass, which GPT-2 refuses
    # ("cannot reshape tensor of 0 elements"); it predicts nothing and the other captions' value is unchanged
    one = Perplexity(model, tok, add_eos=False, batch_size=1)
    assert one(["", "a red circle", ""]) == out
    assert math.isnan(one.per_item({1: ""})[1])
    with pytest.raises(ValueError, match="no token to predict"):
        one([""])


def test_batch_size_does_not_change_the_result():
    model, tok = make_model(), make_tokenizer()
    caps = ["a red circle", "square", "a blue square a red circle", "a"]
    one = Perplexity(model, tok, batch_size=1)(caps)["perplexity"]
    many = Perplexity(model, tok, batch_size=4)(caps)["perplexity"]
    assert one == pytest.approx(many, rel=1e-5)


def test_truncation_at_position_limit_is_counted():
    model, tok = make_model(n_positions=4), make_tokenizer()
    out = Perplexity(model, tok)(["a red circle blue", "a"])
    # [2,4,5,6,7,3] is cut to 4 positions -> 3 predicted; [2,4,3] -> 2 predicted
    assert out["perplexity/truncated"] == 1.0
    assert out["perplexity/tokens"] == 5.0


def test_unloadable_model_names_option(tmp_path):
    with pytest.raises(ValueError, match="eval.lm"):
        Perplexity(str(tmp_path / "nope"))
