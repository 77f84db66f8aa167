"""Name -> object registries with a dotted-path escape hatch for user code (objectives, rewards, samplers,
validators, backbones, generation engines, data set formats and metric groups all use it: :func:`lookup`,
:func:`import_object`).

Example::

    >>> lookup("json:dumps", {}, "my.option", "encoder") is __import__("json").dumps
    True
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Collection, Mapping
from typing import Any

# The name tables. They live here, torch-free, so that the configuration can check names when it is loaded
# (finecap.config) without importing the objectives, rewards or models; each package re-exports its own table.
OBJECTIVES: dict[str, str] = {
    "mle": "finecap.objectives.mle:build",
    "smile": "finecap.objectives.smile:build",
    "reinforce": "finecap.objectives.grpo:build",
    "grpo": "finecap.objectives.grpo:build",
    "scst_me": "finecap.objectives.grpo:build_max_entropy",
    "sle": "finecap.objectives.exploration:build",
}
"""``train.objective`` names -> factories ``factory(cfg) -> objective``. ``grpo`` and ``reinforce`` are one factory:
REINFORCE/SCST with the ``grpo`` section's defaults, the GRPO family with its options (``reinforce`` is the name the
GRPO recipes had before the ``grpo`` section; the same configuration trains bit for bit the same under either)."""
RL_OBJECTIVES = ("reinforce", "grpo", "scst_me", "sle")
"""The objectives that decode ``rl.samples`` captions per image and reward them: the readers of the ``rl`` section
(``mle`` and ``smile`` read none of it)."""
GRPO_OBJECTIVES = ("reinforce", "grpo", "scst_me")
"""The objectives built by ``finecap.objectives.grpo``: the readers of the ``grpo`` section (``sle`` only refuses its
GRPO-family options)."""

REWARDS: dict[str, str] = {
    "cider": "finecap.rewards.cider:build",
    "retrieval": "finecap.rewards.retrieval:build",
    "listener": "finecap.rewards.listener:build",
    "chair": "finecap.rewards.chair:build",
    "qa_utility": "finecap.rewards.qa_utility:build",
    "claims": "finecap.rewards.claims:build",
    "length": "finecap.rewards.length:build",
}
"""``rl.rewards`` names -> factories ``factory(cfg, **options) -> reward``, for the training loop and every adapter
(:mod:`finecap.rewards`)."""

JUDGES: dict[str, str] = {
    "world": "finecap.judges.world:build",
    "openai": "finecap.judges.openai:build",
    "vllm": "finecap.judges.vllm:build",
}
"""``judge.name`` names -> factories ``factory(cfg, **options) -> Judge`` (:mod:`finecap.judges`): the judge the
judge-backed rewards and metrics ask."""

SAMPLERS: dict[str, str] = {
    "random": "finecap.data.samplers:random_sampler",
    "bagcurri": "finecap.data.bags:bagcurri_sampler",
}
"""``data.sampler`` names -> factories ``factory(cfg, dataset, global_batch_size)``."""

BACKBONES: dict[str, str] = {
    "clipcap": "finecap.models.clipcap:ClipCap",
    "blip": "finecap.models.blip:Blip",
    "vlm": "finecap.models.vlm:Vlm",
}
"""``model.kind`` names -> captioner classes (subclasses of :class:`finecap.models.base.CaptionerBase`, which build a
fresh captioner, ``cls.build(cfg)``, and load a saved one, ``cls.from_checkpoint(path)``); a backbone's own options,
when it has any, are the configuration section named like it (``cfg.clipcap``). Resolved by
:func:`finecap.models.backbones.backbone`."""

ENGINES: dict[str, str] = {
    "finecap": "finecap.engines.finecap:FinecapEngine",
    "vllm": "finecap.engines.vllm:VllmEngine",
}
"""``decode.engine`` names -> :class:`~finecap.engines.base.GenerationEngine` subclasses (what decodes a captioner's
captions: finecap's own decoder, a colocated vLLM); resolved by :func:`finecap.engines.base.engine_class`."""

DATA_FORMATS: dict[str, str] = {
    "world": "finecap.data.formats.world:FORMAT",
    "hf": "finecap.data.formats.hf:FORMAT",
    "folder": "finecap.data.formats.folder:FORMAT",
    "messages": "finecap.data.formats.messages:FORMAT",
    "jsonl": "finecap.data.formats.jsonl:FORMAT",
    "coco": "finecap.data.formats.coco:FORMAT",
    "karpathy": "finecap.data.formats.karpathy:FORMAT",
}
"""``data.format`` names -> :class:`~finecap.data.formats.Format` specs (how a data set of the format is detected,
read and fingerprinted), in the order format detection tries them (:func:`finecap.data.formats.detect_format`);
resolved by :func:`finecap.data.formats.data_format`."""

PREDICTION_FORMATS: dict[str, str] = {
    "lmms-eval": "finecap.data.predictions.lmms_eval:FORMAT",
    "llamafactory": "finecap.data.predictions.llamafactory:FORMAT",
    "swift": "finecap.data.predictions.swift:FORMAT",
    "vlmevalkit": "finecap.data.predictions.vlmevalkit:FORMAT",
    "coco": "finecap.data.predictions.coco:FORMAT",
}
"""``finecap eval --predictions-format`` names -> :class:`~finecap.data.predictions.PredictionFormat` specs (how
another toolkit's prediction file is recognised and read); the last row reads what no other recognises."""

HUB_DATA_FORMATS: frozenset[str] = frozenset({"hf"})
"""The formats of :data:`DATA_FORMATS` whose ``data.path`` may be a Hub name rather than a local file (their
``Format.hub_names``): what the configuration, which imports no format, needs to know of them to store such a path
as written (:mod:`finecap.config.paths`)."""

VALIDATORS: dict[str, str] = {
    "captions": "finecap.train.validators:caption_stats_validator",
    "retrieval": "finecap.train.validators:retrieval_validator",
    "cider": "finecap.train.validators:cider_validator",
}
"""``train.validators`` names -> factories ``factory(cfg) -> validator`` (:mod:`finecap.train.validators`); the values
each validator returns are :data:`VALIDATOR_KEYS`."""

VALIDATOR_KEYS: dict[str, tuple[str, ...]] = {
    "captions": ("length", "vocab"),
    "retrieval": ("r@1", "length", "vocab"),
    "cider": ("cider_d", "length", "vocab"),
}
"""``train.validators`` names (:data:`VALIDATORS`) -> the values each returns; with the
loop's own ``loss`` and ``perplexity`` they are what ``train.best_metric`` may name."""

METRIC_GROUPS: dict[str, str] = {
    "bleu": "finecap.metrics.groups:BLEU",
    "rouge": "finecap.metrics.groups:ROUGE",
    "cider": "finecap.metrics.groups:CIDER",
    "meteor": "finecap.metrics.groups:METEOR",
    "spice": "finecap.metrics.groups:SPICE",
    "length": "finecap.metrics.groups:LENGTH",
    "vocab": "finecap.metrics.groups:VOCAB",
    "diversity": "finecap.metrics.groups:DIVERSITY",
    "faithfulness": "finecap.metrics.groups:FAITHFULNESS",
    "retrieval": "finecap.metrics.groups:RETRIEVAL",
    "bags": "finecap.metrics.groups:BAGS",
    "clipscore": "finecap.metrics.groups:CLIPSCORE",
    "perplexity": "finecap.metrics.groups:PERPLEXITY",
    "listener": "finecap.metrics.groups:LISTENER",
    "hallucination": "finecap.metrics.groups:HALLUCINATION",
    "qa": "finecap.metrics.judged:QA",
    "claims": "finecap.metrics.judged:CLAIMS",
    "clair": "finecap.metrics.judged:CLAIR",
}
"""``eval.metrics`` / ``finecap eval --metrics`` names -> :class:`~finecap.metrics.group.MetricGroup` records (their
computation, inputs and columns with each one's direction: :mod:`finecap.metrics.groups`)."""


def declared_needs(component: Any) -> frozenset[str]:
    """What a component (objective, reward, sampler or validator factory) declares it needs prepared before it is
    built or set up, from its optional ``needs`` attribute (``{"retriever"}``: the CLIP retriever of
    ``retriever.*``, i.e. the world encoder when ``retriever.checkpoint`` is empty). The one place that reads it."""
    return frozenset(getattr(component, "needs", ()))


def requires(*needs: str) -> Any:
    """Decorator declaring what a component factory needs (:func:`declared_needs`)::

    >>> @requires("retriever")
    ... def factory(cfg): ...
    >>> sorted(declared_needs(factory))
    ['retriever']
    """

    def mark(obj: Any) -> Any:
        obj.needs = frozenset(needs)
        return obj

    return mark


TRUST_ENV = "FINECAP_TRUSTED_CODE"
"""Environment variable: comma-separated dotted paths of one's own code (a backbone, objective, reward, engine, ...)
that a stored configuration or checkpoint may name (:func:`trusted_code`)."""
LEGACY_TRUST_ENV = "FINECAP_TRUSTED_BACKBONES"
"""The name :data:`TRUST_ENV` had when it covered backbones only; still read."""


def trusted_code() -> frozenset[str]:
    """The dotted paths :data:`TRUST_ENV` (and :data:`LEGACY_TRUST_ENV`) name. A run folder is data, never code
    (docs/reliability.md): a dotted path read from one is imported only when the user names it, in what they typed
    or here."""
    names = ",".join(os.environ.get(env, "") for env in (TRUST_ENV, LEGACY_TRUST_ENV))
    return frozenset(k.strip() for k in names.split(",") if k.strip())


def untrusted_code(name: str, named: Collection[str] = ()) -> bool:
    """Whether ``name``, read from data (a checkpoint, a bags file), is code of one's own that the user has not named:
    a dotted path neither in ``named`` (what the caller's own configuration says) nor in :func:`trusted_code`."""
    return is_dotted_path(name) and name not in named and name not in trusted_code()


def is_dotted_path(name: str) -> bool:
    """Whether ``name`` is user code given as ``"pkg.module:attribute"`` (checked when it is imported)."""
    return ":" in name


def import_object(path: str, option: str) -> Any:
    """Import ``"pkg.module:attribute"``; errors name ``option`` (the config key that holds the path)."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{option}: {path!r} is not a dotted path of the form 'pkg.module:factory'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{option}: cannot import module {module_name!r} of {path!r}: {e}") from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"{option}: module {module_name!r} has no attribute {attr!r}") from None


def lookup(name: str, registry: Mapping[str, str], option: str, kind: str) -> Any:
    """The object registered as ``name`` (``registry`` maps names to ``"pkg.module:attr"``), or the dotted path
    ``name`` itself; an unknown name raises ``ValueError`` naming ``option`` and listing the valid names."""
    if ":" in name:
        return import_object(name, option)
    if name not in registry:
        raise ValueError(
            f"{option}: unknown {kind} {name!r}; valid names: {', '.join(sorted(registry))} "
            "(or a dotted path 'pkg.module:factory')"
        )
    return import_object(registry[name], option)
