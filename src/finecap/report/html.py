"""The HTML report: results tables with the papers' headline comparisons, inlined plots and images, one file.

The page is rendered with Jinja2 from ``templates/report.html`` (shipped as package data). It is self-contained: plots
and images are inlined as ``data:`` URIs, the table sorting is a few lines of inline JavaScript, and nothing is fetched
from a server or the network, so the file opens from disk anywhere.

Tables (:func:`results_tables`) are generic: a results column ``prefix/name`` goes to the table ``prefix``
(``faith``, ``RD99``, ``bag3``, ``sample``, ...), other columns to the first table, and each table lists the stages
that have at least one of its columns. Headline comparisons (:data:`HEADLINES`) name stages and metric patterns;
those absent from the results are skipped silently.
"""

from __future__ import annotations

import base64
import fnmatch
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from finecap.utils import atomic_write_text

TEMPLATES = Path(__file__).parent / "templates"
"""Jinja2 templates of the report and of the bag-review page (:mod:`finecap.app.review`)."""
MAIN_TABLE = "caption"
"""Table of the results columns without a ``prefix/``."""


@dataclass(frozen=True)
class Headline:
    """A paper's headline comparison: ``stage`` against ``baseline`` on the columns matching ``metrics``
    (``fnmatch`` patterns such as ``RD*/R@1``); more is better except on ``lower_is_better`` patterns."""

    paper: str
    claim: str
    baseline: str
    stage: str
    metrics: tuple[str, ...]
    lower_is_better: tuple[str, ...] = ()


HEADLINES: tuple[Headline, ...] = (
    Headline("SMILE", "SMILE makes captions longer and more descriptive than MLE (Table 1)", "mle", "smile",
             ("Length", "Lexical diversity", "RD*/R@1", "faith/recall", "faith/precision", "CIDEr-D")),
    Headline("Sequence-level exploration", "exploration keeps sampled captions diverse at similar CIDEr-D (Table 4)",
             "scst", "sle", ("sample/Div-1", "sample/Div-2", "sample/mBLEU-4", "sample/CIDEr-D", "CIDEr-D"),
             lower_is_better=("*mBLEU-4",)),
    Headline("DiscriTune", "discriminative fine-tuning raises self-retrieval over MLE", "mle", "discritune",
             ("RD*/R@1", "bag*/R@1", "CIDEr-D")),
    Headline("No Detail Left Behind", "SR fine-tuning with BagCurri raises TrueMatch retrieval over MLE",
             "mle", "sr_bagcurri", ("bag*/R@1", "RD*/R@1", "faith/precision", "faith/recall")),
)  # fmt: skip


@dataclass
class Cell:
    text: str
    value: float | None = None
    role: str = ""  # "headline" (compared stage), "baseline", or ""


@dataclass
class Table:
    name: str
    columns: list[str]
    rows: list[tuple[str, list[Cell]]] = field(default_factory=list)


def fmt(value: Any) -> str:
    """Numbers as the Markdown table prints them (3 decimals for floats); None as ``-``."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _matches(column: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(column, p) for p in patterns)


def headline_cells(rows: Mapping[str, Mapping[str, Any]]) -> dict[tuple[str, str], str]:
    """``{(stage, column): role}`` of the cells of every applicable headline comparison."""
    roles: dict[tuple[str, str], str] = {}
    for h in HEADLINES:
        if h.stage not in rows or h.baseline not in rows:
            continue
        for column in rows[h.stage]:
            if _matches(column, h.metrics) and column in rows[h.baseline]:
                roles[(h.stage, column)] = "headline"
                roles.setdefault((h.baseline, column), "baseline")
    return roles


def headline_comparisons(rows: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each applicable headline with ``[(column, baseline value, stage value, difference, better?)]``."""
    out = []
    for h in HEADLINES:
        if h.stage not in rows or h.baseline not in rows:
            continue
        items = []
        for column, value in rows[h.stage].items():
            base = rows[h.baseline].get(column)
            if (
                not _matches(column, h.metrics)
                or not isinstance(value, int | float)
                or not isinstance(base, int | float)
            ):
                continue
            diff = float(value) - float(base)
            if abs(diff) < 5e-4:  # equal at the 3 decimals shown: neither better nor worse
                items.append({"column": column, "baseline": fmt(base), "value": fmt(value), "diff": "±0.000",
                              "better": None})  # fmt: skip
                continue
            better = diff < 0 if _matches(column, h.lower_is_better) else diff > 0
            items.append({"column": column, "baseline": fmt(base), "value": fmt(value), "diff": f"{diff:+.3f}",
                          "better": better})  # fmt: skip
        if items:
            out.append({"paper": h.paper, "claim": h.claim, "stage": h.stage, "baseline": h.baseline, "items": items})
    return out


def results_tables(rows: Mapping[str, Mapping[str, Any]]) -> list[Table]:
    """One table per column prefix (module docstring), columns in first-seen order, headline cells marked."""
    groups: dict[str, list[str]] = {MAIN_TABLE: []}
    for values in rows.values():
        for column in values:
            name = column.split("/", 1)[0] if "/" in column else MAIN_TABLE
            if column not in groups.setdefault(name, []):
                groups[name].append(column)
    roles = headline_cells(rows)
    tables = []
    for name, columns in groups.items():
        if not columns:
            continue
        table = Table(name, columns)
        for stage, values in rows.items():
            if not any(c in values for c in columns):
                continue
            cells = []
            for c in columns:
                v = values.get(c)
                number = float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
                cells.append(Cell(fmt(v), number, roles.get((stage, c), "")))
            table.rows.append((stage, cells))
        tables.append(table)
    return tables


def data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def png_uri(path: str | Path) -> str:
    """A PNG file as a ``data:`` URI."""
    return data_uri(Path(path).read_bytes(), "image/png")


def image_uri(path: str | Path, max_side: int = 224) -> str:
    """An image file as a ``data:`` URI: PNG, scaled down to at most ``max_side`` pixels (never up), so a report
    over large photographs stays small."""
    from PIL import Image

    with Image.open(path) as image:
        image = image.convert("RGB")
        image.thumbnail((max_side, max_side))
        buf = io.BytesIO()
        image.save(buf, format="PNG", optimize=True)
    return data_uri(buf.getvalue(), "image/png")


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined
    )
    env.filters["fmt"] = fmt
    return env


def render_report(context: Mapping[str, Any], out: str | Path) -> Path:
    """Render ``templates/report.html`` with ``context`` to ``out`` (atomically)."""
    html = environment().get_template("report.html").render(**context)
    atomic_write_text(out, html)
    return Path(out)
