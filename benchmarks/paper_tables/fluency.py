"""The world's fluency language model (SMILE's PPL column)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from finecap.stages import StageRunner


def train_fluency_lm(grid: StageRunner) -> Path:
    """The world's fluency language model (SMILE's PPL column): the world-tiny GPT-2 trained on the human training
    captions, saved with ``save_pretrained`` for :class:`finecap.metrics.perplexity.Perplexity`.

    A short plain loop rather than finecap's engine, which trains image-conditioned captioners, not text-only LMs.
    """
    import torch

    from finecap.data.datasets import load_records
    from finecap.models.presets import build_world_lm
    from finecap.utils import seed_everything

    out = grid.run_dir / "fluency_lm"
    if (out / "DONE").exists():
        return out
    cfg = grid.cfg
    seed_everything(cfg.run.seed)
    model, tokenizer = build_world_lm(layers=cfg.clipcap.tiny_layers, hidden=cfg.clipcap.tiny_hidden,
                                      heads=cfg.clipcap.tiny_heads)  # fmt: skip
    captions = [c for r in load_records(cfg, "train") for c in r.captions]
    steps = cfg.train.max_steps if grid.quick or cfg.train.max_steps else FLUENCY_STEPS
    batch = min(64, len(captions))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(cfg.run.seed)
    model.train()
    print(f"== train fluency_lm: world-tiny GPT-2 on {len(captions)} human captions, {steps} steps", flush=True)
    for _ in range(steps):
        picks = torch.randint(len(captions), (batch,), generator=generator).tolist()
        rows = [[tokenizer.bos_token_id, *tokenizer(captions[i], add_special_tokens=False)["input_ids"],
                 tokenizer.eos_token_id] for i in picks]  # fmt: skip
        width = max(len(r) for r in rows)
        ids = torch.full((batch, width), tokenizer.pad_token_id)  # (B, T)
        labels = torch.full((batch, width), -100)  # (B, T): padding not predicted
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
            labels[i, 1 : len(r)] = torch.tensor(r[1:])  # the start token is context, not predicted
        loss = model(input_ids=ids, attention_mask=(ids != tokenizer.pad_token_id).long(), labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "DONE").write_text("ok\n")
    return out


FLUENCY_STEPS = 1500
"""Steps of 64 captions for the fluency LM in a full run (about two epochs of the default world's 50,000)."""
