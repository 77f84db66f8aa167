"""The captioner backbones (``model.kind``) and loading any captioner checkpoint.

A backbone is one class on :class:`finecap.models.base.CaptionerBase` (the captioner contract: the base writes every
member that does not depend on the backbone, the class writes its hooks) that builds itself from the configuration
(``cls.build(cfg)``) and reads back the folders its ``save`` writes (``cls.from_checkpoint``). It is named by one row
of :data:`finecap.registry.BACKBONES` (``"clipcap": "finecap.models.clipcap:ClipCap"``), checked when the
configuration is loaded, or, for one's own, by its dotted path (``model.kind=pkg.module:Class``, no row needed).
``captioner.json`` records the kind (the class's ``kind``: its row's name, or its dotted path; ``clipcap`` when
absent), which :func:`load_captioner` resolves the same way. Each registered backbone reads ``model`` (what every
captioner has) and, when it has options of its own, the section named like its kind (``clipcap``, ``blip``, ``vlm``;
see :class:`finecap.config.Config` for a backbone given by dotted path). The recipe for adding one is in
``docs/architecture.md`` ("How to add a backbone"); ``tests/helpers/toy_backbone.py`` follows it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from finecap.models.base import CONFIG_NAME, CaptionerBase, read_meta, same_source
from finecap.models.world_encoder_cache import encoder_dir
from finecap.registry import BACKBONES, TRUST_ENV, lookup, untrusted_code
from finecap.runs import CheckpointError, swap_guard

if TYPE_CHECKING:
    from finecap.config import Config

log = logging.getLogger(__name__)


def backbone(kind: str, option: str = "model.kind", what: str = "backbone") -> type[CaptionerBase]:
    """The captioner class of ``kind``: a name of :data:`~finecap.registry.BACKBONES` or a dotted path
    ``pkg.module:Class`` (imported). A ``ValueError`` names ``option`` (the key or file that gave ``kind``, which
    calls it ``what``) when it is unknown or not a :class:`~finecap.models.base.CaptionerBase` subclass."""
    cls = lookup(kind, BACKBONES, option, what)
    if not (isinstance(cls, type) and issubclass(cls, CaptionerBase)):
        raise ValueError(f"{option}: {kind!r} is not a captioner class (a finecap.models.base.CaptionerBase)")
    return cls


def build_model(cfg: Config) -> CaptionerBase:
    """A fresh captioner of kind ``model.kind``."""
    return backbone(cfg.model.kind).build(cfg)


def stored_backbone(kind: object, where: str | Path, trusted: tuple[str, ...] = ()) -> type[CaptionerBase]:
    """The captioner class a checkpoint's ``captioner.json`` (``where``) names as its ``kind``. A registered name is
    looked up; a dotted path (one's own backbone) is imported only when the user named it: in ``trusted`` (the
    caller's own configuration, ``model.kind`` of the recipe being trained) or in
    :data:`~finecap.registry.TRUST_ENV`. A run folder
    is data, never code (docs/reliability.md): a tampered ``captioner.json`` must not make finecap import a module,
    whose import runs code before any check of the class. Else a :class:`~finecap.runs.CheckpointError` says how
    to name it."""
    name = str(kind)
    if untrusted_code(name, trusted):
        raise CheckpointError(
            f"{where}: the checkpoint names the backbone {name!r}, code of one's own, which finecap imports only when "
            f"you name it: model.kind={name} in the configuration you train with, or {TRUST_ENV}={name}"
        )
    return backbone(name, str(where), "captioner kind")


def checkpoint_kind(path: str | Path, trusted: tuple[str, ...] = ()) -> str:
    """The backbone of a captioner checkpoint folder (``captioner.json``'s ``kind``; ``clipcap`` when absent),
    checked to name a captioner class (:func:`stored_backbone`: one's own only when ``trusted`` names it)."""
    kind = read_meta(path).get("kind", "clipcap")
    stored_backbone(kind, Path(path) / CONFIG_NAME, trusted)
    return kind


def load_captioner(path: str | Path, trusted: tuple[str, ...] = (), **kwargs: Any) -> CaptionerBase:
    """Load any captioner checkpoint folder written by a backbone's ``save`` (one's own backbone only when
    ``trusted`` or :data:`~finecap.registry.TRUST_ENV` names it: :func:`stored_backbone`). A checkpoint of a run is
    read under :func:`finecap.runs.swap_guard`: a training run saving a new one meanwhile swaps it in before or after
    the load, never in the middle of it."""
    with swap_guard(path):
        return backbone(checkpoint_kind(path, trusted)).from_checkpoint(path, **kwargs)


def check_backbone(path: str | Path, cfg: Config, option: str) -> None:
    """Refuse to train from the checkpoint folder ``path`` (named by ``option``: ``train.init_from`` or
    ``--resume``) a captioner that is not the one ``cfg`` configures: another backbone (the class of
    ``captioner.json``'s ``kind`` against that of ``model.kind``) or other settings that shape its weights (the
    backbone's ``setting_differences``). The run would otherwise train the checkpoint's model while its stored
    configuration names another; so is a checkpoint whose image encoder is not the configured ``model.encoder``
    (:func:`encoder_difference`). The :class:`~finecap.runs.CheckpointError` names both values and the option to
    change."""
    where = Path(path) / CONFIG_NAME
    kind = checkpoint_kind(path, trusted=(cfg.model.kind,))
    cls = backbone(kind)
    if cls is not backbone(cfg.model.kind):
        settings = f" (with its {kind}.* settings)" if kind in BACKBONES else ""
        raise CheckpointError(
            f"{where}: {option} is a {kind} captioner, but model.kind={cfg.model.kind}; set model.kind={kind}"
            f"{settings}, or start from a {cfg.model.kind} checkpoint"
        )
    meta = read_meta(path)
    differences = encoder_difference(cls, meta, cfg) + cls.setting_differences(meta, cfg)
    if differences:
        raise settings_error(where, option, differences)


def encoder_difference(cls: type[CaptionerBase], meta: dict[str, Any], cfg: Config) -> list[tuple[str, Any, Any]]:
    """``[("model.encoder", the checkpoint's, the configured)]`` when the image encoder a checkpoint was built on
    (``captioner.json``'s dual-encoder source: the frozen encoder it loads, or the one its saved encoder was trained
    from) is not the one ``model.encoder`` names for this backbone (:func:`encoder_source`; ``world``: the world
    encoder of ``cfg``'s world, :func:`~finecap.models.world_encoder_cache.encoder_dir`), else ``[]``. The loaded
    captioner keeps its own encoder whatever ``model.encoder`` says, so a run would encode with it while its
    ``config.yaml`` names the other. No difference when the backbone reads no ``model.encoder`` (a pretrained BLIP or
    VLM), when the checkpoint records none, or when the local folder it records is gone (the loader names that)."""
    configured = cls.encoder_source(cfg)
    recorded = meta.get(cls.DUAL_SOURCE_KEY)
    if not configured or not isinstance(recorded, str) or not recorded:
        return []
    if Path(recorded).is_absolute() and not Path(recorded).exists():
        return []
    if configured == "world":
        where = encoder_dir(cfg)
        return [] if Path(recorded).resolve() == where.resolve() else [("model.encoder", recorded, configured)]
    return [] if same_source(recorded, configured) else [("model.encoder", recorded, configured)]


def recorded_encoder(path: str | Path) -> str | None:
    """The image encoder the captioner checkpoint folder ``path`` was built on, as its ``captioner.json`` records it
    (the backbone's dual-encoder source: a world encoder's folder, a CLIP name), or ``None`` when it records none (a
    pretrained BLIP or VLM): the ``model.encoder`` that :func:`encoder_difference` finds no difference with."""
    meta = read_meta(path)
    recorded = meta.get(backbone(checkpoint_kind(path)).DUAL_SOURCE_KEY)
    return recorded if isinstance(recorded, str) and recorded else None


def check_loaded(model: CaptionerBase, path: str | Path, cfg: Config, option: str) -> None:
    """A captioner loaded from the checkpoint folder ``path`` (``option``: ``train.init_from`` or ``--resume``) made
    to train what ``cfg`` says, decided per key by its backbone: a setting that built the weights and is configured
    otherwise (:meth:`~finecap.models.base.CaptionerBase.loaded_setting_differences`: ``clipcap.lm``, a world-tiny
    model's ``tiny_layers``) is a :class:`~finecap.runs.CheckpointError` naming the key and the checkpoint's value,
    as :func:`check_backbone`'s; a setting that can change on trained weights (``clipcap.tiny_dropout``) is applied
    (:meth:`~finecap.models.base.CaptionerBase.apply_settings`) and logged. Either way the run's ``config.yaml``
    says what trains."""
    differences = model.loaded_setting_differences(cfg)
    if differences:
        raise settings_error(Path(path) / CONFIG_NAME, option, differences)
    applied = model.apply_settings(cfg)
    if applied:
        log.info("%s: applied to the checkpoint's captioner: %s", option, ", ".join(applied))


def settings_error(where: Path, option: str, differences: list[tuple[str, Any, Any]]) -> CheckpointError:
    """The one-line error of a checkpoint trained with other settings than the configured ones."""
    shown = "; ".join(f"{key}={theirs!r} in the checkpoint, {ours!r} configured" for key, theirs, ours in differences)
    fix = " ".join(f"{key}={theirs}" for key, theirs, _ in differences)
    return CheckpointError(f"{where}: {option} was trained with other settings ({shown}); set {fix}, or start "
                           "from a checkpoint trained with the configured ones")  # fmt: skip


def reads_world_encoder(cfg: Config) -> bool:
    """Whether a fresh captioner of ``cfg`` reads the world encoder, which a run must then prepare first (ClipCap or
    the world BLIP or VLM with ``model.encoder=world``)."""
    return backbone(cfg.model.kind).reads_world_encoder(cfg)


def check_before_building(cfg: Config) -> None:
    """The checks of a fresh captioner of ``cfg`` that need no model, no world and no encoder, run before a command
    prepares any (a configuration that can never run is refused in a second, not after the world and its encoder
    are made): ``model.quantization`` on a part built here with random weights (:meth:`built_here`); a
    ``model.encoder`` the captioner loads (:func:`encoder_source`) written as a path (absolute, or beginning ``./``
    or ``../``: no Hub name does) where nothing is."""
    from finecap.config import ConfigError
    from finecap.models.memory import LoadOptions

    built = backbone(cfg.model.kind).built_here(cfg)
    if built is not None:
        LoadOptions.of(cfg.model).check_fresh(built)
    source = encoder_source(cfg)
    if source and (Path(source).is_absolute() or source.startswith(("./", "../"))) and not Path(source).exists():
        # it failed once the world and its features were made, as a Hub error: "Repo id must be in the form ..."
        raise ConfigError(f"model.encoder: {source}: no such folder (a path, not a Hub name): the vision encoder's "
                          "folder, or a Hub name such as openai/clip-vit-base-patch32")  # fmt: skip


def encoder_source(cfg: Config) -> str | None:
    """The vision encoder a fresh captioner of ``cfg`` loads from outside its checkpoint (``"world"``: the world
    encoder), or ``None`` when the model brings its own (a pretrained BLIP, a VLM)."""
    return backbone(cfg.model.kind).encoder_source(cfg)


def external_encoder(meta: dict[str, Any], trusted: tuple[str, ...] = ()) -> str | None:
    """The vision encoder a saved captioner loads from outside its folder, from its ``captioner.json``, or ``None``
    when the folder holds everything (what a checkpoint's fingerprint must cover besides the folder)."""
    return stored_backbone(meta.get("kind", "clipcap"), CONFIG_NAME, trusted).external_encoder(meta)
