"""Word ids from the bytes (finecap.metrics.word_ids): exactly ``str.split()``, and the n-gram metrics built on them
still equal pycocoevalcap on realistic raw and tokenised text."""

from __future__ import annotations

import contextlib
import io
import random
import sys
from pathlib import Path

import numpy as np
import pytest
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.rouge.rouge import Rouge

from finecap.metrics import word_ids
from finecap.metrics.ngram import counting, ngram_metrics, rouge_l_per_item
from finecap.metrics.ptb_tokenize import ptb_tokenize
from finecap.metrics.word_ids import split_ids
from helpers.scripts import benchmark

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-9


def _coco_like(n_images: int, seed: int) -> tuple[dict[int, list[str]], dict[int, str]]:
    return benchmark("coco_like").generate(n_images, seed)


def _spelled(text: str) -> list[str] | None:
    out = split_ids(text)
    if out is None:
        return None
    ids, words = out
    assert len(set(words)) == len(words)  # one id per word
    assert ids.dtype == np.int64 and (len(ids) == 0 or int(ids.max()) < len(words))
    return [words[i] for i in ids.tolist()]


TRICKY = [
    "",
    " ",
    "a",
    "  a  b\t\tc\nd\re\x0bf\x0cg ",
    "\x1c a\x1db\x1ec\x1fd",  # str.split() also splits on the ASCII information separators
    "abcdefgh abcdefgh abcdefghi abcdefgi abcdefghij",  # 8 / 9 / 10 bytes: the short-key boundary
    "x" * 16 + " " + "x" * 17 + " " + "x" * 16 + " " + "x" * 24 + " " + "x" * 25 + " " + "y" * 300,
    "café cafe café naïve 日本語 日本 日本語の文 über-long-wörd-with-ümlauts-über über-long-wörd-with-ümlauts-übe",
    "a\x01b \x01 c \x7f \x80",
    "emoji 🙂🙂 🙂 🙂🙂",
]


@pytest.mark.parametrize("text", TRICKY)
def test_split_ids_spell_str_split(text):
    assert _spelled(text) == text.split()


def test_split_ids_on_realistic_text():
    refs, preds = _coco_like(300, seed=11)
    raw = [c for caps in refs.values() for c in caps] + list(preds.values())
    for text in [" ".join(raw), " \x01 ".join(raw)]:
        assert _spelled(text) == text.split()
    tokenised = ptb_tokenize(refs)
    text = " ".join(c for caps in tokenised.values() for c in caps)
    assert _spelled(text) == text.split()


@pytest.mark.parametrize("text", [*TRICKY, "a b", "a  b", " a b", "a b ", "a\tb", "ab", "a b c d", "é b", "a\x01b c"])
def test_single_spaced_stat_is_split_on_a_space(text):
    # the n-gram metrics reuse the word ids for ROUGE-L (split(" ")) only when they are also its words
    stats: dict = {}
    declined = _declined(text, split_ids(text, stats))
    assert declined or stats["single_spaced"] == (text != "" and text.split(" ") == text.split()), repr(text)


def _declined(text: str, result) -> bool:
    """Whether ``split_ids`` returned None, checked to be for the reasons it documents (a NUL, a non-ASCII space;
    no hash collision happens in these short texts), so a test may leave out the stats it did not compute."""
    documented = "\x00" in text or any(c.isspace() and not c.isascii() for c in text)
    assert (result is None) == documented, repr(text)
    return documented


def test_split_ids_random_bytes_level_text():
    rng = random.Random(0)
    alphabet = "ab \t\n\x1c\x1fé日🙂.,'" + "c" * 5
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 60)))
        assert _spelled(text) == text.split(), repr(text)
        stats: dict = {}
        declined = _declined(text, split_ids(text, stats))
        assert declined or stats["single_spaced"] == (text != "" and text.split(" ") == text.split()), repr(text)


def test_split_ids_declines_non_ascii_whitespace_and_nul():
    assert split_ids("a\xa0b") is None  # NO-BREAK SPACE: str.split() splits there, the byte table would not
    assert split_ids("a\u3000b") is None
    assert split_ids("a\x00b") is None  # zero bytes would make short keys ambiguous
    # the module's list holds every non-ASCII whitespace character there is (none lies above U+3000)
    every = tuple(chr(c) for c in range(128, sys.maxunicode + 1) if chr(c).isspace())
    assert every == word_ids._NON_ASCII_WS


def test_split_ids_hash_collision_falls_back(monkeypatch):
    monkeypatch.setattr(word_ids, "_MUL", np.uint64(0))  # every token hashes to 0: the exactness check must fail
    assert split_ids("a b a") is None
    assert split_ids("a a a") is not None  # one word: no collision, still right
    # the metrics then take the str.split path and stay right
    vocab, words, lengths = counting.encode(["a b", "c a b"])
    inv = {i: w for w, i in vocab.items()}
    assert [inv[i] for i in words.tolist()] == ["a", "b", "c", "a", "b"] and lengths.tolist() == [2, 3]


def test_encode_new_vocabulary_equals_dict_path():
    refs, preds = _coco_like(50, seed=4)
    sentences = [c for caps in refs.values() for c in caps] + list(preds.values()) + ["", "  a  b ", "x\ty"]
    vocab, words, lengths = counting.encode(sentences)
    inv = {i: w for w, i in vocab.items()}
    flat = [w for s in sentences for w in s.split()]
    assert [inv[i] for i in words.tolist()] == flat
    assert lengths.tolist() == [len(s.split()) for s in sentences]


@pytest.mark.parametrize(
    "sentences",
    [["a b", "c d e", "b a"], ["a  b", "c"], ["a b", ""], [" a", "b"], ["a\tb c"], ["a\xa0b c"], [""], ["日本 語 ok"]],
)
def test_encode_space_separated_spells_split_space(sentences):
    """ROUGE-L's ``split(" ")`` words: from the bytes when single-spaced, else through ``str.split(" ")``."""
    vocab, words, lengths = counting.encode(sentences, sep=" ")
    inv = {i: w for w, i in vocab.items()}
    assert [inv[i] for i in words.tolist()] == [w for s in sentences for w in s.split(" ")]
    assert lengths.tolist() == [len(s.split(" ")) for s in sentences]


@pytest.mark.parametrize(
    "sentences, expected",
    [
        (["a b", "c d e"], True),
        (["a  b", "c"], False),
        (["a b", ""], False),
        ([" a", "b"], False),
        (["a", "b "], False),
        (["a\tb"], False),
        ([""], False),
    ],
)
def test_space_split_flag(sentences, expected):
    flags: dict = {}
    counting.encode(sentences, flags=flags)
    assert flags["space_split"] is expected
    assert expected == all(s.split(" ") == s.split() for s in sentences)


def _pycoco(preds: dict, refs: dict) -> dict[str, float]:
    gts, res = {i: refs[i] for i in preds}, {i: [preds[i]] for i in preds}
    with contextlib.redirect_stdout(io.StringIO()):
        b, _ = Bleu(4).compute_score(gts, res)
        r, _ = Rouge().compute_score(gts, res)
        c, _ = Cider().compute_score(gts, res)
    return {**{f"BLEU-{k + 1}": b[k] for k in range(4)}, "ROUGE-L": r, "CIDEr-D": c}


def test_metrics_equal_pycocoevalcap_on_realistic_tokenised_text():
    refs_raw, preds_raw = _coco_like(120, seed=21)
    refs = ptb_tokenize(refs_raw)
    preds = {i: c[0] for i, c in ptb_tokenize({i: [c] for i, c in preds_raw.items()}).items()}
    ours, _ = ngram_metrics(preds, refs)
    expected = _pycoco(preds, refs)
    assert max(abs(ours[k] - expected[k]) for k in expected) <= TOL
    assert abs(rouge_l_per_item(preds, refs)[0]["ROUGE-L"] - expected["ROUGE-L"]) <= TOL  # its own encoding


def test_metrics_equal_pycocoevalcap_on_raw_text_with_long_and_unicode_words():
    """Untokenised captions (capitals, punctuation glued to words, words of 9-40 bytes, non-ASCII letters, tabs and
    double spaces, which make ROUGE-L's ``split(" ")`` differ from ``split()``)."""
    refs, preds = _coco_like(80, seed=9)
    rng = random.Random(3)
    extra = ["über-naïve", "refrigerator-and-skateboard", "日本語のテキスト", "motorcycles", "a" * 40]
    refs = {i: [c + " " + rng.choice(extra) for c in caps] for i, caps in refs.items()}
    preds = {i: rng.choice(extra) + " " + c for i, c in preds.items()}
    ours, _ = ngram_metrics(preds, refs)
    expected = _pycoco(preds, refs)
    assert max(abs(ours[k] - expected[k]) for k in expected) <= TOL
    assert abs(rouge_l_per_item(preds, refs)[0]["ROUGE-L"] - expected["ROUGE-L"]) <= TOL
    preds[next(iter(preds))] += "\tend  two"  # now split(" ") != split(): ROUGE-L takes the str.split(" ") path
    ours, _ = ngram_metrics(preds, refs)
    expected = _pycoco(preds, refs)
    assert max(abs(ours[k] - expected[k]) for k in expected) <= TOL
