"""METEOR's English data, read at run time from the user's pycocoevalcap: never copied into finecap.

- Inside ``meteor-1.5.jar`` (a zip file, read with :mod:`zipfile`): the function words
  (``function/english.words``), the Moses non-breaking prefixes (``nonbreaking/english.prefixes``), the WordNet 3.0
  synonym sets (``synonym/english.synsets``: word, then its synset ids) and irregular forms
  (``synonym/english.exceptions``: base word, then its forms). ``synonym/english.relations`` is never used.
- Beside the jar, ``data/paraphrase-en.gz``: 5.27 M paraphrase pairs as three lines each (probability, phrase,
  paraphrase). The first use builds an index of it (word ids in numpy arrays, about 75 MB,
  :func:`build_paraphrase_index`: a vectorised scan, :mod:`~finecap.metrics.meteor.table_scan`, about a second on a
  quiet 2-core machine) in the finecap home, ``<home>/cache/meteor/<key>/paraphrase-v2.npz``, keyed by
  :func:`fingerprint` s of the jar and of the table; later runs load it (a fraction of a second). Each evaluation
  keeps only the pairs that can match its captions (:meth:`ParaphraseIndex.restrict`). The index is an ``.npz``
  written atomically and read with ``allow_pickle=False``.

Nothing is read at import time.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
import threading
import zipfile
import zlib
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from finecap.home import CACHE, home
from finecap.metrics.meteor.normalize import parse_prefixes
from finecap.metrics.meteor.table_scan import TableScanError, scan_table
from finecap.utils import atomic_write_bytes

__all__ = [
    "JAR_NAME",
    "MetricUnavailable",
    "METEOR_ENV",
    "INDEX_VERSION",
    "JarData",
    "ParaphraseIndex",
    "ParaphraseTable",
    "PendingIndex",
    "build_paraphrase_index",
    "data_unavailable_reason",
    "find_meteor_jar",
    "fingerprint",
    "index_path",
    "load_paraphrase_index",
    "paraphrase_path",
    "parse_lines",
    "pycocoevalcap_dir",
    "pycocoevalcap_file",
    "read_jar_data",
]

METEOR_ENV = "FINECAP_METEOR_JAR"
"""Environment variable naming the METEOR jar (its ``data/paraphrase-en.gz`` beside it)."""
JAR_NAME = "meteor-1.5.jar"
PARAPHRASE = Path("data") / "paraphrase-en.gz"
INDEX_VERSION = 3
"""Version of the cached paraphrase index's layout (part of its file name). 2: each pair's word count
(``pair_len``) instead of 64-bit offsets, 75 MB instead of 113. 3: the arrays' bytes after a JSON header and a
CRC-32 (:func:`_save`) instead of an ``.npz`` (written and read in about half the time)."""

_JAR_FILES = {
    "function_words": "function/english.words",
    "prefixes": "nonbreaking/english.prefixes",
    "synsets": "synonym/english.synsets",
    "exceptions": "synonym/english.exceptions",
}


class MetricUnavailable(RuntimeError):
    """An optional metric cannot run here (missing data, Java runtime or jar); the message says what is missing and
    what to install."""


def pycocoevalcap_dir() -> Path | None:
    """The installed ``pycocoevalcap`` package folder, found without importing it (``None`` if not installed)."""
    try:
        spec = importlib.util.find_spec("pycocoevalcap")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def pycocoevalcap_file(given: str | Path | None, env: str, *parts: str) -> Path | None:
    """Where a file of pycocoevalcap's is: ``given`` if not ``None``, else ``$env`` if set, else ``parts`` inside the
    installed pycocoevalcap package (``None`` when it is not installed)."""
    if given is not None:
        return Path(given)
    if os.environ.get(env):
        return Path(os.environ[env])
    root = pycocoevalcap_dir()
    return root.joinpath(*parts) if root is not None else None


def find_meteor_jar(jar: str | Path | None = None) -> Path | None:
    """The METEOR jar to use: ``jar`` if given, else ``$FINECAP_METEOR_JAR``, else pycocoevalcap's copy."""
    return pycocoevalcap_file(jar, METEOR_ENV, "meteor", JAR_NAME)


def paraphrase_path(jar: Path) -> Path:
    """The paraphrase table the jar uses: ``data/paraphrase-en.gz`` beside it."""
    return jar.parent / PARAPHRASE


def data_unavailable_reason(jar: str | Path | None = None) -> str | None:
    """Why METEOR's data cannot be read (``None`` when the jar and the paraphrase table are there)."""
    path = find_meteor_jar(jar)
    if path is None:
        return (
            f"{JAR_NAME} not found: METEOR reads its data (WordNet synonyms, paraphrase table) from pycocoevalcap; "
            f"install it (pip install pycocoevalcap) or set ${METEOR_ENV} to a {JAR_NAME}"
        )
    if not path.is_file():
        given = " (jar=...)" if jar is not None else f" (${METEOR_ENV})" if os.environ.get(METEOR_ENV) else ""
        return (
            f"{JAR_NAME} not found at {path}{given}: METEOR reads its data from pycocoevalcap "
            f"(pip install pycocoevalcap), or from the {JAR_NAME} that ${METEOR_ENV} names"
        )
    if not paraphrase_path(path).is_file():
        return f"METEOR paraphrase table missing: expected {paraphrase_path(path)} (reinstall pycocoevalcap)"
    return None


# --------------------------------------------------------------------------------------------------------------------
# Data inside the jar
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class JarData:
    """The English resources inside the jar.

    ``synsets`` maps a word to its synset ids as one space-separated string (split on demand: most of the 147k words
    never occur in a caption); ``exceptions`` maps an irregular form to the base words listing it.
    """

    function_words: frozenset[str]
    prefixes: dict[str, int]
    synsets: dict[str, str]
    exceptions: dict[str, tuple[str, ...]]
    _synset_cache: dict[str, frozenset[str]] = field(default_factory=dict, repr=False)

    def synsets_of(self, word: str) -> frozenset[str]:
        """The synset ids listed for ``word`` itself (empty when WordNet does not list it)."""
        out = self._synset_cache.get(word)
        if out is None:
            ids = self.synsets.get(word)
            out = self._synset_cache[word] = frozenset(ids.split()) if ids else frozenset()
        return out


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def read_jar_data(jar: str | Path) -> JarData:
    """Read the function words, non-breaking prefixes, synonym sets and irregular forms from ``jar``."""
    with zipfile.ZipFile(jar) as z:
        text = {k: z.read(name).decode("utf-8") for k, name in _JAR_FILES.items()}
    syn = _lines(text["synsets"])
    exc = _lines(text["exceptions"])
    exceptions: dict[str, list[str]] = {}
    for base, forms in zip(exc[0::2], exc[1::2]):
        for form in forms.split():
            exceptions.setdefault(form, []).append(base)
    return JarData(
        function_words=frozenset(_lines(text["function_words"])),
        prefixes=parse_prefixes(text["prefixes"]),
        synsets=dict(zip(syn[0::2], syn[1::2])),
        exceptions={k: tuple(v) for k, v in exceptions.items()},
    )


# --------------------------------------------------------------------------------------------------------------------
# The paraphrase table
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class ParaphraseTable:
    """The paraphrase pairs that can match in one evaluation: ``pairs[phrase] = [paraphrase, ...]`` (word tuples, in
    the table's order), ``prefixes``: the proper prefixes of the phrases (where a walk along a caption goes on), and
    the longest phrase's length.

    The matching stages walk captions along ``trie`` (``{word: [phrase id or -1, {next word: ...}]}``, the phrases
    word by word: one dict look-up a word instead of slicing a tuple and looking it up twice); ``paraphrases[id]`` is
    the phrase's list in ``pairs`` and ``first_words[id]`` the words they start with."""

    pairs: dict[tuple[str, ...], list[tuple[str, ...]]]
    prefixes: frozenset[tuple[str, ...]]
    max_len: int
    trie: dict[str, list] = field(default_factory=dict, repr=False)
    paraphrases: list[list[tuple[str, ...]]] = field(default_factory=list, repr=False)
    first_words: list[frozenset[str]] = field(default_factory=list, repr=False)

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[tuple[str, ...], tuple[str, ...]]]) -> ParaphraseTable:
        """The table of ``(phrase, paraphrase)`` pairs, in order."""
        table: dict[tuple[str, ...], list[tuple[str, ...]]] = {}
        for a, b in pairs:
            table.setdefault(a, []).append(b)
        prefixes = frozenset(k[:n] for k in table for n in range(1, len(k)))
        trie: dict[str, list] = {}
        for pid, phrase in enumerate(table):
            level = trie
            for w in phrase[:-1]:
                level = level.setdefault(w, [-1, {}])[1]
            level.setdefault(phrase[-1], [-1, {}])[0] = pid
        paraphrases = list(table.values())
        first_words = [frozenset(p[0] for p in ps) for ps in paraphrases]
        return cls(table, prefixes, max(map(len, table), default=0), trie, paraphrases, first_words)


@dataclass
class ParaphraseIndex:
    """The whole paraphrase table as word ids: ``vocab`` (the table's words), ``tokens`` (each pair's phrase words,
    then its paraphrase words), ``starts`` (pair k's words are ``tokens[starts[k]:starts[k + 1]]``) and
    ``phrase_len`` (how many of them are the phrase's)."""

    vocab: list[str]
    tokens: np.ndarray
    starts: np.ndarray
    phrase_len: np.ndarray

    _ids: dict[str, int] | None = field(default=None, repr=False, compare=False)

    def restrict(self, words: Iterable[str], bigrams: Iterable[tuple[str, str]] | None = None) -> ParaphraseTable:
        """The pairs whose words all occur in ``words`` (only they can match captions made of those words), and,
        when ``bigrams`` (the pairs of adjacent words in the captions) is given, whose phrase and paraphrase have no
        two adjacent words that are never adjacent in a caption: a phrase or paraphrase occurs in a caption only if
        every two adjacent words of it do.

        With the few hundred words of a synthetic corpus the words alone keep a few thousand pairs; with the
        thousands of everyday words of real captions they keep millions (2,000 common English words: 1.7 M of the
        5.3 M pairs, whose decoding alone takes seconds), of which the adjacent words keep only those that can
        match. The adjacent-word test is a hashed bitmap (a pair seen is never dropped, a few unseen ones are kept):
        every pair that can match is kept, so the scores are those of the whole table.
        """
        if self._ids is None:
            self._ids = {w: k for k, w in enumerate(self.vocab)}
        ids = self._ids
        known = np.zeros(len(self.vocab), dtype=bool)
        known[[ids[w] for w in set(words) if w in ids]] = True
        keep = np.flatnonzero(np.logical_and.reduceat(known[self.tokens], self.starts[:-1]))
        if bigrams is not None and len(keep):
            keep = keep[self._adjacent_seen(keep, bigrams)]
        vocab, starts, tokens, phrase_len = self.vocab, self.starts, self.tokens, self.phrase_len
        pairs = []
        for s, e, n in zip(starts[keep].tolist(), starts[keep + 1].tolist(), phrase_len[keep].tolist()):
            ws = [vocab[t] for t in tokens[s:e].tolist()]
            pairs.append((tuple(ws[:n]), tuple(ws[n:])))
        return ParaphraseTable.from_pairs(pairs)

    def _adjacent_seen(self, keep: np.ndarray, bigrams: Iterable[tuple[str, str]]) -> np.ndarray:
        """Which of the pairs ``keep`` have every two adjacent words of their phrase and of their paraphrase among
        ``bigrams`` (through a hashed bitmap: a few that are not are kept too). The words of the pairs kept are
        gathered when they are few; otherwise the test runs over the whole table, in 32-bit arithmetic."""
        ids = self._ids
        assert ids is not None
        mask = np.uint32((1 << _BIGRAM_BITS) - 1)
        seen = np.zeros(1 << _BIGRAM_BITS, dtype=bool)
        codes = [ids[a] * _BIGRAM_MIX + ids[b] for a, b in bigrams if a in ids and b in ids]
        if codes:
            seen[(np.array(codes, dtype=np.int64) & int(mask)).astype(np.intp)] = True
        first, length = self.starts[keep], self.starts[keep + 1] - self.starts[keep]
        if int(length.sum()) * 4 < len(self.tokens):  # few: their words only
            offsets = np.zeros(len(keep) + 1, dtype=np.int64)
            np.cumsum(length, out=offsets[1:])
            t = self.tokens[np.repeat(first - offsets[:-1], length) + np.arange(int(offsets[-1]))]
            starts, phrase_len = offsets, self.phrase_len[keep]
        else:
            t, starts, phrase_len = self.tokens, self.starts, self.phrase_len
        with np.errstate(over="ignore"):
            code = t[:-1].astype(np.uint32)
            code *= np.uint32(_BIGRAM_MIX)
            code += t[1:]
            code &= mask
        ok = np.append(seen[code], True)  # position i: the words i and i + 1
        ok[starts[1:] - 1] = True  # a pair's last word and the next pair's first: not adjacent
        ok[starts[:-1] + phrase_len.astype(np.int64) - 1] = True  # the phrase's last word and the paraphrase's first
        every = np.logical_and.reduceat(ok, starts[:-1])
        return every if len(every) == len(keep) else every[keep]


_BIGRAM_BITS = 24  # 16 MB of bitmap: under 1 % of it set by a million caption bigrams
_BIGRAM_MIX = 0x9E3779B1


def build_paraphrase_index(gz: str | Path) -> ParaphraseIndex:
    """Parse ``paraphrase-en.gz`` (probability, phrase, paraphrase lines) into a :class:`ParaphraseIndex`: with numpy
    (:func:`~finecap.metrics.meteor.table_scan.scan_table`, about a second), or line by line (:func:`parse_lines`, ten
    times slower) for a table that scan does not handle."""
    try:
        words, tokens, pair_len, phrase_len = scan_table(gz)
    except TableScanError:
        return parse_lines(gz)
    return ParaphraseIndex(words, tokens, _starts(pair_len), phrase_len.astype(np.uint8))


def parse_lines(gz: str | Path) -> ParaphraseIndex:
    """:func:`build_paraphrase_index` line by line in Python: the reference the numpy scan is tested against."""
    vocab: dict[str, int] = {}
    tokens = array("i")
    starts = array("q", [0])
    phrase_len = array("B")
    with gzip.open(gz, "rt", encoding="utf-8", newline="\n") as f:
        lines = iter(f)
        for _prob, phrase, para in zip(lines, lines, lines):
            a = phrase.rstrip("\n").split(" ")
            b = para.rstrip("\n").split(" ")
            for w in a:
                tokens.append(vocab.setdefault(w, len(vocab)))
            for w in b:
                tokens.append(vocab.setdefault(w, len(vocab)))
            phrase_len.append(len(a))
            starts.append(len(tokens))
    dtype = np.uint16 if len(vocab) <= 1 << 16 else np.uint32
    return ParaphraseIndex(
        vocab=list(vocab),
        tokens=np.frombuffer(tokens, dtype=np.int32).astype(dtype),
        starts=np.frombuffer(starts, dtype=np.int64).copy(),
        phrase_len=np.frombuffer(phrase_len, dtype=np.uint8).copy(),
    )


def _starts(pair_len: np.ndarray) -> np.ndarray:
    starts = np.zeros(len(pair_len) + 1, dtype=np.int64)
    np.cumsum(pair_len, out=starts[1:])
    return starts


_FINGERPRINT_BYTES = 1 << 16


def fingerprint(path: Path) -> str:
    """A digest of ``path`` that changes with its content, read in a millisecond: SHA-256 of its size and of its
    first and last 64 KiB. Both files it keys are archives that end with checksums of everything they hold (a zip
    file's central directory lists each member's CRC-32; a gzip file ends with the CRC-32 and length of its text),
    so another jar or table gives another fingerprint without hashing all 68 MB (0.1-0.2 s a run)."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        digest.update(f.read(_FINGERPRINT_BYTES))
        if size > _FINGERPRINT_BYTES:
            f.seek(max(_FINGERPRINT_BYTES, size - _FINGERPRINT_BYTES))
            digest.update(f.read())
    return digest.hexdigest()


def index_path(jar: Path, cache_root: Path | None = None) -> Path:
    """Where the paraphrase index of ``jar`` (and the table beside it) is cached."""
    root = cache_root if cache_root is not None else home() / CACHE / "meteor"
    key = f"{fingerprint(jar)[:16]}-{fingerprint(paraphrase_path(jar))[:16]}"
    return root / key / f"paraphrase-v{INDEX_VERSION}.bin"


_MAGIC = b"finecap METEOR paraphrase index\n"
_ARRAYS = ("vocab", "tokens", "pair_len", "phrase_len")
_DTYPES = {"|u1", "<u2", "<u4"}  # what the arrays may hold: bytes and word ids or counts


def _save(index: ParaphraseIndex, path: Path) -> None:
    """Cache ``index`` at ``path``: :data:`_MAGIC`, the header's length (8 bytes, little-endian), a JSON header
    (each array's name, dtype and length, and the CRC-32 of their bytes), then the arrays' bytes one after another.
    Plain arrays, nothing pickled; written in one atomic write. An ``.npz`` took twice as long to write and read (its
    zip layer copies and checksums every member on both sides)."""
    vocab = "\n".join(index.vocab).encode("utf-8")
    pair_len = np.diff(index.starts)
    small = np.uint8 if len(pair_len) == 0 or int(pair_len.max()) < 256 else np.uint32
    arrays = [np.frombuffer(vocab, dtype=np.uint8), index.tokens, pair_len.astype(small), index.phrase_len]
    arrays = [np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")) for a in arrays]
    crc = 0
    for a in arrays:
        crc = zlib.crc32(a, crc)
    header = json.dumps({"arrays": [[n, a.dtype.str, len(a)] for n, a in zip(_ARRAYS, arrays)], "crc32": crc})
    head = header.encode("utf-8")
    atomic_write_bytes(path, b"".join([_MAGIC, len(head).to_bytes(8, "little"), head, *map(memoryview, arrays)]))


def _load(path: Path) -> ParaphraseIndex:
    """The index :func:`_save` wrote at ``path``; ``ValueError`` for a file that is not one, or is damaged."""
    with open(path, "rb") as f:
        data = bytearray(os.fstat(f.fileno()).st_size)  # writable arrays, read without a second copy
        if f.readinto(data) != len(data):
            raise ValueError(f"{path}: changed while read")
    at = len(_MAGIC) + 8
    if data[: len(_MAGIC)] != _MAGIC:
        raise ValueError(f"{path}: not a finecap paraphrase index")
    end = at + int.from_bytes(data[len(_MAGIC) : at], "little")
    header = json.loads(data[at:end].decode("utf-8"))
    names = [name for name, _, _ in header["arrays"]]
    if names != list(_ARRAYS) or any(dtype not in _DTYPES or int(n) < 0 for _, dtype, n in header["arrays"]):
        raise ValueError(f"{path}: unexpected arrays {header['arrays']}")
    arrays, crc = [], 0
    for _, dtype, length in header["arrays"]:
        size = np.dtype(dtype).itemsize * int(length)
        if end + size > len(data):
            raise ValueError(f"{path}: truncated")
        arrays.append(np.frombuffer(data, dtype=dtype, count=int(length), offset=end))
        crc = zlib.crc32(memoryview(data)[end : end + size], crc)
        end += size
    if end != len(data) or crc != header["crc32"]:
        raise ValueError(f"{path}: damaged (size or CRC-32 differs)")
    vocab, tokens, pair_len, phrase_len = arrays
    return ParaphraseIndex(vocab.tobytes().decode("utf-8").split("\n"), tokens, _starts(pair_len), phrase_len)


def _cached_or_built(jar: Path, cache_root: str | Path | None) -> tuple[ParaphraseIndex, Path | None]:
    """The paraphrase index of ``jar`` from the cache, with ``None``; or built (a damaged cache file too), with the
    path to cache it at."""
    path = index_path(jar, Path(cache_root) if cache_root is not None else None)
    if path.is_file():
        try:
            return _load(path), None
        except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
            pass  # damaged or half-written by an older version: rebuilt below
    return build_paraphrase_index(paraphrase_path(jar)), path


def load_paraphrase_index(jar: str | Path, cache_root: str | Path | None = None) -> ParaphraseIndex:
    """The paraphrase index of the table beside ``jar``: from the cache when there, else built and cached.

    ``cache_root``: the folder of the cache (default ``<finecap home>/cache/meteor``). A damaged cache file is
    rebuilt.
    """
    index, path = _cached_or_built(Path(jar), cache_root)
    if path is not None:
        _save(index, path)
    return index


class PendingIndex:
    """:func:`load_paraphrase_index` running in a thread, started here: the caller reads the jar's data and
    normalises the captions meanwhile (the scan and the load spend most of their time in zlib and numpy, which
    release the GIL). :meth:`result` waits for the index and returns it or raises what loading or building it raised.
    A built index is handed over before it is cached: writing the cache file (0.2 s for the METEOR table) goes on in
    the thread while the caller goes on; :meth:`join` waits for it and raises what writing it raised."""

    def __init__(self, jar: str | Path, cache_root: str | Path | None = None):
        self._index: ParaphraseIndex | None = None
        self._error: BaseException | None = None
        self._cache_error: BaseException | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._load, args=(jar, cache_root), name="meteor-paraphrase-index")
        self._thread.start()

    def _load(self, jar: str | Path, cache_root: str | Path | None) -> None:
        path = None
        try:
            self._index, path = _cached_or_built(Path(jar), cache_root)
        except BaseException as e:  # raised by result(), in the caller's thread
            self._error = e
        finally:
            self._ready.set()
        if path is not None and self._index is not None:
            try:
                _save(self._index, path)
            except BaseException as e:  # raised by join()
                self._cache_error = e

    def result(self) -> ParaphraseIndex:
        self._ready.wait()
        if self._error is not None:
            raise self._error
        assert self._index is not None
        return self._index

    def join(self) -> None:
        """Wait until the thread has ended (the index cached when it was built); raise what caching it raised."""
        self._thread.join()
        if self._cache_error is not None:
            raise self._cache_error

    @property
    def failed(self) -> bool:
        """Whether loading or caching the index failed (a later evaluation should try again)."""
        return not self._thread.is_alive() and (self._error is not None or self._cache_error is not None)
