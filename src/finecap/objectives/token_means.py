"""The per-token metrics of the objectives, logged as the step's token means over every process's tokens.

A per-token metric (MLE's ``accuracy``, SMILE's ``mle_loss``, the GRPO family's ``kl``, ``clip_ratio/low_mean``,
``high_mean`` and ``region_mean`` (``clip_fraction``) and ``ratio/mean``, the logged ``entropy``, and with vLLM's
rollouts ``vllm/logp_diff/mean`` and ``vllm/is_ratio/mean``) is a mean over tokens. The value a step logs is the mean
over *every* token of its global batch: each micro-batch adds the sum of its tokens' values and their count
(:meth:`TokenMeans.add`), and at the step's end both are summed over the processes (one all-reduce,
:meth:`TokenMeans.step_means`), so the value does not change with how the step is cut into micro-batches and processes,
which hold different numbers of tokens (10 tokens of entropy 1 on one process, 2 of entropy 3 on another: 16 / 12,
where the mean of the two processes' means is 2). TRL 1.16 reduces the sum and count over the processes too
(``GRPOTrainer._compute_loss``'s ``global_masked_mean``), one micro-batch at a time, then averages the micro-batches;
the two agree without gradient accumulation (docs/methods/grpo.md, where finecap differs). Until 2026-11-29 only ``kl``
was the step's token mean; the others were the mean over the processes of each one's mean over its micro-batches of
their token means (MLE's ``accuracy`` and SMILE's ``mle_loss`` too). The log averages a step's value over the steps of
its window, as every value. An objective with per-token metrics derives from :class:`TokenMeanObjective`, which reduces
them at the step's end and logs them as its step values.

A metric's tokens are those of the captions a reward scored (:func:`scored_values`): a failed caption takes no
gradient and is no measurement. GSPO's sequence-level ratio has one value per caption, so ``clip_fraction`` and
``ratio/mean`` are means over the scored captions there (TRL's ``global_masked_mean`` counts sequences too).

A mean over captions is reduced alike, one value per caption: the REINFORCE family's ``reward``, ``reward_greedy``,
``baseline``, ``logprob``, ``sample_words`` and SLE's ``diversity_reward`` are the step's means over every caption of
every process (TRL's ``reward`` is over the step's gathered rewards), not the mean of the micro-batches' means, which
differs where they hold unequal numbers of (scored) captions (until 2026-11-29); so is a share of groups, one value
per image: ``distinct_samples`` and the GRPO family's ``zero_std_groups`` (TRL's ``frac_reward_zero_std`` is over the
step's gathered groups; both the micro-batches' means until 2026-11-29). A standard deviation of per-caption values
(:meth:`TokenMeans.add_std`: ``advantage_std``) is reduced alike too: each micro-batch adds the sum of its values and
of their squares, two more rows of the same all-reduce, and the step's std over every process's values is made of the
reduced sums with Bessel's correction, as TRL 1.16's ``nanstd`` (its ``reward_std``) over the step's gathered values,
0 for a single value where TRL's is NaN (:func:`sample_std`; until 2026-11-29 the log held the mean of the
micro-batches' and processes' stds, which changed with how the step was cut). And an extreme of per-caption values
(:meth:`TokenMeans.add_extreme`: TRL's ``clip_ratio/low_min`` and ``high_max``, the extremes of each caption's share
of clipped tokens, :func:`caption_means`) is the step's over every process's captions (one gather), which the log then
averages over its window's steps as TRL averages its logged values (its name ends in ``_min``, not ``/min``: no
extreme of the log, ``finecap.train.logging.EXTREMES``).

Example::

    >>> one, other = TokenMeans(), TokenMeans()  # two processes' micro-batches
    >>> one.add("entropy", torch.ones(10)), other.add("entropy", torch.tensor([3.0, 3.0]))
    (1.0, 3.0)
    >>> both = one.totals() + other.totals()  # what the all-reduce sums
    >>> one.step_means(lambda t: both)  # (10 + 6) / 12
    {'entropy': 1.3333333333333333}
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from finecap.objectives.base import ObjectiveBase

if TYPE_CHECKING:
    from finecap.contract import TrainContext

Reduce = Callable[[torch.Tensor], torch.Tensor]
"""A sum over the processes (``accelerator.reduce(t, "sum")``), every process taking part with the same shape."""

Gather = Callable[[torch.Tensor], torch.Tensor]
"""Every process's tensor (K,), end to end in process order (``accelerator.gather(t)``: (P x K,)), every process taking
part with the same shape."""


def scored_values(x: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """The values of ``x`` (N, L) at the tokens ``mask`` (N, L) holds of the captions ``rows`` (N,) bool (every one
    for ``None``), or of ``x`` (N, 1) (one per caption: GSPO's) at those captions; 1-D. What ``x`` holds elsewhere
    (a NaN at padding) takes no part.

    >>> x, m = torch.tensor([[1.0, 3.0], [5.0, float("nan")]]), torch.tensor([[True, True], [True, False]])
    >>> scored_values(x, m).tolist(), scored_values(x, m, torch.tensor([False, True])).tolist()
    ([1.0, 3.0, 5.0], [5.0])
    >>> scored_values(torch.tensor([[0.5], [2.0]]), m, torch.tensor([True, False])).tolist()
    [0.5]
    """
    keep = rows.to(x.device, torch.bool) if rows is not None else torch.ones(len(x), dtype=torch.bool, device=x.device)
    if x.shape[-1] == 1:
        return x.flatten()[keep]
    return x[mask.to(x.device, torch.bool) & keep.unsqueeze(1)]


def finite_values(x: torch.Tensor) -> torch.Tensor:
    """The finite entries of ``x`` (one value per caption: a reward, a baseline), 1-D: a caption a reward could not
    score has NaN there and is no value (as :func:`~finecap.rewards.base.scored_mean` reads them).

    >>> finite_values(torch.tensor([0.5, float("nan"), 2.0])).tolist()
    [0.5, 2.0]
    """
    x = x.detach().flatten()
    return x[torch.isfinite(x)]


def sample_std(total: float, squares: float, n: float) -> float:
    """The standard deviation, with Bessel's correction (TRL 1.16's ``nanstd``), of ``n`` values whose sum is
    ``total`` and sum of squares ``squares`` (float64 sums: :meth:`TokenMeans.add_std`); 0 for one value, NaN for
    none.

    >>> sample_std(3.0, 5.0, 3), sample_std(2.0, 4.0, 1), sample_std(0.0, 0.0, 0)  # (0, 1, 2): variance 1
    (1.0, 0.0, nan)
    """
    if n < 1:
        return math.nan
    if n < 2:
        return 0.0
    return math.sqrt(max(0.0, (squares - total * total / n) / (n - 1)))  # rounding never makes it negative


def spread_keys(name: str) -> tuple[str, str]:
    """The two rows of :attr:`TokenMeans.sums` a standard deviation ``name`` keeps (:meth:`TokenMeans.add_std`):
    its values' ``[sum, count]`` and ``[sum of squares, count]``; never logged."""
    return f"{name}:sum", f"{name}:squares"


def caption_means(x: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Each caption's mean of ``x`` (N, L) over its tokens ``mask`` (N, L), or ``x`` (N, 1) itself (one value per
    caption: GSPO's), for the captions ``rows`` (N,) bool (every one for ``None``); 1-D, NaN for a caption of no token
    (TRL 1.16's ``masked_seq_mean``, whose extremes its ``nanmin`` / ``nanmax`` take over the captions).

    >>> x = torch.tensor([[1.0, 0.0, 9.0], [1.0, 1.0, 1.0]])
    >>> m = torch.tensor([[True, True, False], [True, True, True]])
    >>> caption_means(x, m).tolist(), caption_means(x, m, torch.tensor([False, True])).tolist()
    ([0.5, 1.0], [1.0])
    """
    keep = rows.to(x.device, torch.bool) if rows is not None else torch.ones(len(x), dtype=torch.bool, device=x.device)
    if x.shape[-1] == 1:
        return x.flatten()[keep]
    m = mask.to(x.device, x.dtype)
    return ((x * m).sum(-1) / m.sum(-1))[keep]  # (N,): 0 / 0 = NaN for a caption of no token, as TRL's


class TokenMeans:
    """One process's sums and counts of the step's per-token metrics (module docstring), added micro-batch by
    micro-batch; :meth:`step_means` reduces them over the processes and starts the next step."""

    def __init__(self) -> None:
        self.sums: dict[str, list[float]] = {}  # name: [sum of the values, their count]
        self.extremes: dict[str, list[float]] = {}  # name: [1 for a maximum, -1 for a minimum; the largest sign x v]
        self.spreads: set[str] = set()  # the standard deviations (add_std), each two rows of sums (spread_keys)

    def add(self, name: str, values: torch.Tensor, counted: bool = True) -> float:
        """Add one micro-batch's ``values`` (1-D, one per token: :func:`scored_values`) to the step's ``name`` and
        return their mean, the micro-batch's value (NaN over none). ``counted=False`` (a copy,
        :func:`~finecap.contract.is_copy`, whose tokens are counted where it was cut from) adds nothing, but the
        name is known still: every process reduces the same names."""
        values = values.detach().double()
        n = values.numel()
        total = float(values.sum())  # the one synchronisation: the count is the shape's, the mean their ratio
        entry = self.sums.setdefault(name, [0.0, 0.0])
        if counted:
            entry[0] += total
            entry[1] += n
        return total / n if n else math.nan

    def add_std(self, name: str, values: torch.Tensor, counted: bool = True) -> float:
        """Add one micro-batch's ``values`` (1-D, one per caption) to the step's standard deviation ``name`` and
        return theirs (:func:`sample_std`: 0 for one value, NaN for none): their sum and sum of squares go to two
        rows of the sums :meth:`add` keeps (:func:`spread_keys`), reduced over the processes with the others, from
        which :meth:`step_means` makes the std over every process's values. ``counted`` as :meth:`add`.

        >>> one, other = TokenMeans(), TokenMeans()  # two processes: values (0, 2) and (1,)
        >>> one.add_std("a", torch.tensor([0.0, 2.0])), other.add_std("a", torch.tensor([1.0]))
        (1.4142135623730951, 0.0)
        >>> both = one.totals() + other.totals()
        >>> one.step_means(lambda t: both)  # the std of (0, 2, 1)
        {'a': 1.0}
        """
        values = values.detach().double()
        n = values.numel()
        total, squares = torch.stack((values.sum(), values.square().sum())).tolist()  # the one synchronisation
        self.spreads.add(name)
        for key, value in zip(spread_keys(name), (total, squares), strict=True):
            entry = self.sums.setdefault(key, [0.0, 0.0])
            if counted:
                entry[0] += value
                entry[1] += n
        return sample_std(total, squares, n)

    def add_extreme(self, name: str, values: torch.Tensor, highest: bool, counted: bool = True) -> float:
        """Add one micro-batch's ``values`` (1-D, a NaN left out: a caption of no token) to the step's extreme
        ``name``, the largest (``highest``) or smallest over every process's micro-batches (:meth:`step_means`), and
        return the micro-batch's own (NaN over none). ``counted`` as :meth:`add`."""
        sign = 1.0 if highest else -1.0
        values = sign * values.detach().double()
        values = values[~torch.isnan(values)]
        own = float(values.max()) if values.numel() else -math.inf  # the one synchronisation
        entry = self.extremes.setdefault(name, [sign, -math.inf])
        if counted:
            entry[1] = max(entry[1], own)
        return sign * own if values.numel() else math.nan

    def totals(self) -> torch.Tensor:
        """(K, 2) float64: each name's ``[sum, count]``, names sorted (the same order on every process)."""
        return torch.tensor([self.sums[name] for name in sorted(self.sums)], dtype=torch.float64).reshape(-1, 2)

    def extreme_values(self) -> torch.Tensor:
        """(K,) float64: each extreme's value so far times its sign (1 for a maximum, -1 for a minimum: the largest
        is the extreme), -inf for none, names sorted (the same order on every process)."""
        return torch.tensor([self.extremes[name][1] for name in sorted(self.extremes)], dtype=torch.float64)

    def step_means(self, reduce: Reduce | None = None, gather: Gather | None = None) -> dict[str, float]:
        """The step's token mean of each name over every process's tokens (``reduce``: the sum over the processes,
        ``None`` on one), each standard deviation (:meth:`add_std`) over every process's values, reduced alike, and
        each extreme (:meth:`add_extreme`) over every process's values (``gather``: the processes' tensors end to
        end, ``None`` on one); a name with no value anywhere left out (its micro-batches' NaN stand); the step starts
        again from nothing."""
        names, totals = sorted(self.sums), self.totals()
        if reduce is not None and names:
            totals = reduce(totals).cpu()
        rows = dict(zip(names, totals.tolist(), strict=True))
        out = {}
        for name in sorted(self.spreads):
            (total, n), (squares, _) = (rows.pop(key) for key in spread_keys(name))
            if n > 0:
                out[name] = sample_std(total, squares, n)
        out.update({name: s / c for name, (s, c) in rows.items() if c > 0})
        extremes, signed = sorted(self.extremes), self.extreme_values()
        if gather is not None and extremes:
            signed = gather(signed).cpu().reshape(-1, len(extremes)).amax(dim=0)  # (P, K) -> (K,)
        for name, value in zip(extremes, signed.tolist(), strict=True):
            if value > -math.inf:
                out[name] = self.extremes[name][0] * value
        self.sums, self.extremes, self.spreads = {}, {}, set()
        return out


class TokenMeanObjective(ObjectiveBase):
    """An objective whose per-token metrics are the step's token means (module docstring): its ``__call__`` adds each
    micro-batch's tokens' values to :attr:`token_means` (:meth:`TokenMeans.add`, ``counted=False`` for a copy:
    :func:`~finecap.contract.is_copy`) and logs what ``add`` returns, the micro-batch's own value; :meth:`end_step`
    reduces them over the processes (a collective: every process calls it alike) into :attr:`step_means`, which
    :meth:`step_values` logs in place of the micro-batches' mean (MLE, SMILE, and REINFORCE and the GRPO family:
    :class:`~finecap.objectives.reinforce.Reinforce`). A subclass that overrides :meth:`setup` or :meth:`end_step`
    calls this class's."""

    def __init__(self) -> None:
        self.accelerator: Any = None  # the run's (setup): the step's token means are summed over its processes
        self.token_means = TokenMeans()  # the step's per-token metrics
        self.step_means: dict[str, float] = {}  # their token means over the last step's global batch (end_step)

    def setup(self, ctx: TrainContext) -> None:
        self.accelerator = getattr(ctx, "accelerator", None)

    def process_sum(self) -> Reduce | None:
        """The sum of a tensor over the run's processes (every one must call it alike), ``None`` on one process."""
        acc = self.accelerator
        if acc is None or acc.num_processes == 1:
            return None
        return lambda t: acc.reduce(t.to(acc.device), reduction="sum")

    def process_gather(self) -> Gather | None:
        """Every process's tensor end to end (every one must call it alike), ``None`` on one process."""
        acc = self.accelerator
        if acc is None or acc.num_processes == 1:
            return None
        return lambda t: acc.gather(t.to(acc.device))

    def end_step(self) -> None:
        """The step's token means and extremes (:attr:`step_means`), over every process's tokens; the next step
        starts from nothing."""
        self.step_means = self.token_means.step_means(self.process_sum(), self.process_gather())

    def step_values(self) -> dict[str, float]:
        """The step's per-token metrics (:attr:`step_means`)."""
        return dict(self.step_means)
