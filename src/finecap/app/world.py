"""``finecap world make``: generate the synthetic world data set (images, captions, scene graphs), or reuse it; and
:func:`ensure_world`, the world's preparation for the other commands (through :func:`finecap.app.prepare.prepare`).

:func:`main` builds the world of ``world.*`` into :func:`finecap.home.world_path` (``world.out``, or
``<finecap home>/worlds/<world key>`` when it is empty) with :func:`finecap.world.make.make_world`, which reuses a
complete world with the same content key, refuses a folder finecap did not make, and replaces another finecap world
only with ``--force`` / ``world.overwrite=true`` (removing only the files finecap made there); then logs a summary.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from finecap.config import Config, WorldConfig
from finecap.home import world_path
from finecap.world.make import check_world_folder, make_world, world_key, world_record

log = logging.getLogger(__name__)


def main(cfg: Config | WorldConfig) -> Path:
    """Build (or reuse) the world of ``cfg`` (a full configuration or its ``world`` section); returns its folder."""
    wcfg = cfg.world if isinstance(cfg, Config) else cfg
    t0 = time.perf_counter()
    out = world_path(wcfg)
    reused = check_world_folder(wcfg, out)  # raises before anything is written for a folder finecap may not write
    make_world(wcfg, out)
    total = wcfg.n_train + wcfg.n_val + wcfg.n_test
    what = "up to date" if reused else f"written in {time.perf_counter() - t0:.1f}s"
    log.info("world: %d scenes (%d train / %d val / %d test), %dpx, key %s, %s: %s", total, wcfg.n_train,
             wcfg.n_val, wcfg.n_test, wcfg.image_size, world_key(wcfg), what, out)  # fmt: skip
    return out


def ensure_world(cfg: Config, make: bool, progress: bool = True) -> Path:
    """The folder of the complete world of ``cfg.world`` (:func:`finecap.home.world_path`), made first when it is
    missing and ``make``, with one logged line saying so and where; otherwise a missing world raises
    ``FileNotFoundError`` naming ``finecap world make``. A folder finecap may not write raises
    :class:`~finecap.world.make.WorldFolderError` (before anything is written)."""
    w = cfg.world
    path = world_path(w)
    if check_world_folder(w, path):
        log.debug("world: the world %s is complete: %s", world_key(w), path)
        return path
    if not make:
        raise FileNotFoundError(
            f"{path}: no complete world of world.* here (finecap makes it only for a command that trains on the "
            "world); make it with `finecap world make` and the same world.* settings"
        )
    record = world_record(path) if path.is_dir() else None
    replacing = ""
    if record is not None and record["key"] != world_key(w):
        replacing = f", replacing the finecap world {record['key']} there (world.overwrite)"
    log.info("world: making the world %s (%d train / %d val / %d test images, %d px) in %s%s", world_key(w),
             w.n_train, w.n_val, w.n_test, w.image_size, path, replacing)  # fmt: skip
    return make_world(w, path, progress=progress)
