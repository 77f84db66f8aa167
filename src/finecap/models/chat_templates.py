"""Chat templates rendered under bounds: a checkpoint's template is code, and a hostile one must not stall finecap.

A chat template (``chat_template.jinja``, or the ``chat_template`` field of ``tokenizer_config.json`` /
``processor_config.json``) is a Jinja program that transformers runs in a sandbox (``ImmutableSandboxedEnvironment``):
it cannot reach Python's internals, but nothing bounds its work. Jinja's sandbox caps one ``range`` at 100,000 items,
yet two nested loops make 10^10 iterations, ``{{ 'x' * 10**9 }}`` builds a gigabyte in one operation, and a macro that
calls itself twice doubles its work with every level. :func:`apply_chat_template` is ``owner.apply_chat_template``
(transformers' own code: the same messages, special tokens and options reach the template) with the template compiled
in :class:`BoundedSandbox`, a subclass of transformers' sandbox with its extensions, filters and globals, and rendered
under these bounds, each ending in :class:`ChatTemplateError` naming the template's file and the limit:

- **time**: :data:`MAX_SECONDS` for compiling and rendering, measured at every line of Python the template runs (its
  compiled code, its macros, Jinja's filters: a trace function, ``sys.settrace``, active only inside the template's
  own calls), so a loop that outputs nothing is stopped too, not only one that streams output;
- **output**: :data:`MAX_CHARS` characters, counted chunk by chunk as Jinja streams them (``Template.generate``);
- **values**: every operation that can build a large value in one step of C code, which no trace function can
  interrupt, is measured *before* it runs (operators ``+``, ``*``, ``**``, ``%``, concatenation ``~``, every filter
  and method call, slices, and the values printed): a result that could exceed :data:`MAX_CHARS` characters (an
  integer :data:`MAX_INT_BITS` bits; a conservative estimate, e.g. a string times the arguments' sizes for a call,
  see :func:`call_estimate`) is refused, and all the values one rendering builds together may not exceed
  :data:`MAX_WORK` characters, so no loop can pile up memory within its time;
- **recursion**: Python's own limit (a macro calling itself ends in ``RecursionError``), named like the others.

Measuring a value costs at most a pass over :data:`MAX_CHARS` elements (about a second), so a refusal comes within
about :data:`MAX_SECONDS` plus that. transformers has no hook for its compiler: during the call,
:func:`_bounded_compiler` puts :func:`compile_bounded` in place of its private ``_compile_jinja_template`` (which its
renderer looks up at each call) and puts the original back after, under a lock; the real templates of
tests/models/test_chat_template_limits.py render identically both ways. ``lipsum`` (Jinja's lorem-ipsum generator,
whose paragraph count multiplies its work) is not available to a chat template here.

Limits are far above a captioning prompt (hundreds to a few thousand characters, rendered in milliseconds), so a
real template never meets them; they are constants, not options, because no real template needs more. The prompt is
rendered once per captioner (:class:`finecap.models.vlm.Vlm` keeps it) and once per boost request.
"""

from __future__ import annotations

import contextlib
import functools
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_SECONDS = 5.0
"""Seconds a chat template may take to compile and render once."""
MAX_CHARS = 2_000_000
"""Characters of a rendered chat template, and of any one value it builds."""
MAX_WORK = 50_000_000
"""Characters of all the values one rendering builds (each measured operation's result, added up)."""
MAX_INT_BITS = 65_536
"""Bits of an integer a chat template may compute (about 20,000 digits)."""

ENVIRONMENT_OPTIONS = (
    *("block_start_string", "block_end_string", "variable_start_string", "variable_end_string"),
    *("comment_start_string", "comment_end_string", "line_statement_prefix", "line_comment_prefix"),
    *("trim_blocks", "lstrip_blocks", "newline_sequence", "keep_trailing_newline", "autoescape"),
)
"""The options of transformers' chat-template environment that :class:`BoundedSandbox` copies."""
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "processor_config.json", "tokenizer_config.json")
"""Files of a model folder that can hold its chat template, in the order transformers prefers them."""


PREFIX = "finecap.models.chat_templates"
"""Where the limits are defined, as error messages name them."""


class ChatTemplateError(ValueError):
    """A chat template that exceeds a bound or fails, named with its file (``finecap: error: ...``, exit 2)."""


class TemplateLimit(Exception):
    """Raised inside a rendering when a bound is exceeded; :func:`apply_chat_template` names the file."""


# -- measuring values ---------------------------------------------------------------------------------------------


def chars(value: Any, limit: int = MAX_CHARS) -> int:
    """At least the characters ``str(value)`` would take, counting a part shared by several containers at every
    place it appears (as ``str`` prints it); stops counting past ``limit`` (so the work is bounded by it too).
    An iterator counts 1 (it is measured when it is consumed)."""
    total, stack = 0, [value]
    while stack and total <= limit:
        v = stack.pop()
        if isinstance(v, str | bytes):
            total += len(v)
        elif isinstance(v, bool) or v is None:
            total += 5
        elif isinstance(v, int):
            total += v.bit_length() // 3 + 1
        elif isinstance(v, range):
            total += len(v)  # short as text, but as long as the values it stands for once a filter lists them
        elif isinstance(v, dict):
            total += 2 + 4 * len(v)
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list | tuple | set | frozenset):
            total += 2 + 2 * len(v)
            stack.extend(v)
        elif isinstance(v, jinja2.utils.Namespace):
            stack.append(object.__getattribute__(v, "_Namespace__attrs"))
        else:
            total += 24  # a number, an undefined value, a macro, a loop: short as text
    return total


def depth(value: Any, limit: int = 1000, nodes: int = MAX_CHARS) -> int:
    """How deeply containers nest in ``value`` (at most ``limit``, looking at no more than ``nodes`` values): the
    indentation levels of its JSON."""
    deepest, stack = 0, [(value, 0)]
    while stack and deepest < limit and nodes > 0:
        v, d = stack.pop()
        nodes -= 1
        deepest = max(deepest, d)
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list | tuple):
            stack.extend((x, d + 1) for x in v)
    return deepest


def size(value: Any) -> int:
    """What an argument multiplies a result by: an integer's magnitude (a width, a count), else its
    :func:`chars`."""
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value)
    return chars(value)


def call_estimate(first: Any, rest: list[Any]) -> int:
    """A bound on the characters of ``f(first, *rest)`` for any filter or method ``f`` a template can call: the
    receiver's characters times one plus the others' sizes (``s.replace(a, b)``: every character of ``s`` becoming
    ``b``; ``sep.join(items)``, ``s.center(n)``, ``s|indent(n)``, ``s|wordwrap(n, wrap)`` likewise), plus the
    arguments themselves."""
    n, others = chars(first), sum(size(v) for v in rest)
    return n * (1 + others) + n + others


class Budget:
    """The bounds of one compilation or rendering: its deadline and the characters built so far."""

    def __init__(self) -> None:
        self.deadline = time.monotonic() + MAX_SECONDS
        self.work = 0

    def refuse(self, what: str, estimate: int, bits: bool = False) -> None:
        """Stop if ``what`` would build more than :data:`MAX_CHARS` characters (``bits``: an integer of more than
        :data:`MAX_INT_BITS` bits)."""
        limit, unit, name = (MAX_INT_BITS, "bits", "MAX_INT_BITS") if bits else (MAX_CHARS, "characters", "MAX_CHARS")
        if estimate > limit:
            raise TemplateLimit(
                f"{what} would build about {estimate:,} {unit}, more than the limit of {limit:,} ({PREFIX}.{name})"
            )

    def spend(self, result: Any) -> Any:
        """Count ``result`` (just built) towards :data:`MAX_WORK`; returns it."""
        self.work += chars(result)
        if self.work > MAX_WORK:
            raise TemplateLimit(f"it builds more than {MAX_WORK:,} characters of values in all ({PREFIX}.MAX_WORK)")
        return result

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimit(f"it ran longer than the limit of {MAX_SECONDS:g} s ({PREFIX}.MAX_SECONDS)")


_local = threading.local()


def budget() -> Budget:
    """The budget of the rendering under way in this thread (a fresh one outside: Jinja evaluates constant
    expressions while compiling)."""
    return getattr(_local, "budget", None) or Budget()


@contextlib.contextmanager
def bounded(b: Budget) -> Iterator[None]:
    """Within the block, ``b`` is this thread's budget and its deadline is checked at every line of Python that runs
    (a trace function, restored to the previous one after)."""

    def tracer(frame: Any, event: str, arg: Any) -> Callable[..., Any] | None:
        b.check_time()
        return None if frame.f_code.co_filename == __file__ else tracer  # this module's loops are bounded already

    previous, saved = sys.gettrace(), getattr(_local, "budget", None)
    _local.budget = b
    sys.settrace(tracer)
    try:
        yield
    finally:
        sys.settrace(previous)
        _local.budget = saved


# -- the environment ------------------------------------------------------------------------------------------------


def _checked_filter(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    """``f`` with its arguments measured first (:func:`call_estimate`; an iterator is listed, so that it is measured)
    and its result counted (``functools.wraps`` keeps Jinja's ``pass_context`` marks)."""

    @functools.wraps(f)
    def checked(*args: Any, **kwargs: Any) -> Any:
        b = budget()
        data = [a for a in args if not isinstance(a, jinja2.runtime.Context | jinja2.nodes.EvalContext
                                                  | jinja2.Environment)]  # fmt: skip
        lead = len(args) - len(data)  # the context or environment Jinja passes first
        if data and isinstance(data[0], Iterator):
            data[0] = list(data[0])
            args = (*args[:lead], data[0], *args[lead + 1 :])
        first, rest = (data[0] if data else None), [*data[1:], *kwargs.values()]
        estimate = call_estimate(first, rest)
        if name in ("tojson", "pprint") and estimate <= MAX_CHARS:  # indentation repeats at every level
            indent = max((size(v) for v in rest if v is not None and not isinstance(v, bool)), default=0)
            estimate = chars(first) * (2 + indent * (1 + depth(first)))
        elif name == "sum" and first is not None and not all(isinstance(v, int | float) for v in first):
            estimate = chars(first) * len(first)  # adding lists or strings copies the partial sum at every item
        b.refuse(f"the filter {name!r}", estimate)
        return b.spend(f(*args, **kwargs))

    return checked


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """transformers' chat-template sandbox with every operation that could build a large value in one step measured
    first (module docstring)."""

    intercepted_binops = frozenset({"+", "*", "**", "%"})

    @staticmethod
    def concat(parts: Any) -> str:  # a macro's or a block's output, joined
        parts = list(parts)
        budget().refuse("joining output", sum(chars(p) for p in parts))
        return "".join(parts)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        b = budget()
        ints = isinstance(left, int) and isinstance(right, int)
        if operator == "**" and ints:
            bits = abs(left).bit_length() * max(right, 0) if abs(left) > 1 else 1
            b.refuse("a power (**)", bits, bits=True)
        elif operator == "*" and ints:
            b.refuse("a product (*)", left.bit_length() + right.bit_length(), bits=True)
        elif operator == "*" and isinstance(right, int | bool) and not isinstance(left, int | float):
            b.refuse("a repetition (*)", chars(left) * max(right, 0))
        elif operator == "*" and isinstance(left, int | bool) and not isinstance(right, int | float):
            b.refuse("a repetition (*)", chars(right) * max(left, 0))
        elif operator == "%" and isinstance(left, str):
            b.refuse("a % formatting", chars(left) + widths(left) + sum(size(v) for v in _items(right)))
        elif operator == "+":
            b.refuse("a sum (+)", chars(left) + chars(right))
        return b.spend(super().call_binop(context, operator, left, right))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (Jinja's names)
        b = budget()
        args = tuple(list(a) if isinstance(a, Iterator) else a for a in args)  # measured, then passed
        # the sandbox hands out str.format as a wrapper of the bound method (functools.update_wrapper: __wrapped__)
        receiver = getattr(__obj, "__self__", None) or getattr(getattr(__obj, "__wrapped__", None), "__self__", None)
        name = getattr(__obj, "__name__", None) or getattr(__obj, "name", None) or type(__obj).__name__
        if isinstance(receiver, str) and name in ("format", "format_map"):
            estimate = chars(receiver) + widths(receiver) + sum(size(v) for v in [*args, *kwargs.values()])
        elif isinstance(receiver, str | bytes | list | tuple | dict):
            estimate = call_estimate(receiver, [*args, *kwargs.values()])
        else:  # a function (a macro, which measures its own work, dict(), namespace(), range()): what it is given
            estimate = sum(size(v) for v in [*args, *kwargs.values()])
        b.refuse(f"calling {name!r}", estimate)
        return b.spend(super().call(__context, __obj, *args, **kwargs))

    def getitem(self, obj: Any, argument: Any) -> Any:
        value = super().getitem(obj, argument)
        return budget().spend(value) if isinstance(argument, slice) else value  # a slice is a new value


def widths(fmt: str) -> int:
    """The sum of the numbers written in a format string (``%5000d``, ``{:>5000}``): at most the padding its widths
    and precisions add (a number of 20 digits or more counts as 10**19)."""
    return sum(int(w) if len(w) < 20 else 10**19 for w in re.findall(r"\d+", fmt))


def _items(value: Any) -> list[Any]:
    """The arguments of ``fmt % value``."""
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        return list(value.values())
    return [value]


def _checked_join(join: Callable[[Any], str]) -> Callable[[Any], str]:
    """Jinja's concatenation ``a ~ b`` (``join``), its parts measured first."""

    def checked(parts: Any) -> str:
        b = budget()
        parts = list(parts)
        b.refuse("a concatenation (~)", sum(chars(p) for p in parts))
        return b.spend(join(parts))

    return checked


def _finalize(value: Any) -> Any:
    """Every printed value (``{{ ... }}``), measured before it becomes text."""
    b = budget()
    b.refuse("printing a value", chars(value))
    return value if isinstance(value, str) else b.spend(value)


def bounded_environment(base: jinja2.Environment) -> BoundedSandbox:
    """A :class:`BoundedSandbox` set up as ``base`` (transformers' chat-template environment): its options,
    extensions, globals, filters (each measured: :func:`_checked_filter`) and tests; without ``lipsum``."""
    options = {name: getattr(base, name) for name in ENVIRONMENT_OPTIONS}
    env = BoundedSandbox(**options, extensions=[type(e) for e in base.extensions.values()], finalize=_finalize)
    env.globals.update({k: v for k, v in base.globals.items() if k not in ("range", "lipsum")})  # range: safe_range
    env.globals.pop("lipsum", None)
    env.filters.update(base.filters)
    env.filters = {name: _checked_filter(name, f) for name, f in env.filters.items()}
    env.tests.update(base.tests)
    return env


class BoundedTemplate:
    """A compiled chat template whose ``render`` / ``generate`` keep the bounds (module docstring): what
    transformers' renderer calls in place of its own compiled template."""

    def __init__(self, template: jinja2.Template) -> None:
        self.template = template
        self.environment = template.environment  # transformers' assistant-mask tracker reads it

    def generate(self, *args: Any, **kwargs: Any) -> Iterator[str]:
        b, out = Budget(), 0
        chunks = self.template.generate(*args, **kwargs)
        while True:
            with bounded(b):
                chunk = next(chunks, None)
            if chunk is None:
                return
            out += len(chunk)
            if out > MAX_CHARS:
                raise TemplateLimit(f"it renders more than the limit of {MAX_CHARS:,} characters ({PREFIX}.MAX_CHARS)")
            yield chunk

    def render(self, *args: Any, **kwargs: Any) -> str:
        return "".join(self.generate(*args, **kwargs))


@functools.cache
def transformers_compiler() -> Callable[[str], Any]:
    """transformers' ``_compile_jinja_template`` (read once, before :func:`_bounded_compiler` first replaces it)."""
    from transformers.utils import chat_template_utils

    return chat_template_utils._compile_jinja_template


@functools.lru_cache(maxsize=16)
def compile_bounded(source: str) -> BoundedTemplate:
    """``source`` compiled in a :class:`BoundedSandbox` set up as transformers' environment (taken from
    transformers' compilation of an empty template, so that the hostile one is never compiled unbounded), under
    the time bound."""
    base = transformers_compiler()("").environment
    env = bounded_environment(base)
    with bounded(Budget()):
        template = env.from_string(source)
    # `~` compiles to a call of jinja2.runtime's str_join / markup_join, names of the compiled module's namespace
    namespace = template.root_render_func.__globals__
    for name in ("str_join", "markup_join"):
        namespace[name] = _checked_join(namespace[name])
    return BoundedTemplate(template)


_swap = threading.Lock()


@contextlib.contextmanager
def _bounded_compiler() -> Iterator[None]:
    """Within the block, transformers compiles chat templates with :func:`compile_bounded`: every transformers module
    holding its ``_compile_jinja_template`` (the renderer looks it up when it renders) holds ours instead. One thread
    at a time."""
    original = transformers_compiler()
    with _swap:
        modules = [m for name, m in list(sys.modules.items()) if name.startswith("transformers")]
        # the module's own namespace, never getattr: a lazy transformers module (5.19's) would import its submodule,
        # which may need a package that is not installed (torchvision)
        holders = [m for m in modules if getattr(m, "__dict__", {}).get("_compile_jinja_template") is original]
        for m in holders:
            m._compile_jinja_template = compile_bounded
        try:
            yield
        finally:
            for m in holders:
                m._compile_jinja_template = original


def template_file(owner: Any) -> str:
    """Where ``owner``'s (a tokenizer's or processor's) chat template was read from: the first file of
    :data:`TEMPLATE_FILES` in its folder, else its folder or name."""
    name = str(getattr(owner, "name_or_path", "") or getattr(getattr(owner, "tokenizer", None), "name_or_path", ""))
    folder = Path(name) if name else None
    if folder is not None and folder.is_dir():
        for file in TEMPLATE_FILES:
            path = folder / file
            if path.is_file() and (file.endswith(".jinja") or "chat_template" in path.read_text(errors="replace")):
                return str(path)
        return f"{folder} (its chat template)"
    return f"{name or type(owner).__name__} (its chat template)"


def apply_chat_template(owner: Any, conversation: Any, **kwargs: Any) -> Any:
    """``owner.apply_chat_template(conversation, **kwargs)`` (a tokenizer or processor) with the template compiled and
    rendered under the module's bounds; a template beyond one, or failing, raises :class:`ChatTemplateError` naming
    its file (:func:`template_file`) and the limit."""
    try:
        with _bounded_compiler():
            return owner.apply_chat_template(conversation, **kwargs)
    except TemplateLimit as e:
        raise ChatTemplateError(f"{template_file(owner)}: chat template refused: {e}") from None
    except RecursionError:
        raise ChatTemplateError(
            f"{template_file(owner)}: chat template refused: it recurses deeper than Python's limit "
            f"({sys.getrecursionlimit()} frames)"
        ) from None
    except (jinja2.TemplateError, OverflowError, MemoryError) as e:
        reason = " ".join(str(e).split())[:200] or type(e).__name__
        raise ChatTemplateError(f"{template_file(owner)}: the chat template fails: {reason}") from None
