"""The content key of a world: a hash of every setting that determines its files (:func:`world_key`).

Apart from :mod:`finecap.world.make` so that resolving the world's folder in the finecap home
(:func:`finecap.home.world_path`) needs neither the world's generator nor its renderer.
"""

from __future__ import annotations

import hashlib
import json
import typing
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the key reads a WorldConfig's fields; finecap.config resolves run folders through finecap.home
    from finecap.config import WorldConfig

WORLD_VERSION = 2
"""Bump when scenes, rendering or captions change, so cached worlds (and everything keyed on them) are rebuilt."""
NOT_CONTENT = ("out", "overwrite")
"""World settings that say where and how to write a world, not what it holds."""


def world_key(cfg: WorldConfig) -> str:
    """Content hash of everything that determines the world's files (all config fields except :data:`NOT_CONTENT`).

    Example::

        >>> from finecap.config import WorldConfig
        >>> world_key(WorldConfig(out="a")) == world_key(WorldConfig(out="b", overwrite=True))
        True
    """
    content = {"version": WORLD_VERSION, **content_config(cfg)}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


def content_config(cfg: WorldConfig) -> dict[str, Any]:
    """The settings :func:`world_key` hashes (what ``world.json`` and the marker record as ``config``)."""
    floats = {k for k, tp in typing.get_type_hints(type(cfg)).items() if tp is float}
    # a float setting given as an int (WorldConfig(pattern_prob=1) from Python) is the same world as 1.0
    d = {k: float(v) if k in floats and type(v) is int else v for k, v in vars(cfg).items() if k not in NOT_CONTENT}
    if d.get("shift") == "none":  # the training domain keeps the key it had before world.shift existed
        d.pop("shift")
    return d
