"""docs/architecture.md's "How to add a reward", followed: a reward written in this file (a module of the user's
own), plugged in by dotted path in ``rl.rewards``, trains a step of the tiny world's captioner, is set up by the
training loop and is logged as ``reward/<name>``; the same factory serves TRL's adapter; and the built-in listener
reward (one row of ``registry.REWARDS``) trains a step on the world's scene graphs."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from finecap.integrations.trl import reward_function
from finecap.judges.base import JudgeFailed
from finecap.judges.world import WorldJudge
from finecap.rewards import NonFiniteReward, RewardBase, RewardOutput
from finecap.train.run import train
from helpers.logged_keys import undocumented

SET_UP: list[int] = []  # the images with references each Words reward saw in setup(inputs)


class Words(RewardBase):
    """Step 1 of the recipe: the reward, ``reward(captions, batch) -> RewardOutput``: a caption's number of words
    (times ``scale``, a setting), with a ``setup(inputs)`` hook."""

    per_caption = True  # a caption's value is its own
    settings = ("scale",)

    def __init__(self) -> None:
        self.scale = 1.0

    def setup(self, inputs) -> None:
        SET_UP.append(len(inputs.references or {}))

    def __call__(self, captions, batch):
        total = torch.tensor([self.scale * len(c.split()) for c in captions])
        return RewardOutput(total, {"words": total})


def build(cfg):
    """Step 2: its factory, ``build(cfg) -> reward``."""
    return Words()


class NaNAtSecondCall:
    """Words, with a NaN ``length`` part for caption 1 from its second call on (the first step's greedy captions): a
    plain callable, which the loop wraps (``as_reward``)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, captions, batch):
        self.calls += 1
        total = torch.tensor([float(len(c.split())) for c in captions])
        length = total.clone()
        if self.calls > 1:
            length[1] = float("nan")
        return RewardOutput(total, {"length": length})


def nan_at_second_call(cfg):
    return NaNAtSecondCall()


def train_values(run_dir) -> list[dict]:
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [e["values"] for e in events if e["split"] == "train"]


RL = ["train.objective=reinforce", "rl.samples=2", "train.max_steps=1", "train.batch_size=8", "train.eval_every=0",
      "train.eval_samples=4", "train.log_captions=0", "decode.max_length=8"]  # fmt: skip


@pytest.mark.parametrize("options", [[], ["grpo.advantage=group", "grpo.policy_loss=clipped", "grpo.iterations=2"]])
def test_a_non_finite_reward_in_training_is_an_error_naming_the_reward_and_part(make_cfg, options):
    """REINFORCE (its second reward call is the greedy baseline's) and GRPO (no greedy captions: the second call is
    the second rollout's, step 3): the error names the reward and its part, never the learning rate."""
    name = f"{__name__}:nan_at_second_call"
    cfg = make_cfg(*RL, f"rl.rewards={{'{name}': 1.0, cider: 1.0}}", "train.max_steps=4", *options)
    with pytest.raises(NonFiniteReward) as caught:
        train(cfg)
    message = str(caught.value)
    assert message.startswith(f"reward '{name}': part 'length' is nan at caption 1 (1 of ")
    assert "train.lr" not in message and "\n" not in message


def test_a_reward_of_your_own_by_dotted_path_trains_a_step(make_cfg):
    name = f"{__name__}:build"  # step 3: rl.rewards names it by its dotted path
    SET_UP.clear()
    values = train_values(train(make_cfg(*RL, f"rl.rewards={{'{name}': 1.0}}")))
    assert len(values) == 1 and math.isfinite(values[0]["loss/reinforce"])
    assert SET_UP and SET_UP[0] > 0  # the loop set it up with the training references
    # the logged reward is this reward of the sampled captions: their mean number of words
    assert values[0][f"reward/{name}"] == pytest.approx(values[0]["sample_words"], rel=1e-6)
    assert values[0][f"reward/{name}"] > 0


def test_the_same_factory_serves_trl_with_its_settings():
    fn = reward_function(f"{__name__}:build", scale=0.5)
    assert fn(prompts=["", ""], completions=["a red circle", "a square"], image_id=[1, 2]) == [1.5, 1.0]
    assert fn.reward.per_caption and fn.reward.scale == 0.5


def test_the_listener_reward_trains_a_step_on_the_world(make_cfg):
    values = train_values(train(make_cfg(*RL, "rl.rewards={listener: 1.0}")))
    assert len(values) == 1 and math.isfinite(values[0]["loss/reinforce"])
    assert 0.0 <= values[0]["reward/listener"] <= 1.0  # an expected R@1 among the step's images


@pytest.mark.parametrize("noise", [0.0, 0.3])
def test_grpo_with_qa_utility_on_the_world_judge_logs_every_part(make_cfg, noise):
    """demo/grpo_qa's settings, tiny: GRPO with the QA-utility reward answered by the world judge (with and without
    judge noise) trains 2 steps and logs the reward's parts and judge counters."""
    from finecap.config import load as load_recipe

    recipe = load_recipe("demo/grpo_qa")
    assert recipe.rl.rewards == {"qa_utility": 1.0} and recipe.judge.name == "world"
    cfg = make_cfg(*RL, "rl.rewards={qa_utility: 1.0}", "grpo.advantage=group", "grpo.policy_loss=clipped",
                   "train.max_steps=2", "train.log_every=1", f"judge.noise={noise}")  # fmt: skip
    values = train_values(train(cfg))
    assert len(values) == 2
    for v in values:
        assert math.isfinite(v["loss/policy"]) and 0.0 <= v["reward/qa_utility"] <= 1.0
        parts = [v[f"reward/qa_utility/{p}"] for p in ("answered", "cannot_answer", "wrong")]
        assert sum(parts) == pytest.approx(1.0, abs=1e-5) and v["reward/qa_utility/judge_failed"] == 0.0
        assert v["reward/qa_utility/judge_cannot_answer"] >= 0.0


CLOSED: list[object] = []  # the judges the closing judge's factory made, as each was closed


def closing_world_judge(cfg, **options):
    """The world judge, recording its close into :data:`CLOSED`."""
    from finecap.judges.world import WorldJudge

    class Closing(WorldJudge):
        def close(self) -> None:
            CLOSED.append(self)

    return Closing()


def test_the_judge_a_training_reward_built_is_closed_when_training_ends(make_cfg):
    # a judge behind a server holds connections, an in-process one an engine's memory (a demo trains stage after
    # stage in one process): the reward that built its judge from judge.name closes it once, when the run ends
    CLOSED.clear()
    cfg = make_cfg(*RL, "rl.rewards={qa_utility: 1.0}", f"judge.name={__name__}:closing_world_judge")
    values = train_values(train(cfg))
    assert len(values) == 1 and 0.0 <= values[0]["reward/qa_utility"] <= 1.0
    assert len(CLOSED) == 1


class TalliedWorldJudge(WorldJudge):
    """The world judge, except that the first ask of a caption in each call fails (counted as failed) and each call
    asking about captions meets one HTTP 429 of its server (a backend's ``rate_limited``); the blind asks (the
    reward's set-up's) are counted apart, in ``blind``."""

    def __init__(self) -> None:
        super().__init__()
        self.backends = [SimpleNamespace(rate_limited=0)]
        self.blind = 0

    def answer(self, asks):
        out = super().answer(asks)
        self.blind += sum(a.caption is None for a in asks)
        captioned = [n for n, a in enumerate(asks) if a.caption is not None]
        if captioned:
            self.backends[0].rate_limited += 1
            out[captioned[0]] = JudgeFailed("down for one ask")
            self.counts["failed"] += 1
        return out


TALLIED: list[TalliedWorldJudge] = []  # the judges tallied_world_judge made


def tallied_world_judge(cfg, **options):
    TALLIED.append(TalliedWorldJudge())
    return TALLIED[-1]


def test_a_training_run_logs_its_judges_calls_failures_and_rate_limits_per_step(make_cfg):
    """The judge's counts (Judge.counts: calls, cache hits, unparsable answers, failed calls) and its servers'
    HTTP 429s (OpenAIBackend.rate_limited) were logged nowhere: a run said how many captions failed
    (reward/qa_utility/judge_failed), not how many calls were asked, failed or rate-limited. Each step now logs their
    increase as reward/qa_utility/judge/<tally>, the set-up's blind asks in no step."""
    TALLIED.clear()
    cfg = make_cfg(*RL, "rl.rewards={qa_utility: 1.0}", f"judge.name={__name__}:tallied_world_judge",
                   "train.max_steps=3", "train.log_every=1")  # fmt: skip
    values = train_values(train(cfg))
    (judge,) = TALLIED
    assert len(values) == 3
    logged = {key: [v[f"reward/qa_utility/judge/{key}"] for v in values]
              for key in ("calls", "cache_hits", "unparsable", "failed", "rate_limited")}  # fmt: skip
    # every step asked (its samples' and greedy captions' questions), each ask of a caption once
    assert all(n > 0 for n in logged["calls"]) and sum(logged["calls"]) == judge.counts["calls"] - judge.blind
    assert judge.blind > 0  # the set-up asked blind: counted in no step
    assert all(n > 0 for n in logged["failed"]) and sum(logged["failed"]) == judge.counts["failed"]
    assert all(n > 0 for n in logged["rate_limited"]) and sum(logged["rate_limited"]) == judge.backends[0].rate_limited
    assert logged["cache_hits"] == logged["unparsable"] == [0.0] * 3  # the world judge has no cache, parses nothing
    assert all(v["reward/qa_utility/judge_failed"] > 0 for v in values)  # the captions whose asks failed
    assert undocumented(set(values[0])) == []  # docs/training.md's "What a run logs" explains every key
