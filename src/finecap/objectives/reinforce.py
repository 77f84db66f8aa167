"""REINFORCE with pluggable rewards and baselines: SCST, DiscriTune/NDLB-style self-retrieval, SLL-ME.

One step, per batch of B images (``train.objective=reinforce``, options in the ``rl`` section):

1. **Roll out** (no gradient, model in eval mode): decode s = ``rl.samples`` captions per image
   (``rl.strategy=sample`` at ``rl.temperature``; ``greedy`` or ``beam`` for s = 1), plus the greedy caption of each
   image when the baseline needs it (``rl.baseline=greedy``).
2. **Score**: ``R = sum_i w_i r_i`` (``rl.rewards``, see :mod:`finecap.rewards`) of every caption, and of the greedy
   captions; every part is logged (``reward/<name>``).
3. **Baseline** (:mod:`finecap.objectives.baselines`): ``b`` per caption; advantage ``A = R - b`` (no gradient).
4. **Surrogate loss** (model in train mode, with gradient): ``loss = -mean_n A_n * log p(y_n | x_n)`` over the N =
   B*s captions, i.e. ``(1/B) sum_i (1/s) sum_j`` as Eq. 15 of the sequence-level exploration paper.
   ``log p`` is the sum of the caption's token log-probs (stop token included; ``rl.logprob=sum``, the REINFORCE
   gradient of the sequence probability) or their mean (``rl.logprob=mean``, length-normalised). With
   ``rl.scaled_logprob=true`` and sampling, the token log-probs are those of the temperature-scaled distribution
   ``softmax(logits / T)`` that was sampled from (NDLB); otherwise of the model at T = 1.
5. Optional **max-entropy** term (SLL-ME, ``rl.entropy_coef > 0`` or ``train.objective=scst_me``): the loss
   ``entropy = -coef * mean token entropy`` (:mod:`finecap.objectives.entropy`), from the same forward pass, over
   the captions a reward scored (a failed caption takes no gradient from it either).

Losses returned: ``reinforce`` (and ``entropy``); metrics: mean reward and parts, greedy reward (and the share of
greedy captions a reward could not score), baseline, advantage spread, sampled caption length, share of distinct
captions per image, the reward-hacking monitor's measures (``monitor/*``, :mod:`finecap.objectives.monitor`, with
its ``rl.alarms``), and the seconds spent decoding (``time/generate``) and scoring (``time/reward``), the
micro-batch's (the engine logs the step's sum: :func:`finecap.train.logging.step_sum`).

The GRPO family (group advantages, the clipped surrogate over several iterations, a KL to the starting policy, token
aggregation: ``grpo.advantage``, ``grpo.policy_loss`` and the options after them) is this objective with options, built
by the same factory: :class:`finecap.objectives.grpo.PolicyOptimization`. With the defaults it is this class.

Choices the papers leave open:

- Decoding runs in eval mode (no dropout) and the log-probs with gradient in train mode, as the training loop puts
  the model in train mode. With dropout (the world-tiny GPT-2 preset has GPT-2's 0.1) the scored policy is thus the
  dropout-perturbed one, a small mismatch that self-critical implementations sampling in train mode share the other
  way round; the captions themselves are always drawn from the clean policy.
- The loss is a mean over captions (not a sum), so its scale does not depend on the batch size or s; so is EGG's
  REINFORCE (DiscriTune's code base: ``((loss - baseline) * log_prob).mean()`` over messages, EOS included).
  self-critical.pytorch's ``RewardCriterion`` (SCST's reference code) divides by the batch's tokens instead (stop
  tokens included): the same gradient direction, finecap's ``T / N`` times larger with ``rl.logprob=sum`` (T tokens,
  N captions: the mean caption length), a factor Adam's normalisation largely absorbs and plain SGD's learning rate
  does not. ``grpo.policy_loss=clipped grpo.loss_aggregation=token`` at one iteration has its gradient exactly
  (both written out in ``tests/objectives/test_reinforce_reference.py``).
- Sampling in the training loop is seeded per image: the draws of image ``i`` at optimizer step ``t`` are a function
  of ``(run.seed, t, i)`` (Gumbel-max with counter-based noise, :func:`finecap.decode.sample`), so they do not depend
  on how the global batch is split over processes and accumulation steps, and ``--resume`` repeats them exactly.
  Called outside the loop (no ``batch['step_info']``), sampling uses torch's global random state.
- The log-probs with gradient come from the captioner's ``forward`` (given the sampled sequences), the one entry
  point that DDP synchronises; decoding uses the bare model (:func:`finecap.objectives.base.unwrap`).

**Rollouts on vLLM** (``decode.engine=vllm``, :mod:`finecap.engines.rollouts`): the samples and greedy captions are
decoded by a colocated vLLM engine built at the first rollout and sent the policy's weights before each rollout that
follows an optimizer step; seeded per image as above (vLLM's draws, not finecap's Gumbel noise). Their log-probs are
vLLM's, and TRL's truncated importance-sampling correction weighs each token's log-prob in ``log p`` by
``min(exp(trainer - vllm), rl.vllm_is_cap)`` (:mod:`finecap.objectives.engine_mismatch`; ``rl.vllm_is_correction``),
logging the mismatch (``vllm/logp_diff/*``, ``vllm/is_ratio/*``) and the weight sync's seconds (``time/sync``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, get_args

import torch

from finecap.config import Config, ConfigError, DecodeConfig, LogProb, RLConfig, RunConfig, VllmConfig
from finecap.contract import is_copy
from finecap.decode import Generation, step_seeds
from finecap.engines import engine_class
from finecap.engines.rollouts import RolloutEngine
from finecap.judges.base import tallies_grown
from finecap.models import sharding
from finecap.models.base import set_dropout
from finecap.objectives.base import ObjectiveOutput, unwrap
from finecap.objectives.baselines import baseline_of, build_baseline, call_hook
from finecap.objectives.engine_mismatch import importance_weights, mismatch_metrics, mismatch_values
from finecap.objectives.entropy import mean_entropy
from finecap.objectives.monitor import Monitor, distinct_shares
from finecap.objectives.token_means import TokenMeanObjective, finite_values, scored_values
from finecap.registry import declared_needs
from finecap.rewards import RewardInputs, as_reward, build_reward
from finecap.rewards.base import RewardOutput, check_finite, scored_mean

if TYPE_CHECKING:
    from finecap.contract import TrainContext
    from finecap.rewards.base import Reward

LOGPROBS = get_args(LogProb)


@dataclass
class Rollout:
    """What one step decoded and scored (all without gradient)."""

    samples: Generation  # N = B * s captions, rows of one image contiguous
    rewards: RewardOutput  # total (N,), parts
    baseline: torch.Tensor  # (N,)
    greedy: Generation | None = None  # B greedy captions (baseline=greedy)
    greedy_rewards: RewardOutput | None = None

    @property
    def advantage(self) -> torch.Tensor:
        """``R - b`` (N,); a caption a reward could not score (``RewardOutput.failed``: its total is NaN), or whose
        baseline no scored caption gave (an image whose other samples all failed, under ``leave_one_out`` or a
        failed greedy caption's fallback: :class:`~finecap.objectives.baselines.GreedyBaseline`), has advantage 0:
        it takes no gradient and is never paid as a zero reward."""
        advantage = self.rewards.total - self.baseline
        usable = self.usable
        if self.rewards.failed is None and bool(usable.all()):
            return advantage
        return torch.where(usable.to(advantage.device), advantage, torch.zeros_like(advantage))

    @property
    def usable(self) -> torch.Tensor:
        """(N,) bool: the captions that have an advantage (a finite ``R - b`` of a caption a reward scored); the
        others' :attr:`advantage` is a placeholder 0, left out of the logged advantage values
        (:func:`usable_advantages`)."""
        usable = torch.isfinite(self.rewards.total - self.baseline)  # only failed captions' NaN passed check_finite
        if self.rewards.failed is not None:
            usable &= ~self.rewards.failed.to(usable.device)
        return usable


def rollout_decode(decode: DecodeConfig, rl: RLConfig) -> DecodeConfig:
    """The ``decode`` section of a step's rollout: ``decode`` (its ``max_length``, ``stop_at_period``,
    ``batch_size`` and beam options) with ``rl.strategy``, ``rl.temperature`` and ``rl.samples`` captions per image.
    Sampling draws from the whole tempered distribution (``top_k`` and ``top_p`` off, whatever ``decode`` says):
    the log-probs the loss is scored with (``rl.scaled_logprob``) are of that distribution.

    >>> from finecap.config import DecodeConfig, RLConfig
    >>> section = rollout_decode(DecodeConfig(max_length=16, top_k=5), RLConfig(samples=8, temperature=0.3))
    >>> section.strategy, section.num_return_sequences, section.temperature, section.top_k, section.max_length
    ('sample', 8, 0.3, 0, 16)
    """
    return dataclasses.replace(decode, strategy=rl.strategy, temperature=rl.temperature,
                               num_return_sequences=rl.samples, top_k=0, top_p=1.0)  # fmt: skip


def greedy_decode(decode: DecodeConfig) -> DecodeConfig:
    """The ``decode`` section of the greedy captions of a rollout (the greedy baseline's): ``decode`` decoding one
    caption per image by arg-max."""
    return dataclasses.replace(decode, strategy="greedy", num_return_sequences=1)


def sequence_logprob(token_logprobs: torch.Tensor, lengths: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
    """log p of each caption from its token log-probs (N, L) (0 at padding): their sum, or mean over ``lengths``.

    >>> sequence_logprob(torch.tensor([[-1.0, -2.0, 0.0]]), torch.tensor([2]), "mean").tolist()
    [-1.5]
    """
    total = token_logprobs.sum(dim=1)  # (N,)
    if reduction == "sum":
        return total
    if reduction == "mean":
        return total / lengths.to(total.device, total.dtype).clamp(min=1.0)
    raise ValueError(f"rl.logprob: invalid value {reduction!r}; valid choices: {', '.join(LOGPROBS)}")


def usable_advantages(advantage: torch.Tensor, usable: torch.Tensor | None = None) -> torch.Tensor:
    """The (N,) ``advantage`` of the captions that have one (``usable``, (N,) bool; ``None``: all), 1-D, what
    ``advantage_std`` (:meth:`Reinforce.metrics`), ``advantage/min`` and ``advantage/max`` (:func:`advantage_range`)
    are of: a caption a reward could not score has the placeholder advantage 0 (:attr:`Rollout.advantage`), which is
    no advantage and is left out, as it is of every statistic (docs/methods/grpo.md). Until 2026-11-29 the
    placeholders counted: a step with failed captions logged a smaller spread, and a 0 as an extreme no caption had.

    >>> usable_advantages(torch.tensor([-1.0, 0.0, 1.0, 0.0]), torch.tensor([True, True, True, False])).tolist()
    [-1.0, 0.0, 1.0]
    """
    values = advantage.detach()
    return values if usable is None else values[usable.to(values.device)]


def advantage_range(values: torch.Tensor) -> dict[str, float]:
    """``advantage/min`` and ``advantage/max`` of the advantages ``values`` (:func:`usable_advantages`), both NaN
    (left out of the logged extremes: :class:`finecap.train.logging.Means`) when no caption has an advantage.

    >>> advantage_range(torch.tensor([-1.0, 0.0, 1.0]))
    {'advantage/min': -1.0, 'advantage/max': 1.0}
    """
    if not values.numel():
        return dict.fromkeys(("advantage/min", "advantage/max"), float("nan"))
    low, high = torch.stack((values.min(), values.max())).float().tolist()
    return {"advantage/min": low, "advantage/max": high}


def policy_gradient_loss(advantage: torch.Tensor, logprob: torch.Tensor) -> torch.Tensor:
    """REINFORCE surrogate ``-mean(A * log p)``; the advantage carries no gradient. Both (N,).

    >>> policy_gradient_loss(torch.tensor([2.0, -1.0]), torch.tensor([-1.0, -3.0])).item()  # -(2*-1 + -1*-3)/2
    -0.5
    """
    return -(advantage.detach().to(logprob.dtype) * logprob).mean()


class Reinforce(TokenMeanObjective):
    """``objective(model, batch)``: REINFORCE with a reward, a baseline and optional max-entropy term.

    Args:
        reward: ``reward(captions, batch) -> RewardOutput`` (e.g. :func:`finecap.rewards.build_reward`).
        baseline: a baseline of :mod:`finecap.objectives.baselines` (the factories build ``rl.baseline``'s).
        rl: the ``rl`` section (samples, strategy, temperature, logprob, scaled_logprob, entropy_coef; checked when
            it is built, :class:`finecap.config.RLConfig`; default: its defaults).
        decode: the ``decode`` section the rollouts start from (:func:`rollout_decode`, :func:`greedy_decode`;
            default: its defaults); its ``engine`` decodes them (:class:`~finecap.engines.rollouts.RolloutEngine`).
        seed: ``run.seed``, the base of the per-image sampling seeds (:meth:`sampling_seeds`).
        vllm: the ``vllm`` section (``decode.engine=vllm``'s engine; the engine is opened with these sections and
            ``run.seed``).
    """

    example_unit = "image"  # the loop trains on one example per image (each image once per epoch)
    headline = ("reward", "loss")  # the progress bar's values

    def __init__(
        self,
        reward: Reward,
        baseline: Any,
        *,
        rl: RLConfig | None = None,
        decode: DecodeConfig | None = None,
        seed: int = 0,
        vllm: VllmConfig | None = None,
    ):
        super().__init__()  # the step's per-token metrics (finecap.objectives.token_means), the run's accelerator
        rl = rl or RLConfig()
        decode = decode or DecodeConfig()
        self.reward = as_reward(reward)
        self.baseline = baseline
        self.needs = declared_needs(reward)  # e.g. {"retriever"} for self-retrieval
        self.rl = rl
        self.seed = seed
        self.logprob_temperature = rl.temperature if (rl.scaled_logprob and rl.strategy == "sample") else 1.0
        self.dropout_disabled: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()  # rl.disable_dropout: done
        self.sample_cfg = rollout_decode(decode, rl)
        self.greedy_cfg = greedy_decode(decode)
        self.monitor = Monitor(rl)  # the reward-hacking monitor (finecap.objectives.monitor): logged, never a loss
        self.weights_kept = False  # the step ending now was skipped by the engine (update_skipped): no sync needed
        self.tallied: dict[str, float] = {}  # the reward's tallies at the end of the last step (or of its set-up)
        self.step_tallies: dict[str, float] = {}  # their increase over the last step, every process's (end_step)
        engine_cfg = Config(run=RunConfig(seed=seed), decode=decode, vllm=vllm or VllmConfig())  # what it reads
        self.rollouts = RolloutEngine(engine_cfg, tempered=self.logprob_temperature != 1.0)

    # ----------------------------------------------------------------------------------------------------------------
    # Hooks called by the training loop
    # ----------------------------------------------------------------------------------------------------------------

    def setup(self, ctx: TrainContext) -> None:
        super().setup(ctx)  # the accelerator: the step's token means and the reward's tallies sum over its processes
        acc = self.accelerator
        self.rollouts.check_processes(1 if acc is None else acc.num_processes)
        model = getattr(ctx, "model", None)
        if model is not None:  # decoding settings the engine cannot decode the policy's captions with
            self.rollouts.check_model(model, [self.sample_cfg, self.greedy_cfg])
        self.reward.setup(RewardInputs.from_context(ctx, self.reward.needs))
        self.tallied = self.reward.tallies()  # the set-up's work (a judge's blind asks) is no step's
        call_hook(self.baseline, "setup", ctx)
        self.monitor.setup(ctx)

    def state_dict(self) -> dict[str, Any]:
        return {"reward": self.reward.state_dict(), "baseline": call_hook(self.baseline, "state_dict"),
                "monitor": self.monitor.state_dict()}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("reward") is not None:
            self.reward.load_state_dict(state["reward"])
        for key, target in (("baseline", self.baseline), ("monitor", self.monitor)):
            if state.get(key) is not None:
                call_hook(target, "load_state_dict", state[key])

    # ----------------------------------------------------------------------------------------------------------------
    # The step
    # ----------------------------------------------------------------------------------------------------------------

    def sampling_seeds(self, batch: dict[str, Any]) -> torch.Tensor | None:
        """Per-image sampling seeds ``(B,)`` from ``(rl seed, step, batch['index'])`` when the training engine
        provides the step (``batch["step_info"]``, :class:`~finecap.contract.StepInfo`), so that an image's
        samples do not depend on how the global batch is split over processes and accumulation steps; ``None``
        (torch's global RNG) otherwise."""
        info = batch.get("step_info")
        if info is None or "index" not in batch or self.rl.strategy != "sample":
            return None
        return step_seeds(self.seed, int(info.step), batch["index"])  # (B,)

    def rollout(self, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[Rollout, dict[str, float]]:
        """Decode (the bare model in eval mode, no gradient), score and compute the baseline; returns the rollout and
        timings."""
        bare = unwrap(model)
        was_training = bare.training
        t0 = time.perf_counter()
        synced = self.rollouts.sync_seconds
        bare.eval()
        # sharded (FSDP2): full parameters while the policy decodes, every process at once (finecap.models.sharding);
        # a vLLM engine needs none (it gathers the full weights itself when it syncs: finecap.engines.rollouts)
        gathered = contextlib.nullcontext() if self.rollouts.external else sharding.decoding(bare)
        try:
            with gathered, torch.no_grad():  # decode.engine: the policy itself, or vLLM synced with it
                samples = self.rollouts.generate(bare, batch, self.sample_cfg, self.sampling_seeds(batch))
                greedy = self.rollouts.generate(bare, batch, self.greedy_cfg) if self.baseline.needs_greedy else None
        finally:
            bare.train(was_training)
        t1 = time.perf_counter()
        synced = self.rollouts.sync_seconds - synced  # building the engine, or sending it the policy's weights
        timings = {"time/generate": t1 - t0 - synced}
        # rl.rewards' weighted sum checks each reward (finecap.rewards.base.check_finite) and makes a failed caption's
        # total NaN; a reward given as is, here: a number it left in a failed caption's total is no baseline's
        rewards = self.score_captions(samples, batch)
        greedy_rewards = None if greedy is None else self.score_captions(greedy, batch)
        t2 = time.perf_counter()
        device = samples.sequences.device
        total = rewards.total.to(device)
        # replace, not a new RewardOutput: what else the reward said of its captions (RewardOutput.failed) is kept
        rewards = dataclasses.replace(rewards, total=total, parts={k: v.to(device) for k, v in rewards.parts.items()})
        greedy_total = greedy_rewards.total.to(device) if greedy_rewards else None
        # a copy's rewards count in no running mean (baseline_of): they are those of the micro-batch it repeats
        baseline = baseline_of(self.baseline, total, samples.image_index.to(device), greedy_total, not is_copy(batch))
        rollout = Rollout(samples, rewards, baseline.detach(), greedy, greedy_rewards)
        timings["time/reward"] = t2 - t1
        if self.rollouts.external:
            timings["time/sync"] = synced
        return rollout, timings

    def score_captions(self, gen: Generation, batch: dict[str, Any]) -> RewardOutput:
        """The reward of the captions ``gen`` (sampled or greedy), checked finite outside its failed captions
        (:func:`~finecap.rewards.base.check_finite`), whose totals are NaN
        (:meth:`~finecap.rewards.base.RewardOutput.failed_as_nan`): a reward given to the objective as is may leave
        a number there, which no baseline or statistic may read."""
        out = self.reward(gen.texts, {**batch, "image_index": gen.image_index})
        return check_finite(out, "rl.rewards").failed_as_nan()

    def advantages(self, rollout: Rollout, batch: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """Named (N,) advantages, one loss each; subclasses add terms (sequence-level exploration)."""
        return {"reinforce": rollout.advantage}, {}

    def score(self, model: torch.nn.Module, batch: dict[str, Any], gen: Generation) -> Any:
        """TokenScores of the sampled captions ``gen``: ``(N, L)`` log-probs (and entropies with
        ``rl.entropy_coef``), with gradient through the captioner's ``forward`` (what DDP and FSDP2 see), under the
        distribution the captions are scored by (``rl.scaled_logprob``). With ``rl.disable_dropout`` every dropout
        module of the policy is set to p = 0 first (once per model; TRL's ``disable_dropout``): the log-probs, and
        GRPO's ratios and KL, carry no dropout noise (rollouts and the reference are scored in eval mode anyway)."""
        if self.rl.disable_dropout:
            bare = unwrap(model)
            if bare not in self.dropout_disabled:
                set_dropout(bare, 0.0)
                self.dropout_disabled.add(bare)
        return model(
            batch,
            sequences=gen.sequences,
            mask=gen.mask,
            image_index=gen.image_index,
            temperature=self.logprob_temperature,
            with_entropy=self.rl.entropy_coef > 0,
        )

    def __call__(self, model: torch.nn.Module, batch: dict[str, Any]) -> ObjectiveOutput:
        rollout, metrics = self.rollout(model, batch)
        advantages, extra = self.advantages(rollout, batch)
        gen = rollout.samples
        scores = self.score(model, batch, gen)
        logp = sequence_logprob(scores.logprobs, gen.lengths, self.rl.logprob)  # (N,)
        weights, extra_mismatch = self.engine_correction(scores.logprobs, gen, counted=not is_copy(batch))
        extra.update(extra_mismatch)
        weighted = logp if weights is None else self.weighted_logprob(scores.logprobs, gen, weights)
        losses = {name: policy_gradient_loss(adv.to(logp.device), weighted) for name, adv in advantages.items()}
        entropy = None
        if scores.entropy is not None:  # over the captions a reward scored (finecap.objectives.entropy)
            failed = rollout.rewards.failed_mask()
            scored, mask = None if failed is None else ~failed, gen.mask.to(scores.entropy.device)
            losses["entropy"] = -self.rl.entropy_coef * mean_entropy(scores.entropy, mask, rows=scored)
            entropy = self.token_means.add("entropy", scored_values(scores.entropy, mask, scored), not is_copy(batch))
        metrics.update(self.metrics(rollout, logp, not is_copy(batch)))
        metrics.update(self.watch(rollout, batch))
        metrics.update(extra)
        if entropy is not None:
            metrics["entropy"] = entropy
        # means over the N captions; scored: the captions that carry a signal (the engine skips a step with none)
        return ObjectiveOutput(losses=losses, metrics=metrics, num_items=len(gen), scored=self.signal(rollout))

    def has_advantage(self, rollout: Rollout) -> torch.Tensor:
        """(N,) bool: the captions whose advantage is defined (:attr:`Rollout.usable`: a reward scored them and
        their baseline exists); the others' advantage is a placeholder 0, no measurement."""
        return rollout.usable

    def signal(self, rollout: Rollout) -> int:
        """How many of the rollout's captions carry a learning signal (``ObjectiveOutput.scored``; the engine skips
        the update of a step whose every process and micro-batch has none): those with an advantage
        (:meth:`has_advantage`), or, with the entropy bonus (``rl.entropy_coef > 0``), every caption a reward
        scored, which the bonus covers. A caption a reward scored but no baseline could be found for (``rl.samples=1``
        with its greedy caption failed; under ``leave_one_out`` every other sample of its image failed) is no signal:
        its advantage is a placeholder 0, and until 2026-11-29 a step of only such captions was taken, AdamW moving
        every weight by its momentum and weight decay alone. An advantage that is 0 because the caption scored as its
        baseline is a signal (the gradient's estimate is 0), as TRL takes a step whose groups are all constant
        (docs/training.md#a-step-no-caption-of-which-was-scored)."""
        if self.rl.entropy_coef > 0:  # the bonus covers every caption a reward scored (finecap.objectives.entropy)
            return rollout.rewards.scored()
        return int(self.has_advantage(rollout).sum())

    def engine_correction(
        self, old: torch.Tensor, gen: Generation, counted: bool = True
    ) -> tuple[torch.Tensor | None, dict[str, float]]:
        """For rollouts another engine decoded (``decode.engine=vllm``): TRL's truncated importance weights ``(N, L)``
        of the trainer's log-probs ``old`` (the policy that was synced into the engine) against the engine's
        (``None`` with ``rl.vllm_is_correction=false``), and the mismatch metrics
        (:mod:`finecap.objectives.engine_mismatch`), whose means go to the step's token means too (``counted``:
        unless the micro-batch is a copy); ``(None, {})`` for the policy's own rollouts."""
        if not self.rollouts.external:
            return None, {}
        mask = gen.mask.to(old.device)
        weights = importance_weights(old, gen.token_logprobs, mask, self.rl.vllm_is_cap)
        metrics = mismatch_metrics(old, gen.token_logprobs, mask, weights)
        for name, values in mismatch_values(old, gen.token_logprobs, mask, weights).items():
            self.token_means.add(f"{name}/mean", values, counted)
        return (weights if self.rl.vllm_is_correction else None), metrics

    def weighted_logprob(self, token_logprobs: torch.Tensor, gen: Generation, weights: torch.Tensor) -> torch.Tensor:
        """``log p`` of each caption (``rl.logprob``) with each token's log-prob weighed by its importance weight
        (:meth:`engine_correction`; no gradient through the weights): REINFORCE's loss on vLLM's rollouts."""
        return sequence_logprob(token_logprobs * weights, gen.lengths, self.rl.logprob)

    def update_skipped(self) -> None:
        """The step about to end left the weights as they were (the engine skipped its update): :meth:`end_step`
        does not tell the rollout engine the policy changed, vLLM holding these weights already (until 2026-11-29 it
        was told, and the next rollout sent them again)."""
        self.weights_kept = True

    def end_step(self) -> None:
        """After each optimizer step: the step's tallies of the reward are taken (:meth:`step_values`); baselines
        with per-step state (the running mean) update once; the monitor's alarms are checked on the step's global
        batch, its ``kl`` the step's token mean (:attr:`step_means`); the rollout engine is told the policy changed,
        unless the step's update was skipped (:meth:`update_skipped`)."""
        self._tally_step()  # before an alarm may stop the run: the stopped step's values hold them too
        super().end_step()  # the step's token means (step_means), likewise (every process: a collective)
        call_hook(self.baseline, "end_step")
        self.monitor.end_step(kl=self.step_means.get("kl"))
        if not self.weights_kept:
            self.rollouts.policy_changed()
        self.weights_kept = False

    def _tally_step(self) -> None:
        """:attr:`step_tallies`: how much each of the reward's tallies
        (:meth:`~finecap.rewards.base.RewardBase.tallies`: a judge's calls, cache hits, unparsable answers, failed
        calls, HTTP 429 replies) grew over the step, summed over the processes (each asks its own judge), as
        ``reward/<name>/<key>``."""
        now = self.reward.tallies()
        keys = sorted(now)  # the same on every process: the reward's structure
        increase = tallies_grown(self.tallied, now)
        grown = torch.tensor([increase[k] for k in keys], dtype=torch.float64)
        reduce = self.process_sum()
        if keys and reduce is not None:
            grown = reduce(grown).cpu()
        self.tallied = now
        self.step_tallies = {f"reward/{k}": v for k, v in zip(keys, grown.tolist(), strict=True)}

    def step_values(self) -> dict[str, float]:
        """The step's per-token metrics (:attr:`step_means`: ``entropy``, the GRPO family's ``kl``, ``clip_ratio/*``,
        ``ratio/mean``, ``vllm/*/mean``), each the token mean over every process's tokens
        (:mod:`finecap.objectives.token_means`; its means over captions too: :meth:`metrics`), in place of the mean of
        the micro-batches' and processes' means (logged until 2026-11-29; ``kl`` was the step's already).
        ``reward/failed``: the share of the step's captions (every micro-batch and process) a reward could not score,
        the ``rl.alarms.failed`` alarm's measure, from the run's first step with one on (:attr:`Monitor.failed_share`).
        The micro-batches' mean of their own shares, which it replaces, left out those whose reward gave
        ``failed=None`` (none failed) until 2026-11-28, and overstated the share. And the reward's tallies of the step
        (:attr:`step_tallies`: ``reward/qa_utility/judge/calls``, ``.../judge/failed``, ...), which the log averages
        over its window's steps: a judge's calls, failures and HTTP 429s per step. With the greedy baseline,
        ``reward_greedy/failed``: the step's share of greedy captions a reward could not score
        (:attr:`Monitor.greedy_failed_share`, the ``rl.alarms.greedy_failed`` alarm's measure), in place of the
        micro-batches' mean of their shares (logged until 2026-11-29)."""
        share, greedy = self.monitor.failed_share, self.monitor.greedy_failed_share
        return {**self.step_means, **self.step_tallies, **({} if share is None else {"reward/failed": share}),
                **({} if greedy is None else {"reward_greedy/failed": greedy})}  # fmt: skip

    def close(self) -> None:
        """Free the rollouts' vLLM engine, if one was built, and what the reward opened (a judge it built)."""
        try:
            self.rollouts.close()
        finally:
            self.reward.close()

    def watch(self, rollout: Rollout, batch: dict[str, Any]) -> dict[str, float]:
        """The reward-hacking monitor's measures of the sampled captions (:mod:`finecap.objectives.monitor`); none
        of a copy (:func:`~finecap.contract.is_copy`: its captions are those of the micro-batch it repeats, counted
        there; until 2026-11-28 they were counted again, in the step's measures, alarms and ``reward/failed``)."""
        info = batch.get("step_info")
        step = None if info is None else int(info.step) + 1
        if is_copy(batch):  # the step is still the one an alarm names (a process whose every micro-batch is a copy)
            self.monitor.step = step
            return {}
        rows = rollout.samples.image_index.tolist()
        ids = batch.get("image_ids")
        image_ids = [ids[r] for r in rows] if ids is not None else rows
        # the rl.alarms.failed alarm's measure, over every caption of the step: a reward says failed=None where none
        # failed (the reward server's client), and such a micro-batch's captions count in the share too
        failed = rollout.rewards.failed
        self.monitor.observe_failed(0 if failed is None else int(failed.sum()), len(rollout.samples))
        if rollout.greedy_rewards is not None:  # the rl.alarms.greedy_failed alarm's measure, likewise
            greedy = rollout.greedy_rewards
            greedy_failed = greedy.failed_mask()
            n_greedy = torch.as_tensor(greedy.total).numel()
            self.monitor.observe_greedy_failed(0 if greedy_failed is None else int(greedy_failed.sum()), n_greedy)
        return self.monitor.measure(rollout.samples.texts, image_ids, step)

    def metrics(
        self, rollout: Rollout, logp: torch.Tensor, counted: bool = True, advantage: torch.Tensor | None = None
    ) -> dict[str, float]:
        """The micro-batch's values of the rollout (module docstring), ``advantage`` (N,) the captions' advantages
        (``None``: :attr:`Rollout.advantage`; the GRPO family's own). ``reward``, ``reward_greedy``, ``baseline``,
        ``logprob`` and ``sample_words``, means over captions, and ``distinct_samples``, a mean over images, also go
        to the step's means (``counted``: unless the micro-batch is a copy), which the step logs in their place
        (:meth:`step_values`): the means over every caption (image) of the step, every process's, as TRL 1.16's
        ``reward`` is over the step's gathered rewards; ``distinct_samples`` is then the measure the
        ``rl.alarms.distinct`` alarm reads (:meth:`finecap.objectives.monitor.Monitor.step_values`).
        ``advantage_std`` likewise (:meth:`~finecap.objectives.token_means.TokenMeans.add_std`): the std over every
        advantage of the step (:func:`usable_advantages`), as TRL's ``nanstd`` of the step's gathered values. Until
        2026-11-29 a step logged the mean of its micro-batches' and processes' values, which differs when they hold
        unequal numbers of (scored) captions. ``reward/<part>`` stays the mean of the micro-batches' means: a part is
        named by each call's output (:attr:`RewardOutput.parts <finecap.rewards.base.RewardOutput.parts>`), declared
        nowhere beforehand (a reward server's answer names its parts, a plain callable returns what it likes), so no
        process knows the names another's micro-batches gave, and a reduction over a name one process lacked would
        stall the step or sum unlike rows."""
        r = rollout.rewards
        add = self.token_means.add  # the step's means (finecap.objectives.token_means)
        # means over the captions the rewards scored: a failed caption's values are NaN (RewardOutput.failed)
        out = {"reward": add("reward", finite_values(r.total), counted)}
        out.update({f"reward/{k}": scored_mean(v) for k, v in r.parts.items()})
        if r.failed is not None:  # this micro-batch's share; in training the step's replaces it (step_values)
            out["reward/failed"] = float(r.failed.float().mean())
        if rollout.greedy_rewards is not None:
            out["reward_greedy"] = add("reward_greedy", finite_values(rollout.greedy_rewards.total), counted)
            # the share of greedy captions a reward could not score: their images' samples had the fallback baseline
            # (this micro-batch's; in training the step's replaces it: step_values)
            greedy_failed = rollout.greedy_rewards.failed_mask()
            out["reward_greedy/failed"] = 0.0 if greedy_failed is None else float(greedy_failed.float().mean())
        # over the captions that have one (not a failed greedy's)
        out["baseline"] = add("baseline", finite_values(rollout.baseline), counted)
        advantage = rollout.advantage if advantage is None else advantage
        usable = usable_advantages(advantage, self.has_advantage(rollout))
        out["advantage_std"] = self.token_means.add_std("advantage_std", usable, counted)
        out["logprob"] = add("logprob", logp.detach().flatten(), counted)
        texts = rollout.samples.texts
        out["sample_words"] = add("sample_words", torch.tensor([float(len(t.split())) for t in texts]), counted)
        if self.rl.samples > 1:
            shares = torch.tensor(distinct_shares(texts, self.rl.samples), dtype=torch.float64)  # (B,)
            out["distinct_samples"] = add("distinct_samples", shares, counted)
        return out


def reinforce_kwargs(cfg: Config) -> dict[str, Any]:
    """Constructor arguments of :class:`Reinforce`: the reward and baseline of ``cfg.rl``, the sections themselves.
    A generation engine (``decode.engine``) that does not serve the configured backbone is refused here, before a run
    prepares anything (its declared :meth:`~finecap.engines.base.GenerationEngine.refusal`: vLLM's of a ClipCap)."""
    reason = engine_class(cfg.decode).refusal(cfg)
    if reason is not None:
        raise ConfigError(reason, key="decode.engine")
    return dict(
        reward=build_reward(cfg),
        baseline=build_baseline(cfg.rl),
        rl=cfg.rl,
        decode=cfg.decode,
        seed=cfg.run.seed,
        vllm=cfg.vllm,
    )
