"""REINFORCE baselines, usable with any reward (``rl.baseline``).

A baseline is called as ``baseline(rewards, image_index, greedy) -> b`` with the (N,) rewards of the decoded
captions, their batch rows ``image_index`` (N,) (rows of one image contiguous) and, when ``needs_greedy`` is True,
the (B,) rewards of the greedily decoded caption of each image; it returns the (N,) values subtracted from the
rewards. The advantage is ``rewards - b``. A baseline that learns from the rewards it is called with (``mean``) also
has ``predict``, the same call recording nothing: what the objective calls for a copy micro-batch
(:func:`baseline_of`, :func:`~finecap.contract.is_copy`), whose rewards are those of the micro-batch it repeats.

- ``greedy`` (SCST, Rennie et al. 2017; the sequence-level exploration paper Sec. 4.3): the reward of the image's
  greedy caption under the current model, ``b_j = R(greedy caption of image(j))``. Where a reward could not score
  the greedy caption (``RewardOutput.failed``: a judge that failed on it), the image's samples fall back to the
  ``leave_one_out`` baseline below, the mean of its other scored samples (self-critical.pytorch's ``sample``
  baseline, Luo 2020's SCST variant), so they still learn against a baseline that does not depend on them; with
  ``rl.samples=1`` there is none, and they take no gradient. Until 2026-11-29 every sample of such an image had
  advantage 0 (``reward_greedy/failed`` now logs how often a greedy caption failed).
- ``mean`` (DiscriTune appendix B.1, NDLB appendix C.2): a running mean of past rewards. DiscriTune's code base
  (EGG's ``MeanBaseline``) keeps the *cumulative mean of per-batch mean rewards*,
  ``m_t = m_{t-1} + (mean_t - m_{t-1}) / t``, and subtracts ``m_{t-1}`` (the mean of *past* batches) before
  updating with the current batch; ``rl.mean_momentum = mu > 0`` uses an exponential moving average
  ``m_t = mu * m_{t-1} + (1 - mu) * mean_t`` instead. At the very first step, with no past rewards, the baseline
  is 0, as in EGG (the first step trains without a baseline). A "batch" is one optimizer step's *global* batch:
  the rewards of all its micro-batches and processes are summed, and the mean is updated once, after the step
  (``end_step``, called by the training loop), so the baseline does not depend on the number of processes or
  accumulation steps and every process holds the same running mean. A copy micro-batch's rewards (an epoch's last
  global batch repeated to fill the step) are not summed (until 2026-11-28 they were, and the mean of a short last
  batch weighed the repeated examples twice). Used outside the loop, call ``end_step()`` after each batch. The
  state (mean, number of batches) is saved in checkpoints and restored on ``--resume``.
- ``leave_one_out``: the mean reward of the other ``s - 1`` captions of the same image,
  ``b_j = (sum_k r_k - r_j) / (s - 1)`` (needs ``s >= 2``; unbiased since ``b_j`` does not depend on ``y_j``).
- ``none``: ``b = 0``.

Example::

    >>> import torch
    >>> rewards = torch.tensor([1.0, 2.0, 6.0])  # three captions of one image
    >>> LeaveOneOut()(rewards, torch.tensor([0, 0, 0]), None).tolist()  # (2+6)/2, (1+6)/2, (1+2)/2
    [4.0, 3.5, 1.5]
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, get_args

import torch

from finecap.config import Baseline, RLConfig
from finecap.utils.text import short_repr

if TYPE_CHECKING:
    from finecap.contract import TrainContext

BASELINES = get_args(Baseline)


def call_hook(obj: Any, hook: str, *args: Any) -> Any:
    """Call ``obj.hook(*args)`` when ``obj`` defines it (a baseline's optional ``setup``, ``end_step`` and state
    hooks)."""
    fn = getattr(obj, hook, None)
    return fn(*args) if callable(fn) else None


def baseline_of(baseline: Any, rewards: torch.Tensor, image_index: torch.Tensor, greedy: torch.Tensor | None,
                counted: bool = True) -> torch.Tensor:  # fmt: skip
    """``baseline(rewards, image_index, greedy)``, the (N,) baseline values; with ``counted=False`` (a copy
    micro-batch's rewards, which count nowhere) a baseline's ``predict`` when it has one: the same values, with
    nothing recorded (the running mean's sums). A baseline without ``predict`` keeps no such state."""
    predict = getattr(baseline, "predict", None)
    if not counted and callable(predict):
        return predict(rewards, image_index, greedy)
    return baseline(rewards, image_index, greedy)


class NoBaseline:
    """``b = 0``."""

    needs_greedy = False

    def __call__(self, rewards: torch.Tensor, image_index: torch.Tensor, greedy: torch.Tensor | None) -> torch.Tensor:
        return torch.zeros_like(rewards)


class GreedyBaseline:
    """SCST: ``b_j`` = reward of the greedy caption of caption j's image; where a reward could not score that greedy
    caption (``RewardOutput.failed``: its reward is NaN), the mean reward of the image's other scored samples
    (:func:`others_mean`, the leave-one-out baseline; NaN, so no gradient, where there is none: ``rl.samples=1``).

    >>> rewards = torch.tensor([1.0, 2.0, 3.0, 2.0, 4.0, 6.0])  # 2 images x 3 samples; image 1's greedy failed
    >>> GreedyBaseline()(rewards, torch.tensor([0, 0, 0, 1, 1, 1]), torch.tensor([2.0, float("nan")])).tolist()
    [2.0, 2.0, 2.0, 5.0, 4.0, 3.0]
    """

    needs_greedy = True

    def __call__(self, rewards: torch.Tensor, image_index: torch.Tensor, greedy: torch.Tensor | None) -> torch.Tensor:
        if greedy is None:
            raise ValueError("rl.baseline=greedy: the rewards of the greedy captions are missing")
        index = image_index.to(rewards.device)
        baseline = greedy.to(rewards.device, rewards.dtype)[index]  # (N,)
        missing = ~torch.isfinite(baseline)  # a failed greedy caption (only a failed caption's reward is not finite)
        if not bool(missing.any()):
            return baseline
        return torch.where(missing, others_mean(rewards, index), baseline)


class LeaveOneOut:
    """``b_j`` = mean reward of the other captions of the same image (every image needs >= 2 captions)."""

    needs_greedy = False

    def __call__(self, rewards: torch.Tensor, image_index: torch.Tensor, greedy: torch.Tensor | None) -> torch.Tensor:
        index = image_index.to(rewards.device)
        n_images = int(index.max()) + 1 if len(index) else 0
        counts = torch.bincount(index, minlength=n_images)  # (B,)
        if bool((counts[index] < 2).any()):
            raise ValueError("rl.baseline=leave_one_out needs at least 2 captions per image (rl.samples >= 2)")
        return others_mean(rewards, index)


def others_mean(rewards: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(N,): the mean reward of the other scored captions of each caption's image (``index`` (N,): its batch row),
    ``(sum_k r_k - r_j) / (s - 1)``; NaN where there is none (one caption, or its image's others all failed: the
    caption then takes no gradient). A caption a reward could not score (``RewardOutput.failed``) is NaN in
    ``rewards`` and is left out. :class:`LeaveOneOut`'s baseline, and :class:`GreedyBaseline`'s where a greedy caption
    failed."""
    n_images = int(index.max()) + 1 if len(index) else 0
    scored = torch.isfinite(rewards)  # a caption a reward could not score (RewardOutput.failed) is NaN
    if bool(scored.all()):
        counts = torch.bincount(index, minlength=n_images)  # (B,)
        sums = torch.zeros(n_images, dtype=rewards.dtype, device=rewards.device).index_add_(0, index, rewards)
        return (sums[index] - rewards) / (counts[index] - 1).to(rewards.dtype)  # (N,): 0 / 0 = NaN for one caption
    # the mean of the other *scored* captions (NaN when none is: the caption then takes no gradient)
    kept = torch.where(scored, rewards, torch.zeros_like(rewards))
    sums = torch.zeros(n_images, dtype=rewards.dtype, device=rewards.device).index_add_(0, index, kept)
    n_scored = torch.zeros(n_images, dtype=rewards.dtype, device=rewards.device).index_add_(
        0, index, scored.to(rewards.dtype)
    )
    others = n_scored[index] - scored.to(rewards.dtype)
    return (sums[index] - kept) / others  # (N,): 0 / 0 = NaN where no other caption was scored


class MeanBaseline:
    """Running mean of past batch-mean rewards (cumulative, or exponential with ``momentum > 0``); see the module
    docstring for the exact update."""

    needs_greedy = False

    def __init__(self, rl: RLConfig | None = None):
        self.momentum = (rl or RLConfig()).mean_momentum  # rl.mean_momentum, in [0, 1) (the section checks it)
        self.mean = 0.0
        self.count = 0
        self._sum, self._n = 0.0, 0  # rewards of the current optimizer step so far (this process)
        self._accelerator: Any = None

    def setup(self, ctx: TrainContext) -> None:
        self._accelerator = ctx.accelerator

    def update(self, batch_mean: float) -> None:
        self.count += 1
        if self.momentum > 0 and self.count > 1:
            self.mean = self.momentum * self.mean + (1.0 - self.momentum) * batch_mean
        else:
            self.mean += (batch_mean - self.mean) / self.count  # cumulative mean (first batch: its own mean)

    def __call__(self, rewards: torch.Tensor, image_index: torch.Tensor, greedy: torch.Tensor | None) -> torch.Tensor:
        """:meth:`predict`, after adding ``rewards`` to the step's sums (folded into the mean at :meth:`end_step`)."""
        detached = rewards.detach().double()
        detached = detached[torch.isfinite(detached)]  # failed captions (NaN, RewardOutput.failed) are not rewards
        self._sum += float(detached.sum())
        self._n += detached.numel()
        return self.predict(rewards, image_index, greedy)

    def predict(self, rewards: torch.Tensor, image_index: torch.Tensor, greedy: torch.Tensor | None) -> torch.Tensor:
        """The baseline of ``rewards`` (N,), recording nothing (a copy micro-batch's: :func:`baseline_of`): the mean
        of *past* steps (0 before the first one, as EGG)."""
        return torch.full_like(rewards, self.mean)

    def end_step(self) -> None:
        """Fold this optimizer step's rewards (all micro-batches, all processes) into the running mean."""
        stats = torch.tensor([self._sum, float(self._n)], dtype=torch.float64)
        acc = self._accelerator
        if acc is not None and acc.num_processes > 1:
            stats = acc.reduce(stats.to(acc.device), reduction="sum").cpu()
        self._sum, self._n = 0.0, 0
        if stats[1] > 0:
            self.update(float(stats[0] / stats[1]))

    def state_dict(self) -> dict[str, float | int]:
        return {"mean": self.mean, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; ``ValueError`` for anything but a finite mean and a count >= 0 (a tampered or
        damaged state would silently shift every advantage)."""
        mean, count = state["mean"], state["count"]
        if isinstance(mean, bool) or not isinstance(mean, int | float) or not math.isfinite(mean):
            raise ValueError(f"baseline 'mean' must be a finite number, got {short_repr(mean)}")
        if type(count) is not int or count < 0:
            raise ValueError(f"baseline 'count' must be an integer >= 0, got {short_repr(count)}")
        self.mean, self.count = float(mean), count


def build_baseline(rl: RLConfig):
    """The baseline ``rl.baseline`` names (one of :data:`BASELINES`; the section checked the name)."""
    if rl.baseline == "mean":
        return MeanBaseline(rl)
    return {"greedy": GreedyBaseline, "leave_one_out": LeaveOneOut, "none": NoBaseline}[rl.baseline]()
