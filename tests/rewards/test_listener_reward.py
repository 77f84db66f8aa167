"""The listener reward (``rl.rewards: {listener: w}``): hand-computed expected R@1, the candidates are the optimizer
step's global batch when the engine says it, its factory in a run and outside one, and its refusal off the world."""

from types import SimpleNamespace

import pytest
import torch

from finecap.config import load
from finecap.registry import REWARDS
from finecap.rewards import RewardInputs, call_batch, get_reward, reward_of
from finecap.rewards.listener import ListenerReward
from finecap.world.scene import Obj, Scene

SCENES = {
    0: Scene(0, "grass", [Obj("circle", "red", "large", 1, 1)]),
    1: Scene(1, "sand", [Obj("circle", "red", "large", 1, 1)]),
    2: Scene(2, "sand", [Obj("square", "blue", "large", 1, 1)]),
}


def test_expected_r1_among_the_batch_images_hand_computed():
    reward = ListenerReward(SCENES)
    texts = ["a red circle", "a red circle on sand", "a blue square", "a red circle on sand"]
    out = reward(texts, {"image_ids": [0, 1, 2], "image_index": torch.tensor([0, 1, 2, 0])})
    # "a red circle" for scene 0: scenes 0 and 1 tie at support 2 (scene 2: -2): 1/2. "... on sand" for scene 1:
    # support 3 vs 1 and -1: 1. "a blue square" for scene 2: 2 vs -2, -2: 1. "... on sand" for scene 0: scene 1 has
    # more: 0.
    assert out.total.tolist() == [0.5, 1.0, 1.0, 0.0]
    assert out.parts["listener"].tolist() == out.total.tolist()
    # outside a run (an adapter's call): the same captions, each with its image id, give the same rewards
    assert reward(texts, call_batch([0, 1, 2, 0])).total.tolist() == [0.5, 1.0, 1.0, 0.0]
    # ids given as strings (data files) find the world's int-keyed scenes
    assert reward(texts, call_batch(["0", "1", "2", "0"])).total.tolist() == [0.5, 1.0, 1.0, 0.0]


def test_an_image_written_as_an_int_and_as_its_string_is_one_candidate():
    """A call naming image 2 as 2 and as "2" (call_batch kept both, a batch may too) ranked image 2 against itself:
    "a blue square" for scene 2 tied with its own second column, expected R@1 1/2 where it is 1."""
    reward = ListenerReward(SCENES)
    texts = ["a red circle on sand", "a blue square", "a blue square"]
    want = reward(texts, call_batch([1, 2, 2])).total.tolist()
    assert want == [1.0, 1.0, 1.0]
    assert reward(texts, call_batch([1, 2, "2"])).total.tolist() == want
    batch = {"image_ids": [1, 2, "2"], "image_index": torch.tensor([0, 1, 2])}  # a batch holding both spellings
    assert reward(texts, batch).total.tolist() == want
    step = SimpleNamespace(step=0, image_ids=[1, "2", 2], fields={})  # and a step's global batch
    assert reward(texts, {**batch, "step_info": step}).total.tolist() == want


def test_call_batch_reads_an_int_and_its_string_as_one_image():
    batch = call_batch([7, "9", "7", 9, 7.0])
    assert batch["image_ids"] == [7, "9"] and batch["image_index"].tolist() == [0, 1, 0, 1, 0]


def test_the_candidates_are_the_steps_global_batch():
    # this micro-batch holds images 0 and 2 only; the step's global batch also holds image 1, which ties with image
    # 0 on "a red circle" and beats it on "a red circle on sand"
    reward = ListenerReward(SCENES)
    micro = {"image_ids": [0, 2], "image_index": torch.tensor([0, 0, 1])}
    texts = ["a red circle", "a red circle on sand", "a blue square"]
    assert reward(texts, micro).total.tolist() == [1.0, 1.0, 1.0]  # alone, image 0 has no rival
    step = SimpleNamespace(step=0, image_ids=[1, 0, 2], fields={})
    assert reward(texts, {**micro, "step_info": step}).total.tolist() == [0.5, 0.0, 1.0]


def test_factory_in_a_run_and_outside_one(tmp_path):
    assert REWARDS["listener"] == "finecap.rewards.listener:build"
    in_run = get_reward("listener", load())
    assert in_run.scenes is None  # read from the world in setup(inputs)
    with pytest.raises(RuntimeError, match="call setup"):
        in_run(["a red circle"], {"image_ids": [0]})
    outside = reward_of("listener", scenes=SCENES)
    assert outside(["a blue square"], call_batch([2])).total.tolist() == [1.0]
    with pytest.raises(ValueError, match="outside a training run give scenes="):
        reward_of("listener")
    with pytest.raises(ValueError, match="not both"):
        reward_of("listener", scenes=SCENES, world=tmp_path)
    with pytest.raises(KeyError, match="no scene graph for image id 7"):
        outside(["a circle"], call_batch([7]))


def test_refused_off_the_world():
    cfg = load(None, ["data.format=jsonl", "data.path=captions.jsonl"])
    with pytest.raises(ValueError, match="a training run reads the world's scene graphs .* this data has none"):
        get_reward("listener", cfg).setup(RewardInputs.of_run(cfg, []))


def test_scenes_keyed_by_an_int_and_its_string_are_refused():
    """Image 0 keyed 0 (a red circle on grass) and "0" (a blue square): "a red circle" for image 0 beside image 1 was
    read in the scene its call's spelling found first, without a word: a tie with image 1 (1/2) called as 0, 0 called
    as "0". Refused wherever the scenes enter the reward: the constructor and set-up (reward_of, a run's inputs)."""
    scenes = {**SCENES, "0": SCENES[2]}
    said = r"^listener scenes: 1 image\(s\) keyed twice, e\.g\. 0 and '0' \(an int id and its string are one id"
    with pytest.raises(ValueError, match=said):
        ListenerReward(scenes)
    with pytest.raises(ValueError, match=said):
        reward_of("listener", scenes=scenes)
    with pytest.raises(ValueError, match=said):
        ListenerReward().setup(RewardInputs(scenes=scenes))
    reward = reward_of("listener", scenes=SCENES)  # keyed once: either spelling reads the one scene
    assert reward(["a red circle", "a red circle"], call_batch([0, 1])).total.tolist()[0] == 0.5
    assert reward(["a red circle", "a red circle"], call_batch(["0", 1])).total.tolist()[0] == 0.5
