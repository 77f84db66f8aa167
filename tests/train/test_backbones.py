"""Every objective on both backbones (ClipCap and BLIP): a few optimizer steps of the training loop's own step on one
fixed batch lower the objective's loss, and exactly the parts that should learn change.

The batch (and the step number that seeds sampling) stays fixed, so REINFORCE-style losses are compared on the same
sampled captions while the policy moves little (rewards and the leave-one-out baseline depend only on the samples).
The world BLIP reads the tiny CLIP's image tokens (its ViT's last hidden state) in these tests.
"""

from __future__ import annotations

import pytest
import torch

from finecap.contract import TrainContext
from finecap.data.datasets import to_device
from finecap.data.samplers import get_sampler
from finecap.home import run_path
from finecap.models import lora
from finecap.objectives import get_objective
from finecap.train.engine import Engine, TrainingData, build_optimizer, make_accelerator
from finecap.train.schedule import build_scheduler
from finecap.train.setup import build_data, build_model, train_unit
from finecap.utils.rng import seed_everything

BACKBONES = {
    "clipcap": [],
    "blip": [
        "model.kind=blip",
        "blip.name=world-tiny",
        "blip.tiny_layers=1",
        "blip.tiny_hidden=32",
        "blip.tiny_heads=2",
    ],
}
RL = ["rl.samples=2", "rl.baseline=leave_one_out", "rl.strategy=sample", "train.batch_size=8", "decode.max_length=8"]
SR = [*RL, "train.objective=reinforce", "rl.rewards={retrieval: 1.0}", "train.lr=1e-3"]
OBJECTIVES = {
    "mle": ["train.objective=mle"],
    "smile_sequence": ["train.objective=smile", "smile.subset=sequence", "smile.first_token=mle"],
    "smile_reverse_shift": [
        "train.objective=smile",
        "smile.subset=reverse",
        "smile.first_token=shift",
        "smile.shift_token_id=5",
    ],
    "smile_random_none": [
        "train.objective=smile",
        "smile.subset=random",
        "smile.first_token=none",
        "smile.mle_weight=0.2",
    ],  # fmt: skip
    "smile_full": ["train.objective=smile", "smile.subset=full"],
    "reinforce_cider": [*RL, "train.objective=reinforce", "rl.rewards={cider: 1.0}", "train.lr=1e-3"],
    "reinforce_retrieval": SR,
    "sle": [*RL, "train.objective=sle", "rl.rewards={cider: 1.0}", "train.lr=1e-3"],
    "scst_me": [*RL, "train.objective=scst_me", "rl.rewards={cider: 1.0}", "rl.entropy_coef=0.05", "train.lr=1e-3"],
    "sr_l": [*SR, "lora.lm=true", "lora.rank=4", "lora.alpha=4"],
    "sr_v": [
        *SR,
        "model.train_lm=false",
        "model.train_encoder=true",
        "lora.encoder=true",
        "lora.rank=4",
        "lora.alpha=4",
    ],  # fmt: skip
    "sr_lv_bagcurri": [
        *SR,
        "model.train_encoder=true",
        "lora.lm=true",
        "lora.encoder=true",
        "lora.rank=4",
        "lora.alpha=4",
        "data.sampler=bagcurri",
        "data.bag_schedule={1: 2}",
        "data.bag_neighbours=8",
        "rl.rewards={retrieval: 1.0, cider: 0.5}",
    ],  # fmt: skip
}


def part_of(name: str, kind: str) -> str:
    """Which part a parameter name belongs to: ``lm`` (text side), ``vision``, ``mapper`` or ``frozen_text`` (the
    text tower of the captioner's dual encoder, never trained)."""
    if kind == "clipcap":
        if name.startswith("mapper."):
            return "mapper"
        if name.startswith("lm."):
            return "lm"
    else:
        if name.startswith("model.text_decoder."):
            return "lm"
        if name.startswith("model.vision_model."):
            return "vision"
    if "text_model" in name or "text_projection" in name or "logit_scale" in name:
        return "frozen_text"
    return "vision"


def expected_parts(cfg) -> set[str]:
    parts = {"mapper"} if cfg.model.kind == "clipcap" else set()
    if cfg.model.train_lm:
        parts.add("lm")
    if cfg.model.train_encoder:
        parts.add("vision")
    return parts


@pytest.mark.slow
@pytest.mark.parametrize("objective", list(OBJECTIVES))
@pytest.mark.parametrize("kind", list(BACKBONES))
def test_objective_lowers_its_loss_and_moves_only_what_trains(make_cfg, clip_dir, kind, objective):
    cfg = make_cfg(f"model.encoder={clip_dir}", f"retriever.checkpoint={clip_dir}", "train.lr=1e-2",
                   "train.warmup_steps=0", "train.schedule=constant", "train.batch_size=16",
                   *BACKBONES[kind], *OBJECTIVES[objective])  # fmt: skip
    accelerator = make_accelerator(cfg.train)
    seed_everything(cfg.run.seed)
    model = build_model(cfg)
    obj = get_objective(cfg.train.objective, cfg)
    data = build_data(cfg, model, accelerator, per_caption=train_unit(cfg, obj) == "caption")
    retriever_before = None
    optimizer = build_optimizer(model, cfg.train)
    scheduler = build_scheduler(optimizer, warmup=0, total=100, kind="constant")
    obj.setup(TrainContext(cfg, accelerator, data.train_records, model.tokenizer, run_path(cfg.run)))
    rewards = getattr(getattr(obj, "reward", None), "rewards", {})  # WeightedSum: name -> (weight, reward)
    retriever = next((r.retriever for _, r in rewards.values() if getattr(r, "retriever", None) is not None), None)
    if retriever is not None:
        retriever_before = {k: v.clone() for k, v in retriever.model.state_dict().items()}
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    sampler = get_sampler(cfg, data.train, cfg.train.batch_size)
    engine = Engine(cfg.train, accelerator, model, obj, TrainingData(data.train, data.collator, sampler), optimizer,
                    scheduler, seed=cfg.run.seed, total=100, progress=False)  # fmt: skip
    model = engine.model

    indices = sampler.batches(0)[0]
    fields = sampler.example_fields(0)
    batch = data.collator([data.train[i] for i in indices])
    for name, table in fields.items():  # BagCurri: batch["bag"]
        batch[name] = torch.tensor([table[int(i)] for i in batch["index"]])
    batch["step_info"] = engine.step_info(indices, fields)
    batch = to_device(batch, accelerator.device)
    losses = [engine.train_step([batch])["loss"] for _ in range(6)]
    assert losses[-1] < losses[0], losses

    bare = accelerator.unwrap_model(model)
    after = bare.state_dict()
    changed = {part_of(k, kind) for k in initial if not torch.equal(initial[k], after[k].to(initial[k].device))}
    assert changed == expected_parts(cfg), (changed, lora.has_adapters(bare))
    if cfg.lora.lm or cfg.lora.encoder:  # LoRA runs: base weights never move, only adapters
        moved = [k for k in initial if not torch.equal(initial[k], after[k].to(initial[k].device))]
        assert moved and all("lora_" in k or k.startswith("mapper.") for k in moved), moved
    if retriever_before is not None:  # the frozen retriever of the reward never moves
        for k, v in retriever.model.state_dict().items():
            assert torch.equal(retriever_before[k], v.to(retriever_before[k].device)), k


@pytest.mark.slow
def test_blip_run_checkpoint_loads_back_and_resumes(make_cfg, clip_dir):
    """The training loop writes a world BLIP in BLIP's own format (BlipForConditionalGeneration.from_pretrained
    loads its folder), ``load_captioner`` restores it, and ``--resume`` continues the run from it."""
    from transformers import BlipForConditionalGeneration

    from finecap.models.backbones import load_captioner
    from finecap.models.blip import Blip
    from finecap.runs import checkpoint_dir, model_dir
    from finecap.train.run import train

    cfg = make_cfg(f"model.encoder={clip_dir}", *BACKBONES["blip"], "train.max_steps=2", "train.eval_every=2")
    run_dir = train(cfg)
    folder = model_dir(checkpoint_dir(run_dir, "last"))
    assert isinstance(BlipForConditionalGeneration.from_pretrained(folder), BlipForConditionalGeneration)
    model = load_captioner(folder)
    assert isinstance(model, Blip) and model.world is not None
    more = make_cfg(f"model.encoder={clip_dir}", *BACKBONES["blip"], "train.max_steps=3", "train.eval_every=3")
    train(more, resume=True)
    info = (checkpoint_dir(run_dir, "last") / "trainer_state.json").read_text()
    assert '"step": 3' in info
