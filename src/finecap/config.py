"""Typed configuration: one dataclass per section, loaded from YAML with dotlist overrides.

Every field has a default and a one-line doc (``doc(...)``). ``load("recipe.yaml", ["train.lr=1e-4"])`` returns a
:class:`Config`; unknown sections or keys, values of the wrong type and values outside a ``Literal`` raise
:class:`ConfigError` naming the key (and the file) and listing the valid choices. Cross-field checks live in each
section's ``__post_init__`` and name the override key to change.

Example::

    >>> cfg = load(None, ["world.n_train=200", "train.objective=mle"])
    >>> cfg.world.n_train
    200
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from finecap.recipes import resolve_recipe
from finecap.registry import (
    METRIC_GROUPS,
    OBJECTIVES,
    REWARDS,
    SAMPLERS,
    VALIDATOR_KEYS,
    is_dotted_path,
)
from finecap.utils import SHORT_REPR_LIMIT, YAMLRefused, load_yaml, short_repr


class ConfigError(ValueError):
    """A configuration value is unknown, of the wrong type or invalid; the message names the key (``key``, when one
    is at fault: ``"train.lr"``, or ``"a/b"`` for a check across two keys)."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


def did_you_mean(name: object, valid: typing.Iterable[object], prefix: str = "") -> str:
    """`` (did you mean 'x'?)`` for the closest of ``valid`` to a mistyped ``name`` (:func:`difflib.get_close_matches`,
    as argparse and git suggest), or ``""`` when nothing is close; ``prefix`` is prepended to the suggestion.

    Example::

        >>> did_you_mean("n_trian", ["n_train", "n_val"])
        " (did you mean 'n_train'?)"

    Only a name of at most :data:`~finecap.utils.SHORT_REPR_LIMIT` characters is compared (a number or a long text is
    no typo of a name, and ``str()`` of a nested value read from a file can be enormous).
    """
    if not isinstance(name, str | int | float) or len(str(name)) > SHORT_REPR_LIMIT:
        return ""
    match = difflib.get_close_matches(str(name), [str(v) for v in valid], n=1, cutoff=0.6)
    return f" (did you mean {prefix + match[0]!r}?)" if match else ""


def doc(default: Any, text: str) -> Any:
    """A dataclass field with a default (copied for mutable values) and a one-line documentation string."""
    if isinstance(default, list | dict):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"doc": text})
    return field(default=default, metadata={"doc": text})


def _check(cond: bool, key: str, message: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {message}", key=key)


def _check_at_most(value: float, key: str, limit: float, why: str) -> None:
    """The upper bound of an option that sizes memory or work (see the bounds below): ``value <= limit``, else a
    :class:`ConfigError` naming ``key`` and saying ``why`` the bound is where it is."""
    _check(value <= limit, key, f"must be <= {limit}, got {short_repr(value, 30)} ({why})")


# Upper bounds of the options that size memory or work. Generous (no real run comes near them) but finite, so that a
# typo (data.max_tokens=1e9 would allocate 512 GB) or a tampered stored config.yaml (decode.beam_size: 100000) is
# refused when the configuration is read, naming the key, instead of exhausting memory or running for ever.
MAX_TOKENS = 4096  # tokens of a caption: the longest dense VLM captions (DCI, DOCCI) are ~1,000; GPT-2 reads 1,024
MAX_BATCH = 65_536  # examples of one batch: twice the largest contrastive batch in use (CLIP's 32,768)
MAX_SPLIT = 1_000_000  # scenes of a world split: COCO has 123k images
MAX_PROCESSES = 256  # worker processes or threads started at once: the cores of a large two-socket machine
MAX_BAG = 1024  # images in a bag: TrueMatch and BagCurri use 3 to 7
MAX_TINY_LAYERS, MAX_TINY_HIDDEN = 48, 2048  # world-tiny models: GPT-2 XL (48 layers, 1,600 wide) is not tiny
MAX_DECODE_POSITIONS = 2**26  # token positions of one decoding batch (rows x length): 67M, ~TBs of KV cache


# Allowed values of string options, defined once: the fields below use them and the modules that dispatch on them
# derive their runtime tuples with typing.get_args (e.g. finecap.objectives.smile.SUBSETS).
DataFormat = Literal["world", "karpathy", "coco", "jsonl", "hf", "folder"]
Mapper = Literal["mlp", "transformer"]
Backbone = Literal["clipcap", "blip", "vlm"]
Schedule = Literal["linear", "cosine", "constant"]
DecodeStrategy = Literal["greedy", "beam", "sample"]
MeteorBackend = Literal["python", "java"]
FinishedBeams = Literal["keep", "set_aside"]
EarlyStopping = Literal[False, True, "never"]
Subset = Literal["sequence", "reverse", "random", "full"]
FirstToken = Literal["mle", "shift", "none"]
Baseline = Literal["greedy", "mean", "leave_one_out", "none"]
RLStrategy = Literal["sample", "greedy", "beam"]
LogProb = Literal["sum", "mean"]
Distance = Literal["bleu34"]
DiversityBaseline = Literal["pairwise_mean", "none"]
SRReward = Literal["log_prob", "accuracy", "cosine"]
Distractors = Literal["batch", "bag", "hard"]
CaptionField = Literal["original", "blend", "visual", "holistic", "dense"]
BoostMode = Literal["blend", "visual", "holistic"]
BoostBackend = Literal["openai", "transformers", "world"]
WorldShift = Literal["none", "domain"]
LoraInit = Literal["kaiming", "gaussian", "normal"]
WeightsDtype = Literal["auto", "float32", "bfloat16", "float16"]
TrainableDtype = Literal["float32", "bfloat16", "float16", "same"]
AttnImplementation = Literal["auto", "sdpa", "eager", "flash_attention_2"]
Quantization = Literal["none", "4bit", "8bit"]


# --------------------------------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class RunConfig:
    name: str = doc("run", "Run name; the run directory is <run.root>/<run.name> unless run.dir is set.")
    root: str = doc("", "Folder holding run directories; empty = <finecap home>/runs (never the working directory).")
    dir: str = doc("", "Explicit run directory (overrides root/name when non-empty).")
    seed: int = doc(0, "Global random seed (torch, numpy, python).")
    cache_dir: str = doc(
        "", "Folder of the reusable caches (world encoders, frozen features); empty = <finecap home>/cache."
    )

    @property
    def path(self) -> Path:
        return Path(self.dir) if self.dir else self.root_path / self.name

    @property
    def root_path(self) -> Path:
        """``run.root``, or ``<finecap home>/runs`` when empty (:func:`finecap.home.home`)."""
        from finecap.home import home  # deferred: finecap.home reads this module's types

        return Path(self.root) if self.root else home() / "runs"


@dataclass
class WorldConfig:
    seed: int = doc(0, "Seed of the synthetic world; the same seed gives the same scenes, images and captions.")
    n_train: int = doc(10000, "Number of training scenes.")
    n_val: int = doc(500, "Number of validation scenes.")
    n_test: int = doc(1000, "Number of test scenes.")
    image_size: int = doc(64, "Rendered image side in pixels.")
    min_objects: int = doc(1, "Fewest objects in a scene.")
    max_objects: int = doc(4, "Most objects in a scene.")
    pattern_prob: float = doc(0.3, "Probability that an object carries a pattern (stripes, dots, ...).")
    families: int = doc(0, "Scene-family size: 0 = off; k >= 2 = groups of k scenes differing in one detail.")
    shift: WorldShift = doc("none", "Domain of the world: none = training domain; domain = the shifted test domain.")
    out: str = doc("", "Folder of the world data set; empty = <finecap home>/worlds/<world key> (FINECAP_HOME).")
    overwrite: bool = doc(False, "Replace another finecap world at world.out (only files finecap made); never others.")

    def __post_init__(self) -> None:
        for key in ("n_train", "n_val", "n_test"):
            _check(getattr(self, key) >= 0, f"world.{key}", "must be >= 0")
        _check(16 <= self.image_size <= 1024, "world.image_size", f"must be in [16, 1024], got {self.image_size}")
        _check(
            1 <= self.min_objects <= self.max_objects <= 4,
            "world.min_objects/world.max_objects",
            "need 1 <= min_objects <= max_objects <= 4",
        )
        _check(0.0 <= self.pattern_prob <= 1.0, "world.pattern_prob", "must be in [0, 1]")
        _check(self.families == 0 or self.families >= 2, "world.families", "must be 0 (off) or >= 2")
        for key in ("n_train", "n_val", "n_test"):
            _check_at_most(getattr(self, key), f"world.{key}", MAX_SPLIT, "scenes rendered per split")


@dataclass
class DataConfig:
    format: DataFormat = doc("world", "Data set format of data.path (docs/data.md: one table of every format).")
    path: str = doc(
        "", "Data set file (Karpathy JSON, COCO annotations, JSONL) or image folder; empty = the world at world.out."
    )
    images: str = doc("", "Image root for relative image paths; empty = next to data.path (folder: the folder).")
    allow_outside_paths: bool = doc(False, "Let records name image files outside the image root (real paths).")
    val_fraction: float = doc(
        0.0, "Share of the images that name no split (folder, JSONL lines without 'split') put in val, by id hash."
    )
    test_fraction: float = doc(
        0.0, "Share of the images that name no split put in test, by id hash; the rest (all by default) is train."
    )
    split_seed: int = doc(0, "Seed of the id hash of data.val_fraction / data.test_fraction (not run.seed).")
    skip_bad_images: bool = doc(
        False, "Decode every image once when read; skip and count those that fail (false: the first stops the run)."
    )
    image_column: str = doc("image", "data.format=hf: column of the image (Image feature or path string).")
    caption_column: str = doc("captions", "data.format=hf: column of the reference caption(s) (string or list).")
    split_column: str = doc("", "data.format=hf: column naming each row's split; empty = the named splits.")
    id_column: str = doc("", "data.format=hf: column of the image id; empty = the image path (or split/row).")
    max_tokens: int = doc(48, "Captions are cut to this many tokens (EOS included); dense world captions reach 41.")
    num_workers: int = doc(0, "DataLoader worker processes decoding and preprocessing images (docs/data.md).")
    persistent_workers: bool = doc(True, "Keep the training DataLoader's workers between epochs (num_workers > 0).")
    pin_memory: bool = doc(True, "Page-locked batches for faster copies to a CUDA device (ignored without one).")
    jpeg_draft: bool = doc(
        True, "Decode JPEGs at 1/2-1/8 scale when still >= the image processor's size (docs/data.md: what changes)."
    )
    sampler: str = doc("random", "Training batch sampler (finecap.data.samplers.SAMPLERS) or 'pkg.module:factory'.")
    train_unit: Literal["auto", "caption", "image"] = doc(
        "auto", "Training examples: one per reference caption or per image (auto: the objective's; MLE: caption)."
    )
    bag_schedule: dict[int, int] = doc(
        {}, "data.sampler=bagcurri: {end_epoch: bag_size} (0 = random batches), e.g. {1: 0, 2: 3, 3: 5, 4: 7}."
    )
    bag_neighbours: int = doc(200, "data.sampler=bagcurri: nearest neighbours per image searched for bag-mates.")
    captions: CaptionField = doc(
        "original", "Caption field trained on: original, a `finecap boost` field (blend/visual/holistic), world dense."
    )

    def __post_init__(self) -> None:
        _check(self.max_tokens >= 1, "data.max_tokens", "must be >= 1")
        _check_at_most(self.max_tokens, "data.max_tokens", MAX_TOKENS, "tokens per caption; batches are this long")
        _check(self.num_workers >= 0, "data.num_workers", "must be >= 0 (0 = load in the main process)")
        for key in ("val_fraction", "test_fraction"):
            _check(0.0 <= getattr(self, key) < 1.0, f"data.{key}", f"must be in [0, 1), got {getattr(self, key)}")
        held_out = self.val_fraction + self.test_fraction
        _check(held_out < 1.0, "data.val_fraction/data.test_fraction",
               f"their sum must be < 1 (train keeps the rest), got {held_out:g}")  # fmt: skip
        _check_at_most(self.num_workers, "data.num_workers", MAX_PROCESSES, "each worker is a process")
        _check(self.bag_neighbours >= 1, "data.bag_neighbours", "must be >= 1")
        _check_at_most(self.bag_neighbours, "data.bag_neighbours", 10_000, "an images x neighbours table; NDLB: 200")
        for end, size in self.bag_schedule.items():
            _check(end >= 1, "data.bag_schedule", f"end epochs must be >= 1, got {end}")
            _check(size == 0 or size >= 2, "data.bag_schedule", f"bag sizes must be 0 (random) or >= 2, got {size}")
            _check_at_most(size, "data.bag_schedule", MAX_BAG, "images per bag; BagCurri grows bags from 3 to 7")


@dataclass
class RetrieverConfig:
    checkpoint: str = doc("", "CLIP checkpoint (HF name or local path); empty = train/reuse the world encoder preset.")
    preset: str = doc(
        "world-tiny", "Architecture of the world encoder: a name in finecap.models.world_encoder.PRESETS."
    )
    epochs: int = doc(10, "Contrastive training epochs of the world encoder.")
    batch_size: int = doc(64, "Batch size of world-encoder training.")
    lr: float = doc(2e-3, "Peak learning rate of world-encoder training.")
    aux_weight: float = doc(5.0, "Weight of the auxiliary scene-graph attribute loss (stands in for pretraining).")
    dense_fraction: float = doc(0.5, "Share of each world-encoder batch also trained against its dense captions.")
    batch_size_eval: int = doc(256, "Batch size when embedding images and texts.")

    def __post_init__(self) -> None:
        _check(self.epochs >= 0, "retriever.epochs", "must be >= 0")
        _check_at_most(self.epochs, "retriever.epochs", 10_000, "the world encoder trains 10 epochs by default")
        _check(self.batch_size >= 2, "retriever.batch_size", "must be >= 2 (contrastive needs negatives)")
        _check_at_most(self.batch_size, "retriever.batch_size", MAX_BATCH, "a batch x batch similarity matrix")
        _check(self.batch_size_eval >= 1, "retriever.batch_size_eval", "must be >= 1")
        _check_at_most(self.batch_size_eval, "retriever.batch_size_eval", MAX_BATCH, "images or texts per pass")
        _check(self.aux_weight >= 0, "retriever.aux_weight", "must be >= 0")
        _check(0.0 <= self.dense_fraction <= 1.0, "retriever.dense_fraction", "must be in [0, 1]")


@dataclass
class ModelConfig:
    kind: Backbone = doc(
        "clipcap",
        "Captioner: clipcap (prefix + causal LM), blip (vision tokens + cross-attending decoder) or vlm (decoder-only "
        "vision-language model); its options are in the section of the same name.",
    )
    encoder: str = doc(
        "world",
        "'world' (the cached world encoder) or a CLIP checkpoint name/path: ClipCap's vision tower, the image tokens "
        "of the world-tiny BLIP and VLM (a pretrained BLIP or VLM brings its own).",
    )
    train_encoder: bool = doc(False, "Train the vision encoder too (SR-V); otherwise features are frozen and cached.")
    train_lm: bool = doc(True, "Train the language model (otherwise only the mapper / projector).")
    dtype: WeightsDtype = doc(
        "float32",
        "Weights' dtype of every loaded or built model (auto: the checkpoint's own); frozen parts stay in it "
        "(docs/memory.md).",
    )
    trainable_dtype: TrainableDtype = doc(
        "float32", "Dtype of the parameters that learn (float32: master weights); same: model.dtype's, no upcast."
    )
    attn_implementation: AttnImplementation = doc(
        "auto", "Attention kernel passed to transformers (auto: its default; flash_attention_2 needs flash-attn)."
    )
    quantization: Quantization = doc(
        "none",
        "Load the language model's base weights in 4 or 8 bits (bitsandbytes, the quant extra): QLoRA with lora.lm.",
    )


def _check_tiny(section: str, layers: int, hidden: int, heads: int, dropout: float = 0.0) -> None:
    """The checks of a backbone section's world-tiny sizes (``<section>.tiny_*``)."""
    _check(layers >= 1, f"{section}.tiny_layers", "must be >= 1")
    _check_at_most(layers, f"{section}.tiny_layers", MAX_TINY_LAYERS, "a world-tiny model trained from scratch")
    _check_at_most(hidden, f"{section}.tiny_hidden", MAX_TINY_HIDDEN, "a world-tiny model trained from scratch")
    _check(0.0 <= dropout < 1.0, f"{section}.tiny_dropout", "must be in [0, 1)")
    heads_ok = heads >= 1 and hidden % heads == 0
    _check(heads_ok, f"{section}.tiny_heads", f"must be >= 1 and divide {section}.tiny_hidden={hidden}")


@dataclass
class ClipCapBackboneConfig:
    lm: str = doc("world-tiny", "'world-tiny' (preset GPT-2 + world tokenizer) or any AutoModelForCausalLM name/path.")
    mapper: Mapper = doc("mlp", "Mapper from image features to the LM prefix.")
    prefix_length: int = doc(10, "Number of prefix embeddings k fed to the language model.")
    mapper_layers: int = doc(2, "Transformer mapper: number of layers.")
    mapper_heads: int = doc(8, "Transformer mapper: attention heads (must divide the LM hidden size).")
    tiny_layers: int = doc(3, "lm=world-tiny: GPT-2 layers.")
    tiny_hidden: int = doc(128, "lm=world-tiny: hidden size (n_embd).")
    tiny_heads: int = doc(4, "lm=world-tiny: attention heads (must divide clipcap.tiny_hidden).")
    tiny_dropout: float = doc(0.1, "lm=world-tiny: dropout of embeddings, residuals and attention (GPT-2's 0.1).")

    def __post_init__(self) -> None:
        _check(self.prefix_length >= 1, "clipcap.prefix_length", "must be >= 1")
        _check_at_most(self.prefix_length, "clipcap.prefix_length", 1024, "GPT-2's whole context; ClipCap: 10 or 40")
        _check(self.mapper_layers >= 1, "clipcap.mapper_layers", "must be >= 1")
        _check_at_most(self.mapper_layers, "clipcap.mapper_layers", 64, "ClipCap's transformer mapper has 8")
        _check(self.mapper_heads >= 1, "clipcap.mapper_heads", "must be >= 1")
        _check_at_most(self.mapper_heads, "clipcap.mapper_heads", 256, "it must divide the LM's hidden size")
        _check_tiny("clipcap", self.tiny_layers, self.tiny_hidden, self.tiny_heads, self.tiny_dropout)


@dataclass
class BlipBackboneConfig:
    name: str = doc("world-tiny", "A BlipForConditionalGeneration name/path, or 'world-tiny' (the world BLIP).")
    tiny_layers: int = doc(3, "name=world-tiny: text decoder layers.")
    tiny_hidden: int = doc(128, "name=world-tiny: text decoder hidden size.")
    tiny_heads: int = doc(4, "name=world-tiny: attention heads (must divide blip.tiny_hidden).")
    tiny_dropout: float = doc(0.1, "name=world-tiny: dropout of the text decoder's hidden states and attention.")

    def __post_init__(self) -> None:
        _check_tiny("blip", self.tiny_layers, self.tiny_hidden, self.tiny_heads, self.tiny_dropout)


@dataclass
class VlmBackboneConfig:
    name: str = doc(
        "HuggingFaceTB/SmolVLM-256M-Instruct",
        "An AutoModelForImageTextToText name/path (LLaVA, Idefics3/SmolVLM, Qwen2-VL), or 'world-tiny' (world VLM).",
    )
    prompt: str = doc("Describe the image.", "The user's text after the image in the chat prompt.")
    train_projector: bool = doc(
        True, "Train the projector from vision tower to LM (as ClipCap's mapper, whatever else trains)."
    )
    processor_kwargs: dict[str, bool | int | float | str] = doc(
        {},
        "Keyword arguments of every processor call, the image-token budget: Qwen2-VL max_pixels / min_pixels, "
        "Idefics3 (SmolVLM) do_image_splitting (docs/vlm.md); recorded in the checkpoint.",
    )
    tiny_layers: int = doc(3, "name=world-tiny: Llama-style LM layers.")
    tiny_hidden: int = doc(128, "name=world-tiny: LM hidden size.")
    tiny_heads: int = doc(4, "name=world-tiny: attention heads (must divide vlm.tiny_hidden).")

    def __post_init__(self) -> None:
        _check_tiny("vlm", self.tiny_layers, self.tiny_hidden, self.tiny_heads)


MOVED_KEYS: dict[str, str] = {
    "model.lm": "clipcap.lm",
    "model.mapper": "clipcap.mapper",
    "model.prefix_length": "clipcap.prefix_length",
    "model.mapper_layers": "clipcap.mapper_layers",
    "model.mapper_heads": "clipcap.mapper_heads",
    "model.blip": "blip.name",
    "model.vlm": "vlm.name",
    "model.vlm_prompt": "vlm.prompt",
    "model.vlm_train_projector": "vlm.train_projector",
    **{f"model.tiny_{k}": f"{{kind}}.tiny_{k}" for k in ("layers", "hidden", "heads", "dropout")},
}
"""Keys of the former flat ``model`` section and where they live now (``{kind}``: the section of ``model.kind``, as
each backbone has its own world-tiny sizes). A recipe or override setting one is an error naming the new key;
a stored configuration written before the move is migrated (:func:`migrate_moved_keys`)."""


def moved_key(key: str, kind: str) -> str | None:
    """The key ``key`` of the former flat ``model`` section moved to for a captioner of ``model.kind=kind``, or
    ``None`` when ``key`` did not move or that backbone has no such option (the world VLM has no dropout).

    Example::

        >>> moved_key("model.prefix_length", "clipcap"), moved_key("model.tiny_hidden", "blip")
        ('clipcap.prefix_length', 'blip.tiny_hidden')
    """
    target = MOVED_KEYS.get(key, "").replace("{kind}", kind)
    if not target:
        return None
    section, name = target.split(".")
    cls = SECTIONS.get(section)
    return target if cls is not None and name in {f.name for f in dataclasses.fields(cls)} else None


def _moved_message(key: str, kind: str) -> str:
    target = moved_key(key, kind)
    if target is not None:
        return f"{key!r} moved to {target!r} (each backbone's options have their own section); set {target} instead"
    where = [t for k in ("clipcap", "blip", "vlm") if (t := moved_key(key, k))]
    return f"{key!r} moved to the backbone sections ({', '.join(where)}); model.kind={kind} has no such option"


def migrate_moved_keys(data: dict[str, Any]) -> dict[str, Any]:
    """Sections ``{section: {key: value}}`` of a configuration stored before the backbone sections
    (:data:`MOVED_KEYS`) with the former ``model`` keys moved to their sections (a value already set there wins;
    an option the backbone no longer has is dropped). Configurations without such keys come back unchanged."""
    model = data.get("model")
    if not isinstance(model, dict) or not any(f"model.{k}" in MOVED_KEYS for k in model):
        return data
    out = {name: dict(values) if isinstance(values, dict) else values for name, values in data.items()}
    kind = str(model.get("kind", ModelConfig.kind))
    for key in list(out["model"]):
        if f"model.{key}" not in MOVED_KEYS:
            continue
        value = out["model"].pop(key)
        target = moved_key(f"model.{key}", kind)
        if target is not None:
            section, name = target.split(".")
            if not isinstance(out.get(section), dict):
                out[section] = {}
            out[section].setdefault(name, value)
    return out


TRACKERS = ("jsonl", "tensorboard", "wandb", "mlflow", "comet_ml", "aim", "clearml", "dvclive", "swanlab", "trackio")
"""Values of ``train.log_with``: finecap's ``jsonl`` (metrics.jsonl) and accelerate's trackers (``LoggerType``)."""


@dataclass
class TrainConfig:
    objective: str = doc("mle", "Objective name (see finecap.objectives) or a dotted import path 'pkg.mod:factory'.")
    init_from: str = doc("", "Checkpoint directory to start from (empty = fresh model).")
    epochs: float = doc(10.0, "Training epochs (fractional allowed); ignored when train.max_steps > 0.")
    max_steps: int = doc(0, "Stop after this many optimizer steps (0 = use train.epochs).")
    batch_size: int = doc(
        64,
        "Examples per micro-batch per process; effective batch = batch_size x processes x train.grad_accum_steps.",
    )
    grad_accum_steps: int = doc(1, "Micro-batches accumulated per optimizer step (accelerate's accumulate).")
    lr: float = doc(2e-3, "Peak learning rate (AdamW).")
    weight_decay: float = doc(0.01, "AdamW weight decay.")
    warmup_steps: int = doc(100, "Linear warmup steps.")
    schedule: Schedule = doc("linear", "Learning-rate schedule after warmup.")
    grad_clip: float = doc(1.0, "Max gradient norm (0 = no clipping).")
    gradient_checkpointing: bool = doc(
        False, "Recompute the activations of the trained parts' layers in backward (non-reentrant; off in decoding)."
    )
    eval_every: int = doc(0, "Evaluate on the validation split every N steps (0 = once per epoch).")
    eval_samples: int = doc(500, "Validation images used per evaluation (0 = all).")
    best_metric: str = doc(
        "loss", "Validation metric picking the best checkpoint ('loss' minimised, others maximised)."
    )
    log_every: int = doc(20, "Log training metrics every N steps.")
    save_every: int = doc(0, "Save a resumable checkpoint every N steps (0 = at each evaluation).")
    best_mode: Literal["auto", "min", "max"] = doc("auto", "Minimise/maximise best_metric (auto: min for 'loss').")
    loss_weights: dict[str, float] = doc({}, "Weight of each named loss of the objective (absent = 1.0).")
    validators: list[str] = doc([], "Validators run at each evaluation (loop.VALIDATORS names or 'pkg.mod:factory').")
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
    )
    tf32: bool = doc(False, "Allow TF32 in float32 matmuls and cuDNN convolutions on CUDA (no-op on the CPU).")
    log_with: list[str] = doc(
        ["jsonl"], "Experiment trackers (accelerate log_with): jsonl (metrics.jsonl), tensorboard, wandb, mlflow, ..."
    )
    log_captions: int = doc(4, "Validation images whose greedy captions are logged as text at each evaluation.")

    def __post_init__(self) -> None:
        _check(self.epochs > 0 or self.max_steps > 0, "train.epochs/train.max_steps", "one of them must be > 0")
        _check(self.batch_size >= 1, "train.batch_size", "must be >= 1")
        _check_at_most(self.batch_size, "train.batch_size", MAX_BATCH, "examples per micro-batch per process")
        _check(self.grad_accum_steps >= 1, "train.grad_accum_steps", "must be >= 1")
        _check_at_most(self.grad_accum_steps, "train.grad_accum_steps", 4096, "micro-batches per optimizer step")
        _check_at_most(self.epochs, "train.epochs", 100_000, "the papers train 1 to 20 epochs")
        _check_at_most(self.max_steps, "train.max_steps", 100_000_000, "LLM pre-training takes ~1,000,000 steps")
        _check_at_most(self.log_captions, "train.log_captions", 1024, "decoded in one batch at each evaluation")
        for tracker in self.log_with:
            _check(
                tracker in TRACKERS,
                "train.log_with",
                f"unknown tracker {short_repr(tracker)}; valid: {', '.join(TRACKERS)}",
            )
        _check(self.log_captions >= 0, "train.log_captions", "must be >= 0")
        _check(self.lr > 0, "train.lr", "must be > 0")
        _check(self.warmup_steps >= 0, "train.warmup_steps", "must be >= 0")
        _check(self.grad_clip >= 0, "train.grad_clip", "must be >= 0")
        _check(self.log_every >= 1, "train.log_every", "must be >= 1")
        for key in ("eval_every", "eval_samples", "save_every", "max_steps", "max_skipped_steps"):
            _check(getattr(self, key) >= 0, f"train.{key}", "must be >= 0")


@dataclass
class DecodeConfig:
    strategy: DecodeStrategy = doc("greedy", "Decoding strategy.")
    max_length: int = doc(24, "Maximum generated tokens (EOS included).")
    beam_size: int = doc(5, "Beam width for strategy=beam.")
    length_penalty: float = doc(1.0, "Beam score = logprob / length**length_penalty.")
    finished_beams: FinishedBeams = doc(
        "keep", "Beam search: keep a finished caption in its beam (ClipCap) or set it aside as transformers' generate."
    )
    early_stopping: EarlyStopping = doc(
        False, "generate's early_stopping (false, true or never) for decode.finished_beams=set_aside."
    )
    temperature: float = doc(1.0, "Sampling temperature.")
    top_k: int = doc(0, "Sample from the k most likely tokens (0 = off).")
    top_p: float = doc(1.0, "Nucleus sampling mass (1.0 = off).")
    num_return_sequences: int = doc(1, "Captions returned per image.")
    stop_at_period: bool = doc(False, "Also stop a caption at a period token.")
    batch_size: int = doc(
        128, "Sequences decoded at once: images x beams (beam) or x num_return_sequences (sample), at least one image."
    )

    def __post_init__(self) -> None:
        _check(self.max_length >= 1, "decode.max_length", "must be >= 1")
        _check_at_most(self.max_length, "decode.max_length", MAX_TOKENS, "tokens per caption")
        _check(self.beam_size >= 1, "decode.beam_size", "must be >= 1")
        _check_at_most(self.beam_size, "decode.beam_size", 100, "captioning papers search 3 to 10 beams")
        _check(self.batch_size >= 1, "decode.batch_size", "must be >= 1")
        _check_at_most(self.batch_size, "decode.batch_size", MAX_BATCH, "sequences decoded at once")
        _check_at_most(self.num_return_sequences, "decode.num_return_sequences", 4096, "captions kept per image")
        # decode.batch_size counts the sequences of a decoding batch (finecap.decode.chunk_images); beams and samples
        # never multiply it. (One image's rows, at most 100 beams or 4,096 samples x 4,096 tokens, stay far below.)
        positions = self.batch_size * self.max_length
        _check(
            positions <= MAX_DECODE_POSITIONS,
            "decode.batch_size",
            f"decode.batch_size x decode.max_length = {positions:,} token positions in one decoding batch, more than "
            f"{MAX_DECODE_POSITIONS:,} (the decoder caches every position of every layer); lower decode.batch_size",
        )
        _check(self.temperature > 0, "decode.temperature", "must be > 0")
        _check(0 < self.top_p <= 1, "decode.top_p", "must be in (0, 1]")
        _check(self.top_k >= 0, "decode.top_k", "must be >= 0")
        _check(self.num_return_sequences >= 1, "decode.num_return_sequences", "must be >= 1")
        _check(
            self.strategy != "beam" or self.num_return_sequences <= self.beam_size,
            "decode.num_return_sequences",
            "must be <= decode.beam_size for beam search",
        )
        _check(
            isinstance(self.early_stopping, bool) or self.early_stopping == "never",
            "decode.early_stopping",
            f"invalid value {self.early_stopping!r}; valid choices: false, true, never",
        )
        _check(
            self.early_stopping is False or self.finished_beams == "set_aside",
            "decode.early_stopping",
            "is a setting of decode.finished_beams=set_aside (the keep rule ends when every beam has finished)",
        )


@dataclass
class EvalConfig:
    metrics: list[str] = doc(
        [], "Metric groups of finecap eval; empty = what the references allow (caption metrics; image, world metrics)."
    )
    n_distractors: int = doc(99, "Random distractors per image for RD-N self-retrieval.")
    draws: int = doc(3, "Random-distractor draws averaged.")
    bag_sizes: list[int] = doc([3, 5, 7], "Bag sizes for TrueMatch-style bag retrieval.")
    seed: int = doc(0, "Seed of distractor draws.")
    bag_similarity: Literal["query", "pairwise"] = doc(
        "query", "TrueMatch intra-bag similarity: query-to-members mean (NDLB Alg. 1) or mean over all pairs."
    )
    lm: str = doc("", "Causal LM (HF name or path) scoring caption perplexity; needed by the 'perplexity' metric.")
    batch_size: int = doc(64, "Captions per forward pass of the perplexity language model.")
    vocab_min_count: int = doc(5, "A word counts towards vocabulary usage when used at least this often (NDLB).")
    meteor_backend: MeteorBackend = doc(
        "python", "METEOR: pure Python (no Java; reproduces the jar) or pycocoevalcap's jar itself (needs Java)."
    )

    def __post_init__(self) -> None:
        _check(self.n_distractors >= 1, "eval.n_distractors", "must be >= 1")  # at most the images: checked on use
        _check(self.draws >= 1, "eval.draws", "must be >= 1")
        _check_at_most(self.draws, "eval.draws", 1000, "each draw ranks every caption again; the papers average 3")
        _check(all(s >= 2 for s in self.bag_sizes), "eval.bag_sizes", "bag sizes must be >= 2")
        _check_at_most(max(self.bag_sizes, default=2), "eval.bag_sizes", MAX_BAG, "images per bag; TrueMatch: 3-7")
        _check(self.batch_size >= 1, "eval.batch_size", "must be >= 1")
        _check_at_most(self.batch_size, "eval.batch_size", MAX_BATCH, "captions per forward pass")
        _check(self.vocab_min_count >= 1, "eval.vocab_min_count", "must be >= 1")


@dataclass
class SmileConfig:
    subset: Subset = doc("sequence", "Softmax subset (SMILE Sec. 2.2, 3.4).")
    first_token: FirstToken = doc("mle", "Initial-context restriction (SMILE Sec. 3.3).")
    mle_weight: float = doc(0.0, "λ of Eq. 4: loss = λ·MLE + (1-λ)·SMILE.")
    include_eos: bool = doc(True, "The end-of-sequence id belongs to the sequence subset (as in the paper's code).")
    shift_token_id: int | None = doc(None, "Alternative first-token id for first_token=shift.")
    random_k: int = doc(10, "Random ids per sequence for subset=random.")

    def __post_init__(self) -> None:
        _check(0.0 <= self.mle_weight <= 1.0, "smile.mle_weight", f"must be in [0, 1], got {self.mle_weight}")
        _check(self.random_k >= 1, "smile.random_k", "must be >= 1")
        _check_at_most(self.random_k, "smile.random_k", 262_144, "more ids than the largest vocabularies (256k)")
        _check(
            self.first_token != "shift" or self.shift_token_id is not None,
            "smile.shift_token_id",
            "must be set when smile.first_token=shift",
        )


@dataclass
class RLConfig:
    rewards: dict[str, float] = doc({"cider": 1.0}, "Reward weights, R = sum w_i r_i (finecap.rewards.REWARDS names).")
    baseline: Baseline = doc("greedy", "REINFORCE baseline of the reward.")
    samples: int = doc(5, "Captions decoded per image in training (s); greedy/beam decoding need 1.")
    strategy: RLStrategy = doc("sample", "Training-time decoding (beam uses decode.*).")
    temperature: float = doc(1.0, "Sampling temperature of training-time decoding (NDLB: 0.3).")
    logprob: LogProb = doc("sum", "log p(caption): sum of token log-probs or their per-token mean.")
    scaled_logprob: bool = doc(False, "Score log p under the temperature-scaled distribution (NDLB), not T = 1.")
    mean_momentum: float = doc(0.0, "baseline=mean: 0 = cumulative mean of past batch rewards, else EMA momentum.")
    entropy_coef: float = doc(0.0, "Max-entropy regularisation (SLL-ME): loss -= coef * mean token entropy.")
    alpha: float = doc(0.75, "sle: weight of the precision term; the diversity term gets 1 - alpha (Eq. 8).")
    distance: Distance = doc("bleu34", "sle: caption distance, bleu34 = 1 - (BLEU-3 + BLEU-4) / 2.")
    diversity_baseline: DiversityBaseline = doc(
        "pairwise_mean", "sle: baseline of the diversity term (pairwise_mean: Sec. 4.3, zero-mean advantages)."
    )

    def __post_init__(self) -> None:
        _check(bool(self.rewards), "rl.rewards", "needs at least one reward, e.g. {cider: 1.0}")
        _check(self.samples >= 1, "rl.samples", "must be >= 1")
        _check_at_most(self.samples, "rl.samples", 256, "captions decoded per image; SCST: 5, GRPO-style: 8 to 64")
        _check(self.temperature > 0, "rl.temperature", "must be > 0")
        _check(
            self.strategy == "sample" or self.samples == 1,
            "rl.samples",
            f"must be 1 with rl.strategy={self.strategy} (deterministic decoding gives one caption per image)",
        )
        _check(
            self.baseline != "leave_one_out" or self.samples >= 2,
            "rl.samples",
            "must be >= 2 with rl.baseline=leave_one_out (the other samples of the image are the baseline)",
        )
        _check(
            not (self.baseline == "greedy" and self.strategy == "greedy"),
            "rl.baseline",
            "greedy with rl.strategy=greedy makes every advantage 0; use mean, or decode with sample/beam",
        )
        _check(0.0 <= self.mean_momentum < 1.0, "rl.mean_momentum", "must be in [0, 1)")
        _check(self.entropy_coef >= 0, "rl.entropy_coef", "must be >= 0")
        _check(0.0 <= self.alpha <= 1.0, "rl.alpha", f"must be in [0, 1], got {self.alpha}")


@dataclass
class SRConfig:
    reward: SRReward = doc(
        "log_prob", "Self-retrieval reward: log-softmax of the target (NDLB Eq. 1), top-1 hit, or cosine alone."
    )
    distractors: Distractors = doc(
        "batch", "Distractors: other images of the global batch, bag-mates only, or k mined + in-batch random."
    )
    hard_k: int = doc(5, "distractors=hard: nearest training images (retriever image cosine) per target (D.2: 5/10).")
    duplicate_threshold: float | None = doc(
        None, "Drop distractors whose image cosine to the target exceeds this (near-duplicates); null = keep all."
    )
    logit_scale: float = doc(0.0, "Similarity scale of the log-softmax; 0 = the retriever's own exp(logit_scale).")

    def __post_init__(self) -> None:
        _check(self.hard_k >= 1, "sr.hard_k", "must be >= 1")
        _check_at_most(self.hard_k, "sr.hard_k", MAX_BAG, "mined distractors per target; DiscriTune D.2: 5 or 10")
        _check(self.logit_scale >= 0, "sr.logit_scale", "must be >= 0 (0 = the retriever's own)")
        _check(
            self.duplicate_threshold is None or -1.0 <= self.duplicate_threshold <= 1.0,
            "sr.duplicate_threshold",
            "must be a cosine in [-1, 1] or null",
        )


@dataclass
class LoraConfig:
    lm: bool = doc(False, "Train the language model through LoRA adapters (needs model.train_lm=true).")
    encoder: bool = doc(False, "Train the vision encoder through LoRA adapters (needs model.train_encoder=true).")
    rank: int = doc(32, "LoRA rank r (NDLB: 32 on GPT-2 and CLIP).")
    alpha: float = doc(32.0, "LoRA alpha; the update is scaled by alpha / rank.")
    dropout: float = doc(0.0, "Dropout on the LoRA input.")
    init: LoraInit = doc(
        "kaiming",
        "Adapter initialisation: kaiming (peft's default: B = 0, A Kaiming-uniform), gaussian (peft: A with std 1/r), "
        "normal (NDLB's released code: the weight's column-side factor N(0, 1), the other 0).",
    )
    lm_targets: list[str] = doc([], "LM module names (suffixes) to adapt; empty = every linear layer but the head.")
    encoder_targets: list[str] = doc([], "Encoder module names (suffixes); empty = every image-side linear layer.")

    def __post_init__(self) -> None:
        _check(self.rank >= 1, "lora.rank", "must be >= 1")
        _check_at_most(self.rank, "lora.rank", 4096, "a rank beyond the layer's width adapts nothing more")
        _check(self.alpha > 0, "lora.alpha", "must be > 0")
        _check(0.0 <= self.dropout < 1.0, "lora.dropout", "must be in [0, 1)")


@dataclass
class BagsConfig:
    text_from: CaptionField = doc(
        "original", "Captions whose mean text embedding builds TrueMatch bags (NDLB: holistic, from `finecap boost`)."
    )


SECRET_KEYS: tuple[str, ...] = ("boost.llm_api_key", "boost.vlm_api_key")
"""Keys holding secrets: masked wherever a configuration is saved, printed or logged; finecap boost never writes them
(prefer the environment: ``boost.llm_api_key_env`` / ``boost.vlm_api_key_env``)."""


def _http_url_problem(url: str) -> str | None:
    """Why ``url`` is not an http(s) URL with a host, or ``None`` when it is (an empty URL means "the default")."""
    from urllib.parse import urlsplit

    if not url:
        return None
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError as e:
        return f"malformed URL ({e})"
    if parts.scheme not in ("http", "https"):
        return f"not an http(s) URL (scheme {short_repr(parts.scheme or 'missing')}); e.g. http://localhost:8000/v1"
    if not parts.hostname:
        return "the URL names no host; e.g. http://localhost:8000/v1"
    return None


@dataclass
class BoostConfig:
    mode: BoostMode = doc(
        "holistic", "Captions `finecap boost` writes: BlendCap, VisualCap or HolisticCap (NDLB Sec. 2)."
    )
    llm_backend: BoostBackend = doc(
        "world", "LLM backend (blend, holistic): openai-compatible server, transformers, world."
    )
    llm_model: str = doc("", "LLM model name (openai: served name; transformers: HF name or path).")
    llm_base_url: str = doc("", "openai: server URL, e.g. http://localhost:8000/v1; empty = env OPENAI_BASE_URL.")
    llm_api_key_env: str = doc("OPENAI_API_KEY", "openai: environment variable holding the LLM server's API key.")
    llm_api_key: str = doc("", "Deprecated (use llm_api_key_env): API key given in the config; never written out.")
    vlm_backend: BoostBackend = doc("world", "VLM backend (visual): openai-compatible server, transformers, world.")
    vlm_model: str = doc(
        "runs/visual_expert/checkpoints/best", "VLM name or path (world: the visual-expert ClipCap checkpoint)."
    )
    vlm_base_url: str = doc("", "openai: VLM server URL; empty = env OPENAI_BASE_URL.")
    vlm_api_key_env: str = doc("OPENAI_API_KEY", "openai: environment variable holding the VLM server's API key.")
    vlm_api_key: str = doc("", "Deprecated (use vlm_api_key_env): API key given in the config; never written out.")
    concurrency: int = doc(8, "openai: requests in flight at once.")
    timeout: float = doc(120.0, "openai: seconds before a request times out (then retried).")
    retries: int = doc(
        3, "Retries of a failed request or malformed/empty answer before the image is logged as failed."
    )
    retry_max_wait: float = doc(
        60.0, "openai: longest wait before a retry, s; a server asking (Retry-After) for longer fails the request."
    )
    max_failure_rate: float = doc(
        0.01, "Failure budget: the run stops, exit 2, once more than this fraction of the images to boost failed."
    )
    max_consecutive_failures: int = doc(
        10, "The run stops, exit 2, after this many requests in a row failed to reach the server."
    )
    prompts: str = doc("", "Prompt file (YAML) overriding the default templates, or 'ndlb' (the paper's prompts).")
    few_shot: bool = doc(True, "Prepend the prompts' few-shot examples to each request.")
    batch_size: int = doc(8, "transformers: prompts generated per batch.")
    max_new_tokens: int = doc(120, "openai/transformers: most tokens generated per answer.")
    temperature: float = doc(0.0, "openai/transformers: sampling temperature (0 = greedy).")
    limit: int = doc(0, "Boost only the first N images (0 = all); the rest keep their human captions.")

    def __post_init__(self) -> None:
        _check(self.concurrency >= 1, "boost.concurrency", "must be >= 1")
        _check_at_most(self.concurrency, "boost.concurrency", 1024, "requests in flight, one thread each")
        _check(self.timeout > 0, "boost.timeout", "must be > 0")
        _check(self.retries >= 0, "boost.retries", "must be >= 0")
        _check_at_most(self.retries, "boost.retries", 100, "each retry waits; a failing server would hold the run")
        _check(self.retry_max_wait >= 0, "boost.retry_max_wait", "must be >= 0")
        _check(0 <= self.max_failure_rate <= 1, "boost.max_failure_rate", "must be a fraction in [0, 1]")
        _check(self.max_consecutive_failures >= 1, "boost.max_consecutive_failures", "must be >= 1")
        _check(self.batch_size >= 1, "boost.batch_size", "must be >= 1")
        _check_at_most(self.batch_size, "boost.batch_size", 4096, "prompts generated at once by transformers")
        _check(self.max_new_tokens >= 1, "boost.max_new_tokens", "must be >= 1")
        _check_at_most(self.max_new_tokens, "boost.max_new_tokens", 32_768, "a caption rewrite takes ~200 tokens")
        _check(self.temperature >= 0, "boost.temperature", "must be >= 0")
        _check(self.limit >= 0, "boost.limit", "must be >= 0")
        for role in ("llm", "vlm"):
            problem = _http_url_problem(getattr(self, f"{role}_base_url"))
            _check(problem is None, f"boost.{role}_base_url", str(problem))
            _check(bool(getattr(self, f"{role}_api_key_env")), f"boost.{role}_api_key_env", "must name a variable")


@dataclass
class DemoConfig:
    stages: list[str] = doc(
        ["world", "retriever", "mle", "blip_mle", "vlm_mle", "sr_bagcurri", "scst", "smile", "sle", "discritune",
         "blip_smile", "vlm_smile", "report"],
        "Demo stages to run, in order (optional: mle_continued, scst_me, blip_discritune, vlm_discritune, vcb, ...).",
    )  # fmt: skip
    quick: bool = doc(False, "Tiny settings that finish in about two minutes (used by tests).")
    force: bool = doc(False, "Re-run stages even when their outputs exist.")
    jobs: int = doc(
        0, "Training stages no other stage starts from, run side by side (0 = cores // demo.stage_threads)."
    )
    stage_threads: int = doc(
        1, "Torch threads of each such stage, whatever demo.jobs (so results do not depend on the job count)."
    )

    def __post_init__(self) -> None:
        _check(self.jobs >= 0, "demo.jobs", "must be >= 0 (0 = from the core count)")
        _check_at_most(self.jobs, "demo.jobs", MAX_PROCESSES, "each job is a process")
        _check(self.stage_threads >= 1, "demo.stage_threads", "must be >= 1")
        _check_at_most(self.stage_threads, "demo.stage_threads", MAX_PROCESSES, "torch threads of each stage")


SECTIONS: dict[str, type] = {
    "run": RunConfig,
    "world": WorldConfig,
    "data": DataConfig,
    "retriever": RetrieverConfig,
    "model": ModelConfig,
    "clipcap": ClipCapBackboneConfig,
    "blip": BlipBackboneConfig,
    "vlm": VlmBackboneConfig,
    "train": TrainConfig,
    "decode": DecodeConfig,
    "eval": EvalConfig,
    "smile": SmileConfig,
    "rl": RLConfig,
    "sr": SRConfig,
    "lora": LoraConfig,
    "demo": DemoConfig,
    "bags": BagsConfig,
    "boost": BoostConfig,
}


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    world: WorldConfig = field(default_factory=WorldConfig)
    data: DataConfig = field(default_factory=DataConfig)
    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    clipcap: ClipCapBackboneConfig = field(default_factory=ClipCapBackboneConfig)
    blip: BlipBackboneConfig = field(default_factory=BlipBackboneConfig)
    vlm: VlmBackboneConfig = field(default_factory=VlmBackboneConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    smile: SmileConfig = field(default_factory=SmileConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    sr: SRConfig = field(default_factory=SRConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    demo: DemoConfig = field(default_factory=DemoConfig)
    bags: BagsConfig = field(default_factory=BagsConfig)
    boost: BoostConfig = field(default_factory=BoostConfig)

    def to_dict(self, redact: bool = False) -> dict[str, dict[str, Any]]:
        """``{section: {key: value}}``; ``redact=True`` masks every secret (:func:`redacted`), as wherever a
        configuration leaves the process: files, stdout, experiment trackers."""
        data = dataclasses.asdict(self)
        return redacted(data) if redact else data

    def save(self, path: str | Path) -> None:
        """Write the resolved configuration as YAML (atomically). Relative paths are written absolute
        (:func:`absolute_paths`), so the stored file means the same from any working directory."""
        from finecap.utils import atomic_write_text

        atomic_write_text(path, self.to_yaml())

    def to_yaml(self) -> str:
        """What :meth:`save` writes: :meth:`saved_dict` as YAML."""
        return yaml.safe_dump(self.saved_dict(), sort_keys=False)

    def saved_dict(self) -> dict[str, dict[str, Any]]:
        """What :meth:`save` writes (and trackers receive): relative paths made absolute, secrets masked."""
        return absolute_paths(self).to_dict(redact=True)


MASK = "***"
"""What a secret (:data:`SECRET_KEYS`) is written as. Read back (a stored ``config.yaml``), it means "not set": the key
then comes from the environment (``boost.llm_api_key_env``), never the mask itself."""


def redacted(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of sections ``{section: {key: value}}`` with every non-empty :data:`SECRET_KEYS` value replaced by
    :data:`MASK`: what :meth:`Config.save` writes, ``finecap config`` prints and trackers receive.

    Example::

        >>> redacted({"boost": {"llm_api_key": "sk-1", "vlm_api_key": ""}})["boost"]
        {'llm_api_key': '***', 'vlm_api_key': ''}
    """
    out = {name: dict(values) if isinstance(values, dict) else values for name, values in data.items()}
    for dotted in SECRET_KEYS:
        section, key = dotted.split(".")
        values = out.get(section)
        if isinstance(values, dict) and values.get(key):
            values[key] = MASK
    return out


# --------------------------------------------------------------------------------------------------------------------
# Type checking and coercion
# --------------------------------------------------------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Return ``value`` converted to ``tp`` or raise a ConfigError naming ``key``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        if value not in args:
            choices = ", ".join(map(str, args))
            raise ConfigError(
                f"{key}: invalid value {short_repr(value)}{did_you_mean(value, args)}; valid choices: {choices}"
            )
        return value
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}: expected {' | '.join(_type_name(a) for a in args)}, got {short_repr(value)}")
    if origin is list:
        if isinstance(value, str):  # "a,b" reads like [a, b], "a" like [a], "" like []
            value = [_list_item(part.strip(), args[0]) for part in value.split(",")] if value.strip() else []
        elif not isinstance(value, list | tuple | dict):  # a single number or boolean
            value = [value]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: expected a list, got {short_repr(value)}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {short_repr(value)}")
        return {_coerce(k, args[0], f"{key} key"): _coerce(v, args[1], f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false, got {short_repr(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {short_repr(value)}")
    if tp is float:
        number = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                number = None
        if number is None:
            raise ConfigError(f"{key}: expected a number, got {short_repr(value)}")
        if not math.isfinite(number):  # inf/nan in a learning rate or weight silently wrecks a run
            raise ConfigError(f"{key}: must be a finite number, got {short_repr(value)}")
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {short_repr(value)}")
    raise ConfigError(f"{key}: unsupported field type {tp!r}")


def _list_item(text: str, tp: Any) -> Any:
    """One item of a comma-separated list value: a string for string lists, else read as YAML (``3`` -> 3)."""
    if tp is str or typing.get_origin(tp) is Literal:
        return text
    try:
        return load_yaml(text)
    except (yaml.YAMLError, ValueError):  # the text itself, for the field to judge
        return text


Origins = dict[str, str]
"""Where each set key's value came from, as the prefix of its errors: ``{"train.lr": "override 'train.lr=x': "}``,
``{"world.n_train": "recipe.yaml: "}``. Keys set by no file or override (defaults, built-in layers) are absent."""


def _where(key: str | None, origins: Origins, source: str) -> str:
    """The prefix of an error about ``key`` (``"a/b"`` for a check across keys): the command-line override that set
    it, else the file, else an override of the same section (a cross-field check may name a key left at its
    default), else ``source``."""
    if not key:
        return source
    keys = [k.split("[")[0] for k in key.split("/")]
    found = [origins[k] for k in keys if k in origins]
    overrides = [o for o in found if o.startswith("override ")]
    if overrides or found:
        return (overrides or found)[0]
    sections = {k.split(".")[0] for k in keys}
    near = [o for k, o in origins.items() if k.split(".")[0] in sections and o.startswith("override ")]
    return near[0] if near else source


def _build_section(name: str, cls: type, values: dict[str, Any], source: str, origins: Origins) -> Any:
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for k, v in values.items():
        key = f"{name}.{k}"
        where = _where(key, origins, source)
        if k not in known and key in MOVED_KEYS:
            raise ConfigError(f"{where}{_moved_message(key, str(values.get('kind', ModelConfig.kind)))}", key=key)
        if k not in known:
            raise ConfigError(
                f"{where}unknown key {short_repr(key)}{did_you_mean(k, known, f'{name}.')}; "
                f"valid keys of [{name}]: {', '.join(sorted(known))}",
                key=key,
            )
        try:
            kwargs[k] = _coerce(v, hints[k], key)
        except ConfigError as e:
            message = f"{key}: expected {_type_name(hints[k])} (the value is not shown)" if _looks_secret(key) else e
            raise ConfigError(f"{where}{message}", key=key) from None
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{_where(e.key or name, origins, source)}{e}", key=e.key) from None


def _check_name(name: str, valid: Any, key: str, kind: str, dotted: bool = True) -> None:
    if (dotted and is_dotted_path(name)) or name in valid:
        return
    hint = " (or a dotted path 'pkg.module:factory')" if dotted else ""
    raise ConfigError(
        f"{key}: unknown {kind} {short_repr(name)}{did_you_mean(name, valid)}; valid names: "
        f"{', '.join(sorted(valid))}{hint}",
        key=key,
    )


def check_names(cfg: Config) -> None:
    """Registry names are checked when the configuration is loaded, not at first use (tables in the torch-free
    :mod:`finecap.registry`); ``train.best_metric`` must be ``loss``, ``perplexity`` or a value the chosen
    built-in validators return (any name when a validator is user code)."""
    _check_name(cfg.train.objective, OBJECTIVES, "train.objective", "objective")
    _check_name(cfg.data.sampler, SAMPLERS, "data.sampler", "sampler")
    for name in cfg.rl.rewards:
        _check_name(name, REWARDS, "rl.rewards", "reward")
    for name in cfg.train.validators:
        _check_name(name, VALIDATOR_KEYS, "train.validators", "validator")
    for name in cfg.eval.metrics:
        _check_name(name, METRIC_GROUPS, "eval.metrics", "metric group", dotted=False)
    if any(is_dotted_path(v) for v in cfg.train.validators):
        return
    values = ["loss", "perplexity", *dict.fromkeys(k for v in cfg.train.validators for k in VALIDATOR_KEYS[v])]
    if cfg.train.best_metric not in values:
        raise ConfigError(
            f"train.best_metric: {short_repr(cfg.train.best_metric)}{did_you_mean(cfg.train.best_metric, values)} is "
            "not a "
            f"validation value of this run; available: {', '.join(values)} (train.validators adds values: "
            + ", ".join(f"{name} -> {', '.join(keys)}" for name, keys in VALIDATOR_KEYS.items())
            + ")",
            key="train.best_metric",
        )


def from_dict(data: dict[str, Any] | None, source: str = "", origins: Origins | None = None) -> Config:
    """Build a :class:`Config` from nested mappings ``{section: {key: value}}``. Errors start with where the value at
    fault was set (``origins``, see :func:`load`), else with ``source`` (e.g. ``"recipe.yaml: "``). A secret read
    back as :data:`MASK` (a stored configuration) is unset."""
    data = data or {}
    origins = origins or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}the configuration must be a mapping of sections, got {type(data).__name__}")
    sections = {}
    for name, values in data.items():
        where = _where("/".join(k for k in origins if k.split(".")[0] == name), origins, source)
        if name not in SECTIONS:
            raise ConfigError(
                f"{where}unknown section {short_repr(name)}{did_you_mean(name, SECTIONS)}; valid sections: "
                f"{', '.join(SECTIONS)}"
            )
        if values is None:
            values = {}
        if not isinstance(values, dict):
            raise ConfigError(f"{where}section {short_repr(name)} must be a mapping, got {short_repr(values)}")
        values = {k: "" if f"{name}.{k}" in SECRET_KEYS and v == MASK else v for k, v in values.items()}
        sections[name] = _build_section(name, SECTIONS[name], values, source, origins)
    cfg = Config(**sections)
    try:
        check_names(cfg)
    except ConfigError as e:
        raise ConfigError(f"{_where(e.key, origins, source)}{e}", key=e.key) from None
    return cfg


def parse_override(item: str) -> tuple[list[str], Any]:
    """Parse ``section.key=value`` (value read as YAML: numbers, booleans, lists, mappings; anchors, aliases and
    duplicate keys refused, :func:`finecap.utils.load_yaml`)."""
    if "=" not in item:
        raise ConfigError(f"override {_shown_override(item)}: expected section.key=value")
    key, raw = item.split("=", 1)
    parts = key.strip().split(".")
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"override {_shown_override(item)}: the key must look like section.key (e.g. train.lr=1e-4)")
    try:
        value = load_yaml(raw) if raw.strip() else ""
    except YAMLRefused as e:
        if e.kind != "alias":  # an anchor (a value to repeat: a bomb's start) or a duplicate key
            raise ConfigError(f"override {_shown_override(item)}: {e.reason}", key=key.strip()) from None
        value = raw  # an alias before any anchor never was YAML (`*best`): the text itself, as before
    except (yaml.YAMLError, ValueError):  # not YAML (or an integer of thousands of digits): the text itself
        value = raw
    if isinstance(value, str):
        # YAML reads "1e-4" as a string; let the field type decide.
        value = raw.strip()
    return parts, value


OVERRIDE_SHOWN = 200
"""Characters of a command-line override an error message repeats at most (a path fits, a pasted file does not)."""


def _shown_override(item: str) -> str:
    """An override ``section.key=value`` as error messages quote it: shortened (:func:`finecap.utils.short_repr`),
    the value of a secret key masked."""
    key = item.split("=", 1)[0].strip()
    shown = f"{key}={MASK}" if "=" in item and _looks_secret(key) else item.strip()
    return short_repr(shown, OVERRIDE_SHOWN)


def _looks_secret(key: str) -> bool:
    """A key of :data:`SECRET_KEYS`, or one named like a secret (a mistyped ``boost.llm_apikey``): its value is never
    repeated in an error message."""
    name = key.rsplit(".", 1)[-1].lower()
    return key in SECRET_KEYS or any(word in name for word in ("key", "token", "secret", "password"))


def merge_overrides(data: dict[str, Any], overrides: list[str], origins: Origins | None = None) -> dict[str, Any]:
    """``data`` with the dotlist ``overrides`` set; ``origins`` (when given) records which override set each key."""
    data = {k: dict(v or {}) for k, v in (data or {}).items()}
    for item in overrides:
        (section, key), value = parse_override(item)
        data.setdefault(section, {})[key] = value
        if origins is not None:
            origins[f"{section}.{key}"] = f"override {_shown_override(item)}: "
    return data


def load(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    base: dict[str, Any] | None = None,
    over: dict[str, Any] | None = None,
) -> Config:
    """Load ``path`` (YAML) and validate. Layers, lowest first: the dataclass defaults, ``base`` (settings beneath
    the recipe), the recipe, ``over`` (settings above the recipe, e.g. the demo's ``--quick``), then the dotlist
    ``overrides``. An error names where the value at fault was set: the override (``override 'train.lr=x': ...``)
    or the recipe file."""
    data: dict[str, Any] = {k: dict(v) for k, v in (base or {}).items()}
    origins: Origins = {}
    source = ""
    if path is not None:
        try:
            path = resolve_recipe(path)  # a YAML path, or a packaged recipe by name (finecap.recipes)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        from finecap.utils import read_yaml_mapping

        try:
            loaded = read_yaml_mapping(path, "a recipe must be a mapping of sections")
        except ValueError as e:
            raise ConfigError(str(e)) from None
        source = f"{path}: "
        for name, values in loaded.items():
            if isinstance(values, dict) and isinstance(data.get(name), dict):
                data[name] = {**data[name], **values}
            else:
                data[name] = values
            keys = values if isinstance(values, dict) and values else [""]
            origins.update({f"{name}.{k}" if k else name: source for k in keys})
    for name, values in (over or {}).items():
        data[name] = {**(data.get(name) or {}), **values}
    data = merge_overrides(data, overrides or [], origins)
    return from_dict(data, source, origins)


def describe(cls: type) -> list[tuple[str, str, Any, str]]:
    """(key, type, default, doc) rows of a section, for help output and documentation."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        rows.append((f.name, _type_name(hints[f.name]), default, f.metadata.get("doc", "")))
    return rows


# --------------------------------------------------------------------------------------------------------------------
# Paths in stored configurations
# --------------------------------------------------------------------------------------------------------------------

PATH_KEYS: dict[str, Literal["path", "name_or_path"]] = {
    "run.root": "path",
    "run.dir": "path",
    "run.cache_dir": "path",
    "world.out": "path",
    "data.path": "path",  # name_or_path with data.format=hf (a Hub data set name)
    "data.images": "path",
    "retriever.checkpoint": "name_or_path",
    "model.encoder": "name_or_path",
    "clipcap.lm": "name_or_path",
    "blip.name": "name_or_path",
    "vlm.name": "name_or_path",
    "train.init_from": "path",
    "eval.lm": "name_or_path",
    "boost.prompts": "path",
    "boost.llm_model": "name_or_path",
    "boost.vlm_model": "name_or_path",
}
"""Keys holding file-system paths: ``path`` keys always are one; ``name_or_path`` keys are a Hub name unless a
local file or folder exists there (as ``from_pretrained`` decides)."""
KEYWORDS = ("world", "world-tiny")
"""Values of ``name_or_path`` keys that name finecap's embedded models, never a folder."""


def _absolute(key: str, value: Any, base: Path, data_format: Any) -> Any:
    if not isinstance(value, str) or not value or value in KEYWORDS or Path(value).is_absolute():
        return value
    joined = os.path.normpath(os.path.join(base, value))
    kind = "name_or_path" if key == "data.path" and data_format == "hf" else PATH_KEYS[key]
    if kind == "name_or_path" and not os.path.exists(joined):
        return value
    return joined


def absolute_path_values(data: dict[str, Any], base: str | Path) -> dict[str, Any]:
    """Sections ``{section: {key: value}}`` with every relative path of :data:`PATH_KEYS` joined to ``base``."""
    base = Path(os.path.abspath(base))
    out = {name: dict(values) if isinstance(values, dict) else values for name, values in data.items()}
    data_section = out.get("data") if isinstance(out.get("data"), dict) else {}
    data_format = data_section.get("format", DataConfig().format)
    for dotted in PATH_KEYS:
        section, key = dotted.split(".")
        values = out.get(section)
        if isinstance(values, dict) and key in values:
            values[key] = _absolute(dotted, values[key], base, data_format)
    return out


def absolute_paths(cfg: Config, base: str | Path | None = None) -> Config:
    """``cfg`` with every relative path of :data:`PATH_KEYS` made absolute against ``base`` (default: the working
    directory, against which a running command reads them). :meth:`Config.save` stores this form.

    Example::

        >>> absolute_paths(load(None, ["world.out=data/w"]), "/home/me").world.out
        '/home/me/data/w'
    """
    data = absolute_path_values(cfg.to_dict(), base if base is not None else os.getcwd())
    return dataclasses.replace(cfg, **{name: dataclasses.replace(getattr(cfg, name), **values)
                                       for name, values in data.items()})  # fmt: skip


def load_stored(path: str | Path, overrides: list[str] | None = None, recipe: str | Path | None = None) -> Config:
    """A configuration finecap stored (a run's or checkpoint's ``config.yaml``) with a ``recipe``'s keys and the
    dotlist ``overrides`` on top (only the keys they set replace the stored ones).

    finecap writes absolute paths (:meth:`Config.save`); a relative path found in the file (edited by hand) is read
    relative to the file's folder. Paths in the recipe and the overrides are the user's, relative to the working
    directory. A file stored before the backbone sections (``model.prefix_length``, ...) is migrated
    (:func:`migrate_moved_keys`).
    """
    from finecap.utils import read_yaml_mapping

    path = Path(path)
    try:
        data = read_yaml_mapping(path, "a stored configuration must be a mapping of sections")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    data = absolute_path_values(migrate_moved_keys(data), path.parent)
    from_dict(data, f"{path}: ")  # the stored file alone is valid; errors name it
    return load(recipe, overrides, base=data)
