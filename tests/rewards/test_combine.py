"""Weighted reward sums R = sum w_i r_i, their logged parts and hooks, and the reward registry."""

import re
from types import SimpleNamespace

import pytest
import torch

from finecap.config import load
from finecap.rewards import (
    REWARDS,
    NonFiniteReward,
    RewardOutput,
    WeightedSum,
    build_reward,
    caption_rows,
    check_finite,
    get_reward,
)
from finecap.rewards.cider import CiderReward


class Words:
    """Number of words of each caption."""

    def __call__(self, captions, batch):
        total = torch.tensor([float(len(c.split())) for c in captions])
        return RewardOutput(total, {"words": total})


class Pieces:
    """Two pieces: 1 per caption and the caption's row; total = their sum. Stateful (counts its calls)."""

    def __init__(self):
        self.calls = 0
        self.ctx = None

    def setup(self, ctx):
        self.ctx = ctx

    def __call__(self, captions, batch):
        self.calls += 1
        rows = caption_rows(captions, batch).float()
        ones = torch.ones(len(captions))
        return RewardOutput(ones + rows, {"one": ones, "row": rows})

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state):
        self.calls = state["calls"]


def pieces_factory(cfg):
    return Pieces()


def test_weighted_sum_and_unweighted_parts():
    reward = WeightedSum({"words": (0.5, Words()), "pieces": (2.0, Pieces())})
    out = reward(["a b c", "a", "a b"], {"image_index": torch.tensor([0, 0, 1])})
    # words (3, 1, 2); pieces = 1 + row = (1, 1, 2)
    # total = 0.5 * (3, 1, 2) + 2 * (1, 1, 2) = (1.5 + 2, 0.5 + 2, 1 + 4) = (3.5, 2.5, 5.0)
    assert out.total.tolist() == [3.5, 2.5, 5.0]
    assert out.parts["words"].tolist() == [3.0, 1.0, 2.0]  # the component's own part named like it is not repeated
    assert out.parts["pieces"].tolist() == [1.0, 1.0, 2.0]
    assert out.parts["pieces/one"].tolist() == [1.0, 1.0, 1.0]
    assert out.parts["pieces/row"].tolist() == [0.0, 0.0, 1.0]
    assert "words/words" not in out.parts


def test_hooks_are_forwarded():
    pieces = Pieces()
    reward = WeightedSum({"words": (1.0, Words()), "pieces": (1.0, pieces)})
    ctx = SimpleNamespace(train_records=[])
    reward.setup(ctx)
    assert pieces.ctx is ctx
    reward(["a"], {})
    reward(["a"], {})
    state = reward.state_dict()
    assert state == {"pieces": {"calls": 2}}  # Words has no state
    fresh_pieces = Pieces()
    fresh = WeightedSum({"words": (1.0, Words()), "pieces": (1.0, fresh_pieces)})
    fresh.load_state_dict(state)
    assert fresh_pieces.calls == 2


def test_wrong_shape_is_reported_with_the_reward_name():
    class Bad:
        def __call__(self, captions, batch):
            return RewardOutput(torch.zeros(len(captions) + 1))

    with pytest.raises(ValueError, match="'bad'"):
        WeightedSum({"bad": (1.0, Bad())})(["a", "b"], {})


class Planted:
    """Finite words, with ``value`` planted at caption ``at`` of the part ``part`` (``"total"``: of the total)."""

    def __init__(self, part, value, at):
        self.part, self.value, self.at = part, value, at

    def __call__(self, captions, batch):
        total = torch.tensor([float(len(c.split())) for c in captions])
        parts = {"words": total.clone(), "chars": torch.tensor([float(len(c)) for c in captions])}
        (total if self.part == "total" else parts[self.part])[self.at] = self.value
        return RewardOutput(total, parts)


@pytest.mark.parametrize(
    ("part", "value", "at", "message"),
    [("total", float("nan"), 0, "reward 'mine': total is nan at caption 0 (1 of 3 captions not finite)"),
     ("chars", float("inf"), 2, "reward 'mine': part 'chars' is inf at caption 2 (1 of 3 captions not finite)"),
     ("words", float("-inf"), 1, "reward 'mine': part 'words' is -inf at caption 1 (1 of 3 captions not finite)")],
)  # fmt: skip
def test_a_non_finite_reward_value_is_an_error_naming_the_reward_part_and_caption(part, value, at, message):
    reward = WeightedSum({"cider_like": (1.0, Words()), "mine": (0.5, Planted(part, value, at))})
    with pytest.raises(NonFiniteReward, match=re.escape(message)) as caught:
        reward(["a b", "a", "a b c"], {})
    assert isinstance(caught.value, ValueError)
    finite = Planted(part, 7.0, at)
    out = check_finite(finite(["a b", "a", "a b c"], {}), "mine")  # the same reward, finite: returned as it is
    assert torch.isfinite(out.total).all()


def test_finite_rewards_whose_weighted_sum_overflows_are_refused_naming_rl_rewards():
    # float32's largest value is about 3.4e38: captions 0 and 2 (3 words) give 1e38 * 3 + 1e38 * 3 = 6e38, inf;
    # caption 1 (1 word): 1e38 + 1e38 = 2e38 stays finite.
    reward = WeightedSum({"words": (1e38, Words()), "more": (1e38, Words())})
    with pytest.raises(NonFiniteReward, match=r"reward 'rl.rewards, the weighted sum': total is inf at caption 0 "
                       r"\(2 of 3 captions not finite\)"):  # fmt: skip
        reward(["a b c", "a", "a b c"], {})
    assert WeightedSum({"words": (1e37, Words())})(["a b c"], {}).total.item() == pytest.approx(3e37, rel=1e-6)


def test_registry_names_dotted_paths_and_errors():
    cfg = load()
    assert "cider" in REWARDS
    assert isinstance(get_reward("cider", cfg), CiderReward)
    assert isinstance(get_reward(f"{__name__}:pieces_factory", cfg), Pieces)
    with pytest.raises(ValueError, match="unknown reward 'nope'.*cider"):
        get_reward("nope", cfg)


def test_build_reward_from_config_weights():
    cfg = load(None, [f"rl.rewards={{cider: 1.0, '{__name__}:pieces_factory': 0.25}}"])
    reward = build_reward(cfg)
    assert {name: w for name, (w, _) in reward.rewards.items()} == {
        "cider": 1.0,
        f"{__name__}:pieces_factory": 0.25,
    }
