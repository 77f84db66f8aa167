"""Captions longer than the retriever's text window (retriever.long_text: truncate | error | chunks), on tiny CLIPs
built from configs: the window read from the checkpoint (248 positions load whole), the decisive detail past the
window seen only with ``chunks``, the refusal naming the caption, the counts every reward and metric reports, and
the chunked pooling against a hand computation."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from tokenizers import processors
from transformers import CLIPImageProcessor, CLIPModel, CLIPTokenizer

from finecap.config import SRConfig, load
from finecap.metrics.suite import evaluate
from finecap.models.presets import tiny_clip_config
from finecap.models.retriever import Retriever, load_retriever
from finecap.models.tokenizer import world_tokenizer
from finecap.rewards import reward_of
from finecap.rewards.base import call_batch
from helpers.cli import refused, run_cli

WORDS = ["a", "red", "blue", "circle", "square", "on", "grass", "big", "small", "the"]
WINDOW = 16  # the tiny text tower's positions: 15 words and the world tokenizer's EOS
PREFIX = " ".join((WORDS * 2)[:20])  # 20 words: past the window on their own


def processor() -> CLIPImageProcessor:
    return CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})


def clip_tokenizer(model_max_length: int = 77) -> CLIPTokenizer:
    """A real ``CLIPTokenizer`` (byte-level BPE, ``<|startoftext|>`` ... ``<|endoftext|>`` around every text, as
    CLIP's) whose vocabulary makes each of :data:`WORDS` one token."""
    vocab: dict[str, int] = {}
    merges: list[tuple[str, str]] = []
    for w in WORDS:
        pieces = list(w[:-1]) + [w[-1] + "</w>"]
        for p in pieces:
            vocab.setdefault(p, len(vocab))
        while len(pieces) > 1:
            if (pieces[0], pieces[1]) not in merges:
                merges.append((pieces[0], pieces[1]))
            pieces = [pieces[0] + pieces[1], *pieces[2:]]
            vocab.setdefault(pieces[0], len(vocab))
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=model_max_length)


def tiny_retriever(tokenizer=None, positions: int = WINDOW, long_text: str = "truncate") -> Retriever:
    tok = tokenizer if tokenizer is not None else world_tokenizer(WORDS)
    torch.manual_seed(0)
    cfg = tiny_clip_config(len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                           bos_token_id=tok.bos_token_id, max_text_length=positions)  # fmt: skip
    return Retriever(CLIPModel(cfg).eval(), tok, processor(), name="tiny", long_text=long_text)


def with_mode(r: Retriever, long_text: str) -> Retriever:
    """The same model and tokenizer under another ``long_text``."""
    return Retriever(r.model, r.tokenizer, r.image_processor, name=r.name, long_text=long_text)


def hand_windows(tokens: list[int], text_tokens: int) -> list[list[int]]:
    """Windows of ``text_tokens`` tokens, each starting half a window (rounded down) before the previous one ends."""
    step = text_tokens - text_tokens // 2
    out, start = [], 0
    while True:
        out.append(tokens[start : start + text_tokens])
        if start + text_tokens >= len(tokens):
            return out
        start += step


def feature(r: Retriever, ids: list[int]) -> torch.Tensor:
    """The text tower's projected feature ``(D,)`` of one token sequence, alone (no padding)."""
    with torch.no_grad():
        return r.model.get_text_features(input_ids=torch.tensor([ids])).pooler_output[0]


def test_the_window_is_the_checkpoints_and_a_248_position_clip_reads_248(tmp_path):
    # A Long-CLIP-like checkpoint: 248 text positions, tokenizer files copied from CLIP's (model_max_length 77).
    folder = tiny_retriever(clip_tokenizer(77), positions=248).save(tmp_path / "long_clip")
    r = Retriever.from_pretrained(folder)
    assert r.tokenizer.model_max_length == 77 and r.max_length == 248
    caption = " ".join((WORDS * 15)[:150])  # 150 words, one token each: 152 with BOS and EOS
    enc = r.encode_texts([caption])
    assert enc.tokens == (152,) and enc.window == 248 and enc.long == [False]
    tok = r.tokenizer
    ids = [tok.bos_token_id, *tok(caption, add_special_tokens=False)["input_ids"], tok.eos_token_id]
    assert len(ids) == 152
    assert torch.allclose(enc.embeddings[0], F.normalize(feature(r, ids), dim=-1), atol=1e-6)  # all 152 read
    cfg = load(None, [f"retriever.checkpoint={folder}", "retriever.long_text=chunks", f"run.cache_dir={tmp_path}"])
    loaded = load_retriever(cfg)
    assert loaded.max_length == 248 and loaded.long_text == "chunks"
    # The world tokenizer's 64 does not cap a CLIP tower's 16 or its 100 positions either way.
    assert tiny_retriever().max_length == 16 and tiny_retriever(positions=100).max_length == 100


def test_a_detail_past_the_window_counts_only_with_chunks():
    r = tiny_retriever()
    red, blue = f"{PREFIX} red circle", f"{PREFIX} blue square"  # 22 words: 23 tokens, the last 7 past the window
    first_window = " ".join(PREFIX.split()[:15])  # what `truncate` reads of either: 15 words + EOS
    images = {0: torch.tensor([1.0, 0.0] * 12), 1: torch.tensor([0.0, 1.0] * 12)}
    batch = call_batch([0, 0, 0, 1])
    captions = [red, blue, first_window, "a small square"]

    truncate = reward_of("retrieval", retriever=r, embeddings=images, sr=SRConfig())(captions, batch)
    assert torch.equal(truncate.total[0], truncate.total[1])  # the colours and shapes are never read
    assert torch.equal(truncate.total[0], truncate.total[2])  # ... the same as the first window alone
    assert truncate.parts["truncated"].tolist() == [1.0, 1.0, 0.0, 0.0]  # 23, 23, 16, 4 tokens in a window of 16

    chunks = reward_of("retrieval", retriever=with_mode(r, "chunks"), embeddings=images, sr=SRConfig())(
        captions, batch
    )
    assert chunks.total[0] != chunks.total[1]  # red circle and blue square are told apart
    assert torch.equal(chunks.total[2:], truncate.total[2:])  # the captions that fit score as before
    assert chunks.parts["chunked"].tolist() == [1.0, 1.0, 0.0, 0.0] and "truncated" not in chunks.parts


def test_error_names_the_caption_its_length_and_the_window():
    r = tiny_retriever(long_text="error")
    reward = reward_of("retrieval", retriever=r, embeddings={7: torch.ones(24), 8: -torch.ones(24)}, sr=SRConfig())
    captions = ["a red circle", f"{PREFIX} red circle", f"{PREFIX} blue square on the grass"]
    with pytest.raises(ValueError) as e:
        reward(captions, call_batch([7, 8, 7]))
    msg = str(e.value)
    assert "\n" not in msg
    # the first too-long caption: image 8, 22 words + EOS = 23 tokens; one more after it
    assert "the caption of image 8 ('a red blue circle square on grass big ...')" in msg
    assert "has 23 tokens, more than the 16-token text window of tiny (and 1 more)" in msg
    assert "retriever.long_text=truncate or chunks" in msg
    assert torch.isfinite(reward(["a red circle", "the big square"], call_batch([7, 8])).total).all()  # fits: scored


def test_error_refuses_a_long_text_whose_embedding_the_cache_holds(tmp_path):
    # the cached embeddings are truncate's (the same key), so a long text read from the cache skipped the refusal
    texts = ["a red circle", f"{PREFIX} red circle"]
    cached = tiny_retriever().text_embeddings(texts, cache_dir=tmp_path)
    assert cached.shape[0] == 2
    with pytest.raises(ValueError, match="retriever.long_text=error: text 1 .* has 23 tokens"):
        with_mode(tiny_retriever(), "error").text_embeddings(texts, cache_dir=tmp_path)
    fits = ["a red circle", "the big square"]
    truncated = tiny_retriever().text_embeddings(fits, cache_dir=tmp_path)
    assert torch.equal(with_mode(tiny_retriever(), "error").text_embeddings(fits, cache_dir=tmp_path), truncated)


def test_truncated_counts_and_share_by_hand(tmp_path, caplog):
    r = tiny_retriever()
    words = (WORDS * 4)[:30]
    texts = [" ".join(words[:15]), " ".join(words[:16]), "a red circle", " ".join(words)]
    # tokens: 15 words + EOS = 16 (fits exactly), 17 (one over), 3 + 1 = 4, 30 + 1 = 31 -> two of four are long
    enc = r.encode_texts(texts)
    assert enc.tokens == (16, 17, 4, 31) and enc.long == [False, True, False, True]
    assert enc.counts("retrieval") == {"retrieval/truncated": 2.0}
    assert with_mode(r, "chunks").encode_texts(texts).counts("x") == {"x/chunked": 2.0}
    assert r.encode_texts(texts[:1] + texts[2:3]).counts("retrieval") == {}  # none long: no key at all

    out = reward_of("retrieval", retriever=r, embeddings={i: torch.randn(24) for i in range(4)})(
        texts, call_batch([0, 1, 2, 3])
    )
    assert out.parts["truncated"].mean().item() == 0.5  # the logged share reward/retrieval/truncated

    image_dir = tmp_path / "images"
    image_dir.mkdir()
    rng = np.random.default_rng(0)
    records = []
    for i in range(4):
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(image_dir / f"{i}.png")
        records.append(type("Rec", (), {"image_id": i, "path": image_dir / f"{i}.png"})())
    cfg = load(None, [f"run.cache_dir={tmp_path / 'cache'}", "eval.n_distractors=2", "eval.draws=1"])
    with caplog.at_level(logging.INFO, logger="finecap"):
        scores = evaluate(dict(enumerate(texts)), {i: [t] for i, t in enumerate(texts)},
                          metrics="retrieval,bags,clipscore", retriever=r, images=records, bags=[[0, 1], [2, 3]],
                          cfg=cfg)  # fmt: skip
    # the world tokenizer knows no "photo": CLIPScore uses no prefix, so the same two captions are long
    assert scores["retrieval/truncated"] == 2.0 and scores["clipscore/truncated"] == 2.0
    notes = [m for m in caplog.messages if "longer than the retriever's text window" in m]
    assert notes == [
        "note: retrieval: 2 of 4 captions are longer than the retriever's text window of 16 tokens: truncated to it "
        "(retriever.long_text=truncate; 'chunks' encodes them whole)",
        "note: clipscore: 2 of 4 captions are longer than the retriever's text window of 16 tokens: truncated to it "
        "(retriever.long_text=truncate; 'chunks' encodes them whole)",
    ]  # once per encoding: the bags group reuses the retrieval scores


@pytest.mark.parametrize("tokenizer", ["world", "clip"])
def test_chunked_pooling_equals_the_hand_computation(tokenizer):
    tok = clip_tokenizer() if tokenizer == "clip" else world_tokenizer(WORDS)
    r = tiny_retriever(tok, long_text="chunks")
    caption = " ".join((WORDS * 4)[:31])
    tokens = tok(caption, add_special_tokens=False)["input_ids"]
    assert len(tokens) == 31
    bos = [tok.bos_token_id] if tokenizer == "clip" else []  # CLIP's tokenizer adds BOS; the world's only EOS
    text_tokens = WINDOW - len(bos) - 1  # 14 (clip) or 15 (world) text tokens a window
    windows = hand_windows(tokens, text_tokens)
    # world: [0, 15) [8, 23) [16, 31); clip: [0, 14) [7, 21) [14, 28) [21, 31)
    assert [len(w) for w in windows] == ([14, 14, 14, 10] if tokenizer == "clip" else [15, 15, 15])
    ids, mask, owner = r.windows([caption])
    assert ids.tolist() == [bos + w + [tok.eos_token_id] + [tok.pad_token_id] * (text_tokens - len(w))
                            for w in windows] and owner.tolist() == [0] * len(windows)  # fmt: skip
    # mean of the unit window features, weighted by their text tokens, then unit-normalised
    pooled = sum(len(w) * F.normalize(feature(r, bos + w + [tok.eos_token_id]), dim=-1) for w in windows)
    want = F.normalize(pooled / sum(len(w) for w in windows), dim=-1)
    assert torch.allclose(r.embed_texts([caption])[0], want, atol=1e-6)
    # and the first window is what truncation reads
    assert r.tokenize([caption])[0].tolist() == [bos + windows[0] + [tok.eos_token_id]]


def test_windows_of_a_tokenizer_without_eos_get_the_eos_appended():
    r = tiny_retriever(long_text="chunks")
    bare = world_tokenizer(WORDS)
    bare.backend_tokenizer.post_processor = processors.TemplateProcessing(single="$A", special_tokens=[])
    appended = Retriever(r.model, bare, r.image_processor, long_text="chunks")  # the retriever appends the EOS
    caption = " ".join((WORDS * 4)[:31])
    assert appended.token_counts([caption]) == r.token_counts([caption]) == [32]
    # room is kept for the appended EOS: the same windows, nothing of the caption lost
    assert torch.equal(appended.windows([caption])[0], r.windows([caption])[0])
    assert torch.allclose(appended.embed_texts([caption]), r.embed_texts([caption]), atol=1e-6)


def test_a_caption_within_the_window_is_bit_identical_in_every_mode():
    r = tiny_retriever()
    short = ["a red circle", "the big blue square on the grass", " ".join((WORDS * 2)[:15])]  # 15 words: 16 tokens
    want = r.embed_texts(short)
    for mode in ("error", "chunks"):
        assert torch.equal(with_mode(r, mode).embed_texts(short), want), mode
        assert torch.equal(with_mode(r, mode).encode_texts(short).embeddings, want), mode
    # beside a long caption in the same batch, too
    mixed = [short[0], f"{PREFIX} red circle", short[1]]
    truncated, chunked = r.embed_texts(mixed), with_mode(r, "chunks").embed_texts(mixed)
    assert torch.equal(truncated[[0, 2]], chunked[[0, 2]]) and not torch.allclose(truncated[1], chunked[1])


def test_chunked_embeddings_have_their_own_text_cache_entry(tmp_path):
    r = tiny_retriever()
    texts = ["a red circle", f"{PREFIX} red circle"]
    cut = r.text_embeddings(texts, tmp_path)
    whole = with_mode(r, "chunks").text_embeddings(texts, tmp_path)  # not served from the truncated file
    assert torch.equal(whole, with_mode(r, "chunks").embed_texts(texts)) and not torch.allclose(cut[1], whole[1])
    assert torch.equal(r.text_embeddings(texts, tmp_path), cut)


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="retriever.long_text: invalid value 'chunk'; valid choices: truncate, error"):
        tiny_retriever(long_text="chunk")


@pytest.fixture
def eval_files(tmp_path) -> dict[str, Path]:
    """A JSONL data set of four images, predictions of which two are longer than a 16-token window, and a tiny
    CLIP with that window saved like a Hub checkpoint."""
    rng = np.random.default_rng(0)
    lines = []
    for i in range(4):
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
        lines.append(json.dumps({"image": f"{i}.png", "captions": ["a red circle"], "split": "test", "id": f"im{i}"}))
    (tmp_path / "refs.jsonl").write_text("\n".join(lines) + "\n")
    captions = ["a red circle", f"{PREFIX} red circle", "a blue square", f"{PREFIX} blue square on the grass"]
    results = [{"image_id": f"im{i}", "caption": c} for i, c in enumerate(captions)]
    (tmp_path / "results.json").write_text(json.dumps(results))
    return {"refs": tmp_path / "refs.jsonl", "results": tmp_path / "results.json",
            "clip": tiny_retriever().save(tmp_path / "clip"), "cache": tmp_path / "cache"}  # fmt: skip


def eval_argv(files: dict[str, Path], *extra: str) -> list[str]:
    return ["eval", "--predictions", str(files["results"]), "--references", str(files["refs"]), "--metrics",
            "retrieval,clipscore", f"retriever.checkpoint={files['clip']}", f"run.cache_dir={files['cache']}",
            "eval.n_distractors=2", *extra]  # fmt: skip


def test_finecap_eval_notes_and_shows_the_truncated_captions(eval_files):
    code, out, err = run_cli(eval_argv(eval_files))
    assert code == 0, err
    assert ("note: retrieval: 2 of 4 captions are longer than the retriever's text window of 16 tokens: truncated "
            "to it (retriever.long_text=truncate; 'chunks' encodes them whole)") in err  # fmt: skip
    assert "| retrieval/truncated | 2 |" in out and "| clipscore/truncated | 2 |" in out
    code, out, err = run_cli(eval_argv(eval_files, "retriever.long_text=chunks"))
    assert code == 0, err
    assert "2 of 4 captions are longer than the retriever's text window of 16 tokens: encoded as overlapping" in err
    assert "| retrieval/chunked | 2 |" in out and "truncated" not in out


def test_finecap_eval_with_error_refuses_naming_the_caption(eval_files):
    refused(eval_argv(eval_files, "retriever.long_text=error"), "the caption of image 'im1'", "has 23 tokens",
            "16-token text window")  # fmt: skip
