"""The finecap home: one folder for the reusable, content-keyed artefacts every run shares.

``$FINECAP_HOME``, else the platform's user cache directory (``platformdirs.user_cache_dir("finecap")``:
``$XDG_CACHE_HOME/finecap`` or ``~/.cache/finecap`` on Linux, ``~/Library/Caches/finecap`` on macOS,
``%LOCALAPPDATA%\\finecap\\Cache`` on Windows), as ``HF_HOME`` is for Hugging Face. It holds:

- ``worlds/<world key>/``: the world data sets (``world.out`` empty, the default; the key is
  :func:`finecap.world.key.world_key`, so a world is made once per setting and found again by any run);
- ``runs/``: run directories when ``run.root`` is empty (:func:`run_path`), where a relative ``train.init_from``
  is also looked for (:func:`start_path`), so that a recipe's start is found where the recipe making it writes;
- ``cache/``: world encoders (``cache/world_encoder/<key>``), frozen-feature and bag-neighbour caches
  (``run.cache_dir`` empty, the default).

Everything a run makes besides these lives in its run directory. Commands read the configuration's folders only
through :func:`world_path`, :func:`cache_dir` and :func:`run_path`, so an explicit folder given by the user and the
home resolve alike.
Nothing here creates a folder: the code that writes one does (never as a side effect of resolving a path).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import platformdirs

from finecap.utils.text import short_repr

if TYPE_CHECKING:
    from finecap.config import RunConfig, WorldConfig

ENV = "FINECAP_HOME"
"""Environment variable naming the finecap home (empty or unset: the user cache directory)."""
WORLDS = "worlds"
CACHE = "cache"
RUNS = "runs"
JUDGES = "judges"
"""The folder of ``<home>/cache`` holding the judges' answer cache (:mod:`finecap.judges.cache`)."""
METEOR = "meteor"
"""The folder of ``<home>/cache`` holding METEOR's data (:mod:`finecap.metrics.meteor.resources`)."""
HOME_CACHES = (JUDGES, METEOR)
"""The folders of ``<home>/cache`` that stay in the home whatever ``run.cache_dir`` says (the judges' answers,
METEOR's data)."""


def home() -> Path:
    """The finecap home: ``$FINECAP_HOME`` (``~`` expanded, made absolute) or the user cache directory.

    Example::

        >>> from unittest import mock
        >>> with mock.patch.dict(os.environ, {ENV: "~/finecap-home"}):
        ...     home() == Path.home() / "finecap-home"
        True
        >>> with mock.patch.dict(os.environ, {ENV: "relative/home"}):
        ...     home() == Path.cwd() / "relative" / "home"
        True
    """
    value = os.environ.get(ENV, "")
    if value:
        return Path(os.path.abspath(os.path.expanduser(value)))
    return Path(platformdirs.user_cache_dir("finecap", appauthor=False))


def world_path(world: WorldConfig) -> Path:
    """The folder of the world of ``world``: ``world.out`` when set, else ``<home>/worlds/<world key>``.

    Example::

        >>> from finecap.config import WorldConfig
        >>> world_path(WorldConfig(out="data/my-world"))
        PosixPath('data/my-world')
        >>> world_path(WorldConfig(n_train=20)).relative_to(home()).parts[0]
        'worlds'
    """
    if world.out:
        return Path(world.out)
    from finecap.world.key import world_key

    return home() / WORLDS / world_key(world)


def runs_root(run: RunConfig) -> Path:
    """The folder holding run directories: ``run.root`` when set, else ``<home>/runs`` (never the working
    directory)."""
    return Path(run.root) if run.root else home() / RUNS


def run_path(run: RunConfig) -> Path:
    """The run directory of ``run``: ``run.dir`` when set, else ``<run root>/<run.name>`` (:func:`runs_root`). A
    ``run.name`` naming no folder below the root (``""``, ``.``, ``a/..``) is a ``ConfigError`` naming it: the run
    would be the root itself, the folder holding every run (checked here, where a run's folder is chosen, not when a
    configuration is read: a configuration stored by a run trained so still loads to caption and evaluate).

    Example::

        >>> from finecap.config import RunConfig
        >>> run_path(RunConfig(dir="out/x")), run_path(RunConfig(root="runs", name="mle"))
        (PosixPath('out/x'), PosixPath('runs/mle'))
    """
    if run.dir:
        return Path(run.dir)
    if os.path.normpath(run.name) == ".":
        from finecap.config import ConfigError

        raise ConfigError(f"run.name: {short_repr(run.name)} names no folder below the runs root ({runs_root(run)}): "
                          "the run would write into the folder holding every run; give the run a name (or set "
                          "run.dir)", key="run.name")  # fmt: skip
    return runs_root(run) / run.name


def start_path(value: str, run: RunConfig) -> Path:
    """The checkpoint a run starts from (``train.init_from``): ``value`` when absolute or when it exists from the
    working directory, else ``value`` under the runs root (:func:`runs_root`): ``train.init_from=demo/mle`` (or
    ``demo/mle/checkpoints/best``) is the run that ``run.name=demo/mle`` writes, as the packaged recipes chain.

    Example::

        >>> from finecap.config import RunConfig
        >>> start_path("demo/mle/checkpoints/best", RunConfig(root="/srv/runs")).as_posix()
        '/srv/runs/demo/mle/checkpoints/best'
        >>> start_path("/ckpt/best", RunConfig(root="/srv/runs")).as_posix()
        '/ckpt/best'
    """
    path = Path(value)
    return path if path.is_absolute() or path.exists() else runs_root(run) / path


def cache_dir(run: RunConfig) -> Path:
    """The folder of the reusable caches (world encoders, features, bag tables): ``run.cache_dir`` when set, else
    ``<home>/cache``."""
    return Path(run.cache_dir) if run.cache_dir else home() / CACHE


def settings_moving(path: str | Path, folders: Mapping[str, str | Path] | None = None) -> list[str]:
    """What moves ``path`` out of the folder it is in, for errors about a file there where ``--out`` cannot help:
    inside the finecap home (links resolved), :data:`ENV` and the setting that moves that part of it (``world.out``
    for a world, ``run.cache_dir`` for the caches it holds: docs/runs-and-home.md's table); under one of ``folders``
    (``{setting: folder}``: what ``run.cache_dir`` and ``world.out`` configure, an empty folder none), that setting;
    ``[]`` elsewhere.

    Example::

        >>> from unittest import mock
        >>> with mock.patch.dict(os.environ, {ENV: "/srv/home"}):
        ...     [settings_moving(f"/srv/home/{p}") for p in ("cache/features/a", "cache/judges/b", "worlds/k", "x")]
        [['FINECAP_HOME', 'run.cache_dir'], ['FINECAP_HOME'], ['FINECAP_HOME', 'world.out'], ['FINECAP_HOME']]
        >>> settings_moving("/elsewhere/out.json"), settings_moving("/scratch/c/a", {"run.cache_dir": "/scratch/c"})
        ([], ['run.cache_dir'])
    """
    configured = [s for s, folder in (folders or {}).items() if folder and _parts_within(path, folder) is not None]
    parts = _parts_within(path, home())
    if parts is None:
        return configured
    if parts[:1] == (WORLDS,):
        return [ENV, "world.out"]
    if parts[:1] == (CACHE,) and parts[1:2] != ():
        return [ENV] if parts[1] in HOME_CACHES else [ENV, "run.cache_dir"]
    return [ENV, *configured]


def _parts_within(path: str | Path, folder: str | Path) -> tuple[str, ...] | None:
    """The parts of ``path`` below ``folder`` (links resolved in both), ``None`` when it is not inside it."""
    try:
        return Path(os.path.realpath(path)).relative_to(os.path.realpath(folder)).parts
    except (OSError, ValueError):
        return None
