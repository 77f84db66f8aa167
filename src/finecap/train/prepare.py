"""Explicit, visible preparation of what a run, a command or a served reward needs: the world and the world encoder.

:func:`prepare` is where training (:func:`prepare_needs`), the reward server, the demo's stages, ``boost`` and
``bags build`` get them (``retriever
train`` / ``probe``, whose data always is the world, call the two functions it calls directly). Both are content-keyed
artefacts (by default in the finecap home, :mod:`finecap.home`), so
a complete world or a trained encoder is found again by a second demo, another run directory or ``finecap train`` on
the same world, and used silently. What is missing:

- is made (the world, :func:`finecap.world.make.ensure_world`) or trained (the world encoder,
  :func:`finecap.train.world_encoder.ensure_world_encoder`) only by a command that trains on the world: ``train`` when
  its data is the world (:func:`world_is_data`: ``data.format=world`` with no ``data.path``), the demo and the
  ``retriever`` commands (whose data always is the world); one logged line (INFO) says what and where;
- stops every other command (a user's data set; ``boost`` and ``bags build``, which only read), with an error naming
  the command or setting that provides it: finecap never prepares anything behind a user's data set.

A folder at ``world.out`` that finecap did not make, or another finecap world without ``world.overwrite``, stops
every command before anything is written (:func:`finecap.world.make.check_world_folder`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from accelerate import PartialState

from finecap.config import Config
from finecap.errors import relayed
from finecap.world.make import ensure_world

NEEDS = {
    "data": "the command's data set: the world when it is the data (world_is_data), else nothing to prepare",
    "world": "the world of world.* (its scenes, images and captions)",
    "world_encoder": "the trained world encoder of world.*, retriever.* and run.seed",
    "retriever": "retriever.checkpoint when set, else the world encoder",
}
"""What :func:`prepare` can be asked for, with what each means."""


@dataclass(frozen=True)
class Prepared:
    """What :func:`prepare` found or made: the world folder and the world encoder folder (``None`` when not asked
    for, or for ``retriever`` when ``retriever.checkpoint`` is set)."""

    world: Path | None = None
    world_encoder: Path | None = None


def world_is_data(cfg: Config) -> bool:
    """Whether the configured data set is the world (``data.format=world`` and ``data.path`` empty)."""
    return cfg.data.format == "world" and not cfg.data.path


def prepare(cfg: Config, needs: Iterable[str], *, make: bool | None = None, progress: bool = True) -> Prepared:
    """Find, or (``make``) make, what ``needs`` names (:data:`NEEDS`).

    Args:
        cfg: the command's configuration.
        needs: names from :data:`NEEDS`.
        make: whether missing things are made (the world) or trained (the world encoder), each announced with one
            logged line; default :func:`world_is_data`, the rule of a command that trains on its data. Commands
            that train on the world whatever ``data.*`` says pass ``True``, commands that only read pass ``False``.
        progress: progress bars while making or training.

    Raises:
        finecap.world.make.WorldFolderError: ``world.out`` is a folder finecap did not make, or another finecap world.
        FileNotFoundError: something is missing and not to be made here; the message names the command that makes it.
    """
    needs = set(needs)
    unknown = needs - set(NEEDS)
    if unknown:
        raise ValueError(f"prepare: unknown need(s) {sorted(unknown)}; valid: {', '.join(NEEDS)}")
    make = world_is_data(cfg) if make is None else make
    world = None
    if "world" in needs or ("data" in needs and world_is_data(cfg)):
        world = ensure_world(cfg, make, progress=progress)
    encoder = None
    if "world_encoder" in needs or ("retriever" in needs and not cfg.retriever.checkpoint):
        from finecap.train.world_encoder import ensure_world_encoder  # trains with torch: only when needed

        encoder = ensure_world_encoder(cfg, progress=progress, make=make)
    return Prepared(world=world, world_encoder=encoder)


def prepare_needs(cfg: Config, needs: frozenset[str], accelerator: PartialState) -> None:
    """Prepare the run's data and what ``needs`` names, once, on the main process, before any process builds a
    component on it (:func:`prepare`: the world and the world encoder are made or trained, with a
    printed line, only when the run's data is the world; otherwise what is missing stops the run). What stops the main
    process stops the others too, relayed (:func:`finecap.errors.relayed`): one line for the
    command, not a line and a traceback per process."""

    def prepared() -> None:  # the others wait for it (a barrier); only its error is sent to them
        prepare(cfg, {"data", *needs}, progress=True)

    relayed(accelerator, prepared)
