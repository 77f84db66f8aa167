"""The record every data set format reads into, and the checks its readers share.

A reader (:mod:`finecap.data.formats`) returns :class:`Record` s, one per image; bad input raises :class:`DataError`
naming the file and the record at fault (missing keys, wrong types, empty caption lists, image files that do not
exist, reported with a count and the first few paths). The helpers below are those checks, written once: a field of
the right type (:func:`require`), an image id finecap reads and writes alike (:func:`check_id`), a caption list
(:func:`clean_captions`), the captions ``finecap boost`` adds (:func:`read_boosted`), an image's questions
(:func:`read_questions_field`), one record per image (:func:`check_unique_ids`), each image file in one split
(:func:`check_split_files`), the image files present (:func:`check_image_files`), a split read from a file name
(:func:`split_from_name`) and a split's name read (:func:`split_named`, :class:`SplitKeys`).

Nothing here imports torch or PIL.
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from collections.abc import Collection, Hashable, Iterable
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path, PurePath
from typing import Any, Protocol

from finecap.utils.text import BIDI_CONTROLS, short_repr

log = logging.getLogger(__name__)

MAX_LISTED = 5
"""Bad records, missing files or duplicate ids an error lists at most (then says how many more)."""
NO_SPLIT = ""
"""The split of a record whose data set names none (a JSONL line without ``"split"``, an image of a ``folder``):
given one when a command reads the data set (:func:`finecap.data.splits.assign_splits`)."""


class DataError(ValueError):
    """A data set or results file is malformed; the message names the file and the record."""


@dataclass
class Record:
    """One image of a data set: its id, its file (or, embedded, a name for it), its split and reference captions."""

    image_id: int | str
    path: Path
    split: str
    captions: list[str] = field(default_factory=list)
    boosted: dict[str, list[str]] = field(default_factory=dict)
    """Caption fields written by ``finecap boost`` (``original``, ``blend``, ...; :mod:`finecap.boost.output`)."""
    image_bytes: bytes | None = field(default=None, repr=False)
    """The encoded image when the data set embeds it and it was given in memory."""
    image_ref: EmbeddedImage | None = field(default=None, repr=False)
    """The embedded image read on demand (a memory-mapped Hugging Face data set, :mod:`finecap.data.formats.hf`):
    records hold no image bytes, so a data set of any size costs the memory of its captions."""
    prompt: str = ""
    """The text a chat data set gives with the image (the user turn of a ``messages`` record, its image placeholders
    removed); empty for the other formats. What reads it: docs/data.md, "Chat JSONL"."""
    questions: list[Any] | None = None
    """The image's multiple-choice questions as the data set gives them (a JSONL line's or chat record's
    ``questions``, an ``hf`` data set's ``data.hf.questions_column``: CapRL's layout, ``{"question", "options",
    "answer"}`` or options embedded in the question; :func:`read_questions_field`), read by the ``qa_utility`` reward
    (:func:`finecap.judges.questions.question_of`); ``None`` when it gives none."""

    @property
    def embedded(self) -> bool:
        """Whether the image is embedded in the data set (bytes, or a reference to them) rather than a file."""
        return self.image_bytes is not None or self.image_ref is not None

    def encoded_image(self) -> bytes | None:
        """The embedded image's encoded bytes (read now, for a reference), or ``None`` for an image file."""
        if self.image_bytes is not None:
            return self.image_bytes
        return self.image_ref.read() if self.image_ref is not None else None


class EmbeddedImage(Protocol):
    """An image stored inside a data set file, read when asked (:class:`finecap.data.formats.hf.ArrowImage`)."""

    def read(self) -> bytes:
        """The encoded image (PNG, JPEG, ...)."""
        ...

    def key(self) -> str | None:
        """What identifies this image's stored version without reading it (the data set files' paths, sizes and
        modification times, and the row), or ``None`` when nothing does (then its bytes are hashed)."""
        ...


# ---------------------------------------------------------------------------------------------------------------------
# Checks of a record's fields
# ---------------------------------------------------------------------------------------------------------------------


def type_name(value: Any) -> str:
    """The name of ``value``'s type, for messages (``list``, ``NoneType``)."""
    return type(value).__name__


def require(rec: Any, key: str, types: type | tuple[type, ...], where: str) -> Any:
    """Field ``key`` of the JSON object ``rec``, of one of ``types`` (never a bool for a number); a
    :class:`DataError` naming ``where`` (the file and the record), the key and what was found otherwise."""
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected an object, got {type_name(rec)}")
    if key not in rec:
        raise DataError(f"{where}: missing key {key!r} (keys present: {', '.join(sorted(map(str, rec))) or 'none'})")
    value = rec[key]
    if not isinstance(value, types) or isinstance(value, bool):
        names = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        raise DataError(f"{where}: {key!r} must be {names}, got {type_name(value)} {short_repr(value)}")
    return value


MAX_INT_ID = 2**53 - 1
"""The largest integer image id (either sign) finecap reads or writes: RFC 8259's interoperable range, the integers
every JSON reader holds exactly (JavaScript, and any reader that parses numbers as doubles, turns
``12345678901234567891`` into ``12345678901234567000``), and within int64 (numpy, torch, Arrow). An integer id beyond
it in a data set, results or bags file is refused, naming the record (:func:`check_id`: write it as a string); a
file name whose number is beyond it keeps its name as the id (:func:`finecap.inference.image_ids`)."""


def int_id_fits(value: int) -> bool:
    """Whether the integer ``value`` is a usable image id (``|value| <= MAX_INT_ID``)."""
    return -MAX_INT_ID <= value <= MAX_INT_ID


NUMBERED = re.compile(r"^(?:COCO_[A-Za-z]+\d*_)?(\d+)$")
"""A file stem that gives an integer image id: digits, or COCO 2014's ``COCO_<set>_<digits>``."""
MAX_ID_DIGITS = 64
"""Digits of a file stem converted to a number at most (leading zeros included): a longer one is beyond
:data:`MAX_INT_ID` or all zeros, and Python refuses to convert more than 4300."""


def file_number(name: str) -> int | None:
    """The integer image id a file's name gives (:data:`NUMBERED`: ``000000391895.jpg`` and
    ``COCO_val2014_000000391895.jpg`` give 391895), ``None`` when its stem is no such number or the number is beyond
    :data:`MAX_INT_ID`: what ``finecap caption --images`` names a numbered file (:func:`finecap.inference.image_ids`)
    and ``finecap eval`` matches a predicted integer id with (:func:`finecap.app.eval.match_ids`).

    Example::

        >>> file_number("000000391895.jpg"), file_number("COCO_val2014_000000000042.jpg"), file_number("cat.jpg")
        (391895, 42, None)
    """
    return stem_number(PurePath(name).stem)


def stem_number(stem: str) -> int | None:
    """:func:`file_number` of a file whose stem (name without its suffix) is ``stem``: for a path parsed already
    (``Path.stem``), without parsing its name again (:func:`finecap.app.eval.file_numbers` reads thousands)."""
    found = NUMBERED.match(stem)
    if found is None or len(found.group(1)) > MAX_ID_DIGITS:
        return None
    number = int(found.group(1))
    return number if int_id_fits(number) else None


_INT_TEXT = re.compile(rf"-?[0-9]{{1,{MAX_ID_DIGITS}}}")
"""Text that may be an integer id as Python writes it: :func:`id_key` reads it as that integer only when ``str``
of the integer gives the text back (not ``"042"``, ``"-0"``, ``" 42"``)."""


def id_key(image_id: Hashable, keys: Collection[Hashable]) -> Hashable | None:
    """The key among ``keys`` that names ``image_id``: itself, else the same id written the other way, an int as its
    string or the string of an int as that int; ``None`` when none does.

    The rule, the one every part of finecap reads ids by: two ids are one image when they read the same as text
    (:func:`id_text`: ``str``, an integral float as its integer), so an int and its decimal string (``391895`` and
    ``"391895"``) are one id, and a string that is not exactly how Python writes an integer is its own id:
    ``"000000391895"``, ``"+42"``, ``" 42"`` and ``"-0"`` are not ``391895``, ``42`` and ``0``. COCO's annotation and
    results files give ids as ints and pycocoevalcap matches them as written (``"391895"`` is no image there); data
    files give them as strings (``"391895"``), so finecap also reads an int and its string as one. A zero-padded string
    is no spelling of a COCO id: it is the id a data set chose (``"0042"`` and ``"42"`` may be two images), and the
    data readers' duplicate check (:func:`check_unique_ids`), results files, per-image outputs and the reward server
    key images by the id's text, so reading ``"0042"`` as ``42`` here would join two images that every other part keeps
    apart. A file name's number (``000000391895.jpg`` -> ``391895``, :func:`file_number`) is another rule, ``finecap
    eval``'s alone, for matching predictions keyed by file names (:func:`finecap.app.eval.match_ids`).

    Example::

        >>> id_key(42, {"42", "7"}), id_key("42", {42}), id_key("-3", {-3}), id_key("x", {"y"}), id_key("--1", {1})
        ('42', 42, -3, None, None)
        >>> id_key("000000391895", {391895}), id_key(" 42", {42}), id_key("-0", {0}), id_key(42, {"042"})
        (None, None, None, None)
        >>> id_key(42.0, {"42"}), id_key(42.5, {"42"})
        ('42', None)
    """
    if image_id in keys:
        return image_id
    number = id_number(image_id)  # 42.0 is 42 (a float key 42.0 finds 42 above; "42" here), as COCO's readers
    if number is None:
        return None
    other = number if isinstance(image_id, str) else str(number)  # the same id written the other way
    return other if other in keys else None


def id_number(image_id: Hashable) -> int | None:
    """The integer ``image_id`` names by :func:`id_key`'s rule: an int (not a bool), an integral float
    (:func:`integral_id`) or the string Python writes for an int; ``None`` for any other id (``"042"``, ``"-0"``,
    ``" 42"``, ``"x"``, ``42.5``), which names no integer.

    Example::

        >>> id_number(42), id_number("42"), id_number(42.0), id_number("-3"), id_number("042"), id_number("x")
        (42, 42, 42, -3, None, None)
    """
    image_id = integral_id(image_id)
    if isinstance(image_id, bool):
        return None
    if isinstance(image_id, int):
        return image_id
    if isinstance(image_id, str) and _INT_TEXT.fullmatch(image_id):  # ASCII digits, one sign ("--5", "²": none)
        number = int(image_id)
        return number if str(number) == image_id else None  # "042", "-0": their own ids
    return None


def id_keys(ids: Iterable[Hashable], keys: Collection[Hashable]) -> tuple[dict[Hashable, Hashable], list[Hashable]]:
    """``({id: the key of keys naming it}, [the ids naming none])`` of ``ids``, each looked up by :func:`id_key` (an
    int and its string are one id): how the metrics match the ids of one input (predictions, bags) with another's
    (references, the images), each caller raising its own error on what is left, with :func:`some_ids` of both sides.

    Example::

        >>> id_keys([391895, "7", 8], ["391895", 7])
        ({391895: '391895', '7': 7}, [8])
    """
    keys = keys if isinstance(keys, set | frozenset | dict) else set(keys)
    found: dict[Hashable, Hashable] = {}
    missing: list[Hashable] = []
    for i in ids:
        key = id_key(i, keys)
        if key is None:
            missing.append(i)
        else:
            found[i] = key
    return found, missing


def id_text(image_id: Hashable) -> str:
    """The text an image id is read by: two ids name one image when their texts are equal (:func:`id_key`'s rule),
    an integral float being its integer (:func:`integral_id`). The one key of "the same image" wherever ids are
    grouped or indexed by it (:func:`repeated_ids`, :func:`check_unique_ids`, the reward server's image table, the
    batch of a reward call).

    Example::

        >>> id_text(42), id_text("42"), id_text(42.0), id_text("042"), id_text(42.5)
        ('42', '42', '42', '042', '42.5')
    """
    return str(integral_id(image_id))


def repeated_ids(ids: Iterable[Hashable]) -> list[tuple[Hashable, ...]]:
    """The ids of ``ids`` that name one image more than once, a group for each image, each id as written and in
    order: ids read as :func:`id_key` and :func:`check_unique_ids` read them, one when they read the same as text
    (:func:`id_text`).

    Example::

        >>> repeated_ids([1, 2, "1", "02", 3, 3, 2.0])
        [(1, '1'), (2, 2.0), (3, 3)]
    """
    by_text: dict[str, list[Hashable]] = {}
    for i in ids:
        by_text.setdefault(id_text(i), []).append(i)
    return [tuple(group) for group in by_text.values() if len(group) > 1]


def refuse_repeated_ids(ids: Iterable[Hashable], what: str) -> None:
    """A ``ValueError`` naming ``what`` and the first ids when two of ``ids`` (an input's keys: predictions,
    references, scenes, ...) name one image (:func:`repeated_ids`: ``1`` and ``"1"``): scoring both would count the
    image twice, and choosing one is no silent choice. How ``finecap eval``, :func:`finecap.evaluate` and every
    metric called from Python read a keyed input, as the data readers refuse such a data set
    (:func:`check_unique_ids`); ``refuse_repeated_ids({1: "a dog", "1": "a cat"}, "predictions")`` is
    ``ValueError("predictions: 1 image(s) keyed twice, e.g. 1 and '1' (an int id and its string are one id, ...")``.
    """
    twice = repeated_ids(ids)
    if twice:
        raise ValueError(f"{what}: {len(twice)} image(s) keyed twice, e.g. {' and '.join(map(repr, twice[0]))} "
                         "(an int id and its string are one id, as the data readers read them): give each image one "
                         "entry")  # fmt: skip


def some_ids(ids: Iterable[Hashable]) -> str:
    """The first :data:`MAX_LISTED` of ``ids`` as an error shows them, as written (``[1, '2', ...]``)."""
    first = list(islice(ids, MAX_LISTED + 1))
    shown = ", ".join(map(repr, first[:MAX_LISTED]))
    return f"[{shown}{', ...' if len(first) > MAX_LISTED else ''}]"


def check_id(value: Any, where: str, key: str = "image id") -> int | str:
    """``value`` when it is an image id finecap reads and writes alike: a string, or an integer (never a bool)
    within :data:`MAX_INT_ID`; else a :class:`DataError` naming ``where`` and ``key``."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise DataError(f"{where}: {key} {short_repr(value)} must be an int or a string, got {type_name(value)}")
    if isinstance(value, int) and not int_id_fits(value):
        raise DataError(
            f"{where}: {key} {short_repr(value, 40)} is an integer beyond +-(2**53 - 1), which JSON readers do not "
            f'all read back exactly (RFC 8259); write it as a string ("{short_repr(value, 40)}")'
        )
    return value


def id_from_key(key: str) -> int | str:
    """The image id a JSON object key stands for (JSON keys are strings): the integer when ``key`` is one written
    as Python writes it (``"42"``, ``"-7"``; not ``"042"`` or ``"+4"``) and within :data:`MAX_INT_ID`, else the key
    itself: ids written with ``str(id)`` read back as they were."""
    try:
        number = int(key) if len(key) <= 20 else None
    except ValueError:
        return key
    return number if number is not None and str(number) == key and int_id_fits(number) else key


def require_image(rec: Any, key: str, where: str) -> str:
    """Field ``key`` of ``rec``, an image file's path as written (:func:`check_image_path`).

    >>> require_image({"image": "cats/001.jpg"}, "image", "x.jsonl, line 1")
    'cats/001.jpg'
    >>> require_image({"image": "."}, "image", "x.jsonl, line 2")
    Traceback (most recent call last):
    ...
    finecap.data.records.DataError: x.jsonl, line 2: 'image' is '.', a folder, not an image file; name the image's file
    """
    return check_image_path(require(rec, key, str, where), where, repr(key))


def check_image_path(image: str, where: str, what: str) -> str:
    """``image``, an image file's path as a record writes it (``what`` names the field): a :class:`DataError`
    naming ``where`` and ``what`` when it is empty (or only white space) or names a folder (``"."``, ``".."``,
    ``"cats/"``, ``"a/.."``): joined to the image root such a path is a folder, whose name would be read as an
    image id and refused only later as a missing image file, or never when image files are not checked."""
    if not image.strip():
        raise DataError(f"{where}: {what} is empty ({short_repr(image)}); name the image's file")
    if image.endswith(("/", os.sep)) or os.path.basename(os.path.normpath(image)) in ("", ".", ".."):
        raise DataError(f"{where}: {what} is {short_repr(image)}, a folder, not an image file; name the image's file")
    return image


def require_id(rec: Any, key: str, where: str, floats: list[float] | None = None) -> int | str:
    """Field ``key`` of ``rec``, an image id (:func:`check_id`). Given ``floats`` (the readers of the files
    pycocotools reads: COCO results and annotations), an integral float is read as its integer
    (:func:`integral_id`) and appended to ``floats``, for the reader's one note (:func:`float_ids_note`); any other
    float (``42.5``, NaN, an infinity, one beyond :data:`MAX_INT_ID`) is a :class:`DataError` naming it."""
    value = rec.get(key) if isinstance(rec, dict) else None
    if floats is None or type(value) is not float:
        return check_id(require(rec, key, (int, str), where), where, repr(key))
    if not value.is_integer() or not int_id_fits(int(value)):
        raise DataError(f"{where}: {key!r} {value!r} names no image: an image id is an integer within "
                        "+-(2**53 - 1) (42, or 42.0 as pycocotools reads it) or a string")  # fmt: skip
    floats.append(value)
    return int(value)


def integral_id(value: Any) -> Any:
    """``value``, or the integer it is when it is an integral float (``42.0`` -> ``42``): how a COCO results or
    annotations file's ids are read, as pycocotools and pycocoevalcap read them (they look ids up in Python dicts,
    where ``42.0`` and ``42`` are one key; pandas writes an integer column holding a missing value as floats). Any
    other value is returned as it is, for :func:`check_id` to refuse what is no id (``42.5``, NaN, the infinities,
    a bool); an integral float beyond :data:`MAX_INT_ID` becomes an integer that :func:`check_id` refuses.

    Example::

        >>> integral_id(42.0), integral_id(-7.0), integral_id(42.5), integral_id("42.0"), integral_id(True)
        (42, -7, 42.5, '42.0', True)
    """
    return int(value) if isinstance(value, float) and value.is_integer() else value


def float_ids_note(path: str | Path, floats: list[float]) -> str:
    """The one line a reader logs when ids of ``path`` were integral floats (``floats``, as :func:`require_id`
    collected them): how many, and the first as written."""
    return (f"{path}: {len(floats)} image id(s) are written as floats (e.g. {floats[0]!r}), read as the integers "
            "they are, as pycocotools reads them")  # fmt: skip


def is_id(value: Any) -> bool:
    """The fast readers' test of an image id (the checking loops name a bad one, :func:`check_id`)."""
    return type(value) is str or (type(value) is int and int_id_fits(value))


def other_normalisation(path: Path) -> str:
    """What to say of the missing file ``path`` when it exists under its name in another Unicode normalisation
    (``café`` typed as one character, NFC, for a file copied from macOS, whose names are NFD: the two print alike
    and are two names on Linux), else ``""``: every reader that names a missing image file adds it
    (:func:`check_image_files`, :func:`finecap.data.formats.folder.read_folder`)."""
    import unicodedata

    for form in ("NFC", "NFD"):
        other = Path(unicodedata.normalize(form, str(path)))
        if other != path and other.is_file():
            return (f" (it exists with its name in Unicode {form}, {ascii(other.name)} against {ascii(path.name)} "
                    "here: write the name as the file system has it, or rename the file)")  # fmt: skip
    return ""


def check_image_files(records: list[Record], path: Path, root: Path) -> None:
    """A :class:`DataError` naming the data file ``path``, the image root ``root`` and the first missing files when
    some of ``records`` name an image file that does not exist."""
    missing = [r.path for r in records if not r.path.is_file()]
    if missing:
        shown = "\n  ".join(str(p) + other_normalisation(p) for p in missing[:MAX_LISTED])
        more = f"\n  ... and {len(missing) - MAX_LISTED} more" if len(missing) > MAX_LISTED else ""
        raise DataError(
            f"{path}: {len(missing)} of {len(records)} image files do not exist (image root {root}; set the image "
            f"folder with data.images=DIR, or --images DIR for finecap eval):\n  {shown}{more}"
        )


# ---------------------------------------------------------------------------------------------------------------------
# Captions, ids and splits of a whole data set
# ---------------------------------------------------------------------------------------------------------------------


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""Control characters (C0, DEL, C1, Unicode's line and paragraph separators): :func:`clean_text` reads them."""
_BIDI_MARKS = "\u200e\u200f\u061c"
"""The direction marks (LRM, RLM, ALM): they reorder nothing, and right-to-left text needs them (kept)."""
_BIDI = re.compile(f"[{''.join(sorted(BIDI_CONTROLS - set(_BIDI_MARKS)))}]")
"""Unicode's bidirectional embeddings, overrides and isolates (:data:`~finecap.utils.text.BIDI_CONTROLS` but the
marks: LRE, RLE, PDF, LRO, RLO; LRI, RLI, FSI, PDI): they reorder the text shown after them, so a caption holding one
prints other than its tokens read; :func:`clean_text` refuses them."""
_BOM = "\ufeff"
"""The byte-order mark: at the start of a caption an encoding artifact (a file or cell written with one, joined),
which :func:`clean_text` strips."""
_BREAKS = re.compile(r"\s*[\t\n\x0b\x0c\r\x1c-\x1f\x85\u2028\u2029][\s]*")
"""A run of white space holding a control character that is white space (tab, a line break, a separator)."""


def needs_cleaning(text: str) -> bool:
    """Whether :func:`clean_text` has work to do in the stripped ``text`` beyond refusing it as :func:`invisible`:
    a control character, a bidirectional override or a byte-order mark in it (the fast readers' test). ASCII text,
    the usual caption, is read in one C pass: its control characters (C0 and DEL) are exactly its unprintable ones,
    and the other two are not ASCII (two regular-expression searches an image were 28 ms of reading 8,000 COCO
    images)."""
    if text.isascii():
        return not text.isprintable()
    return _CONTROL.search(text) is not None or _BIDI.search(text) is not None or _BOM in text


def invisible(text: str) -> bool:
    """Whether the non-empty ``text`` shows nothing: every character of it white space or an invisible format
    character (Unicode category Cf: the zero-width space U+200B, joiners, the byte-order mark U+FEFF, direction
    marks), which ``str.strip`` keeps. Such a caption is an empty one that prints as nothing (a copy from a web page
    or a spreadsheet): :func:`clean_text` refuses it. ASCII text is never invisible (the usual caption: one pass).

    Example::

        >>> invisible("\u200b\u200b"), invisible(" \ufeff\u2060 "), invisible("a\u200bdog"), invisible("a dog")
        (True, True, False, False)
    """
    import unicodedata

    return not text.isascii() and all(c.isspace() or unicodedata.category(c) == "Cf" for c in text)


def clean_text(text: str, where: str, what: str) -> str:
    """``text`` (a caption or a prompt: ``what`` names it) stripped, with every run of white space that holds a line
    break, tab or separator (``\\n``, ``\\r``, ``\\t``, U+2028, ...) made one space: a caption is one line of
    words, however the file wrapped it. Any other control character (NUL, ESC and the other C0 and C1 controls,
    DEL) is a :class:`DataError` naming ``where``, ``what`` and the character: it is no text, and it would reach
    tokenizers, results files, reports and terminals as it is. Text that is not empty but shows nothing (only
    zero-width spaces and other invisible format characters: :func:`invisible`) is a :class:`DataError` too: an
    empty caption that looks like text to ``str.strip``. ``""`` is returned as it is (a caller names it empty).

    Invisible format characters among visible ones, by class:

    - a **byte-order mark** (U+FEFF) at the start is stripped: an encoding artifact (a file or cell written with one,
      joined to the text), no part of the caption; one further in is kept, as the other invisible format characters;
    - a **bidirectional override** (the embeddings, overrides and isolates U+202A-U+202E, U+2066-U+2069) is a
      :class:`DataError` naming it and its place: it reorders the text displayed after it, so the caption a report
      shows is not the one its tokens read (``"a\\u202edog"`` prints as ``agod``);
    - the **others** (zero-width spaces and joiners, word joiners, the direction marks U+200E, U+200F and U+061C,
      which reorder nothing) are kept as written: scripts and emoji need joiners, right-to-left text its marks.

    Example::

        >>> clean_text(" a dog\\r\\n on  a\\tdeck ", "x.jsonl, line 3", "caption 0")
        'a dog on  a deck'
        >>> clean_text("\\ufeffa dog", "x.jsonl, line 4", "caption 0")
        'a dog'
    """
    text = text.strip()
    if _CONTROL.search(text) is not None:
        text = _BREAKS.sub(" ", text)
        bad = _CONTROL.search(text)
        if bad is not None:
            raise DataError(f"{where}: {what} holds control character U+{ord(bad.group()):04X} at character "
                            f"{bad.start()} ({short_repr(text)}); remove it (a caption is text)")  # fmt: skip
    if text and invisible(text):
        raise DataError(f"{where}: {what} shows no character, only invisible ones ({ascii(text)[:80]}: zero-width "
                        "spaces, byte-order marks, direction marks); it is empty: remove it")  # fmt: skip
    bidi = _BIDI.search(text)
    if bidi is not None:
        import unicodedata

        raise DataError(f"{where}: {what} holds the bidirectional control U+{ord(bidi.group()):04X} "
                        f"({unicodedata.name(bidi.group())}) at character {bidi.start()} ({ascii(text)[:80]}): it "
                        "reorders the text shown after it, so the caption shown is not the one read; remove it (the "
                        "direction marks U+200E and U+200F are kept)")  # fmt: skip
    return text.lstrip(_BOM).lstrip() if text.startswith(_BOM) else text


def clean_captions(items: list[Any], where: str) -> list[str]:
    """The captions ``items`` read by :func:`clean_text` (stripped, line breaks and tabs made spaces); a
    :class:`DataError` naming ``where`` for an empty list, a caption that is not a string, one that is empty (or shows
    nothing: :func:`invisible`) or one holding another control character."""
    if not items:
        raise DataError(f"{where}: empty caption list")
    out = []
    for j, c in enumerate(items):
        if not isinstance(c, str):
            raise DataError(f"{where}: caption {j} must be a string, got {type_name(c)} {short_repr(c)}")
        if not c.strip():
            raise DataError(f"{where}: caption {j} is empty")
        out.append(clean_text(c, where, f"caption {j}"))
    return out


def read_questions_field(value: Any, where: str, what: str = "'questions'") -> list[Any] | None:
    """A record's questions (:attr:`Record.questions`) as its data set gives them in ``what`` (a JSON key, an ``hf``
    column): ``None`` when absent (``None``), a list as it is (each question is read by the reward that asks it,
    :func:`finecap.judges.questions.question_of`), anything else a :class:`DataError` naming ``where`` (the line or
    row).

    >>> read_questions_field([{"question": "Colour?", "options": ["red", "blue"], "answer": "A"}], "f.jsonl, line 1")
    [{'question': 'Colour?', 'options': ['red', 'blue'], 'answer': 'A'}]
    >>> read_questions_field("Colour?", "f.jsonl, line 1")
    Traceback (most recent call last):
    ...
    finecap.data.records.DataError: f.jsonl, line 1: 'questions' must be a list of questions, got 'Colour?'
    """
    if value is not None and not isinstance(value, list):
        raise DataError(f"{where}: {what} must be a list of questions, got {short_repr(value)}")
    return value


def read_boosted(rec: dict[str, Any], where: str) -> dict[str, list[str]]:
    """The ``"boost": {field: [caption, ...]}`` object ``finecap boost`` adds to a record (empty when absent)."""
    raw = rec.get("boost")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise DataError(f"{where}: 'boost' must be an object {{field: [caption, ...]}}, got {type_name(raw)}")
    return {str(k): clean_captions(v if isinstance(v, list) else [v], f"{where}: boost.{k}") for k, v in raw.items()}


def check_unique_ids(records: list[Record], path: Path, what: str = "records") -> None:
    """Raise :class:`DataError` naming the image ids that several ``records`` share: each image has one record
    holding all its references, and which of two would be meant cannot be guessed. Ids that read the same as text
    are one id (``1`` and ``"1"``): results files, per-image outputs and the reward server key images by that text,
    and ``finecap eval`` matches a predicted ``"1"`` with a reference ``1`` (:func:`id_key`)."""
    if len({id_text(r.image_id) for r in records}) == len(records):
        return
    where: dict[str, list[int]] = {}
    for k, r in enumerate(records):
        where.setdefault(id_text(r.image_id), []).append(k)
    dups = {i: ks for i, ks in where.items() if len(ks) > 1}

    def named(ks: list[int]) -> str:
        written = list(dict.fromkeys(repr(records[k].image_id) for k in ks))  # 1 and '1': both, as written
        return f"id {' and '.join(written)} in {what}[{', '.join(map(str, ks[:3]))}{', ...' if len(ks) > 3 else ''}]"

    shown = "; ".join(named(ks) for ks in list(dups.values())[:MAX_LISTED])
    mixed = any(len({type(records[k].image_id) for k in ks}) > 1 for ks in dups.values())
    alike = "; an id written as a number and as a string is one id (finecap eval and per-image outputs read it so)"
    raise DataError(
        f"{path}: {len(dups)} image id(s) appear in several {what}: {shown}"
        f"{' ...' if len(dups) > MAX_LISTED else ''}; give each image one entry (with all its captions)"
        f"{alike if mixed else ''}"
    )


def check_split_files(records: list[Record], path: Path) -> None:
    """Raise :class:`DataError` naming the data file ``path``, the image file and both records' ids and splits when
    two ``records`` name one image file (its path made absolute, ``.`` and ``..`` read: however it is written) in
    two splits (``restval`` counts as ``train``), or both without a split (:data:`NO_SPLIT`:
    their ids' hash may part them): an image in two splits is trained on and tested on. Records of one file in one
    named split are one format's choice (a JSONL line per id); embedded images (no file) are not checked here (the
    ``hf`` reader refuses an embedded image a row repeats: :mod:`finecap.data.formats.hf`). Links are
    not followed: two names of one stored file are two images, as a Hugging Face snapshot links identical images of
    a data set to one stored blob (the data set's duplicates, which finecap reads as the data set has them;
    tests/boost/test_boost_command.py). No file-system call."""
    files = [r for r in records if not r.embedded]
    if len({r.split for r in files} - {NO_SPLIT}) < 2 and not any(r.split == NO_SPLIT for r in files):
        return
    first: dict[str, Record] = {}
    for r in files:
        where = os.path.abspath(r.path)
        other = first.setdefault(where, r)
        if other is r:
            continue
        a, b = compared_split(other.split), compared_split(r.split)
        if a != b or a == NO_SPLIT:
            said = ", ".join(f"id {short_repr(x.image_id)} ({repr(x.split) if x.split else 'no split'}, {x.path})"
                             for x in (other, r))  # fmt: skip
            why = "two splits" if a != b else "no split: the id hash may put them in two splits"
            raise DataError(f"{path}: one image file {where} is named by two records in {why}: {said}; "
                            "an image in two splits is trained on and tested on: give it one record, or one "
                            "split")  # fmt: skip


def compared_split(split: str) -> str:
    """``split`` as two records' splits are compared for an image in two of them (:func:`check_split_files`, the
    ``hf`` reader's embedded images): ``restval``, Karpathy's, is ``train``.

    >>> compared_split("restval"), compared_split("test")
    ('train', 'test')
    """
    return "train" if split == "restval" else split


SPLIT_NAMES = ("train", "val", "test", "restval")
"""The splits a record names (``restval``: Karpathy's, read as train), as data sets write them."""


class SplitKeys:
    """The ``"split"`` keys of one data file's records (``jsonl``, ``messages``, a folder's sidecar, an ``hf`` split
    column): :meth:`read` each, then :meth:`say` once what was read another way.

    - a split of :data:`SPLIT_NAMES` in another case or with white space around it (``"TRAIN"``, ``" Val "``), or in
      another word for it (``"validation"``, ``"valid"``, ``"training"``, ``"testing"``: :func:`split_named`), is read
      as that split, and said (one log line per file: the spellings and how many records): a record spelled
      ``TRAIN`` or ``validation`` is not left out of every split;
    - any other name (``"dev"``, ``"testA"``) is kept as written, a split of its own that only ``--split NAME``
      reads, and said as a warning naming it (training reads ``train`` and ``val``);
    - a value that is not a string is a :class:`DataError` naming the record; ``""`` names no split
      (:data:`NO_SPLIT`);
    - one file writing a split both as itself and in another word (``"val"`` and ``"validation"``) is a
      :class:`DataError` from :meth:`say`: read as one split they could be two the file keeps apart.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = path
        self.respelled: Counter[tuple[str, str]] = Counter()
        self.others: Counter[str] = Counter()
        self.plain: Counter[str] = Counter()

    def read(self, rec: dict[str, Any], where: str, default: str = NO_SPLIT) -> str:
        """The split record ``rec`` names (``default`` without a ``"split"`` key)."""
        if "split" not in rec:
            return default
        written = require(rec, "split", str, where)
        if written in SPLIT_NAMES or written == NO_SPLIT:
            self.plain[written] += 1
            return written
        split = split_named(written)
        if split is not None:
            self.respelled[written, split] += 1
            return split
        self.others[written] += 1
        return written

    def say(self) -> None:
        """Log what :meth:`read` read another way, or as a split of its own (nothing when all were plain); refuse a
        split written both as itself and in another word (class docstring)."""
        both = [(w, s) for w, s in self.respelled if s in self.plain and w.strip().lower() != s]
        if both:
            shown = ", ".join(f"{s!r} ({self.plain[s]}) and {short_repr(w)} ({self.respelled[w, s]})" for w, s in both)
            raise DataError(f"{self.path}: records write {shown}: finecap reads both as one split; give them one "
                            "name, or, to keep them apart, one that is none of train, val, test, valid, validation, "
                            "training, testing")  # fmt: skip
        if self.respelled:
            most = self.respelled.most_common(MAX_LISTED)
            shown = ", ".join(f"{short_repr(w)} as {s!r} ({n})" for (w, s), n in most)
            log.info("data: %s: %d records write their split in another case or word, or with spaces; read %s",
                     self.path, self.respelled.total(), shown)  # fmt: skip
        if self.others:
            shown = ", ".join(f"{short_repr(w)} ({n})" for w, n in self.others.most_common(MAX_LISTED))
            log.warning("data: %s: %d records name a split that is none of train, val, test: %s; only --split "
                        "NAME reads them (training reads train and val)", self.path, self.others.total(),
                        shown)  # fmt: skip


SPLIT_WORDS = {"train": "train", "training": "train", "val": "val", "valid": "val", "validation": "val",
               "test": "test", "testing": "test"}  # fmt: skip
"""The words that say a split: of a file name (:func:`split_from_name`), and, in any case, of a split's name
(:func:`split_named`). ``dev`` is none: it names a test split as often as a validation one (VQA's ``test-dev``)."""


def split_named(written: str) -> str | None:
    """The split of :data:`SPLIT_NAMES` a split's name as a data set writes it says, in any case and with white space
    around it: itself, or the split of its word in :data:`SPLIT_WORDS` (Hugging Face's ``validation``); ``None`` for
    any other name. The one reading of split names: a record's ``"split"`` (:class:`SplitKeys`) and a Hugging Face
    data set's named splits (:func:`finecap.data.formats.hf.split_read_as`).

    >>> [split_named(n) for n in ("val", " Validation ", "valid", "TRAINING", "restval", "dev", "testA")]
    ['val', 'val', 'val', 'train', 'restval', None, None]
    """
    word = written.strip().lower()
    return word if word in SPLIT_NAMES else SPLIT_WORDS.get(word)


NAME_SPLIT_WORDS = {**SPLIT_WORDS, "trainval": "train"}
"""The words of a data file's name that say its split (:func:`split_from_name`): :data:`SPLIT_WORDS`, and
``trainval``, one file of the training and validation images together (``captions_trainval2014.json``), which
Karpathy-style setups train on (as Karpathy's ``restval``): ``train``, as ``captions_train_val2014.json`` already read.
Not a word of :func:`split_named`: a record's ``"split": "trainval"`` stays a split of its own."""


def split_from_name(path: Path) -> str:
    """The split a data file's name says, else ``test``: how COCO annotation files and lone Hugging Face files are
    split. The name's words (its letters between other characters: ``captions_val2014.json`` has ``captions``,
    ``val`` and ``json``) are looked up in :data:`NAME_SPLIT_WORDS`, ``train`` before ``val`` before ``test``: a word
    holding one is not it (``retrieval`` is no ``val``, ``constrained`` no ``train``), but ``trainval`` is ``train``.

    >>> names = ("captions_val2014.json", "coco_retrieval_test.json", "data.parquet", "captions_trainval2014.json")
    >>> [split_from_name(Path(n)) for n in names]
    ['val', 'test', 'test', 'train']
    """
    said = {NAME_SPLIT_WORDS[w] for w in re.split(r"[^a-z]+", path.name.lower()) if w in NAME_SPLIT_WORDS}
    return next((split for split in ("train", "val", "test") if split in said), "test")
