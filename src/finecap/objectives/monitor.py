"""The reward-hacking monitor of every RL run: what the sampled captions turn into while a reward is maximised.

A policy maximising a learned or n-gram reward finds what the reward pays for and the task does not: longer and
longer captions (a length-correlated reward), loops of repeated phrases, every sample of an image the same caption,
or, on the world, statements that are not true of the scene. The monitor measures these on the captions each step
samples (no extra decoding) and logs them with the step's other values; none of it enters the loss.

- ``monitor/length_drift``: the mean length (words) of the step's sampled captions relative to that of the run's
  first step whose captions have a word, ``mean_t / mean_1 - 1`` (0 until that step and at it; +0.5 = half as long
  again). A step whose captions are all empty (a fresh policy that stops at once) gives no length to drift from, so
  the start is the next step's (until 2026-11-28 the first step's length was taken even when 0, and the drift, and
  its alarm, stayed 0 for the rest of the run). The start is part of the objective's state, so a resumed run drifts
  from the same start.
- ``monitor/repetition``: the mean over captions of the share of a caption's word 3-grams (:data:`REPETITION_N`) that
  repeat an earlier 3-gram of the same caption (``a red circle a red circle``: 4 trigrams, 1 repeated, 0.25); a
  caption shorter than 3 words has none. Trigrams, because a plain caption may repeat a word or a pair (``a red
  circle and a red square``) but rarely three in a row; loops always do.
- ``distinct_samples`` (logged by the objective when ``rl.samples > 1``, :func:`distinct_shares`): the mean over images
  of the share of distinct captions among the image's samples, every image of the step, every process's (the
  ``distinct`` alarm's measure; until 2026-11-29 the log held the mean of the micro-batches' and processes' means).
- ``monitor/fact_precision``, ``monitor/fact_recall`` (on the world only, where scene graphs say what is true): the
  mean over sampled captions of the world's fact precision and recall (:func:`finecap.world.facts.faithfulness`, the
  parser ``finecap eval``'s faithfulness uses).

- ``kl``: the step's KL to the starting policy (TRL's k3, mean over every token of the step's global batch, so it
  does not depend on how the step is cut into micro-batches; until 2026-11-27 the mean of each micro-batch's token
  mean), handed over by the GRPO objective at the step's end (``end_step(kl=...)``) when ``grpo.kl_coef > 0``: the
  step's token mean the objective logs as ``kl`` (:mod:`finecap.objectives.token_means`; :attr:`Monitor.step_kl`),
  so the log shows the value the alarm read (until 2026-11-29 the log held the mean of the micro-batch means, and a
  run could stop for a KL above its threshold that its log never showed).
- ``failed`` (logged as ``reward/failed`` by the objective, :attr:`Monitor.failed_share`): the step's share of
  sampled captions a reward could not score (``RewardOutput.failed``, e.g. a judge that timed out), handed over by the
  objective (:meth:`Monitor.observe_failed`) for every micro-batch, one whose reward gave ``failed=None`` as none
  failed (until 2026-11-28 such a micro-batch was left out of the share, which a step's other failures then
  overstated: in the alarm until that day's first fix, in the logged value until its second). It is logged from the
  run's first step with a failed caption on (0 at a step without), so a reward that never fails logs none; the
  measure is the same whether logged or alarmed.
- ``greedy_failed`` (logged as ``reward_greedy/failed``, :attr:`Monitor.greedy_failed_share`; ``rl.baseline=greedy``
  only): the step's share of the greedy captions a reward could not score, over every process and micro-batch,
  handed over by the objective (:meth:`Monitor.observe_greedy_failed`). Such an image's samples take the mean of its
  other samples as baseline instead (leave-one-out: :class:`~finecap.objectives.baselines.GreedyBaseline`), and
  none with ``rl.samples=1``; a run whose greedy captions fail is then no longer SCST. A measure of its own, not
  counted in ``failed``: that one is the share of sampled captions, which lose their gradient, and greedy failures
  added to it would be diluted by the s samples of each image (every greedy caption failed, none of 5 samples:
  1/6). Until 2026-11-29 no alarm read it, and ``reward_greedy/failed`` was the mean of the micro-batches' shares.

Every measure counts each caption of the step once: a micro-batch that repeats another's examples (an epoch's last
global batch smaller than processes x accumulation steps; :attr:`~finecap.contract.StepInfo.copy`, which the engine
weights 0) hands the monitor nothing (:meth:`Reinforce.watch <finecap.objectives.reinforce.Reinforce.watch>`, and the
GRPO objective's KL). Until 2026-11-28 its captions were counted again: 2 images cut into 3 micro-batches counted the
first image's twice, a failed share of 2/9 for 1/6 (``tests/objectives/test_policy_objective.py``).

**Alarms** (``rl.alarms``, off by default): a mapping of measure to threshold. ``length_drift`` sounds when the
drift's size exceeds its threshold (either way: longer or shorter), ``repetition``, ``kl``, ``failed`` and
``greedy_failed`` when the value exceeds it, ``distinct``, ``fact_precision`` and ``fact_recall`` when the value
falls below it (the configuration refuses one that could never sound: ``distinct`` with one sample per image, the
fact measures off the world, ``greedy_failed`` without the greedy baseline, a share's threshold no share crosses:
:class:`~finecap.config.RLConfig`). Each is checked
once per optimizer step on the step's whole global batch (every process's captions, so every process decides alike),
after the step. ``rl.alarm_action=warn`` logs one warning per measure, the first time it sounds in the run (the
measures warned about are part of the objective's state, so a resumed run does not warn again; until 2026-11-28 it
did); ``stop`` ends training
with :class:`RewardHackingAlarm`, one line naming the step and the measure (``finecap train`` exits with code 2),
after the alarmed step, the steps since the last log event and the line itself (a ``stop`` event) are logged (until
2026-11-28 the run ended before any of them was: up to ``train.log_every`` steps missing from the log).

Example::

    >>> repetition("a red circle a red circle"), repetition("a red circle and a red square"), repetition("a circle")
    (0.25, 0.0, 0.0)
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, get_args

import torch

from finecap.config import RLConfig
from finecap.config.sections.rl import SOUNDS_BELOW, AlarmMeasure
from finecap.data.references import world_scenes
from finecap.objectives.base import StopTraining
from finecap.utils.text import short_repr

if TYPE_CHECKING:
    from finecap.contract import TrainContext
    from finecap.world.scene import Scene

log = logging.getLogger(__name__)

REPETITION_N = 3
"""The n of ``monitor/repetition``: word n-grams repeated within one caption."""

# The step's sums (this process), in this order, reduced over processes at the end of the step.
SUMS = (
    "captions",
    "words",
    "repetition",
    "groups",
    "distinct",
    "scored",
    "precision",
    "recall",
    "failed",
    "rewarded",
    "greedy_failed",
    "greedy",
)


class RewardHackingAlarm(StopTraining):
    """A measure of :mod:`finecap.objectives.monitor` crossed its ``rl.alarms`` threshold with
    ``rl.alarm_action=stop``; the message names the step and the measure. A :class:`StopTraining`: the engine logs the
    step and the values since the last log event, then the message (a ``stop`` event), before the run ends."""


def repetition(text: str, n: int = REPETITION_N) -> float:
    """Share of the word ``n``-grams of ``text`` that repeat an earlier one of the same text (0 without n-grams)."""
    words = text.split()
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def distinct_shares(texts: list[str], s: int) -> list[float]:
    """Each image's share of distinct captions among its samples (distinct captions / s), captions of one image
    contiguous in groups of ``s``; 1 for each caption with ``s <= 1``.

    >>> distinct_shares(["a", "a", "b", "c", "d", "e"], 3)
    [0.6666666666666666, 1.0]
    """
    if s <= 1:
        return [1.0] * len(texts)
    groups = [texts[i : i + s] for i in range(0, len(texts), s)]
    return [len(set(g)) / len(g) for g in groups]


def distinct_share(texts: list[str], s: int) -> float:
    """Mean over images of :func:`distinct_shares`; 1 for no caption."""
    shares = distinct_shares(texts, s)
    return sum(shares) / len(shares) if shares else 1.0


class Monitor:
    """Measures the sampled captions of each step and sounds ``rl.alarms`` (module docstring).

    Args:
        rl: the ``rl`` section (``samples``, ``alarms``, ``alarm_action``).
    """

    def __init__(self, rl: RLConfig | None = None):
        rl = rl or RLConfig()
        self.samples, self.alarms, self.action = rl.samples, dict(rl.alarms), rl.alarm_action
        self.first_length: float | None = None  # mean words of the first step's captions with a word (global batch)
        self.scenes: Mapping[Hashable, Scene] | None = None
        self.accelerator: Any = None
        self.warned: set[str] = set()
        self.failed_seen = False  # whether a step of the run had a caption a reward could not score
        self.failed_share: float | None = None  # the last step's share of them, from the first such step on
        self.greedy_failed_share: float | None = None  # the last step's share of failed greedy captions (if any)
        self.step_kl: float | None = None  # the last step's token mean KL (None without grpo.kl_coef)
        self.step: int | None = None  # the step being measured (1-based, as logged), when the engine says it
        self._sums = dict.fromkeys(SUMS, 0.0)

    def setup(self, ctx: TrainContext) -> None:
        self.accelerator = getattr(ctx, "accelerator", None)
        self.scenes = world_scenes(getattr(ctx, "cfg", None))

    def measure(
        self, texts: Sequence[str], image_ids: Sequence[Hashable], step: int | None = None
    ) -> dict[str, float]:
        """The measures of one micro-batch's sampled captions (``image_ids``: each caption's image), to log; they are
        also added to the step's sums for the alarms (:meth:`end_step`)."""
        from finecap.metrics.faithfulness import scene_of

        n = len(texts)
        words = sum(len(t.split()) for t in texts)
        rep = sum(repetition(t) for t in texts)
        groups = max(1, n // max(1, self.samples))
        distinct = distinct_share(list(texts), self.samples) * groups
        sums = {"captions": n, "words": words, "repetition": rep, "groups": groups, "distinct": distinct}
        out = {"monitor/length_drift": self._drift(words / max(1, n)), "monitor/repetition": rep / max(1, n)}
        if self.scenes is not None:
            from finecap.world.facts import faithfulness

            scored = [faithfulness(t, scene) for t, i in zip(texts, image_ids, strict=True)
                      if (scene := scene_of(i, self.scenes)) is not None]  # fmt: skip
            k = len(scored)
            sums.update(scored=k, precision=sum(f.precision for f in scored), recall=sum(f.recall for f in scored))
            out["monitor/fact_precision"] = sums["precision"] / max(1, k)
            out["monitor/fact_recall"] = sums["recall"] / max(1, k)
        for key, value in sums.items():
            self._sums[key] += float(value)
        if step is not None:
            self.step = step
        return out

    def observe_failed(self, failed: int, captions: int) -> None:
        """Add one micro-batch's count of captions a reward could not score (``RewardOutput.failed``) out of its
        ``captions`` to the step's sums (the ``failed`` alarm reads their share over the step's global batch)."""
        self._sums["failed"] += float(failed)
        self._sums["rewarded"] += float(captions)

    def observe_greedy_failed(self, failed: int, captions: int) -> None:
        """Add one micro-batch's count of greedy captions (the greedy baseline's) a reward could not score out of its
        ``captions`` greedy captions to the step's sums (the ``greedy_failed`` alarm reads their share over the
        step's global batch)."""
        self._sums["greedy_failed"] += float(failed)
        self._sums["greedy"] += float(captions)

    def _drift(self, mean_length: float) -> float:
        return 0.0 if not self.first_length else mean_length / self.first_length - 1.0

    def step_values(self) -> dict[str, float]:
        """The step's measures over the global batch (every process's captions), as the alarms read them."""
        values = torch.tensor([self._sums[k] for k in SUMS], dtype=torch.float64)
        acc = self.accelerator
        if acc is not None and acc.num_processes > 1:
            values = acc.reduce(values.to(acc.device), reduction="sum").cpu()
        sums = dict(zip(SUMS, values.tolist(), strict=True))
        if sums["captions"] == 0:
            return {}
        length = sums["words"] / sums["captions"]
        if not self.first_length:  # the first step with a word (an all-empty step has no length to drift from)
            self.first_length = length or None
        out = {"length_drift": self._drift(length), "repetition": sums["repetition"] / sums["captions"],
               "distinct": sums["distinct"] / max(1.0, sums["groups"])}  # fmt: skip
        if sums["rewarded"] > 0:
            out["failed"] = sums["failed"] / sums["rewarded"]
        if sums["greedy"] > 0:
            out["greedy_failed"] = sums["greedy_failed"] / sums["greedy"]
        if sums["scored"] > 0:
            out["fact_precision"] = sums["precision"] / sums["scored"]
            out["fact_recall"] = sums["recall"] / sums["scored"]
        return out

    def end_step(self, kl: float | None = None) -> None:
        """After an optimizer step: the step's global measures, the first step's length kept, the alarms checked;
        ``kl``: the step's KL to the starting policy, over every token of its global batch (``None``: none, no
        ``grpo.kl_coef``, or no scored token)."""
        values = self.step_values()
        if kl is not None:
            values["kl"] = kl
        self._sums = dict.fromkeys(SUMS, 0.0)
        self.failed_seen = self.failed_seen or values.get("failed", 0.0) > 0
        self.failed_share = values.get("failed") if self.failed_seen else None
        self.step_kl = values.get("kl")
        self.greedy_failed_share = values.get("greedy_failed")
        for measure, threshold in self.alarms.items():
            if measure not in values:
                continue  # fact_* off the world
            value = values[measure]
            high = measure not in SOUNDS_BELOW
            crossed = (abs(value) if measure == "length_drift" else value) > threshold if high else value < threshold
            if not crossed:
                continue
            where = f"step {self.step}" if self.step is not None else "this step"
            side = "above" if high else "below"
            what = {
                "kl": "the KL to the starting policy (rl.alarms.kl)",
                "failed": "the share of captions a reward could not score (rl.alarms.failed)",
                "greedy_failed": "the share of greedy captions a reward could not score (rl.alarms.greedy_failed)",
            }.get(measure, f"the sampled captions' {measure}")
            size = "its size " if measure == "length_drift" else ""  # either way: -0.6 crosses 0.5 by its size
            why = {
                "failed": "the reward could not score them (a judge that failed?)",
                "greedy_failed": "the reward could not score them (a judge that failed?), and their images' samples "
                "took the mean of the image's other samples as baseline, not the greedy caption's reward (no "
                "baseline with rl.samples=1)",
            }.get(measure, "the policy may be exploiting the reward")
            message = f"rl.alarms: at {where} {what} is {value:.4g}, {size}{side} its threshold {threshold:g}: {why}"
            if self.action == "stop":
                raise RewardHackingAlarm(f"{message}; training stopped (rl.alarm_action=stop)")
            if measure not in self.warned:
                self.warned.add(measure)
                if self.accelerator is None or self.accelerator.is_main_process:
                    log.warning("%s (warned once per measure; rl.alarm_action=stop ends the run)", message)

    def state_dict(self) -> dict[str, Any]:
        """The length drift's start, the measures warned about (``rl.alarm_action=warn`` warns once per run, a
        resumed one included) and whether a caption failed yet (``reward/failed`` is logged from then on)."""
        return {"first_length": self.first_length, "warned": sorted(self.warned), "failed_seen": self.failed_seen}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`; ``ValueError`` unless the first length is ``None`` or a number >= 0 (0, saved
        before 2026-11-28 after an all-empty first step, is read as no start yet) and ``warned`` a list of alarm
        measures (absent before 2026-11-28: none warned), ``failed_seen`` a bool (absent before then: ``False``)."""
        first = state.get("first_length")
        if first is not None and (isinstance(first, bool) or not isinstance(first, int | float) or not first >= 0):
            raise ValueError(f"monitor 'first_length' must be a number >= 0 or null, got {short_repr(first)}")
        warned = state.get("warned", [])
        measures = get_args(AlarmMeasure)
        if not isinstance(warned, list) or not all(isinstance(m, str) and m in measures for m in warned):
            raise ValueError(f"monitor 'warned' must be a list of alarm measures, got {short_repr(warned)}")
        seen = state.get("failed_seen", False)
        if not isinstance(seen, bool):
            raise ValueError(f"monitor 'failed_seen' must be true or false, got {short_repr(seen)}")
        self.first_length = float(first) if first else None
        self.warned, self.failed_seen = set(warned), seen
