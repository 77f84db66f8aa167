"""Self-retrieval training on batches of whole bags (BagCurri, NDLB appendices B.2-B.3) through the training loop:
bag numbers reach the reward, bag-mates are the sampler's bags, and the demo's `sr_bagcurri` recipe (SR-LV with
LoRA, SR + 0.5 CIDEr-D, greedy baseline) trains on a tiny world, checkpoints its adapters and resumes exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from finecap.config import WorldConfig, load
from finecap.models import lora
from finecap.models.clipcap import ClipCap
from finecap.models.presets import save_tiny_clip
from finecap.recipes import resolve_recipe
from finecap.rewards.retrieval import RetrievalReward
from finecap.runs import checkpoint_dir, model_dir
from finecap.train.run import train
from helpers.logged_keys import undocumented

RECIPES = resolve_recipe("demo/mle").parent
N_TRAIN = 40


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    from finecap.world.make import make_world

    out = tmp_path_factory.mktemp("world")
    make_world(WorldConfig(n_train=N_TRAIN, n_val=6, n_test=4, image_size=32, seed=0), out=out, progress=False)
    return out


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory) -> Path:
    """A tiny random CLIP with the world tokenizer and an image processor: captioner encoder and retriever."""
    return save_tiny_clip(tmp_path_factory.mktemp("clip"), image_size=32, patch_size=16)


@pytest.fixture
def make_cfg(world, clip_dir, tmp_path):
    def make(*overrides: str, recipe: Path | None = None, run: str = "run"):
        base = [
            f"world.out={world}", f"world.n_train={N_TRAIN}", "world.n_val=6", "world.n_test=4", "world.image_size=32",
            f"model.encoder={clip_dir}", f"retriever.checkpoint={clip_dir}",
            "clipcap.tiny_layers=1", "clipcap.tiny_hidden=32", "clipcap.tiny_heads=2", "clipcap.prefix_length=2",
            f"run.dir={tmp_path / run}", f"run.cache_dir={tmp_path / 'cache'}", "train.init_from=",
            "train.batch_size=12", "train.log_every=1", "decode.max_length=8", "eval.n_distractors=3", "eval.draws=1",
        ]  # fmt: skip
        return load(recipe, [*base, *overrides])

    return make


def test_bag_numbers_reach_the_reward_and_bag_mates_are_the_sampler_bags(make_cfg, monkeypatch):
    from finecap.data.bags import BagCurriSampler, neighbour_table
    from finecap.data.datasets import load_records

    seen = []
    original = RetrievalReward.__call__

    def spy(self, captions, batch):
        out = original(self, captions, batch)
        seen.append((list(batch["image_ids"]), batch["bag"].tolist(), out.parts["candidates"].tolist()))
        return out

    monkeypatch.setattr(RetrievalReward, "__call__", spy)
    # 40 images, batches of 12: epoch 0 bags of 2 (6 per batch: 4 batches), epoch 1 bags of 4 (3 per batch: 4 batches)
    # 3 neighbours an image: bags of 4 need them all, so some bags hold random images (bags/filled below)
    cfg = make_cfg("train.objective=reinforce", "data.sampler=bagcurri", "data.bag_schedule={1: 2, 2: 4}",
                   "rl.rewards={retrieval: 1.0}", "rl.baseline=mean", "rl.strategy=greedy", "rl.samples=1",
                   "sr.distractors=bag", "train.max_steps=8", "train.eval_every=100", "train.lr=1e-3",
                   "data.bag_neighbours=3")  # fmt: skip
    run = train(cfg)
    assert len(seen) == 8

    records = load_records(cfg, "train")
    sampler = BagCurriSampler(neighbour_table(cfg, records, cfg.data.bag_neighbours), 12, {1: 2, 2: 4},
                              seed=cfg.run.seed)  # fmt: skip
    for step, (ids, bags, candidates) in enumerate(seen):
        size = 2 if step < 4 else 4
        expected = {frozenset(records[i].image_id for i in bag) for bag in sampler.bags_for(size).bags}
        groups: dict[int, list] = {}
        for image_id, bag in zip(ids, bags, strict=True):
            groups.setdefault(bag, []).append(image_id)
        assert all(frozenset(g) in expected for g in groups.values())  # whole bags of the sampler
        assert candidates == [float(size)] * len(ids)  # distractors = the bag-mates only
        assert bags == sorted(bags, key=lambda b: bags.index(b))  # bag-mates are contiguous
    assert sum(len(ids) for ids, _, _ in seen[:4]) == N_TRAIN  # every image once in the epoch
    # every training event names its epoch's bag size and how many bag-mates are random images (TrainingBags.filled,
    # computed and never reported before)
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    values = [e["values"] for e in events if e["split"] == "train"]
    assert [v["bags/size"] for v in values] == [2.0] * 4 + [4.0] * 4
    filled = [sampler.bags_for(2).filled] * 4 + [sampler.bags_for(4).filled] * 4
    assert [v["bags/filled"] for v in values] == filled and filled[-1] > 0
    assert undocumented({k for v in values for k in v}) == []  # docs/training.md, "What a run logs"


@pytest.mark.slow
def test_a_run_ending_before_a_bag_size_warns_at_its_start(make_cfg, caplog):
    # 40 images in batches of 12: bags of 2 take 4 steps (epoch 1); 3 steps never reach the bags of 4 of epoch 2
    cfg = make_cfg("train.objective=reinforce", "data.sampler=bagcurri", "data.bag_schedule={1: 2, 2: 4}",
                   "rl.rewards={retrieval: 1.0}", "rl.baseline=mean", "rl.strategy=greedy", "rl.samples=1",
                   "train.max_steps=3", "train.eval_every=100")  # fmt: skip
    train(cfg)
    assert ("data.bag_schedule={1: 2, 2: 4}: this run ends in epoch 1 (train.max_steps=3) and never uses bags of 4 "
            "(from epoch 2): train longer or shorten data.bag_schedule") in caplog.text  # fmt: skip


@pytest.mark.slow
def test_sr_bagcurri_recipe_trains_lora_adapters_and_resumes_exactly(make_cfg):
    # epoch 0: random batches (4 steps); epoch 1: bags of 2. Killed after step 4, resumed to step 6.
    common = ["train.max_steps=6", "train.save_every=2", "train.eval_every=3", "data.bag_schedule={1: 0, 2: 2}",
              "lora.rank=4", "lora.alpha=8", "train.lr=1e-3"]  # fmt: skip
    recipe = RECIPES / "sr_bagcurri.yaml"
    full = train(make_cfg(*common, recipe=recipe, run="full"))

    events = [json.loads(line) for line in (full / "metrics.jsonl").read_text().splitlines()]
    train_values = [e["values"] for e in events if e["split"] == "train"]
    assert len(train_values) == 6
    for v in train_values:
        assert {"reward/retrieval", "reward/cider", "reward_greedy", "reward/retrieval/accuracy"} <= set(v)
        assert torch.isfinite(torch.tensor(v["loss"]))
    # random batches of 12 (the last has 4) then bags of 2 in batches of 12: the global batch is every distractor
    assert [v["reward/retrieval/candidates"] for v in train_values] == [12.0, 12.0, 12.0, 4.0, 12.0, 12.0]
    assert "r@1" in [e for e in events if e["split"] == "val"][0]["values"]

    last = model_dir(checkpoint_dir(full, "last"))
    assert (last / "lm_lora" / "adapter_model.safetensors").exists()
    assert (last / "encoder_lora" / "adapter_model.safetensors").exists()
    model = ClipCap.from_checkpoint(last)
    assert lora.adapter_spec(model, "lm").rank == 4 and lora.adapter_spec(model, "encoder").rank == 4
    assert model.train_encoder and model.train_lm

    class Killed(Exception):
        pass

    def kill_at_4(state):
        if state.step == 4:
            raise Killed

    cfg = make_cfg(*common, recipe=recipe, run="killed")
    with pytest.raises(Killed):
        train(cfg, callbacks=[kill_at_4])
    resumed = train(cfg, resume=True)
    a = ClipCap.from_checkpoint(model_dir(checkpoint_dir(full, "last"))).state_dict()
    b = ClipCap.from_checkpoint(model_dir(checkpoint_dir(resumed, "last"))).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    adapters = [k for k in a if "lora_B" in k]
    assert adapters and any(a[k].abs().sum() > 0 for k in adapters)  # the adapters learned


def test_hard_distractors_through_the_loop(make_cfg):
    # batches of 12: 3 mined training images + 12 - 1 - 3 = 8 batch images + the target = 12 candidates per caption
    cfg = make_cfg("train.objective=reinforce", "rl.rewards={retrieval: 1.0}", "rl.baseline=mean",
                   "rl.strategy=greedy", "rl.samples=1", "sr.distractors=hard", "sr.hard_k=3", "train.max_steps=2",
                   "train.eval_every=100")  # fmt: skip
    run = train(cfg)
    values = [json.loads(line)["values"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [v["reward/retrieval/candidates"] for v in values if "reward" in v] == [12.0, 12.0]


SPLIT = ["train.objective=reinforce", "data.sampler=bagcurri", "data.bag_schedule={1: 4}",
         "rl.rewards={retrieval: 1.0}", "rl.baseline=mean", "rl.strategy=greedy", "rl.samples=1",
         "sr.distractors=bag", "train.eval_every=100", "train.save_every=1", "clipcap.tiny_dropout=0"]  # fmt: skip


def test_accumulation_takes_the_global_batch_of_one_big_batch_and_cuts_bags_without_losing_bag_mates(
    make_cfg, monkeypatch
):
    """One step of 12 images, bags of 4, as 1 x 12 and as 1 x 6 x 2 accumulation steps. The global batches used to
    be rounded to whole bags per micro-batch, so the split step took 2 bags (8 images) where the big batch took 3
    (12). Now both take the same 3 bags; the second bag is cut between the two micro-batches, and its images still
    have their 3 bag-mates as distractors (the reward reads the step's bag numbers), so the rewards, the loss and
    the gradient are those of the big batch."""
    seen = []
    original = RetrievalReward.__call__

    def spy(self, captions, batch):
        out = original(self, captions, batch)
        seen.append((list(batch["step_info"].image_ids), list(batch["image_ids"]), out.parts["candidates"].tolist(),
                     out.total.tolist()))  # fmt: skip
        return out

    monkeypatch.setattr(RetrievalReward, "__call__", spy)
    big = train(make_cfg(*SPLIT, "train.max_steps=1", run="big"))
    (step_ids, ids, candidates, rewards), *rest = seen
    assert rest == [] and step_ids == ids and len(ids) == 12 and candidates == [4.0] * 12
    seen.clear()
    split = train(make_cfg(*SPLIT, "train.max_steps=1", "train.batch_size=6", "train.grad_accum_steps=2",
                           run="split"))  # fmt: skip
    assert [s[0] for s in seen] == [step_ids, step_ids]  # the big batch's images, whatever the split
    assert [s[1] for s in seen] == [ids[:6], ids[6:]]  # the micro-batches cut the second bag of 4
    assert [c for s in seen for c in s[2]] == candidates  # every image keeps its 3 bag-mates
    assert [r for s in seen for r in s[3]] == pytest.approx(rewards, abs=1e-6)

    def logged(run, key):
        events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return next(e for e in events if e["split"] == "train")["values"][key]

    assert logged(split, "loss") == pytest.approx(logged(big, "loss"), rel=1e-5)
    assert logged(split, "grad_norm") == pytest.approx(logged(big, "grad_norm"), rel=1e-5)
    assert logged(big, "grad_norm") > 0


def test_a_mid_epoch_resume_with_another_split_continues_and_other_batches_are_refused(make_cfg):
    """Resumed mid-epoch, a run must train the rest of its epoch's examples: with another split of the same global
    batch BagCurri plans the same batches and the run continues; with batches that hold other examples (another bag
    schedule: the global batch size alone was checked before the checkpoint recorded which examples its epoch has
    trained) it is refused."""
    from finecap.train.state import CheckpointError

    run = train(make_cfg(*SPLIT, "train.max_steps=1"))  # 1 process x 12: 3 bags of 4 a batch
    state = json.loads((checkpoint_dir(run, "last") / "trainer_state.json").read_text())
    assert state["position"] == 1 and len(state["trained"]) == 64
    other = make_cfg(*[o for o in SPLIT if not o.startswith("data.bag_schedule")], "data.bag_schedule={1: 3}",
                     "train.max_steps=3")  # fmt: skip
    with pytest.raises(CheckpointError, match=r"stopped 1 global batches into epoch 0, but this run's first 1 "
                                              r"batches of that epoch hold other examples"):  # fmt: skip
        train(other, resume=True)
    assert json.loads((checkpoint_dir(run, "last") / "trainer_state.json").read_text())["step"] == 1
    split = make_cfg(*SPLIT, "train.max_steps=3", "train.batch_size=6", "train.grad_accum_steps=2")
    resumed = train(split, resume=True)
    assert json.loads((checkpoint_dir(resumed, "last") / "trainer_state.json").read_text())["step"] == 3
