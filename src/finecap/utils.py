"""Small shared helpers: atomic writes (with the user's umask), JSON I/O, seeding, whether to show progress bars."""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import ipaddress
import itertools
import json
import os
import random
import re
import reprlib
import shlex
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

_UMASK_LOCK = threading.Lock()
PROC_STATUS = "/proc/self/status"


@functools.cache
def current_umask() -> int:
    """The process's file-mode creation mask, read once.

    On Linux it is read from :data:`PROC_STATUS` (``Umask:``), which changes nothing. Elsewhere the only way is to
    set a mask and put the old one back (``os.umask`` returns the previous value); that is done once, under a lock,
    so no thread of finecap creates a file in between.
    """
    try:
        for line in Path(PROC_STATUS).read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def file_mode() -> int:
    """Mode of a new file under the user's umask (``0o666 & ~umask``: 0644 under umask 022), what ``open`` gives."""
    return 0o666 & ~current_umask()


def dir_mode() -> int:
    """Mode of a new folder under the user's umask (``0o777 & ~umask``: 0755 under umask 022), what ``mkdir``
    gives."""
    return 0o777 & ~current_umask()


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` serves this machine only (every address it resolves to is a loopback address)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


class MissingExtra(ImportError):
    """An option needs a package of one of finecap's extras that is not installed (``model.quantization`` needs
    bitsandbytes, ``data.format=hf`` datasets); the message names the option and the ``pip install``; the command
    line prints it and exits with code 2."""


class OutputRefused(ValueError):
    """An output path finecap will not write (a symbolic link, one of the command's inputs, a file it did not make;
    :mod:`finecap.outputs`); a ``ValueError``: the command line prints the message and exits with code 2."""


def refuse_link(path: str | Path) -> None:
    """:class:`OutputRefused` when ``path`` is a symbolic link (dangling or not): finecap never writes through one,
    and never replaces one (a link planted in a run folder someone shared, which survives ``tar xf``, is named)."""
    if os.path.islink(path):
        raise OutputRefused(
            f"{path}: is a symbolic link (to {os.readlink(path)}); finecap never writes through a link: remove the "
            "link, or choose another output"
        )


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask on Linux, the machine's CPUs elsewhere), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a uniquely named temporary file in the same folder, then rename.

    The one atomic file write of the package (text, JSON and safetensors go through it): readers see the old file or
    the complete new one, never a half-written file, and an interrupted write leaves no temporary file behind. The
    temporary name is unique per call (``mkstemp``), so concurrent writers of the same file never share one; the last
    rename wins. ``mkstemp`` creates its file with mode 0600; it is given :func:`file_mode` before the rename, so the
    file ends up with the mode a plain ``open(path, "w")`` would give (0644 under umask 022, 0600 under 077). A
    symbolic link at ``path`` is refused (:func:`refuse_link`): ``rename`` would not write through it, but a link
    where finecap writes was planted by someone else and is named, never silently replaced.
    """
    path = Path(path)
    refuse_link(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.chmod(tmp, file_mode())
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, obj: Any, indent: int | None = 2) -> None:
    """Write ``obj`` as JSON (plus a final newline) to ``path`` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=indent) + "\n")


# ---------------------------------------------------------------------------------------------------------------------
# Bounded reads: how much of a file finecap reads at most
# ---------------------------------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------------------------------
# Reading JSON strictly: the one parser of every JSON and JSONL file finecap reads
# ---------------------------------------------------------------------------------------------------------------------


class JSONRefused(ValueError):
    """A JSON text :func:`parse_json` refuses; the message names where (the file, the line) and what is wrong.
    ``kind``: ``"encoding"`` (not UTF-8) or ``"syntax"`` (not JSON), the text is not JSON at all; ``"duplicate"`` (a
    key twice in an object) or ``"depth"`` (nesting too deep), JSON finecap does not read (format detection tells
    the two apart). ``detail``: what is wrong, without where."""

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
            text = data.decode(json.detect_encoding(data), "surrogatepass")
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
        detail = f"invalid JSON at {'' if one_line else f'line {e.lineno}, '}column {e.colno}: {e.msg}"
        raise JSONRefused(f"{where}: {detail}", "syntax", detail) from None
    except _DuplicateKey as e:
        offset = _find_duplicate(text)
        place = f" in the object at {_position(text, offset, one_line)}" if offset is not None else ""
        detail = (f"duplicate key {short_repr(e.key)}{place}; JSON readers keep one of the two values (which one "
                  "depends on the reader): keep one key")  # fmt: skip
        raise JSONRefused(f"{where}: {detail}", "duplicate", detail) from None
    except RecursionError:
        offset = _too_deep(text)
        place = f" (more than {JSON_DEPTH_SHOWN} levels at {_position(text, offset, one_line)})" if offset else ""
        detail = f"JSON nested too deeply to read{place}; data files nest a few levels"
        raise JSONRefused(f"{where}: {detail}", "depth", detail) from None


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


def shell_command(argv: Iterable[str | os.PathLike[str]]) -> str:
    """``argv`` as one POSIX shell command line (bash, zsh, sh) that, pasted into a shell, runs exactly ``argv``: each
    word quoted when it needs it (:func:`shlex.join`: ``'run;name'``, ``'$(touch x)'``, ``'it'"'"'s'``; a plain word
    as it is). The one way finecap prints a command for a user to run again (a model card's "Made by", a lock's
    record, a hint naming a path): joining the words with spaces would make ``run.name=a;rm -rf x`` two commands and
    run ``$(...)``. An argument holding a line break keeps it inside its quotes (the command then spans lines and is
    still one command; ``shlex.split`` reads it back).

    Example::

        >>> print(shell_command(["finecap", "train", "demo/mle", "run.name=a b;c", "run.out=$(id)"]))
        finecap train demo/mle 'run.name=a b;c' 'run.out=$(id)'
    """
    return shlex.join(os.fspath(a) for a in argv)


def one_line(error: BaseException) -> str:
    """An exception's message on one line (whitespace runs joined), or its type's name when it has none."""
    return " ".join(str(error).split()) or type(error).__name__


SHORT_REPR_LIMIT = 60
"""Characters of a user's value an error message shows at most (:func:`short_repr`)."""


def short_repr(value: Any, limit: int = SHORT_REPR_LIMIT) -> str:
    """``repr(value)`` in at most ``limit`` characters, for error messages: the one way finecap shows a user's value,
    so that no message can be megabytes long (a value read from a file, or a YAML alias bomb, can be). Built on
    :mod:`reprlib`, which never renders what it leaves out: a long string keeps its two ends, a container its first
    items and the first levels of its nesting.

    Example::

        >>> short_repr("ten"), short_repr("x" * 1000, limit=20), short_repr([[[[1]]]] * 100, limit=30)
        ("'ten'", "'xxxxxxx...xxxxxxxx'", '[[[[...]]], [[[...]]], [[[....')
    """
    shortener = reprlib.Repr()
    shortener.maxlevel = 3
    for name in ("maxlist", "maxtuple", "maxset", "maxfrozenset", "maxdeque", "maxarray", "maxdict"):
        setattr(shortener, name, 6)
    shortener.maxstring = shortener.maxlong = shortener.maxother = max(limit, 5)
    try:
        text = shortener.repr(value)
    except (ValueError, RecursionError):  # an int past Python's digit limit; a self-referencing structure
        text = f"<{type(value).__name__} too long to show>"
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""Characters that end a line or are invisible controls (C0, DEL, C1, Unicode's line and paragraph separators): what
a name finecap writes into a file or a page must not hold (``run.name``), and what a card shows escaped
(:func:`finecap.train.model_card.one_line`)."""


class YAMLRefused(yaml.YAMLError):
    """Something finecap refuses in a YAML file it reads (:class:`StrictYAMLLoader`): ``reason`` says what, ``line``
    (1-based) where, ``kind`` which refusal (``"anchor"``, ``"alias"`` or ``"duplicate"``); ``str()`` is
    ``"line N: reason"``."""

    def __init__(self, reason: str, line: int, kind: str):
        super().__init__(f"line {line}: {reason}")
        self.reason, self.line, self.kind = reason, line, kind


class StrictYAMLLoader(yaml.SafeLoader):
    """The one YAML loader of finecap's readers of user files (recipes, stored ``config.yaml``, command-line override
    values, prompt files): ``yaml.SafeLoader`` that also refuses

    - **anchors and aliases** (``&a`` / ``*a``): an alias repeats a value without copying it, so a few hundred bytes
      of nested aliases ("billion laughs") stand for billions of values, which any code printing or walking the
      value (an error message) expands; a recipe has no need for them;
    - **duplicate keys** at any depth: YAML keeps the last of two equal keys silently, so a recipe holding a
      section twice would lose the first; the error names the key and both lines.

    Both raise :class:`YAMLRefused` (a ``yaml.YAMLError``) before any value is built. Read with :func:`load_yaml`.

    Booleans are YAML 1.2's: ``true`` and ``false`` (any case) alone. PyYAML's YAML 1.1 also reads ``yes``, ``no``,
    ``on`` and ``off`` as booleans, so that ``train.mixed_precision=no`` (a string option whose choices are ``no``,
    ``fp16``, ``bf16``) arrived as ``False`` and was refused; they are now strings, which a string option keeps and
    a boolean option reads as the boolean they name (:func:`finecap.config.loading` ``_coerce``).
    """

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
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
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
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


def load_yaml(text: str) -> Any:
    """``text`` read as YAML with :class:`StrictYAMLLoader` (``yaml.safe_load`` without anchors, aliases or
    duplicate keys): :class:`YAMLRefused` or another ``yaml.YAMLError`` when it cannot be."""
    loader = StrictYAMLLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def read_yaml_mapping(path: str | Path, expected: str) -> dict[str, Any]:
    """A YAML file holding a mapping (an empty file is ``{}``); ``ValueError`` naming the file otherwise, with
    ``expected`` saying what the mapping should hold. Read with :func:`load_yaml`: anchors, aliases and duplicate
    keys are refused, naming the file and the line."""
    path = Path(path)
    text = read_text_bounded(path, METADATA)
    try:
        data = load_yaml(text) or {}
    except YAMLRefused as e:
        raise ValueError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: invalid YAML: {e}") from None
    except ValueError as e:  # a value Python cannot build, e.g. an integer of more than 4300 digits
        raise ValueError(f"{path}: invalid YAML value: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: {expected}")
    return data


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


def open_append(path: str | Path) -> io.TextIOWrapper:
    """``path`` opened for appending text (created with the umask's mode when missing), never through a symbolic
    link: ``O_NOFOLLOW`` makes the kernel refuse a link at ``path`` even if one is planted after the check."""
    path = Path(path)
    refuse_link(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            refuse_link(path)  # the link appeared after the check: name it
        raise
    return open(fd, "a", encoding="utf-8")  # noqa: SIM115 (the caller closes it)


def png_bytes(image: Any, **options: Any) -> bytes:
    """A PIL image encoded as PNG (``options``: PIL's, e.g. ``compress_level``), to write with
    :func:`atomic_write_bytes` or send."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", **options)
    return buffer.getvalue()


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    with open_append(path) as f:
        f.write(json.dumps(record) + "\n")


def make_temporary_dir(final_dir: str | Path) -> Path:
    """A new, uniquely named, empty folder next to ``final_dir`` (``.<name>.<random>.tmp``) to build it in before
    :func:`atomic_replace_dir`; its mode is :func:`dir_mode` (``tempfile.mkdtemp`` alone gives 0700)."""
    final_dir = Path(final_dir)
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final_dir.parent, prefix=f".{final_dir.name}.", suffix=".tmp"))
    os.chmod(tmp, dir_mode())
    return tmp


def apply_umask(root: str | Path) -> None:
    """Give ``root`` and every folder under it :func:`dir_mode`, every file :func:`file_mode` (symbolic links are
    left alone). For folders finecap builds before renaming them into place: ``tempfile.mkdtemp`` makes 0700 folders,
    and safetensors (0.8) writes its files with mode 0600 whatever the umask, as do ``save_pretrained`` calls that go
    through it."""
    root = Path(root)
    os.chmod(root, dir_mode())
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            if not os.path.islink(os.path.join(folder, name)):
                os.chmod(os.path.join(folder, name), dir_mode())
        for name in files:
            if not os.path.islink(os.path.join(folder, name)):
                os.chmod(os.path.join(folder, name), file_mode())


FOLDER_MARK = ".finecap-folder"
"""The file finecap writes into every folder it swaps into place (:func:`atomic_replace_dir`: checkpoints, merged
exports, world encoders) and into the temporary folders it builds them in: a folder holding it with the text
:func:`folder_mark_text` gives for its kind is finecap's (recognised by content, never by name), and only such a
folder is ever replaced or removed by :func:`atomic_replace_dir` and :func:`remove_own_folder`. Deleting the file
keeps finecap from touching the folder."""
MAX_MARK_BYTES = 4096
"""The largest :data:`FOLDER_MARK` file read (the mark is a short sentence; a larger file is not finecap's)."""


def folder_mark_text(kind: str) -> str:
    """The content of the :data:`FOLDER_MARK` of a folder finecap made as a ``kind`` (``"checkpoint"``,
    ``"export"``, ``"world-encoder"``): one folder kind is never taken for another (``export --force`` replaces an
    export, never a checkpoint)."""
    return f"finecap made this folder ({kind}) and may replace or remove it; delete this file to keep it from that\n"


def mark_folder(folder: str | Path, kind: str) -> None:
    """Write the :data:`FOLDER_MARK` of ``kind`` into ``folder`` (atomically, never through a link)."""
    atomic_write_text(Path(folder) / FOLDER_MARK, folder_mark_text(kind))


def is_finecap_folder(path: str | Path, kind: str, ours: Callable[[Path], bool] | None = None) -> bool:
    """Whether ``path`` is a real folder (not a link) that finecap made as a ``kind``: its :data:`FOLDER_MARK` is a
    regular file holding exactly :func:`folder_mark_text` of ``kind``, or the caller's content test ``ours(path)``
    says so (a checkpoint written before folders were marked: :func:`finecap.train.state.is_checkpoint_folder`)."""
    path = Path(path)
    if os.path.islink(path) or not path.is_dir():
        return False
    mark = path / FOLDER_MARK
    try:
        if (not os.path.islink(mark) and mark.is_file() and mark.stat().st_size <= MAX_MARK_BYTES
                and mark.read_text(encoding="utf-8") == folder_mark_text(kind)):  # fmt: skip
            return True
    except (OSError, UnicodeDecodeError):
        pass
    return ours is not None and ours(path)


def check_own_folder(path: str | Path, kind: str, ours: Callable[[Path], bool] | None = None) -> None:
    """:class:`OutputRefused` naming ``path`` when something is there that finecap did not make as a ``kind``
    (:func:`is_finecap_folder`): a link, a file, or a folder of the user's (or of another kind). Nothing there: no
    error."""
    refuse_link(path)
    if not os.path.lexists(path) or is_finecap_folder(path, kind, ours):
        return
    what = "a folder" if os.path.isdir(path) else "a file"
    raise OutputRefused(
        f"{path}: {what} finecap did not make (no {FOLDER_MARK} of a {kind}) is where finecap swaps a {kind} "
        "folder into place; finecap never removes what it did not make: move it away, or choose another output"
    )


def remove_own_folder(path: str | Path, kind: str, ours: Callable[[Path], bool] | None = None) -> None:
    """Remove the folder ``path`` if finecap made it as a ``kind`` (:func:`check_own_folder`; an unfinished
    temporary folder of finecap's); anything else there is refused, never removed."""
    check_own_folder(path, kind, ours)
    if os.path.lexists(path):
        shutil.rmtree(path)


def previous_dir(final_dir: Path) -> Path:
    """Where :func:`atomic_replace_dir` keeps the replaced version of ``final_dir`` during the swap
    (``<name>.old``)."""
    return final_dir.with_name(final_dir.name + ".old")


def check_swap(final_dir: str | Path, kind: str, ours: Callable[[Path], bool] | None = None) -> None:
    """What :func:`atomic_replace_dir` checks before it swaps a ``kind`` folder in at ``final_dir``: ``final_dir``
    and its :func:`previous_dir` are each missing or a folder finecap made as a ``kind`` (:func:`check_own_folder`),
    never a link, a file or a folder of the user's. A command calls it before its work, to refuse early."""
    final_dir = Path(final_dir)
    for path in (final_dir, previous_dir(final_dir)):
        check_own_folder(path, kind, ours)


DEFAULT_KIND = "folder"
"""The folder kind of :func:`atomic_replace_dir` when its caller names none."""


def atomic_replace_dir(
    tmp_dir: str | Path, final_dir: str | Path, *, kind: str = DEFAULT_KIND, ours: Callable[[Path], bool] | None = None
) -> None:
    """Move a fully written ``tmp_dir`` to ``final_dir``, replacing any previous version, which is first renamed
    ``<name>.old`` (:func:`previous_dir`) and removed once the new folder is in place.

    Only finecap's own folders are replaced or removed: ``final_dir`` and ``<name>.old`` must each be missing or a
    folder finecap made as a ``kind`` (:func:`check_swap`: its :data:`FOLDER_MARK`, or ``ours``), else
    :class:`OutputRefused` names it and nothing is changed. ``tmp_dir`` is marked as a ``kind`` before the swap
    (:func:`mark_folder`), so the folder swapped in is recognised as finecap's the next time. Its modes follow the
    user's umask first (:func:`apply_umask`): what ``mkdtemp`` or safetensors created 0700 / 0600 ends up as readable
    as ``mkdir`` and ``open`` make it."""
    tmp_dir, final_dir = Path(tmp_dir), Path(final_dir)
    old = previous_dir(final_dir)
    check_swap(final_dir, kind, ours)
    mark_folder(tmp_dir, kind)
    apply_umask(tmp_dir)
    if old.exists():
        shutil.rmtree(old)
    if final_dir.exists():
        os.replace(final_dir, old)
    os.replace(tmp_dir, final_dir)
    if old.exists():
        shutil.rmtree(old)


def seed_everything(seed: int) -> None:
    # Deferred: utils is on the start-up path of text-only commands (`finecap eval` writes JSON with it), which
    # must not import torch (tests/app/test_cli.py checks); only training seeds.
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """This process's random states (python, numpy, torch CPU and CUDA)."""
    import torch  # deferred, as in seed_everything

    version, internal, gauss = random.getstate()
    state = {"python": {"version": version, "internal": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
             "numpy": np.random.get_state(legacy=True), "torch": torch.get_rng_state()}  # fmt: skip
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state`."""
    import torch

    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["internal"].tolist()), py["gauss"]))
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def rng_preserved() -> Iterator[None]:
    """Within the block, code may reseed the process's random generators (vLLM's engine start does); after it they
    are as before (:func:`rng_state`), so a training run's draws do not depend on when an engine was started."""
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)


PROGRESS_ENV = "TQDM_DISABLE"
"""The environment variable that turns progress bars off: ``finecap -q`` sets it (unless the user did)."""
NOT_SET = ("", "0", "false", "no", "off")


def progress_enabled(wanted: bool = True) -> bool:
    """Whether to show a progress bar the caller wants (``wanted``): not when :data:`PROGRESS_ENV` is set to
    anything but :data:`NOT_SET` (``finecap -q`` sets it, a user may too). Read at each call: tqdm reads its
    ``TQDM_*`` variables only once, when it is imported, and lets an explicit ``disable=`` win over them, so every
    finecap bar is made with ``disable=not progress_enabled(...)``."""
    return wanted and os.environ.get(PROGRESS_ENV, "").strip().lower() in NOT_SET
