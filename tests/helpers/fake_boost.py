"""A stand-in for ``finecap boost`` (:func:`finecap.app.boost.main`) that boosts nothing: it writes an empty
``dataset.json`` and the ``boost.json`` record the command writes (its status and ``boost.*`` settings:
tests/boost/test_boost_command.py checks that record against the real command), and lists each call's settings."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def recording_boost(boosted: list[Any]) -> Callable[[Any, Path], None]:
    """The stand-in, appending each call's ``cfg.boost`` to ``boosted``."""
    from finecap.app.boost import boost_settings

    def fake_boost(cfg: Any, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "dataset.json").write_text("{}")
        (out / "boost.json").write_text(json.dumps({"status": "ok", "config": boost_settings(cfg)}))
        boosted.append(cfg.boost)

    return fake_boost
