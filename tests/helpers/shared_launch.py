"""The one launch of 2 CPU processes that several modules of tests/train share (the ``shared_launch`` fixture of
tests/train/conftest.py): each launch costs the launcher's and both workers' imports of torch, transformers,
accelerate and finecap (~11 CPU-s) before any work, so the runs these modules launched one launch each train one
after another in one launch of tests/train/fsdp_worker.py, made once for every xdist worker. Each module's runs, its
feature cache and anything else it made keep a folder of their own, ``<root>/<module>``; a module's one-process runs
that must come before the launch (a run it resumes) are trained while its runs are built, those that must come after
it (a launched checkpoint resumed in one process) by :func:`after_launch`; and the overrides each module's
in-process runs share with its launched ones are built here."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.equivalence import OBJECTIVES, overrides
from helpers.launch import launch_bounded, two_processes

TIMEOUT = 2100  # seconds for the whole launch (its runs' launches had 300, 300, 480, 300, 180 and 600 s)


def launched_runs(root: Path, world: list[str], clip: Path) -> list[tuple[list[str], bool]]:
    """Every ``(overrides, resume)`` of the shared launch, in the order trained, after each module's preparation (the
    VLM test's tiny LLaVA) in its folder."""
    return [
        *equivalence_runs(root / "equivalence", world, clip), *vlm_tower_runs(root / "vlm_tower", world),
        *validation_runs(root / "validation", world, clip), *grpo_runs(root / "grpo", world, clip),
        *discritune_runs(root / "discritune", world, clip), *fsdp_runs(root / "fsdp", world, clip),
    ]  # fmt: skip


def make_shared_launch(root: Path, world: list[str], clip: Path) -> None:
    """Train :func:`launched_runs` in one launch of 2 processes, its output in ``root/launch.log``, then
    :func:`after_launch`."""
    runs = launched_runs(root, world, clip)
    worker = str(Path(__file__).parents[1] / "train" / "fsdp_worker.py")
    launch_bounded([*two_processes(), worker, json.dumps(runs)], root / "launch.log", TIMEOUT)
    after_launch(root, world, clip)


def after_launch(root: Path, world: list[str], clip: Path) -> None:
    """The one-process runs that continue a launched one: tests/train/test_fsdp.py's :func:`fsdp_after_launch`."""
    fsdp_after_launch(root / "fsdp", world, clip)


# -- tests/train/test_equivalence.py ------------------------------------------------------------------------------


def equivalence_runs(folder: Path, world: list[str], clip: Path) -> list[tuple[list[str], bool]]:
    """One step of each objective over 2 processes x batch 8: ``folder/<objective>-2proc``, cache ``folder/cache``."""
    args = dict(world=world, clip=clip, cache=folder / "cache")
    return [(overrides(name, folder / f"{name}-2proc", batch=8, accum=1, **args), False) for name in OBJECTIVES]


def vlm_tower_run(folder: Path, world: list[str], run_dir: Path, batch: int, accum: int, steps: int) -> list[str]:
    """A tiny LLaVA (``folder/llava``) whose tower trains through LoRA adapters only, ``steps`` steps of ``batch`` x
    ``accum`` into ``run_dir``, cache ``folder/cache``."""
    from helpers.equivalence import LR

    return [
        *world, "model.kind=vlm", f"vlm.name={folder / 'llava'}", "model.train_lm=false",
        "vlm.train_projector=false", "model.train_encoder=true", "lora.encoder=true", "lora.rank=4",
        f"run.cache_dir={folder / 'cache'}", "decode.max_length=6", f"train.max_steps={steps}",
        "train.warmup_steps=0", "train.schedule=constant", f"train.lr={LR}", "train.eval_every=2",
        "train.eval_samples=4", "train.log_captions=0", "train.log_every=1", f"train.batch_size={batch}",
        f"train.grad_accum_steps={accum}", f"run.dir={run_dir}",
    ]  # fmt: skip


def vlm_tower_runs(folder: Path, world: list[str]) -> list[tuple[list[str], bool]]:
    """``folder/two``: 2 processes x batch 4 for 2 steps, resumed in 2 processes for a third; the tiny LLaVA saved
    first."""
    from helpers.vlm import save_llava_reading_a_hidden_layer

    folder.mkdir(parents=True, exist_ok=True)
    save_llava_reading_a_hidden_layer(folder / "llava")
    two = folder / "two"
    return [(vlm_tower_run(folder, world, two, 4, 1, 2), False), (vlm_tower_run(folder, world, two, 4, 1, 3), True)]


# -- tests/train/test_fsdp_validation.py --------------------------------------------------------------------------

VALIDATION_VARIANTS = {
    "features": ["train.validators=[cider]"],  # frozen encoder: the feature cache's fingerprint
    "pixels": ["train.validators=[captions]", "model.train_encoder=true"],  # a nested decoding block
}


def validation_run(run_dir: Path, world: list[str], clip: Path, cache: Path, strategy: str, *extra: str) -> list[str]:
    """3 steps of a tiny ClipCap over 2 processes x batch 8, validated after every step (validation loss, sample
    captions on the main process, and ``extra``'s validators)."""
    return [
        *world, f"model.encoder={clip}", f"retriever.checkpoint={clip}", f"run.cache_dir={cache}",
        "clipcap.tiny_layers=1", "clipcap.tiny_hidden=32", "clipcap.tiny_heads=2", "clipcap.prefix_length=2",
        "clipcap.tiny_dropout=0", "decode.max_length=8", "train.max_steps=3", "train.warmup_steps=0",
        "train.schedule=constant", "train.lr=1e-3", "train.eval_every=1", "train.eval_samples=4",
        "train.log_captions=2", "train.log_every=1", "train.batch_size=8", f"train.strategy={strategy}",
        f"run.dir={run_dir}", *extra,
    ]  # fmt: skip


def validation_runs(folder: Path, world: list[str], clip: Path) -> list[tuple[list[str], bool]]:
    """Each variant sharded and under DDP: ``folder/<strategy>-<variant>``, cache ``folder/cache``."""
    return [(validation_run(folder / f"{s}-{v}", world, clip, folder / "cache", s, *extra), False)
            for v, extra in VALIDATION_VARIANTS.items() for s in ("fsdp", "ddp")]  # fmt: skip


# -- tests/train/test_grpo_multiprocess.py ------------------------------------------------------------------------


def grpo_run(run_dir: Path, world: list[str], clip: Path, cache: Path, batch: int) -> list[str]:
    """One step of the GRPO family (group advantages scaled by the batch, the clipped surrogate, the token mean, KL,
    the entropy bonus) on a tiny ClipCap at batch ``batch``. At a first step the ratio is 1 and the policy is the
    reference, so ``kl``, ``clip_ratio/*`` and ``ratio/*`` are constants; the logged ``entropy`` is the per-token
    metric whose value tells the token mean over both processes' tokens (the processes hold different numbers: 192
    and 180, measured) from the mean of their means: sampled and scored at T = 0.1 (``rl.scaled_logprob``), where the
    random policy's entropies differ between the processes (means 3.07 and 2.91: the mean of the means is 9e-4 off,
    relative); at T = 1 every token's is within 0.01 of log V, and the mean of the means within 1e-6 of the token
    mean."""
    from helpers.equivalence import LR

    return [
        *world, f"model.encoder={clip}", f"run.cache_dir={cache}", "clipcap.tiny_layers=1", "clipcap.tiny_hidden=32",
        "clipcap.tiny_heads=2", "clipcap.prefix_length=2", "clipcap.tiny_dropout=0", "decode.max_length=8",
        "train.max_steps=1", "train.warmup_steps=0", "train.schedule=constant", f"train.lr={LR}", "train.eval_every=1",
        "train.eval_samples=4", "train.log_captions=0", f"train.batch_size={batch}", f"run.dir={run_dir}",
        "train.objective=reinforce", "rl.rewards={cider: 1.0}", "rl.samples=3", "grpo.advantage=group",
        "grpo.scale_rewards=batch", "grpo.policy_loss=clipped", "grpo.loss_aggregation=token", "grpo.kl_coef=0.1",
        "rl.entropy_coef=0.01", "rl.temperature=0.1", "rl.scaled_logprob=true",
    ]  # fmt: skip


def grpo_runs(folder: Path, world: list[str], clip: Path) -> list[tuple[list[str], bool]]:
    """2 processes x batch 8: ``folder/two``, cache ``folder/cache``."""
    return [(grpo_run(folder / "two", world, clip, folder / "cache", 8), False)]


# -- tests/train/test_sr_multiprocess.py --------------------------------------------------------------------------


def discritune_run(run_dir: Path, world: list[str], clip: Path, cache: Path, batch: int) -> list[str]:
    """The demo's DiscriTune recipe (``--recipe=<its file>``, as tests/train/fsdp_worker.py reads it) on a tiny
    ClipCap for 3 steps of ``batch`` images."""
    from finecap.recipes import resolve_recipe

    return [
        f"--recipe={resolve_recipe('demo/discritune')}", *world, f"model.encoder={clip}",
        f"retriever.checkpoint={clip}",
        "clipcap.tiny_layers=1", "clipcap.tiny_hidden=32", "clipcap.tiny_heads=2", "clipcap.prefix_length=2",
        f"run.cache_dir={cache}", "train.init_from=", "train.max_steps=3", "train.log_every=1", "train.eval_every=3",
        "train.lr=1e-3", "decode.max_length=8", "eval.n_distractors=3", "eval.draws=1", f"run.dir={run_dir}",
        f"train.batch_size={batch}",
    ]  # fmt: skip


def discritune_runs(folder: Path, world: list[str], clip: Path) -> list[tuple[list[str], bool]]:
    """2 processes x batch 8: ``folder/two``, cache ``folder/cache``."""
    return [(discritune_run(folder / "two", world, clip, folder / "cache", 8), False)]


# -- tests/train/test_fsdp.py -------------------------------------------------------------------------------------

FSDP = ["train.strategy=fsdp"]


def fsdp_resume_run(folder: Path, world: list[str], clip: Path, name: str, steps: int, *extra: str) -> list[str]:
    """Sharded MLE over 2 micro-batches of 4 per process and clipping (``train.grad_clip=0.05``), ``steps`` steps,
    saved after each, into ``folder/<name>``, cache ``folder/cache``."""
    base = overrides("mle", folder / name, world=world, clip=clip, cache=folder / "cache", batch=4, accum=2)
    return [*base, *FSDP, f"train.max_steps={steps}", "train.grad_clip=0.05", "train.save_every=1", *extra]


def in_one_process(run: list[str]) -> list[str]:
    """A run's overrides for 1 process x batch 8 x 2 accumulation steps: the global batch of 2 processes x 4 x 2."""
    kept = [o for o in run if not o.startswith(("train.batch_size", "train.grad_accum_steps"))]
    return [*kept, "train.batch_size=8", "train.grad_accum_steps=2"]


def fsdp_runs(folder: Path, world: list[str], clip: Path) -> list[tuple[list[str], bool]]:
    """One sharded step of each objective over 2 processes x 8 (``folder/<objective>-fsdp``) and the resume test's
    runs: ``whole``; ``cut`` stopped after step 1 and resumed; ``ckpt`` with gradient checkpointing; ``cut1``'s step
    1 (its step 2 resumed in one process by :func:`fsdp_after_launch`); ``one``'s step 2, resumed sharded from its
    step 1 in one process, trained here first. Cache ``folder/cache``."""
    from finecap.config import load
    from finecap.train.run import train

    def resume_run(name: str, steps: int, *extra: str) -> list[str]:
        return fsdp_resume_run(folder, world, clip, name, steps, *extra)

    train(load(None, in_one_process(resume_run("one", 1))))
    args = dict(world=world, clip=clip, cache=folder / "cache")
    runs = [([*overrides(n, folder / f"{n}-fsdp", batch=8, accum=1, **args), *FSDP], False) for n in OBJECTIVES]
    return [*runs, (resume_run("whole", 2), False), (resume_run("cut", 1), False), (resume_run("cut", 2), True),
            (resume_run("ckpt", 2, "train.gradient_checkpointing=true"), False), (resume_run("cut1", 1), False),
            (resume_run("one", 2), True)]  # fmt: skip


def fsdp_after_launch(folder: Path, world: list[str], clip: Path) -> None:
    """The sharded checkpoint of ``cut1``'s step 1 resumed in one process for its step 2 (1 x 8 x 2: the same global
    batch)."""
    from finecap.config import load
    from finecap.train.run import train

    train(load(None, in_one_process(fsdp_resume_run(folder, world, clip, "cut1", 2))), resume=True)
