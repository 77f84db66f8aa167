"""Name -> object registries with a dotted-path escape hatch for user code (objectives, rewards, samplers,
validators all use :func:`lookup`).

Example::

    >>> lookup("json:dumps", {}, "my.option", "encoder") is __import__("json").dumps
    True
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


def import_object(path: str, option: str) -> Any:
    """Import ``"pkg.module:attribute"``; errors name ``option`` (the config key that holds the path)."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{option}: {path!r} is not a dotted path of the form 'pkg.module:factory'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{option}: cannot import module {module_name!r} of {path!r}: {e}") from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"{option}: module {module_name!r} has no attribute {attr!r}") from None


def lookup(name: str, registry: Mapping[str, str], option: str, kind: str) -> Any:
    """The object registered as ``name`` (``registry`` maps names to ``"pkg.module:attr"``), or the dotted path
    ``name`` itself; an unknown name raises ``ValueError`` naming ``option`` and listing the valid names."""
    if ":" in name:
        return import_object(name, option)
    if name not in registry:
        raise ValueError(
            f"{option}: unknown {kind} {name!r}; valid names: {', '.join(sorted(registry))} "
            "(or a dotted path 'pkg.module:factory')"
        )
    return import_object(registry[name], option)
