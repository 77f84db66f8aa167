"""Decoding algorithms on toy incremental models with known distributions (no transformers involved).

The toy model's next-token distribution depends on the image (a row's feature value) and the full history, so
beam search, sampling and stopping can be checked against hand-computed values and exhaustive search.
"""

import dataclasses
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
        state = [(img, hist + (int(t),)) for (img, hist), t in zip(state, tokens, strict=True)]
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
    return [s[:n] for s, n in zip(gen.sequences.tolist(), gen.lengths.tolist(), strict=True)]


def beam_cfg(max_length: int, **options) -> DecodeConfig:
    return DecodeConfig(strategy="beam", max_length=max_length, **options)


def sample_cfg(max_length: int, **options) -> DecodeConfig:
    return DecodeConfig(strategy="sample", max_length=max_length, **options)


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
    gen = greedy(s, images(0, 1), DecodeConfig(max_length=3), stop_ids=[EOS], pad_id=PAD)
    assert gen.sequences.tolist() == [[A, EOS, PAD], [B, B, A]]
    assert gen.lengths.tolist() == [2, 3]
    assert gen.mask.tolist() == [[True, True, False], [True, True, True]]
    expected = [[math.log(0.7), math.log(0.6), 0.0], [math.log(0.7), math.log(0.7), math.log(0.8)]]
    assert torch.allclose(gen.token_logprobs, torch.tensor(expected), atol=1e-6)
    assert gen.scores.tolist() == pytest.approx([sum(r) for r in expected], abs=1e-6)
    assert gen.image_index.tolist() == [0, 1]


def test_greedy_stops_early_when_all_rows_finished():
    s = TableStepper(5, {(): [0, 0.9, 0.05, 0.05, 0]})  # EOS first for every image
    gen = greedy(s, images(0, 1, 2), DecodeConfig(max_length=10), stop_ids=[EOS], pad_id=PAD)
    assert gen.sequences.tolist() == [[EOS]] * 3
    assert s.calls == 0  # no LM step after everything finished


def test_stop_at_period_keeps_the_period():
    table = {(): [0, 0.1, 0.5, 0.1, 0.3], (A,): [0, 0.1, 0.2, 0.1, 0.6], (A, DOT): [0, 0.1, 0.8, 0.1, 0]}
    s = TableStepper(5, table)
    with_dot = greedy(s, images(0), DecodeConfig(max_length=4), stop_ids=[EOS, DOT], pad_id=PAD)
    assert rows(with_dot) == [[A, DOT]]
    without = greedy(s, images(0), DecodeConfig(max_length=4), stop_ids=[EOS], pad_id=PAD)
    assert rows(without)[0][:3] == [A, DOT, A]


def test_batch_equals_single_image_for_every_strategy():
    s = TableStepper(5)
    feats = images(0, 1, 2, 3)
    for decoder in (
        lambda f: greedy(s, f, DecodeConfig(max_length=6), [EOS], PAD),
        lambda f: beam_search(s, f, beam_cfg(6, beam_size=3, length_penalty=1.0, num_return_sequences=2), [EOS], PAD),
        lambda f: beam_search(s, f, beam_cfg(6, beam_size=3, length_penalty=1.0, num_return_sequences=2,
                                         finished_beams="set_aside"), [EOS], PAD),
        lambda f: beam_search(s, f, beam_cfg(6, beam_size=2, length_penalty=2.0, num_return_sequences=2,
                                         finished_beams="set_aside", early_stopping="never"), [EOS, DOT], PAD),
    ):  # fmt: skip
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
    g = greedy(s, images(0), DecodeConfig(max_length=2), stop_ids=[EOS], pad_id=PAD)
    b = beam_search(s, images(0), beam_cfg(2, beam_size=2, length_penalty=0.0), stop_ids=[EOS], pad_id=PAD)
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
    cfg = beam_cfg(3, beam_size=16, length_penalty=length_penalty, num_return_sequences=15)
    gen = beam_search(s, images(0, 1), cfg, stop_ids=[EOS], pad_id=PAD)
    got = rows(gen)
    for image in (0, 1):
        best = _exhaustive(s, image, 3, length_penalty)
        assert len(best) == 15
        assert got[image * 15 : image * 15 + 15] == [h for _, h in best]
        assert gen.scores[image * 15 : image * 15 + 15].tolist() == pytest.approx([sc for sc, _ in best], abs=1e-5)


def test_beam_logprobs_and_padding():
    s = TableStepper(4)
    gen = beam_search(s, images(0, 1, 2), beam_cfg(5, beam_size=3, length_penalty=1.0, num_return_sequences=3),
                      stop_ids=[EOS], pad_id=PAD)  # fmt: skip
    for r, (seq, n) in enumerate(zip(gen.sequences.tolist(), gen.lengths.tolist(), strict=True)):
        image = int(gen.image_index[r])
        assert gen.token_logprobs[r, :n].tolist() == pytest.approx(s.seq_logprob(image, seq[:n]), abs=1e-5)
        assert all(t == PAD for t in seq[n:])
        assert gen.token_logprobs[r, n:].abs().sum() == 0
        assert EOS not in seq[: n - 1]
        assert gen.scores[r].item() == pytest.approx(sum(s.seq_logprob(image, seq[:n])) / n, abs=1e-5)
    # best first within each image
    sc = gen.scores.view(3, 3)
    assert (sc[:, :-1] >= sc[:, 1:]).all()


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0])
def test_wide_set_aside_beam_never_stopping_early_equals_exhaustive_search(length_penalty):
    # With early_stopping="never" an image's search ends only when no live beam can beat its worst finished
    # hypothesis even at max_length (a sum of log-probs only falls, and with length_penalty > 0 dividing it by the
    # longest length is the best it can do), so a beam that never prunes (16 > 15 hypotheses) finds them all.
    s = TableStepper(4)
    cfg = beam_cfg(3, beam_size=16, length_penalty=length_penalty, num_return_sequences=15,
                   finished_beams="set_aside", early_stopping="never")  # fmt: skip
    gen = beam_search(s, images(0, 1), cfg, stop_ids=[EOS], pad_id=PAD)
    got = rows(gen)
    for image in (0, 1):
        best = _exhaustive(s, image, 3, length_penalty)
        assert got[image * 15 : image * 15 + 15] == [h for _, h in best]
        assert gen.scores[image * 15 : image * 15 + 15].tolist() == pytest.approx([sc for sc, _ in best], abs=1e-5)


def test_finished_beams_keep_and_set_aside_hand_computed():
    # Root: EOS .4, A .35, B .25; after A everything is poor, after B EOS is almost certain. Beam 2, max length 2,
    # length_penalty 1 (score = mean log-prob; log .4 = -0.916, log .35 = -1.050, log .25 = -1.386, log .95 = -0.051).
    table = {(): [0, 0.4, 0.35, 0.25, 0], (A,): [0, 0.3, 0.4, 0.3, 0], (B,): [0, 0.95, 0.025, 0.025, 0]}
    lp = {tok: math.log(p) for tok, p in ((EOS, 0.4), (A, 0.35), (B, 0.25))}
    # keep (ClipCap): step 1 keeps [EOS] (-0.916) and [A] (-1.050) in the two slots, so [B] is pruned; step 2 keeps
    # [EOS] and extends [A] to [A A] ((-1.050 - 0.916) / 2 = -0.983, ahead of [A EOS] -1.127).
    s = TableStepper(5, table)
    keep = beam_search(s, images(0), beam_cfg(2, beam_size=2, length_penalty=1.0, num_return_sequences=2), [EOS], PAD)
    assert rows(keep) == [[EOS], [A, A]]
    assert keep.scores.tolist() == pytest.approx([lp[EOS], (lp[A] + math.log(0.4)) / 2], abs=1e-6)
    # set_aside (generate): [EOS] is set aside and two beams stay live, [A] and [B]; at step 2 [B EOS] scores
    # (-1.386 - 0.051) / 2 = -0.719 and becomes the best caption, ahead of [EOS].
    s = TableStepper(5, table)
    aside = beam_search(s, images(0), beam_cfg(2, beam_size=2, length_penalty=1.0, num_return_sequences=2,
                                           finished_beams="set_aside"), [EOS], PAD)  # fmt: skip
    assert rows(aside) == [[B, EOS], [EOS]]
    assert aside.scores.tolist() == pytest.approx([(lp[B] + math.log(0.95)) / 2, lp[EOS]], abs=1e-6)
    assert aside.sequences.tolist() == [[B, EOS], [EOS, PAD]] and aside.lengths.tolist() == [2, 1]
    assert torch.allclose(aside.token_logprobs, torch.tensor([[lp[B], math.log(0.95)], [lp[EOS], 0.0]]), atol=1e-6)


def test_set_aside_early_stopping_hand_computed():
    # Beam 1, length_penalty 1, max length 3. Root: EOS .5, A .45, B .05; after A, EOS .9. Step 1 sets [EOS] aside
    # (-0.693) and keeps [A] (-0.799) live.
    # - early_stopping=False: [A] could at best score -0.799 / 1 (its current length) < -0.693: stop, [EOS].
    # - early_stopping=True: one finished hypothesis fills the beam of 1: stop, [EOS].
    # - early_stopping="never": the bound is -0.799 / 3 (max length) > -0.693: go on; [A EOS] scores
    #   (-0.799 - 0.105) / 2 = -0.452 and wins.
    table = {(): [0, 0.5, 0.45, 0.05, 0], (A,): [0, 0.9, 0.05, 0.05, 0]}
    expected = {False: ([EOS], math.log(0.5), 0), True: ([EOS], math.log(0.5), 0),
                "never": ([A, EOS], (math.log(0.45) + math.log(0.9)) / 2, 1)}  # fmt: skip
    for early_stopping, (caption, score, steps) in expected.items():
        s = TableStepper(5, table)
        gen = beam_search(s, images(0), beam_cfg(3, beam_size=1, length_penalty=1.0, finished_beams="set_aside",
                                             early_stopping=early_stopping), [EOS], PAD)  # fmt: skip
        assert rows(gen) == [caption], early_stopping
        assert gen.scores.item() == pytest.approx(score, abs=1e-6)
        assert s.calls == steps  # LM steps after the first token's


def test_finished_beams_options_are_checked():
    # by the section, when it is built: beam_search reads a checked one
    from finecap.config import ConfigError, load

    with pytest.raises(ConfigError, match="decode.finished_beams: invalid value 'drop'; valid choices: keep, set_"):
        beam_cfg(3, beam_size=2, finished_beams="drop")
    with pytest.raises(ConfigError, match="decode.early_stopping: invalid value 'soon'"):
        beam_cfg(3, beam_size=2, finished_beams="set_aside", early_stopping="soon")
    with pytest.raises(ConfigError, match="decode.early_stopping: is a setting of decode.finished_beams=set_aside"):
        beam_cfg(3, beam_size=2, early_stopping=True)
    with pytest.raises(ConfigError, match="decode.early_stopping: is a setting of decode.finished_beams=set_aside"):
        load(None, ["decode.early_stopping=never"])
    cfg = load(None, ["decode.finished_beams=set_aside", "decode.early_stopping=never"]).decode
    assert (cfg.finished_beams, cfg.early_stopping) == ("set_aside", "never")
    assert load(None, ["decode.finished_beams=set_aside", "decode.early_stopping=true"]).decode.early_stopping is True
    assert DecodeConfig().finished_beams == "keep"  # existing recipes keep ClipCap's rule
    from finecap.objectives import get_objective

    rl = get_objective("reinforce", load(None, ["rl.strategy=beam", "rl.samples=1", "rl.baseline=mean",
                                                "decode.finished_beams=set_aside",
                                                "decode.early_stopping=never"]))  # fmt: skip
    assert (rl.sample_cfg.finished_beams, rl.sample_cfg.early_stopping) == ("set_aside", "never")  # RL's beam too


def test_a_decoder_refuses_a_section_of_another_strategy():
    # a section's rules hold for its own strategy: num_return_sequences <= beam_size is a rule of beam sections only
    s = TableStepper(5)
    wide = sample_cfg(3, num_return_sequences=4, beam_size=2)
    with pytest.raises(ValueError, match="beam decoding was given a decode section with strategy='sample'"):
        beam_search(s, images(0), wide, [EOS], PAD)
    with pytest.raises(ValueError, match="greedy decoding was given a decode section with strategy='sample'"):
        greedy(s, images(0), wide, [EOS], PAD)
    with pytest.raises(ValueError, match="sample decoding was given a decode section with strategy='beam'"):
        sample(s, images(0), beam_cfg(3, beam_size=2), [EOS], PAD)


def test_greedy_with_several_captions_is_refused_when_the_configuration_is_loaded():
    from finecap.config import ConfigError, load

    with pytest.raises(ConfigError, match="decode.num_return_sequences: 2 needs decode.strategy=sample or beam"):
        load(None, ["decode.num_return_sequences=2"])
    assert load(None, ["decode.num_return_sequences=2", "decode.strategy=sample"]).decode.num_return_sequences == 2


def test_beam_size_one_equals_greedy():
    s = TableStepper(5)
    feats = images(0, 1, 2, 3, 4)
    g = greedy(s, feats, DecodeConfig(max_length=6), [EOS], PAD)
    b = beam_search(s, feats, beam_cfg(6, beam_size=1, length_penalty=1.0), [EOS], PAD)
    assert rows(b) == rows(g)
    assert torch.allclose(b.token_logprobs, g.token_logprobs)


# --------------------------------------------------------------------------------------------------------------------
# sampling
# --------------------------------------------------------------------------------------------------------------------


def test_sampling_with_top_k_one_equals_greedy():
    s = TableStepper(5)
    feats = images(0, 1, 2)
    g = greedy(s, feats, DecodeConfig(max_length=6), [EOS], PAD)
    smp = sample(s, feats, sample_cfg(6, temperature=3.0, top_k=1, num_return_sequences=2), [EOS], PAD)
    assert rows(smp) == [r for r in rows(g) for _ in range(2)]
    assert smp.image_index.tolist() == [0, 0, 1, 1, 2, 2]


def test_sampling_frequencies_follow_the_tempered_distribution():
    # one step, p = [.5, .3, .2] over (EOS, A, B); at T = 0.5 the sampling distribution is p^2 / sum(p^2)
    # = [.25, .09, .04] / .38 = [.658, .237, .105]
    s = TableStepper(4, {(): [0, 0.5, 0.3, 0.2]})
    g = torch.Generator().manual_seed(0)
    gen = sample(s, images(0), sample_cfg(1, temperature=0.5, num_return_sequences=4000), [EOS], PAD, generator=g)
    freq = torch.bincount(gen.sequences[:, 0], minlength=4).float() / 4000
    assert freq[1:].tolist() == pytest.approx([0.658, 0.237, 0.105], abs=0.03)
    # returned log-probs are the untempered model's: log .5, log .3, log .2
    expected = torch.log(torch.tensor([0.0, 0.5, 0.3, 0.2]))[gen.sequences[:, 0]]
    assert torch.allclose(gen.token_logprobs[:, 0], expected, atol=1e-6)


class OnDevice(TableStepper):
    """The toy LM with its logits moved to ``device``."""

    def __init__(self, vocab: int, device: str) -> None:
        super().__init__(vocab)
        self.device = device

    def _out(self, state):
        return super()._out(state).to(self.device)


def test_sampling_refuses_a_generator_on_another_device_than_the_logits():
    # a CPU generator with a model on a GPU failed inside torch.multinomial (CUDA's check); "meta" stands in for the
    # other device here: torch.multinomial draws there without a word, so only finecap's check can refuse it
    cfg = sample_cfg(4, num_return_sequences=1)
    with pytest.raises(ValueError, match=r"the generator is on cpu, the logits on meta; .*device='meta'"):
        sample(OnDevice(5, "meta"), images(0), cfg, [EOS], PAD, generator=torch.Generator().manual_seed(0))
    gen = sample(OnDevice(5, "cpu"), images(0, 1), cfg, [EOS], PAD, generator=torch.Generator().manual_seed(0))
    assert gen.image_index.tolist() == [0, 1]  # the same device: drawn


def test_top_p_sampling_never_leaves_the_nucleus():
    # p = [.5, .3, .2]: top_p .6 keeps EOS and A (preceding mass 0 and .5 < .6), never B
    s = TableStepper(4, {(): [0, 0.5, 0.3, 0.2]})
    gen = sample(s, images(0), sample_cfg(1, top_p=0.6, num_return_sequences=500), [EOS], PAD,
                 generator=torch.Generator().manual_seed(1))  # fmt: skip
    counts = torch.bincount(gen.sequences[:, 0], minlength=4).tolist()
    assert counts[B] == 0 and counts[EOS] > 0 and counts[A] > 0


def test_sampled_rows_of_one_image_are_contiguous_and_padded():
    s = TableStepper(5)
    cfg = sample_cfg(8, num_return_sequences=3)
    gen = sample(s, images(0, 1), cfg, [EOS], PAD, generator=torch.Generator().manual_seed(0))
    assert gen.image_index.tolist() == [0, 0, 0, 1, 1, 1]
    for r, (seq, n) in enumerate(zip(gen.sequences.tolist(), gen.lengths.tolist(), strict=True)):
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


class _SentencePieceLike:
    """Llama's spelling: ``"."`` alone is the word-start ``"▁."`` (7), a period after a word the plain ``"."`` (6)."""

    eos_token_id, unk_token_id = EOS, None
    vocab = {"▁dog": 5, ".": 6, "▁.": 7}

    def encode(self, text, add_special_tokens=False):
        if text.strip() == ".":
            return [7]
        return [5] + ([6] if text.endswith(".") else [])


def test_stop_at_period_stops_at_the_period_that_follows_a_word():
    # only "▁." stopped a caption: "a dog." (whose period is the plain ".") ran on
    assert stop_token_ids(_SentencePieceLike(), stop_at_period=True) == [EOS, 7, 6]


def test_decode_dispatch_texts_and_stop_ids():
    tok = _Tok()
    assert stop_token_ids(tok) == [EOS]
    assert stop_token_ids(tok, stop_at_period=True) == [EOS, DOT]
    # a captioner's end tokens (a VLM's turn end first, then its other stop tokens) in place of the tokenizer's EOS
    assert stop_token_ids(tok, stop_at_period=True, ends=[A, EOS, A]) == [A, EOS, DOT]
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


# --------------------------------------------------------------------------------------------------------------------
# decode.batch_size counts sequences
# --------------------------------------------------------------------------------------------------------------------


class CountingStepper(TableStepper):
    """A TableStepper that records the images of each decoding batch and the most rows it ever held."""

    def __init__(self, vocab: int) -> None:
        super().__init__(vocab)
        self.images, self.max_rows = [], 0

    def start(self, features):
        self.images.append(len(features))
        return super().start(features)

    def select(self, state, index):
        self.max_rows = max(self.max_rows, len(index))
        return super().select(state, index)


@pytest.mark.parametrize(
    ("cfg", "chunks", "most_rows"),
    [
        # beam 5 with decode.batch_size=10 sequences: 2 images (10 beams) per decoding batch, never 10 images (50)
        (dict(strategy="beam", beam_size=5, batch_size=10), [2, 2, 1], 10),
        # beam 5 returning 2 captions still holds 5 beams per image: 11 sequences -> 2 images
        (dict(strategy="beam", beam_size=5, num_return_sequences=2, batch_size=11), [2, 2, 1], 10),
        # 3 samples per image, 7 sequences: 2 images (6 rows)
        (dict(strategy="sample", num_return_sequences=3, batch_size=7), [2, 2, 1], 6),
        # fewer sequences than one image's beams: one image per batch, at least
        (dict(strategy="beam", beam_size=5, batch_size=3), [1, 1, 1, 1, 1], 5),
        (dict(strategy="greedy", batch_size=2), [2, 2, 1], 0),  # greedy never repeats rows (0: no select call)
    ],
)
def test_decode_batch_size_counts_sequences_not_images(cfg, chunks, most_rows):
    from finecap.decode import chunk_images

    cfg = DecodeConfig(max_length=4, **cfg)
    assert chunk_images(cfg) == chunks[0]
    seeds = torch.arange(5) * 7919  # per-image seeds: samples do not depend on the chunk an image is decoded in
    chunked = CountingStepper(5)
    gen = decode(chunked, images(0, 1, 2, 3, 4), cfg, _Tok(), seeds=seeds)
    assert chunked.images == chunks and chunked.max_rows == most_rows
    whole = CountingStepper(5)
    one = decode(whole, images(0, 1, 2, 3, 4), dataclasses.replace(cfg, batch_size=1000), _Tok(), seeds=seeds)
    assert whole.images == [5]  # unchunked: every image at once
    assert gen.texts == one.texts and rows(gen) == rows(one) and torch.equal(gen.image_index, one.image_index)
    assert torch.allclose(gen.scores, one.scores)


def test_seeded_draws_follow_the_softmax_and_differ_by_position():
    """Gumbel-max with the counter-based noise: argmax(logits + G) is a draw from softmax(logits); the noise has the
    Gumbel(0, 1) moments (mean Euler's gamma, variance pi^2 / 6), and a row's draws at two positions are unrelated."""
    from finecap.decode import sample_keys, seeded_gumbel

    keys = sample_keys(torch.arange(20_000), 1)  # (N,) one sample of 20,000 images
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5], dtype=torch.float64)
    noise = seeded_gumbel(keys, 0, 5)  # (N, V)
    assert noise.shape == (20_000, 5)
    assert abs(noise.mean().item() - 0.5772157) < 0.02 and abs(noise.var().item() - math.pi**2 / 6) < 0.06
    draws = (logits + noise).argmax(-1)
    p = logits.softmax(-1)
    freq = torch.bincount(draws, minlength=5).double() / len(draws)
    sigma = (p * (1 - p) / len(draws)).sqrt()
    assert ((freq - p).abs() < 4 * sigma).all(), (freq, p)
    later = (logits + seeded_gumbel(keys, 1, 5)).argmax(-1)
    same = (draws == later).double().mean().item()
    assert abs(same - (p**2).sum().item()) < 0.02  # independent draws agree with probability sum p^2
    assert torch.equal(draws, (logits + seeded_gumbel(keys, 0, 5)).argmax(-1))  # a pure function of (key, t, v)


def test_step_seeds_take_any_run_seed():
    # seed * 1_000_003 became an int64 tensor: run.seed=$(date +%s%N) (1.7e18) overflowed ('Overflow when unpacking
    # long long') at the first RL rollout; hash32 reads 32 bits, so the mix modulo 2**32 gives every seed that
    # worked its draws unchanged
    from finecap.decode import hash32, step_seeds

    index = torch.tensor([0, 5, 9])
    big = 1_700_000_000_000_000_000
    assert torch.equal(step_seeds(big, 3, index), step_seeds(big % 2**32, 3, index))
    assert torch.equal(step_seeds(2**64 - 1, 0, index), step_seeds(2**32 - 1, 0, index))
    # by hand for a seed that always worked: hash32(hash32(seed * 1_000_003 + step) ^ hash32(index))
    first = hash32(torch.tensor([12 * 1_000_003 + 4]))
    assert torch.equal(step_seeds(12, 4, index), hash32(first ^ hash32(index)))
