"""Texts longer than a retriever's text window: what was done with them, and how many there were.

A CLIP-family text tower reads at most its ``max_position_embeddings`` tokens, BOS and EOS included: its *text
window* (77 for CLIP, 248 for Long-CLIP; :class:`finecap.models.retriever.Retriever` reads it from the loaded
config). A detailed caption of 100-300 tokens does not fit. ``retriever.long_text`` (:data:`LONG_TEXT`) says what the
retriever does with one: ``truncate`` (the default, as CLIP's tokenizer does: its first window), ``error`` (refused,
naming it) or ``chunks`` (overlapping windows, pooled: :meth:`~finecap.models.retriever.Retriever.text_features`).

Nothing is silent: the users of a retriever encode captions through :func:`encode_texts`, which returns the
embeddings with each text's length (:class:`TextEncoding`), and say how many were longer than the window: the
self-retrieval reward logs the share as a part (``reward/retrieval/truncated``; ``.../chunked`` with ``chunks``),
the metric groups write the count (``retrieval/truncated``, ``clipscore/truncated``, ``family/truncated``;
``.../chunked``), only when there is one, beside their columns, and log one note (:func:`log_note`).

Imports no torch (the metric modules that read it are imported by text-only evaluation).

Example (a window of 8 tokens; the second text has 12)::

    >>> enc = TextEncoding(embeddings=[[1.0], [1.0]], tokens=(5, 12), window=8)
    >>> enc.long, enc.counts("retrieval")
    ([False, True], {'retrieval/truncated': 1.0})
    >>> print(enc.note("retrieval"))  # doctest: +NORMALIZE_WHITESPACE
    retrieval: 1 of 2 captions are longer than the retriever's text window of 8 tokens: truncated to it
    (retriever.long_text=truncate; 'chunks' encodes them whole)
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, get_args

from finecap.config import LongText

log = logging.getLogger(__name__)

LONG_TEXT: tuple[str, ...] = get_args(LongText)
"""``retriever.long_text``'s values: ``truncate``, ``error``, ``chunks``."""

DONE = {"truncate": "truncated", "chunks": "chunked"}
"""The key (``<what>/<done>``) under which each mode counts the long texts it encoded (``error`` encodes none)."""

_HOW = {
    "truncate": "truncated to it (retriever.long_text=truncate; 'chunks' encodes them whole)",
    "chunks": "encoded as overlapping windows and pooled (retriever.long_text=chunks)",
}


@dataclass(frozen=True)
class TextEncoding:
    """Unit-norm ``embeddings`` ``(N, D)`` of N texts, the number of ``tokens`` of each (BOS and EOS included,
    before any cut), the text ``window`` and what was done with the longer ones (``long_text``). A stand-in retriever
    without a tokenizer knows no lengths: ``tokens=()``, ``window=0``, and no text is long."""

    embeddings: Any
    tokens: tuple[int, ...] = ()
    window: int = 0
    long_text: str = "truncate"

    @property
    def long(self) -> list[bool]:
        """Per text: longer than the window."""
        if not self.window:
            return [False] * len(self.embeddings)
        return [n > self.window for n in self.tokens]

    def counts(self, what: str) -> dict[str, float]:
        """``{"<what>/truncated": n}`` (``/chunked`` with ``chunks``) when ``n > 0`` texts are longer than the
        window, else ``{}`` (results keep their columns when every text fits)."""
        n = sum(self.long)
        return {f"{what}/{DONE.get(self.long_text, 'long')}": float(n)} if n else {}

    def note(self, what: str) -> str | None:
        """One line saying how many of the captions ``what`` scored were longer than the window and what was done,
        or None when none was."""
        n = sum(self.long)
        if not n:
            return None
        return (f"{what}: {n} of {len(self.tokens)} captions are longer than the retriever's text window of "
                f"{self.window} tokens: {_HOW.get(self.long_text, 'refused')}")  # fmt: skip


def encode_texts(retriever: Any, texts: Sequence[str], names: Sequence[Hashable] | None = None) -> TextEncoding:
    """``retriever.encode_texts(texts, names)`` (:meth:`finecap.models.retriever.Retriever.encode_texts`; ``names``:
    each text's image id, for the refusal of ``retriever.long_text=error``); a stand-in retriever with only
    ``embed_texts`` (a test's, or a user's own) gives its embeddings and no lengths."""
    encode = getattr(retriever, "encode_texts", None)
    if encode is not None:
        return encode(texts, names=names)
    return TextEncoding(retriever.embed_texts(list(texts)))


def log_note(encoding: TextEncoding, what: str) -> None:
    """Log :meth:`TextEncoding.note` (``finecap eval`` prints it) when some caption was longer than the window."""
    note = encoding.note(what)
    if note:
        log.info("note: %s", note)
