"""Parse METEOR's paraphrase table (``paraphrase-en.gz``: probability, phrase, paraphrase lines) into word ids with
numpy: about 1.6 s of CPU for its 5.27 M pairs, a fifth of it inflating, where a line-by-line parse takes 10.

One thread inflates the text (272 MB; with ISA-L where ``isal`` is installed, else zlib) and cuts it into 1 MB blocks
at newlines; the caller's thread scans them, handing those it can to a helper process that scans them beside it
(:func:`scan_table`), and joins the two processes' blocks in the table's order. In each block the
separators (space, newline) are found at once; every token between two separators is a word, exactly as
``line.split(" ")`` gives it (two spaces give an empty word). The table lists the pairs of one phrase one after
another (5.27 M pairs, 430,639 runs of one phrase: 16.8 M of its 32.6 M words are a phrase line said again), so
each phrase line is compared byte for byte with the phrase line of the pair before it, and only a phrase that
starts a *run* is tokenised: the index holds each run's phrase once (:func:`scan_table`). A token is keyed by its
bytes read as three little-endian 64-bit integers (bytes 0-7, 8-15 and 16-23, those past its end masked off) and
its length: a key equal for equal words and different for different words of up to 24 bytes. Keys are hashed to 64
bits and given word ids in an open-addressing table of numpy arrays (vectorised linear probing); each id keeps the
key of the first word that took it, and every token's key is compared with the key of its id, so two words whose
hashes collide are never merged: :class:`TableScanError` is raised instead (as for words longer than 24 bytes, which
the paraphrase table has none of), and the caller parses the table line by line.

:func:`scan_table` returns the words (in the order they were given ids) and, as :class:`ScannedTable`, the runs'
phrases and the pairs' paraphrases as word ids (the probability lines are skipped).
"""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import struct
import subprocess
import sys
import threading
import zlib
from pathlib import Path, PureWindowsPath
from typing import NamedTuple

import numpy as np

try:  # ISA-L's inflate (python-isal, a dependency where it has wheels): half of zlib's CPU time for the table
    from isal import isal_zlib as _inflater
except ImportError:  # zlib: the same bytes, more slowly
    _inflater = zlib  # type: ignore[assignment]

__all__ = [
    "ARRAY_DTYPES",
    "MAX_WORD_BYTES",
    "ScannedTable",
    "TableScanError",
    "narrowest",
    "read_arrays",
    "row_starts",
    "scan_table",
]

MAX_WORD_BYTES = 24
"""Longest word (in UTF-8 bytes) the vectorised keys tell apart exactly; longer ones make :func:`scan_table` fail."""
_BLOCK = 1 << 20  # decompressed bytes a block holds, at least (then cut at its last newline): small blocks keep the
# arrays of a block in the processor's cache and reuse freed memory (16 MB blocks take 2.5 times as long)
_READ = 1 << 18  # compressed bytes inflated at a time
_PAD = bytes(MAX_WORD_BYTES + 16)  # lets the last token's 8-byte reads stay inside the block
# _MASKS[k // 8][n]: the bytes k .. k + 7 that a token of n bytes has (all ones when it has the 8)
_MASKS = np.array(
    [[(1 << (8 * min(max(n - k, 0), 8))) - 1 for n in range(MAX_WORD_BYTES + 1)] for k in range(0, MAX_WORD_BYTES, 8)],
    dtype=np.uint64,
)
_LOW_BYTES = np.array([(1 << (8 * n)) - 1 for n in range(8)] + [(1 << 64) - 1], dtype=np.uint64)  # [n]: n low bytes
_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F), np.uint64(0x165667B19E3779F9))
_EMPTY = np.uint64(0)  # slot value of an empty slot (a real hash of 0 is stored as 1)


class TableScanError(ValueError):
    """The table holds something the vectorised parse does not handle (a word longer than :data:`MAX_WORD_BYTES`,
    two words with the same 64-bit hash): parse it line by line instead."""


def _put(out: queue.Queue, item: object, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            out.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def _inflate(gz: Path, out: queue.Queue, stop: threading.Event, readers: int) -> None:
    """Put the text of ``gz`` into ``out`` in blocks that end at a newline (the last one may not), as ``(number,
    lines before it, block)``, then one ``None`` for each of the ``readers``; an exception is put instead, for the
    parsing thread to raise. Stops early when ``stop`` is set."""
    try:
        inflate = _inflater.decompressobj(31)  # gzip header and trailer
        text = bytearray()  # the block being filled: each inflated piece copied once, the block handed over as it is
        number = lines = 0
        with open(gz, "rb") as f:
            while not stop.is_set():
                raw = f.read(_READ)
                text += inflate.decompress(raw) if raw else inflate.flush()
                while inflate.eof and inflate.unused_data:  # a file of several gzip members, as gzip.open reads it
                    rest, inflate = inflate.unused_data, _inflater.decompressobj(31)
                    text += inflate.decompress(rest)
                if raw and len(text) < _BLOCK:
                    continue
                cut = text.rfind(b"\n") + 1 if raw else len(text)
                if cut:
                    block, text = text, text[cut:]  # the next block starts with what follows the last newline
                    del block[cut:]
                    count = block.count(b"\n")
                    if not _put(out, (number, lines, block), stop):
                        return
                    number, lines = number + 1, lines + count
                if not raw:
                    if not inflate.eof:
                        raise EOFError(f"{gz}: compressed file ended before the end-of-stream marker was reached")
                    break
        for _ in range(readers):
            _put(out, None, stop)
    except _inflater.error as e:  # as zlib's (which gzip.open raises too), whichever library inflated
        _put(out, e if isinstance(e, zlib.error) else zlib.error(f"{gz}: {e}"), stop)
    except BaseException as e:  # handed to the parsing thread, which raises it
        _put(out, e, stop)


class _Ids:
    """Word ids of 64-bit hashes (never 0): an open-addressing hash table in numpy arrays (linear probing), grown
    when half full; small enough to stay in the processor's cache for a table of some 10^5 words."""

    def __init__(self, bits: int = 16):
        self.bits = bits
        self.hashes = np.zeros(1 << bits, dtype=np.uint64)  # 0: a free slot
        self.ids = np.zeros(1 << bits, dtype=np.int32)
        self.count = 0

    def _slots(self, h: np.ndarray) -> np.ndarray:
        return (h >> np.uint64(64 - self.bits)).astype(np.intp)

    def _grow(self) -> None:
        used = self.hashes != 0
        hashes, ids = self.hashes[used], self.ids[used]
        self.bits += 1
        self.hashes = np.zeros(1 << self.bits, dtype=np.uint64)
        self.ids = np.zeros(1 << self.bits, dtype=np.int32)
        slots = self._slots(hashes)
        mask = (1 << self.bits) - 1
        while len(slots):  # distinct hashes: each takes the first free slot it probes
            free = np.flatnonzero(self.hashes[slots] == 0)
            _, k = np.unique(slots[free], return_index=True)
            first = free[k]
            self.hashes[slots[first]] = hashes[first]
            self.ids[slots[first]] = ids[first]
            rest = np.ones(len(slots), dtype=bool)
            rest[first] = False
            slots, hashes, ids = (slots[rest] + 1) & mask, hashes[rest], ids[rest]

    def lookup(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The id of each hash (new hashes get the next ids) and, for each new id in order, the position in ``h`` of
        one of its occurrences."""
        slots = self._slots(h)
        out = np.take(self.ids, slots)  # right where the slot holds the hash; the others are set below
        owner = np.take(self.hashes, slots)
        hit = owner == h
        todo = np.flatnonzero(~hit)  # new words, and words whose slot another word took first
        slots = slots[todo]
        new_reps: list[np.ndarray] = []
        mask = (1 << self.bits) - 1
        while len(todo):
            ht = h[todo]
            owner = self.hashes[slots]
            empty = np.flatnonzero(owner == 0)
            if len(empty):  # the free slots are taken by one of the tokens probing them (the last one written)
                claimed = slots[empty]
                self.hashes[claimed] = ht[empty]
                fresh = np.zeros(len(self.hashes), dtype=bool)
                fresh[claimed] = True
                fresh = np.flatnonzero(fresh)
                self.ids[fresh] = np.arange(self.count, self.count + len(fresh), dtype=np.int32)
                self.count += len(fresh)
                owner = self.hashes[slots]
                rep = np.empty(len(self.hashes), dtype=np.intp)
                won = empty[owner[empty] == ht[empty]]
                rep[slots[won]] = todo[won]
                new_reps.append(rep[fresh])
            hit = owner == ht
            out[todo[hit]] = self.ids[slots[hit]]
            miss = ~hit
            todo, slots = todo[miss], (slots[miss] + 1) & mask
            if self.count > (1 << self.bits) // 2:  # grown as soon as half full, also within a block: a block with
                # more new words than free slots would otherwise probe a full table for ever
                self._grow()
                mask = (1 << self.bits) - 1
                slots = self._slots(h[todo])  # the words still probing start again from their slots in the new table
        return out, np.concatenate(new_reps) if new_reps else np.empty(0, dtype=np.intp)


def _part(window: np.ndarray, starts: np.ndarray, lens: np.ndarray, k: int) -> np.ndarray:
    """Bytes ``k .. k + 7`` of each token as a little-endian integer (bytes past its end zero), read from ``window``
    (the block's bytes as overlapping little-endian 64-bit integers, one starting at each byte: :func:`_windows`).
    One unaligned read a token, half the time of two aligned reads shifted together; the mask works in place."""
    value = window[starts + k] if k else window[starts]
    value &= np.take(_MASKS[k // 8], lens)
    return value


def _windows(padded: bytearray) -> np.ndarray:
    """The 8 bytes starting at each byte of ``padded`` as a little-endian 64-bit integer (a view, no copy)."""
    return np.ndarray(shape=(len(padded) - 7,), dtype="<u8", buffer=padded, strides=(1,))


def _key_parts(window: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> list[np.ndarray]:
    """Each token's bytes 0-7, 8-15 and 16-23 (:func:`_part`; read only for the tokens that long)."""
    parts = [_part(window, starts, lens, 0)]
    for k in range(8, MAX_WORD_BYTES, 8):
        part = np.zeros(len(starts), dtype=np.uint64)
        long = np.flatnonzero(lens > k)
        if len(long):
            part[long] = _part(window, starts[long], lens[long], k)
        parts.append(part)
    return parts


def _hash(parts: list[np.ndarray], lens: np.ndarray) -> np.ndarray:
    """64-bit hashes of the keys (never 0, the free slot's mark)."""
    with np.errstate(over="ignore"):
        h = lens.astype(np.uint64)
        h *= _MIX[2]
        term = np.multiply(parts[0], _MIX[0])
        h ^= term
        for k, (p, mix) in enumerate(zip(parts[1:], (_MIX[1], _MIX[0] ^ _MIX[1])), 1):
            long = np.flatnonzero(lens > 8 * k)  # the other tokens have no bytes there: their term is 0
            if len(long):
                h[long] ^= np.take(p, long) * mix
        np.right_shift(h, np.uint64(31), out=term)
        h ^= term
        h *= _MIX[0]
        np.right_shift(h, np.uint64(29), out=term)
        h ^= term
    h[h == _EMPTY] = 1
    return h


def _repeated(window: np.ndarray, line_ends: np.ndarray, phrase: np.ndarray) -> np.ndarray:
    """Which of the phrase lines ``phrase`` (line numbers in the block) equal, byte for byte, the phrase line of the
    pair before (three lines up; a block's first phrase line is never compared, :func:`scan_table` joins its run
    to the one before when their words are the same). ``line_ends``: each line's newline (byte offset);
    ``window``: :func:`_windows` of the padded block. Lines of equal length are compared 8 bytes at a time, those
    still equal going on to the next 8."""
    out = np.zeros(len(phrase), dtype=bool)
    at = np.flatnonzero(phrase >= 3)
    line = phrase[at]
    end, before_end = line_ends[line], line_ends[line - 3]
    start = line_ends[line - 1] + 1
    before_start = np.where(line >= 4, line_ends[np.maximum(line - 4, 0)] + 1, 0)
    length = end - start
    todo = np.flatnonzero(length == before_end - before_start)
    k = 0
    while len(todo):
        left = length[todo] - k
        done = left <= 0  # every byte compared, all equal
        if done.any():
            out[at[todo[done]]] = True
            todo, left = todo[~done], left[~done]
        differ = window[start[todo] + k] ^ window[before_start[todo] + k]
        differ &= np.take(_LOW_BYTES, np.minimum(left, 8))
        todo = todo[differ == 0]
        k += 8
    return out


def _tokenise(block: bytearray, line0: int, gz: Path) -> tuple:
    """The tokens of a block that starts at line ``line0``: the paraphrase lines' and those of the phrase lines that
    start a run (not a repeat of the pair before's, :func:`_repeated`). Returns ``(block, its bytes padded for
    :func:`_windows`, newlines, starts, lens, is_phrase, pairs)``: ``is_phrase`` marks the phrase tokens, ``pairs``
    is ``(first pair, phrase words of each pair from it on (0 for a repeated phrase), paraphrase words of each,
    whether each starts a run, the pair of the block's first phrase line or -1)`` (the probability lines left out; a
    pair cut by the block's end is completed by the next)."""
    if not block.endswith(b"\n"):
        block.append(10)
    n = len(block)
    padded = block  # padded in place (the block is this scan's own): whole 64-bit words, room to read past the end
    padded += bytes((-n % 8) + len(_PAD))
    buf = np.frombuffer(padded, dtype=np.uint8)
    sep = np.flatnonzero(buf[:n] <= 32)
    ch = np.take(buf, sep)
    newline = ch == 10
    real = newline | (ch == 32)
    if not real.all():  # a control character inside a word: not a separator
        sep, newline = sep[real], newline[real]
    ends = np.flatnonzero(newline)  # the separator ending each line (the block ends with one)
    on_line = np.diff(ends, prepend=-1)  # tokens on each line
    kind = (np.arange(len(ends)) + line0) % 3  # 0: probability, 1: phrase, 2: paraphrase
    phrase = np.flatnonzero(kind == 1)
    kept_line = kind != 0
    kept_line[phrase[_repeated(_windows(padded), np.take(sep, ends), phrase)]] = False
    keep = np.flatnonzero(np.repeat(kept_line, on_line))
    starts = np.empty(len(sep), dtype=np.int64)
    starts[0] = 0
    np.add(sep[:-1], 1, out=starts[1:])
    starts = np.take(starts, keep)
    lens = np.take(sep, keep)
    lens -= starts
    if len(lens) and int(lens.max()) > MAX_WORD_BYTES:
        raise TableScanError(f"{gz}: a word longer than {MAX_WORD_BYTES} bytes")
    kept = np.flatnonzero(kept_line)
    is_phrase = np.repeat(kind[kept] == 1, on_line[kept])
    # tokens per line in rows of three lines (probability, phrase, paraphrase), one row a pair
    skip = line0 % 3
    size = -(-(skip + len(ends)) // 3) * 3
    grid = np.zeros(size, dtype=np.int64)
    grid[skip : skip + len(ends)] = on_line
    grid[skip : skip + len(ends)][~kept_line] = 0
    grid = grid.reshape(-1, 3)
    new = np.zeros(size, dtype=bool)
    new[skip : skip + len(ends)] = kept_line & (kind == 1)
    first = (line0 + int(phrase[0])) // 3 if len(phrase) else -1
    pairs = (line0 // 3, narrowest(grid[:, 1]), narrowest(grid[:, 2]), new.reshape(-1, 3)[:, 1].copy(), first)
    return block, padded, len(ends), starts, lens, is_phrase, pairs


def _get(source: queue.Queue, stop: threading.Event) -> object:
    while not stop.is_set():
        try:
            return source.get(timeout=0.1)
        except queue.Empty:
            continue
    return None


class ScannedTable(NamedTuple):
    """The paraphrase table as word ids (:func:`scan_table`): ``words``, the ids' words; pairs that share a phrase
    and follow each other in the table form a *run*: run r's phrase is ``phrase_len[r]`` ids of ``phrase_tokens``
    (after those of the runs before) and its pairs are the next ``run_pairs[r]`` pairs; pair k's paraphrase is
    ``para_len[k]`` ids of ``para_tokens``."""

    words: list[str]
    phrase_tokens: np.ndarray
    phrase_len: np.ndarray
    run_pairs: np.ndarray
    para_tokens: np.ndarray
    para_len: np.ndarray


class _Block(NamedTuple):
    """One block scanned: its number in the table, its lines, its phrase and paraphrase word ids (of the process
    that scanned it) and its pairs' counts (:func:`_tokenise`)."""

    number: int
    lines: int
    phrase: np.ndarray
    para: np.ndarray
    pairs: tuple


class _Words:
    """Word ids in one process: the ids' words, and each id's key (to catch two words of one hash)."""

    def __init__(self, gz: Path):
        self.gz = gz
        self.ids = _Ids()
        self.words: list[str] = []
        self.rep = np.zeros((MAX_WORD_BYTES // 8 + 1, 1 << 16), dtype=np.uint64)  # per id: its first key and length

    def scan(self, number: int, line0: int, block: bytearray) -> _Block:
        """Tokenise ``block`` (:func:`_tokenise`), key and hash its words and give them ids."""
        block, padded, lines, starts, lens, is_phrase, pairs = _tokenise(block, line0, self.gz)
        parts = _key_parts(_windows(padded), starts, lens)
        tid, first = self.ids.lookup(_hash(parts, lens))
        words, rep = self.words, self.rep
        words += [block[a : a + n].decode("utf-8") for a, n in zip(starts[first].tolist(), lens[first].tolist())]
        if len(words) > rep.shape[1]:  # room for the new ids' keys
            more = np.zeros((len(parts) + 1, max(len(words), 2 * rep.shape[1])), np.uint64)
            rep = self.rep = np.concatenate([rep, more], axis=1)
        rep[:, len(words) - len(first) : len(words)] = [*(p[first] for p in parts), lens[first].view(np.uint64)]
        same = np.array_equal(np.take(rep[-1], tid), lens) and np.array_equal(np.take(rep[0], tid), parts[0])
        for k in range(1, len(parts)):  # the other parts: only tokens that long can differ there
            long = np.flatnonzero(lens > 8 * k)
            same = same and np.array_equal(np.take(rep[k], tid[long]), parts[k][long])
        if not same:
            raise TableScanError(f"{self.gz}: two words with the same 64-bit hash")
        # kept in the narrowest type the ids so far fit (the table's 32.6 M tokens as 64-bit ids until the end were
        # 261 MB of fresh memory: a third of the scan's page faults)
        tid = tid.astype(np.uint16 if len(words) <= 1 << 16 else np.uint32)
        return _Block(number, lines, tid[is_phrase], tid[~is_phrase], pairs)


_FRAME = struct.Struct("<qqq")  # a block sent to the helper: its number, first line and length; number -1: the end
_END = _FRAME.pack(-1, 0, 0)  # the end of the blocks, said rather than left to the end of the file: a process forked
# meanwhile (a DataLoader, a multiprocessing pool) would hold the pipe's write end open, and the helper wait for ever
_SCAN_ERROR = 3  # the helper's exit status for a TableScanError (its message on stderr)


class _HelperFailed(RuntimeError):
    """The helper process did not scan its blocks (it could not start, or died): the table is scanned here."""


class _Helper:
    """A second process (this file run by path with ``python -P``: numpy and isal only, no finecap import, about
    70 ms to start) that scans the blocks it is given while this process scans the others. A thread writes the
    blocks to its standard input; :meth:`offer` gives it a block only when its queue has room, so each process
    takes as many blocks as it has time for. :meth:`results` closes its input and reads its blocks back."""

    def __init__(self, gz: Path):
        self.gz = gz
        self.process = subprocess.Popen(
            [sys.executable, "-P", str(Path(__file__).resolve()), _HELPER_ARG, str(gz)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        self.queue: queue.Queue = queue.Queue(maxsize=2)
        self.error: BaseException | None = None
        self.writer = threading.Thread(target=self._write, name="meteor-table-helper", daemon=True)
        try:
            self.writer.start()
        except BaseException:  # no thread to feed it (RuntimeError): no helper
            self.process.kill()
            self.process.wait()
            raise

    def _write(self) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        try:
            while (item := self.queue.get()) is not None:
                number, line0, block = item
                stdin.write(_FRAME.pack(number, line0, len(block)))
                stdin.write(block)
            stdin.write(_END)
            stdin.close()
        except BaseException as e:  # the helper died: results() says so
            self.error = e

    def offer(self, number: int, line0: int, block: bytearray) -> bool:
        """Give the helper this block if it has room for it (``False``: scan it here)."""
        if self.error is not None or not self.writer.is_alive():
            return False
        try:
            self.queue.put_nowait((number, line0, block))
            return True
        except queue.Full:
            return False

    def results(self) -> tuple[list[str], list[_Block]]:
        """The helper's words and blocks (their ids its own); :class:`_HelperFailed` if it did not scan them all,
        :class:`TableScanError` if it found what the scan does not handle."""
        while self.writer.is_alive():
            try:
                self.queue.put(None, timeout=0.1)
                break
            except queue.Full:
                continue
        self.writer.join()
        stdout = self.process.stdout
        assert stdout is not None
        try:
            data = stdout.read()  # the whole answer (tens of MB), read before waiting: the helper may block on it
            words, blocks = _read_blocks(data)
        except Exception:  # any answer that is not one (cut, damaged): the helper failed
            words, blocks = [], None
        status = self.process.wait()
        err = self.process.stderr.read().decode("utf-8", "replace").strip() if self.process.stderr else ""
        if status == _SCAN_ERROR:
            raise TableScanError(err.splitlines()[-1] if err else f"{self.gz}: the helper could not scan it")
        if status != 0 or blocks is None or self.error is not None:
            raise _HelperFailed(f"exit status {status}: {err[-500:] or self.error}")
        return words, blocks

    def close(self) -> None:
        """Stop the helper if it still runs (an error here); wait for it and for the writing thread (woken by an
        end mark, or by the broken pipe when its queue is full)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        with contextlib.suppress(queue.Full):
            self.queue.put_nowait(None)
        for pipe in (self.process.stdin, self.process.stdout, self.process.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        self.writer.join(timeout=5)


def scan_table(gz: str | Path, helper: bool | None = None) -> ScannedTable:
    """The :class:`ScannedTable` of ``paraphrase-en.gz``: the same runs and words as the line-by-line parse
    (:func:`finecap.metrics.meteor.resources.parse_lines`) gives (the ids in another order).

    A thread inflates the table into blocks; this thread scans them (:func:`_tokenise`, then the ids,
    :class:`_Words`), handing every block it can to a helper process (:class:`_Helper`; ``helper``: ``None``
    where this process may use 2 CPUs or more) and scanning the others itself. At the end the helper's words get
    this process's ids and the blocks are joined in the table's order; a block's first phrase line starts a run of
    its own, joined to the run before when their words are the same (a run cut by the block's end). When the helper
    fails (it cannot start, or dies), the whole table is scanned again in this process. Measured on the 2-core
    development machine: 1.5-1.8 s of wall time with the helper (2.8-3.0 s of CPU in the two processes), 2.1 s
    without it (2.4 s of CPU), where the earlier pipeline of three threads in one process took 2.0-2.1 s (2.7-2.8 s
    of CPU: its threads share the GIL, and a second tokenising thread was no faster than one).

    Raises :class:`TableScanError` (module docstring) and whatever reading or inflating the file raises.
    """
    gz = Path(gz)
    if helper is None:
        from finecap.utils.system import usable_cpus

        helper = usable_cpus() >= 2 and _is_python(sys.executable)
    blocks: queue.Queue = queue.Queue(maxsize=8)
    stop = threading.Event()
    reader = threading.Thread(target=_inflate, args=(gz, blocks, stop, 1), daemon=True)
    reader.start()
    other: _Helper | None = None
    words = _Words(gz)
    mine: list[_Block] = []
    theirs: list[_Block] = []
    try:
        try:
            other = _Helper(gz) if helper else None
        except (OSError, TypeError, ValueError, RuntimeError):  # no interpreter (sys.executable empty), no thread
            other = None
        while (item := _get(blocks, stop)) is not None:
            if isinstance(item, BaseException):
                raise item
            number, line0, block = item
            if other is None or not other.offer(number, line0, block):
                mine.append(words.scan(number, line0, block))
        if other is not None:
            their_words, theirs = other.results()
            try:
                ids = _merge_words(words.words, their_words)
                theirs = [b._replace(phrase=ids[b.phrase], para=ids[b.para]) for b in theirs]
            except IndexError as e:  # an id the helper gave no word: its answer is wrong
                raise _HelperFailed(f"the helper's ids: {e}") from e
    except _HelperFailed:
        failed = True  # the whole table is scanned here, below
    else:
        failed = False
    finally:
        stop.set()
        if other is not None:
            other.close()
        reader.join()
    if failed:
        return scan_table(gz, helper=False)
    done = sorted(mine + theirs, key=lambda b: b.number)
    return _runs(words.words, done, sum(b.lines for b in done) // 3)


def _is_python(executable: str | None) -> bool:
    """Whether ``executable`` (``sys.executable``) is a Python interpreter that can run the helper: in an embedded
    interpreter (uWSGI, mod_wsgi) it may be the server's binary, which is not started with the helper's arguments."""
    name = PureWindowsPath(executable or "").name.lower()  # either separator: / and \\
    return name.startswith(("python", "pypy"))


def _merge_words(words: list[str], theirs: list[str]) -> np.ndarray:
    """Give ``theirs`` (another process's words, by its ids) this process's ids, appending to ``words`` those it
    has not seen; returns the ids by the other process's id."""
    known = {w: k for k, w in enumerate(words)}
    ids = np.empty(len(theirs), dtype=np.uint32)
    for k, w in enumerate(theirs):
        i = known.get(w)
        if i is None:
            i = known[w] = len(words)
            words.append(w)
        ids[k] = i
    return ids


_HELPER_ARG = "--scan-blocks"


def _serve(gz: Path) -> int:
    """The helper's side (:class:`_Helper`): scan the blocks read from standard input until their end mark, then
    write to standard output the JSON header's length (8 bytes, little-endian), the header and the arrays' bytes
    (:func:`_read_blocks` reads them)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C reaches the whole process group: the caller decides
    source, out = sys.stdin.buffer, sys.stdout.buffer
    words = _Words(gz)
    done: list[_Block] = []
    try:
        while True:
            head = source.read(_FRAME.size)
            if len(head) != _FRAME.size:
                raise EOFError("the scan's input ended before its end mark")
            number, line0, size = _FRAME.unpack(head)
            if number < 0:
                break
            block = bytearray(source.read(size))
            if len(block) != size:
                raise EOFError("the scan's input ended inside a block")
            done.append(words.scan(number, line0, block))
    except TableScanError as e:
        print(e, file=sys.stderr)
        return _SCAN_ERROR
    arrays = [np.frombuffer("\n".join(words.words).encode("utf-8"), dtype=np.uint8)]
    meta = []
    for b in done:
        first_pair, per_phrase, per_para, starts_run, block_first = b.pairs
        arrays += [b.phrase, b.para, per_phrase, per_para, starts_run.view(np.uint8)]
        meta.append([b.number, b.lines, first_pair, block_first])
    header = json.dumps({"words": len(words.words), "arrays": [[a.dtype.str, len(a)] for a in arrays],
                         "blocks": meta}).encode("utf-8")  # fmt: skip
    out.write(len(header).to_bytes(8, "little") + header)
    for a in arrays:
        out.write(memoryview(np.ascontiguousarray(a)).cast("B"))
    out.flush()
    return 0


ARRAY_DTYPES = frozenset({"|u1", "<u2", "<u4"})
"""The array types written after a JSON header (the helper's answer, the cached index): bytes, word ids, counts."""


def read_arrays(data: bytes | bytearray, at: int, listing: list) -> tuple[list[np.ndarray], int]:
    """The arrays ``listing`` names (``[dtype, length]`` each) stored one after another in ``data`` from offset
    ``at``, as views, and the offset where they end; ``ValueError`` for another type or for ``data`` too short."""
    arrays = []
    for dtype, length in listing:
        if dtype not in ARRAY_DTYPES or int(length) < 0:
            raise ValueError(f"unexpected array {dtype} x {length}")
        if at + np.dtype(dtype).itemsize * int(length) > len(data):
            raise ValueError("truncated")
        arrays.append(np.frombuffer(data, dtype=dtype, count=int(length), offset=at))
        at += arrays[-1].nbytes
    return arrays, at


def row_starts(lengths: np.ndarray) -> np.ndarray:
    """Offsets of rows of these lengths (one more than rows, the first 0)."""
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    return starts


def narrowest(counts: np.ndarray) -> np.ndarray:
    """Non-negative ``counts`` in the narrowest unsigned type that holds them (8, 16 or 32 bits)."""
    top = int(counts.max()) if len(counts) else 0
    return counts.astype(np.uint8 if top < 1 << 8 else np.uint16 if top < 1 << 16 else np.uint32)


def _read_blocks(data: bytes) -> tuple[list[str], list[_Block]]:
    """The words and blocks :func:`_serve` wrote (``ValueError`` and the like for anything else)."""
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    arrays, at = read_arrays(data, 8 + size, header["arrays"])
    if at != len(data) or len(arrays) != 1 + 5 * len(header["blocks"]):
        raise ValueError("the helper's answer is cut or too long")
    words = arrays[0].tobytes().decode("utf-8").split("\n") if header["words"] else []  # [""]: one empty word
    if len(words) != header["words"]:
        raise ValueError(f"{len(words)} words where the helper said {header['words']}")
    blocks = []
    for k, (number, lines, first_pair, block_first) in enumerate(header["blocks"]):
        phrase, para, per_phrase, per_para, starts_run = arrays[1 + 5 * k : 6 + 5 * k]
        pairs = (first_pair, per_phrase, per_para, starts_run.view(bool), block_first)  # counts as narrow as sent
        blocks.append(_Block(number, lines, phrase, para, pairs))
    return words, blocks


def _runs(words: list[str], blocks: list[_Block], n_pairs: int) -> ScannedTable:
    """The blocks (in the table's order) as one :class:`ScannedTable` of ``n_pairs`` pairs (an incomplete last pair
    is left out, as ``zip(lines, lines, lines)`` leaves it): each block's first phrase line joined to the run before
    when their words are the same."""
    if not blocks:
        empty = np.empty(0, dtype=np.uint16)
        return ScannedTable(words, empty, empty, empty, empty, empty)
    # a pair cut by a block's end has a row in both blocks: the later block's row is left out when joining and added
    # to the earlier one (each line is in one block, so one of the two rows is 0 in each column)
    cut, cut_at, row, at = [], [], 0, 0
    for k, b in enumerate(blocks):
        rows = len(b.pairs[2])
        if b.pairs[0] < row:
            cut.append(k)
            cut_at.append(at - 1)
            rows -= 1
        row, at = b.pairs[0] + len(b.pairs[2]), at + rows
    cuts = set(cut)
    phrase_len, para_len, new = (
        np.concatenate([b.pairs[col][1:] if k in cuts else b.pairs[col] for k, b in enumerate(blocks)])
        for col in (1, 2, 3)
    )
    for k, at in zip(cut, cut_at):
        first = blocks[k].pairs
        phrase_len[at] += first[1][0]
        para_len[at] += first[2][0]
        new[at] |= first[3][0]
    phrase_len, para_len, new = phrase_len[:n_pairs], para_len[:n_pairs], new[:n_pairs]
    dtype = np.uint16 if len(words) <= 1 << 16 else np.uint32  # a block's ids fit its type: joined, they fit this
    phrase = np.concatenate([b.phrase for b in blocks], dtype=dtype)[: int(phrase_len.sum())]
    para = np.concatenate([b.para for b in blocks], dtype=dtype)[: int(para_len.sum())]
    run_first = np.flatnonzero(new)
    run_len = phrase_len[run_first]
    offsets = row_starts(run_len)
    drop = []  # runs that repeat the run before across a block's start
    for b in blocks:
        pair = b.pairs[4]
        if not 0 < pair < n_pairs:
            continue
        r = int(np.searchsorted(run_first, pair))
        if r == 0 or r >= len(run_first) or run_first[r] != pair:
            continue
        if np.array_equal(phrase[offsets[r] : offsets[r + 1]], phrase[offsets[r - 1] : offsets[r]]):
            drop.append(r)
    if drop:
        keep_token = np.ones(len(phrase), dtype=bool)
        for r in drop:
            keep_token[offsets[r] : offsets[r + 1]] = False
        phrase = phrase[keep_token]
        keep_run = np.ones(len(run_first), dtype=bool)
        keep_run[drop] = False
        run_first, run_len = run_first[keep_run], run_len[keep_run]
    run_pairs = np.diff(run_first, append=n_pairs)
    return ScannedTable(words, phrase, run_len, run_pairs, para, para_len)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == _HELPER_ARG:  # the helper (_Helper), by path
    sys.exit(_serve(Path(sys.argv[2])))
