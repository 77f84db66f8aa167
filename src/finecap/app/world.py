"""``finecap world make``: generate the synthetic world data set (images, captions, scene graphs), or reuse it; and
:func:`ensure_world`, the world's preparation for the other commands (through :func:`finecap.train.prepare.prepare`).

:func:`main` builds the world of ``world.*`` into :func:`finecap.home.world_path` (``world.out``, or
``<finecap home>/worlds/<world key>`` when it is empty) with :func:`finecap.world.make.make_world`, which reuses a
complete world with the same content key, refuses a folder finecap did not make, and replaces another finecap world
only with ``--force`` / ``world.overwrite=true`` (removing only the files finecap made there); then logs a summary.
A world of no scenes (``world.n_train``, ``n_val`` and ``n_test`` all 0) is refused before anything is written.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from finecap.config import Config, ConfigError, WorldConfig
from finecap.home import world_path
from finecap.world.make import make_world_said, world_key

log = logging.getLogger(__name__)


def main(cfg: Config | WorldConfig) -> Path:
    """Build (or reuse) the world of ``cfg`` (a full configuration or its ``world`` section); returns its folder."""
    wcfg = cfg.world if isinstance(cfg, Config) else cfg
    if wcfg.n_train + wcfg.n_val + wcfg.n_test == 0:  # before anything is written: a world of no scenes serves nothing
        raise ConfigError("--n-train, --n-val and --n-test (world.n_train, world.n_val, world.n_test) are all 0: a "
                          "world of no scenes; give at least one split some scenes, e.g. --n-test 100")  # fmt: skip
    t0 = time.perf_counter()
    out = world_path(wcfg)
    _, wrote = make_world_said(wcfg, out)  # refuses before anything is written a folder finecap may not write
    total = wcfg.n_train + wcfg.n_val + wcfg.n_test
    what = f"written in {time.perf_counter() - t0:.1f}s" if wrote else "up to date"
    log.info("world: %d scenes (%d train / %d val / %d test), %dpx, key %s, %s: %s", total, wcfg.n_train,
             wcfg.n_val, wcfg.n_test, wcfg.image_size, world_key(wcfg), what, out)  # fmt: skip
    return out
