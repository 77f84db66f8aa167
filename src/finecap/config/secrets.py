"""Secrets in a configuration: which keys hold one, how they are masked when a configuration leaves the process
(files, stdout, experiment trackers) and which keys look like one (never repeated in an error message)."""

from __future__ import annotations

from typing import Any

SECRET_KEYS: tuple[str, ...] = ("boost.llm_api_key", "boost.vlm_api_key")
"""Keys holding secrets: masked wherever a configuration is saved, printed or logged; finecap boost never writes them
(prefer the environment: ``boost.llm_api_key_env`` / ``boost.vlm_api_key_env``)."""

MASK = "***"
"""What a secret (:data:`SECRET_KEYS`) is written as. Read back (a stored ``config.yaml``), it means "not set": the key
then comes from the environment (``boost.llm_api_key_env``), never the mask itself."""


def redacted(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of sections ``{section: {key: value}}`` with every non-empty :data:`SECRET_KEYS` value replaced by
    :data:`MASK`: what :meth:`Config.save` writes, ``finecap config`` prints and trackers receive.

    Example::

        >>> redacted({"boost": {"llm_api_key": "sk-1", "vlm_api_key": ""}})["boost"]
        {'llm_api_key': '***', 'vlm_api_key': ''}
    """
    out = {name: dict(values) if isinstance(values, dict) else values for name, values in data.items()}
    for dotted in SECRET_KEYS:
        section, key = dotted.split(".")
        values = out.get(section)
        if isinstance(values, dict) and values.get(key):
            values[key] = MASK
    return out


def looks_secret(key: str) -> bool:
    """A key of :data:`SECRET_KEYS`, or one named like a secret (a mistyped ``boost.llm_apikey``): its value is never
    repeated in an error message.

    Example::

        >>> looks_secret("boost.llm_apikey"), looks_secret("train.lr")
        (True, False)
    """
    name = key.rsplit(".", 1)[-1].lower()
    return key in SECRET_KEYS or any(word in name for word in ("key", "token", "secret", "password"))
