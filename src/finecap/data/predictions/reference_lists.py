"""Reference columns that hold a list as text (VLMEvalKit's ``answer``: ``"['a dog runs.', 'A brown dog.']"``;
lmms-eval's ``target``): parsed, and a value that only looks like a list is kept as one caption and counted."""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from finecap.data.records import MAX_LISTED, DataError, clean_captions
from finecap.utils.text import short_repr


@dataclass
class ReferenceLists:
    """Parses the reference values of one column of one file; :meth:`warnings` says which only looked like lists.

    Errors and warnings name each value's place as the file has them: a table's (``.tsv``, ``.xlsx``) by its row
    number, a JSON Lines file's (``lines=True``) by its line number; a place given as text (``"logs[2]"``: an element
    of a JSON list) as it is.

    >>> refs = ReferenceLists(Path("r.tsv"), "answer")
    >>> refs.parse("['a dog.', \\"a dog's toy\\"]", 1), refs.parse("a cat", 2), refs.parse("['a ca", 3)
    (['a dog.', "a dog's toy"], ['a cat'], ["['a ca"])
    >>> print(refs.warnings()[0])  # doctest: +ELLIPSIS
    r.tsv: column 'answer': 1 value(s) look like a stringified list but do not parse as one (rows 3: ...
    >>> ReferenceLists(Path("p.jsonl"), "label", lines=True).parse("", 4)
    Traceback (most recent call last):
    ...
    finecap.data.records.DataError: p.jsonl, line 4: 'label': caption 0 is empty
    """

    path: Path
    column: str
    lines: bool = False
    bad: list[tuple[int | str, str]] = field(default_factory=list)

    def parse(self, value: object, at: int | str) -> list[str]:
        """The references of the row or line ``at`` (its number, or a place named as text): a list of strings as it
        is; a string that is a list literal (JSON or Python) parsed; any other string as one reference; each read as
        finecap's own references are (:func:`~finecap.data.records.clean_captions`: stripped, line breaks made
        spaces). ``DataError`` for other values, an empty list, an empty reference (a data set without answers:
        LLaMA-Factory's ``label`` is then ``""``) or one holding a control character."""
        where = self._where(at)
        if isinstance(value, list):
            refs = value
        elif isinstance(value, str):
            text = value.strip()
            refs = [value]
            if text.startswith("[") and text.endswith("]") or text.startswith("['") or text.startswith('["'):
                parsed = _literal(text)
                if parsed is None:
                    self.bad.append((at, value))
                else:
                    refs = parsed
        else:
            raise DataError(f"{where} must be text, got {short_repr(value)}")
        if not refs or not all(isinstance(r, str) for r in refs):
            raise DataError(f"{where} must hold reference captions, got {short_repr(value)}")
        return clean_captions(refs, where)  # as finecap's references

    def _where(self, at: int | str) -> str:
        """The place of a value in messages: ``<file>: row 3: column 'answer'``, ``<file>, line 3: 'label'`` (as
        the JSON Lines readers name a line), ``<file>: logs[2]: 'target'``."""
        if isinstance(at, str):
            return f"{self.path}: {at}: {self.column!r}"
        if self.lines:
            return f"{self.path}, line {at}: {self.column!r}"
        return f"{self.path}: row {at}: column {self.column!r}"

    def warnings(self) -> list[str]:
        if not self.bad:
            return []
        numbered = [at for at, _ in self.bad[:MAX_LISTED] if not isinstance(at, str)]
        places = ", ".join(str(at) for at, _ in self.bad[:MAX_LISTED])
        if len(numbered) == len(self.bad[:MAX_LISTED]):
            places = f"{'lines' if self.lines else 'rows'} {places}"
        what = repr(self.column) if self.lines else f"column {self.column!r}"
        return [
            f"{self.path}: {what}: {len(self.bad)} value(s) look like a stringified list but do not parse as one "
            f"({places}: e.g. {short_repr(self.bad[0][1])}); each is scored as ONE reference caption, brackets and "
            "quotes included, which gives near-zero n-gram scores: fix the file (a truncated cell? quotes?) before "
            "trusting them"
        ]


def _literal(text: str) -> list[str] | None:
    for parse in (json.loads, ast.literal_eval):
        try:
            out = parse(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if isinstance(out, list) and all(isinstance(x, str) for x in out):
            return out
    return None


def first_of(value: object) -> object:
    """The first non-list element of nested lists (lmms-eval's ``filtered_resps``: ``["..."]`` or ``[["..."]]``)."""
    while isinstance(value, list) and value:
        value = value[0]
    return value


def flat_texts(values: Iterable[object]) -> list[str]:
    return [v for v in values if isinstance(v, str)]
