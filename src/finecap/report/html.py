"""The HTML report: results tables with the papers' headline comparisons, inlined plots and images, one file.

The page is rendered with Jinja2 from ``templates/report.html`` (shipped as package data). It is self-contained: plots
and images are inlined as ``data:`` URIs, the table sorting is a few lines of inline JavaScript, and nothing is fetched
from a server or the network, so the file opens from disk anywhere.

Tables (:func:`results_tables`) are generic: a results column ``prefix/name`` goes to the table ``prefix``
(``faith``, ``RD99``, ``bag3``, ``sample``, ...), other columns to the first table, and each table lists the stages
that have at least one of its columns. Headline comparisons (:data:`HEADLINES`) name stages and metric patterns;
those absent from the results are skipped silently.

Colours follow each column's direction (:mod:`finecap.report.columns`, the one place that defines it): a headline
difference is green when the method is better than its baseline and red when worse (so a fall in hallucination rate
is green); in the results tables the best stage of a column is green and the worst red, reference rows (the human
captions) left out of that ranking; a column without a direction (caption length) is not coloured. Numbers print
with :func:`~finecap.report.columns.format_value` (counts as integers).
"""

from __future__ import annotations

import base64
import fnmatch
import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

import jinja2
import markupsafe

from finecap.outputs import digest, write_output
from finecap.report.columns import ColumnRules, better, direction, finite_number, format_difference, format_value
from finecap.utils.text import bidi_isolated

if TYPE_CHECKING:
    from finecap.data.images import ImageLimits

TEMPLATES = Path(__file__).parent / "templates"
"""Jinja2 templates of the report and of the bag-review page (:mod:`finecap.app.review`)."""
MAIN_TABLE = "caption"
"""Table of the results columns without a ``prefix/``."""


REFERENCE_ROWS = ("human",)
"""Rows that are references, not methods: shown, but not ranked best / worst."""


@dataclass(frozen=True)
class Headline:
    """A paper's headline comparison: ``stage`` against ``baseline`` on the columns matching ``metrics``
    (``fnmatch`` patterns such as ``RD*/R@1``); which is better follows each column's direction."""

    paper: str
    claim: str
    baseline: str
    stage: str
    metrics: tuple[str, ...]


HEADLINES: tuple[Headline, ...] = (
    Headline("SMILE", "SMILE makes captions longer and more descriptive than MLE (Table 1)", "mle", "smile",
             ("Length", "Lexical diversity", "hardRD*/R@1", "RD*/R@1", "faith/recall", "faith/precision", "CIDEr-D")),
    Headline("Sequence-level exploration", "exploration keeps sampled captions diverse at similar CIDEr-D (Table 4)",
             "scst", "sle", ("sample/Div-1", "sample/Div-2", "sample/mBLEU-4", "sample/CIDEr-D", "CIDEr-D")),
    Headline("DiscriTune", "discriminative fine-tuning raises self-retrieval over MLE", "mle", "discritune",
             ("hardRD*/R@1", "family/R@1", "RD*/R@1", "bag*/R@1", "CIDEr-D")),
    Headline("No Detail Left Behind", "SR fine-tuning with BagCurri raises TrueMatch retrieval over MLE",
             "mle", "sr_bagcurri", ("bag*/R@1", "hardRD*/R@1", "RD*/R@1", "faith/precision", "faith/recall")),
)  # fmt: skip


@dataclass
class Cell:
    text: str
    value: float | None = None
    role: str = ""  # "headline" (compared stage), "baseline", or ""
    rank: str = ""  # "best" or "worst" of its column by the column's direction, or ""


@dataclass
class Table:
    name: str
    columns: list[str]
    rows: list[tuple[str, list[Cell]]] = field(default_factory=list)
    rules: ColumnRules | None = None  # what each column means (default: the built-in metrics')

    @property
    def directions(self) -> list[str | None]:
        """Each column's better direction (``"higher"``, ``"lower"``, None)."""
        return [direction(c, self.rules) for c in self.columns]


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


def headline_comparisons(
    rows: Mapping[str, Mapping[str, Any]], rules: ColumnRules | None = None
) -> list[dict[str, Any]]:
    """Each applicable headline with ``[(column, baseline value, stage value, difference, better?)]``, by the
    columns' ``rules``."""
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
            items.append({"column": column, "baseline": format_value(base, column, rules),
                          "value": format_value(value, column, rules),
                          "diff": format_difference(value, base, column, rules),
                          "better": better(value, base, column, rules),
                          "direction": direction(column, rules)})  # fmt: skip
        if items:
            out.append({"paper": h.paper, "claim": h.claim, "stage": h.stage, "baseline": h.baseline, "items": items})
    return out


def _rank(table: Table, reference_rows: Sequence[str]) -> None:
    """Mark the best and worst cell of each column with a direction, among the rows that are not references and
    whose value is a finite number (ties at the precision shown share the mark; nothing is marked when all are
    equal): a NaN or infinite value (a diverged stage) is never marked best or worst."""
    for j, column in enumerate(table.columns):
        side = direction(column, table.rules)
        cells = [cells[j] for stage, cells in table.rows if stage not in reference_rows and cells[j].value is not None]
        if side is None or len({c.text for c in cells}) < 2:
            continue
        values = [c.value for c in cells]
        best, worst = (max(values), min(values)) if side == "higher" else (min(values), max(values))
        for cell in cells:
            if cell.text == format_value(best, column, table.rules):
                cell.rank = "best"
            elif cell.text == format_value(worst, column, table.rules):
                cell.rank = "worst"


def results_tables(
    rows: Mapping[str, Mapping[str, Any]], reference_rows: Sequence[str] = REFERENCE_ROWS,
    rules: ColumnRules | None = None,
) -> list[Table]:  # fmt: skip
    """One table per column prefix (module docstring), columns in first-seen order, headline cells marked, the best
    and worst cell of each column with a direction (by ``rules``) marked (``reference_rows`` are not ranked)."""
    groups: dict[str, list[str]] = {MAIN_TABLE: []}
    for values in rows.values():
        for column in values:
            name = column.split("/", 1)[0] if "/" in column else MAIN_TABLE
            if column not in groups.setdefault(name, []):
                groups[name].append(column)
    roles = headline_cells(rows)
    return [_table(name, columns, rows, roles, reference_rows, rules) for name, columns in groups.items() if columns]


def single_table(
    name: str, rows: Mapping[str, Mapping[str, Any]], reference_rows: Sequence[str] = (),
    rules: ColumnRules | None = None,
) -> Table:  # fmt: skip
    """All of ``rows``' columns in one table (first-seen order), ranked like :func:`results_tables`' (no headline
    cells): for result files whose columns belong together, such as the VCB tables."""
    columns: list[str] = []
    for values in rows.values():
        columns += [c for c in values if c not in columns]
    return _table(name, columns, rows, {}, reference_rows, rules)


def _table(
    name: str, columns: list[str], rows: Mapping[str, Mapping[str, Any]], roles: Mapping[tuple[str, str], str],
    reference_rows: Sequence[str], rules: ColumnRules | None,
) -> Table:  # fmt: skip
    """The rows that have at least one of ``columns``, formatted and ranked."""
    table = Table(name, columns, rules=rules)
    for stage, values in rows.items():
        if not any(c in values for c in columns):
            continue
        cells = []
        for c in columns:
            v = values.get(c)
            number = float(v) if finite_number(v) else None  # NaN / inf: shown, never ranked nor sorted as a number
            cells.append(Cell(format_value(v, c, rules), number, roles.get((stage, c), "")))
        table.rows.append((stage, cells))
    _rank(table, reference_rows)
    return table


def data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def png_uri(path: str | Path) -> str:
    """An image file (a plot) as a PNG ``data:`` URI: decoded and re-encoded
    (:func:`finecap.data.images.load_image`), never the file's bytes, as every image the report embeds."""
    from finecap.data.images import encode_image, load_image

    return data_uri(*encode_image(load_image(path)))


def image_uri(path: str | Path, max_side: int = 224, limits: ImageLimits | None = None) -> str:
    """An image file as a ``data:`` URI: decoded by finecap's one rule (:func:`finecap.data.images.load_image`:
    a real image within the decompression-bomb limit and the image budget ``limits``, the run's
    ``data.max_image_pixels`` / ``data.max_aspect_ratio``, default theirs; EXIF orientation applied; a one-line error
    naming the file otherwise), scaled down to at most ``max_side`` pixels (never up), so a report over large
    photographs stays small, and re-encoded as PNG."""
    from finecap.data.images import DEFAULT_LIMITS, load_image

    image = load_image(path, limits=limits or DEFAULT_LIMITS)
    image.thumbnail((max_side, max_side))
    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=True)
    return data_uri(buf.getvalue(), "image/png")


def printed(value: Any) -> Any:
    """What a template prints for ``value`` (Jinja's ``finalize``, before escaping): a string or path isolated from
    the page's text around it (:func:`finecap.utils.text.bidi_isolated`: a caption, id or file name's right-to-left
    override reverses nothing of the page's), markup the template made (a macro's) as it is. The report's templates
    and the review page's (:mod:`finecap.app.review`) print through it.

    >>> printed(Path("bags\u202e.json")) == "\u2068bags\u202e.json\u202c\u2069", printed(markupsafe.Markup("<b>"))
    (True, Markup('<b>'))
    """
    if isinstance(value, PurePath):  # a path is printed as its str(): the review page's --out and bags file
        value = str(value)
    return bidi_isolated(value) if isinstance(value, str) and not isinstance(value, markupsafe.Markup) else value


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        finalize=printed,
    )
    env.filters["fmt"] = format_value
    return env


def render_report(context: Mapping[str, Any], out: str | Path) -> Path:
    """Render ``templates/report.html`` with ``context`` to ``out`` (atomically, never through a link), stamped
    (:func:`stamped`)."""
    html = environment().get_template("report.html").render(**context)
    write_output(out, stamped(html), "report")
    return Path(out)


_STAMP = "<!-- finecap report; SHA-256 of the page above this line: {} -->\n"
_STAMP_AT_END = re.compile(rb"<!-- finecap report; SHA-256 of the page above this line: ([0-9a-f]{64}) -->\n\Z")
MAX_STAMPED = 1 << 30
"""The largest page :func:`unedited_report` reads (bytes): a report inlines its plots and images, tens of MB."""


def stamped(html: str) -> str:
    """``html`` with a last line holding the SHA-256 of what comes before it: the page says itself whether it was
    edited since finecap wrote it (:func:`unedited_report`), whatever finecap home wrote it (the record of what
    finecap wrote, :func:`finecap.outputs.made_by_finecap`, lives in one home: a run copied from another machine, or
    a home emptied since, would otherwise need ``--force`` for its own report)."""
    text = html if html.endswith("\n") else html + "\n"
    return text + _STAMP.format(digest(text.encode("utf-8")))


def unedited_report(path: Path) -> bool:
    """Whether ``path`` is a page :func:`stamped` wrote and nobody changed since: its last line's SHA-256 is that of
    the rest (a page edited by hand, or no finecap report, is not)."""
    try:
        if path.stat().st_size > MAX_STAMPED:
            return False
        data = path.read_bytes()
    except OSError:
        return False
    stamp = _STAMP_AT_END.search(data)
    return stamp is not None and digest(data[: stamp.start()]).encode() == stamp[1]
