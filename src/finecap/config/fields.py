"""What a configuration field is: a default, a one-line doc and its own constraints, checked by one loop.

A section is a dataclass deriving from :class:`Section` whose fields are declared with :func:`doc`::

    prefix_length: int = doc(10, "Number of prefix embeddings.", ge=1, le=1024, why="GPT-2's whole context")

A field whose type is another section is a nested subsection (:func:`subsection`: ``data.hf``, the options only the
``hf`` data format reads), read from ``data: {hf: {image_column: img}}`` or ``data.hf.image_column=img``.

The bounds (``ge``, ``gt``, ``le``, ``lt``) and the allowed values of a ``Literal`` type are the field's own rules:
:func:`check_fields` reads them for every field when the section is constructed (:meth:`Section.__post_init__`),
so a section built by hand (``SmileConfig(first_token="x")``, as tests and the TRL adapter do) is refused like one
read from a recipe, with the same message. Rules that relate two fields stay in the section's ``__post_init__``
(after ``super().__post_init__()``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import field
from typing import Any, ClassVar, Literal

from finecap.config.secrets import MASK, SECRET_KEYS, masked_url_secrets, masked_url_values
from finecap.utils.text import short_repr

BOUNDS = ("ge", "gt", "le", "lt")
SYMBOLS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


class ConfigError(ValueError):
    """A configuration value is unknown, of the wrong type or invalid; the message names the key (``key``, when one
    is at fault: ``"train.lr"``, or ``"a/b"`` for a check across two keys). The credentials of every URL in the
    message are masked (:func:`~finecap.config.secrets.masked_url_secrets`): a message repeats values, and the error
    leaves the process through the Python API and tracebacks as well as the command line's ``finecap: error:``."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(masked_url_secrets(message))
        self.key = key


def doc(
    default: Any,
    text: str,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    why: str = "",
    url: bool = False,
) -> Any:
    """A dataclass field with a default (copied for mutable values), a one-line documentation string and optional
    bounds: ``ge`` (>=), ``gt`` (>), ``le`` (<=), ``lt`` (<); ``why`` says why an upper bound is where it is (the
    bounds of options that size memory or work), shown when it is crossed. ``None`` (an optional field unset) is
    never out of bounds. ``url``: the field holds a URL (a string, or a list of them), refused when it holds white
    space (:func:`url_problem`)."""
    bounds = {name: value for name, value in zip(BOUNDS, (ge, gt, le, lt), strict=True) if value is not None}
    metadata = {"doc": text, "bounds": bounds, "why": why, "url": url}
    if isinstance(default, list | dict):
        return field(default_factory=lambda d=default: type(d)(d), metadata=metadata)
    return field(default=default, metadata=metadata)


def subsection(cls: type[Section], text: str) -> Any:
    """A dataclass field holding the nested section ``cls`` (its defaults by default) with a one-line doc: its keys
    are ``<section>.<field>.<key>`` (``cls`` names itself so: ``class HfDataConfig(Section, name="data.hf")``)."""
    return field(default_factory=cls, metadata={"doc": text, "bounds": {}, "why": ""})


def subsections(cls: type) -> dict[str, type[Section]]:
    """``{field name: section class}`` of the fields of section class ``cls`` that are nested sections."""
    types = _field_types(cls)
    return {f.name: tp for f in dataclasses.fields(cls)
            if isinstance(tp := types[f.name], type) and issubclass(tp, Section)}  # fmt: skip


def option_fields(cls: type, prefix: str = "") -> list[tuple[str, dataclasses.Field, Any]]:
    """``(key, field, type)`` of every option of section class ``cls``, a nested section's options in its place as
    ``<field>.<key>`` (``hf.image_column``), each key after ``prefix``: the keys one can set, for listings (``finecap
    config --describe``, docs/config-reference.md)."""
    types = _field_types(cls)
    nested = subsections(cls)
    rows: list[tuple[str, dataclasses.Field, Any]] = []
    for f in dataclasses.fields(cls):
        if f.name in nested:
            rows += option_fields(nested[f.name], f"{prefix}{f.name}.")
        else:
            rows.append((f"{prefix}{f.name}", f, types[f.name]))
    return rows


def every_option(cls: type, needs: str, have: str, but: tuple[str, ...] = ()) -> dict[str, tuple[str, str]]:
    """``{key: (needs, have)}`` for every option of section class ``cls`` (keys named by its ``section_name``) but
    the keys in ``but``: what :meth:`Section.unread_options` returns for a section nothing reads under ``have``."""
    return {key: (needs, have) for key, _, _ in option_fields(cls, f"{cls.section_name}.") if key not in but}


def check(cond: bool, key: str, message: str) -> None:
    """A :class:`ConfigError` ``"<key>: <message>"`` unless ``cond`` (the cross-field checks of ``__post_init__``)."""
    if not cond:
        raise ConfigError(f"{key}: {message}", key=key)


def check_at_most(value: float, key: str, limit: float, why: str) -> None:
    """``value <= limit``, else a :class:`ConfigError` naming ``key`` and saying ``why`` (the message of an upper
    bound, for the values a field's metadata cannot reach: the items of a list or mapping)."""
    check(value <= limit, key, f"must be <= {limit}, got {short_repr(value, 30)} ({why})")


def constraint_text(f: dataclasses.Field) -> str:
    """A field's bounds as the reference documentation shows them: ``">= 1, <= 1024"``, ``"in [0, 1)"``, or ``""``."""
    bounds = f.metadata.get("bounds") or {}
    low = next(((name, bounds[name]) for name in ("ge", "gt") if name in bounds), None)
    high = next(((name, bounds[name]) for name in ("le", "lt") if name in bounds), None)
    if low and high and not f.metadata.get("why"):
        return f"in {'[' if low[0] == 'ge' else '('}{low[1]}, {high[1]}{']' if high[0] == 'le' else ')'}"
    return ", ".join(f"{SYMBOLS[bound[0]]} {bound[1]}" for bound in (low, high) if bound)


def _violated(value: Any, name: str, bound: float) -> bool:
    return not {"ge": value >= bound, "gt": value > bound, "le": value <= bound, "lt": value < bound}[name]


def field_problem(f: dataclasses.Field, value: Any) -> str | None:
    """Why ``value`` breaks the bounds of field ``f`` (``"must be >= 1, got 0"``), or ``None`` when it does not.

    Example::

        >>> import dataclasses
        >>> @dataclasses.dataclass
        ... class S:
        ...     k: int = doc(10, "Prefix length.", ge=1, le=1024, why="GPT-2's context")
        ...     p: float = doc(0.5, "A share.", ge=0, le=1)
        >>> k, p = dataclasses.fields(S)
        >>> field_problem(k, 0), field_problem(k, 2000), field_problem(p, 1.5), field_problem(k, 7)
        ('must be >= 1, got 0', "must be <= 1024, got 2000 (GPT-2's context)", 'must be in [0, 1], got 1.5', None)

    A bound with a reason (``why``) is reported alone with it; two bounds without one as the interval they make.
    """
    bounds = f.metadata.get("bounds") or {}
    if value is None or not bounds:
        return None
    broken = [name for name, bound in bounds.items() if _violated(value, name, bound)]
    if not broken:
        return None
    got = f", got {short_repr(value, 30)}"
    why = f.metadata.get("why", "")
    if len(bounds) == 2 and not why:
        return f"must be {constraint_text(f)}{got}"
    name = broken[0]
    reason = f" ({why})" if why and name in ("le", "lt") else ""
    return f"must be {SYMBOLS[name]} {bounds[name]}{got}{reason}"


def url_problem(url: str) -> str | None:
    """Why ``url``, the value of a URL option (:func:`doc` ``url=True``), is refused, or ``None``: a URL holds no
    white space (a space, a tab, a line break), so one that does is two URLs pasted together or a URL and a word,
    which were read as one URL with a space in its path. Its credentials are masked where a message shows it
    (:class:`ConfigError`).

    Example::

        >>> url_problem("http://localhost:8000/v1"), url_problem("")
        (None, None)
        >>> url_problem("http://h/v1 http://x")
        "holds white space ('http://h/v1 http://x'): a URL has none; two URLs pasted together? Give one"
    """
    if not any(c.isspace() for c in url):
        return None
    return f"holds white space ({short_repr(url)}): a URL has none; two URLs pasted together? Give one"


def url_values(value: Any, key: str) -> list[tuple[str, str]]:
    """``(key, url)`` of the URLs of a URL option's ``value``: the string itself, or each string of a list
    (``judge.urls[1]``)."""
    if isinstance(value, str):
        return [(key, value)]
    return [(f"{key}[{i}]", v) for i, v in enumerate(value or ()) if isinstance(v, str)]


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def choices_of(tp: Any) -> tuple[Any, ...] | None:
    """The allowed values of a ``Literal`` type (``None`` for any other type)."""
    return typing.get_args(tp) if typing.get_origin(tp) is Literal else None


def is_choice(value: Any, choice: Any) -> bool:
    """Whether ``value`` is the ``Literal`` value ``choice``: equal, and a boolean exactly when ``choice`` is one
    (Python has ``1 == True``, so ``decode.early_stopping=1`` was read as ``true`` while a boolean option refuses 1).

    >>> is_choice(True, True), is_choice(1, True), is_choice(0.0, False), is_choice("never", "never")
    (True, False, False, True)
    """
    return value == choice and isinstance(value, bool) == isinstance(choice, bool)


def choices_text(choices: tuple[Any, ...]) -> str:
    """The values of a ``Literal`` as messages list them, a boolean as YAML writes it.

    >>> choices_text((False, True, "never"))
    'false, true, never'
    """
    return ", ".join(str(c).lower() if isinstance(c, bool) else str(c) for c in choices)


def non_finite(value: Any, key: str) -> tuple[str, float] | None:
    """``(key, number)`` of the first NaN or infinite float in ``value`` (a number, or the items of a list or
    mapping: ``key[i]``, ``key.name``), or ``None``.

    >>> non_finite({"cider": 1.0, "retrieval": float("inf")}, "rl.rewards"), non_finite([1.0, 2], "x")
    (('rl.rewards.retrieval', inf), None)
    """
    if isinstance(value, float):
        return None if math.isfinite(value) else (key, value)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list | tuple) else ()
    for name, item in items:
        found = non_finite(item, f"{key}.{name}" if isinstance(value, dict) else f"{key}[{name}]")
        if found:
            return found
    return None


def check_fields(section: Any) -> None:
    """The one loop over a section's fields: every number finite (no NaN or infinity, in lists and mappings too),
    each value within its bounds (:func:`doc`), for a ``Literal`` type one of its values, and a URL option's URLs
    without white space (:func:`url_problem`); a
    :class:`ConfigError` naming ``<section>.<field>`` otherwise. A nested section checked itself when built."""
    types = _field_types(type(section))
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if isinstance(value, Section):
            continue
        key = f"{section.section_name}.{f.name}"
        bad = non_finite(value, key)
        if bad:
            raise ConfigError(f"{bad[0]}: must be a finite number, got {bad[1]}", key=bad[0])
        choices = choices_of(types[f.name])
        if choices is not None and not any(is_choice(value, c) for c in choices):
            raise ConfigError(f"{key}: invalid value {short_repr(value)}; valid choices: {choices_text(choices)}",
                              key=key)  # fmt: skip
        problem = field_problem(f, value)
        if problem:
            raise ConfigError(f"{key}: {problem}", key=key)
        for at, url in url_values(value, key) if f.metadata.get("url") else ():
            problem = url_problem(url)
            if problem:
                raise ConfigError(f"{at}: {problem}", key=key)


def masked_repr(section: Any) -> str:
    """``repr`` of a section (a dataclass), as the dataclass writes it but with its secrets masked as ``config.yaml``
    masks them (:func:`~finecap.config.secrets.redacted`): a :data:`~finecap.config.secrets.SECRET_KEYS` value set
    as ``'***'``, the credentials of every URL in a value as ``***@``. A configuration is printed where nobody means
    to publish it: a notebook's output, a failed assertion, a traceback with its locals."""
    shown = []
    for f in dataclasses.fields(section):
        if not f.repr:
            continue
        value = getattr(section, f.name)
        if f"{section.section_name}.{f.name}" in SECRET_KEYS and value:
            value = MASK
        elif not isinstance(value, Section):  # a nested section masks its own
            value = masked_url_values(value)
        shown.append(f"{f.name}={value!r}")
    return f"{type(section).__qualname__}({', '.join(shown)})"


class Section:
    """Base of the configuration sections: ``class SmileConfig(Section, name="smile")`` names the section its
    errors name (``smile.first_token``); constructing one checks every field (:func:`check_fields`). A section with
    cross-field rules checks them in its own ``__post_init__`` after calling this one. Its ``repr`` masks its secrets
    (:func:`masked_repr`; set here, before ``@dataclass`` runs, which keeps a ``__repr__`` the class has)."""

    section_name: ClassVar[str] = ""

    def __init_subclass__(cls, name: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.section_name = name or cls.section_name
        if "__repr__" not in cls.__dict__:
            cls.__repr__ = masked_repr  # type: ignore[method-assign]

    def __post_init__(self) -> None:
        check_fields(self)

    def check_config(self, cfg: Any) -> None:
        """Checks of this section's options against other sections of the whole configuration ``cfg`` (run when a
        :class:`~finecap.config.Config` is built); ``ConfigError`` naming the key to change. None by default."""

    def unread_options(self, cfg: Any) -> dict[str, tuple[str, str]]:
        """This section's options that nothing ``cfg`` configures reads, each with the setting that would read it
        and ``cfg``'s own (``{"decode.top_k": ("decode.strategy=sample", "decode.strategy=greedy")}``). Not refused
        (a stored configuration keeps options its run did not read): :func:`finecap.config.loading.load` warns
        about the ones a recipe or override set. None by default."""
        return {}
