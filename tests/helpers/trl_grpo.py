"""TRL 1.16's own GRPO code, reached for tests that compare finecap with it (``tests/objectives/test_policy_trl.py``):
real ``GRPOTrainer`` objects over a tiny GPT-2 saved like a Hub checkpoint (:func:`save_tiny_lm`, :func:`make_trainer`)
and the advantages its ``_generate_and_score_completions`` computes from chosen reward values
(:func:`trls_own_advantages`).

TRL is imported inside the functions: the test modules skip without it (``pytest.importorskip("trl")``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

COMPLETION = 6  # max_completion_length of every trainer here (token positions)


def save_tiny_lm(folder: Path) -> tuple[Path, Any]:
    """A one-layer GPT-2 of the world's tokenizer without dropout, saved into ``folder``; ``(folder, tokenizer)``."""
    from finecap.models.presets import build_world_lm

    torch.manual_seed(0)
    lm, tok = build_world_lm(layers=1, hidden=32, heads=2, dropout=0.0)
    lm.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, tok


def make_trainer(path, tok, tmp_path, rows=None, reward_funcs=None, num_generations=3, **config):
    """A real ``GRPOTrainer`` over ``rows`` (six prompts by default), ``reward_funcs`` (one paying 0 by default)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    rows = rows or [{"prompt": "a red circle"}] * 6
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=len(rows),
                      num_generations=num_generations, max_completion_length=COMPLETION, report_to="none",
                      use_cpu=True, save_strategy="no", seed=0, bf16=False, **config)  # fmt: skip
    funcs = reward_funcs or [lambda prompts, completions, **kw: [0.0] * len(completions)]
    trainer = GRPOTrainer(model=str(path), processing_class=tok, args=args, train_dataset=Dataset.from_list(rows),
                          reward_funcs=funcs)  # fmt: skip
    trainer.model.eval()  # no dropout; _compute_loss's normalisers are then 1 (TRL's eval mode)
    return trainer


def trls_own_advantages(tiny_lm, tmp_path, parts, weights, num_generations, **config):
    """The advantages TRL 1.16 computes itself: ``GRPOTrainer._generate_and_score_completions`` (it generates
    completions with the tiny LM, scores them and returns ``advantages``) over one prompt per row of ``parts``
    (N, K), whose K reward functions pay those values column by column, ``None`` where NaN (TRL's unscorable),
    weighed by ``weights`` (K,)."""
    path, tok = tiny_lm

    def column(k):
        def reward(prompts, completions, paid, **kw):
            return [None if p[k] != p[k] else p[k] for p in paid]

        reward.__name__ = f"r{k}"
        return reward

    rows = [{"prompt": "a red circle", "paid": p} for p in parts.tolist()]
    trainer = make_trainer(path, tok, tmp_path, rows, [column(k) for k in range(parts.shape[1])], num_generations,
                           reward_weights=weights.tolist(), **config)  # fmt: skip
    return trainer._generate_and_score_completions(rows)["advantages"]
