"""Every objective on every tiny VLM family (``model.kind=vlm``): a few optimizer steps of the training engine's own
step on one fixed batch of world images lower the objective's loss, and exactly the parts that should learn change
(the language model and its head, the vision tower, the projector; only LoRA adapters and the projector for SR-L /
SR-V / SR-LV), while the retriever scoring self-retrieval never moves.

As in ``tests/train/test_backbones.py`` (ClipCap and BLIP), the batch and the step number that seeds sampling stay
fixed, so REINFORCE-style losses are compared on the same sampled captions while the policy moves little.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from finecap.config import WorldConfig, load
from finecap.contract import TrainContext
from finecap.data.datasets import CaptionDataset, load_records, model_collator, to_device
from finecap.data.features import model_features
from finecap.data.samplers import get_sampler
from finecap.home import run_path
from finecap.models import lora
from finecap.models.backbones import build_model
from finecap.models.presets import VLM_FAMILIES, save_tiny_clip, save_tiny_vlm
from finecap.models.vlm import Vlm
from finecap.objectives import get_objective
from finecap.objectives.entropy import mean_entropy
from finecap.objectives.reinforce import policy_gradient_loss, sequence_logprob
from finecap.train.engine import Engine, TrainingData, build_optimizer, make_accelerator
from finecap.train.schedule import build_scheduler
from finecap.utils.rng import seed_everything

RL = ["rl.samples=2", "rl.strategy=sample", "decode.max_length=6", "train.lr=1e-3"]
SR = [*RL, "train.objective=reinforce", "rl.rewards={retrieval: 1.0}", "rl.baseline=leave_one_out"]
OBJECTIVES = {
    "mle": ["train.objective=mle"],
    "smile_sequence": ["train.objective=smile", "smile.subset=sequence", "smile.first_token=mle"],
    "smile_reverse_shift": ["train.objective=smile", "smile.subset=reverse", "smile.first_token=shift",
                            "smile.shift_token_id=5"],
    "smile_random_none": ["train.objective=smile", "smile.subset=random", "smile.first_token=none",
                          "smile.mle_weight=0.2"],
    "smile_full": ["train.objective=smile", "smile.subset=full"],
    "reinforce_cider_greedy": [*RL, "train.objective=reinforce", "rl.rewards={cider: 1.0}", "rl.baseline=greedy"],
    "reinforce_cider_mean": [*RL, "train.objective=reinforce", "rl.rewards={cider: 1.0}", "rl.baseline=mean"],
    "reinforce_cider_none": [*RL, "train.objective=reinforce", "rl.rewards={cider: 1.0}", "rl.baseline=none"],
    "reinforce_retrieval_loo": SR,
    "sle": [*RL, "train.objective=sle", "rl.rewards={cider: 1.0}", "rl.baseline=leave_one_out"],
    "scst_me": [*RL, "train.objective=scst_me", "rl.rewards={cider: 1.0}", "rl.entropy_coef=0.05",
                "rl.baseline=leave_one_out"],
    "sr_l": [*SR, "lora.lm=true", "lora.rank=4", "lora.alpha=4"],
    "sr_v": [*SR, "model.train_lm=false", "model.train_encoder=true", "lora.encoder=true", "lora.rank=4",
             "lora.alpha=4"],
    "sr_lv_bagcurri": [*SR, "model.train_encoder=true", "lora.lm=true", "lora.encoder=true", "lora.rank=4",
                       "lora.alpha=4", "data.sampler=bagcurri", "data.bag_schedule={1: 2}", "data.bag_neighbours=8",
                       "rl.rewards={retrieval: 1.0, cider: 0.5}"],
}  # fmt: skip


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """A tiny world (32 px scenes), a tiny CLIP (the retriever) and the three tiny VLMs, saved once."""
    from finecap.world.make import make_world

    root = tmp_path_factory.mktemp("vlm_objectives")
    make_world(WorldConfig(n_train=24, n_val=4, n_test=4, image_size=32, seed=0), out=root / "world", progress=False)
    out = {"world": root / "world", "clip": save_tiny_clip(root / "clip", image_size=16, patch_size=8)}
    out.update({f: save_tiny_vlm(root / f, f, std=0.2) for f in VLM_FAMILIES})
    return out


def parts(model: Vlm) -> dict[str, str]:
    """Parameter name -> ``lm`` (language model and head), ``vision`` (vision tower) or ``projector``."""

    def names(module: torch.nn.Module) -> set[int]:
        return {id(p) for p in module.parameters()}

    projector = names(_projector(model))
    lm = names(model.lora_module("lm")) | {id(model.model.get_output_embeddings().weight)}
    vision = names(model.lora_module("encoder"))  # the world VLM: its dual encoder (image side and text tower)
    out = {}
    for n, p in model.named_parameters():
        out[n] = "projector" if id(p) in projector else "lm" if id(p) in lm else "vision" if id(p) in vision else "?"
    return out


def _projector(model: Vlm) -> torch.nn.Module:
    module = model.model
    for name in model.family.projector.split("."):
        module = getattr(module, name)
    return module


def vlm_overrides(saved: dict[str, Path], family: str) -> list[str]:
    """``vlm.name`` of a saved tiny family, or the world VLM over the tiny CLIP's image tokens (``world``)."""
    if family == "world":
        return ["vlm.name=world-tiny", f"model.encoder={saved['clip']}", "vlm.tiny_layers=1",
                "vlm.tiny_hidden=32", "vlm.tiny_heads=2"]  # fmt: skip
    return [f"vlm.name={saved[family]}"]


@pytest.mark.slow
@pytest.mark.parametrize("objective", list(OBJECTIVES))
@pytest.mark.parametrize("family", [*VLM_FAMILIES, "world"])
def test_objective_lowers_its_loss_and_moves_only_what_trains(saved, tmp_path, family, objective):
    cfg = load(None, [f"world.out={saved['world']}", "model.kind=vlm", *vlm_overrides(saved, family),
                      f"retriever.checkpoint={saved['clip']}", f"run.dir={tmp_path / 'run'}",
                      f"run.cache_dir={tmp_path / 'cache'}", "train.lr=1e-2", "train.warmup_steps=0",
                      "train.schedule=constant", "train.batch_size=8", "data.max_tokens=12",
                      *OBJECTIVES[objective]])  # fmt: skip
    accelerator = make_accelerator(cfg.train)
    seed_everything(cfg.run.seed)
    model = lora.configure_training(build_model(cfg), cfg)
    assert isinstance(model, Vlm) and model.cache_features == (family == "world")
    obj = get_objective(cfg.train.objective, cfg)
    records = load_records(cfg, "train")
    per_caption = obj.example_unit == "caption"
    features = None  # frozen world tokens through the feature cache, as training reads them
    if model.cache_features and not model.train_encoder:
        features = model_features(model, records, cfg, "train", progress=False)
    train = CaptionDataset(records, per_caption=per_caption, features=features)
    collator = model_collator(model, cfg.data.max_tokens)
    optimizer = build_optimizer(model, cfg.train)
    scheduler = build_scheduler(optimizer, warmup=0, total=100, kind="constant")
    obj.setup(TrainContext(cfg, accelerator, records, model.tokenizer, run_path(cfg.run)))
    rewards = obj.reward.rewards if hasattr(obj, "reward") else {}  # WeightedSum: name -> (weight, reward)
    retriever = rewards["retrieval"][1].retriever if "retrieval" in rewards else None
    retriever_before = {k: v.clone() for k, v in retriever.model.state_dict().items()} if retriever else None
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    names = parts(model)
    sampler = get_sampler(cfg, train, cfg.train.batch_size)
    engine = Engine(cfg.train, accelerator, model, obj, TrainingData(train, collator, sampler), optimizer, scheduler,
                    seed=cfg.run.seed, total=100, progress=False)  # fmt: skip

    indices = sampler.batches(0)[0]
    fields = sampler.example_fields(0)
    batch = collator([train[i] for i in indices])
    for name, table in fields.items():  # BagCurri: batch["bag"]
        batch[name] = torch.tensor([table[int(i)] for i in batch["index"]])
    batch["step_info"] = engine.step_info(indices, fields)
    batch = to_device(batch, accelerator.device)
    if hasattr(obj, "rollout"):  # REINFORCE-style: the surrogate of one fixed rollout must fall
        # (the samples of later steps may differ as the policy moves, and greedy / running-mean baselines move with
        # the model or with past rewards, so the logged loss of later steps is not comparable to the first one)
        rollout, _ = obj.rollout(engine.model, batch)
        advantages, _ = obj.advantages(rollout, batch)
        gen = rollout.samples

        def surrogate() -> float:
            with torch.no_grad():
                scores = engine.model(
                    batch,
                    sequences=gen.sequences,
                    mask=gen.mask,
                    image_index=gen.image_index,
                    temperature=obj.logprob_temperature,
                    with_entropy=obj.rl.entropy_coef > 0,
                )
            logp = sequence_logprob(scores.logprobs, gen.lengths, obj.rl.logprob)  # (N,)
            loss = sum(policy_gradient_loss(a, logp) for a in advantages.values())
            if scores.entropy is not None:
                loss = loss - obj.rl.entropy_coef * mean_entropy(scores.entropy, gen.mask)
            return float(loss)

        before = surrogate()
        for _ in range(5):
            engine.train_step([batch])
        assert surrogate() < before
    else:
        losses = [engine.train_step([batch])["loss"] for _ in range(5)]
        assert losses[-1] < losses[0], losses

    after = accelerator.unwrap_model(engine.model).state_dict()
    moved = {k for k in initial if not torch.equal(initial[k], after[k].to(initial[k].device))}
    changed = {names.get(k, "buffer") for k in moved if "lora_" not in k}
    adapted = {names[k] for k in moved if "lora_" in k}
    expected = {"projector"} | ({"lm"} if cfg.model.train_lm else set()) | ({"vision"} if cfg.model.train_encoder
                                                                            else set())  # fmt: skip
    if cfg.lora.lm or cfg.lora.encoder:  # LoRA runs: base weights never move, only adapters and the projector
        assert changed == {"projector"}, changed
        assert adapted == ({"lm"} if cfg.lora.lm else set()) | ({"vision"} if cfg.lora.encoder else set()), adapted
    else:
        assert changed == expected and not adapted, changed
    if retriever_before is not None:  # the frozen retriever of the reward never moves
        for k, v in retriever.model.state_dict().items():
            assert torch.equal(retriever_before[k], v.to(retriever_before[k].device)), k
