"""Reward factories of a user's own, named by dotted path in ``rl.rewards`` (docs/methods/judges.md: a shaped reward
in a training run): ``qa_utility`` under CapRL's piecewise length reward, and ``claims`` paying its precision."""

from __future__ import annotations

from finecap.rewards import get_reward


def qa_shaped(cfg):
    shaped = get_reward("length", cfg)
    shaped.configure(reward="qa_utility", kind="piecewise", l1=2, l2=6, weight=0.5)
    return shaped


def claims_precision(cfg):
    reward = get_reward("claims", cfg)
    reward.configure(score="precision")
    return reward
