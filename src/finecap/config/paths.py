"""Paths in stored configurations: which keys hold file-system paths, and those paths made absolute.

A configuration finecap stores (a run's ``config.yaml``, :meth:`finecap.config.Config.save`) holds absolute paths, so
it means the same from any working directory; :func:`finecap.config.load_stored` reads a relative path found in one
(edited by hand) relative to the file's folder. This module works on any section dataclasses and plain mappings and
imports none of them.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Literal

from finecap.registry import HUB_DATA_FORMATS

PATH_KEYS: dict[str, Literal["path", "name_or_path"]] = {
    "run.root": "path",
    "run.dir": "path",
    "run.cache_dir": "path",
    "world.out": "path",
    "data.path": "path",  # name_or_path with a format reading Hub names (registry.HUB_DATA_FORMATS)
    "data.images": "path",
    "retriever.checkpoint": "name_or_path",
    "model.encoder": "name_or_path",
    "clipcap.lm": "name_or_path",
    "blip.name": "name_or_path",
    "vlm.name": "name_or_path",
    "train.init_from": "path",
    "eval.lm": "name_or_path",
    "eval.instances": "path",
    "boost.prompts": "path",
    "boost.llm_model": "name_or_path",
    "boost.vlm_model": "name_or_path",
}
"""Keys holding file-system paths: ``path`` keys always are one; ``name_or_path`` keys are a Hub name unless a
local file or folder exists there (as ``from_pretrained`` decides)."""
KEYWORDS = ("world", "world-tiny", "data-tiny")
"""Values of ``name_or_path`` keys that name finecap's embedded models, never a folder."""


def _absolute(key: str, value: Any, base: Path, data_format: Any) -> Any:
    if not isinstance(value, str) or not value or value in KEYWORDS or Path(value).is_absolute():
        return value
    joined = os.path.normpath(os.path.join(base, value))
    kind = "name_or_path" if key == "data.path" and data_format in HUB_DATA_FORMATS else PATH_KEYS[key]
    if kind == "name_or_path" and not os.path.exists(joined):
        return value
    return joined


def absolute_path_values(data: dict[str, Any], base: str | Path) -> dict[str, Any]:
    """Sections ``{section: {key: value}}`` with every relative path of :data:`PATH_KEYS` joined to ``base`` (a
    ``data.path`` is a Hub name only with a format of :data:`finecap.registry.HUB_DATA_FORMATS`, such as
    ``hf``; absent, the format is the default, a file format)."""
    base = Path(os.path.abspath(base))
    out = {name: dict(values) if isinstance(values, dict) else values for name, values in data.items()}
    data_section = out.get("data") if isinstance(out.get("data"), dict) else {}
    data_format = data_section.get("format")
    for dotted in PATH_KEYS:
        section, key = dotted.split(".")
        values = out.get(section)
        if isinstance(values, dict) and key in values:
            values[key] = _absolute(dotted, values[key], base, data_format)
    return out


def recorded_source(name: str) -> str:
    """How a loaded model's source ``name`` (a Hub name or a local path, as ``from_pretrained`` read it) is recorded
    in what finecap saves (``captioner.json``'s sources, a whole-model adapter's ``base_model_name_or_path``, a model
    card): a local file or folder, one that exists at ``name`` from the working directory, by its absolute path (links
    resolved), so the record names that folder from any working directory; anything else (a Hub name) as given. A
    relative ``models/vlm`` recorded as given is what peft and transformers look up as a Hub repository from anywhere
    else.

    Example::

        >>> recorded_source("openai-community/gpt2")  # no such folder here: a Hub name
        'openai-community/gpt2'
        >>> recorded_source(".") == os.path.realpath(".")
        True
    """
    return str(Path(name).resolve()) if Path(name).exists() else name


def read_as_path(name: str, cfg: Any) -> bool:
    """Whether ``name``, a model source as the user gave it and a captioner recorded it (``models/gpt2``), was read
    as a local file or folder rather than a Hub name: one exists there from the working directory, or ``cfg`` (a
    :class:`finecap.config.Config`; a stored one holds its :data:`PATH_KEYS` made absolute where they existed,
    :func:`absolute_paths`) holds it as a ``name_or_path`` value joined to the folder it was given in (read from
    another working directory, as ``finecap export`` may be).

    Example::

        >>> from finecap.config import load
        >>> # clipcap.lm=models/gpt2 given in /home/me, where that folder existed: stored as /home/me/models/gpt2
        >>> stored = load(None, ["clipcap.lm=/home/me/models/gpt2"])
        >>> read_as_path("models/gpt2", stored), read_as_path("openai-community/gpt2", stored)
        (True, False)
    """
    if not name or name in KEYWORDS:
        return False
    if os.path.exists(name) or Path(name).is_absolute():
        return True
    tail = os.sep + os.path.normpath(name)
    values = (getattr(getattr(cfg, dotted.split(".")[0], None), dotted.split(".")[1], None)
              for dotted, kind in PATH_KEYS.items() if kind == "name_or_path")  # fmt: skip
    return any(isinstance(v, str) and os.path.isabs(v) and os.path.normpath(v).endswith(tail) for v in values)


def absolute_paths(cfg: Any, base: str | Path | None = None) -> Any:
    """The configuration ``cfg`` (a :class:`finecap.config.Config`) with every relative path of :data:`PATH_KEYS`
    made absolute against ``base`` (default: the working directory, against which a running command reads them).
    :meth:`finecap.config.Config.save` stores this form.

    Example::

        >>> from finecap.config import load
        >>> absolute_paths(load(None, ["world.out=data/w"]), "/home/me").world.out
        '/home/me/data/w'
    """
    data = absolute_path_values(dataclasses.asdict(cfg), base if base is not None else os.getcwd())
    paths = {name: {k: v for k, v in values.items() if f"{name}.{k}" in PATH_KEYS} for name, values in data.items()}
    return dataclasses.replace(cfg, **{name: dataclasses.replace(getattr(cfg, name), **values)
                                       for name, values in paths.items()})  # fmt: skip
