"""Results tables: ``{row: {metric: value}}`` mappings rendered as Markdown and saved as JSON.

Example::

    >>> print(markdown_table({"mle": {"length": 7.25, "R@1": 0.5}}, columns=["length", "R@1"]))
    | stage | length | R@1 |
    | --- | --- | --- |
    | mle | 7.250 | 0.500 |
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def _fmt(value: object) -> str:
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def markdown_table(
    rows: Mapping[str, Mapping[str, object]], columns: Sequence[str] | None = None, row_header: str = "stage"
) -> str:
    """A Markdown table with one row per key of ``rows``; missing cells print as ``-``."""
    if columns is None:
        columns = []
        for values in rows.values():
            columns += [c for c in values if c not in columns]
    lines = ["| " + " | ".join([row_header, *columns]) + " |", "| " + " | ".join(["---"] * (len(columns) + 1)) + " |"]
    for name, values in rows.items():
        lines.append("| " + " | ".join([name, *(_fmt(values.get(c)) for c in columns)]) + " |")
    return "\n".join(lines)
