"""A generation engine of one's own (tests/helpers/toy_engine.py, named by its dotted path ``decode.engine=
helpers.toy_engine:ColourEngine``) goes where finecap's engines go: ``finecap caption`` and the Python API caption
with it, an RL rollout decodes with it (kept in step after an optimizer step, its log-probs importance-corrected),
its declared refusal stops a run before anything is built, and ``decode.engine`` names only engines."""

from __future__ import annotations

import pytest
import torch

from finecap import Captioner
from finecap.config import ConfigError, DecodeConfig, RLConfig, load
from finecap.contract import StepInfo
from finecap.data.datasets import model_collator
from finecap.engines import engine_class, open_engine
from finecap.objectives import get_objective
from finecap.objectives.baselines import build_baseline
from finecap.objectives.reinforce import Reinforce
from finecap.rewards.base import RewardOutput, WeightedSum
from helpers.shapes import CAPTION, COLORS, caption
from helpers.toy_engine import NAME, OPENED, ColourEngine

TOY = [f"the {color} one" for color in COLORS]


@pytest.fixture(scope="module")
def files(shapes):
    return [shapes["new"] / f"{color}.png" for color in COLORS]


def test_finecap_caption_decodes_with_the_named_engine(run, files, tmp_path):
    opened = len(OPENED)
    toy = caption(run, *files, out=tmp_path / "toy.json", more=("--engine", NAME))
    assert [toy[f.name] for f in files] == TOY
    assert len(OPENED) == opened + 1 and OPENED[-1].closed  # opened for the command, closed after it
    own = caption(run, *files, out=tmp_path / "own.json")  # the default engine: the captioner itself
    assert [own[f.name] for f in files] == [CAPTION[color] for color in COLORS]


def test_the_api_holds_the_engine_its_settings_name(run, files):
    cap = Captioner.from_pretrained(run, device="cpu")
    opened = len(OPENED)
    assert cap.caption(files, engine=NAME) == TOY
    assert cap.caption(files[:1], engine=NAME) == TOY[:1]
    assert len(OPENED) == opened + 1 and not OPENED[-1].closed  # kept between calls with the same engine
    assert cap.caption(files) == [CAPTION[color] for color in COLORS]  # back to the captioner: the toy is closed
    assert OPENED[-1].closed
    cap.close()


def words(captions, batch):
    return RewardOutput(torch.tensor([float(len(c.split())) for c in captions]))


def test_an_rl_rollout_decodes_with_the_engine_and_syncs_it(run, shapes, tmp_path):
    from helpers.contexts import training_context

    """REINFORCE's rollouts come from the toy engine (its captions are rewarded and scored by the trainer), its
    log-probs are importance-corrected (``external_logprobs``), and an optimizer step syncs it before the next."""
    from PIL import Image

    policy = Captioner.from_pretrained(run, device="cpu").model
    pictures = [Image.open(shapes["new"] / f"{color}.png") for color in COLORS]
    items = [{"caption": "a b", "image": im, "image_id": i, "references": ["a b"], "index": i}
             for i, im in enumerate(pictures)]  # fmt: skip
    assert engine_class(DecodeConfig(engine=NAME)).reads_images  # what the training collator is told to keep
    batch = model_collator(policy, 8, keep_images=True)(items)
    batch["step_info"] = StepInfo(0, list(range(len(items))), {})
    rl = RLConfig(samples=2, baseline="none")  # the reward itself is the advantage: a gradient
    objective = Reinforce(WeightedSum({"words": (1.0, words)}), build_baseline(rl), rl=rl,
                          decode=DecodeConfig(engine=NAME, max_length=6))  # fmt: skip
    objective.setup(training_context([], tmp_path))
    out = objective(policy, batch)
    engine = objective.rollouts.engine
    assert isinstance(engine, ColourEngine) and engine.synced == 0
    assert out.metrics["reward"] == pytest.approx(3.0)  # "the <colour> one": 3 words, every sample
    assert "vllm/logp_diff/max" in out.metrics and "time/sync" in out.metrics  # another engine's log-probs
    sum(out.losses.values()).backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.parameters())  # scored by the trainer
    objective.end_step()
    batch["step_info"] = StepInfo(1, list(range(len(items))), {})
    objective(policy, batch)
    assert objective.rollouts.engine is engine and engine.synced == 1  # synced once, not rebuilt
    objective.close()
    assert engine.closed and objective.rollouts.engine is None


@pytest.mark.parametrize("grpo", [False, True])
def test_a_caption_of_no_token_is_refused_naming_the_engine(run, shapes, tmp_path, grpo):
    """An engine returning a caption with no token (not even its stop token, which the contract counts) is refused at
    the rollout, naming it, before any reward scores it: REINFORCE and GRPO alike. Until 2026-11-29 such a caption
    went through: rewarded as "", counted in its group's mean, and given an advantage (-0.71 in a group of 2 with a
    3-word caption) that its log-prob, a sum over no token, could not take."""
    from PIL import Image

    from finecap.config import GRPOConfig
    from finecap.objectives.grpo import PolicyOptimization
    from helpers.contexts import training_context

    engine = "helpers.toy_engine:NoTokenEngine"
    policy = Captioner.from_pretrained(run, device="cpu").model
    pictures = [Image.open(shapes["new"] / f"{color}.png") for color in COLORS]
    items = [{"caption": "a b", "image": im, "image_id": i, "references": ["a b"], "index": i}
             for i, im in enumerate(pictures)]  # fmt: skip
    batch = model_collator(policy, 8, keep_images=True)(items)
    batch["step_info"] = StepInfo(0, list(range(len(items))), {})
    scored = []

    def counted(captions, batch):
        scored.append(len(captions))
        return words(captions, batch)

    rl = RLConfig(samples=2, baseline="none")
    options = {"grpo": GRPOConfig(advantage="group", policy_loss="clipped")} if grpo else {}
    cls = PolicyOptimization if grpo else Reinforce
    objective = cls(WeightedSum({"words": (1.0, counted)}), build_baseline(rl), rl=rl,
                    decode=DecodeConfig(engine=engine, max_length=6), **options)  # fmt: skip
    objective.setup(training_context([], tmp_path))
    with pytest.raises(ValueError) as e:
        objective(policy, batch)
    assert str(e.value).startswith(f"decode.engine={engine} returned 1 of {2 * len(items)} captions with no token "
                                   "(the first: row 0, ''); a caption's tokens end with its stop token")  # fmt: skip
    assert scored == []  # refused before any reward
    objective.close()


def test_the_engines_refusal_stops_a_run_before_anything_is_built():
    cfg = load(None, ["train.objective=reinforce", "model.kind=blip", f"decode.engine={NAME}"])
    with pytest.raises(ConfigError) as e:
        get_objective("reinforce", cfg)
    assert str(e.value) == f"decode.engine={NAME}: model.kind=blip is not served by the toy engine"
    assert e.value.key == "decode.engine"


def test_decode_engine_names_only_engines(run):
    with pytest.raises(ConfigError, match=r"decode.engine: unknown generation engine 'vlm' \(did you mean 'vllm'\?\)"):
        load(None, ["decode.engine=vlm"])
    policy = Captioner.from_pretrained(run, device="cpu").model
    cfg = load(None, ["decode.engine=helpers.toy_engine:NotAnEngine"])  # a dotted path is checked when opened
    with pytest.raises(ConfigError, match="decode.engine: 'helpers.toy_engine:NotAnEngine' is not a GenerationEngine"):
        open_engine(cfg, policy)
    with pytest.raises(ConfigError, match="decode.engine: cannot import module 'helpers.nowhere'"):
        open_engine(load(None, ["decode.engine=helpers.nowhere:Engine"]), policy)
