"""Configurations finecap stored (a run's or checkpoint's ``config.yaml``): read back with a recipe and overrides on
top, relative paths found in the file read relative to it (:mod:`finecap.config.paths`), and files written before a
key moved migrated (:data:`~finecap.config.sections.MOVED_KEYS`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from finecap.config.fields import ConfigError
from finecap.config.loading import from_dict, load, renamed_keys
from finecap.config.paths import absolute_path_values
from finecap.config.sections import MOVED_KEYS, Config, ModelConfig, moved_key
from finecap.utils.reading import read_yaml_mapping


def migrate_moved_keys(data: dict[str, Any]) -> dict[str, Any]:
    """Sections ``{section: {key: value}}`` of a configuration stored before the backbone sections or the split of
    ``rl`` into ``rl``, ``grpo`` and ``sle`` (:data:`MOVED_KEYS`) with the former keys moved to their sections (for a
    ``model`` key a value already set there wins; an option the backbone no longer has is dropped). Configurations
    without such keys come back unchanged."""
    data = renamed_keys(data)
    model = data.get("model")
    if not isinstance(model, dict) or not any(f"model.{k}" in MOVED_KEYS for k in model):
        return data
    out = {name: dict(values) if isinstance(values, dict) else values for name, values in data.items()}
    kind = str(model.get("kind", ModelConfig.kind))
    for key in list(out["model"]):
        if f"model.{key}" not in MOVED_KEYS:
            continue
        value = out["model"].pop(key)
        target = moved_key(f"model.{key}", kind)
        if target is not None:
            section, name = target.split(".")
            if not isinstance(out.get(section), dict):
                out[section] = {}
            out[section].setdefault(name, value)
    return out


def load_stored(path: str | Path, overrides: list[str] | None = None, recipe: str | Path | None = None) -> Config:
    """A configuration finecap stored (a run's or checkpoint's ``config.yaml``) with a ``recipe``'s keys and the
    dotlist ``overrides`` on top (only the keys they set replace the stored ones).

    finecap writes absolute paths (:meth:`Config.save`); a relative path found in the file (edited by hand) is read
    relative to the file's folder. Paths in the recipe and the overrides are the user's, relative to the working
    directory. A file stored before the backbone sections (``model.prefix_length``, ...) is migrated
    (:func:`migrate_moved_keys`).
    """
    path = Path(path)
    try:
        data = read_yaml_mapping(path, "a stored configuration must be a mapping of sections")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    data = absolute_path_values(migrate_moved_keys(data), path.parent)
    from_dict(data, f"{path}: ")  # the stored file alone is valid; errors name it
    return load(recipe, overrides, base=data)
