"""Reading a configuration: YAML recipes and dotlist overrides, values coerced to the fields' types, errors that
name where the value at fault was set (the override, else the file and its line) and suggest the closest valid name.

:func:`load`'s contract and an example: the package's docstring (:mod:`finecap.config`); the fields' own bounds and
the sections' cross-field checks run when each section is built (:mod:`finecap.config.fields`).
"""

from __future__ import annotations

import dataclasses
import decimal
import logging
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from finecap.config.fields import ConfigError, choices_text, constraint_text, is_choice, option_fields, subsections
from finecap.config.hf_names import HF_NAMES, hf_hint
from finecap.config.paths import PATH_KEYS
from finecap.config.secrets import (
    DEPRECATED_SECRETS,
    MASK,
    SECRET_KEYS,
    deprecated_secret_message,
    environment_advice,
    looks_secret,
    masked_url_secrets,
)
from finecap.config.sections import MOVED_KEYS, SECTIONS, Config, ModelConfig, moved_key, renamed_key
from finecap.recipes import resolve_recipe
from finecap.registry import (
    BACKBONES,
    DATA_FORMATS,
    ENGINES,
    METRIC_GROUPS,
    OBJECTIVES,
    REWARDS,
    SAMPLERS,
    VALIDATOR_KEYS,
    is_dotted_path,
)
from finecap.utils.once import SaidOnce
from finecap.utils.reading import METADATA, StrictYAMLLoader, YAMLRefused, load_yaml, read_text_bounded
from finecap.utils.text import SHORT_REPR_LIMIT, closest, did_you_mean, short_repr

log = logging.getLogger(__name__)


def _moved_message(key: str, kind: str) -> str:
    target = moved_key(key, kind)
    if target is not None:
        return f"{key!r} moved to {target!r} (each backbone's options have their own section); set {target} instead"
    where = [t for k in BACKBONES if (t := moved_key(key, k))]
    return f"{key!r} moved to the backbone sections ({', '.join(where)}); model.kind={kind} has no such option"


def renamed_keys(data: dict[str, Any], source: str = "", warn: bool = False) -> dict[str, Any]:
    """Sections ``{section: {key: value}}`` with the keys of a former flat section read under their new names
    (:func:`~finecap.config.sections.renamed_key`: ``rl.advantage`` -> ``grpo.advantage``); ``data`` itself when it
    has none. One mapping setting both a former key and its new one to different values is refused, naming both;
    ``warn`` logs one line naming the renamed keys (a recipe the user wrote). A new key may lie in a nested section
    (``data.image_column`` -> ``data.hf.image_column``)."""
    moves = [(name, k, target) for name, values in data.items() if isinstance(values, dict)
             for k in values if (target := renamed_key(f"{name}.{k}"))]  # fmt: skip
    if not moves:
        return data
    out = {name: dict(values) if isinstance(values, dict) else values for name, values in data.items()}
    for name, k, target in moves:
        *path, new = target.split(".")
        value = out[name].pop(k)
        try:
            node = mapping_at(out, path)
        except ConfigError as e:  # data: {image_column: x, hf: [a]}: name the file
            raise ConfigError(f"{source}{e}", key=e.key) from None
        if new in node and node[new] != value:
            raise ConfigError(
                f"{source}{name}.{k}={short_repr(value)} and {target}={short_repr(node[new])} are both set; "
                f"{name}.{k} is the former name of {target}: keep {target} only",
                key=target,
            )
        node[new] = value
    if warn:
        log.warning("%sread under their new names: %s", source, ", ".join(f"{n}.{k} -> {t}" for n, k, t in moves))
    return out


def mapping_at(data: dict[str, Any], path: list[str]) -> dict[str, Any]:
    """The mapping at ``path`` (``["data", "hf"]``) inside the nested mappings ``data``, made (or copied, so a caller's
    mapping is never changed) on the way: the place to set a key of a nested section."""
    node = data
    for depth, part in enumerate(path):
        if node.get(part) is not None and not isinstance(node[part], dict):  # data: {hf: [a]}: never dropped
            key = ".".join(path[: depth + 1])
            raise ConfigError(f"{key} must be a mapping of keys, got {short_repr(node[part])}", key=key)
        node[part] = dict(node[part]) if isinstance(node.get(part), dict) else {}
        node = node[part]
    return node


def merged(cls: type | None, below: dict[str, Any], above: dict[str, Any]) -> dict[str, Any]:
    """The keys of one section (class ``cls``; ``None``: unknown) set by ``below`` with those ``above`` sets on top: a
    nested section's (:func:`~finecap.config.fields.subsections`) mappings merged key by key, as the section's own,
    any other value (a mapping option such as ``rl.rewards`` too) replaced whole.

    >>> from finecap.config import DataConfig
    >>> merged(DataConfig, {"path": "a", "hf": {"image_column": "img"}}, {"hf": {"caption_column": "text"}})
    {'path': 'a', 'hf': {'image_column': 'img', 'caption_column': 'text'}}
    """
    nested = subsections(cls) if cls is not None else {}
    out = dict(below)
    for k, v in above.items():
        if k in nested and isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merged(nested[k], out[k], v)
        else:
            out[k] = v
    return out


def flat_options(data: dict[str, Any]) -> dict[str, Any]:
    """Sections ``{section: {key: value}}`` (:meth:`~finecap.config.Config.to_dict`, a stored configuration) as
    ``{"section.key": value}``, a nested section's keys under their whole name (``data.hf.image_column``); a mapping
    option (``rl.rewards``) stays one value. For what compares or lists options one by one (trackers' tables, the
    changes a resumed run reports).

    >>> flat_options({"data": {"path": "d", "hf": {"image_column": "img"}}, "rl": {"rewards": {"cider": 1.0}}})
    {'data.path': 'd', 'data.hf.image_column': 'img', 'rl.rewards': {'cider': 1.0}}
    """
    out: dict[str, Any] = {}
    for name, values in data.items():
        if isinstance(values, dict):
            out.update(_flat(SECTIONS.get(name), values, f"{name}."))
    return out


def _flat(cls: type | None, values: dict[str, Any], prefix: str) -> dict[str, Any]:
    nested = subsections(cls) if cls is not None else {}
    out: dict[str, Any] = {}
    for k, v in values.items():
        if k in nested and isinstance(v, dict):
            out.update(_flat(nested[k], v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def renamed_override(item: str) -> str:
    """An override ``section.key=value`` as it is written now: a former key (:func:`renamed_key`) under its new name,
    the value as given; any other item unchanged. For records of overrides written before a key moved.

    >>> renamed_override("rl.kl_coef=0.04"), renamed_override("rl.samples=5")
    ('grpo.kl_coef=0.04', 'rl.samples=5')
    """
    target = renamed_key(override_key(item)) if "=" in item else None
    return f"{target}={item.split('=', 1)[1]}" if target else item


BOOL_WORDS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}
"""What a boolean option reads as a boolean. Values are read as YAML 1.2
(:class:`finecap.utils.reading.StrictYAMLLoader`: only ``true`` / ``false`` are booleans), so ``yes``, ``no``, ``on``
and ``off`` reach the options as strings: a string option keeps them (``train.mixed_precision=no``), a boolean one
reads them here, and so does an option whose choices hold booleans (``decode.early_stopping=yes``)."""


def empty_path(value: Any, key: str) -> Any:
    """``""`` (no path) for a path option (:data:`~finecap.config.paths.PATH_KEYS`) set to YAML's ``null`` (``null``,
    ``~``) or, for a ``path`` key, to ``none`` in any case: ``train.init_from=null`` reads as everyday speech says,
    where the empty string is the option's own spelling; any other value as it is.

    >>> empty_path(None, "train.init_from"), empty_path("None", "train.init_from"), empty_path("none", "run.name")
    ('', '', 'none')
    """
    kind = PATH_KEYS.get(key)
    if kind is None:
        return value
    if value is None or (kind == "path" and isinstance(value, str) and value.strip().lower() in ("none", "null")):
        return ""
    return value


def refuse_nul_path(value: Any, key: str) -> None:
    r"""A :class:`ConfigError` naming ``key`` when a path option (:data:`~finecap.config.paths.PATH_KEYS`) holds a NUL
    character, which no file path (nor Hub name) can hold: the first file operation on it failed far from the
    configuration with a bare ``embedded null byte``, naming neither the option nor its value.

    >>> refuse_nul_path("runs/a", "run.root")
    >>> try:
    ...     refuse_nul_path("a\x00b", "run.root")
    ... except ConfigError as e:
    ...     print(e)
    run.root: 'a\x00b' holds a NUL character ('\x00'), which no file path can hold
    """
    if key in PATH_KEYS and isinstance(value, str) and "\x00" in value:
        raise ConfigError(f"{key}: {short_repr(value)} holds a NUL character ('\\x00'), which no file path can hold",
                          key=key)  # fmt: skip


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Return ``value`` converted to ``tp`` or raise a ConfigError naming ``key``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        word = value.strip().lower() if isinstance(value, str) else None
        booleans = any(isinstance(a, bool) for a in args)
        if booleans and word in BOOL_WORDS and not any(is_choice(value, a) for a in args):
            value = BOOL_WORDS[word]  # a choice that is a boolean (decode.early_stopping) reads the words as one does
        found = [a for a in args if is_choice(value, a)]
        if not found:
            choices = choices_text(args)
            raise ConfigError(
                f"{key}: invalid value {short_repr(value)}{did_you_mean(value, choices.split(', '))}; valid choices: "
                f"{choices}"
            )
        return found[0]  # the choice itself (a plain value, whatever YAML built)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}: expected {' | '.join(_type_name(a) for a in args)}, got {short_repr(value)}")
    if origin is list:
        if isinstance(value, str):  # "a,b" reads like [a, b], "a" like [a], "" like []
            text = value.strip()
            parts = [part.strip() for part in text.split(",")] if text else []
            if text.startswith("[") or text.endswith("]") or "" in parts:  # "[a,,b]" is no YAML list: not '[a', 'b]'
                raise ConfigError(f"{key}: {short_repr(value)} is not a list: an empty item or an unclosed bracket; "
                                  "write [a, b] or a,b")  # fmt: skip
            value = [_list_item(part, args[0]) for part in parts]
        elif not isinstance(value, list | tuple | dict):  # a single number or boolean
            value = [value]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: expected a list, got {short_repr(value)}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {short_repr(value)}")
        _refuse_unspaced_colon(value, key)
        return {_coerce(k, args[0], f"{key} key"): _coerce(v, args[1], f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in BOOL_WORDS:  # YAML 1.1's words, read as strings
            return BOOL_WORDS[value.strip().lower()]
        raise ConfigError(f"{key}: expected true/false, got {short_repr(value)}")
    if tp is int or tp is float:
        _refuse_yaml11_number(value, key)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return int(value)
        if isinstance(value, str) and (whole := _whole_number(value)) is not None:
            return whole
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {short_repr(value)} ({INTEGER_RULE})")
    if tp is float:
        number = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                number = None
        if number is None:
            raise ConfigError(f"{key}: expected a number, got {short_repr(value)}")
        if not math.isfinite(number):  # inf/nan in a learning rate or weight silently wrecks a run
            raise ConfigError(f"{key}: must be a finite number, got {short_repr(value)}")
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return getattr(value, "written", None) or str(value)  # as written: `0123`, not YAML 1.1's octal 83
        if value is None or isinstance(value, bool):  # `name: null`, `tag: true`: YAML's words, not the text
            word, meaning = ("null", "no value") if value is None else (str(value).lower(), "a boolean")
            raise ConfigError(f"{key}: expected a string, got {value}: YAML reads {word} as {meaning}; quote it "
                              f"for the text: {key.rsplit('.', 1)[-1]}: \"{word}\" in a file, {key}='\"{word}\"' on "
                              "the command line")  # fmt: skip
        hint = ""
        if isinstance(value, dict) and len(value) == 1:  # `vlm.prompt=Describe: the image` reads as a mapping
            ((k, v),) = value.items()
            if isinstance(k, str) and isinstance(v, str) and len(k) + len(v) < SHORT_REPR_LIMIT:  # text, not data
                hint = f" (YAML reads {k}: {v} as a mapping: quote the text, e.g. {key}='\"{k}: {v}\"')"
        raise ConfigError(f"{key}: expected a string, got {short_repr(value)}{hint}")
    raise ConfigError(f"{key}: unsupported field type {tp!r}")


WRITTEN_NUMBER = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?")
"""A number as text: decimal (``5``, ``5.0``) or in exponent notation (``1e5``, ``2.5E3``). PyYAML's YAML 1.1 reads
an exponent as a number only with a dot and a signed exponent (``1.0e+5``), else as the string; a quoted number
(``"5"``) is a string on every route. A float option converts the string, and an integer option takes it when its
value is whole (:data:`INTEGER_RULE`)."""

INTEGER_RULE = 'an integer option takes a whole number, however written: 5, 5.0, 5e0, "5" are 5'
"""The one rule of an integer option, which its refusal states: a whole number, whatever the spelling (an integer,
a float that is whole, exponent notation, quoted or not: ``train.max_steps=1e5`` is 100000, as ``1.0e+5`` was), as
a float option reads a number from any of them; ``5.5``, ``1e-3`` and ``"five"`` are refused."""


def _whole_number(text: str) -> int | None:
    """The whole number ``text`` writes (:data:`WRITTEN_NUMBER`), read exactly (``run.seed=12345678901234567891e0``
    is that seed, where a float would round it), else ``None``: not such a number, not whole (``1.5e0``), or of more
    than 100 digits (``1e999999999``: no option's bound comes near, and the integer alone would take gigabytes).

    >>> _whole_number("1e5"), _whole_number("2.5E3"), _whole_number("5"), _whole_number("5.0"), _whole_number("1.5e0")
    (100000, 2500, 5, 5, None)
    """
    text = text.strip()
    if not WRITTEN_NUMBER.fullmatch(text):
        return None
    number = decimal.Decimal(text)
    if number.adjusted() >= 100 or number != number.to_integral_value():
        return None
    return int(number)


def _refuse_yaml11_number(value: Any, key: str) -> None:
    """A :class:`ConfigError` naming ``key`` when ``value`` is a number YAML 1.1 read otherwise than it is written
    in decimal, which a numeric option would take silently: a leading zero (``run.seed: 010`` is octal 8) or a colon
    (``world.n_train: 12:30`` is base 60: 750). ``0x1F``, ``1_000`` and ``07`` (7 either way) are what they say.

    Example::

        >>> _refuse_yaml11_number(load_yaml("07"), "run.seed")
        >>> try:
        ...     _refuse_yaml11_number(load_yaml("010"), "run.seed")
        ... except ConfigError as e:
        ...     print(e)
        run.seed: '010' reads as 8 (YAML 1.1 reads a leading 0 as octal); write 10 (no leading 0), or 8
    """
    written = getattr(value, "written", None)
    if written is None:
        return
    digits = written.replace("_", "")
    if ":" in digits:
        how, fix = "a colon as base 60", f"write the number itself ({value})"
    elif re.fullmatch(r"[-+]?0[0-9]+", digits) and int(digits, 10) != value:
        how, fix = "a leading 0 as octal", f"write {int(digits, 10)} (no leading 0), or {value}"
    else:
        return
    raise ConfigError(f"{key}: {written!r} reads as {value} (YAML 1.1 reads {how}); {fix}", key=key)


def _refuse_unspaced_colon(value: dict[Any, Any], key: str) -> None:
    """A :class:`ConfigError` naming ``key`` when the mapping ``value`` holds a key with a colon and no value: YAML
    reads a colon as a key's end only before a space, so ``{cider:1}`` is the key ``'cider:1'`` with no value, which
    was refused as ``rl.rewards.cider:1: expected a number, got None``. The last colon is the one meant
    (``{pkg.mod:fn:2}`` is ``{pkg.mod:fn: 2}``). A key of digits is checked as written: YAML 1.1 reads ``{1:30}``
    as the key 90 (base 60), no value.

    >>> try:
    ...     _refuse_unspaced_colon({"cider:1": None}, "rl.rewards")
    ... except ConfigError as e:
    ...     print(e)
    rl.rewards: 'cider:1' is a key with no value: YAML ends a key at a colon only before a space; write {cider: 1}
    """
    for k, v in value.items():
        text = getattr(k, "written", k)
        if v is None and isinstance(text, str) and ":" in text.strip(":"):
            name, _, given = text.rpartition(":")
            raise ConfigError(f"{key}: {short_repr(text)} is a key with no value: YAML ends a key at a colon only "
                              f"before a space; write {{{name}: {given}}}", key=key)  # fmt: skip


def _list_item(text: str, tp: Any) -> Any:
    """One item of a comma-separated list value: a string for string lists, else read as YAML (``3`` -> 3)."""
    if tp is str or typing.get_origin(tp) is Literal:
        return text
    try:
        return load_yaml(text)
    except (yaml.YAMLError, ValueError):  # the text itself, for the field to judge
        return text


class FileSource(str):
    """The prefix of the errors about the values a YAML file set (``"recipe.yaml: "``), knowing the file (``path``),
    so that an error can name the line too (:meth:`at`): a string option given a YAML word (``name: null``, ``tag:
    true``) is refused naming the file and the line to quote."""

    path: Path

    def __new__(cls, path: str | Path) -> FileSource:
        source = super().__new__(cls, f"{path}: ")
        source.path = Path(path)
        return source

    def at(self, key: str) -> str:
        """``"recipe.yaml: line 3: "``: the prefix with the line of the file setting ``key`` (``section.key``, a
        nested section's ``section.sub.key``, a list's ``section.key[1]``, or ``a/b`` for a check across keys: the
        first the file sets), under its former name too (:data:`MOVED_KEYS`: ``rl.kl_coef`` for ``grpo.kl_coef``);
        the prefix alone when the file cannot say (it changed, or does not set the key). Read only for an error."""
        keys = [k.split("[")[0] for k in key.split("/")]
        keys += [old for k in keys for old, new in MOVED_KEYS.items() if new == k]
        try:
            root = StrictYAMLLoader(read_text_bounded(self.path, METADATA)).get_single_node()
        except (OSError, ValueError, yaml.YAMLError):
            return str(self)
        for dotted in keys:
            node, line = root, None
            for part in dotted.split("."):
                found = [(k, v) for k, v in getattr(node, "value", ()) if isinstance(node, yaml.MappingNode)
                         and isinstance(k, yaml.ScalarNode) and k.value == part]  # fmt: skip
                if not found:
                    break
                line, node = found[0][0].start_mark.line + 1, found[0][1]
            else:
                return f"{self}line {line}: "
        return str(self)


def _located(prefix: str, key: str | None) -> str:
    """An error's prefix ``prefix`` (:func:`_where`) with the line of the file setting ``key`` when the prefix names
    a file (:meth:`FileSource.at`), else as it is."""
    return prefix.at(key) if isinstance(prefix, FileSource) and key else prefix


Origins = dict[str, str]
"""Where each set key's value came from, as the prefix of its errors: ``{"train.lr": "override 'train.lr=x': "}``,
``{"world.n_train": "recipe.yaml: "}``. Keys set by no file or override (defaults, built-in layers) are absent."""


def _where(key: str | None, origins: Origins, source: str) -> str:
    """The prefix of an error about ``key`` (``"a/b"`` for a check across keys): the command-line override that set
    it, else the file, else an override of the same section (a cross-field check may name a key left at its
    default), else ``source``."""
    if not key:
        return source
    keys = [k.split("[")[0] for k in key.split("/")]
    found = [origins[k] for k in keys if k in origins]
    overrides = [o for o in found if o.startswith("override ")]
    if overrides or found:
        return (overrides or found)[0]
    sections = {k.split(".")[0] for k in keys}
    near = [o for k, o in origins.items() if k.split(".")[0] in sections and o.startswith("override ")]
    return near[0] if near else source


def _unknown_key(name: str, k: str, known: list[str], kind: str) -> str:
    """The message of an unknown key ``name.k``: what a Hugging Face name of this section's options is here
    (:data:`~finecap.config.hf_names.HF_NAMES`: ``decode.num_beams`` -> ``decode.beam_size``, where the closest key by
    spelling is ``finished_beams``; ``decode.max_new_tokens`` -> ``decode.max_length``, not the boost LLM's
    ``boost.max_new_tokens``), else the options of that very name elsewhere, a nested section's
    (``data.questions_column`` -> ``data.hf.questions_column``) or another section's (``train.beam_size`` ->
    ``decode.beam_size``, where the closest key of ``train`` is ``batch_size``), else what a Hugging Face name is here
    (``train.num_beams`` -> ``decode.beam_size``), else the closest key of the section, else the new name of the
    closest key the section had before it moved (:data:`MOVED_KEYS`: ``rl.kl_cof`` -> ``grpo.kl_coef``; a former
    ``model`` key's for ``model.kind=kind``), and the section's valid keys."""
    same = options_named(k, exclude=f"{name}.{k}")
    hf = HF_NAMES.get(k)
    if hf is not None and (hf.key or "").rsplit(".", 1)[0] == name:
        hint = hf_hint(k)
    elif same:
        hint = f" (did you mean {either(same)}?)"
    else:
        hint = hf_hint(k) or did_you_mean(k, known, f"{name}.")
    former = [key.split(".", 1)[1] for key in MOVED_KEYS if key.split(".")[0] == name]
    if not hint and (match := closest(k, former)) is not None:
        target = renamed_key(f"{name}.{match}") or moved_key(f"{name}.{match}", kind)
        hint = f" (did you mean {target!r}? {name}.{match} moved there)" if target else ""
    return f"unknown key {short_repr(f'{name}.{k}')}{hint}; valid keys of [{name}]: {', '.join(sorted(known))}"


def options_named(k: str, exclude: str = "") -> list[str]:
    """Every option (``section.key``, a nested section's ``section.sub.key``) whose own name is ``k``, but
    ``exclude``, in the order of :data:`SECTIONS`: what a key given without its section names
    (``options_named("max_steps")`` is ``["train.max_steps"]``)."""
    return [key for s, cls in SECTIONS.items() for key, _, _ in option_fields(cls, f"{s}.")
            if key.rsplit(".", 1)[-1] == k and key != exclude]  # fmt: skip


def either(names: list[str], most: int = 4) -> str:
    """``'a'``, ``'a' or 'b'``, ``'a', 'b' or 'c'`` (at most ``most`` names, then ``...``): the suggestions of a
    message."""
    shown = [repr(n) for n in names[:most]] + (["..."] if len(names) > most else [])
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


def replaced_section(section: Any, name: str, /, **changes: Any) -> Any:
    """The section ``section`` (named ``name``: ``decode``) with ``changes``, each converted and checked as a recipe's
    value is (a ``ConfigError`` naming ``name.key``): for callers that take options as keywords (the Python API).
    ``section`` and ``name`` are positional only, so that an option called ``name`` or ``section`` (``judge.name``,
    ``vlm.name``) is a change like any other.

    Example::

        >>> from finecap.config import DecodeConfig
        >>> replaced_section(DecodeConfig(), "decode", max_length=12.0).max_length
        12
    """
    return _build_section(name, type(section), {**dataclasses.asdict(section), **changes}, "", {})


def _build_section(name: str, cls: type, values: dict[str, Any], source: str, origins: Origins) -> Any:
    """Section ``cls`` named ``name`` (``data``, or ``data.hf`` for a nested one) from its mapping ``values``."""
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    nested = subsections(cls)
    kwargs = {}
    for k, v in values.items():
        key = f"{name}.{k}"
        where = _where(key, origins, source)
        if k not in known and key in MOVED_KEYS:
            kind = str(values.get("kind", ModelConfig.kind))
            raise ConfigError(f"{_located(where, key)}{_moved_message(key, kind)}", key=key)
        if k not in known:
            kind = str(values.get("kind", ModelConfig.kind))
            raise ConfigError(f"{_located(where, key)}{_unknown_key(name, k, known, kind)}", key=key)
        if k in nested:
            if v is not None and not isinstance(v, dict):
                inner = ", ".join(f.name for f in dataclasses.fields(nested[k]))
                at = _located(_where(_first_set(key, origins), origins, source), key)
                raise ConfigError(f"{at}{key} is a section: expected a mapping of its keys ({inner}), got "
                                  f"{short_repr(v)}", key=key)  # fmt: skip
            kwargs[k] = _build_section(key, nested[k], v or {}, source, origins)
            continue
        if key in SECRET_KEYS and v == MASK:  # a secret read back masked (a stored configuration) is unset
            v = ""
        try:
            kwargs[k] = _coerce(empty_path(v, key), hints[k], key)
            refuse_nul_path(kwargs[k], key)
        except ConfigError as e:
            message = f"{key}: expected {_type_name(hints[k])} (the value is not shown)" if looks_secret(key) else e
            raise ConfigError(f"{_located(where, key)}{message}", key=key) from None
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{_located(_where(e.key or name, origins, source), e.key or name)}{e}", key=e.key) from None


def _first_set(prefix: str, origins: Origins) -> str:
    """The first key under ``prefix`` (a nested section) that origins record, else ``prefix``."""
    return next((k for k in origins if k == prefix or k.startswith(prefix + ".")), prefix)


def _check_name(name: str, valid: Any, key: str, kind: str, dotted: bool = True) -> None:
    if (dotted and is_dotted_path(name)) or name in valid:
        return
    hint = " (or a dotted path 'pkg.module:factory')" if dotted else ""
    raise ConfigError(
        f"{key}: unknown {kind} {short_repr(name)}{did_you_mean(name, valid)}; valid names: "
        f"{', '.join(sorted(valid))}{hint}",
        key=key,
    )


def check_names(cfg: Config) -> None:
    """Registry names are checked when the configuration is loaded, not at first use (tables in the torch-free
    :mod:`finecap.registry`); ``train.best_metric`` must be ``loss``, ``perplexity`` or a value the chosen
    built-in validators return (any name when a validator is user code)."""
    _check_name(cfg.model.kind, BACKBONES, "model.kind", "backbone")
    _check_name(cfg.data.format, DATA_FORMATS, "data.format", "data set format")
    _check_name(cfg.train.objective, OBJECTIVES, "train.objective", "objective")
    _check_name(cfg.data.sampler, SAMPLERS, "data.sampler", "sampler")
    _check_name(cfg.decode.engine, ENGINES, "decode.engine", "generation engine")
    for name in cfg.rl.rewards:
        _check_name(name, REWARDS, "rl.rewards", "reward")
    for name in cfg.train.validators:
        _check_name(name, VALIDATOR_KEYS, "train.validators", "validator")
    for name in cfg.eval.metrics:
        _check_name(name, METRIC_GROUPS, "eval.metrics", "metric group")
    if any(is_dotted_path(v) for v in cfg.train.validators):
        return
    values = ["loss", "perplexity", *dict.fromkeys(k for v in cfg.train.validators for k in VALIDATOR_KEYS[v])]
    if cfg.train.best_metric not in values:
        raise ConfigError(
            f"train.best_metric: {short_repr(cfg.train.best_metric)}{did_you_mean(cfg.train.best_metric, values)} is "
            "not a "
            f"validation value of this run; available: {', '.join(values)} (train.validators adds values: "
            + ", ".join(f"{name} -> {', '.join(keys)}" for name, keys in VALIDATOR_KEYS.items())
            + ")",
            key="train.best_metric",
        )


def from_dict(data: dict[str, Any] | None, source: str = "", origins: Origins | None = None) -> Config:
    """Build a :class:`Config` from nested mappings ``{section: {key: value}}``. Errors start with where the value at
    fault was set (``origins``, see :func:`load`), else with ``source`` (e.g. ``"recipe.yaml: "``). A nested section
    is a mapping inside its section (``{"data": {"hf": {"image_column": "img"}}}``). A secret read back as
    :data:`MASK` (a stored configuration) is unset."""
    data = data or {}
    origins = origins or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}the configuration must be a mapping of sections, got {type(data).__name__}")
    data = renamed_keys(data, source)
    sections = {}
    for name, values in data.items():
        where = _where("/".join(k for k in origins if k.split(".")[0] == name), origins, source)
        if name not in SECTIONS:
            raise ConfigError(
                f"{_located(where, name)}unknown section {short_repr(name)}{did_you_mean(name, SECTIONS)}; valid "
                f"sections: {', '.join(SECTIONS)}"
            )
        if values is None:
            values = {}
        if not isinstance(values, dict):
            raise ConfigError(f"{_located(where, name)}section {short_repr(name)} must be a mapping of keys, got "
                              f"{short_repr(values)}: write each key below it, indented")  # fmt: skip
        sections[name] = _build_section(name, SECTIONS[name], values, source, origins)
    try:
        cfg = Config(**sections)  # the checks across sections (Section.check_config)
        check_names(cfg)
    except ConfigError as e:
        raise ConfigError(f"{_located(_where(e.key, origins, source), e.key)}{e}", key=e.key) from None
    return cfg


def override_key(item: str) -> str:
    """The dotted key an override ``section.key=value`` sets, as :func:`parse_override` reads it: the text before the
    first ``=`` with the white space around it and around each of its dots dropped (``' boost.llm_api_key =K'`` and
    ``'boost . llm_api_key=K'`` both set ``boost.llm_api_key``).

    White space is dropped rather than refused because it comes from quoting in shells and scripts (``"$A =$B"``, a
    tab in a pasted line), never from a key: no section or key has white space in its name. Every reader of an
    override's key goes through this one function, so the key that is set is also the key that is masked
    (:func:`masked_override`) wherever the command line is written.

    Example::

        >>> override_key(" boost . llm_api_key = sk-1")
        'boost.llm_api_key'
    """
    return ".".join(part.strip() for part in item.split("=", 1)[0].split("."))


def parse_override(item: str) -> tuple[list[str], Any]:
    """Parse ``section.key=value`` (value read as YAML: numbers, booleans, lists, mappings; anchors, aliases and
    duplicate keys refused, :func:`finecap.utils.reading.load_yaml`); the key as :func:`override_key` reads it, split
    at its dots (a nested section's key has three parts: ``data.hf.image_column=img``)."""
    if "=" not in item:
        raise ConfigError(f"override {_shown_override(item)}: expected section.key=value")
    raw = item.split("=", 1)[1]
    key = override_key(item)
    parts = key.split(".")
    if len(parts) < 2 or not all(parts):
        raise ConfigError(f"override {_shown_override(item)}: the key must look like section.key (e.g. train.lr=1e-4)")
    try:
        # a value starting with '#' is all comment to YAML (None): the text itself, as "a #1 photo" already is
        value = load_yaml(raw) if raw.strip() and not raw.strip().startswith("#") else raw.strip()
    except YAMLRefused as e:
        if e.kind != "alias":  # an anchor (a value to repeat: a bomb's start) or a duplicate key
            raise ConfigError(f"override {_shown_override(item)}: {e.reason}", key=key) from None
        value = raw  # an alias before any anchor never was YAML (`*best`): the text itself, as before
    except (yaml.YAMLError, ValueError):  # not YAML (or an integer of thousands of digits): the text itself
        value = raw
    if isinstance(value, str) and raw.strip()[:1] not in ("'", '"'):
        # YAML reads 1e-4 as a string; let the field type decide (a quoted value is the string YAML unquoted).
        value = raw.strip()
    return parts, value


OVERRIDE_SHOWN = 200
"""Characters of a command-line override an error message repeats at most (a path fits, a pasted file does not)."""


def masked_override(item: str) -> str:
    """A command-line argument as it may leave the process (a lock file, a model card, an error message): an override
    of a key named like a secret (:func:`~finecap.config.secrets.looks_secret`, the key read by :func:`override_key`,
    so any spelling of it is caught) as ``key=***``; any other argument with the credentials of the URLs in it masked
    (:func:`~finecap.config.secrets.masked_url_secrets`).

    The rule is the wide one on purpose: options merely named like a secret (``smile.first_token``, or
    ``boost.llm_api_key_env`` given the key itself by mistake) are masked too, but for a name's words for a text's
    tokens (:data:`~finecap.config.secrets.TEXT_TOKENS`: ``decode.max_new_tokens=20`` is shown as given). A command
    line is never the record of a value: the run's and each checkpoint's ``config.yaml`` hold every option, secrets
    alone masked.

    Example::

        >>> masked_override(" boost.llm_api_key =sk-1"), masked_override("boost.llm_base_url=http://u:p@h/v1")
        ('boost.llm_api_key=***', 'boost.llm_base_url=http://***@h/v1')
    """
    if "=" in item and looks_secret(key := override_key(item)):
        return f"{key}={MASK}"
    return masked_url_secrets(item)


def _shown_override(item: str) -> str:
    """An override ``section.key=value`` as error messages quote it: :func:`masked_override`, shortened
    (:func:`finecap.utils.text.short_repr`)."""
    return short_repr(masked_override(item.strip()), OVERRIDE_SHOWN)


def _section_copy(values: Any) -> Any:
    """A section's mapping copied (``None``: an empty one); any other value as it is, for :func:`from_dict` to refuse
    naming where it was set (``train: 5``, ``train: false``: never read as no keys)."""
    if values is None:
        return {}
    return dict(values) if isinstance(values, dict) else values


def merge_overrides(
    data: dict[str, Any], overrides: list[str], origins: Origins | None = None, warn: bool = True,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """``data`` with the dotlist ``overrides`` set; ``origins`` (when given) records which override set each key, as
    ``labels`` names it when it holds the override (a command-line option's words, ``--n-train -3``, for the override
    the option stands for), else as the override itself. ``warn``: log an override of a former key (read under its
    new name); ``False`` for a second merge of the same overrides (:func:`finecap.config.stored.load_stored` checks
    the stored file with them)."""
    data = {k: _section_copy(v) for k, v in (data or {}).items()}
    for item in overrides:
        parts, value = parse_override(item)
        key = ".".join(parts)
        if target := renamed_key(key):
            if warn:
                log.warning("override %s: %s is now %s (read as it)", _shown_override(item), key, target)
            key, parts = target, target.split(".")
        _check_nested(parts, item)
        try:
            mapping_at(data, parts[:-1])[parts[-1]] = value
        except ConfigError as e:  # a recipe's subsection that is no mapping: name the recipe
            raise ConfigError(f"{_located(_where(e.key, origins or {}, ''), e.key)}{e}", key=e.key) from None
        if origins is not None:
            origins[key] = f"{labels[item]}: " if labels and item in labels else f"override {_shown_override(item)}: "
    return data


def _check_nested(parts: list[str], item: str) -> None:
    """An override's key of more than two parts must name a nested section's key (``data.hf.image_column``): a
    :class:`ConfigError` naming the part that is no nested section otherwise (an unknown section is named later), and
    for a key of a mapping option (``rl.rewards.cider=1``) how to set the option (``rl.rewards='{cider: 1}'``)."""
    cls = SECTIONS.get(parts[0])
    for i, part in enumerate(parts[1:-1], start=1):
        if cls is None:
            return
        nested = subsections(cls)
        if part not in nested:
            at, prefix = ".".join(parts[: i + 1]), ".".join(parts[:i]) + "."
            if typing.get_origin(typing.get_type_hints(cls).get(part)) is dict and i == len(parts) - 2:
                value = item.split("=", 1)[1].strip()
                value = value if len(value) <= 40 else "..."  # the example's value: a word, not a pasted file
                example = masked_override(f"{at}='{{{parts[-1]}: {value}}}'")
                raise ConfigError(f"override {_shown_override(item)}: {at} is a mapping option, set whole (the keys "
                                  f"it leaves out are dropped): {example}", key=at)  # fmt: skip
            inner = f"; nested sections of [{'.'.join(parts[:i])}]: {', '.join(nested)}" if nested else ""
            hint = did_you_mean(part, nested, prefix)
            raise ConfigError(
                f"override {_shown_override(item)}: {at} is no nested section{hint}; a key looks like section.key "
                f"(e.g. train.lr=1e-4){inner}",
                key=at,
            )
        cls = nested[part]


def load(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    base: dict[str, Any] | None = None,
    over: dict[str, Any] | None = None,
    over_source: str = "",
    labels: dict[str, str] | None = None,
) -> Config:
    """Load ``path`` (YAML) and validate. Layers, lowest first: the dataclass defaults, ``base`` (settings beneath
    the recipe), the recipe, ``over`` (settings above the recipe, e.g. the demo's ``--quick``), then the dotlist
    ``overrides``. An error names where the value at fault was set: the override (``override 'train.lr=x': ...``, or
    its name in ``labels``: the command-line option it stands for, ``--n-train -3``), ``over_source`` for a value of
    ``over`` (``"finecap.train keywords: "``), or the recipe file."""
    data: dict[str, Any] = {k: _section_copy(v) for k, v in renamed_keys(base or {}).items()}
    origins: Origins = {}
    source = ""
    if path is not None:
        try:
            path = resolve_recipe(path)  # a YAML path, or a packaged recipe by name (finecap.recipes)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        from finecap.utils.reading import read_yaml_mapping

        try:
            loaded = read_yaml_mapping(path, "a recipe must be a mapping of sections")
        except ValueError as e:
            raise ConfigError(str(e)) from None
        source = FileSource(path)
        loaded = renamed_keys(loaded, source, warn=True)
        for name, values in loaded.items():
            if isinstance(values, dict) and isinstance(data.get(name), dict):
                data[name] = merged(SECTIONS.get(name), data[name], values)
            else:
                data[name] = values
            keys = list(_flat(SECTIONS.get(name), values, f"{name}.")) if isinstance(values, dict) else []
            origins.update({k: source for k in keys or [name]})
    data = with_over(data, over, over_source, origins)
    data = merge_overrides(data, overrides or [], origins, labels=labels)
    cfg = from_dict(data, source, origins)
    warn_unread(cfg, origins)
    warn_unexpanded(cfg, origins)
    warn_deprecated_secrets(cfg)
    return cfg


def with_over(data: dict[str, Any], over: dict[str, Any] | None, over_source: str, origins: Origins,
              warn: bool = True) -> dict[str, Any]:  # fmt: skip
    """Sections ``data`` with the settings ``over`` (``{section: {key: value}}``: keywords of the Python API, the
    demo's ``--quick``) on top, key by key (:func:`merged`); ``origins`` records ``over_source`` for each key set. A
    former key (``rl__kl_coef=0.1``: :func:`renamed_keys`) is read under its new name, ``warn``: saying so once, as
    for a recipe or an override (``False`` for a second merge of the same settings, as :func:`merge_overrides`)."""
    data = dict(data)
    for name, values in renamed_keys(over or {}, over_source, warn=warn).items():
        data[name] = merged(SECTIONS.get(name), data.get(name) or {}, values)
        keys = list(_flat(SECTIONS.get(name), values, f"{name}.")) if isinstance(values, dict) else []
        origins.update({k: over_source for k in keys or [name]})  # not the recipe's: it did not set them
    return data


def warn_unread(cfg: Config, origins: Origins) -> None:
    """A warning for each option a recipe or override set (``origins``) that nothing ``cfg`` configures reads
    (:meth:`Section.unread_options <finecap.config.fields.Section.unread_options>`: ``decode.temperature=0.7`` alone
    decodes greedily, ``clipcap.prefix_length`` with ``model.kind=blip``), naming the setting that would read it."""
    for f in dataclasses.fields(cfg):
        for key, (needs, have) in getattr(cfg, f.name).unread_options(cfg).items():
            if key in origins:
                log.warning("%s%s changes nothing: it is read with %s (this configuration has %s)", origins[key], key,
                            needs, have)  # fmt: skip


ENVIRONMENT_REFERENCE = re.compile(r"\$\{[^}]*\}|\$[A-Z_][A-Z0-9_]*\b")
"""What reads like a reference to an environment variable in a value: ``${NAME}`` (``${oc.env:NAME}``,
``${NAME:-default}``) or a shell's ``$NAME`` in capitals (``$HOME/data``). finecap expands none
(:func:`warn_unexpanded`)."""


def environment_references(value: Any) -> list[str]:
    """The references to environment variables (:data:`ENVIRONMENT_REFERENCE`) in ``value``, a string or the strings
    of a list or mapping, in order.

    >>> environment_references("${DATA_DIR}/coco.json"), environment_references(["a", "$HOME/x", "$5, $x"])
    (['${DATA_DIR}'], ['$HOME'])
    """
    if isinstance(value, str):
        return ENVIRONMENT_REFERENCE.findall(value)
    if isinstance(value, list | tuple):
        return [found for v in value for found in environment_references(v)]
    if isinstance(value, dict):
        return [found for v in (*value, *value.values()) for found in environment_references(v)]
    return []


def warn_unexpanded(cfg: Config, origins: Origins) -> None:
    """A warning for each option a recipe, a keyword or an override set (``origins``) whose value reads like a
    reference to an environment variable (``data.path: ${DATA_DIR}/coco.json``): finecap expands none, so the value
    is used as written, a folder named ``${DATA_DIR}`` or an API key of those characters. Not expanding is the rule
    (docs/configuration.md, "No environment variables in a recipe"): a run stores its configuration, and a secret
    expanded into it would be written to ``config.yaml``. The warning names where the value was set (a recipe's
    line) and the reference, never the value of a key named like a secret
    (:func:`~finecap.config.secrets.looks_secret`), and for a secret key the option that reads it from the
    environment (``boost.llm_api_key_env``)."""
    values = flat_options(cfg.to_dict())
    for key, origin in origins.items():
        found = environment_references(values.get(key))
        if not found:
            continue
        secret, value = looks_secret(key), values[key]
        shown = "the value" if secret else either(list(dict.fromkeys(found)))
        example = masked_url_secrets(value) if isinstance(value, str) and len(value) <= 80 else "...$NAME..."
        if key in DEPRECATED_SECRETS:
            advice = environment_advice(key)
        elif key.endswith("_env"):  # boost.llm_api_key_env: ${OPENAI_API_KEY} looks up a variable of that name
            advice = f"{key} names the variable itself, without $: {key}=OPENAI_API_KEY"
        else:
            advice = ("write the value itself, or set it on the command line, where the shell expands it: "
                      + (f'{key}="{example}"' if not secret else f"{key}=..."))  # fmt: skip
        log.warning("%s%s: %s is used as written: finecap expands no environment variables in a configuration "
                    "(docs/configuration.md#no-environment-variables-in-a-recipe); %s", _located(origin, key), key,
                    shown, advice)  # fmt: skip


_DEPRECATED_SAID = SaidOnce()


def warn_deprecated_secrets(cfg: Config) -> None:
    """A warning for each deprecated secret key ``cfg`` sets (:data:`~finecap.config.secrets.DEPRECATED_SECRETS`:
    ``boost.llm_api_key``), naming its replacement; once per key in a command (a command loading its configuration
    twice warns once; each call of the Python API is a command: :mod:`finecap.utils.once`). A stored configuration
    holds the key masked, read back unset: it is not warned about."""
    for key in DEPRECATED_SECRETS:
        section, name = key.split(".")
        if getattr(getattr(cfg, section), name) and _DEPRECATED_SAID.first(key):
            log.warning(deprecated_secret_message(key))


def describe(cls: type) -> list[tuple[str, str, Any, str]]:
    """(key, type, default, doc) rows of a section, for help output and documentation, a nested section's keys in
    its place (``hf.image_column``: :func:`~finecap.config.fields.option_fields`); the doc ends with the field's
    bounds (:func:`finecap.config.fields.constraint_text`) and why the upper one is where it is, when the field says
    (``Must be >= 1, <= 1024 (GPT-2's whole context).``)."""
    rows = []
    for key, f, tp in option_fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        bounds = constraint_text(f)
        why = f.metadata.get("why", "")
        text = f.metadata.get("doc", "") + (f" Must be {bounds}{f' ({why})' if why else ''}." if bounds else "")
        rows.append((key, _type_name(tp), default, text))
    return rows
