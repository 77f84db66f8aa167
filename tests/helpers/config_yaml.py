"""What :meth:`finecap.config.Config.save` must write, rendered afresh, and a count of the YAML renders, for the tests
of the saved configuration's YAML text, which is rendered once for the same data (tests/config/test_saved_config.py,
tests/train/test_checkpoint.py)."""

from __future__ import annotations

from typing import Any

import yaml

from finecap.config import absolute_paths


def rendered_afresh(cfg: Any) -> str:
    """``cfg``'s saved YAML built now from its public parts, nothing remembered: its paths made absolute against the
    working directory (:func:`~finecap.config.paths.absolute_paths`), its secrets masked (``to_dict(redact=True)``),
    ``yaml.safe_dump`` with the keys in order."""
    return yaml.safe_dump(absolute_paths(cfg).to_dict(redact=True), sort_keys=False)


def count_renders(monkeypatch) -> list[Any]:
    """``yaml.safe_dump`` made to record the data of each call (then render it as before); the list of those data."""
    calls: list[Any] = []
    real = yaml.safe_dump

    def counting(data: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(data)
        return real(data, *args, **kwargs)

    monkeypatch.setattr(yaml, "safe_dump", counting)
    return calls
