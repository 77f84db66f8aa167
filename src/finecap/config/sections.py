"""The configuration's sections: one dataclass per section (one per backbone), each field one line with its default,
its doc and its own bounds (:func:`~finecap.config.fields.doc`), checked when the section is built; cross-field
checks in each section's ``__post_init__`` name the key to change. :class:`Config` holds one of each.

A component takes its section (``SmileObjective(cfg.smile)``, ``ClipCap(..., cfg.clipcap)``): an option is one field
line here and its uses there, and a section built by hand is checked as one read from a recipe.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import yaml

from finecap.config.fields import ConfigError, Section, check, check_at_most, doc
from finecap.config.paths import absolute_paths
from finecap.config.secrets import redacted
from finecap.registry import BACKBONES, DATA_FORMATS
from finecap.utils import CONTROL_CHARACTERS, short_repr

__all__ = [  # the names finecap.config re-exports
    "Advantage",
    "AlarmAction",
    "AlarmMeasure",
    "AttnImplementation",
    "BagsConfig",
    "Baseline",
    "BlipBackboneConfig",
    "BoostBackend",
    "BoostConfig",
    "BoostMode",
    "CaptionField",
    "ClipCapBackboneConfig",
    "Config",
    "DataConfig",
    "DEFAULT_MAX_ASPECT_RATIO",
    "DEFAULT_MAX_IMAGE_PIXELS",
    "DecodeConfig",
    "DecodeStrategy",
    "DemoConfig",
    "Distance",
    "Distractors",
    "DiversityBaseline",
    "EarlyStopping",
    "Engine",
    "EvalConfig",
    "FinishedBeams",
    "FirstToken",
    "Importance",
    "LogProb",
    "LossAggregation",
    "LoraConfig",
    "LoraInit",
    "LongText",
    "MAX_BAG",
    "MAX_BATCH",
    "MAX_DECODE_POSITIONS",
    "MAX_PROCESSES",
    "MAX_SPLIT",
    "MAX_TINY_HIDDEN",
    "MAX_TINY_LAYERS",
    "MAX_TOKENS",
    "MOVED_KEYS",
    "Mapper",
    "PIL_MAX_IMAGE_PIXELS",
    "MeteorBackend",
    "ModelConfig",
    "PolicyLoss",
    "Quantization",
    "RLConfig",
    "RLStrategy",
    "RetrieverConfig",
    "RewardAggregation",
    "RunConfig",
    "SECTIONS",
    "SRConfig",
    "SRReward",
    "ScaleRewards",
    "Schedule",
    "SmileConfig",
    "Subset",
    "TRACKERS",
    "TrainConfig",
    "TrainableDtype",
    "VlmBackboneConfig",
    "VllmConfig",
    "WeightsDtype",
    "WorldConfig",
    "WorldShift",
    "moved_key",
]

# Upper bounds of the options that size memory or work. Generous (no real run comes near them) but finite, so that a
# typo (data.max_tokens=1e9 would allocate 512 GB) or a tampered stored config.yaml (decode.beam_size: 100000) is
# refused when the configuration is read, naming the key, instead of exhausting memory or running for ever.
MAX_TOKENS = 4096  # tokens of a caption: the longest dense VLM captions (DCI, DOCCI) are ~1,000; GPT-2 reads 1,024
MAX_BATCH = 65_536  # examples of one batch: twice the largest contrastive batch in use (CLIP's 32,768)
MAX_SPLIT = 1_000_000  # scenes of a world split: COCO has 123k images
MAX_PROCESSES = 256  # worker processes or threads started at once: the cores of a large two-socket machine
MAX_BAG = 1024  # images in a bag: TrueMatch and BagCurri use 3 to 7
MAX_REWARD_WEIGHT = 1e6  # |w| of a reward weight: the papers' are 0.5 to 1; a weight scales its reward as lr a step
FLOAT32_TINY = 1.1754943508222875e-38  # float32's smallest normal number: a nonzero weight below it is 0 there
MAX_TINY_LAYERS, MAX_TINY_HIDDEN = 48, 2048  # world-tiny models: GPT-2 XL (48 layers, 1,600 wide) is not tiny
MAX_DECODE_POSITIONS = 2**26  # token positions of one decoding batch (rows x length): 67M, ~TBs of KV cache
PIL_MAX_IMAGE_PIXELS = 89_478_485  # PIL's decompression-bomb limit (PIL.Image.MAX_IMAGE_PIXELS): PIL refuses more

# The image budget (data.max_image_pixels, data.max_aspect_ratio), checked from an image's header before it is
# decoded (finecap.data.images.ImageLimits); the defaults admit every photograph of a camera or phone in its
# default mode. Pixels: 64 MP holds every full-frame camera's (the largest, 61 MP: 9504 x 6336) and phones' (12-50
# MP); a decoded image takes 3 bytes a pixel (192 MB at the limit), held per image of a batch until the image
# processor resizes it. Aspect ratio: 20:1 holds panoramas (a phone's are up to about 8:1); an image processor
# resizes the shorter side to a few hundred pixels, so a 1 x 60,000 strip, 320 bytes as a PNG, would become
# 224 x 13 million pixels (gigabytes).
DEFAULT_MAX_IMAGE_PIXELS = 64_000_000
DEFAULT_MAX_ASPECT_RATIO = 20.0


# Allowed values of string options, defined once: the fields below use them and the modules that dispatch on them
# derive their runtime tuples with typing.get_args (e.g. finecap.objectives.smile.SUBSETS).
Mapper = Literal["mlp", "transformer"]
Schedule = Literal["linear", "cosine", "constant"]
DecodeStrategy = Literal["greedy", "beam", "sample"]
Engine = Literal["finecap", "vllm"]
MeteorBackend = Literal["python", "java"]
FinishedBeams = Literal["keep", "set_aside"]
EarlyStopping = Literal[False, True, "never"]
Subset = Literal["sequence", "reverse", "random", "full"]
FirstToken = Literal["mle", "shift", "none"]
Baseline = Literal["greedy", "mean", "leave_one_out", "none"]
RLStrategy = Literal["sample", "greedy", "beam"]
LogProb = Literal["sum", "mean"]
Distance = Literal["bleu34", "overlap34"]
DiversityBaseline = Literal["pairwise_mean", "none"]
SRReward = Literal["log_prob", "accuracy", "cosine"]
Distractors = Literal["batch", "bag", "hard"]
CaptionField = Literal["original", "blend", "visual", "holistic", "dense"]
BoostMode = Literal["blend", "visual", "holistic"]
BoostBackend = Literal["openai", "transformers", "vllm", "world"]
WorldShift = Literal["none", "domain"]
LoraInit = Literal["kaiming", "gaussian", "normal"]
LongText = Literal["truncate", "error", "chunks"]
WeightsDtype = Literal["auto", "float32", "bfloat16", "float16"]
TrainableDtype = Literal["float32", "bfloat16", "float16", "same"]
AttnImplementation = Literal["auto", "sdpa", "eager", "flash_attention_2"]
Quantization = Literal["none", "4bit", "8bit"]
Advantage = Literal["baseline", "group"]
ScaleRewards = Literal["group", "batch", "none"]
RewardAggregation = Literal["sum_then_normalize", "normalize_then_sum"]
PolicyLoss = Literal["reinforce", "clipped"]
Importance = Literal["token", "sequence"]
LossAggregation = Literal["sequence", "token", "constant"]
AlarmAction = Literal["warn", "stop"]
AlarmMeasure = Literal["length_drift", "repetition", "distinct", "fact_precision", "fact_recall", "kl"]


# --------------------------------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class RunConfig(Section, name="run"):
    """Where a run writes; :func:`finecap.home.run_dir` resolves its folder (the finecap home is no concern of the
    configuration)."""

    name: str = doc("run", "Run name; the run directory is <run.root>/<run.name> unless run.dir is set.")
    root: str = doc("", "Folder holding run directories; empty = <finecap home>/runs (never the working directory).")
    dir: str = doc("", "Explicit run directory (overrides root/name when non-empty).")
    seed: int = doc(0, "Global random seed (torch, numpy, python).")
    cache_dir: str = doc(
        "", "Folder of the reusable caches (world encoders, frozen features); empty = <finecap home>/cache."
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        control = CONTROL_CHARACTERS.search(self.name)
        if control is not None:
            raise ConfigError(
                f"run.name: {short_repr(self.name)} holds the control character {control.group()!r} (a newline, a "
                "tab, ...); a run's name names its folder and heads its model card: use printable characters",
                key="run.name",
            )


@dataclass
class WorldConfig(Section, name="world"):
    seed: int = doc(0, "Seed of the synthetic world; the same seed gives the same scenes, images and captions.")
    n_train: int = doc(
        10000, "Number of training scenes.", ge=0, le=MAX_SPLIT, why="scenes rendered per split; COCO has 123k images"
    )
    n_val: int = doc(
        500, "Number of validation scenes.", ge=0, le=MAX_SPLIT, why="scenes rendered per split; COCO has 123k images"
    )
    n_test: int = doc(
        1000, "Number of test scenes.", ge=0, le=MAX_SPLIT, why="scenes rendered per split; COCO has 123k images"
    )
    image_size: int = doc(64, "Rendered image side in pixels.", ge=16, le=1024)
    min_objects: int = doc(1, "Fewest objects in a scene.")
    max_objects: int = doc(4, "Most objects in a scene.")
    pattern_prob: float = doc(0.3, "Probability that an object carries a pattern (stripes, dots, ...).", ge=0, le=1)
    families: int = doc(0, "Scene-family size: 0 = off; k >= 2 = groups of k scenes differing in one detail.")
    shift: WorldShift = doc("none", "Domain of the world: none = training domain; domain = the shifted test domain.")
    out: str = doc("", "Folder of the world data set; empty = <finecap home>/worlds/<world key> (FINECAP_HOME).")
    overwrite: bool = doc(False, "Replace another finecap world at world.out (only files finecap made); never others.")

    def __post_init__(self) -> None:
        super().__post_init__()
        check(
            1 <= self.min_objects <= self.max_objects <= 4,
            "world.min_objects/world.max_objects",
            "need 1 <= min_objects <= max_objects <= 4",
        )
        check(self.families == 0 or self.families >= 2, "world.families", "must be 0 (off) or >= 2")


@dataclass
class DataConfig(Section, name="data"):
    format: str = doc(
        "world",
        f"Data set format of data.path: {', '.join(sorted(DATA_FORMATS))} (docs/data.md: one table of every format), "
        "or a dotted path 'pkg.module:FORMAT' to one's own Format (docs/architecture.md).",
    )
    path: str = doc(
        "", "Data set file (Karpathy JSON, COCO annotations, JSONL) or image folder; empty = the world at world.out."
    )
    images: str = doc("", "Image root for relative image paths; empty = next to data.path (folder: the folder).")
    allow_outside_paths: bool = doc(False, "Let records name image files outside the image root (real paths).")
    val_fraction: float = doc(
        0.0,
        "Share of the images that name no split (folder, JSONL lines without 'split') put in val, by id hash.",
        ge=0,
        lt=1,
    )
    test_fraction: float = doc(
        0.0,
        "Share of the images that name no split put in test, by id hash; the rest (all by default) is train.",
        ge=0,
        lt=1,
    )
    split_seed: int = doc(0, "Seed of the id hash of data.val_fraction / data.test_fraction (not run.seed).")
    skip_bad_images: bool = doc(
        False, "Decode every image once when read; skip and count those that fail (false: the first stops the run)."
    )
    max_image_pixels: int = doc(
        DEFAULT_MAX_IMAGE_PIXELS,
        "Images of more pixels (from the header) are refused before decoding; 64 MP: every camera's photo.",
        ge=1,
        le=PIL_MAX_IMAGE_PIXELS,
        why="PIL's decompression-bomb limit, PIL.Image.MAX_IMAGE_PIXELS: PIL refuses larger images itself",
    )
    max_aspect_ratio: float = doc(
        DEFAULT_MAX_ASPECT_RATIO,
        "Images whose longer side is more times their shorter are refused before decoding; 20: panoramas pass.",
        ge=1,
        le=1000,
        why="the image processor scales the shorter side to ~224-384 pixels; 1000:1 is then ~100 M pixels",
    )
    image_column: str = doc("image", "data.format=hf: column of the image (Image feature or path string).")
    caption_column: str = doc("captions", "data.format=hf: column of the reference caption(s) (string or list).")
    split_column: str = doc("", "data.format=hf: column naming each row's split; empty = the named splits.")
    id_column: str = doc("", "data.format=hf: column of the image id; empty = the image path (or split/row).")
    max_tokens: int = doc(
        48,
        "Captions are cut to this many tokens (EOS included); dense world captions reach 41.",
        ge=1,
        le=MAX_TOKENS,
        why="tokens per caption; batches are this long; dense VLM captions reach ~1,000, GPT-2 reads 1,024",
    )
    max_unk_share: float = doc(
        0.02,
        "Training stops when more of the training captions' tokens than this are unknown to the captioner's "
        "tokenizer (a word-level vocabulary not made for them: use clipcap.lm=data-tiny or a pretrained LM).",
        ge=0,
        le=1,
    )
    num_workers: int = doc(
        0,
        "DataLoader worker processes decoding and preprocessing images (docs/data.md).",
        ge=0,
        le=MAX_PROCESSES,
        why="each worker is a process",
    )
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
        {},
        "data.sampler=bagcurri: {end_epoch: bag_size} (0 = random batches), e.g. {1: 0, 2: 3, 3: 5, 4: 7}; sizes "
        f"0 or 2 to {MAX_BAG} (images per bag; BagCurri grows bags from 3 to 7).",
    )
    bag_neighbours: int = doc(
        200,
        "data.sampler=bagcurri: nearest neighbours per image searched for bag-mates.",
        ge=1,
        le=10_000,
        why="an images x neighbours table; NDLB: 200",
    )
    captions: CaptionField = doc(
        "original", "Caption field trained on: original, a `finecap boost` field (blend/visual/holistic), world dense."
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        held_out = self.val_fraction + self.test_fraction
        check(held_out < 1.0, "data.val_fraction/data.test_fraction",
              f"their sum must be < 1 (train keeps the rest), got {held_out:g}")  # fmt: skip
        for end, size in self.bag_schedule.items():
            check(end >= 1, "data.bag_schedule", f"end epochs must be >= 1, got {end}")
            check(size == 0 or size >= 2, "data.bag_schedule", f"bag sizes must be 0 (random) or >= 2, got {size}")
            check_at_most(size, "data.bag_schedule", MAX_BAG, "images per bag; BagCurri grows bags from 3 to 7")


@dataclass
class RetrieverConfig(Section, name="retriever"):
    checkpoint: str = doc("", "CLIP checkpoint (HF name or local path); empty = train/reuse the world encoder preset.")
    preset: str = doc(
        "world-tiny", "Architecture of the world encoder: a name in finecap.models.world_encoder.PRESETS."
    )
    epochs: int = doc(
        10,
        "Contrastive training epochs of the world encoder.",
        ge=0,
        le=10_000,
        why="the world encoder trains 10 epochs by default",
    )
    batch_size: int = doc(
        64,
        "Batch size of world-encoder training (at least 2: the batch's other images are the negatives).",
        ge=2,
        le=MAX_BATCH,
        why="a batch x batch similarity matrix; twice CLIP's contrastive batch of 32,768",
    )
    lr: float = doc(2e-3, "Peak learning rate of world-encoder training.")
    aux_weight: float = doc(
        5.0, "Weight of the auxiliary scene-graph attribute loss (stands in for pretraining).", ge=0
    )
    dense_fraction: float = doc(
        0.5, "Share of each world-encoder batch also trained against its dense captions.", ge=0, le=1
    )
    batch_size_eval: int = doc(
        256,
        "Batch size when embedding images and texts.",
        ge=1,
        le=MAX_BATCH,
        why="images or texts per pass; twice CLIP's contrastive batch of 32,768",
    )
    long_text: LongText = doc(
        "truncate",
        "Texts longer than the text window (77 tokens for CLIP, 248 for Long-CLIP): cut to it, refused, or encoded "
        "as overlapping windows and pooled (docs/metrics.md#long-captions).",
    )


@dataclass
class ModelConfig(Section, name="model"):
    kind: str = doc(
        "clipcap",
        f"Captioner backbone: {', '.join(BACKBONES)} (docs/backbones.md; its options are in the section of the same "
        "name), or a dotted path 'pkg.module:Class' to one's own CaptionerBase subclass (docs/architecture.md).",
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


TINY_SIZES: dict[str, dict[str, Any]] = {
    "layers": {
        "default": 3,
        "ge": 1,
        "le": MAX_TINY_LAYERS,
        "why": "a world-tiny model trained from scratch; GPT-2 XL has 48 layers, 1,600 wide",
    },
    "hidden": {
        "default": 128,
        "ge": 1,
        "le": MAX_TINY_HIDDEN,
        "why": "a world-tiny model trained from scratch; GPT-2 XL has 48 layers, 1,600 wide",
    },
    "heads": {"default": 4, "ge": 1},
    "dropout": {"default": 0.1, "ge": 0, "lt": 1},
}
"""The default and bounds of each size of a backbone's world-tiny model (``<section>.tiny_<size>``), the same in
every backbone section (:func:`tiny`)."""


def tiny(size: str, text: str) -> Any:
    """The field ``tiny_<size>`` of a backbone section (its default and bounds: :data:`TINY_SIZES`), with its doc
    ``text`` (which model of the backbone the size is of)."""
    spec = dict(TINY_SIZES[size])
    return doc(spec.pop("default"), text, **spec)


class WorldTinySection(Section):
    """Base of the backbone sections that build a world-tiny model (fields ``tiny_*``: :func:`tiny`): its attention
    heads divide its hidden size (``<section>.tiny_heads``)."""

    tiny_hidden: int
    tiny_heads: int

    def __post_init__(self) -> None:
        super().__post_init__()
        name, hidden = self.section_name, self.tiny_hidden
        check(
            hidden % self.tiny_heads == 0, f"{name}.tiny_heads", f"must be >= 1 and divide {name}.tiny_hidden={hidden}"
        )


@dataclass
class ClipCapBackboneConfig(WorldTinySection, name="clipcap"):
    lm: str = doc(
        "world-tiny",
        "'world-tiny' (preset GPT-2 + world tokenizer), 'data-tiny' (the same over the training captions' words: "
        "one's own captions offline) or any AutoModelForCausalLM name/path.",
    )
    mapper: Mapper = doc("mlp", "Mapper from image features to the LM prefix.")
    prefix_length: int = doc(
        10,
        "Number of prefix embeddings k fed to the language model.",
        ge=1,
        le=1024,
        why="GPT-2's whole context; ClipCap: 10 or 40",
    )
    mapper_layers: int = doc(
        2, "Transformer mapper: number of layers.", ge=1, le=64, why="ClipCap's transformer mapper has 8"
    )
    mapper_heads: int = doc(
        8,
        "Transformer mapper: attention heads (must divide the LM hidden size).",
        ge=1,
        le=256,
        why="it must divide the LM's hidden size",
    )
    tiny_layers: int = tiny("layers", "lm=world-tiny/data-tiny: GPT-2 layers.")
    tiny_hidden: int = tiny("hidden", "lm=world-tiny: hidden size (n_embd).")
    tiny_heads: int = tiny("heads", "lm=world-tiny: attention heads (must divide clipcap.tiny_hidden).")
    tiny_dropout: float = tiny(
        "dropout", "lm=world-tiny: dropout of embeddings, residuals and attention (GPT-2's 0.1)."
    )


@dataclass
class BlipBackboneConfig(WorldTinySection, name="blip"):
    name: str = doc("world-tiny", "A BlipForConditionalGeneration name/path, or 'world-tiny' (the world BLIP).")
    tiny_layers: int = tiny("layers", "name=world-tiny: text decoder layers.")
    tiny_hidden: int = tiny("hidden", "name=world-tiny: text decoder hidden size.")
    tiny_heads: int = tiny("heads", "name=world-tiny: attention heads (must divide blip.tiny_hidden).")
    tiny_dropout: float = tiny(
        "dropout", "name=world-tiny: dropout of the text decoder's hidden states and attention."
    )


@dataclass
class VlmBackboneConfig(WorldTinySection, name="vlm"):
    name: str = doc(
        "HuggingFaceTB/SmolVLM-256M-Instruct",
        "An AutoModelForImageTextToText name/path of a supported family (docs/vlm.md: Qwen2/2.5/3-VL, SmolVLM, "
        "InternVL, Gemma 3, LLaVA, ...), or 'world-tiny' (world VLM).",
    )
    prompt: str = doc("Describe the image.", "The user's text after the image in the chat prompt.")
    train_projector: bool = doc(
        True, "Train the projector from vision tower to LM (as ClipCap's mapper, whatever else trains)."
    )
    processor_kwargs: dict[str, bool | int | float | str | dict[str, int]] = doc(
        {},
        "Keyword arguments of every processor call, the image-token budget: Qwen2-VL size: {longest_edge: pixels} "
        "(or max_pixels), Idefics3 (SmolVLM) do_image_splitting (docs/vlm.md); recorded in the checkpoint. Its keys "
        "win over those vlm.image_max_pixels maps to.",
    )
    image_max_pixels: int | None = doc(
        None,
        "Pixel budget per image (LLaMA-Factory's name), every crop/tile counted, mapped per family to its processor's "
        "option: Qwen max_pixels, SmolVLM longest_edge/splitting, LLaVA-NeXT grids, InternVL tiles (docs/vlm.md); "
        "null: the processor's own.",
        gt=0,
    )
    tiny_layers: int = tiny("layers", "name=world-tiny: Llama-style LM layers.")
    tiny_hidden: int = tiny("hidden", "name=world-tiny: LM hidden size.")
    tiny_heads: int = tiny("heads", "name=world-tiny: attention heads (must divide vlm.tiny_hidden).")


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
    section, _, name = target.partition(".")  # a dotted-path kind ('pkg.mod:Class') names no section
    cls = SECTIONS.get(section)
    return target if cls is not None and name in {f.name for f in dataclasses.fields(cls)} else None


TRACKERS = ("jsonl", "tensorboard", "wandb", "mlflow", "comet_ml", "aim", "clearml", "dvclive", "swanlab", "trackio")
"""Values of ``train.log_with``: finecap's ``jsonl`` (metrics.jsonl) and accelerate's trackers (``LoggerType``)."""


@dataclass
class TrainConfig(Section, name="train"):
    objective: str = doc("mle", "Objective name (see finecap.objectives) or a dotted import path 'pkg.mod:factory'.")
    init_from: str = doc(
        "",
        "Checkpoint directory to start from (empty = fresh model); a relative path is read from the working "
        "directory, else from <run.root> (demo/mle/checkpoints/best: the run of recipe demo/mle).",
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
        "loss", "Validation metric picking the best checkpoint ('loss' minimised, others maximised)."
    )
    log_every: int = doc(20, "Log training metrics every N steps.", ge=1)
    save_every: int = doc(0, "Save a resumable checkpoint every N steps (0 = at each evaluation).", ge=0)
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
                f"unknown tracker {short_repr(tracker)}; valid: {', '.join(TRACKERS)}",
            )


@dataclass
class DecodeConfig(Section, name="decode"):
    engine: Engine = doc(
        "finecap",
        "What generates: finecap's decoder (every backbone) or a colocated vLLM (VLMs; the vllm section; "
        "docs/scaling.md).",
    )
    strategy: DecodeStrategy = doc("greedy", "Decoding strategy.")
    max_length: int = doc(
        24,
        "Maximum generated tokens (EOS included).",
        ge=1,
        le=MAX_TOKENS,
        why="tokens per caption; dense VLM captions reach ~1,000, GPT-2 reads 1,024",
    )
    beam_size: int = doc(
        5, "Beam width for strategy=beam.", ge=1, le=100, why="captioning papers search 3 to 10 beams"
    )
    length_penalty: float = doc(1.0, "Beam score = logprob / length**length_penalty.")
    finished_beams: FinishedBeams = doc(
        "keep", "Beam search: keep a finished caption in its beam (ClipCap) or set it aside as transformers' generate."
    )
    early_stopping: EarlyStopping = doc(
        False, "generate's early_stopping (false, true or never) for decode.finished_beams=set_aside."
    )
    temperature: float = doc(1.0, "Sampling temperature.", gt=0)
    top_k: int = doc(0, "Sample from the k most likely tokens (0 = off).", ge=0)
    top_p: float = doc(1.0, "Nucleus sampling mass (1.0 = off).", gt=0, le=1)
    num_return_sequences: int = doc(1, "Captions returned per image.", ge=1, le=4096, why="captions kept per image")
    stop_at_period: bool = doc(False, "Also stop a caption at a period token.")
    batch_size: int = doc(
        128,
        "Sequences decoded at once: images x beams (beam) or x num_return_sequences (sample), at least one image; "
        f"decode.batch_size x decode.max_length at most {MAX_DECODE_POSITIONS:,} token positions (the decoder caches "
        "every position of every layer).",
        ge=1,
        le=MAX_BATCH,
        why="sequences decoded at once; twice CLIP's contrastive batch of 32,768",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        # decode.batch_size counts the sequences of a decoding batch (finecap.decode.chunk_images); beams and samples
        # never multiply it. (One image's rows, at most 100 beams or 4,096 samples x 4,096 tokens, stay far below.)
        positions = self.batch_size * self.max_length
        check(
            positions <= MAX_DECODE_POSITIONS,
            "decode.batch_size",
            f"decode.batch_size x decode.max_length = {positions:,} token positions in one decoding batch, more than "
            f"{MAX_DECODE_POSITIONS:,} (the decoder caches every position of every layer); lower decode.batch_size",
        )
        check(
            self.strategy != "beam" or self.num_return_sequences <= self.beam_size,
            "decode.num_return_sequences",
            "must be <= decode.beam_size for beam search",
        )
        check(
            self.strategy != "greedy" or self.num_return_sequences == 1,
            "decode.num_return_sequences",
            f"{self.num_return_sequences} needs decode.strategy=sample or beam (greedy decoding returns one "
            "caption per image)",
        )
        check(
            isinstance(self.early_stopping, bool) or self.early_stopping == "never",
            "decode.early_stopping",
            f"invalid value {self.early_stopping!r}; valid choices: false, true, never",
        )
        check(
            not (self.engine == "vllm" and self.strategy == "beam" and self.stop_at_period),
            "decode.stop_at_period",
            "vLLM's beam search (decode.engine=vllm) stops at EOS only; use decode.engine=finecap to stop beams at "
            "a period",
        )
        check(
            self.early_stopping is False or self.finished_beams == "set_aside",
            "decode.early_stopping",
            "is a setting of decode.finished_beams=set_aside (the keep rule ends when every beam has finished)",
        )


@dataclass
class VllmConfig(Section, name="vllm"):
    """The colocated vLLM engine of ``decode.engine=vllm`` (:mod:`finecap.engines.vllm`) and of boost's ``vllm``
    backend (:mod:`finecap.boost.vllm_backend`); TRL's knob names."""

    gpu_memory_utilization: float = doc(
        0.3, "Fraction of the GPU's memory vLLM takes for weights and KV cache (TRL's colocate default).", gt=0, le=1
    )
    max_model_len: int = doc(
        0,
        "Longest prompt + caption vLLM serves (0: the model's context length).",
        ge=0,
        le=1_048_576,
        why="tokens of context; the longest VLM contexts are ~1M",
    )
    tensor_parallel_size: int = doc(
        1, "GPUs one vLLM engine shards the model over.", ge=1, le=MAX_PROCESSES, why="GPUs of one engine"
    )
    kv_cache_memory_bytes: int = doc(
        0, "Bytes of KV cache (0: sized from gpu_memory_utilization; on a CPU vLLM's default).", ge=0
    )
    enforce_eager: bool = doc(
        True, "Run vLLM eagerly: no torch.compile or CUDA graphs (faster start; false for throughput on a GPU)."
    )


@dataclass
class EvalConfig(Section, name="eval"):
    metrics: list[str] = doc(
        [], "Metric groups of finecap eval; empty = what the references allow (caption metrics; image, world metrics)."
    )
    n_distractors: int = doc(99, "Random distractors per image for RD-N self-retrieval.", ge=1)
    draws: int = doc(
        3,
        "Random-distractor draws averaged.",
        ge=1,
        le=1000,
        why="each draw ranks every caption again; the papers average 3",
    )
    bag_sizes: list[int] = doc(
        [3, 5, 7],
        f"Bag sizes for TrueMatch-style bag retrieval, each 2 to {MAX_BAG} (images per bag; TrueMatch: 3-7).",
    )
    seed: int = doc(0, "Seed of distractor draws.")
    bag_similarity: Literal["query", "pairwise"] = doc(
        "query", "TrueMatch intra-bag similarity: query-to-members mean (NDLB Alg. 1) or mean over all pairs."
    )
    lm: str = doc("", "Causal LM (HF name or path) scoring caption perplexity; needed by the 'perplexity' metric.")
    instances: str = doc(
        "", "COCO instances_*.json of the hallucination metric (CHAIR) and the chair reward; finecap eval --instances."
    )
    batch_size: int = doc(
        64,
        "Captions per forward pass of the perplexity language model.",
        ge=1,
        le=MAX_BATCH,
        why="captions per forward pass; twice CLIP's contrastive batch of 32,768",
    )
    vocab_min_count: int = doc(5, "A word counts towards vocabulary usage when used at least this often (NDLB).", ge=1)
    meteor_backend: MeteorBackend = doc(
        "python", "METEOR: pure Python (no Java; reproduces the jar) or pycocoevalcap's jar itself (needs Java)."
    )
    meteor_max_words: int = doc(
        1000,
        "METEOR refuses a caption or reference of more words (its alignment time grows faster than the square).",
        ge=1,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check(all(s >= 2 for s in self.bag_sizes), "eval.bag_sizes", "bag sizes must be >= 2")
        check_at_most(max(self.bag_sizes, default=2), "eval.bag_sizes", MAX_BAG, "images per bag; TrueMatch: 3-7")


@dataclass
class SmileConfig(Section, name="smile"):
    subset: Subset = doc("sequence", "Softmax subset (SMILE Sec. 2.2, 3.4).")
    first_token: FirstToken = doc("mle", "Initial-context restriction (SMILE Sec. 3.3).")
    mle_weight: float = doc(0.0, "λ of Eq. 4: loss = λ·MLE + (1-λ)·SMILE.", ge=0, le=1)
    include_eos: bool = doc(True, "The end-of-sequence id belongs to the sequence subset (as in the paper's code).")
    shift_token_id: int | None = doc(None, "Alternative first-token id for first_token=shift.")
    random_k: int = doc(
        10,
        "Random ids per sequence for subset=random.",
        ge=1,
        le=262_144,
        why="more ids than the largest vocabularies (256k)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check(
            self.first_token != "shift" or self.shift_token_id is not None,
            "smile.shift_token_id",
            "must be set when smile.first_token=shift",
        )


@dataclass
class RLConfig(Section, name="rl"):
    rewards: dict[str, float] = doc(
        {"cider": 1.0},
        "Reward weights, R = sum w_i r_i (finecap.rewards.REWARDS names); each in [-1e6, 1e6], not all 0.",
    )
    baseline: Baseline = doc("greedy", "REINFORCE baseline of the reward.")
    samples: int = doc(
        5,
        "Captions decoded per image in training (s); greedy/beam decoding need 1.",
        ge=1,
        le=256,
        why="captions decoded per image; SCST: 5, GRPO-style: 8 to 64",
    )
    strategy: RLStrategy = doc("sample", "Training-time decoding (beam uses decode.*).")
    temperature: float = doc(
        1.0,
        "Sampling temperature of training-time decoding (NDLB: 0.3); vLLM raises T < 0.01 to 0.01, greedy is T -> 0.",
        ge=0.01,
        le=100,
        why="logits / T: beyond 100 sampling is uniform over the vocabulary",
    )
    logprob: LogProb = doc("sum", "log p(caption): sum of token log-probs or their per-token mean.")
    scaled_logprob: bool = doc(False, "Score log p under the temperature-scaled distribution (NDLB), not T = 1.")
    mean_momentum: float = doc(
        0.0, "baseline=mean: 0 = cumulative mean of past batch rewards, else EMA momentum.", ge=0, lt=1
    )
    entropy_coef: float = doc(
        0.0,
        "Max-entropy regularisation (SLL-ME): loss -= coef * mean token entropy.",
        ge=0,
        le=100,
        why="times a mean entropy of at most log V, 12 nats for 256k words; SLL-ME uses 0.01",
    )
    alpha: float = doc(
        0.75, "sle: weight of the precision term; the diversity term gets 1 - alpha (Eq. 8).", ge=0, le=1
    )
    distance: Distance = doc(
        "bleu34",
        "sle: caption distance: bleu34 = 1 - (BLEU-3 + BLEU-4) / 2 (the paper's); overlap34 = 1 - mean n-gram overlap "
        "(n = 3, 4) over the shorter caption's n-grams, length-neutral (finecap's ablation).",
    )
    diversity_baseline: DiversityBaseline = doc(
        "pairwise_mean", "sle: baseline of the diversity term (pairwise_mean: Sec. 4.3, zero-mean advantages)."
    )
    # The GRPO family (docs/methods/grpo.md; TRL's names in brackets). The defaults are the papers' REINFORCE.
    advantage: Advantage = doc(
        "baseline", "baseline: R - rl.baseline (the papers); group: GRPO's (R - group mean) / scale, per image."
    )
    scale_rewards: ScaleRewards = doc(
        "group", "advantage=group: divide by the std of the image's group, of the batch, or not (Dr. GRPO) [same]."
    )
    reward_aggregation: RewardAggregation = doc(
        "sum_then_normalize",
        "advantage=group: normalise the weighted sum, or each reward within its group, then sum (GDPO) "
        "[multi_objective_aggregation].",
    )
    policy_loss: PolicyLoss = doc(
        "reinforce", "reinforce: -A log p (rl.logprob); clipped: GRPO/PPO's clipped ratio surrogate [loss_type]."
    )
    iterations: int = doc(
        1,
        "clipped: optimizer steps per rollout batch; each global batch is taken this many times [num_iterations].",
        ge=1,
        le=64,
        why="optimizer steps on one rollout batch; PPO and GRPO use 1 to 10",
    )
    clip_low: float = doc(0.2, "clipped: the ratio's lower clip is 1 - clip_low [epsilon].", ge=0, lt=1)
    clip_high: float = doc(
        0.2,
        "clipped: the ratio's upper clip is 1 + clip_high; DAPO: 0.28 [epsilon_high].",
        ge=0,
        le=100,
        why="a probability ratio clipped at 1 + 100 is unclipped in practice; PPO/GRPO use 0.2, DAPO 0.28",
    )
    importance: Importance = doc(
        "token", "clipped: ratio per token, or per caption from its mean log-ratio (GSPO) [importance_sampling_level]."
    )
    loss_aggregation: LossAggregation = doc(
        "sequence",
        "clipped: mean per caption then over captions; mean over all tokens; / (captions x decode.max_length) "
        "[loss_type grpo; bnpo, dapo; dr_grpo].",
    )
    kl_coef: float = doc(
        0.0,
        "clipped: beta of the k3 KL to the starting policy, per token; 0 = no reference [beta].",
        ge=0,
        le=100,
        why="the KL term would swamp every advantage: TRL's beta is 0 or 0.04, RLHF's 0.001 to 0.2",
    )
    disable_dropout: bool = doc(
        False,
        "Set every dropout module of the policy to p = 0 for the RL objective, so GRPO's ratios and KL carry no "
        "dropout noise (rollouts and the reference run in eval mode) [disable_dropout].",
    )
    kl_bias_correction: bool = doc(
        True,
        "clipped: multiply the per-token KL by the importance ratio (TRL 1.16's default) [use_bias_correction_kl].",
    )
    vllm_is_correction: bool = doc(
        True,
        "decode.engine=vllm: weigh each token of the loss by the truncated importance ratio of the trainer's "
        "log-prob to vLLM's (docs/scaling.md) [vllm_importance_sampling_correction].",
    )
    vllm_is_cap: float = doc(
        3.0,
        "decode.engine=vllm: the importance ratio's cap, C >= 1 (truncation; TRL's default) "
        "[vllm_importance_sampling_clip_max].",
        ge=1,
        le=1000,
        why="a cap on the importance ratio of two nearly equal policies; TRL's is 3",
    )
    alarms: dict[str, float] = doc(
        {},
        "Reward-hacking alarms, measure -> threshold (length_drift, repetition, distinct, fact_precision/recall; kl: "
        "the step's KL to the starting policy, with rl.kl_coef > 0).",
    )
    alarm_action: AlarmAction = doc(
        "warn", "What a crossed rl.alarms threshold does: log a warning, or stop training."
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check(bool(self.rewards), "rl.rewards", "needs at least one reward, e.g. {cider: 1.0}")
        for name, weight in self.rewards.items():
            check(
                isinstance(weight, int | float) and not isinstance(weight, bool),
                f"rl.rewards.{name}",
                f"must be a number, got {short_repr(weight)}",
            )
            check(
                abs(weight) <= MAX_REWARD_WEIGHT,
                f"rl.rewards.{name}",
                f"must be in [-{MAX_REWARD_WEIGHT:g}, {MAX_REWARD_WEIGHT:g}], got {short_repr(weight, 30)} (a weight "
                "scales its reward as train.lr a step, and rewards times weights are summed in float32; the papers' "
                "are 0.5 to 1)",
            )
            check(
                weight == 0 or abs(weight) >= FLOAT32_TINY,
                f"rl.rewards.{name}",
                f"{short_repr(weight)} is 0 in float32, in which rewards are weighted; use 0 or a larger weight",
            )
        check(
            any(w != 0 for w in self.rewards.values()),
            "rl.rewards",
            "every weight is 0, so every caption's reward is 0 and nothing is learnt; give a reward a nonzero weight",
        )
        check(
            self.advantage != "group" or self.samples >= 2,
            "rl.samples",
            "must be >= 2 with rl.advantage=group (an image's samples are its group)",
        )
        for key, default in (("scale_rewards", "group"), ("reward_aggregation", "sum_then_normalize")):
            check(
                self.advantage == "group" or getattr(self, key) == default,
                f"rl.{key}",
                "is an option of group advantages: set rl.advantage=group as well",
            )
        check(
            self.reward_aggregation == "sum_then_normalize" or self.scale_rewards == "group",
            "rl.scale_rewards",
            "is not used with rl.reward_aggregation=normalize_then_sum (each reward is scaled by its group's std, "
            "their sum by the batch's)",
        )
        for key, unused in (("iterations", self.iterations == 1), ("kl_coef", self.kl_coef == 0)):
            check(unused or self.policy_loss == "clipped", f"rl.{key}", "needs rl.policy_loss=clipped")
        measures = get_args(AlarmMeasure)
        for measure, threshold in self.alarms.items():
            check(
                measure in measures,
                "rl.alarms",
                f"unknown measure {short_repr(measure)}; valid: {', '.join(measures)}",
            )
            number = isinstance(threshold, int | float) and not isinstance(threshold, bool)
            drift = measure in ("length_drift", "kl")  # a relative change or a KL, any size; the others are shares
            check(
                number and (threshold > 0 if drift else 0 <= threshold <= 1),
                f"rl.alarms.{measure}",
                f"must be {'> 0' if drift else 'in [0, 1]'}, got {short_repr(threshold)}",
            )
        check(
            "kl" not in self.alarms or self.kl_coef > 0,
            "rl.alarms.kl",
            "needs rl.kl_coef > 0 (the KL to the starting policy is computed only with its penalty)",
        )
        check(
            self.strategy == "sample" or self.samples == 1,
            "rl.samples",
            f"must be 1 with rl.strategy={self.strategy} (deterministic decoding gives one caption per image)",
        )
        check(
            self.baseline != "leave_one_out" or self.samples >= 2,
            "rl.samples",
            "must be >= 2 with rl.baseline=leave_one_out (the other samples of the image are the baseline)",
        )
        check(
            not (self.baseline == "greedy" and self.strategy == "greedy"),
            "rl.baseline",
            "greedy with rl.strategy=greedy makes every advantage 0; use mean, or decode with sample/beam",
        )


@dataclass
class SRConfig(Section, name="sr"):
    reward: SRReward = doc(
        "log_prob", "Self-retrieval reward: log-softmax of the target (NDLB Eq. 1), top-1 hit, or cosine alone."
    )
    distractors: Distractors = doc(
        "batch", "Distractors: other images of the global batch, bag-mates only, or k mined + in-batch random."
    )
    hard_k: int = doc(
        5,
        "distractors=hard: nearest training images (retriever image cosine) per target (D.2: 5/10).",
        ge=1,
        le=MAX_BAG,
        why="mined distractors per target; DiscriTune D.2: 5 or 10",
    )
    duplicate_threshold: float | None = doc(
        None,
        "Drop distractors whose image cosine to the target exceeds this (near-duplicates); null = keep all.",
        ge=-1,
        le=1,
    )
    logit_scale: float = doc(
        0.0,
        "Similarity scale of the log-softmax; 0 = the retriever's own exp(logit_scale).",
        ge=0,
        le=1000,
        why="CLIP clamps its own scale at 100; cosines times a larger one make every log-softmax 0 or -inf",
    )


@dataclass
class LoraConfig(Section, name="lora"):
    lm: bool = doc(False, "Train the language model through LoRA adapters (needs model.train_lm=true).")
    encoder: bool = doc(False, "Train the vision encoder through LoRA adapters (needs model.train_encoder=true).")
    rank: int = doc(
        32,
        "LoRA rank r (NDLB: 32 on GPT-2 and CLIP).",
        ge=1,
        le=4096,
        why="a rank beyond the layer's width adapts nothing more",
    )
    alpha: float = doc(32.0, "LoRA alpha; the update is scaled by alpha / rank.", gt=0)
    dropout: float = doc(0.0, "Dropout on the LoRA input.", ge=0, lt=1)
    init: LoraInit = doc(
        "kaiming",
        "Adapter initialisation: kaiming (peft's default: B = 0, A Kaiming-uniform), gaussian (peft: A with std 1/r), "
        "normal (NDLB's released code: the weight's column-side factor N(0, 1), the other 0).",
    )
    lm_targets: list[str] = doc([], "LM module names (suffixes) to adapt; empty = every linear layer but the head.")
    encoder_targets: list[str] = doc([], "Encoder module names (suffixes); empty = every image-side linear layer.")


@dataclass
class BagsConfig(Section, name="bags"):
    text_from: CaptionField = doc(
        "original", "Captions whose mean text embedding builds TrueMatch bags (NDLB: holistic, from `finecap boost`)."
    )
    keep_hardest: float = doc(
        1.0,
        "Share of the curated bags kept, highest intra-bag similarity first (NDLB kept 254 of 680; demo: 1/3).",
        gt=0,
        le=1,
    )


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
class BoostConfig(Section, name="boost"):
    mode: BoostMode = doc(
        "holistic", "Captions `finecap boost` writes: BlendCap, VisualCap or HolisticCap (NDLB Sec. 2)."
    )
    llm_backend: BoostBackend = doc(
        "world", "LLM backend (blend, holistic): openai-compatible server, transformers, vllm (in-process), world."
    )
    llm_model: str = doc("", "LLM model name (openai: served name; transformers, vllm: HF name or path).")
    llm_base_url: str = doc("", "openai: server URL, e.g. http://localhost:8000/v1; empty = env OPENAI_BASE_URL.")
    llm_api_key_env: str = doc("OPENAI_API_KEY", "openai: environment variable holding the LLM server's API key.")
    llm_api_key: str = doc("", "Deprecated (use llm_api_key_env): API key given in the config; never written out.")
    vlm_backend: BoostBackend = doc(
        "world", "VLM backend (visual): openai-compatible server, transformers, vllm (in-process), world."
    )
    vlm_model: str = doc(
        "runs/visual_expert/checkpoints/best", "VLM name or path (world: the visual-expert ClipCap checkpoint)."
    )
    vlm_base_url: str = doc("", "openai: VLM server URL; empty = env OPENAI_BASE_URL.")
    vlm_api_key_env: str = doc("OPENAI_API_KEY", "openai: environment variable holding the VLM server's API key.")
    vlm_api_key: str = doc("", "Deprecated (use vlm_api_key_env): API key given in the config; never written out.")
    concurrency: int = doc(
        8, "openai: requests in flight at once.", ge=1, le=1024, why="requests in flight, one thread each"
    )
    timeout: float = doc(120.0, "openai: seconds before a request times out (then retried).", gt=0)
    retries: int = doc(
        3,
        "Retries of a failed request or malformed/empty answer before the image is logged as failed.",
        ge=0,
        le=100,
        why="each retry waits; a failing server would hold the run",
    )
    retry_max_wait: float = doc(
        60.0,
        "openai: longest wait before a retry, s; a server asking (Retry-After) for longer fails the request.",
        ge=0,
    )
    max_failure_rate: float = doc(
        0.01,
        "Failure budget: the run stops, exit 2, once more than this fraction of the images to boost failed.",
        ge=0,
        le=1,
    )
    max_consecutive_failures: int = doc(
        10, "The run stops, exit 2, after this many requests in a row failed to reach the server.", ge=1
    )
    prompts: str = doc("", "Prompt file (YAML) overriding the default templates, or 'ndlb' (the paper's prompts).")
    few_shot: bool = doc(True, "Prepend the prompts' few-shot examples to each request.")
    batch_size: int = doc(
        8, "transformers, vllm: prompts generated per batch.", ge=1, le=4096, why="prompts generated at once"
    )
    max_new_tokens: int = doc(
        120,
        "openai/transformers/vllm: most tokens generated per answer.",
        ge=1,
        le=32_768,
        why="a caption rewrite takes ~200 tokens",
    )
    temperature: float = doc(0.0, "openai/transformers/vllm: sampling temperature (0 = greedy).", ge=0)
    limit: int = doc(0, "Boost only the first N images (0 = all); the rest keep their human captions.", ge=0)

    def __post_init__(self) -> None:
        super().__post_init__()
        for role in ("llm", "vlm"):
            problem = _http_url_problem(getattr(self, f"{role}_base_url"))
            check(problem is None, f"boost.{role}_base_url", str(problem))
            check(bool(getattr(self, f"{role}_api_key_env")), f"boost.{role}_api_key_env", "must name a variable")


@dataclass
class DemoConfig(Section, name="demo"):
    stages: list[str] = doc(
        ["world", "retriever", "mle", "blip_mle", "vlm_mle", "sr_bagcurri", "scst", "grpo_sr_cider", "smile", "sle",
         "discritune", "blip_smile", "vlm_smile", "report"],
        "Demo stages to run, in order (optional: mle_continued, scst_me, blip_discritune, vlm_discritune, vcb, ...).",
    )  # fmt: skip
    quick: bool = doc(False, "Tiny settings that finish in about two minutes (used by tests).")
    force: bool = doc(False, "Re-run stages even when their outputs exist.")
    jobs: int = doc(
        0,
        "Training stages no other stage starts from, run side by side (0 = cores // demo.stage_threads).",
        ge=0,
        le=MAX_PROCESSES,
        why="each job is a process",
    )
    stage_threads: int = doc(
        1,
        "Torch threads of each such stage, whatever demo.jobs (so results do not depend on the job count).",
        ge=1,
        le=MAX_PROCESSES,
        why="torch threads of each stage",
    )


@dataclass
class Config:
    """The whole configuration: one field per section, named like the section (:data:`SECTIONS` is read from these
    fields). A registered backbone (:data:`finecap.registry.BACKBONES`) with options of its own has a section named
    like its kind here (``clipcap``, ``blip``, ``vlm``), which its ``build(cfg)`` reads beside ``model``. A backbone
    given by a dotted path (``model.kind=pkg.module:Class``) has no section: its ``build(cfg)`` reads ``model`` (and
    any section it wants), and options of its own are its class's to hold until it is registered with a section.
    """

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
    vllm: VllmConfig = field(default_factory=VllmConfig)
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


SECTIONS: dict[str, type[Section]] = {f.name: f.default_factory for f in dataclasses.fields(Config)}  # type: ignore[misc]
"""``{name: section class}``, in the order of :class:`Config`'s fields, from which it is read."""
