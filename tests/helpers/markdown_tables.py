"""Markdown tables of the docs and of the benchmarks' printed output, read as cells, for the tests that tie a page's
numbers to the committed results they quote."""

from __future__ import annotations

import itertools


def markdown_table(text: str, heading: str) -> list[list[str]]:
    """The first Markdown table after ``heading`` in ``text``: its header, then its rows, each a list of stripped
    cells (the ``| --- |`` line left out)."""
    lines = text[text.index(heading) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = list(itertools.takewhile(lambda line: line.startswith("|"), lines[start:]))
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in table if not line.startswith("| ---")]


def markdown_rows(text: str, heading: str) -> list[dict[str, str]]:
    """The rows of the first Markdown table after ``heading`` in ``text``, each as ``{column: cell}``."""
    header, *rows = markdown_table(text, heading)
    return [dict(zip(header, row, strict=True)) for row in rows]


def ascii_minus(text: str) -> str:
    """``text`` with the pages' typographic minus (U+2212) as the ``-`` the scripts print."""
    return text.replace("\u2212", "-")


def table_lines(text: str, heading: str) -> list[str]:
    """The data rows of the first Markdown table after ``heading`` in ``text``, as lines (header and ``| --- |`` left
    out): what a benchmark prints below its own header, for a page whose table is a script's output."""
    lines = text[text.index(heading) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    return list(itertools.takewhile(lambda line: line.startswith("|"), lines[start:]))[2:]
