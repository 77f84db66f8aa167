"""``finecap world make``: generate the synthetic world data set (images, captions, scene graphs), or reuse it.

:func:`main` builds the world of ``world.*`` into ``world.out`` with :func:`finecap.world.make.make_world` (which
skips a complete world with the same content key) and prints a summary.
"""

from __future__ import annotations

import time
from pathlib import Path

from finecap.config import Config, WorldConfig
from finecap.world.make import is_complete, make_world, world_key


def main(cfg: Config | WorldConfig) -> Path:
    """Build (or reuse) the world of ``cfg`` (a full configuration or its ``world`` section); returns its folder."""
    wcfg = cfg.world if isinstance(cfg, Config) else cfg
    t0 = time.perf_counter()
    out = Path(wcfg.out)
    reused = is_complete(out, world_key(wcfg))
    make_world(wcfg, out)
    total = wcfg.n_train + wcfg.n_val + wcfg.n_test
    what = "up to date" if reused else f"written in {time.perf_counter() - t0:.1f}s"
    print(f"world: {total} scenes ({wcfg.n_train} train / {wcfg.n_val} val / {wcfg.n_test} test), "
          f"{wcfg.image_size}px, key {world_key(wcfg)}, {what}: {out}")  # fmt: skip
    return out
