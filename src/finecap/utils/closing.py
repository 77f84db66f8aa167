"""Closing things: ``with`` on anything that has a ``close()`` (:class:`Closeable`), several things at once, every
one closed even when an earlier one's ``close`` raises (:func:`close_all`), and the error of a use after ``close()``
(:class:`UsedAfterClose`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Self


class UsedAfterClose(RuntimeError):
    """A use of something after its ``close()`` freed what the use needs (a vLLM engine shut down, a judge's engine
    and answer cache): the message names what was closed and how to get another, where the use would otherwise fail
    deep inside, naming neither (``'NoneType' object has no attribute 'generate'``)."""


class Closeable:
    """A base that gives a class with a ``close()`` method ``with obj:``, the block ending with ``obj.close()``
    (a generation engine, a reward scorer, a :class:`finecap.Captioner`).

    >>> class Thing(Closeable):
    ...     closed = False
    ...     def close(self):
    ...         self.closed = True
    >>> with Thing() as thing:
    ...     pass
    >>> thing.closed
    True
    """

    def close(self) -> None:
        """Release what the object holds; nothing by default."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def close_all(things: Iterable[Any]) -> None:
    """Call ``close()`` on each of ``things`` in order (``None`` entries passed over), all of them even when some
    raise; then raise the first error, with a note naming each later one. A judge whose server connection fails to
    close still closes its answer cache; a weighted reward whose first component fails still closes the others.

    >>> class Thing:
    ...     def __init__(self, name, fails=False):
    ...         self.name, self.fails, self.closed = name, fails, False
    ...     def close(self):
    ...         self.closed = True
    ...         if self.fails:
    ...             raise OSError(f"{self.name} did not close")
    >>> things = [Thing("a", fails=True), None, Thing("b"), Thing("c", fails=True)]
    >>> close_all(things)
    Traceback (most recent call last):
    ...
    OSError: a did not close
    also failed to close Thing: OSError: c did not close
    >>> [t.closed for t in things if t is not None]
    [True, True, True]
    """
    first: BaseException | None = None
    for thing in things:
        if thing is None:
            continue
        try:
            thing.close()
        except Exception as e:  # noqa: BLE001 - the others are closed first, then the first error is raised
            if first is None:
                first = e
            else:
                first.add_note(f"also failed to close {type(thing).__name__}: {type(e).__name__}: {e}")
    if first is not None:
        raise first
