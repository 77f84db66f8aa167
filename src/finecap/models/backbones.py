"""The captioner backbones (``model.kind``) and loading any captioner checkpoint.

A backbone is one module implementing the captioner contract (:class:`finecap.models.captioner.Captioner`:
``forward``, the Stepper methods, ``generate``, ``save``/``from_checkpoint``, and the hooks :mod:`finecap.models.lora`
uses) plus one entry in :data:`BACKBONES`: its builder from the configuration and its class (whose
``from_checkpoint`` reads the folders its ``save`` writes; ``captioner.json`` records the kind, ``clipcap`` when
absent). Each backbone reads ``model`` (what every captioner has) and the section named like its kind
(``clipcap``, ``blip``, ``vlm``: its own options). Adding a backbone: its module, its entry here, its name in
``config.Backbone``, its section in ``config.SECTIONS``, its case in ``tests/models/test_contract.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from finecap.config import SECTIONS, Backbone
from finecap.models.base import CONFIG_NAME, read_meta
from finecap.models.blip import Blip, build_blip
from finecap.models.clipcap import ClipCap, build_captioner
from finecap.models.vlm import Vlm, build_vlm
from finecap.runs import CheckpointError

if TYPE_CHECKING:
    from finecap.config import Config
    from finecap.models.captioner import Captioner

BACKBONES: dict[str, tuple[Callable[[Config], Captioner], type]] = {
    "clipcap": (build_captioner, ClipCap),
    "blip": (build_blip, Blip),
    "vlm": (build_vlm, Vlm),
}
assert set(BACKBONES) == set(get_args(Backbone)), "config.Backbone and BACKBONES must list the same kinds"
assert set(BACKBONES) <= set(SECTIONS), "every backbone has a configuration section named like its kind"


def build_model(cfg: Config) -> Captioner:
    """A fresh captioner of kind ``model.kind``."""
    kind = cfg.model.kind
    if kind not in BACKBONES:
        raise ValueError(f"model.kind={kind!r}; valid: {', '.join(sorted(BACKBONES))}")
    return BACKBONES[kind][0](cfg)


def checkpoint_kind(path: str | Path) -> str:
    """The backbone of a captioner checkpoint folder (``captioner.json``'s ``kind``; ``clipcap`` when absent)."""
    kind = read_meta(path).get("kind", "clipcap")
    if kind not in BACKBONES:
        raise ValueError(
            f"{Path(path) / CONFIG_NAME}: unknown captioner kind {kind!r}; valid: {', '.join(sorted(BACKBONES))}"
        )
    return kind


def load_captioner(path: str | Path, **kwargs: Any) -> Captioner:
    """Load any captioner checkpoint folder written by a backbone's ``save``."""
    return BACKBONES[checkpoint_kind(path)][1].from_checkpoint(path, **kwargs)


def check_backbone(path: str | Path, cfg: Config, option: str) -> None:
    """Refuse to train from the checkpoint folder ``path`` (named by ``option``: ``train.init_from`` or
    ``--resume``) a captioner that is not the one ``cfg`` configures: another backbone (``captioner.json``'s
    ``kind`` against ``model.kind``) or other settings that shape its weights (the backbone's
    ``setting_differences``). The run would otherwise train the checkpoint's model while its stored configuration
    names another. The :class:`~finecap.runs.CheckpointError` names both values and the option to change."""
    where = Path(path) / CONFIG_NAME
    kind = checkpoint_kind(path)
    if kind != cfg.model.kind:
        raise CheckpointError(
            f"{where}: {option} is a {kind} captioner, but model.kind={cfg.model.kind}; set model.kind={kind} (with "
            f"its {kind}.* settings), or start from a {cfg.model.kind} checkpoint"
        )
    differences = BACKBONES[kind][1].setting_differences(read_meta(path), cfg)
    if differences:
        shown = "; ".join(f"{key}={theirs!r} in the checkpoint, {ours!r} configured"
                          for key, theirs, ours in differences)  # fmt: skip
        fix = " ".join(f"{key}={theirs}" for key, theirs, _ in differences)
        raise CheckpointError(f"{where}: {option} was trained with other settings ({shown}); set {fix}, or start "
                              "from a checkpoint trained with the configured ones")  # fmt: skip


def backbone(kind: str) -> type:
    """The captioner class of ``model.kind``."""
    if kind not in BACKBONES:
        raise ValueError(f"model.kind={kind!r}; valid: {', '.join(sorted(BACKBONES))}")
    return BACKBONES[kind][1]


def reads_world_encoder(cfg: Config) -> bool:
    """Whether a fresh captioner of ``cfg`` reads the world encoder, which a run must then prepare first (ClipCap or
    the world BLIP or VLM with ``model.encoder=world``)."""
    return backbone(cfg.model.kind).reads_world_encoder(cfg)


def check_before_building(cfg: Config) -> None:
    """The checks of a fresh captioner of ``cfg`` that need no model, no world and no encoder, run before a command
    prepares any (a configuration that can never run is refused in a second, not after the world and its encoder
    are made): ``model.quantization`` on a part built here with random weights (:meth:`built_here`)."""
    from finecap.models.memory import LoadOptions

    built = backbone(cfg.model.kind).built_here(cfg)
    if built is not None:
        LoadOptions.of(cfg.model).check_fresh(built)


def encoder_source(cfg: Config) -> str | None:
    """The vision encoder a fresh captioner of ``cfg`` loads from outside its checkpoint (``"world"``: the world
    encoder), or ``None`` when the model brings its own (a pretrained BLIP, a VLM)."""
    return backbone(cfg.model.kind).encoder_source(cfg)


def external_encoder(meta: dict[str, Any]) -> str | None:
    """The vision encoder a saved captioner loads from outside its folder, from its ``captioner.json``, or ``None``
    when the folder holds everything (what a checkpoint's fingerprint must cover besides the folder)."""
    return backbone(meta.get("kind", "clipcap")).external_encoder(meta)
