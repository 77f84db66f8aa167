"""The per-token metrics' step values (finecap.objectives.token_means): the token mean over every process's tokens,
from hand-made per-process sums and counts, and the tokens each metric covers (the scored captions')."""

from __future__ import annotations

import math

import pytest
import torch

from finecap.objectives.token_means import TokenMeans, scored_values


def reduced(*processes: TokenMeans):
    """The all-reduce (sum) of the processes' ``[sum, count]`` tensors, as each process receives it."""
    total = sum(p.totals() for p in processes)
    return lambda t: total


def gathered(*processes: TokenMeans):
    """The gather of the processes' signed extremes, end to end, as each process receives it."""
    signed = torch.cat([p.extreme_values() for p in processes])
    return lambda t: signed


def test_the_step_mean_is_over_every_processs_tokens_not_the_mean_of_their_means():
    # process 0: two micro-batches, 10 tokens of entropy 1 and 2 of entropy 4; process 1: one micro-batch of 3 tokens
    # of entropy 6. Over the 15 tokens: (10 + 8 + 18) / 15 = 2.4. What was logged until 2026-11-29: each process's
    # mean of its micro-batches' means, (1 + 4) / 2 = 2.5 and 6, averaged over the processes: 4.25.
    zero, one = TokenMeans(), TokenMeans()
    assert zero.add("entropy", torch.ones(10)) == 1.0 and zero.add("entropy", torch.full((2,), 4.0)) == 4.0
    assert one.add("entropy", torch.full((3,), 6.0)) == 6.0
    reduce = reduced(zero, one)
    assert zero.step_means(reduce) == one.step_means(reduce) == {"entropy": pytest.approx(2.4, rel=1e-12)}
    assert zero.sums == {} and zero.step_means() == {}  # the next step starts from nothing


def test_several_metrics_reduce_in_one_tensor_of_sums_and_counts_in_the_same_order_on_every_process():
    # the processes add their metrics in different orders; the reduced tensor is sorted by name on each
    zero, one = TokenMeans(), TokenMeans()
    zero.add("kl", torch.tensor([0.1, 0.3])), zero.add("clip_fraction", torch.tensor([1.0, 0.0, 0.0, 0.0]))
    one.add("clip_fraction", torch.tensor([1.0])), one.add("kl", torch.tensor([0.2] * 6))
    assert zero.totals().tolist() == [[1.0, 4.0], [pytest.approx(0.4), 2.0]]  # clip_fraction, kl
    reduce = reduced(zero, one)
    # clip_fraction: 2 of 5 tokens; kl: (0.1 + 0.3 + 6 x 0.2) / 8 = 0.2
    assert zero.step_means(reduce) == {"clip_fraction": pytest.approx(0.4), "kl": pytest.approx(0.2)}


def test_a_copy_adds_no_token_but_its_name_so_every_process_reduces_the_same_names():
    # a process whose every micro-batch is a copy (an epoch's last global batch smaller than the micro-batches)
    # reduces a tensor of the same shape as the others (a collective of another shape fails or hangs) holding 0s:
    # the step's means are the other processes' tokens'
    copies, real = TokenMeans(), TokenMeans()
    assert copies.add("ratio/mean", torch.tensor([2.0, 2.0]), counted=False) == 2.0  # the copy's own value
    real.add("ratio/mean", torch.tensor([1.0, 0.5, 1.5]))
    assert copies.totals().shape == real.totals().shape and copies.totals().tolist() == [[0.0, 0.0]]
    assert copies.step_means(reduced(copies, real)) == {"ratio/mean": 1.0}


def test_a_name_with_no_token_anywhere_is_left_out_and_a_micro_batch_of_none_has_the_value_nan():
    # every caption of the step failed: no token is measured, the step has no value (its micro-batches' NaN stand)
    zero, one = TokenMeans(), TokenMeans()
    assert math.isnan(zero.add("kl", torch.tensor([])))
    one.add("kl", torch.tensor([]))
    assert zero.step_means(reduced(zero, one)) == {}


def test_the_scored_values_are_the_scored_captions_tokens_or_their_one_value_each():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, float("nan"), 0.0], [6.0, 7.0, 8.0]])  # NaN at padding takes no part
    mask = torch.tensor([[True, True, False], [True, False, False], [True, True, True]])
    assert scored_values(x, mask).tolist() == [1.0, 2.0, 4.0, 6.0, 7.0, 8.0]
    assert scored_values(x, mask, torch.tensor([True, False, True])).tolist() == [1.0, 2.0, 6.0, 7.0, 8.0]
    assert scored_values(x, mask, torch.tensor([False] * 3)).numel() == 0
    per_caption = torch.tensor([[0.5], [1.5], [2.5]])  # GSPO's sequence-level ratio: one per caption
    assert scored_values(per_caption, mask, torch.tensor([True, False, True])).tolist() == [0.5, 2.5]
    assert scored_values(per_caption, mask).tolist() == [0.5, 1.5, 2.5]


def test_a_steps_extreme_is_over_every_processs_micro_batches_and_none_of_a_copy():
    # TRL's clip_ratio/low_min and high_max: the smallest and largest over every caption of every process (its gather
    # then nanmin / nanmax). Process 0: micro-batches [0.5, NaN] (a caption of no token) and [0.25]; process 1: a copy
    # of [0.0] (counted where it was cut from) and [0.75]. Minimum 0.25 (not the copy's 0), maximum 0.75.
    zero, one = TokenMeans(), TokenMeans()
    for means, batches in ((zero, [([0.5, math.nan], True), ([0.25], True)]), (one, [([0.0], False), ([0.75], True)])):
        for values, counted in batches:
            means.add_extreme("share/low_min", torch.tensor(values), False, counted)
            means.add_extreme("share/high_max", torch.tensor(values), True, counted)
    assert zero.add_extreme("share/low_min", torch.tensor([1.0, 3.0]), False, counted=False) == 1.0  # its own value
    assert math.isnan(zero.add_extreme("share/high_max", torch.tensor([math.nan]), True))  # no value: NaN, left out
    gather, want = gathered(zero, one), {"share/high_max": 0.75, "share/low_min": 0.25}
    assert zero.step_means(gather=gather) == one.step_means(gather=gather) == want
    assert zero.extremes == {} and zero.step_means() == {}  # the next step starts from nothing
    alone = TokenMeans()  # one process whose micro-batches held no value: the name is left out
    alone.add_extreme("share/high_max", torch.tensor([]), True)
    assert alone.step_means() == {}


STD_VALUES = {0: [([1.0, 3.0], True), ([2.0, 2.0, 5.0], True)], 1: [([9.0, 9.0], False), ([4.0], True)]}
"""Two processes' micro-batches of per-caption values (``counted=False``: a copy, counted where it was cut from)."""


def test_a_steps_std_is_over_every_processs_values_and_none_of_a_copy():
    # the step's values: 1, 3, 2, 2, 5 on process 0 and 4 on process 1 (not the copy's 9s): n 6, sum 17, squares 59,
    # Bessel-corrected variance (59 - 17^2 / 6) / 5 = 13/6. Each micro-batch returns its own std (sqrt 2, sqrt 3, 0
    # for one value); the mean of those, process by process, is what was logged until 2026-11-29.
    zero, one = TokenMeans(), TokenMeans()
    own = [means.add_std("spread", torch.tensor(v), counted) for means, p in ((zero, 0), (one, 1))
           for v, counted in STD_VALUES[p]]  # fmt: skip
    assert own == pytest.approx([math.sqrt(2), math.sqrt(3), 0.0, 0.0])
    zero.add("kl", torch.tensor([0.5])), one.add("kl", torch.tensor([1.5]))  # reduced with the others, apart
    reduce = reduced(zero, one)
    want = {"spread": pytest.approx(math.sqrt(13 / 6), rel=1e-12), "kl": 1.0}
    assert zero.step_means(reduce) == one.step_means(reduce) == want
    assert zero.sums == {} and zero.spreads == set() and zero.step_means() == {}  # the next step starts from nothing
    alone = TokenMeans()  # one value in the step: std 0; none: NaN for the micro-batch and no step value
    assert alone.add_std("spread", torch.tensor([7.0])) == 0.0 and alone.step_means() == {"spread": 0.0}
    assert math.isnan(alone.add_std("spread", torch.tensor([]))) and alone.step_means() == {}


def test_a_steps_std_is_trls_nanstd_of_the_steps_values():
    # TRL 1.16 logs reward_std as nanstd of the step's gathered values: the sample std (Bessel's correction)
    nanstd = pytest.importorskip("trl.trainer.utils").nanstd
    zero, one = TokenMeans(), TokenMeans()
    for means, p in ((zero, 0), (one, 1)):
        for values, counted in STD_VALUES[p]:
            means.add_std("spread", torch.tensor(values), counted)
    step = torch.tensor([1.0, 3.0, 2.0, 2.0, 5.0, 4.0], dtype=torch.float64)
    # rel 1e-7: nanstd multiplies by its correction count / (count - 1) in float32
    assert zero.step_means(reduced(zero, one))["spread"] == pytest.approx(float(nanstd(step)), rel=1e-7)
