"""Results tables: ``{row: {metric: value}}`` mappings rendered as Markdown and saved as JSON.

Numbers print with :func:`finecap.report.columns.format_value`: 3 decimals, counts (``bag3/n``, ``Vocab usage``) as
integers.

Example::

    >>> print(markdown_table({"mle": {"length": 7.25, "R@1": 0.5}}, columns=["length", "R@1"]))
    | stage | length | R@1 |
    | --- | --- | --- |
    | mle | 7.250 | 0.500 |
    >>> print(markdown_table({"Vocab usage": {"value": 54.0}, "CIDEr-D": {"value": 1.0}}, row_header="metric"))
    | metric | value |
    | --- | --- |
    | Vocab usage | 54 |
    | CIDEr-D | 1.000 |
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from finecap.report.columns import ColumnRules, column_info, format_value

QUICK_TITLE = (
    "QUICK RUN (finecap demo --quick): a tiny world and a few training steps per stage, to check that the pipeline "
    "runs. These numbers are not results."
)
"""The title above every table of a quick run's numbers (stdout, ``results.md``; the report shows a banner)."""


def quick_labelled(table: str, quick: bool) -> str:
    """``table`` under :data:`QUICK_TITLE` when its numbers come from a quick run (``quick``), else as it is."""
    return f"{QUICK_TITLE}\n\n{table}" if quick else table


def markdown_table(
    rows: Mapping[str, Mapping[str, object]],
    columns: Sequence[str] | None = None,
    row_header: str = "stage",
    rules: ColumnRules | None = None,
) -> str:
    """A Markdown table with one row per key of ``rows``; missing cells print as ``-``, numbers by ``rules``
    (:mod:`finecap.report.columns`)."""
    if columns is None:
        columns = []
        for values in rows.values():
            columns += [c for c in values if c not in columns]
    lines = ["| " + " | ".join(map(table_cell, [row_header, *columns])) + " |",
             "| " + " | ".join(["---"] * (len(columns) + 1)) + " |"]  # fmt: skip
    for name, values in rows.items():
        # A cell is formatted as its column's metric, or as its row's when the rows are the metrics (finecap eval).
        cells = [format_value(values.get(c), c if column_info(c, rules) is not None else name, rules) for c in columns]
        lines.append("| " + " | ".join(map(table_cell, [name, *cells])) + " |")
    return "\n".join(lines)


def table_cell(text: object) -> str:
    """``text`` as one Markdown table cell: a ``|`` (a stage, metric or reward named with one) escaped as ``\\|`` and
    a line break as a space, which would otherwise end the cell or the row and shift every column after it.

    >>> table_cell("a|b\\nc")
    'a\\\\|b c'
    """
    return " ".join(str(text).replace("|", "\\|").splitlines())
