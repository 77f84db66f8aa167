"""METEOR's English data, read at run time from the user's pycocoevalcap: never copied into finecap.

- Inside ``meteor-1.5.jar`` (a zip file, read with :mod:`zipfile`): the function words
  (``function/english.words``), the Moses non-breaking prefixes (``nonbreaking/english.prefixes``), the WordNet 3.0
  synonym sets (``synonym/english.synsets``: word, then its synset ids) and irregular forms
  (``synonym/english.exceptions``: base word, then its forms). ``synonym/english.relations`` is never used.
- Beside the jar, ``data/paraphrase-en.gz``: 5.27 M paraphrase pairs as three lines each (probability, phrase,
  paraphrase). The first use builds an index of it (word ids in numpy arrays, each run of pairs that share a phrase
  holding the phrase once, about 42 MB; :func:`build_paraphrase_index`: a vectorised scan,
  :mod:`~finecap.metrics.meteor.table_scan`, about a second on a quiet 2-core machine) in the finecap home,
  ``<home>/cache/meteor/<key>/paraphrase-v4.bin``, keyed by :func:`fingerprint` s of the jar and of the table; later
  runs load it (a fraction of a second). Each evaluation keeps only the pairs that can match its captions
  (:meth:`ParaphraseIndex.restrict`). The index is plain arrays after a JSON header (:func:`_save`), written
  atomically.

Nothing is read at import time.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.machinery
import json
import os
import threading
import zipfile
import zlib
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path

import numpy as np

from finecap.home import CACHE, METEOR, home
from finecap.metrics.meteor.normalize import parse_prefixes
from finecap.metrics.meteor.table_scan import (
    ScannedTable,
    TableScanError,
    narrowest,
    read_arrays,
    row_starts,
    scan_table,
)
from finecap.utils.files import atomic_write_bytes

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
INDEX_VERSION = 4
"""Version of the cached paraphrase index's layout (part of its file name). 2: each pair's word count
(``pair_len``) instead of 64-bit offsets, 75 MB instead of 113. 3: the arrays' bytes after a JSON header and a
CRC-32 (:func:`_save`) instead of an ``.npz`` (written and read in about half the time). 4: each run of pairs that
share a phrase holds the phrase once (:class:`ParaphraseIndex`), 42 MB instead of 75."""

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
    """The installed ``pycocoevalcap`` package folder, found on ``sys.path`` without importing it (``None`` if not
    installed); never :mod:`finecap.compat`'s stand-in, which ``finecap.compat.install()`` puts in ``sys.modules``."""
    try:
        spec = importlib.machinery.PathFinder.find_spec("pycocoevalcap")
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
    """The whole paraphrase table as word ids. Pairs that share a phrase and follow each other in the table form a
    *run* (the table lists a phrase's paraphrases together: 5.27 M pairs in 430,639 runs), whose phrase is held
    once: ``vocab`` (the table's words), ``phrase_tokens`` (run r's phrase is
    ``phrase_tokens[phrase_starts[r]:phrase_starts[r + 1]]``), ``run_starts`` (run r's pairs are pairs
    ``run_starts[r]`` to ``run_starts[r + 1] - 1``), ``para_tokens`` (pair k's paraphrase is
    ``para_tokens[para_starts[k]:para_starts[k + 1]]``)."""

    vocab: list[str]
    phrase_tokens: np.ndarray
    phrase_starts: np.ndarray
    run_starts: np.ndarray
    para_tokens: np.ndarray
    para_starts: np.ndarray

    _ids: dict[str, int] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_scan(cls, scanned: ScannedTable) -> ParaphraseIndex:
        """The index of :func:`~finecap.metrics.meteor.table_scan.scan_table`'s arrays (lengths made offsets)."""
        return cls(scanned.words, scanned.phrase_tokens, row_starts(scanned.phrase_len), row_starts(scanned.run_pairs),
                   scanned.para_tokens, row_starts(scanned.para_len))  # fmt: skip

    def __len__(self) -> int:
        """The number of pairs."""
        return len(self.para_starts) - 1

    def _run_of(self, pairs: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.run_starts, pairs, side="right") - 1

    def pairs(self) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
        """Every ``(phrase, paraphrase)`` pair as words, in the table's order."""
        return self._pairs(np.arange(len(self)))

    def _pairs(self, keep: np.ndarray) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
        """Pairs ``keep`` as words: every word id of theirs looked up at once, then cut into phrases and
        paraphrases (a run's phrase once)."""
        run = self._run_of(keep)  # ascending, as ``keep`` is
        runs = run[np.append(True, run[1:] != run[:-1])] if len(run) else run
        phrase = dict(zip(runs.tolist(), _rows_as_words(self.vocab, self.phrase_tokens, self.phrase_starts, runs)))
        paraphrases = _rows_as_words(self.vocab, self.para_tokens, self.para_starts, keep)
        return [(phrase[r], p) for r, p in zip(run.tolist(), paraphrases)]

    def word_counts(self) -> np.ndarray:
        """How often each word of ``vocab`` occurs in the pairs (a phrase counted once for each of its pairs)."""
        per_run = np.diff(self.run_starts)
        weights = np.repeat(per_run, np.diff(self.phrase_starts))
        phrase = np.bincount(self.phrase_tokens, weights=weights, minlength=len(self.vocab))
        return (phrase + np.bincount(self.para_tokens, minlength=len(self.vocab))).astype(np.int64)

    def restrict(self, words: Iterable[str], bigrams: Iterable[tuple[str, str]] | None = None) -> ParaphraseTable:
        """The pairs whose words all occur in ``words`` (only they can match captions made of those words), and,
        when ``bigrams`` (the pairs of adjacent words in the captions) is given, whose phrase and paraphrase have no
        two adjacent words that are never adjacent in a caption: a phrase or paraphrase occurs in a caption only if
        every two adjacent words of it do.

        With the few hundred words of a synthetic corpus the words alone keep a few thousand pairs; with the
        thousands of everyday words of real captions they keep millions (2,000 common English words: 1.7 M of the
        5.3 M pairs, whose decoding alone takes seconds), of which the adjacent words keep only those that can
        match. The adjacent-word test is a hashed bitmap (a pair seen is never dropped, a few unseen ones are kept):
        every pair that can match is kept, so the scores are those of the whole table. A run's phrase is tested
        once for all its pairs.
        """
        if self._ids is None:
            self._ids = {w: k for k, w in enumerate(self.vocab)}
        ids = self._ids
        known = np.zeros(len(self.vocab), dtype=bool)
        known[[ids[w] for w in set(words) if w in ids]] = True
        runs = np.flatnonzero(_every(known[self.phrase_tokens], self.phrase_starts))
        seen = None if bigrams is None else self._bigram_bitmap(bigrams)
        if seen is not None and len(runs):
            runs = runs[_adjacent_seen(self.phrase_tokens, self.phrase_starts, runs, seen)]
        pairs = _rows_of(self.run_starts, runs)  # the pairs of the runs kept: only their paraphrases are tested
        length = self.para_starts[pairs + 1] - self.para_starts[pairs]
        keep = pairs[_every(known[self.para_tokens[_rows_of(self.para_starts, pairs)]], row_starts(length))]
        if seen is not None and len(keep):
            keep = keep[_adjacent_seen(self.para_tokens, self.para_starts, keep, seen)]
        return ParaphraseTable.from_pairs(self._pairs(keep))

    def _bigram_bitmap(self, bigrams: Iterable[tuple[str, str]]) -> np.ndarray:
        """The hashed bitmap of the captions' adjacent words (:func:`_adjacent_seen`)."""
        ids = self._ids
        assert ids is not None
        seen = np.zeros(1 << _BIGRAM_BITS, dtype=bool)
        bigrams = list(bigrams)
        first, second = list(map(itemgetter(0), bigrams)), list(map(itemgetter(1), bigrams))
        id_of = {w: ids.get(w, -1) for w in {*first, *second}}  # -1: a word the table does not hold
        a = np.fromiter(map(id_of.__getitem__, first), dtype=np.int64, count=len(first))
        b = np.fromiter(map(id_of.__getitem__, second), dtype=np.int64, count=len(second))
        both = (a >= 0) & (b >= 0)
        seen[((a[both] * _BIGRAM_MIX + b[both]) & ((1 << _BIGRAM_BITS) - 1)).astype(np.intp)] = True
        return seen


def _rows_of(starts: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The positions of the items of ``rows`` (row k holds positions ``starts[k]`` to ``starts[k + 1] - 1``), in
    order."""
    length = starts[rows + 1] - starts[rows]
    before = np.cumsum(length) - length  # items of the rows before, in the result
    return np.repeat(starts[rows] - before, length) + np.arange(int(length.sum()))


def _rows_as_words(
    vocab: list[str], tokens: np.ndarray, starts: np.ndarray, rows: np.ndarray
) -> list[tuple[str, ...]]:
    """The words of ``rows`` (as in :func:`_rows_of`), a tuple a row."""
    words = [vocab[t] for t in tokens[_rows_of(starts, rows)].tolist()]
    ends = np.cumsum(starts[rows + 1] - starts[rows]).tolist()
    return [tuple(words[a:b]) for a, b in zip([0, *ends[:-1]], ends)]


def _every(flags: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per row (``flags[starts[k]:starts[k + 1]]``, none empty): whether all its flags are set."""
    if len(starts) <= 1:
        return np.zeros(0, dtype=bool)
    return np.logical_and.reduceat(flags, starts[:-1])


def _adjacent_seen(tokens: np.ndarray, starts: np.ndarray, rows: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """Which of ``rows`` (of ``tokens``, as in :func:`_every`) have every two adjacent words among the captions'
    (``seen``, :meth:`ParaphraseIndex._bigram_bitmap`: a few that are not are kept too). The words of the rows are
    gathered when they are few; otherwise the test runs over all rows, in 32-bit arithmetic."""
    length = starts[rows + 1] - starts[rows]
    if int(length.sum()) * 4 < len(tokens):  # few: their words only
        t, starts = tokens[_rows_of(starts, rows)], row_starts(length)
    else:
        t = tokens
    with np.errstate(over="ignore"):
        code = t[:-1].astype(np.uint32)
        code *= np.uint32(_BIGRAM_MIX)
        code += t[1:]
        code &= np.uint32((1 << _BIGRAM_BITS) - 1)
    ok = np.append(seen[code], True)  # position i: the words i and i + 1
    ok[starts[1:] - 1] = True  # a row's last word and the next row's first: not adjacent
    every = np.logical_and.reduceat(ok, starts[:-1])
    return every if len(every) == len(rows) else every[rows]


_BIGRAM_BITS = 24  # 16 MB of bitmap: under 1 % of it set by a million caption bigrams
_BIGRAM_MIX = 0x9E3779B1


def build_paraphrase_index(gz: str | Path) -> ParaphraseIndex:
    """Parse ``paraphrase-en.gz`` (probability, phrase, paraphrase lines) into a :class:`ParaphraseIndex`: with numpy
    (:func:`~finecap.metrics.meteor.table_scan.scan_table`, about a second), or line by line (:func:`parse_lines`, ten
    times slower) for a table that scan does not handle."""
    try:
        scanned = scan_table(gz)
    except TableScanError:
        return parse_lines(gz)
    return ParaphraseIndex.from_scan(scanned)


def parse_lines(gz: str | Path) -> ParaphraseIndex:
    """:func:`build_paraphrase_index` line by line in Python: the reference the numpy scan is tested against (the
    same words, ids and runs)."""
    vocab: dict[str, int] = {}
    phrase_tokens, para_tokens = array("i"), array("i")
    phrase_len, run_pairs, para_len = array("q"), array("q"), array("q")
    last = None
    with gzip.open(gz, "rt", encoding="utf-8", newline="\n") as f:
        lines = iter(f)
        for _prob, phrase, para in zip(lines, lines, lines):
            phrase = phrase.rstrip("\n")
            if phrase != last:  # a new run
                a = phrase.split(" ")
                phrase_tokens.extend(vocab.setdefault(w, len(vocab)) for w in a)
                phrase_len.append(len(a))
                run_pairs.append(0)
                last = phrase
            run_pairs[-1] += 1
            b = para.rstrip("\n").split(" ")
            para_tokens.extend(vocab.setdefault(w, len(vocab)) for w in b)
            para_len.append(len(b))
    dtype = np.uint16 if len(vocab) <= 1 << 16 else np.uint32
    return ParaphraseIndex.from_scan(ScannedTable(
        list(vocab),
        np.frombuffer(phrase_tokens, dtype=np.int32).astype(dtype),
        np.frombuffer(phrase_len, dtype=np.int64),
        np.frombuffer(run_pairs, dtype=np.int64),
        np.frombuffer(para_tokens, dtype=np.int32).astype(dtype),
        np.frombuffer(para_len, dtype=np.int64),
    ))  # fmt: skip


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
    root = cache_root if cache_root is not None else home() / CACHE / METEOR
    key = f"{fingerprint(jar)[:16]}-{fingerprint(paraphrase_path(jar))[:16]}"
    return root / key / f"paraphrase-v{INDEX_VERSION}.bin"


_MAGIC = b"finecap METEOR paraphrase index\n"
_ARRAYS = ("vocab", "phrase_tokens", "phrase_len", "run_pairs", "para_tokens", "para_len")


def _save(index: ParaphraseIndex, path: Path) -> None:
    """Cache ``index`` at ``path``: :data:`_MAGIC`, the header's length (8 bytes, little-endian), a JSON header
    (each array's name, dtype and length, and the CRC-32 of their bytes), then the arrays' bytes one after another.
    Plain arrays, nothing pickled; written in one atomic write. An ``.npz`` took twice as long to write and read (its
    zip layer copies and checksums every member on both sides)."""
    vocab = "\n".join(index.vocab).encode("utf-8")
    lengths = [narrowest(np.diff(starts)) for starts in (index.phrase_starts, index.run_starts, index.para_starts)]
    arrays = [np.frombuffer(vocab, dtype=np.uint8), index.phrase_tokens, lengths[0], lengths[1], index.para_tokens,
              lengths[2]]  # fmt: skip
    arrays = [np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")) for a in arrays]
    listing = [[n, a.dtype.str, len(a)] for n, a in zip(_ARRAYS, arrays)]
    crc = zlib.crc32(json.dumps(listing).encode("utf-8"))  # the listing too: a damaged length is caught
    for a in arrays:
        crc = zlib.crc32(a, crc)
    header = json.dumps({"arrays": listing, "crc32": crc})
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
    if [name for name, _, _ in header["arrays"]] != list(_ARRAYS):
        raise ValueError(f"{path}: unexpected arrays {header['arrays']}")
    try:
        arrays, stop = read_arrays(data, end, [[dtype, n] for _, dtype, n in header["arrays"]])
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
    crc = zlib.crc32(memoryview(data)[end:stop], zlib.crc32(json.dumps(header["arrays"]).encode("utf-8")))
    if stop != len(data) or crc != header["crc32"]:
        raise ValueError(f"{path}: damaged (size or CRC-32 differs)")
    vocab, phrase_tokens, phrase_len, run_pairs, para_tokens, para_len = arrays
    words = vocab.tobytes().decode("utf-8").split("\n")
    tokens = (phrase_tokens, para_tokens)
    if not (len(phrase_len) == len(run_pairs) and int(run_pairs.sum()) == len(para_len)
            and int(phrase_len.sum()) == len(phrase_tokens) and int(para_len.sum()) == len(para_tokens)
            and all(int(t.max()) < len(words) for t in tokens if len(t))):  # fmt: skip
        raise ValueError(f"{path}: its arrays do not fit together")
    return ParaphraseIndex.from_scan(ScannedTable(words, phrase_tokens, phrase_len, run_pairs, para_tokens, para_len))


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
