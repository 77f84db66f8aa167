"""Weighted reward sums R = sum w_i r_i, their logged parts and hooks, and the reward registry."""

import math
import re

import pytest
import torch

from finecap.config import load
from finecap.rewards import (
    REWARDS,
    FunctionReward,
    NonFiniteReward,
    RewardBase,
    RewardInputs,
    RewardOutput,
    WeightedSum,
    as_reward,
    build_reward,
    caption_rows,
    check_finite,
    get_reward,
    reward_of,
)
from finecap.rewards.cider import CiderReward


class Words:
    """Number of words of each caption."""

    def __call__(self, captions, batch):
        total = torch.tensor([float(len(c.split())) for c in captions])
        return RewardOutput(total, {"words": total})


class Pieces(RewardBase):
    """Two pieces: 1 per caption and the caption's row; total = their sum. Stateful (counts its calls)."""

    needs = frozenset({"retriever"})
    per_caption = True
    settings = ("offset",)

    def __init__(self):
        self.calls = 0
        self.inputs = None
        self.offset = 0.0

    def setup(self, inputs):
        self.inputs = inputs

    def __call__(self, captions, batch):
        self.calls += 1
        rows = caption_rows(captions, batch).float()
        ones = torch.ones(len(captions))
        return RewardOutput(ones + rows + self.offset, {"one": ones, "row": rows})

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
    inputs = RewardInputs(references={})
    reward.setup(inputs)
    assert pieces.inputs is inputs
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


# --------------------------------------------------------------------------------------------------------------------
# The contract: declared facts, a plain callable wrapped once, failed captions
# --------------------------------------------------------------------------------------------------------------------


def test_reward_base_declares_its_facts_and_the_sum_combines_them():
    plain = RewardBase()
    assert (plain.needs, plain.per_caption, plain.compares_images, plain.known_images()) == (
        frozenset(), False, False, None)  # fmt: skip
    assert plain.state_dict() == {} and plain.settings == ()
    with pytest.raises(NotImplementedError):
        plain(["a"], {})
    with pytest.raises(TypeError, match="unexpected keyword argument 'sigma' \\(settings: none"):
        plain.configure(sigma=1.0)
    pieces = Pieces()
    pieces.configure(offset=2.0)
    assert pieces(["a"], {}).total.tolist() == [3.0]
    cider = CiderReward({1: ["a b"], 2: ["c d"]})
    mix = WeightedSum({"pieces": (1.0, Pieces()), "cider": (1.0, cider)})
    assert mix.needs == {"retriever"} and mix.per_caption and not mix.compares_images
    assert mix.known_images() == {1, 2}  # Pieces does not say; CIDEr-D knows its corpus
    assert not WeightedSum({"pieces": (1.0, Pieces()), "words": (1.0, Words())}).per_caption  # Words is unmarked


def test_a_plain_callable_reward_is_wrapped_once_reading_its_declared_facts():
    def length(captions, batch):
        total = torch.tensor([float(len(c)) for c in captions])
        return RewardOutput(total)

    length.per_caption = True
    length.needs = frozenset({"retriever"})
    wrapped = as_reward(length)
    assert isinstance(wrapped, FunctionReward) and as_reward(wrapped) is wrapped
    length.per_caption = False  # read once, when wrapped
    assert wrapped.per_caption and wrapped.needs == {"retriever"} and not wrapped.compares_images
    assert wrapped(["ab", "c"], {}).total.tolist() == [2.0, 1.0]
    wrapped.setup(RewardInputs())  # no set-up, no state
    assert wrapped.state_dict() == {}
    with pytest.raises(ValueError, match="rl.rewards: expected a reward .* got int"):
        as_reward(3)


def plain_factory(cfg):
    """A user's factory returning a plain callable (by dotted path)."""
    return Words()


def test_a_plain_callable_by_dotted_path_serves_the_loop_and_the_adapters():
    name = f"{__name__}:plain_factory"
    reward = get_reward(name, load())
    assert isinstance(reward, FunctionReward)
    assert reward_of(name)(["a b c"], {}).total.tolist() == [3.0]
    assert build_reward(load(None, [f"rl.rewards={{'{name}': 2.0}}"]))(["a b"], {}).total.tolist() == [4.0]
    with pytest.raises(TypeError, match="unexpected keyword argument 'scale'"):
        reward_of(name, scale=2.0)  # a plain callable declares no settings


class Judge(RewardBase):
    """Words, failing (values NaN or planted) on the captions that say "?"."""

    def __init__(self, planted=math.nan):
        self.planted = planted

    def __call__(self, captions, batch):
        total = torch.tensor([float(len(c.split())) for c in captions])
        failed = torch.tensor(["?" in c for c in captions])
        total[failed] = self.planted
        return RewardOutput(total, {"judge": total.clone()}, failed)


def test_failed_captions_are_not_read_by_check_finite_and_the_sum_ors_them():
    captions = ["a b", "what ?", "a", "b ?"]
    out = check_finite(Judge()(captions, {}), "judge")  # NaN at failed captions: not read
    assert out.failed.tolist() == [False, True, False, True]
    broken = RewardOutput(torch.tensor([1.0, math.nan]), failed=torch.tensor([True, False]))
    with pytest.raises(NonFiniteReward, match="total is nan at caption 1 \\(1 of 2"):
        check_finite(broken, "judge")  # a NaN outside the mask is still an error
    with pytest.raises(ValueError, match="failed has shape \\(3,\\) for 2 captions"):
        check_finite(RewardOutput(torch.tensor([1.0, 2.0]), failed=torch.zeros(3, dtype=torch.bool)), "judge")
    mix = WeightedSum({"judge": (1.0, Judge(planted=0.0)), "words": (0.5, Words()),
                       "other": (1.0, Judge())})  # fmt: skip
    got = mix(captions, {})
    assert got.failed.tolist() == [False, True, False, True]
    total = got.total.tolist()
    assert total[0] == 2 + 1 + 2 and total[2] == 1 + 0.5 + 1  # hand-computed: 1 * words + 0.5 * words + 1 * words
    assert math.isnan(total[1]) and math.isnan(total[3])  # a failed caption is never paid, not even its 0
    assert got.parts["judge"].tolist()[1] == 0.0  # a component's own value is logged as it gave it
    lone = RewardOutput(torch.tensor([1.5, 7.0]), {"p": torch.tensor([1, 2])}, torch.tensor([False, True]))
    (t0, t1), parts = lone.values()
    assert t0 == 1.5 and math.isnan(t1) and parts["p"][0] == 1.0 and math.isnan(parts["p"][1])
    assert lone.values(failed=None) == ([1.5, None], {"p": [1.0, None]})
    first, second = lone.split([1, 1])  # a merged call answered request by request: each its own mask
    assert first.failed is not None and first.failed_mask() is None and first.values() == ([1.5], {"p": [1.0]})
    assert second.failed.tolist() == [True] and second.values(failed=None) == ([None], {"p": [None]})
    assert WeightedSum({"words": (1.0, Words())})(["a"], {}).failed is None


def test_a_reward_of_weight_zero_is_logged_and_its_failures_leave_no_caption_unpaid():
    # rl.rewards allows a weight of 0 (logged, not paid: "not all 0"); its failure made the whole caption NaN, never
    # paid, though the total does not read it
    captions = ["a b", "what ?", "a"]
    mix = WeightedSum({"words": (1.0, Words()), "judge": (0.0, Judge())})
    got = mix(captions, {})
    assert got.failed is None and got.total.tolist() == [2.0, 2.0, 1.0]  # hand-computed: the words alone
    judge = got.parts["judge"].tolist()
    assert judge[0] == 2.0 and math.isnan(judge[1]) and judge[2] == 1.0  # logged as it gave it
    weighed = WeightedSum({"words": (1.0, Words()), "judge": (0.5, Judge())})(captions, {})
    assert weighed.failed.tolist() == [False, True, False]  # with a weight, its failures still fail the caption
    assert WeightedSum({"judge": (0.0, Judge())})(captions, {}).total.tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("order", [("cider", "chair"), ("chair", "cider")])
def test_a_sum_knows_an_image_its_components_key_as_an_int_and_as_its_string(order):
    # CIDEr-D's references from a JSONL data set key "1", CHAIR's COCO instances key 1: the sum's known images were
    # the exact intersection, empty, so an adapter refused every id ("unknown image id"); and CIDEr-D, given the
    # chair's 1, had no references for it
    from finecap.integrations.scoring import Scorer

    parts = {
        "cider": reward_of("cider", references={"1": ["a dog chasing a cat"], "2": ["a red bus"]}),
        "chair": reward_of("chair", objects={1: frozenset({"dog"}), 2: frozenset({"bus"})}),
    }
    mix = WeightedSum({name: (1.0, parts[name]) for name in order})
    assert sorted(map(str, mix.known_images())) == ["1", "2"]
    captions = ["a dog chasing a cat", "a red bus"]
    out = Scorer.of(mix).score(captions, [1, "2"])
    # each component alone, given the ids as it keys them: CIDEr-D 10 (the reference itself, clipped), chair 1 - 1/2
    # (the cat) and 1
    cider = parts["cider"](captions, {"image_ids": ["1", "2"]}).total
    chair = parts["chair"](captions, {"image_ids": [1, 2]}).total
    assert chair.tolist() == [0.5, 1.0]
    assert out.total.tolist() == (cider + chair).tolist()


def test_a_sum_knows_an_image_a_component_keys_as_an_integral_float():
    # a COCO instances file written by pandas keys its image ids as floats (1.0), which read_instances keeps and every
    # lookup reads as 1 (records.id_key); the sum intersected its components' images by str(), "1.0" against a JSONL
    # data set's "1": the image was unknown to the sum, and an adapter or the server refused it
    from finecap.integrations.scoring import Scorer

    mix = WeightedSum({
        "cider": (1.0, reward_of("cider", references={"1": ["a dog chasing a cat"], "2": ["a red bus"]})),
        "chair": (1.0, reward_of("chair", objects={1.0: frozenset({"dog"}), 2.0: frozenset({"bus"})})),
    })  # fmt: skip
    assert sorted(map(str, mix.known_images())) == ["1", "2"]
    out = Scorer.of(mix).score(["a dog chasing a cat", "a red bus"], [1, "2"])
    assert out.parts["chair"].tolist() == [0.5, 1.0]  # 1 - 1/2 (the cat), then 1: each image found by its float key
