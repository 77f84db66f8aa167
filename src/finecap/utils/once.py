"""Notes said once per command: a warning or log line that each read of a data set, each validation or each load of a
configuration would repeat is said the first time only (:class:`SaidOnce`). A command is one process, so "once per
process" was enough for ``finecap train``; a notebook calls :func:`finecap.train` twice in one process, and the second
run said nothing of what the first had said (the bad images it left out, how it split the data). Each call of the
Python API is therefore a command of its own (:func:`said_afresh`): it says its notes as a fresh process would."""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Hashable, Iterator

_LOCK = threading.Lock()
_ALL: weakref.WeakSet[SaidOnce] = weakref.WeakSet()
_depth = 0  # how many said_afresh blocks are open (one call of the API may run inside another)


class SaidOnce:
    """The keys whose note was said in this command: :meth:`first` is ``True`` the first time it is asked about a
    key, and marks it said. Every instance forgets its keys when a call of the Python API starts
    (:func:`said_afresh`).

    >>> said = SaidOnce()
    >>> said.first(("data.jsonl", "train")), said.first(("data.jsonl", "train"))
    (True, False)
    >>> with said_afresh():
    ...     said.first(("data.jsonl", "train"))
    True
    """

    def __init__(self) -> None:
        self._keys: set[Hashable] = set()
        with _LOCK:
            _ALL.add(self)

    def first(self, key: Hashable) -> bool:
        """Whether ``key``'s note is said for the first time in this command (then it is marked said)."""
        with _LOCK:
            if key in self._keys:
                return False
            self._keys.add(key)
            return True


@contextlib.contextmanager
def said_afresh() -> Iterator[None]:
    """A command: when the outermost such block starts, every :class:`SaidOnce` forgets what it said, so the block's
    notes are said as in a fresh process (a block inside another forgets nothing: its notes are the outer one's). The
    Python API's calls (:func:`finecap.train`, :meth:`finecap.Captioner.from_pretrained`, :func:`finecap.evaluate`)
    run in one; a command line's process is one command already."""
    global _depth
    with _LOCK:
        if _depth == 0:
            for said in _ALL:
                said._keys.clear()
        _depth += 1
    try:
        yield
    finally:
        with _LOCK:
            _depth -= 1
