"""The proof that distribution is right (tests/train/test_equivalence.py, tests/train/test_fsdp.py): the objectives
compared, the overrides of one optimizer step of a tiny ClipCap, and the comparison of two runs' weights within
bounds justified in tests/train/test_equivalence.py's docstring."""

from __future__ import annotations

from pathlib import Path

import torch

from finecap.models.clipcap import ClipCap
from finecap.runs import checkpoint_dir, model_dir

LR = 1e-3
OBJECTIVES = {
    "mle": [],
    "smile": ["train.objective=smile"],
    "smile_random": ["train.objective=smile", "smile.subset=random", "smile.random_k=20", "smile.first_token=none"],
    "scst": ["train.objective=reinforce", "rl.rewards={cider: 1.0}", "rl.baseline=greedy", "rl.samples=3"],
    "sr": ["train.objective=reinforce", "rl.rewards={retrieval: 1.0}", "rl.baseline=mean", "rl.samples=1",
           "rl.strategy=greedy", "sr.distractors=batch"],
}  # fmt: skip


def overrides(
    name: str, run_dir: Path, world: list[str], clip: Path, cache: Path, batch: int, accum: int
) -> list[str]:
    """The overrides of one optimizer step of objective ``name`` at batch ``batch`` x ``accum`` accumulation steps,
    dropout off, into ``run_dir``."""
    return [
        *world, f"model.encoder={clip}", f"retriever.checkpoint={clip}", f"run.cache_dir={cache}",
        "clipcap.tiny_layers=1", "clipcap.tiny_hidden=32", "clipcap.tiny_heads=2", "clipcap.prefix_length=2",
        "clipcap.tiny_dropout=0", "decode.max_length=8", "train.max_steps=1", "train.warmup_steps=0",
        "train.schedule=constant", f"train.lr={LR}", "train.eval_every=1", "train.eval_samples=4",
        "train.log_captions=0", f"train.batch_size={batch}", f"train.grad_accum_steps={accum}",
        f"run.dir={run_dir}", *OBJECTIVES[name],
    ]  # fmt: skip


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The trained ClipCap of the run's last checkpoint (its frozen encoder not loaded): its state dict."""
    return ClipCap.from_checkpoint(model_dir(checkpoint_dir(run_dir, "last")), load_encoder=False).state_dict()


def compare(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], what: str) -> None:
    """Assert that two runs' weights agree: at most 0.1% of the elements differ by more than 1e-6, none by more than
    5% of the learning rate."""
    assert a.keys() == b.keys()
    diffs = torch.cat([(a[k].float() - b[k].float()).abs().flatten() for k in a])
    moved = torch.cat([a[k].float().flatten() for k in a])
    print(f"{what}: max |difference| {diffs.max().item():.3g} over {diffs.numel()} parameters")
    assert torch.isfinite(moved).all()
    assert (diffs > 1e-6).float().mean().item() <= 1e-3, what  # float32 rounding of the parameters themselves
    assert diffs.max().item() <= 0.05 * LR, what  # a few elements with gradients near Adam's eps
