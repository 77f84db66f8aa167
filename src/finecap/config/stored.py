"""Configurations finecap stored (a run's or checkpoint's ``config.yaml``): read back with a recipe and overrides on
top, relative paths found in the file read relative to it (:mod:`finecap.config.paths`), and files written before a
key moved migrated (:data:`~finecap.config.sections.MOVED_KEYS`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from finecap.config.fields import ConfigError
from finecap.config.loading import (
    FileSource,
    Origins,
    from_dict,
    load,
    mapping_at,
    merge_overrides,
    parse_override,
    renamed_key,
    renamed_keys,
    with_over,
)
from finecap.config.paths import absolute_path_values
from finecap.config.sections import ADDED_KEYS, MOVED_KEYS, Config, ModelConfig, moved_key
from finecap.config.sections.grpo import never_read
from finecap.recipes import resolve_recipe
from finecap.registry import TRUST_ENV, is_dotted_path, trusted_code
from finecap.utils.once import SaidOnce
from finecap.utils.reading import read_yaml_mapping

log = logging.getLogger(__name__)

CODE_OPTIONS = ("model.kind", "data.format", "decode.engine", "judge.name", "eval.metrics")
"""The options naming code (a registry name, or a dotted path ``pkg.module:attr`` that is imported) that the commands
reading a stored configuration (caption, export, report, eval of a run, the Python API) may import. The options
only training imports (``train.objective``, ``data.sampler``, ``rl.rewards``, ``train.validators``) are read from
the configuration being trained, never from a stored one, so a run trained with code of one's own captions as is
(``tests/app/test_output_safety.py::test_a_stored_configuration_imports_nothing_when_read``). A stored configuration
read to train again (``finecap train --resume --out RUN`` without a recipe: :func:`load_stored` ``for_training``) is
checked for those too (:data:`TRAINING_CODE_OPTIONS`)."""
TRAINING_CODE_OPTIONS = ("train.objective", "data.sampler", "rl.rewards", "train.validators")
"""The options naming code only training imports (a mapping's keys, a list's items)."""


def migrate_moved_keys(data: dict[str, Any], source: str = "") -> dict[str, Any]:
    """Sections ``{section: {key: value}}`` of a configuration stored before the backbone sections or the split of
    ``rl`` into ``rl``, ``grpo`` and ``sle`` (:data:`MOVED_KEYS`) with the former keys moved to their sections (for a
    ``model`` key a value already set there wins; an option the backbone no longer has is dropped). Configurations
    without such keys come back unchanged. A former ``rl`` or ``data`` key set beside its new one to another value, or
    a section a former key moves to that is no mapping (``clipcap: 5``), is a :class:`ConfigError` beginning with
    ``source`` (``"runs/x/config.yaml: "``: the file at fault)."""
    data = renamed_keys(data, source)
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
            try:
                node = mapping_at(out, [section])  # `clipcap: 5` beside a former model key: refused, never dropped
            except ConfigError as e:
                raise ConfigError(f"{source}{e}", key=e.key) from None
            node.setdefault(name, value)
    return out


def former_names(data: dict[str, Any]) -> dict[str, str]:
    """``{new key: former key}`` of the keys of sections ``data`` (as stored) that :func:`migrate_moved_keys` reads
    under a new name (``grpo.kl_coef: rl.kl_coef``), a former ``model`` key only where its value is the one read (its
    new key not set beside it): what a warning and the errors about the value name, as the user's file says it."""
    out: dict[str, str] = {}
    model = data.get("model")
    kind = str(model.get("kind", ModelConfig.kind)) if isinstance(model, dict) else ModelConfig.kind
    for name, values in data.items():
        for k in values if isinstance(values, dict) else ():
            target = renamed_key(f"{name}.{k}") or (moved_key(f"{name}.{k}", kind) if name == "model" else None)
            section, _, new = (target or "").partition(".")
            beside = data.get(section) if isinstance(data.get(section), dict) else {}
            if target and not (name == "model" and new in beside):
                out[target] = f"{name}.{k}"
    return out


_FORMER_SAID = SaidOnce()


def warn_former_names(path: Path, former: dict[str, str]) -> None:
    """One warning naming ``path`` and each former key it stores with the key it is read as (:func:`former_names`),
    once per file and keys in a command (a command reading one run's configuration twice warns once;
    :mod:`finecap.utils.once`)."""
    seen = (str(path), tuple(sorted(former.items())))
    if former and _FORMER_SAID.first(seen):
        log.warning("%s: written before these keys moved, read under their new names: %s", path,
                    ", ".join(f"{old} -> {new}" for new, old in former.items()))  # fmt: skip


def with_added_keys(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """Sections with each key of :data:`~finecap.config.sections.ADDED_KEYS` that a stored section lacks set to the
    value of the behaviour before the key existed (logged): finecap stores every key of a section, so the file was
    written before it (``data.jpeg_draft``: ``false``, full-size JPEG decoding, as the run trained). A section the
    file lacks altogether is left to its defaults."""
    out = {name: dict(values) if isinstance(values, dict) else values for name, values in data.items()}
    added = {}
    for option, value in ADDED_KEYS.items():
        section, key = option.split(".")
        if isinstance(out.get(section), dict) and key not in out[section]:
            out[section][key] = added[option] = value
    if added:
        log.info("%s: written before %s existed: read with %s, as the finecap that wrote it behaved", path,
                 ", ".join(added), ", ".join(f"{k}={v!r}" for k, v in added.items()))  # fmt: skip
    return out


def without_unread(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """Sections with the options the stored run set but never read dropped
    (:func:`~finecap.config.sections.grpo.never_read`; logged), so that a run stored before they were refused loads."""
    grpo, rl = (data.get(name) if isinstance(data.get(name), dict) else {} for name in ("grpo", "rl"))
    unread = never_read(grpo, rl)
    if not unread:
        return data
    log.info("%s: read without %s, which the run set but never read", path, ", ".join(unread))
    out = {name: dict(values) if isinstance(values, dict) else values for name, values in data.items()}
    for option in unread:
        section, key = option.split(".")
        del out[section][key]
    return out


def load_stored(path: str | Path, overrides: list[str] | None = None, recipe: str | Path | None = None,
                for_training: bool = False, over: dict[str, Any] | None = None, over_source: str = "",
                labels: dict[str, str] | None = None) -> Config:  # fmt: skip
    """A configuration finecap stored (a run's or checkpoint's ``config.yaml``) with a ``recipe``'s keys, the
    settings ``over`` (``{section: {key: value}}``, e.g. :func:`finecap.train`'s keywords, which errors name by
    ``over_source``) and the dotlist ``overrides`` on top (only the keys they set replace the stored ones); an error
    about an override in ``labels`` names it as its label there (the command-line option it stands for,
    ``--engine nosuch``: :func:`finecap.config.loading.load`).

    finecap writes absolute paths (:meth:`Config.save`); a relative path found in the file (edited by hand) is read
    relative to the file's folder. Paths in the recipe and the overrides are the user's, relative to the working
    directory. The stored file's values are checked before the recipe's are applied, each error naming the file,
    but a value the dotlist ``overrides`` or ``over`` replaces is never read, nor checked: an override rescues a
    stored value a newer finecap's bound refuses. A file stored before the backbone sections (``model.prefix_length``,
    ...) or another move of keys is migrated (:func:`migrate_moved_keys`), with one warning naming the file, each
    former key and its new one, and errors about such a value name the former key too; one stored before a key of
    :data:`~finecap.config.sections.ADDED_KEYS` existed reads it as the behaviour before it (:func:`with_added_keys`).
    ``for_training``: the configuration is trained with, so a dotted path in an option only training imports is
    refused as well unless named (:func:`check_stored_code`).
    """
    path = Path(path)
    try:
        data = read_yaml_mapping(path, "a stored configuration must be a mapping of sections")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    former = former_names(data)
    data = with_added_keys(migrate_moved_keys(data, f"{path}: "), path)
    warn_former_names(path, former)
    data = absolute_path_values(without_unread(data, path), path.parent)
    origins: Origins = {}
    on_top = merge_overrides(with_over(data, over, over_source, origins, warn=False), overrides or [], origins,
                             warn=False, labels=labels)  # fmt: skip
    try:  # the stored file is valid but for the keys set on top of it, whose stored values are never read
        stored = from_dict(on_top, FileSource(path), origins)
    except ConfigError as e:
        if e.key not in former or e.key in origins:
            raise
        raise ConfigError(f"{e} ({path} sets it as {former[e.key]}, its former name)", key=e.key) from None
    cfg = load(recipe, overrides, base=data, over=over, over_source=over_source, labels=labels)
    check_stored_code(path, stored, cfg, recipe, overrides or [], for_training, over)
    return cfg


def resume_config(run_dir: str | Path, overrides: list[str] | None = None, *, over: dict[str, Any] | None = None,
                  over_source: str = "", asked: str, with_recipe: str) -> Config:  # fmt: skip
    """The configuration that resumes the run in ``run_dir`` without a recipe (``finecap train --resume --out RUN``,
    ``finecap.train(RUN, resume=True)``): the settings it was trained with (its ``config.yaml``), ``over`` and the
    dotlist ``overrides`` on top, ``run.dir`` ``run_dir``; a dotted path of code of one's own in the file is
    imported only when named again (:func:`load_stored` ``for_training``: a run folder is data). A folder without a
    ``config.yaml`` is a ``ValueError`` beginning with ``asked`` (how the caller named the run: ``--resume --out
    RUN``) that points to ``with_recipe`` (how to resume with the run's recipe instead)."""
    from finecap.runs import CONFIG_FILE

    stored = Path(run_dir) / CONFIG_FILE
    if not stored.is_file():
        raise ValueError(f"{asked}: no {CONFIG_FILE} of a run there to take the settings from; give the run's "
                         f"recipe ({with_recipe})")  # fmt: skip
    over = {name: dict(values) if isinstance(values, dict) else values for name, values in (over or {}).items()}
    run = over.get("run")
    over["run"] = {**(run if isinstance(run, dict) else {}), "dir": str(run_dir)}  # a dotlist's run.dir still wins
    return load_stored(stored, overrides, for_training=True, over=over, over_source=over_source)


def code_paths(cfg: Config, options: tuple[str, ...] = CODE_OPTIONS) -> dict[str, list[str]]:
    """``{option: [dotted path, ...]}`` of the ``options`` of ``cfg`` that name code of one's own."""
    out: dict[str, list[str]] = {}
    for option in options:
        section, key = option.split(".")
        value = getattr(getattr(cfg, section), key)
        names = [value] if isinstance(value, str) else list(value)  # eval.metrics: a list
        dotted = [n for n in names if isinstance(n, str) and is_dotted_path(n)]
        if dotted:
            out[option] = dotted
    return out


def _strings(obj: Any) -> set[str]:
    """Every string of a parsed YAML document, mapping keys included."""
    if isinstance(obj, str):
        return {obj}
    if isinstance(obj, dict):
        return set().union(*(_strings(k) | _strings(v) for k, v in obj.items())) if obj else set()
    if isinstance(obj, (list, tuple)):
        return set().union(*(_strings(v) for v in obj)) if obj else set()
    return set()


def _named_in(overrides: list[str], option: str, name: str) -> bool:
    """Whether an override of ``option`` holds ``name`` (parsed: a value, a list item or a mapping key)."""
    for item in overrides:
        keys, value = parse_override(item)
        if ".".join(keys) == option and name in _strings(value):
            return True
    return False


def _over_value(over: dict[str, Any] | None, option: str) -> Any:
    """The value ``over`` (``{section: {key: value}}``) sets for ``option`` (``section.key``), or ``None``."""
    section, key = option.split(".")
    values = (over or {}).get(section)
    return values.get(key) if isinstance(values, dict) else None


def check_stored_code(
    path: Path,
    stored: Config,
    cfg: Config,
    recipe: str | Path | None,
    overrides: list[str],
    for_training: bool = False,
    over: dict[str, Any] | None = None,
) -> None:
    """Refuse a dotted path (code of one's own) that the stored configuration ``path`` names and the loaded ``cfg``
    still uses, unless the user named it too: in an override (a dotlist's, or ``over``'s), in the recipe, or in
    :data:`~finecap.registry.TRUST_ENV`. A run folder is data, never code: importing a module runs it, so a
    tampered or shared ``config.yaml`` must not make finecap import one (as :func:`finecap.models.backbones.
    stored_backbone` for a checkpoint's ``captioner.json``)."""
    options = CODE_OPTIONS + (TRAINING_CODE_OPTIONS if for_training else ())
    used = code_paths(cfg, options)
    named: set[str] | None = None
    for option, names in code_paths(stored, options).items():
        for name in names:
            if (name not in used.get(option, ()) or name in trusted_code() or _named_in(overrides, option, name)
                    or name in _strings(_over_value(over, option))):  # fmt: skip
                continue
            if named is None:
                named = set() if recipe is None else _strings(read_yaml_mapping(resolve_recipe(recipe), "a recipe"))
            if name not in named:
                raise ConfigError(
                    f"{path}: {option} names {name!r}, code of one's own, which finecap imports only when you name "
                    f"it (a run folder is data, never code): pass {option}=... naming it again, or set "
                    f"{TRUST_ENV}={name}",
                    key=option,
                )
