"""The ``train`` section: the objective, the optimiser, the schedule, checkpoints, validation and logging."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from finecap.config.fields import Section, check, doc
from finecap.config.sections.limits import (
    MAX_BATCH,
)
from finecap.registry import OBJECTIVES
from finecap.utils.text import did_you_mean, short_repr

if TYPE_CHECKING:
    from finecap.config.sections import Config

Schedule = Literal["linear", "cosine", "constant"]


TRACKERS = ("jsonl", "tensorboard", "wandb", "mlflow", "comet_ml", "aim", "clearml", "dvclive", "swanlab", "trackio")
"""Values of ``train.log_with``: finecap's ``jsonl`` (metrics.jsonl) and accelerate's trackers (``LoggerType``)."""


def objective_without(cfg: Config, readers: tuple[str, ...]) -> str | None:
    """``"train.objective=<name>"`` when the objective of ``cfg`` is a registered one outside ``readers`` (so an
    option only they read is never read: :meth:`~finecap.config.fields.Section.unread_options`), else ``None`` (an
    objective of one's own, named by dotted path, may read any section)."""
    objective = cfg.train.objective
    return f"train.objective={objective}" if objective in OBJECTIVES and objective not in readers else None


@dataclass
class TrainConfig(Section, name="train"):
    objective: str = doc("mle", "Objective name (see finecap.objectives) or a dotted import path 'pkg.mod:factory'.")
    init_from: str = doc(
        "",
        "Checkpoint directory, or run directory (its best checkpoint, else its last), to start from (empty = fresh "
        "model); a relative path is read from the working directory, else from <run.root> (demo/mle/checkpoints/best: "
        "the run of recipe demo/mle).",
    )
    epochs: float = doc(
        10.0,
        "Training epochs (fractional allowed); ignored when train.max_steps > 0.",
        ge=0,
        le=100_000,
        why="the papers train 1 to 20 epochs",
    )
    max_steps: int = doc(
        0,
        "Stop after this many optimizer steps (0 = use train.epochs).",
        ge=0,
        le=100_000_000,
        why="LLM pre-training takes ~1,000,000 steps",
    )
    batch_size: int = doc(
        64,
        "Examples per micro-batch per process; effective batch = batch_size x processes x train.grad_accum_steps.",
        ge=1,
        le=MAX_BATCH,
        why="examples per micro-batch per process; twice CLIP's contrastive batch of 32,768",
    )
    grad_accum_steps: int = doc(
        1,
        "Micro-batches accumulated per optimizer step (accelerate's accumulate).",
        ge=1,
        le=4096,
        why="micro-batches per optimizer step",
    )
    lr: float = doc(2e-3, "Peak learning rate (AdamW).", gt=0)
    weight_decay: float = doc(0.01, "AdamW weight decay.")
    warmup_steps: int = doc(100, "Linear warmup steps.", ge=0)
    schedule: Schedule = doc("linear", "Learning-rate schedule after warmup.")
    grad_clip: float = doc(1.0, "Max gradient norm (0 = no clipping).", ge=0)
    gradient_checkpointing: bool = doc(
        False, "Recompute the activations of the trained parts' layers in backward (non-reentrant; off in decoding)."
    )
    eval_every: int = doc(0, "Evaluate on the validation split every N steps (0 = once per epoch).", ge=0)
    eval_samples: int = doc(500, "Validation images used per evaluation (0 = all).", ge=0)
    best_metric: str = doc(
        "loss", "Validation metric picking the best checkpoint ('loss' and 'perplexity' minimised, others maximised)."
    )
    log_every: int = doc(20, "Log training metrics every N steps.", ge=1)
    save_every: int = doc(0, "Save a resumable checkpoint every N steps (0 = at each evaluation).", ge=0)
    best_mode: Literal["auto", "min", "max"] = doc(
        "auto", "Minimise/maximise best_metric (auto: min for 'loss' and 'perplexity')."
    )
    loss_weights: dict[str, float] = doc({}, "Weight of each named loss of the objective (absent = 1.0).")
    validators: list[str] = doc(
        [], "Validators run at each evaluation (finecap.registry.VALIDATORS names or 'pkg.mod:factory')."
    )
    cpu: bool = doc(False, "Train on the CPU even when an accelerator (GPU) is available.")
    strategy: Literal["ddp", "fsdp"] = doc(
        "ddp",
        "How several processes share a run: ddp (every process holds the whole model) or fsdp (torch FSDP2: "
        "parameters, gradients and optimizer state sharded; docs/training.md).",
    )
    mixed_precision: Literal["no", "fp16", "bf16"] = doc(
        "no",
        "Autocast of training, evaluation and finecap caption (accelerate's): bf16, or fp16 with a gradient scaler "
        "(GPU only; on the CPU fp16 runs in float32).",
    )
    max_skipped_steps: int = doc(
        25,
        "fp16: consecutive optimizer steps the gradient scaler may skip (overflow) before the run counts as diverged.",
        ge=0,
    )
    tf32: bool = doc(False, "Allow TF32 in float32 matmuls and cuDNN convolutions on CUDA (no-op on the CPU).")
    log_with: list[str] = doc(
        ["jsonl"], "Experiment trackers (accelerate log_with): jsonl (metrics.jsonl), tensorboard, wandb, mlflow, ..."
    )
    log_captions: int = doc(
        4,
        "Validation images whose greedy captions are logged as text at each evaluation.",
        ge=0,
        le=1024,
        why="decoded in one batch at each evaluation",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.epochs > 0 or self.max_steps > 0, "train.epochs/train.max_steps", "one of them must be > 0")
        for tracker in self.log_with:
            check(
                tracker in TRACKERS,
                "train.log_with",
                f"unknown tracker {short_repr(tracker)}{did_you_mean(str(tracker), TRACKERS)}; valid: "
                f"{', '.join(TRACKERS)}",
            )

    def check_config(self, cfg: Config) -> None:
        trained = cfg.model.dtype if cfg.model.trainable_dtype == "same" else cfg.model.trainable_dtype
        check(
            self.mixed_precision != "fp16" or trained != "float16",
            "train.mixed_precision",
            "fp16 scales the gradients with a GradScaler, which refuses float16 trained weights (model.trainable_dtype"
            f"={cfg.model.trainable_dtype}" + (f" with model.dtype={cfg.model.dtype}" if trained is cfg.model.dtype
                                                 else "") + "): keep model.trainable_dtype=float32 (master weights) "
            "or train with bf16",
        )  # fmt: skip
        quantization = cfg.model.quantization
        check(
            self.strategy != "fsdp" or quantization == "none",
            "train.strategy",
            f"fsdp cannot shard a model.quantization={quantization} base (bitsandbytes' packed uint8 weights, which "
            "FSDP2 would shard as plain bytes): use train.strategy=ddp (a quantized base is small enough to keep "
            "whole on every GPU) or model.quantization=none",
        )
