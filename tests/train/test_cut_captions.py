"""Captions longer than ``data.max_tokens`` keeps are cut (their targets end with EOS after ``max_tokens - 1``
tokens, so the captioner learns to stop there): training says so once, with the share, the longest caption and the
``data.max_tokens`` that keeps 99 % of them whole, from the one tokenisation of the sampled training captions that
the unknown-token check reads (docs/data.md#captions-longer-than-datamax_tokens)."""

from __future__ import annotations

import logging

import pytest

import finecap.data.targets as targets
import finecap.train.setup as setup
from finecap.config import load
from finecap.data.records import DataError, Record
from finecap.models.tokenizer import world_tokenizer
from helpers.cli import run_cli

TOK = world_tokenizer(["a", "red", "circle"])


def records(lengths: list[int]) -> list[Record]:
    """One training record per caption, each ``n`` words ("a a a ..."), one token a word."""
    return [Record(i, None, "train", [" ".join(["a"] * n)]) for i, n in enumerate(lengths)]


def said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "finecap.train.setup" and r.levelno == logging.WARNING]


def test_cut_captions_are_said_with_the_share_the_longest_and_the_option_to_raise(caplog, monkeypatch):
    tokenised = []
    for module in (setup, targets):  # each tokenisation of captions, wherever it is called from
        monkeypatch.setattr(module, "text_ids", lambda tok, texts, _f=targets.text_ids: tokenised.append(len(texts))
                            or _f(tok, texts))  # fmt: skip
    # 100 captions: 95 of 10 tokens, 5 of 60 (the longest): data.max_tokens=48 keeps 47 and EOS, 5 % cut; the
    # shortest 99 % (ceil(99.0) = 99 captions) reach 60 tokens: data.max_tokens=61 keeps them whole
    cfg = load(None, ["data.path=dense.jsonl"])
    with caplog.at_level(logging.WARNING):
        setup.check_captions(TOK, records([10] * 95 + [60] * 5), cfg)
    assert tokenised == [100]  # one tokenisation for both checks
    assert said(caplog) == [
        "data: dense.jsonl: 5% of the training captions (100 read; the longest 60 tokens) are longer than "
        "data.max_tokens=48 keeps (47 tokens and EOS): their training targets end after 47 tokens, so the captioner "
        "learns to stop there; data.max_tokens=61 keeps 99% of them whole"
    ]


def test_one_caption_in_a_hundred_cut_is_not_said_two_are(caplog):
    cfg = load(None, ["data.path=dense.jsonl", "data.max_tokens=11"])  # keeps 10 tokens and EOS
    with caplog.at_level(logging.WARNING):
        setup.check_captions(TOK, records([10] * 99 + [11]), cfg)  # 1 % cut: a long outlier
    assert said(caplog) == []
    with caplog.at_level(logging.WARNING):
        setup.check_captions(TOK, records([10] * 98 + [11] * 2), cfg)  # 2 %
    (line,) = said(caplog)
    assert "2% of the training captions (100 read; the longest 11 tokens)" in line
    assert line.endswith("data.max_tokens=12 keeps 99% of them whole")


def test_captions_longer_than_the_option_allows_name_its_most(caplog):
    # 4,096 tokens is data.max_tokens' most; half the captions are 5,000 tokens: it keeps the other half
    cfg = load(None, ["data.path=dense.jsonl"])
    with caplog.at_level(logging.WARNING):
        setup.check_captions(TOK, records([10, 5000]), cfg)
    assert said(caplog)[0].endswith("the longest 5000 tokens) are longer than data.max_tokens=48 keeps (47 tokens "
                                    "and EOS): their training targets end after 47 tokens, so the captioner learns to "
                                    "stop there; data.max_tokens=4096, its most, keeps 50% of them whole")  # fmt: skip


def test_only_rank_0_of_a_launch_says_it(caplog, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    with caplog.at_level(logging.WARNING):
        setup.check_captions(TOK, records([60] * 10), load(None, []))
    assert said(caplog) == []


def test_unknown_words_still_stop_the_run_before_the_cut_is_said(caplog):
    with caplog.at_level(logging.WARNING), pytest.raises(DataError, match="50% of the training captions' tokens"):
        setup.check_captions(TOK, [Record(0, None, "train", ["a big red dog"])], load(None, ["data.max_tokens=2"]))
    assert said(caplog) == []


@pytest.mark.slow
def test_training_says_the_cut_once(tmp_path):
    """Wired into training: ``finecap train --dry-run`` (the run built as training builds it) on the world with
    captions of 5-20 tokens and ``data.max_tokens=4`` says it once."""
    world = ["world.n_train=20", "world.n_val=4", "world.n_test=4", "world.image_size=32", "retriever.epochs=1",
             "retriever.batch_size=8", "retriever.batch_size_eval=16", "clipcap.tiny_layers=1",
             "clipcap.tiny_hidden=32", "clipcap.tiny_heads=2", "clipcap.prefix_length=2", "train.batch_size=8",
             "decode.max_length=6"]  # fmt: skip
    code, _, err = run_cli(["train", "demo/mle", *world, "data.max_tokens=4", "--dry-run", "--out",
                            str(tmp_path / "run")])  # fmt: skip
    assert code == 0, err
    assert err.count("are longer than data.max_tokens=4 keeps (3 tokens and EOS)") == 1, err
