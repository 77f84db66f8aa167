"""Bounded reads: how much of a file finecap reads at most, and strict JSON and YAML parsing."""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from finecap.utils.text import short_repr

MiB, GiB = 2**20, 2**30


class FileTooLarge(ValueError):
    """A file larger than finecap reads of its kind (:class:`SizeLimit`); a ``ValueError``: the command line prints
    the message (naming the file, its size, the limit and how to raise it) and exits with code 2."""


def _size_text(n: int) -> str:
    """``n`` bytes for a message: ``"10,000,000,000 bytes (9.3 GiB)"``."""
    unit = next(((name, size) for name, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)) if n >= size), None)
    return f"{n:,} bytes" + (f" ({n / unit[1]:.3g} {unit[0]})" if unit else "")


@dataclass(frozen=True)
class SizeLimit:
    """How many bytes finecap reads at most of one kind of file: ``what`` it is (for the message), the ``default``
    limit, ``why`` it is where it is, and ``env``, the environment variable that sets another limit (a whole number
    of bytes), for the kinds a real file may outgrow; ``None``: no real file of the kind comes near the limit.

    A limit is what stands between a 10 GB file (a sparse file takes no disk; a FIFO or a growing file need not
    have a size) and a ``MemoryError`` traceback: :func:`read_bounded` refuses a file over it before reading, and
    reads at most one byte more than it; :func:`read_lines` streams a file's lines, each within :data:`LINE`."""

    what: str
    default: int
    why: str
    env: str | None = None

    def limit(self) -> int:
        """The limit in bytes: :attr:`env` when set (a ``ValueError`` naming it when it is not a positive whole
        number), else :attr:`default`."""
        raw = os.environ.get(self.env, "").strip() if self.env else ""
        if not raw:
            return self.default
        try:
            value = int(raw.replace("_", ""))
        except ValueError:
            value = 0
        if value < 1:
            raise ValueError(f"{self.env}={short_repr(raw)}: must be a whole number of bytes >= 1 (the default is "
                             f"{self.default})")  # fmt: skip
        return value

    def refusal(self, path: str | Path, size: int | None, *, where: str = "") -> FileTooLarge:
        """The error for ``path`` (``where``: a line of it) being over the limit, ``size`` bytes or more."""
        how = f"set {self.env}=BYTES to read a larger one" if self.env else "is it the right file?"
        shown = _size_text(size) if size is not None else f"more than {self.limit():,} bytes"
        return FileTooLarge(f"{path}{where}: too large ({shown}): finecap reads at most {_size_text(self.limit())} "
                            f"of a {self.what} ({self.why}); {how}")  # fmt: skip


DATA_LIMIT_ENV = "FINECAP_MAX_DATA_BYTES"


CAPTION_TEXT = SizeLimit("caption file", MiB, "one image's captions, a line each")


"""A folder data set's ``.txt`` beside an image (:func:`finecap.data.formats.folder.read_folder`)."""


METADATA = SizeLimit("finecap file", 64 * MiB, "configurations, recipes, prompts and a run's records are kilobytes")


"""Files of a few kilobytes: recipes, ``config.yaml``, prompt files, and what finecap records in a run or
checkpoint folder (``captioner.json``, ``trainer_state.json``, fingerprints, timings, lock records)."""


DATA_FILE = SizeLimit("data file", 2 * GiB, "read whole into memory, which takes several times its size",
                      DATA_LIMIT_ENV)  # fmt: skip


"""JSON files read whole: data sets (Karpathy, COCO: 150 MB for COCO's), predictions, references, bags files, a
run's captions and results; and the total of a line file read into memory (``metrics.jsonl``)."""


LINE = SizeLimit("line", 16 * MiB, "one record or event a line; a record is kilobytes")


"""One line of a file read line by line (:func:`read_lines`): JSONL data sets, ``captions.jsonl`` and
``captions.csv``, ``metrics.jsonl``, boost's cache; their size is not bounded (they are streamed) unless asked."""


def checked_size(path: str | Path, limit: SizeLimit) -> int:
    """The size of ``path`` (``st_size``; 0 for a FIFO or device, which :func:`read_bounded` bounds as it reads), a
    :class:`FileTooLarge` when it is over ``limit``; ``OSError`` when it cannot be read."""
    size = os.stat(path).st_size
    if size > limit.limit():
        raise limit.refusal(path, size)
    return size


def read_bounded(path: str | Path, limit: SizeLimit) -> bytes:
    """The bytes of ``path``, at most ``limit``: a :class:`FileTooLarge` naming the file, its size and the limit
    when its size is over (checked before reading) or it gives more while read (a growing file, a FIFO). The one
    way finecap reads a whole file it was given or finds in a run folder."""
    n = limit.limit()
    checked_size(path, limit)
    with open(path, "rb") as f:
        data = f.read(n + 1)
    if len(data) > n:
        raise limit.refusal(path, None)
    return data


def read_text_bounded(path: str | Path, limit: SizeLimit) -> str:
    """:func:`read_bounded` decoded as UTF-8 (``UnicodeDecodeError`` when it is not)."""
    return read_bounded(path, limit).decode("utf-8")


def text_lines(text: str) -> list[str]:
    r"""The lines of ``text`` (JSON Lines, already read), split at ``\n`` (a ``\r`` before it dropped) and at nothing
    else: ``str.splitlines`` also splits at U+2028, U+2029, U+0085 and a few control characters, which a JSON string
    may hold unescaped (``json.dumps(..., ensure_ascii=False)`` writes them so), and would cut such a line in two.

    >>> text_lines('{"a": "one\u2028two"}\r\n{"b": 2}\n')
    ['{"a": "one\u2028two"}', '{"b": 2}']
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final line end ends the last line, it starts none
    return [line.removesuffix("\r") for line in lines]


def read_lines(
    path: str | Path,
    *,
    total: SizeLimit | None = None,
    line: SizeLimit = LINE,
    encoding: str = "utf-8",
    newline: str | None = None,
) -> Iterator[str]:
    """The lines of the text file ``path``, read one at a time, each with its line end (the last may have none): a
    :class:`FileTooLarge` naming the file and the line when one is longer than ``line`` (in characters), or, with
    ``total``, when the file is larger than it (checked before reading, and counted while reading). ``newline``:
    as ``open``'s (``""`` for ``csv``)."""
    most = line.limit()
    whole = total.limit() if total is not None else None
    if total is not None:
        checked_size(path, total)
    seen = 0
    with open(path, encoding=encoding, newline=newline) as f:
        for lineno in itertools.count(1):
            text = f.readline(most + 1)
            if not text:
                return
            if len(text) > most:
                raise line.refusal(path, None, where=f", line {lineno}")
            seen += len(text)
            if whole is not None and seen > whole:
                raise total.refusal(path, None)  # type: ignore[union-attr]
            yield text


class JSONRefused(ValueError):
    """A JSON text :func:`parse_json` refuses; the message names where (the file, the line) and what is wrong.
    ``kind``: ``"encoding"`` (not UTF-8) or ``"syntax"`` (not JSON), the text is not JSON at all; ``"duplicate"`` (a
    key twice in an object), ``"depth"`` (nesting too deep) or ``"number"`` (an integer of over 4,300 digits, past
    Python's limit), JSON finecap does not read (format detection tells the two apart). ``detail``: what is wrong,
    without where."""

    def __init__(self, message: str, kind: str, detail: str) -> None:
        super().__init__(message)
        self.kind, self.detail = kind, detail

    @property
    def syntax(self) -> bool:
        """Whether the text is not JSON at all (not UTF-8, or a syntax error)."""
        return self.kind in ("encoding", "syntax")


class _DuplicateKey(Exception):
    """Raised by :func:`_unique_keys` inside ``json.loads``, which knows no position: :func:`_find_duplicate` finds
    it."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook``: the object, unless a key is in it twice."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        raise _DuplicateKey(next(k for k, _ in pairs if k in seen or seen.add(k)))  # type: ignore[func-returns-value]
    return obj


def _position(text: str, offset: int, one_line: bool) -> str:
    """``line L, column C`` of ``offset`` in ``text`` (``column C`` alone for one line of a JSONL file)."""
    column = offset - text.rfind("\n", 0, offset)
    return f"column {column}" if one_line else f"line {text.count(chr(10), 0, offset) + 1}, column {column}"


def _find_duplicate(text: str) -> int | None:
    """The offset of the first object (its ``{``) holding a key twice, found by parsing ``text`` again with the
    pure-Python scanner, which passes positions (only after the fast parse met a duplicate); ``None`` when that
    parser cannot say (it recurses deeper per level than the C one)."""
    import json.decoder
    import json.scanner

    def parse_object(s_and_end: tuple[str, int], *args: Any, **kwargs: Any) -> tuple[dict[str, Any], int]:
        pairs, end = json.decoder.JSONObject(s_and_end, *args, **kwargs)
        if len({k for k, _ in pairs}) != len(pairs):
            raise _DuplicateKey(str(s_and_end[1] - 1))
        return dict(pairs), end

    decoder = json.JSONDecoder(object_pairs_hook=list)
    decoder.parse_object = parse_object  # type: ignore[assignment]
    decoder.scan_once = json.scanner.py_make_scanner(decoder)
    try:
        decoder.decode(text)
    except _DuplicateKey as e:
        return int(e.key)
    except (ValueError, RecursionError):
        return None
    return None


JSON_DEPTH_SHOWN = 500


"""How deep a JSON text a refusal for nesting says it is at least (Python's parser stops near 1,000 levels; data
files nest a few): the first place the text passes it is named."""


_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.S)


def _too_deep(text: str, depth: int = JSON_DEPTH_SHOWN) -> int | None:
    """The offset where ``text`` first opens its ``depth + 1``-th nested array or object (strings skipped), or
    ``None`` when it never does."""
    level = 0
    for m in _JSON_TOKEN.finditer(text):
        token = m.group()
        if token in "[{":
            level += 1
            if level > depth:
                return m.start()
        elif token in "]}":
            level -= 1
    return None


def parse_json(data: str | bytes, where: str | Path, *, one_line: bool = False, constants: bool = True) -> Any:
    """The JSON value in ``data`` (a whole file's text or bytes, or with ``one_line`` one line of a JSONL file),
    read strictly; else a :class:`JSONRefused` (a ``ValueError``) naming ``where`` (the file, or ``"<file>, line
    <n>"``) and the place in it (line and column; the column alone for one line):

    - not JSON: ``invalid JSON at line L, column C: <why>``; bytes not UTF-8 (nor UTF-16/32, as ``json.loads``
      reads them): ``not a UTF-8 text file``;
    - an object holding one key twice (``{"split": "val", "split": "train"}``): JSON parsers keep one of the two
      values, which one depends on the parser, so the file does not say what it means: refused, naming the key and
      the object's place;
    - nested more deeply than Python's parser goes (a bare ``RecursionError`` otherwise): refused, naming the
      first place nested more than :data:`JSON_DEPTH_SHOWN` levels;
    - with ``constants=False``, ``NaN``, ``Infinity`` and ``-Infinity`` (which Python reads and JSON does not have):
      refused as not JSON (the reward server's requests).

    The one parser of every JSON and JSONL file finecap reads (:func:`read_json`, :mod:`finecap.data.json_files`);
    refusing duplicates costs nothing measurable (``dict`` of the pairs, compared by length).

    Example::

        >>> parse_json('{"a": [1, 2]}', "x.json")
        {'a': [1, 2]}
        >>> try:
        ...     parse_json('{"a": 1,\\n "a": 2}', "x.json")
        ... except ValueError as e:
        ...     print(str(e).split(";")[0])
        x.json: duplicate key 'a' in the object at line 1, column 1
    """
    if isinstance(data, bytes | bytearray):
        try:
            text = data.decode(json.detect_encoding(data))  # strict: encoded surrogates are not UTF-8 either
        except UnicodeDecodeError as e:
            raise JSONRefused(f"{where}: not a UTF-8 text file ({e.reason})", "encoding", e.reason) from None
    else:
        text = data
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=None if constants else _no_constant)
    except _NotJsonConstant as e:
        detail = f"invalid JSON: {e.args[0]} is not JSON"
        raise JSONRefused(f"{where}: {detail}", "syntax", detail) from None
    except json.JSONDecodeError as e:
        at = f"{'' if one_line else f'line {e.lineno}, '}column {e.colno}"
        detail = f"invalid JSON at {at}: {e.msg}{_separator_hint(e.doc, e.pos, at, one_line)}"
        raise JSONRefused(f"{where}: {detail}", "syntax", detail) from None
    except _DuplicateKey as e:
        offset = _find_duplicate(text)
        place = f" in the object at {_position(text, offset, one_line)}" if offset is not None else ""
        detail = (f"duplicate key {short_repr(e.key)}{place}; JSON readers keep one of the two values (which one "
                  "depends on the reader): keep one key")  # fmt: skip
        raise JSONRefused(f"{where}: {detail}", "duplicate", detail) from None
    except ValueError as e:  # Python's limit on the digits of an integer (a JSONDecodeError is caught above)
        too_long = "integer string conversion" in str(e)
        detail = "invalid JSON: a number too long to read (over 4,300 digits)" if too_long else f"invalid JSON: {e}"
        raise JSONRefused(f"{where}: {detail}", "number", detail) from None
    except RecursionError:
        offset = _too_deep(text)
        place = f" (more than {JSON_DEPTH_SHOWN} levels at {_position(text, offset, one_line)})" if offset else ""
        detail = f"JSON nested too deeply to read{place}; data files nest a few levels"
        raise JSONRefused(f"{where}: {detail}", "depth", detail) from None


_SEPARATORS = {"\u2028": "LINE SEPARATOR", "\u2029": "PARAGRAPH SEPARATOR", "\x85": "NEXT LINE"}
"""Characters editors show as line breaks, which JSON does not read as white space (space, tab, ``\\n``, ``\\r``)."""


def _separator_hint(text: str, pos: int, at: str, one_line: bool) -> str:
    """What to add to a syntax error at ``pos`` of ``text`` (``at``: that place, written) when the character there
    is one of :data:`_SEPARATORS`: it looks like a line break and is none (a JSONL line holding two records split by
    one is one line, refused as ``Extra data``); else ``""``."""
    char = text[pos] if 0 <= pos < len(text) else ""
    if char not in _SEPARATORS:
        return ""
    where = "JSON Lines ends a line at \\n only" if one_line else "JSON's white space is space, tab, \\n and \\r"
    return (f"; the character U+{ord(char):04X} ({_SEPARATORS[char]}) at {at} is no line break in JSON, though "
            f"editors show it as one ({where}): replace it with \\n, or remove it")  # fmt: skip


class _NotJsonConstant(Exception):
    pass


def _no_constant(name: str) -> Any:
    raise _NotJsonConstant(name)


def read_json(path: str | Path, limit: SizeLimit = METADATA) -> Any:
    """The JSON value in ``path``, read whole within ``limit`` (:func:`read_bounded`; the default for finecap's own
    records, :data:`DATA_FILE` for data) and strictly (:func:`parse_json`); a ``ValueError`` naming the file when it
    is not JSON, holds a key twice in an object or is nested too deeply."""
    path = Path(path)
    return parse_json(read_bounded(path, limit), path)


class YAMLRefused(yaml.YAMLError):
    """Something finecap refuses in a YAML file it reads (:class:`StrictYAMLLoader`): ``reason`` says what, ``line``
    (1-based) where, ``kind`` which refusal (``"anchor"``, ``"alias"``, ``"merge"`` or ``"duplicate"``); ``str()`` is
    ``"line N: reason"``."""

    def __init__(self, reason: str, line: int, kind: str):
        super().__init__(f"line {line}: {reason}")
        self.reason, self.line, self.kind = reason, line, kind


_YAML_1_1_ONLY = ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:timestamp")
"""The implicit types of PyYAML's YAML 1.1 that :class:`StrictYAMLLoader` does not read as such (booleans then come
back with YAML 1.2's words alone; a date stays the string it is written as)."""


class StrictYAMLLoader(yaml.SafeLoader):
    """The one YAML loader of finecap's readers of user files (recipes, stored ``config.yaml``, command-line override
    values, prompt files): ``yaml.SafeLoader`` that also refuses

    - **anchors and aliases** (``&a`` / ``*a``): an alias repeats a value without copying it, so a few hundred bytes
      of nested aliases ("billion laughs") stand for billions of values, which any code printing or walking the
      value (an error message) expands; a recipe has no need for them;
    - **duplicate keys** at any depth: YAML keeps the last of two equal keys silently, so a recipe holding a
      section twice would lose the first; the error names the key and both lines;
    - **merge keys** (``<<``): without an alias (``<<: {lr: 2}``) they still merged, and a key written beside one
      silently won over the merged one (``lr: 1`` and ``<<: {lr: 2}``: 1), a duplicate the check above never saw.

    Both raise :class:`YAMLRefused` (a ``yaml.YAMLError``) before any value is built. Read with :func:`load_yaml`.

    Booleans are YAML 1.2's: ``true`` and ``false`` (any case) alone. PyYAML's YAML 1.1 also reads ``yes``, ``no``,
    ``on`` and ``off`` as booleans, so that ``train.mixed_precision=no`` (a string option whose choices are ``no``,
    ``fp16``, ``bf16``) arrived as ``False`` and was refused; they are now strings, which a string option keeps and
    a boolean option reads as the boolean they name (:func:`finecap.config.loading` ``_coerce``).

    Dates are YAML 1.2's too: none. YAML 1.1 reads ``2024-01-01`` (and ``2024-01-01T10:00:00``) as a date, which no
    option takes, so a run, a data folder or a prompt named by its date was refused (``run.name: expected a string,
    got datetime.date(2024, 1, 1)``); such a value is now the string it is written as.
    """

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in _YAML_1_1_ONLY]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        alias = isinstance(event, yaml.AliasEvent)
        if alias or getattr(event, "anchor", None) is not None:
            mark = f"{'*' if alias else '&'}{event.anchor}"
            raise YAMLRefused(
                f"YAML anchors and aliases are not allowed (found {short_repr(mark, 30)}): write the value out in "
                "full",
                event.start_mark.line + 1,
                "alias" if alias else "anchor",
            )
        return super().compose_node(parent, index)

    def compose_document(self) -> Any:
        node = super().compose_document()
        self._refuse_duplicate_keys(node)
        return node

    def _refuse_duplicate_keys(self, root: Any) -> None:
        stack = [(root, "")]
        while stack:  # a loop, not recursion: nesting as deep as the composer allows
            node, where = stack.pop()
            if isinstance(node, yaml.SequenceNode):
                stack += [(item, f"{where}[{i}]") for i, item in enumerate(node.value)]
            if not isinstance(node, yaml.MappingNode):
                continue
            seen: dict[Any, int] = {}
            for key_node, value_node in node.value:
                name = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
                dotted = f"{where}.{name}" if where else str(name)
                stack.append((value_node, dotted))
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag == "tag:yaml.org,2002:merge":
                    raise YAMLRefused(
                        f"YAML merge keys are not allowed (found '<<' in {short_repr(where or 'the top level')}): "
                        "write the keys out in the mapping itself",
                        key_node.start_mark.line + 1,
                        "merge",
                    )
                if not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node)  # as YAML compares keys: `1` and `0x1`, `yes` and `true`
                line = key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:  # unhashable: the constructor names it
                    continue
                if first is not None:
                    lines = f"twice on line {line}" if first == line else f"at lines {first} and {line}"
                    raise YAMLRefused(
                        f"duplicate key {short_repr(dotted)} {lines} (YAML would keep only the last silently): "
                        "merge them into one",
                        line,
                        "duplicate",
                    )
                seen[key] = line


StrictYAMLLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


class WrittenInt(int):
    """An integer :class:`StrictYAMLLoader` read, with the text it was written as (``written``): YAML 1.1 reads
    ``0123`` as octal 83, ``1:30`` as 90 and ``1_000`` as 1000, so a string option given such a value keeps the text
    (:func:`finecap.config.loading` ``_coerce``), never the number's digits."""

    written: str


class WrittenFloat(float):
    """A float :class:`StrictYAMLLoader` read, with the text it was written as (``written``: ``2024.10``, which the
    float prints as ``2024.1``)."""

    written: str


def _written(number_type: type, construct: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def constructor(loader: Any, node: Any) -> Any:
        value = number_type(construct(loader, node))
        value.written = node.value
        return value

    return constructor


StrictYAMLLoader.add_constructor("tag:yaml.org,2002:int", _written(WrittenInt, yaml.SafeLoader.construct_yaml_int))
StrictYAMLLoader.add_constructor(
    "tag:yaml.org,2002:float", _written(WrittenFloat, yaml.SafeLoader.construct_yaml_float)
)


def load_yaml(text: str) -> Any:
    """``text`` read as YAML with :class:`StrictYAMLLoader` (``yaml.safe_load`` without anchors, aliases or
    duplicate keys): :class:`YAMLRefused` or another ``yaml.YAMLError`` when it cannot be."""
    loader = StrictYAMLLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def yaml_error_text(error: yaml.YAMLError) -> str:
    """A YAML syntax error on one line, where it is first: ``" at line 2, column 5: expected ',' or ']', but got
    '<stream end>' (while parsing a flow sequence that started at line 1, column 5)"`` (PyYAML's own message spans
    several lines, each place named as ``in "<unicode string>"``). A tab PyYAML stops at (:func:`_tab_problem`) is
    said in words: ``" at line 2, column 1: a tab in the indentation: YAML allows no tabs there; indent with
    spaces"``."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    if (tab := _tab_problem(problem, mark)) is not None:
        return f"{where}: {tab}"
    context, context_mark = getattr(error, "context", None), getattr(error, "context_mark", None)
    started = f" at line {context_mark.line + 1}, column {context_mark.column + 1}" if context_mark is not None else ""
    return f"{where}: {problem}" + (f" ({context}{started})" if context else "")


def _tab_problem(problem: str, mark: Any) -> str | None:
    """What a tab PyYAML refuses (``found character '\\t' that cannot start any token``, its words for every tab
    outside a quoted text) means at ``mark``, else ``None``: in a line's indentation, that YAML indents with spaces
    only (an editor's tab key, a pasted block); elsewhere (after ``key:``, before a ``#`` comment, inside a plain
    value), that PyYAML reads no tab between a value's parts, so a space goes there, or the text is quoted."""
    if "'\\t'" not in problem:
        return None
    buffer, pointer = getattr(mark, "buffer", None), getattr(mark, "pointer", None)
    if isinstance(buffer, str) and isinstance(pointer, int):
        start = buffer.rfind("\n", 0, pointer) + 1
        if buffer[start:pointer].strip(" \t"):  # text before the tab on its line: not the indentation
            return ("a tab; PyYAML reads no tab between a key, its value and a comment, nor inside an unquoted "
                    "value: write a space, or quote the text")  # fmt: skip
    return "a tab in the indentation: YAML allows no tabs there; indent with spaces"


def read_yaml_mapping(path: str | Path, expected: str) -> dict[str, Any]:
    """A YAML file holding a mapping (an empty file is ``{}``); ``ValueError`` naming the file otherwise (not UTF-8,
    not YAML, not a mapping), with ``expected`` saying what the mapping should hold. Read with :func:`load_yaml`:
    anchors, aliases and duplicate keys are refused, naming the file and the line."""
    path = Path(path)
    raw = read_bounded(path, METADATA)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:  # a bare "'utf-8' codec can't decode byte 0xff in position 0" named no file
        utf16 = raw[:2] in (b"\xff\xfe", b"\xfe\xff")
        how = ": it is UTF-16 (Windows' 'Unicode'); save it as UTF-8" if utf16 else ""
        raise ValueError(f"{path}: not a UTF-8 text file ({e.reason} at byte {e.start}){how}") from None
    try:
        data = load_yaml(text) or {}
    except YAMLRefused as e:
        raise ValueError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: invalid YAML{yaml_error_text(e)}") from None
    except ValueError as e:  # a value Python cannot build, e.g. an integer of more than 4300 digits
        raise ValueError(f"{path}: invalid YAML value: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: {expected}")
    return data


def unfinished_line(path: str | Path) -> bytes:
    """The bytes after the last newline of the file ``path``: a line its writer did not finish (a killed run's), or
    ``b""`` when the file is empty or ends in a newline. Read from the end, at most :data:`LINE` bytes and one more
    (a longer unfinished line is returned cut to them: no line of finecap's is that long).

    Example::

        >>> path = Path(cache_dir) / "log.jsonl"
        >>> _ = path.write_bytes(b'{"a": 1}\\n{"a"')
        >>> unfinished_line(path)
        b'{"a"'
    """
    with Path(path).open("rb") as f:
        size = f.seek(0, 2)
        f.seek(max(0, size - LINE.limit() - 1))
        tail = f.read()
    return b"" if tail.endswith(b"\n") else tail.rpartition(b"\n")[2]


def jsonl_rows_are(path: str | Path, accept: Any) -> bool:
    """Whether every line of the JSONL file ``path`` is a JSON value ``accept(row)`` is true of (blank lines skipped;
    a last line without its newline, written when a run was killed, is not read): how finecap recognises its own
    logs by content (``metrics.jsonl``, boost's ``cache.jsonl`` / ``failures.jsonl``). Read line by line
    (:func:`read_lines`, at most :data:`DATA_FILE` in all): a :class:`FileTooLarge` when the file is over that or a
    line is over :data:`LINE`; ``False`` when a line is not UTF-8."""
    try:
        for line in read_lines(path, total=DATA_FILE):
            if not line.endswith("\n") or not line.strip():
                continue  # blank, or the last line cut short
            try:
                row = json.loads(line)
            except ValueError:
                return False
            if not accept(row):
                return False
    except UnicodeDecodeError:
        return False
    return True
