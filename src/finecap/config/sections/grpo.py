"""The ``grpo`` section: the GRPO family's options (``train.objective=grpo``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal

from finecap.config.fields import Section, check, doc, every_option
from finecap.config.sections.rl import RLConfig
from finecap.config.sections.train import objective_without
from finecap.registry import GRPO_OBJECTIVES

if TYPE_CHECKING:
    from finecap.config.sections import Config

Advantage = Literal["baseline", "group"]
ScaleRewards = Literal["group", "batch", "none"]
RewardAggregation = Literal["sum_then_normalize", "normalize_then_sum"]
PolicyLoss = Literal["reinforce", "clipped"]
Importance = Literal["token", "sequence"]
LossAggregation = Literal["sequence", "token", "constant"]
CLIPPED_ONLY = ("iterations", "clip_low", "clip_high", "importance", "loss_aggregation", "kl_coef",
                "kl_bias_correction")  # fmt: skip
"""The options only ``grpo.policy_loss=clipped`` reads: refused at another value than their default without it."""
GROUP_UNUSED = ("baseline", "mean_momentum")
"""The ``rl`` options ``grpo.advantage=group`` never reads (the group's mean is the baseline)."""


@dataclass
class GRPOConfig(Section, name="grpo"):
    """The GRPO family's options (docs/methods/grpo.md; TRL's names in brackets), read by ``train.objective=grpo``
    (and by ``reinforce``, its former name). The defaults are the papers' REINFORCE: ``advantage: group`` and
    ``policy_loss: clipped`` make it GRPO. The rollout, rewards and alarms are the ``rl`` section's."""

    advantage: Advantage = doc(
        "baseline", "baseline: R - rl.baseline (the papers); group: GRPO's (R - group mean) / scale, per image."
    )
    scale_rewards: ScaleRewards = doc(
        "group",
        "advantage=group: divide by the std of the image's group, of the batch, or not (Dr. GRPO) [same; TRL's "
        "true and false are group and none, which finecap takes as words only].",
    )
    reward_aggregation: RewardAggregation = doc(
        "sum_then_normalize",
        "advantage=group: normalise the weighted sum, or each reward within its group, then sum (GDPO) "
        "[multi_objective_aggregation].",
    )
    policy_loss: PolicyLoss = doc(
        "reinforce", "reinforce: -A log p (rl.logprob); clipped: GRPO/PPO's clipped ratio surrogate [loss_type]."
    )
    iterations: int = doc(
        1,
        "clipped: optimizer steps per rollout batch; each global batch is taken this many times [num_iterations].",
        ge=1,
        le=64,
        why="optimizer steps on one rollout batch; PPO and GRPO use 1 to 10",
    )
    clip_low: float = doc(0.2, "clipped: the ratio's lower clip is 1 - clip_low [epsilon].", ge=0, lt=1)
    clip_high: float = doc(
        0.2,
        "clipped: the ratio's upper clip is 1 + clip_high; DAPO: 0.28 [epsilon_high].",
        ge=0,
        le=100,
        why="a probability ratio clipped at 1 + 100 is unclipped in practice; PPO/GRPO use 0.2, DAPO 0.28",
    )
    importance: Importance = doc(
        "token", "clipped: ratio per token, or per caption from its mean log-ratio (GSPO) [importance_sampling_level]."
    )
    loss_aggregation: LossAggregation = doc(
        "sequence",
        "clipped: mean per caption then over captions; mean over all tokens; / (captions x decode.max_length) "
        "[loss_type grpo; bnpo, dapo; dr_grpo].",
    )
    kl_coef: float = doc(
        0.0,
        "clipped: beta of the k3 KL to the starting policy, per token; 0 = no reference [beta].",
        ge=0,
        le=100,
        why="the KL term would swamp every advantage: TRL's beta is 0 or 0.04, RLHF's 0.001 to 0.2",
    )
    kl_bias_correction: bool = doc(
        True,
        "clipped: multiply the per-token KL by the importance ratio (TRL 1.16's default) [use_bias_correction_kl].",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        for key, default in (("scale_rewards", "group"), ("reward_aggregation", "sum_then_normalize")):
            check(
                self.advantage == "group" or getattr(self, key) == default,
                f"grpo.{key}",
                "is an option of group advantages: set grpo.advantage=group as well",
            )
        check(
            self.reward_aggregation == "sum_then_normalize" or self.scale_rewards == "group",
            "grpo.scale_rewards",
            "is not used with grpo.reward_aggregation=normalize_then_sum (each reward is scaled by its group's std, "
            "their sum by the batch's)",
        )
        for f in fields(self):  # read only by the clipped loss: set without it, they would change nothing
            if f.name in CLIPPED_ONLY:
                check(
                    getattr(self, f.name) == f.default or self.policy_loss == "clipped",
                    f"grpo.{f.name}",
                    "needs grpo.policy_loss=clipped",
                )

    def check_config(self, cfg: Config) -> None:
        check(
            self.advantage != "group" or cfg.rl.samples >= 2,
            "rl.samples",
            "must be >= 2 with grpo.advantage=group (an image's samples are its group)",
        )
        defaults = {f.name: f.default for f in fields(cfg.rl)}
        for key in GROUP_UNUSED:
            check(
                self.advantage != "group" or getattr(cfg.rl, key) == defaults[key],
                f"rl.{key}",
                "is not used with grpo.advantage=group (the group's mean is the baseline): leave it out, or set "
                "grpo.advantage=baseline",
            )

    def unread_options(self, cfg: Config) -> dict[str, tuple[str, str]]:
        """Every option under an objective that is not of the GRPO family (:data:`~finecap.registry.GRPO_OBJECTIVES`;
        ``sle`` reads ``advantage`` and ``policy_loss`` only to refuse the family's values)."""
        have = objective_without(cfg, GRPO_OBJECTIVES)
        if not have:
            return {}
        read = ("grpo.advantage", "grpo.policy_loss") if cfg.train.objective == "sle" else ()
        return every_option(GRPOConfig, "train.objective=grpo", have, but=read)


def never_read(grpo: Mapping[str, Any], rl: Mapping[str, Any]) -> list[str]:
    """The options of a stored ``grpo`` and ``rl`` section (``{key: value}`` as the file holds them) that the run set
    to other values than their defaults but never read: :data:`CLIPPED_ONLY` without ``policy_loss: clipped``,
    :data:`GROUP_UNUSED` with ``advantage: group``. A new configuration refuses them; a run stored before that was
    trained exactly as without them, so its configuration is read without them
    (:func:`finecap.config.stored.load_stored`)."""
    ours = {f.name: f.default for f in fields(GRPOConfig)}
    theirs = {f.name: f.default for f in fields(RLConfig)}
    out = []
    if grpo.get("policy_loss", ours["policy_loss"]) != "clipped":
        out += [f"grpo.{k}" for k in CLIPPED_ONLY if k in grpo and grpo[k] != ours[k]]
    if grpo.get("advantage", ours["advantage"]) == "group":
        out += [f"rl.{k}" for k in GROUP_UNUSED if k in rl and rl[k] != theirs[k]]
    return out
