"""Parse METEOR's paraphrase table (``paraphrase-en.gz``: probability, phrase, paraphrase lines) into word ids with
numpy: about 3 s of CPU for its 5.27 M pairs (a fifth of it inflating), where a line-by-line parse takes 10.

One thread inflates the text (272 MB; with ISA-L where ``isal`` is installed, else zlib) and cuts it into 1 MB blocks
at newlines, another tokenises them and the caller's thread gives the word ids in block order. In each block the
separators (space, newline) are found at once; every token between two separators is a word, exactly as
``line.split(" ")`` gives it (two spaces give an empty word). A token is keyed by its bytes read as three
little-endian 64-bit integers (bytes 0-7, 8-15 and 16-23, those past its end masked off) and its length: a key equal
for equal words and different for different words of up to 24 bytes. Keys are hashed to 64 bits and given word ids in
an open-addressing table of numpy arrays (vectorised linear probing); each id keeps the key of the first word that
took it, and every token's key is compared with the key of its id, so two words whose hashes collide are never
merged: :class:`TableScanError` is raised instead (as for words longer than 24 bytes, which the paraphrase table has
none of), and the caller parses the table line by line.

:func:`scan_table` returns the words (in the order they were given ids), the word ids of the phrase and paraphrase
words (the probability lines are skipped), the pairs' word counts and their phrases' lengths.
"""

from __future__ import annotations

import queue
import threading
import zlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

try:  # ISA-L's inflate (python-isal, a dependency where it has wheels): half of zlib's CPU time for the table
    from isal import isal_zlib as _inflater
except ImportError:  # zlib: the same bytes, more slowly
    _inflater = zlib  # type: ignore[assignment]

__all__ = ["MAX_WORD_BYTES", "TableScanError", "scan_table"]

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


def _tokenise(block: bytearray, line0: int, gz: Path) -> tuple:
    """The phrase and paraphrase tokens of a block that starts at line ``line0``: ``(block, its bytes padded for
    :func:`_windows`, newlines, starts, lens, pairs)``, ``pairs`` being ``(first pair, words of each pair from it on,
    words of each one's phrase)`` (the block's probability lines left out; a pair cut by the block's end is completed
    by the next)."""
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
    kept_line = kind != 0
    keep = np.flatnonzero(np.repeat(kept_line, on_line))
    starts = np.empty(len(sep), dtype=np.int64)
    starts[0] = 0
    np.add(sep[:-1], 1, out=starts[1:])
    starts = np.take(starts, keep)
    lens = np.take(sep, keep)
    lens -= starts
    if len(lens) and int(lens.max()) > MAX_WORD_BYTES:
        raise TableScanError(f"{gz}: a word longer than {MAX_WORD_BYTES} bytes")
    # tokens per line in rows of three lines (probability, phrase, paraphrase), one row a pair
    skip = line0 % 3
    grid = np.zeros(-(-(skip + len(ends)) // 3) * 3, dtype=np.int64)
    grid[skip : skip + len(ends)] = on_line
    grid[skip : skip + len(ends)][~kept_line] = 0
    grid = grid.reshape(-1, 3)
    pairs = (line0 // 3, grid[:, 1] + grid[:, 2], grid[:, 1].copy())
    return block, padded, len(ends), starts, lens, pairs


def _get(source: queue.Queue, stop: threading.Event) -> object:
    while not stop.is_set():
        try:
            return source.get(timeout=0.1)
        except queue.Empty:
            continue
    return None


def scan_table(gz: str | Path) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """``(words, tokens, pair_len, phrase_len)`` of ``paraphrase-en.gz``: pair k's words are the ``pair_len[k]``
    ids after those of the pairs before it, its phrase the first ``phrase_len[k]`` of them.

    Three threads in a pipeline: one inflates, one finds each block's tokens (:func:`_tokenise`), and this one keys
    and hashes them and gives the word ids, block after block in the table's order. Tried on the idle 2-core
    development machine and dropped: a second tokenising thread (more CPU, the same wall time: numpy's index
    operations on these arrays hold the GIL), and a helper process scanning the second half of the table (2.2-2.4 s
    against 1.8-2.1: the scan already keeps about 1.4 cores busy, and the helper adds CPU of its own, inflating the
    first half again, starting, and handing its part over).

    Raises :class:`TableScanError` (module docstring) and whatever reading or inflating the file raises.
    """
    gz = Path(gz)
    blocks: queue.Queue = queue.Queue(maxsize=8)
    stop = threading.Event()
    reader = threading.Thread(target=_inflate, args=(gz, blocks, stop, 1), daemon=True)
    reader.start()
    pool = ThreadPoolExecutor(1, thread_name_prefix="meteor-table-scan")
    pending: deque[Future] = deque()  # blocks being tokenised, in the table's order (at most two)
    ids = _Ids()
    words: list[str] = []
    tokens: list[np.ndarray] = []
    counts: list[tuple[int, np.ndarray, np.ndarray]] = []  # per block: first pair, words and phrase words per pair
    n_lines = 0
    rep = np.zeros((MAX_WORD_BYTES // 8 + 1, 1 << 16), dtype=np.uint64)  # per id: its first token's key and length
    try:
        done = False
        while not done or pending:
            while not done and len(pending) < 2:
                item = _get(blocks, stop)
                if item is None:
                    done = True
                elif isinstance(item, BaseException):
                    raise item
                else:
                    pending.append(pool.submit(_tokenise, item[2], item[1], gz))
            if not pending:
                break
            block, padded, newlines, starts, lens, pairs = pending.popleft().result()
            n_lines += newlines
            # the keys and their hashes here: this thread has time to spare, the tokenising one has not
            parts = _key_parts(_windows(padded), starts, lens)
            tid, first = ids.lookup(_hash(parts, lens))
            word_starts, word_lens = starts[first].tolist(), lens[first].tolist()
            words += [block[a : a + n].decode("utf-8") for a, n in zip(word_starts, word_lens)]
            if len(words) > rep.shape[1]:  # room for the new ids' keys
                more = np.zeros((len(parts) + 1, max(len(words), 2 * rep.shape[1])), np.uint64)
                rep = np.concatenate([rep, more], axis=1)
            rep[:, len(words) - len(first) : len(words)] = [*(p[first] for p in parts), lens[first].view(np.uint64)]
            same = np.array_equal(np.take(rep[-1], tid), lens) and np.array_equal(np.take(rep[0], tid), parts[0])
            for k in range(1, len(parts)):  # the other parts: only tokens that long can differ there
                long = np.flatnonzero(lens > 8 * k)
                same = same and np.array_equal(np.take(rep[k], tid[long]), parts[k][long])
            if not same:
                raise TableScanError(f"{gz}: two words with the same 64-bit hash")
            # kept in the narrowest type the ids so far fit (the table's 32.6 M tokens as 64-bit ids until the end
            # were 261 MB of fresh memory: a third of the scan's page faults)
            tokens.append(tid.astype(np.uint16 if len(words) <= 1 << 16 else np.uint32))
            counts.append(pairs)
    finally:
        stop.set()
        for future in pending:
            future.cancel()
        pool.shutdown(wait=True)
        reader.join()
    n_pairs = n_lines // 3  # an incomplete last pair is left out, as zip(lines, lines, lines) leaves it
    pair_len = np.zeros(n_pairs + 2, dtype=np.int64)
    phrase_len = np.zeros(n_pairs + 2, dtype=np.int64)
    for first_pair, per_pair, per_phrase in counts:
        pair_len[first_pair : first_pair + len(per_pair)] += per_pair
        phrase_len[first_pair : first_pair + len(per_pair)] += per_phrase
    dtype = np.uint16 if len(words) <= 1 << 16 else np.uint32  # a block's ids fit its type: joined, they fit this
    tok = np.concatenate(tokens, dtype=dtype) if tokens else np.empty(0, dtype=dtype)
    return words, tok[: int(pair_len[:n_pairs].sum())], pair_len[:n_pairs], phrase_len[:n_pairs]
