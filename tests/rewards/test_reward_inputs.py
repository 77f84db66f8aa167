"""``RewardInputs``: built from a training context (references, records, the world's scenes, the retriever when the
reward needs it, the accelerator's gather) and from an adapter's options; every built-in reward set up from either
gives the same values."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from finecap.config import SRConfig, load
from finecap.contract import TrainContext
from finecap.data.datasets import load_records
from finecap.rewards import RewardInputs, build_reward, call_batch, get_reward, reward_of
from finecap.rewards.inputs import identity
from finecap.rewards.retrieval import RetrievalReward


@pytest.fixture(scope="module")
def world(tiny):
    """The tiny world's overrides (its CLIP as the retriever), configuration and training records."""
    base = [*tiny["base"], f"retriever.checkpoint={tiny['clip']}"]
    cfg = load(None, base)
    return base, cfg, load_records(cfg, "train")


def test_from_a_training_context(world, tmp_path):
    _, cfg, records = world
    ctx = TrainContext(cfg, None, records, tokenizer="the tokenizer", run_dir=tmp_path)
    inputs = RewardInputs.from_context(ctx)
    assert inputs.retriever is None  # not needed: not loaded
    expected = {}
    for r in records:
        expected.setdefault(r.image_id, []).extend(r.captions)
    assert inputs.references == expected and len(expected) == 40
    assert list(inputs.records) == records
    assert set(inputs.scenes) >= set(expected)  # the world's scene graphs, every training image's among them
    assert inputs.gather is identity and inputs.device == torch.device("cpu")
    assert (inputs.tokenizer, inputs.run_dir) == ("the tokenizer", tmp_path)
    assert str(inputs.cache_dir) == cfg.run.cache_dir  # the tiny world's run.cache_dir
    gathered = []
    acc = SimpleNamespace(device=torch.device("cpu"), gather=lambda t: gathered.append(t) or t,
                          main_process_first=contextlib.nullcontext, num_processes=1)  # fmt: skip
    with_acc = RewardInputs.from_context(TrainContext(cfg, acc, records, None, tmp_path), frozenset({"retriever"}))
    assert with_acc.gather is acc.gather and with_acc.retriever is not None  # the retriever: needed, loaded
    assert with_acc.gather(torch.ones(2)).tolist() == [1.0, 1.0] and len(gathered) == 1


def test_every_builtin_reward_set_up_in_a_run_or_from_options_gives_the_same_values(world, tmp_path):
    """The training loop's route (``build_reward``, then ``setup`` with the context's inputs) and an adapter's
    (``reward_of`` with the same data as options) score the same captions bit for bit."""
    base, _, records = world
    mix_cfg = load(None, [*base, "rl.rewards={retrieval: 1.0, cider: 0.5, listener: 2.0, chair: 0.25}"])
    in_run = build_reward(mix_cfg)
    ctx = TrainContext(mix_cfg, None, records, None, tmp_path)
    in_run.setup(RewardInputs.from_context(ctx, in_run.needs))
    captions = [records[i % 5].captions[0] for i in range(8)] + ["a red circle", "two blue squares"]
    ids = [records[i].image_id for i in range(10)]
    batch = call_batch(ids)
    expected = in_run(captions, batch)
    retrieval = in_run.rewards["retrieval"][1]
    table = retrieval.retriever.image_embeddings(records, cache_dir=mix_cfg.run.cache_dir)  # as setup embeds them
    embeddings = dict(zip([r.image_id for r in records], table, strict=True))
    refs = {r: list(c) for r, c in RewardInputs.from_context(ctx).references.items()}
    scenes = RewardInputs.from_context(ctx).scenes
    outside = {
        "retrieval": reward_of("retrieval", retriever=retrieval.retriever, embeddings=embeddings, sr=SRConfig()),
        "cider": reward_of("cider", references=refs),
        "listener": reward_of("listener", scenes=scenes),
        "chair": reward_of("chair", scenes=scenes),
    }
    for name, reward in outside.items():
        assert torch.equal(reward(captions, batch).total, expected.parts[name]), name
    assert in_run.known_images() == frozenset(r.image_id for r in records)


def test_a_retrieval_reward_from_options_embeds_given_images_and_refuses_a_missing_table():
    class Retriever:
        logit_scale = 2.0

        def embed_images(self, images):
            return torch.tensor([[float(v) for v in image] for image in images])

        def embed_texts(self, texts):
            vectors = torch.tensor([[float(v) for v in t.split()] for t in texts])
            return torch.nn.functional.normalize(vectors, dim=-1)

    from_images = reward_of("retrieval", retriever=Retriever(), images={"a": (2.0, 0.0), "b": (0.0, 3.0)})
    direct = RetrievalReward(Retriever(), image_ids=["a", "b"], embeddings=torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    assert torch.equal(from_images(["1 0", "0 1"], call_batch(["a", "b"])).total,
                       direct(["1 0", "0 1"], call_batch(["a", "b"])).total)  # fmt: skip
    assert from_images.sr.reward == "log_prob"  # the sr section's defaults
    with pytest.raises(ValueError, match="retrieval: give retriever= and one image table"):
        reward_of("retrieval", retriever=Retriever())
    with pytest.raises(ValueError, match="retrieval: give retriever= and one image table"):
        reward_of("retrieval", embeddings={"a": torch.ones(2)})
    with pytest.raises(TypeError, match="sr= must be a finecap.config.SRConfig"):
        reward_of("retrieval", retriever=Retriever(), images={"a": (1.0, 0.0)}, sr={"reward": "accuracy"})
    built = get_reward("retrieval", load(None, ["sr.reward=accuracy"]))
    assert built.sr.reward == "accuracy" and built.table is None  # the factory takes the configuration only
    with pytest.raises(TypeError, match="options \\['sigma'\\] are given with a built reward"):
        reward_of(built, sigma=1.0)


def test_questions_come_from_the_data_set_itself(tmp_path):
    """A JSONL line's ``questions`` (CapRL's layout; issue 66) reach ``RewardInputs.questions`` and the qa_utility
    reward; a ``questions`` that is not a list is a DataError naming the line."""
    import json

    from PIL import Image

    from finecap.config import load as load_config
    from finecap.data.formats.jsonl import read_jsonl
    from finecap.data.records import DataError
    from finecap.rewards.inputs import RewardInputs

    Image.new("RGB", (4, 4)).save(tmp_path / "a.png")
    Image.new("RGB", (4, 4)).save(tmp_path / "b.png")
    asked = [{"question": "What colour is the cat?\n  - A) black\n  - B) white", "answer": "A"},
             {"question": "How many cats?", "options": ["one", "two"], "answer": "two"}]  # fmt: skip
    lines = [{"image": "a.png", "captions": ["a black cat"], "id": 1, "questions": asked},
             {"image": "b.png", "captions": ["a dog"], "id": 2}]  # fmt: skip
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    records = read_jsonl(tmp_path / "d.jsonl")
    cfg = load_config(None, ["data.format=jsonl", f"data.path={tmp_path / 'd.jsonl'}"])
    inputs = RewardInputs.of_run(cfg, records)
    first, second = inputs.questions[1]
    assert sorted(inputs.questions) == [1]
    assert (first.text, first.options, first.answer) == ("What colour is the cat?", ("black", "white"), "black")
    assert (second.options, second.answer) == (("one", "two"), "two")
    assert RewardInputs.of_run(cfg, records[1:]).questions is None
    (tmp_path / "bad.jsonl").write_text(json.dumps({**lines[0], "questions": "what?"}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl, line 1: 'questions' must be a list"):
        read_jsonl(tmp_path / "bad.jsonl")
