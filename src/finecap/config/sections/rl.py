"""The ``rl`` section: what every RL objective shares (rewards, rollout, log-prob, baseline, alarms)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from finecap.config.fields import Section, check, doc, every_option
from finecap.config.sections.limits import (
    FLOAT32_TINY,
    MAX_REWARD_WEIGHT,
)
from finecap.config.sections.train import objective_without
from finecap.config.sections.vllm import decodes_itself
from finecap.registry import RL_OBJECTIVES
from finecap.utils.text import did_you_mean, short_repr

if TYPE_CHECKING:
    from finecap.config.sections import Config

Baseline = Literal["greedy", "mean", "leave_one_out", "none"]
RLStrategy = Literal["sample", "greedy", "beam"]
LogProb = Literal["sum", "mean"]
AlarmAction = Literal["warn", "stop"]
VLLM_CORRECTION = ("vllm_is_correction", "vllm_is_cap")
"""The ``rl`` options only rollouts another engine decoded read (``decode.engine=vllm``:
:mod:`finecap.objectives.engine_mismatch`)."""
AlarmMeasure = Literal[
    "length_drift", "repetition", "distinct", "fact_precision", "fact_recall", "kl", "failed", "greedy_failed"
]
SOUNDS_BELOW = ("distinct", "fact_precision", "fact_recall")
"""The alarm measures that sound when the value falls below the threshold; the others sound above it
(:class:`finecap.objectives.monitor.Monitor`; ``length_drift`` by its size)."""


@dataclass
class RLConfig(Section, name="rl"):
    """What every RL objective shares (reinforce, grpo, scst_me, sle): the rewards, the rollout, the log-prob, the
    baseline of REINFORCE/SCST, the vLLM corrections and the reward-hacking alarms. The GRPO family's own options are
    the ``grpo`` section (:class:`GRPOConfig`), SLE's the ``sle`` section (:class:`SLEConfig`)."""

    rewards: dict[str, float] = doc(
        {"cider": 1.0},
        "Reward weights, R = sum w_i r_i (finecap.rewards.REWARDS names); each in [-1e6, 1e6], not all 0.",
    )
    baseline: Baseline = doc("greedy", "REINFORCE baseline of the reward.")
    samples: int = doc(
        5,
        "Captions decoded per image in training (s); greedy/beam decoding need 1.",
        ge=1,
        le=256,
        why="captions decoded per image; SCST: 5, GRPO-style: 8 to 64",
    )
    strategy: RLStrategy = doc("sample", "Training-time decoding (beam uses decode.*).")
    temperature: float = doc(
        1.0,
        "Sampling temperature of training-time decoding (NDLB: 0.3); vLLM raises T < 0.01 to 0.01, greedy is T -> 0.",
        ge=0.01,
        le=100,
        why="logits / T: beyond 100 sampling is uniform over the vocabulary",
    )
    logprob: LogProb = doc("sum", "log p(caption): sum of token log-probs or their per-token mean.")
    scaled_logprob: bool = doc(False, "Score log p under the temperature-scaled distribution (NDLB), not T = 1.")
    mean_momentum: float = doc(
        0.0, "baseline=mean: 0 = cumulative mean of past batch rewards, else EMA momentum.", ge=0, lt=1
    )
    entropy_coef: float = doc(
        0.0,
        "Max-entropy regularisation (SLL-ME): loss -= coef * mean token entropy.",
        ge=0,
        le=100,
        why="times a mean entropy of at most log V, 12 nats for 256k words; SLL-ME uses 0.01",
    )
    disable_dropout: bool = doc(
        False,
        "Set every dropout module of the policy to p = 0 for the RL objective, so GRPO's ratios and KL carry no "
        "dropout noise (rollouts and the reference run in eval mode) [disable_dropout].",
    )
    vllm_is_correction: bool = doc(
        True,
        "decode.engine=vllm: weigh each token of the loss by the truncated importance ratio of the trainer's "
        "log-prob to vLLM's (docs/scaling.md) [vllm_importance_sampling_correction].",
    )
    vllm_is_cap: float = doc(
        3.0,
        "decode.engine=vllm: the importance ratio's cap, C >= 1 (truncation; TRL's default) "
        "[vllm_importance_sampling_clip_max].",
        ge=1,
        le=1000,
        why="a cap on the importance ratio of two nearly equal policies; TRL's is 3",
    )
    alarms: dict[str, float] = doc(
        {},
        "Reward-hacking alarms, measure -> threshold (length_drift, repetition, distinct with rl.samples >= 2, "
        "fact_precision/recall on data.format=world; kl: the step's KL to the starting policy, with grpo.kl_coef > 0; "
        "failed: the step's share of sampled captions a reward could not score; greedy_failed: of the greedy "
        "baseline's captions, with rl.baseline=greedy).",
    )
    alarm_action: AlarmAction = doc(
        "warn", "What a crossed rl.alarms threshold does: log a warning, or stop training."
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check(bool(self.rewards), "rl.rewards", "needs at least one reward, e.g. {cider: 1.0}")
        for name, weight in self.rewards.items():
            check(
                isinstance(weight, int | float) and not isinstance(weight, bool),
                f"rl.rewards.{name}",
                f"must be a number, got {short_repr(weight)}",
            )
            check(
                abs(weight) <= MAX_REWARD_WEIGHT,
                f"rl.rewards.{name}",
                f"must be in [-{MAX_REWARD_WEIGHT:g}, {MAX_REWARD_WEIGHT:g}], got {short_repr(weight, 30)} (a weight "
                "scales its reward as train.lr a step, and rewards times weights are summed in float32; the papers' "
                "are 0.5 to 1)",
            )
            check(
                weight == 0 or abs(weight) >= FLOAT32_TINY,
                f"rl.rewards.{name}",
                f"{short_repr(weight)} is 0 in float32, in which rewards are weighted; use 0 or a larger weight",
            )
        check(
            any(w != 0 for w in self.rewards.values()),
            "rl.rewards",
            "every weight is 0, so every caption's reward is 0 and nothing is learnt; give a reward a nonzero weight",
        )
        measures = get_args(AlarmMeasure)
        for measure, threshold in self.alarms.items():
            check(
                measure in measures,
                "rl.alarms",
                f"unknown measure {short_repr(measure)}{did_you_mean(str(measure), measures)}; valid: "
                f"{', '.join(measures)}",
            )
            number = isinstance(threshold, int | float) and not isinstance(threshold, bool)
            # a relative change or a KL, any size; the others are shares, and a threshold no share can cross is
            # refused: distinct and the fact shares sound below it (none is below 0), repetition and failed above it
            # (repetition is below 1: a caption's first trigram is never a repeat)
            drift, below = measure in ("length_drift", "kl"), measure in SOUNDS_BELOW
            check(
                number and (threshold > 0 if drift else 0 < threshold <= 1 if below else 0 <= threshold < 1),
                f"rl.alarms.{measure}",
                f"must be {'> 0' if drift else 'in (0, 1]' if below else 'in [0, 1)'}, got {short_repr(threshold)}",
            )
        check(
            "distinct" not in self.alarms or self.samples >= 2,
            "rl.alarms.distinct",
            "needs rl.samples >= 2 (the share of distinct captions among an image's samples is 1 with one sample)",
        )
        check(
            self.strategy == "sample" or self.samples == 1,
            "rl.samples",
            f"must be 1 with rl.strategy={self.strategy} (deterministic decoding gives one caption per image)",
        )
        check(
            self.baseline != "leave_one_out" or self.samples >= 2,
            "rl.samples",
            "must be >= 2 with rl.baseline=leave_one_out (the other samples of the image are the baseline)",
        )
        check(
            not (self.baseline == "greedy" and self.strategy == "greedy"),
            "rl.baseline",
            "greedy with rl.strategy=greedy makes every advantage 0; use mean, or decode with sample/beam",
        )

    def check_config(self, cfg: Config) -> None:
        check(
            "kl" not in self.alarms or cfg.grpo.kl_coef > 0,
            "rl.alarms.kl",
            "needs grpo.kl_coef > 0 (the KL to the starting policy is computed only with its penalty)",
        )
        check(
            "greedy_failed" not in self.alarms or (self.baseline == "greedy" and cfg.grpo.advantage == "baseline"),
            "rl.alarms.greedy_failed",
            "needs rl.baseline=greedy (and grpo.advantage=baseline): only the greedy baseline decodes greedy "
            f"captions, and rl.baseline={self.baseline}, grpo.advantage={cfg.grpo.advantage} decodes none",
        )
        for measure in ("fact_precision", "fact_recall"):
            check(
                measure not in self.alarms or cfg.data.format == "world",
                f"rl.alarms.{measure}",
                f"needs data.format=world (the facts are checked against the world's scene graphs; data.format="
                f"{cfg.data.format} has none, so the alarm could never sound)",
            )

    def unread_options(self, cfg: Config) -> dict[str, tuple[str, str]]:
        """Every option but ``rl.rewards`` (which ``finecap serve-reward`` serves whatever the objective) under an
        objective that rewards no captions (``mle``, ``smile``: :data:`~finecap.registry.RL_OBJECTIVES`). Under one:
        ``rl.logprob`` under the clipped loss, which works per token (docs/methods/grpo.md); ``rl.mean_momentum``
        without ``rl.baseline=mean``; ``rl.scaled_logprob`` without sampling; the vLLM corrections with finecap's own
        decoder, whose log-probs are the trainer's."""
        have = objective_without(cfg, RL_OBJECTIVES)
        if have:
            return every_option(RLConfig, "train.objective=reinforce, grpo, scst_me or sle", have, but=("rl.rewards",))
        out = {}
        if cfg.grpo.policy_loss == "clipped":
            out["rl.logprob"] = ("grpo.policy_loss=reinforce", "grpo.policy_loss=clipped")
        if self.baseline != "mean":
            out["rl.mean_momentum"] = ("rl.baseline=mean", f"rl.baseline={self.baseline}")
        if self.strategy != "sample":
            out["rl.scaled_logprob"] = ("rl.strategy=sample", f"rl.strategy={self.strategy}")
        if decodes_itself(cfg):
            out |= {f"rl.{k}": ("decode.engine=vllm", "decode.engine=finecap") for k in VLLM_CORRECTION}
        return out
