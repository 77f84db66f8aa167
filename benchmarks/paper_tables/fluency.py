"""The world's fluency language model (SMILE's PPL column): the world-tiny GPT-2 trained on the human training
captions through the library's engine (:class:`finecap.train.engine.Engine`), as the world encoder is
(:mod:`finecap.train.world_encoder`): a data set of captions, a collator, a next-token objective, AdamW at a
constant learning rate of 1e-3 without clipping, random batches of 64 captions (a fresh permutation each epoch)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from finecap.objectives.base import ObjectiveOutput
    from finecap.stages import StageRunner

FLUENCY_STEPS = 1500
"""Steps of 64 captions for the fluency LM in a full run (about two epochs of the default world's 50,000)."""
BATCH = 64
LR = 1e-3
IGNORE = -100
"""Label of positions not predicted (padding, the start token): the ``labels`` convention of ``transformers``."""


@dataclass
class Captions:
    """The training examples: caption ``index`` of the training split (the engine's data set)."""

    captions: list[str]
    image_ids: list[Any]

    def __len__(self) -> int:
        return len(self.captions)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"index": index}

    def image_id(self, index: int) -> Any:
        return self.image_ids[index]


@dataclass
class CaptionCollator:
    """Token ids of a batch's captions between the start and end tokens, padded, with their next-token labels."""

    captions: list[str]
    tokenizer: Any

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        tok = self.tokenizer
        rows = [[tok.bos_token_id, *tok(self.captions[it["index"]], add_special_tokens=False)["input_ids"],
                 tok.eos_token_id] for it in items]  # fmt: skip
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), tok.pad_token_id)  # (B, T)
        labels = torch.full((len(rows), width), IGNORE)  # (B, T): padding not predicted
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
            labels[i, 1 : len(r)] = torch.tensor(r[1:])  # the start token is context, not predicted
        index = torch.tensor([it["index"] for it in items])  # (B,)
        return {"index": index, "input_ids": ids, "attention_mask": (ids != tok.pad_token_id).long(), "labels": labels}


def next_token_loss(model: torch.nn.Module, batch: dict[str, Any]) -> ObjectiveOutput:
    """The language model's mean cross-entropy over the predicted tokens (``transformers`` shifts the labels), a mean
    over ``num_items`` tokens so the engine weighs micro-batches by their tokens."""
    from finecap.objectives.base import ObjectiveOutput

    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
    tokens = int((batch["labels"][:, 1:] != IGNORE).sum())  # the labels transformers scores after its shift
    return ObjectiveOutput(losses={"lm": out.loss}, num_items=tokens)


def train_fluency_lm(grid: StageRunner) -> Path:
    """The fluency LM of ``grid``'s seed in ``<seed folder>/fluency_lm`` (trained once: its ``DONE`` marker), saved
    with ``save_pretrained`` for :class:`finecap.metrics.perplexity.Perplexity`; ``train.max_steps`` steps when set
    (the quick grid's), else :data:`FLUENCY_STEPS`."""
    import torch

    from finecap.config import TrainConfig
    from finecap.data.datasets import load_records
    from finecap.data.samplers import RandomBatches
    from finecap.models.presets import build_world_lm
    from finecap.objectives.base import FunctionObjective
    from finecap.train.engine import Engine, TrainingData, make_accelerator
    from finecap.train.schedule import build_scheduler
    from finecap.utils.files import atomic_write_text
    from finecap.utils.rng import seed_everything

    out = grid.run_dir / "fluency_lm"
    if (out / "DONE").exists():
        return out
    cfg = grid.cfg
    seed_everything(cfg.run.seed)
    model, tokenizer = build_world_lm(layers=cfg.clipcap.tiny_layers, hidden=cfg.clipcap.tiny_hidden,
                                      heads=cfg.clipcap.tiny_heads)  # fmt: skip
    records = load_records(cfg, "train")
    captions = [c for r in records for c in r.captions]
    image_ids = [r.image_id for r in records for _ in r.captions]
    steps = cfg.train.max_steps if grid.quick or cfg.train.max_steps else FLUENCY_STEPS
    batch = min(BATCH, len(captions))
    settings = TrainConfig(max_steps=steps, batch_size=batch, lr=LR, weight_decay=0.01, warmup_steps=0,
                           schedule="constant", grad_clip=0.0, log_every=steps, log_with=[],
                           eval_samples=0)  # fmt: skip
    accelerator = make_accelerator(settings)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=settings.weight_decay)
    scheduler = build_scheduler(optimizer, warmup=0, total=steps, kind="constant")
    data = TrainingData(Captions(captions, image_ids), CaptionCollator(captions, tokenizer),
                        RandomBatches(len(captions), batch, seed=cfg.run.seed))  # fmt: skip
    print(f"== train fluency_lm: world-tiny GPT-2 on {len(captions)} human captions, {steps} steps", flush=True)
    engine = Engine(settings, accelerator, model, FunctionObjective(next_token_loss), data, optimizer, scheduler,
                    seed=cfg.run.seed, total=steps, progress=False, desc="fluency LM")  # fmt: skip
    engine.fit()
    model.eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    atomic_write_text(out / "DONE", "ok\n")
    return out
