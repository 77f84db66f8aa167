"""TRL 1.16's own GRPO code, reached for tests that compare finecap with it (``tests/objectives/test_policy_trl.py``,
``test_engine_mismatch.py``): real ``GRPOTrainer`` objects over a tiny GPT-2 saved like a Hub checkpoint
(:func:`save_tiny_lm`, :func:`make_trainer`), the advantages its ``_generate_and_score_completions`` computes from
chosen reward values (:func:`trls_own_advantages`), and the importance weights and ``sampling/*`` metrics it computes
for vLLM rollouts of chosen completions and engine log-probs (:func:`vllm_trainer`, :func:`trls_own_vllm_correction`:
``use_vllm`` set on the trainer, the rollout handed in through TRL's ``rollout_func``, so no vLLM runs).

TRL is imported inside the functions: the test modules skip without it (``pytest.importorskip("trl")``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

COMPLETION = 6  # max_completion_length of every trainer here (token positions)
PROMPT_IDS = [5, 44, 19]  # a prompt of 3 tokens of the tiny LM's vocabulary


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


def trainer_logprobs(trainer, completions: list[list[int]]) -> torch.Tensor:
    """TRL's own per-token log-probs (``_get_per_token_logps_and_entropies``) of ``completions`` after
    :data:`PROMPT_IDS`, ``(N, COMPLETION)``, whatever follows a completion's last token included (0 there is
    not promised: mask it)."""
    ids = torch.zeros(len(completions), COMPLETION, dtype=torch.long)
    mask = torch.zeros(len(completions), COMPLETION, dtype=torch.long)
    for i, c in enumerate(completions):
        ids[i, : len(c)], mask[i, : len(c)] = torch.tensor(c), 1
    prompt = torch.tensor([PROMPT_IDS] * len(completions))
    with torch.no_grad():
        return trainer._get_per_token_logps_and_entropies(trainer.model, torch.cat([prompt, ids], 1),
                                                          torch.cat([torch.ones_like(prompt), mask], 1), COMPLETION,
                                                          batch_size=len(completions))[0]  # fmt: skip


def vllm_trainer(tiny_lm, tmp_path, cap: float):
    """A ``GRPOTrainer`` that takes its rollouts as vLLM's (``use_vllm``, ``vllm_importance_sampling_correction``,
    mode ``token_truncate`` with ``vllm_importance_sampling_clip_max=cap`` and no lower cap: finecap's correction),
    without starting vLLM: :func:`trls_own_vllm_correction` hands it the rollout."""
    path, tok = tiny_lm
    trainer = make_trainer(path, tok, tmp_path, vllm_importance_sampling_mode="token_truncate",
                           vllm_importance_sampling_clip_max=cap)  # fmt: skip
    trainer.use_vllm = True  # what _generate and _generate_and_score_completions read (use_vllm=True starts vLLM)
    trainer.vllm_importance_sampling_correction = True
    trainer._last_loaded_step = trainer.state.global_step  # the "engine" has this step's weights: no sync
    return trainer


def trls_own_vllm_correction(
    trainer, completions: list[list[int]], sampling: list[list[float | None]], env_mask: list[list[int]] | None = None
) -> tuple[dict[str, Any], dict[str, float]]:
    """What TRL 1.16's ``_generate_and_score_completions`` computes for the vLLM rollout ``completions`` (token ids,
    each after :data:`PROMPT_IDS`) whose engine log-probs are ``sampling`` (``None``: a token vLLM could not score),
    handed in through TRL's ``rollout_func`` (``env_mask``: its mask of the tokens that count, 1 on every token by
    default): its output (``old_per_token_logps``, ``importance_sampling_ratio``, ``completion_mask``, ...) and
    its logged ``sampling/*`` metrics (``trainer`` from :func:`vllm_trainer`)."""

    def rollout(prompts, _trainer):
        out = {"prompt_ids": [list(PROMPT_IDS)] * len(prompts), "completion_ids": completions, "logprobs": sampling}
        return out if env_mask is None else {**out, "env_mask": env_mask}

    trainer.rollout_func = rollout
    output = trainer._generate_and_score_completions([{"prompt": "a red circle"}] * len(completions))
    logged = trainer._metrics["eval"]
    metrics = {name: values[-1] for name, values in logged.items() if name.startswith("sampling/")}
    return output, metrics
