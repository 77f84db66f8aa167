"""Decoding algorithms on toy incremental models with known distributions (no transformers involved).

The toy model's next-token distribution depends on the image (a row's feature value) and the full history, so
beam search, sampling and stopping can be checked against hand-computed values and exhaustive search.
"""

import itertools
import math
import zlib

import pytest
import torch

from finecap.config import DecodeConfig
from finecap.decode import (
    Generation,
    beam_search,
    concat,
    decode,
    filter_logits,
    greedy,
    sample,
    stop_token_ids,
    texts_of,
)

PAD, EOS, A, B, DOT = 0, 1, 2, 3, 4
NEG = float("-inf")


class TableStepper:
    """Toy LM: logits of (image, history) from an explicit table, else a fixed pseudo-random vector.

    Features are ``(B, 1)`` image ids. The pad token gets -inf unless the table says otherwise.
    """

    def __init__(self, vocab: int, table: dict | None = None) -> None:
        self.vocab = vocab
        self.table = table or {}
        self.calls = 0

    def logits(self, image: int, history: tuple) -> torch.Tensor:
        key = (image, history)
        if key in self.table:
            return torch.tensor([math.log(p) if p > 0 else NEG for p in self.table[key]])
        if history in self.table:
            return torch.tensor([math.log(p) if p > 0 else NEG for p in self.table[history]])
        g = torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))
        out = 2 * torch.randn(self.vocab, generator=g)
        out[PAD] = NEG
        return out

    def _out(self, state):
        return torch.stack([self.logits(img, hist) for img, hist in state])

    def start(self, features):
        state = [(int(f), ()) for f in features[:, 0]]
        return self._out(state), state

    def step(self, tokens, state):
        self.calls += 1
        state = [(img, hist + (int(t),)) for (img, hist), t in zip(state, tokens)]
        return self._out(state), state

    def select(self, state, index):
        return [state[i] for i in index.tolist()]

    def seq_logprob(self, image: int, seq: list[int]) -> list[float]:
        lps = []
        for t, tok in enumerate(seq):
            lps.append(float(torch.log_softmax(self.logits(image, tuple(seq[:t])), -1)[tok]))
        return lps


def images(*ids):
    return torch.tensor([[float(i)] for i in ids])


def rows(gen: Generation) -> list[list[int]]:
    return [s[:n] for s, n in zip(gen.sequences.tolist(), gen.lengths.tolist())]


# --------------------------------------------------------------------------------------------------------------------
# filtering
# --------------------------------------------------------------------------------------------------------------------


def test_filter_top_k_and_top_p_hand_computed():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    # top-k 2 keeps the two largest
    assert torch.isinf(filter_logits(logits, top_k=2)).tolist() == [[False, False, True, True]]
    # top-p 0.7: mass before each sorted token = [0, .5, .8, .95]; tokens whose preceding mass >= .7 are dropped
    assert torch.isinf(filter_logits(logits, top_p=0.7)).tolist() == [[False, False, True, True]]
    # top-p 0.85: preceding mass .8 < .85 keeps the third token too
    assert torch.isinf(filter_logits(logits, top_p=0.85)).tolist() == [[False, False, False, True]]
    # top-p 0.5: the first token alone reaches .5
    assert torch.isinf(filter_logits(logits, top_p=0.5)).tolist() == [[False, True, True, True]]
    # unsorted input: the filter follows probabilities, not positions
    shuffled = logits[:, [2, 0, 3, 1]]
    assert torch.isinf(filter_logits(shuffled, top_p=0.7)).tolist() == [[True, False, True, False]]


# --------------------------------------------------------------------------------------------------------------------
# greedy and stopping
# --------------------------------------------------------------------------------------------------------------------


def test_greedy_stops_at_eos_and_pads_after_it():
    table = {
        (0, ()): [0, 0.2, 0.7, 0.1, 0],  # -> A
        (0, (A,)): [0, 0.6, 0.3, 0.1, 0],  # -> EOS (length 2)
        (1, ()): [0, 0.1, 0.2, 0.7, 0],  # -> B
        (1, (B,)): [0, 0.1, 0.2, 0.7, 0],  # -> B
        (1, (B, B)): [0, 0.1, 0.8, 0.1, 0],  # -> A, then max_length 3 is reached without EOS
    }
    s = TableStepper(5, table)
    gen = greedy(s, images(0, 1), max_length=3, stop_ids=[EOS], pad_id=PAD)
    assert gen.sequences.tolist() == [[A, EOS, PAD], [B, B, A]]
    assert gen.lengths.tolist() == [2, 3]
    assert gen.mask.tolist() == [[True, True, False], [True, True, True]]
    expected = [[math.log(0.7), math.log(0.6), 0.0], [math.log(0.7), math.log(0.7), math.log(0.8)]]
    assert torch.allclose(gen.token_logprobs, torch.tensor(expected), atol=1e-6)
    assert gen.scores.tolist() == pytest.approx([sum(r) for r in expected], abs=1e-6)
    assert gen.image_index.tolist() == [0, 1]


def test_greedy_stops_early_when_all_rows_finished():
    s = TableStepper(5, {(): [0, 0.9, 0.05, 0.05, 0]})  # EOS first for every image
    gen = greedy(s, images(0, 1, 2), max_length=10, stop_ids=[EOS], pad_id=PAD)
    assert gen.sequences.tolist() == [[EOS]] * 3
    assert s.calls == 0  # no LM step after everything finished


def test_stop_at_period_keeps_the_period():
    table = {(): [0, 0.1, 0.5, 0.1, 0.3], (A,): [0, 0.1, 0.2, 0.1, 0.6], (A, DOT): [0, 0.1, 0.8, 0.1, 0]}
    s = TableStepper(5, table)
    with_dot = greedy(s, images(0), max_length=4, stop_ids=[EOS, DOT], pad_id=PAD)
    assert rows(with_dot) == [[A, DOT]]
    without = greedy(s, images(0), max_length=4, stop_ids=[EOS], pad_id=PAD)
    assert rows(without)[0][:3] == [A, DOT, A]


def test_batch_equals_single_image_for_every_strategy():
    s = TableStepper(5)
    feats = images(0, 1, 2, 3)
    for decoder in (
        lambda f: greedy(s, f, 6, [EOS], PAD),
        lambda f: beam_search(s, f, 6, [EOS], PAD, beam_size=3, length_penalty=1.0, num_return_sequences=2),
    ):
        batch = rows(decoder(feats))
        single = [r for i in range(4) for r in rows(decoder(feats[i : i + 1]))]
        assert batch == single


# --------------------------------------------------------------------------------------------------------------------
# beam search
# --------------------------------------------------------------------------------------------------------------------


def test_beam_finds_a_better_caption_than_greedy():
    table = {
        (): [0, 0.1, 0.5, 0.4, 0],  # greedy takes A (.5) over B (.4)
        (A,): [0, 0.34, 0.33, 0.33, 0],  # after A everything is poor
        (B,): [0, 0.9, 0.05, 0.05, 0],  # after B, EOS is almost certain
    }
    s = TableStepper(5, table)
    g = greedy(s, images(0), max_length=2, stop_ids=[EOS], pad_id=PAD)
    b = beam_search(s, images(0), max_length=2, stop_ids=[EOS], pad_id=PAD, beam_size=2, length_penalty=0.0)
    assert rows(g) == [[A, EOS]]  # log .5 + log .34 = -1.772
    assert rows(b) == [[B, EOS]]  # log .4 + log .9 = -0.916 - 0.105 = -1.022
    assert b.scores.item() == pytest.approx(math.log(0.4) + math.log(0.9), abs=1e-6)
    assert g.scores.item() == pytest.approx(math.log(0.5) + math.log(0.34), abs=1e-6)


def _exhaustive(s: TableStepper, image: int, max_length: int, lp: float) -> list[tuple[float, list[int]]]:
    """Every complete hypothesis (ends at EOS, or reaches max_length) with its score, best first."""
    hyps = []
    for n in range(1, max_length + 1):
        for body in itertools.product([EOS, A, B], repeat=n):
            body = list(body)
            if EOS in body[:-1]:
                continue
            if body[-1] != EOS and n < max_length:
                continue
            hyps.append((sum(s.seq_logprob(image, body)) / n**lp, body))
    return sorted(hyps, key=lambda h: -h[0])


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0])
def test_wide_beam_equals_exhaustive_search(length_penalty):
    # 4 tokens (pad never allowed), max length 3: 1 + 2 + 4 hypotheses end in EOS, 8 reach the limit: 15 in all.
    # A beam of 16 never prunes, so its ranking must be the exhaustive one, with finished hypotheses neither lost,
    # duplicated nor re-scored.
    s = TableStepper(4)
    gen = beam_search(s, images(0, 1), max_length=3, stop_ids=[EOS], pad_id=PAD, beam_size=16,
                      length_penalty=length_penalty, num_return_sequences=15)  # fmt: skip
    got = rows(gen)
    for image in (0, 1):
        best = _exhaustive(s, image, 3, length_penalty)
        assert len(best) == 15
        assert got[image * 15 : image * 15 + 15] == [h for _, h in best]
        assert gen.scores[image * 15 : image * 15 + 15].tolist() == pytest.approx([sc for sc, _ in best], abs=1e-5)


def test_beam_logprobs_and_padding():
    s = TableStepper(4)
    gen = beam_search(s, images(0, 1, 2), max_length=5, stop_ids=[EOS], pad_id=PAD, beam_size=3,
                      length_penalty=1.0, num_return_sequences=3)  # fmt: skip
    for r, (seq, n) in enumerate(zip(gen.sequences.tolist(), gen.lengths.tolist())):
        image = int(gen.image_index[r])
        assert gen.token_logprobs[r, :n].tolist() == pytest.approx(s.seq_logprob(image, seq[:n]), abs=1e-5)
        assert all(t == PAD for t in seq[n:])
        assert gen.token_logprobs[r, n:].abs().sum() == 0
        assert EOS not in seq[: n - 1]
        assert gen.scores[r].item() == pytest.approx(sum(s.seq_logprob(image, seq[:n])) / n, abs=1e-5)
    # best first within each image
    sc = gen.scores.view(3, 3)
    assert (sc[:, :-1] >= sc[:, 1:]).all()


def test_beam_size_one_equals_greedy():
    s = TableStepper(5)
    feats = images(0, 1, 2, 3, 4)
    g = greedy(s, feats, 6, [EOS], PAD)
    b = beam_search(s, feats, 6, [EOS], PAD, beam_size=1, length_penalty=1.0)
    assert rows(b) == rows(g)
    assert torch.allclose(b.token_logprobs, g.token_logprobs)


# --------------------------------------------------------------------------------------------------------------------
# sampling
# --------------------------------------------------------------------------------------------------------------------


def test_sampling_with_top_k_one_equals_greedy():
    s = TableStepper(5)
    feats = images(0, 1, 2)
    g = greedy(s, feats, 6, [EOS], PAD)
    smp = sample(s, feats, 6, [EOS], PAD, temperature=3.0, top_k=1, num_return_sequences=2)
    assert rows(smp) == [r for r in rows(g) for _ in range(2)]
    assert smp.image_index.tolist() == [0, 0, 1, 1, 2, 2]


def test_sampling_frequencies_follow_the_tempered_distribution():
    # one step, p = [.5, .3, .2] over (EOS, A, B); at T = 0.5 the sampling distribution is p^2 / sum(p^2)
    # = [.25, .09, .04] / .38 = [.658, .237, .105]
    s = TableStepper(4, {(): [0, 0.5, 0.3, 0.2]})
    g = torch.Generator().manual_seed(0)
    gen = sample(s, images(0), 1, [EOS], PAD, temperature=0.5, num_return_sequences=4000, generator=g)
    freq = torch.bincount(gen.sequences[:, 0], minlength=4).float() / 4000
    assert freq[1:].tolist() == pytest.approx([0.658, 0.237, 0.105], abs=0.03)
    # returned log-probs are the untempered model's: log .5, log .3, log .2
    expected = torch.log(torch.tensor([0.0, 0.5, 0.3, 0.2]))[gen.sequences[:, 0]]
    assert torch.allclose(gen.token_logprobs[:, 0], expected, atol=1e-6)


def test_top_p_sampling_never_leaves_the_nucleus():
    # p = [.5, .3, .2]: top_p .6 keeps EOS and A (preceding mass 0 and .5 < .6), never B
    s = TableStepper(4, {(): [0, 0.5, 0.3, 0.2]})
    gen = sample(s, images(0), 1, [EOS], PAD, top_p=0.6, num_return_sequences=500,
                 generator=torch.Generator().manual_seed(1))  # fmt: skip
    counts = torch.bincount(gen.sequences[:, 0], minlength=4).tolist()
    assert counts[B] == 0 and counts[EOS] > 0 and counts[A] > 0


def test_sampled_rows_of_one_image_are_contiguous_and_padded():
    s = TableStepper(5)
    gen = sample(s, images(0, 1), 8, [EOS], PAD, num_return_sequences=3, generator=torch.Generator().manual_seed(0))
    assert gen.image_index.tolist() == [0, 0, 0, 1, 1, 1]
    for r, (seq, n) in enumerate(zip(gen.sequences.tolist(), gen.lengths.tolist())):
        image = int(gen.image_index[r])
        assert gen.token_logprobs[r, :n].tolist() == pytest.approx(s.seq_logprob(image, seq[:n]), abs=1e-5)
        assert all(t == PAD for t in seq[n:])
        assert (seq[n - 1] == EOS) or n == 8


# --------------------------------------------------------------------------------------------------------------------
# entry point, texts, concatenation
# --------------------------------------------------------------------------------------------------------------------


class _Tok:
    """Minimal tokenizer: ids -> words; EOS and pad are special."""

    eos_token_id, pad_token_id, unk_token_id = EOS, PAD, None
    words = {A: "a", B: "b", DOT: "."}

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(self.words[i] for i in ids if i not in (EOS, PAD))

    def encode(self, text, add_special_tokens=False):
        return [DOT] if text == "." else [PAD, DOT]


def test_decode_dispatch_texts_and_stop_ids():
    tok = _Tok()
    assert stop_token_ids(tok) == [EOS]
    assert stop_token_ids(tok, stop_at_period=True) == [EOS, DOT]
    table = {(): [0, 0.1, 0.6, 0.3, 0], (A,): [0, 0.7, 0.2, 0.1, 0]}
    s = TableStepper(5, table)
    gen = decode(s, images(0), DecodeConfig(strategy="greedy", max_length=5), tok)
    assert gen.texts == ["a"] and rows(gen) == [[A, EOS]]
    with pytest.raises(ValueError, match="num_return_sequences"):
        decode(s, images(0), DecodeConfig(strategy="greedy", num_return_sequences=2), tok)
    beam = decode(s, images(0), DecodeConfig(strategy="beam", beam_size=2, num_return_sequences=2, max_length=3), tok)
    assert len(beam.texts) == 2 and beam.texts[0] == "a"


def test_concat_shifts_images_and_pads():
    g1 = Generation(torch.tensor([[A, EOS]]), torch.tensor([[-1.0, -2.0]]), torch.tensor([2]), torch.tensor([0]),
                    torch.tensor([-3.0]), ["a"])  # fmt: skip
    g2 = Generation(torch.tensor([[A, B, EOS], [EOS, PAD, PAD]]), torch.tensor([[-1.0, -1.0, -1.0], [-0.5, 0, 0]]),
                    torch.tensor([3, 1]), torch.tensor([0, 1]), torch.tensor([-3.0, -0.5]), ["a b", ""])  # fmt: skip
    g = concat([g1, g2], pad_id=PAD)
    assert g.sequences.tolist() == [[A, EOS, PAD], [A, B, EOS], [EOS, PAD, PAD]]
    assert g.token_logprobs[0].tolist() == [-1.0, -2.0, 0.0]
    assert g.image_index.tolist() == [0, 1, 2]
    assert g.texts == ["a", "a b", ""]
    assert texts_of(_Tok(), g) == ["a", "a b", ""]
