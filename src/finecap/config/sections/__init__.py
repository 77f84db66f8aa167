"""The configuration's sections, one module per owner: one dataclass per section (one per backbone), each field one
line with its default, its doc and its own bounds (:func:`~finecap.config.fields.doc`), checked when the section is
built; cross-field checks in each section's ``__post_init__``, and checks across sections in its ``check_config``,
name the key to change. :class:`Config` (here) holds one of each.

A component takes its section (``SmileObjective(cfg.smile)``, ``ClipCap(..., cfg.clipcap)``): an option is one field
line in its section's module and its uses there, and a section built by hand is checked as one read from a recipe.
``from finecap.config.sections import X`` (and ``from finecap.config import X``) reaches every name of every module.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from finecap.config.fields import Section
from finecap.config.paths import absolute_path_values
from finecap.config.secrets import redacted
from finecap.config.sections.backbones import BlipBackboneConfig, ClipCapBackboneConfig, Mapper, VlmBackboneConfig
from finecap.config.sections.bags import BagsConfig
from finecap.config.sections.boost import BoostBackend, BoostConfig, BoostMode
from finecap.config.sections.choices import CaptionField
from finecap.config.sections.data import DataConfig, HfDataConfig
from finecap.config.sections.decode import DecodeConfig, DecodeStrategy, EarlyStopping, FinishedBeams
from finecap.config.sections.demo import DemoConfig
from finecap.config.sections.eval import EvalConfig, MeteorBackend
from finecap.config.sections.grpo import (
    Advantage,
    GRPOConfig,
    Importance,
    LossAggregation,
    PolicyLoss,
    RewardAggregation,
    ScaleRewards,
)
from finecap.config.sections.judge import JudgeConfig
from finecap.config.sections.limits import (
    DEFAULT_MAX_ASPECT_RATIO,
    DEFAULT_MAX_IMAGE_PIXELS,
    MAX_BAG,
    MAX_BATCH,
    MAX_DECODE_POSITIONS,
    MAX_PROCESSES,
    MAX_SPLIT,
    MAX_TINY_HIDDEN,
    MAX_TINY_LAYERS,
    MAX_TOKENS,
    PIL_MAX_IMAGE_PIXELS,
)
from finecap.config.sections.lora import LoraConfig, LoraInit
from finecap.config.sections.model import AttnImplementation, ModelConfig, Quantization, TrainableDtype, WeightsDtype
from finecap.config.sections.moved import ADDED_KEYS, MOVED_KEYS, moved_key, renamed_key
from finecap.config.sections.retriever import LongText, RetrieverConfig
from finecap.config.sections.rl import AlarmAction, AlarmMeasure, Baseline, LogProb, RLConfig, RLStrategy
from finecap.config.sections.run import RunConfig
from finecap.config.sections.sle import Distance, DiversityBaseline, SLEConfig
from finecap.config.sections.smile import FirstToken, ShiftForm, SmileConfig, Subset
from finecap.config.sections.sr import Distractors, SRConfig, SRReward
from finecap.config.sections.train import TRACKERS, Schedule, TrainConfig
from finecap.config.sections.vllm import VllmConfig, VllmDtype
from finecap.config.sections.world import WorldConfig, WorldShift

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
    "EvalConfig",
    "FinishedBeams",
    "FirstToken",
    "GRPOConfig",
    "HfDataConfig",
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
    "ADDED_KEYS",
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
    "SLEConfig",
    "SRConfig",
    "SRReward",
    "ScaleRewards",
    "Schedule",
    "SmileConfig",
    "ShiftForm",
    "Subset",
    "TRACKERS",
    "TrainConfig",
    "TrainableDtype",
    "VlmBackboneConfig",
    "VllmConfig",
    "VllmDtype",
    "WeightsDtype",
    "WorldConfig",
    "WorldShift",
    "moved_key",
    "renamed_key",
]


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
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    sle: SLEConfig = field(default_factory=SLEConfig)
    sr: SRConfig = field(default_factory=SRConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    demo: DemoConfig = field(default_factory=DemoConfig)
    bags: BagsConfig = field(default_factory=BagsConfig)
    boost: BoostConfig = field(default_factory=BoostConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)

    def __post_init__(self) -> None:
        # the checks across sections, each owned by a section (Section.check_config)
        for f in dataclasses.fields(self):
            getattr(self, f.name).check_config(self)

    def to_dict(self, redact: bool = False) -> dict[str, dict[str, Any]]:
        """``{section: {key: value}}``; ``redact=True`` masks every secret (:func:`redacted`), as wherever a
        configuration leaves the process: files, stdout, experiment trackers."""
        data = dataclasses.asdict(self)
        return redacted(data) if redact else data

    def save(self, path: str | Path) -> None:
        """Write the resolved configuration as YAML (atomically). Relative paths are written absolute
        (:func:`~finecap.config.paths.absolute_paths`), so the stored file means the same from any working
        directory."""
        from finecap.utils.files import atomic_write_text

        atomic_write_text(path, self.to_yaml())

    def to_yaml(self) -> str:
        """What :meth:`save` writes: :meth:`saved_dict` as YAML (``yaml.safe_dump``, keys in order), rendered once
        for the same data (:func:`_saved_yaml`: a run saves it with every checkpoint)."""
        return _saved_yaml(self.saved_dict())

    def saved_dict(self) -> dict[str, dict[str, Any]]:
        """What :meth:`save` writes (and trackers receive): relative paths made absolute against the working
        directory, secrets masked (``absolute_paths(cfg).to_dict(redact=True)``, without building and checking the
        absolute configuration: :func:`~finecap.config.paths.absolute_path_values` of :meth:`to_dict`)."""
        return redacted(absolute_path_values(self.to_dict(), os.getcwd()))


_RENDERED: tuple[str, str] = ("", "")
"""The last data :func:`_saved_yaml` rendered (its ``repr``) and its YAML."""


def _saved_yaml(data: dict[str, dict[str, Any]]) -> str:
    """``yaml.safe_dump(data, sort_keys=False)``, remembered for the last ``data`` rendered: PyYAML's pure-Python
    emitter takes ~5 ms of CPU for a configuration (a third of a tiny model's checkpoint save), which a run wrote with
    each of its checkpoints. The key is the whole
    ``data``'s ``repr``, which tells apart every two values ``safe_dump`` writes differently (``1``, ``1.0`` and
    ``True``; ``0.0`` and ``-0.0``; the order of the keys), so a configuration changed in any way, or whose paths
    read otherwise (another working directory, a folder made since), is rendered again; ``data`` holds no object
    twice (:meth:`Config.saved_dict` builds fresh containers), so ``safe_dump`` writes no anchors whose placement
    the ``repr`` would not show."""
    global _RENDERED
    key = repr(data)
    last = _RENDERED
    if last[0] != key:
        last = _RENDERED = (key, yaml.safe_dump(data, sort_keys=False))
    return last[1]


SECTIONS: dict[str, type[Section]] = {f.name: f.default_factory for f in dataclasses.fields(Config)}  # type: ignore[misc]
"""``{name: section class}``, in the order of :class:`Config`'s fields, from which it is read."""
