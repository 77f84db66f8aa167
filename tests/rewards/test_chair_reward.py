"""The ``chair`` reward: 1 - CHAIRi per caption (+ recall_weight x object recall), its logged parts, its factory, and
the same counts as the ``hallucination`` metric group's."""

from __future__ import annotations

import pytest
import torch

from finecap.metrics.hallucination import chair
from finecap.registry import REWARDS
from finecap.rewards import RewardInputs, WeightedSum, call_batch, get_reward, reward_of
from finecap.rewards.chair import ChairReward

OBJECTS = {1: frozenset({"dog", "person"}), 2: frozenset({"cat", "teddy bear"}), 3: frozenset()}


def test_reward_is_one_minus_the_hallucinated_share_with_its_parts():
    assert REWARDS["chair"] == "finecap.rewards.chair:build"
    reward = WeightedSum({"chair": (1.0, reward_of("chair", objects=OBJECTS))})
    captions = [
        "two men and their dogs",  # person, dog: 0 of 2 hallucinated -> 1.0; recall 2/2
        "a dog chasing a cat and a frisbee",  # dog, cat, frisbee on image 1: cat, frisbee -> 1 - 2/3; recall 1/2
        "a kitten with teddy bears",  # image 2: cat, teddy bear -> 1.0; recall 2/2
        "a kitten on a bus",  # image 2: cat, bus -> 1 - 1/2; recall 1/2
        "an empty street",  # image 3: no mention -> 1.0 (never wrong); no annotated object -> recall 1
    ]
    out = reward(captions, call_batch([1, 1, 2, 2, 3]))
    assert out.total.tolist() == pytest.approx([1.0, 1 / 3, 1.0, 0.5, 1.0])
    assert out.parts["chair/CHAIRi"].tolist() == pytest.approx([0.0, 2 / 3, 0.0, 0.5, 0.0])
    assert out.parts["chair/CHAIRs"].tolist() == [0.0, 1.0, 0.0, 1.0, 0.0]
    assert out.parts["chair/recall"].tolist() == [1.0, 0.5, 1.0, 0.5, 1.0]
    assert out.parts["chair/objects"].tolist() == [2.0, 3.0, 2.0, 2.0, 0.0]
    assert torch.equal(out.parts["chair"], out.total)


def test_recall_weight_references_and_the_metric_agree():
    # recall_weight 0.5: "a dog" on image 1 -> 1 - 0 + 0.5 * 1/2 = 1.25; "a cat" -> 1 - 1 + 0.5 * 0 = 0
    reward = reward_of("chair", objects=OBJECTS, recall_weight=0.5)
    assert reward(["a dog", "a cat"], call_batch([1, 1])).total.tolist() == [1.25, 0.0]
    # a reference naming a cat makes the cat ground truth (CHAIR's reference code): 1 - 0
    with_refs = ChairReward(OBJECTS, {1: ["A dog and a cat."]})
    assert with_refs(["a cat"], call_batch([1])).total.tolist() == [1.0]
    # per caption, the reward's CHAIRi is the metric group's
    captions = {1: "a dog chasing a cat and a frisbee", 2: "a kitten on a bus", 3: "a bus"}
    _, items = chair(captions, OBJECTS)
    out = ChairReward(OBJECTS)(list(captions.values()), call_batch(list(captions)))
    assert out.parts["CHAIRi"].tolist() == pytest.approx([items[i].chair_i for i in captions])


def test_a_calls_own_references_replace_the_images_in_the_ground_truth():
    # the reward server's and the adapters' requests may send references; the chair reward ignored them, scoring
    # against the references it was built with (CIDEr-D and claims read the call's instead)
    reward = ChairReward(OBJECTS, {1: ["a dog chasing a cat"]})
    captions = ["a dog chasing a cat", "a man with a frisbee", "a kitten on a bus"]
    assert reward(captions, call_batch([1, 1, 2])).total.tolist() == pytest.approx([1.0, 0.5, 0.5])  # the image's
    given = [["a dog with a frisbee"], ["a dog with a frisbee"], ["a cat on a bus"]]
    out = reward(captions, call_batch([1, 1, 2], given))
    # image 1 truth: dog, person + frisbee (cat no longer: replaced): cat 1 of 2 mentions -> 0.5; person, frisbee -> 1;
    # image 2 truth: cat, teddy bear + bus -> 1
    assert out.total.tolist() == pytest.approx([0.5, 1.0, 1.0])
    assert out.parts["recall"].tolist() == pytest.approx([0.5, 0.5, 0.5])  # of the annotated objects alone
    assert reward(captions, call_batch([1, 1, 2])).total.tolist() == pytest.approx([1.0, 0.5, 0.5])  # unchanged


def test_factory_and_missing_images():
    with pytest.raises(ValueError, match="outside a training run give objects="):
        reward_of("chair")
    with pytest.raises(ValueError, match="not both"):
        reward_of("chair", objects=OBJECTS, instances="x.json")
    with pytest.raises(ValueError, match=r"^eval.instances: .*nope.json: no such file"):
        reward_of("chair", instances="nope.json")
    with pytest.raises(TypeError, match="unexpected keyword argument 'recall'.*settings: recall_weight"):
        reward_of("chair", objects=OBJECTS, recall=0.5)
    with pytest.raises(ValueError, match=r"rl.rewards.chair: no objects for 1 predicted image\(s\), e.g. \[9\]"):
        ChairReward(OBJECTS)(["a dog"], call_batch([9]))


def test_setup_in_a_run_reads_eval_instances_and_the_training_references(tmp_path):
    from finecap.config import load
    from finecap.contract import TrainContext
    from finecap.data.records import Record
    from helpers.coco_instances import instances_file

    path = instances_file(tmp_path)  # image 3: a hot dog and a dining table
    records = [Record(3, tmp_path / "3.jpg", "train", ["A dog sniffs hot dogs on a table."])]
    cfg = load(None, ["data.format=coco", f"eval.instances={path}"])
    reward = get_reward("chair", cfg)
    reward.setup(RewardInputs.from_context(TrainContext(cfg, None, records, tokenizer=None, run_dir=tmp_path)))
    # hot dog, dog (the training reference names one: present), table -> 1 - 0; a cat: 1 - 1
    assert reward(["hot dogs and a dog on a table", "a cat"], call_batch([3, 3])).total.tolist() == [1.0, 0.0]
    coco = load(None, ["data.format=coco"])
    with pytest.raises(ValueError, match=r"^chair: no object annotations: .* in a run set eval.instances="):
        get_reward("chair", coco).setup(RewardInputs.of_run(coco, records))


def test_references_keyed_by_the_id_written_the_other_way_are_the_images():
    # COCO's instances key images by int, a JSONL data set's references by string: the reward looked the references
    # up by the id as the objects key it, so "a cat" named by the references of "1" was a hallucination on image 1
    # (1 - 1/2 = 0.5 for "a dog chasing a cat"); through an adapter, whichever way the call writes the id
    from finecap.integrations.scoring import Scorer

    scorer = Scorer.of("chair", objects={1: frozenset({"dog"})}, references={"1": ["a dog chasing a cat"]})
    assert scorer.score(["a dog chasing a cat", "a dog and a bus"], [1, "1"]).total.tolist() == [1.0, 0.5]
    # references given to the constructor and with the inputs, one keyed each way: one list of the image
    reward = ChairReward(references={"1": ["a cat"]})
    reward.setup(RewardInputs(objects={1: frozenset({"dog"})}, references={1: ["a bus"]}))
    assert reward(["a dog, a cat and a bus"], call_batch([1])).total.tolist() == [1.0]


@pytest.mark.parametrize(
    ("table", "given", "objects"),
    [
        ("objects", {1: frozenset({"dog"}), "1": frozenset({"cat"}), 2: frozenset()}, None),
        ("references", {1: ["a dog"], "1": ["a cat"], 2: ["a bus"]}, {1: frozenset(), 2: frozenset()}),
    ],
)
def test_a_table_keyed_by_an_int_and_its_string_is_refused(table, given, objects):
    """Image 1 keyed 1 and "1" with two different entries: "a dog" was checked against the entry its call's spelling
    found first, without a word: 1.0 called as 1 and 0.0 as "1" (objects; references given to the constructor, the
    image having no annotated object), while set-up (reward_of) pooled the two reference lists into one, as the
    ``chair`` metric refuses. Refused wherever the table enters the reward: the constructor and set-up."""
    said = rf"^chair {table}: 1 image\(s\) keyed twice, e\.g\. 1 and '1' \(an int id and its string are one id"
    tables = {table: given} if objects is None else {table: given, "objects": objects}
    with pytest.raises(ValueError, match=said):
        ChairReward(**tables)
    with pytest.raises(ValueError, match=said):
        reward_of("chair", **tables)


def test_world_scenes_keyed_by_an_int_and_its_string_are_refused():
    # the world's ground truth (its scenes' shapes) keyed 0 and "0": "a circle" was true or a hallucination by how
    # its call spelt the id
    from finecap.world.scene import Obj, Scene

    scenes = {0: Scene(0, "grass", [Obj("circle", "red", "large", 1, 1)]),
              "0": Scene(0, "grass", [Obj("square", "red", "large", 1, 1)])}  # fmt: skip
    with pytest.raises(ValueError, match=r"^chair scenes: 1 image\(s\) keyed twice, e\.g\. 0 and '0'"):
        reward_of("chair", scenes=scenes)
    reward = reward_of("chair", scenes={0: scenes[0]})
    assert reward(["a circle", "a circle"], call_batch([0, "0"])).total.tolist() == [1.0, 1.0]
