"""Plots of training runs and results, written as PNG files (the HTML report inlines them).

Every function draws from plain data (``metrics.jsonl`` events, ``{stage: {metric: value}}`` rows, ``{stage:
{image_id: caption}}``), never from a fixed list of stages or metrics, and returns None when it has nothing to draw.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import io
import json
import logging
import math
import re
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

from finecap.judges.base import TALLIES
from finecap.metrics.diversity import caption_length
from finecap.outputs import check_replaceable, digest, made_by_finecap, write_output
from finecap.report.columns import finite_number
from finecap.report.html import unedited_report
from finecap.runs import METRICS_FILE, decode_event
from finecap.utils.reading import DATA_FILE, read_lines
from finecap.utils.text import bidi_isolated, short_repr

log = logging.getLogger(__name__)

BAG_RECALL = re.compile(r"^bag(\d+)/R@1$")
"""Result keys of TrueMatch R@1 per bag size (``bag3/R@1``), as :func:`finecap.metrics.retrieval.bag_retrieval`
names them."""

REWARD_TOTAL = ("reward", "reward_greedy")
"""Train keys of the total reward (:class:`finecap.objectives.reinforce.Reinforce`'s metrics): the sampled captions'
mean and the greedy captions' (SCST); one axis. (``baseline`` is not drawn: 0 under group advantages, it would only
stretch the axis.)"""
RL_GROUPS = {
    "kl": ("KL to the reference", ("kl",)),
    "clip_fraction": (
        "clip fraction (either side, low, high)",
        ("clip_fraction", "clip_ratio/low_mean", "clip_ratio/high_mean"),
    ),
    "ratio": ("importance ratio range (min, mean, max)", ("ratio/min", "ratio/mean", "ratio/max")),
    "advantage": ("advantage spread (std, min, max)", ("advantage_std", "advantage/min", "advantage/max")),
}
"""The RL diagnostics drawn together because they share units (:class:`finecap.objectives.grpo.PolicyOptimization`'s
metrics): ``{panel: (title, keys)}``; a panel draws those of its keys a run logged (``clip_ratio/low_mean`` and
``high_mean``, the two sides of ``clip_fraction``, from 2026-11-29 on: an older run's panel holds ``clip_fraction``
alone)."""


_Draw = TypeVar("_Draw", bound=Callable[..., Any])


def _plain_text(draw: _Draw) -> _Draw:
    """``draw`` with matplotlib's mathtext off while it runs: the labels a plot writes (stage names, metric names,
    reward parts: the user's text) are drawn as they are, never parsed as TeX between two ``$`` (a stage ``$x^$``
    was a ``ValueError`` that stopped the report; ``$5 and $6`` printed in italics without its dollars). Scoped
    (``matplotlib.rc_context``), so a program that imports finecap keeps its own setting."""

    @functools.wraps(draw)
    def plain(*args: Any, **kwargs: Any) -> Any:
        import matplotlib

        with matplotlib.rc_context({"text.parse_math": False}):
            return draw(*args, **kwargs)

    return plain  # type: ignore[return-value]


def legend_label(name: str) -> str:
    """``name`` as a line's legend label: matplotlib leaves out of the legend every label that begins with ``_``, so a
    stage, metric or reward part named ``_ablation`` would vanish from it silently; such a name gets a zero-width space
    in front (invisible), any other is as it is.

    >>> legend_label("_ablation"), legend_label("mle")
    ('\u200b_ablation', 'mle')
    """
    return "\u200b" + name if name.startswith("_") else name


_PLAIN_NAME = re.compile(r"[a-z0-9]+(?:[-_/][a-z0-9]+)*")
"""A name :func:`plot_file_name` writes as it is (each ``/`` as ``.``): lowercase ASCII letters and digits, single
``-``, ``_`` or ``/`` between them."""
_KIND = re.compile(r"[a-z]+")
PLAIN_NAME_CHARS = 100
"""The longest plot file name (before ``.png``) :func:`plot_file_name` writes without a digest; a longer one (a stage
folder of 250 characters: ``curves_`` and its name are over the 255 bytes a file name holds) is cut and given one."""


def plot_file_name(kind: str, name: str, *more: str) -> str:
    """The file name of a report's plot of ``kind`` (a word of finecap's, lowercase letters: ``curves``, ``rl``) for
    ``name`` and ``more`` (the user's text: a stage, an RL panel): ``<kind>_<name>[__<more>...].png``. Two different
    ``(kind, name, *more)`` never get one file name, nor two that differ only in case (a case-insensitive file system:
    macOS, Windows), so no plot file is written over another and the page never shows one image for two plots.

    A name of lowercase ASCII letters and digits with single ``-``, ``_`` or ``/`` between them is written as it is,
    each ``/`` as ``.`` (``reward/cider``: ``reward.cider``). Any other name (``MLE``, ``reward/Cider``,
    ``reward/cïder``, ``a.b``, ``a--b``, ``pkg.mod:Reward``) makes the file name a readable form (lowercase, any other
    character as ``-``, cut at 80 characters) followed by ``--`` and 12 hex digits of the SHA-256 of ``(kind,
    names)`` (and so does a file name over :data:`PLAIN_NAME_CHARS`). A name written as it is holds no ``.``, ``--``
    nor ``__``, so a file name without ``--`` reads back as one ``(kind, *names)``: the names are what lies between
    its ``__``; one with ``--`` is told apart by its digest (two such alike: 48 bits of SHA-256 alike, and a report
    drawing a second plot at one name stops: :func:`drafts`). ``ValueError`` for a ``kind`` of other characters.

    >>> plot_file_name("curves", "smile_random"), plot_file_name("rl", "grpo_sr_cider", "reward/cider")
    ('curves_smile_random.png', 'rl_grpo_sr_cider__reward.cider.png')
    >>> plot_file_name("rl", "grpo", "reward/a-b"), plot_file_name("rl", "grpo", "reward/a/b")
    ('rl_grpo__reward.a-b.png', 'rl_grpo__reward.a.b.png')
    >>> plot_file_name("rl", "grpo", "reward/Cider")
    'rl_grpo__reward.cider--a56a5ffca32c.png'
    """
    if not _KIND.fullmatch(kind):
        raise ValueError(f"a plot's kind is lowercase letters, got {kind!r}")
    names = (name, *more)
    if all(_PLAIN_NAME.fullmatch(n) for n in names):
        plain = kind + "_" + "__".join(n.replace("/", ".") for n in names)
        if len(plain) <= PLAIN_NAME_CHARS:
            return plain + ".png"
    readable = "__".join(re.sub(r"[^a-z0-9._-]+", "-", n.lower().replace("/", ".")) for n in names)
    # json.dumps: names as they are (any character, a lone surrogate of a folder name too), never two lists alike
    return f"{(kind + '_' + readable)[:80].rstrip('-')}--{digest(json.dumps([kind, *names]).encode())[:12]}.png"


def validation_series(run_dir: str | Path, key: str) -> list[tuple[int, float]]:
    """``(step, value)`` of ``key`` at every validation event of ``<run_dir>/metrics.jsonl`` that logged it as a number
    (a ``null`` is none)."""
    points = []
    for event in read_events(Path(run_dir) / METRICS_FILE):
        value = (event.get("values") or {}).get(key)
        if event.get("split") == "val" and event.get("step") is not None and isinstance(value, int | float):
            points.append((int(event["step"]), float(value)))
    return points


@_plain_text
def length_curves(runs: Mapping[str, str | Path], out: str | Path, *, start: str | Path | None = None,
                  key: str = "length") -> Path:  # fmt: skip
    """Mean validation caption length over training steps, one line per run (SMILE Fig. 4a).

    ``start``: the run the others continue from; its last validation value (if it logged ``key``) is drawn at step 0.
    """
    plt = _pyplot()
    origin = validation_series(start, key)[-1:] if start is not None else []
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for label, run_dir in runs.items():
        points = validation_series(run_dir, key)
        if origin:
            points = [(0, origin[0][1]), *points]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=legend_label(label))
    ax.set_xlabel("training step")
    ax.set_ylabel("mean caption length (words, validation)")
    ax.legend()
    return _save(fig, out)


def _pyplot() -> Any:
    # Deferred: pyplot takes seconds to import (measured 3 s here), and choosing the file-only Agg backend is a
    # process-wide setting that must precede it; both happen only when a plot is drawn.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, out: str | Path) -> Path:
    """Lay ``fig`` out (``tight_layout``), draw it once into PNG bytes, close it, and write them to ``out`` (a plot
    of finecap's, never a file of the user's; in the folder of :func:`drafts`, a draft). ``tight_layout`` leaves a
    placeholder layout engine on the figure, for which ``savefig`` would draw the whole figure once more and throw
    that draw away before the one it keeps; the engine is taken off first, so the figure is drawn once, as
    ``tight_layout`` placed it: the same pixels."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.set_layout_engine(None)  # none under the default rc; a placeholder would cost a second, discarded draw
    out = Path(out)
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=100, format=out.suffix.lstrip(".") or "png")
    plt.close(fig)
    if out.parent == _DRAFTS.get():  # a draft (see drafts): the caller writes and records the plots it keeps, once
        with out.open("xb") as f:  # a second plot at one name is an error, never one plot in place of another
            f.write(buffer.getvalue())
        return out
    # never through a link, nor over a file of the user's: one finecap wrote (remembered, or an earlier report's
    # plot its page shows: plot_replaceable) is replaced
    check_replaceable(out, force=False, option="out", kind="plot", ours=_earlier_report_plot, force_flag=None)
    write_output(out, buffer.getvalue(), "plot")
    return out


_DRAFTS: ContextVar[Path | None] = ContextVar("finecap_plot_drafts", default=None)
"""The folder of :func:`drafts` open now, if any."""


@contextlib.contextmanager
def drafts() -> Iterator[Path]:
    """A new folder of the system's temporary folder (``finecap-plots-*``, mode 0700, removed on leaving) to draw
    plots into before they are checked and written where they go: the report's
    (:func:`finecap.report.plot_files.write_plots` writes each it keeps atomically, durably, and records it as
    finecap's, once). While it is open, a plot drawn into it (its file directly in the folder) is a draft, written
    plainly: not synced to the disk (it lives as long as the folder), not recorded as finecap's (finecap records what
    it leaves, not its drafts: a report with ``--out`` alone leaves no plot file), and not checked for a file of the
    user's (the folder is new, and only this user's). A second plot drawn at a draft's name is a ``FileExistsError``
    (the report stops), never a plot in place of another (:func:`plot_file_name`). A plot drawn anywhere else is
    written as always."""
    with tempfile.TemporaryDirectory(prefix="finecap-plots-") as scratch:
        token = _DRAFTS.set(Path(scratch))
        try:
            yield Path(scratch)
        finally:
            _DRAFTS.reset(token)


def plot_replaceable(path: str | Path) -> bool:
    """Whether the existing regular file ``path`` is a plot finecap may draw again: one it wrote as a plot
    (:func:`finecap.outputs.made_by_finecap`), or a plot of a report finecap wrote before it remembered its plots (or
    in another finecap home: a run folder copied from another machine), known by :func:`_earlier_report_plot`. A
    figure of the user's by a plot's name, even one matplotlib drew, is neither: it is never replaced without
    ``--force``."""
    return made_by_finecap(path, ("plot",)) or _earlier_report_plot(Path(path))


REPORT_PAGE = "report.html"
"""The report page of a run folder, which shows the plots of ``<run folder>/plots/``."""
_PNG_URI = re.compile(rb"data:image/png;base64,([A-Za-z0-9+/]+=*)")


def _earlier_report_plot(path: Path) -> bool:
    """Whether ``path`` is a PNG that matplotlib wrote (:func:`_is_matplotlib_png`) which finecap's own report page
    shows: the ``report.html`` of its folder, or of the folder above it (a run folder's page shows the plots of its
    ``plots/``), a page finecap wrote and nobody edited since (:func:`finecap.report.html.unedited_report`, or
    remembered as a report: :func:`~finecap.outputs.made_by_finecap`), with an image of the same pixels inlined."""
    if not _is_matplotlib_png(path):
        return False
    pages = [folder / REPORT_PAGE for folder in (path.parent, path.parent.parent)]
    return any(page.is_file() and (unedited_report(page) or made_by_finecap(page, ("report",))) and _shows(page, path)
               for page in pages)  # fmt: skip


def _shows(page: Path, path: Path) -> bool:
    """Whether the page ``page`` inlines the image file ``path``: a PNG ``data:`` URI holding its bytes (as reports
    did first) or its pixels (:func:`finecap.report.html.png_uri`, re-encoded); only an image of the file's size is
    decoded."""
    from PIL import Image

    from finecap.data.images import load_image

    try:
        data, raw = page.read_bytes(), path.read_bytes()
        pixels = load_image(path)
    except (OSError, ValueError):
        return False
    for found in _PNG_URI.finditer(data):
        inlined = base64.b64decode(found[1])
        if inlined == raw:
            return True
        try:
            with Image.open(io.BytesIO(inlined)) as image:
                if image.size == pixels.size and image.convert("RGB").tobytes() == pixels.tobytes():
                    return True
        except (OSError, ValueError, Image.DecompressionBombError):
            continue
    return False


def _is_matplotlib_png(path: Path) -> bool:
    """Whether ``path`` is a PNG that matplotlib wrote (its ``Software: Matplotlib`` text chunk, near the start)."""
    with path.open("rb") as f:
        head = f.read(256)
    return head.startswith(b"\x89PNG\r\n\x1a\n") and b"Matplotlib" in head


def _grid(n: int, ncols: int = 4) -> tuple[int, int]:
    cols = min(n, ncols)
    return math.ceil(n / cols), cols


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """The events of a ``metrics.jsonl`` (``{"step", "split", "values", ...}`` per line; blank lines skipped), read
    line by line within :data:`~finecap.utils.reading.DATA_FILE` (:func:`~finecap.utils.reading.read_lines`).

    A last line without its line end that is not JSON (a run still writing it, or killed while it did) is not read,
    as resuming drops it; any other line that is not JSON, or not an event (a JSON object whose ``values``, when
    given, is an object), is a ``ValueError`` naming the file and the line. Values
    come back as logged, whether the run wrote them as strict JSON or, before it did, with Python's ``NaN`` /
    ``Infinity`` tokens (:func:`finecap.runs.decode_event`)."""
    path = Path(path)
    events = []
    for lineno, line in enumerate(read_lines(path, total=DATA_FILE), 1):
        if not line.strip():
            continue
        try:
            event = decode_event(json.loads(line))
        except json.JSONDecodeError as e:
            if not line.endswith("\n"):  # only the last line can lack its line end: cut short
                log.info("%s, line %d: cut short (a run still writing it, or killed): not read", path, lineno)
                break
            raise ValueError(f"{path}, line {lineno}: invalid JSON: {e.msg}") from None
        if not isinstance(event, dict) or not isinstance(event.get("values") or {}, dict):
            raise ValueError(f"{path}, line {lineno}: expected an event {{\"step\", \"split\", \"values\": {{...}}}}, "
                             f"got {short_repr(event)}")  # fmt: skip
        events.append(event)
    return events


def curve_panels(events: Sequence[Mapping[str, Any]], max_val: int = 6) -> dict[str, dict[str, list[tuple]]]:
    """``{panel title: {series: [(step, value), ...]}}`` of a run's events: every training loss on one panel, the
    total reward (:data:`REWARD_TOTAL`; each reward part has a panel of its own among :func:`rl_panels`) on another,
    and one panel per validation metric (the first ``max_val`` keys logged)."""
    panels: dict[str, dict[str, list[tuple[int, float]]]] = {}
    val_keys: list[str] = []
    for event in events:
        split, step = event.get("split"), event.get("step")
        for key, value in (event.get("values") or {}).items():
            if not isinstance(value, int | float) or isinstance(value, bool) or step is None:
                continue
            if split == "train" and key.split("/")[0] == "loss":
                title = "train loss"
            elif split == "train" and key in REWARD_TOTAL:
                title = "train reward"
            elif split == "val":
                if key not in val_keys:
                    val_keys.append(key)
                if val_keys.index(key) >= max_val:
                    continue
                title = f"val {key}"
            else:
                continue
            panels.setdefault(title, {}).setdefault(key, []).append((int(step), float(value)))
    return panels


@_plain_text
def training_curves(events: Sequence[Mapping[str, Any]], out: str | Path, title: str = "") -> Path | None:
    """Training loss, reward and validation metrics over steps (:func:`curve_panels`), one panel each."""
    panels = curve_panels(events)
    if not panels:
        return None
    plt = _pyplot()
    rows, cols = _grid(len(panels))
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False)
    for ax, (name, series) in zip(axes.flat, panels.items()):
        for key, points in series.items():
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 30 else None,
                    label=legend_label(key))  # fmt: skip
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        if len(series) > 1:
            ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, out)


def judge_panel(key: str) -> str | None:
    """The panel of a judge-backed reward's judge, ``reward/<part>/judge``, when ``key`` is one of its tallies
    ``reward/<part>/judge/<tally>`` (:data:`finecap.judges.base.TALLIES`: calls, cache hits, unparsable answers,
    failed calls, HTTP 429s; :meth:`finecap.rewards.base.RewardBase.tallies`); ``reward/judge/<tally>`` (a judged
    reward trained on its own, no ``rl.rewards`` mixture) -> ``reward/judge``; else None.

    >>> judge_panel("reward/qa_utility/judge/calls"), judge_panel("reward/qa_utility/judge_failed")
    ('reward/qa_utility/judge', None)
    """
    *panel, tally = key.split("/")
    if panel[:1] == ["reward"] and panel[-1:] == ["judge"] and len(panel) >= 2 and tally in TALLIES:
        return "/".join(panel)
    return None


def rl_panel(key: str) -> str | None:
    """The RL panel of a train key (:func:`rl_panels`), by what the key means, never by a substring: ``reward`` and
    ``reward_greedy`` -> ``"reward"``; a reward part ``reward/<part>`` -> itself, and so is each of
    a part's own measures ``reward/<part>/<measure>`` (the retriever's ``accuracy``, its ``candidates`` count, ...:
    each its own scale), but a judge's tallies ``reward/<part>/judge/<tally>`` -> one panel of that judge
    (:func:`judge_panel`: counts of one step, one scale); the :data:`RL_GROUPS` keys -> their group; a monitor
    series ``monitor/<name>`` -> itself; anything else (``time/reward``, ``lr``, ``loss``) -> None."""
    if key in REWARD_TOTAL:
        return "reward"
    head, _, rest = key.partition("/")
    if head in ("reward", "monitor") and rest and all(rest.split("/")):
        return judge_panel(key) or key
    return next((group for group, (_, keys) in RL_GROUPS.items() if key in keys), None)


def is_rl(events: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a run's events are an RL run's: some train event logs the total ``reward`` (every objective of the
    REINFORCE family does: SCST, GRPO, exploration, self-retrieval)."""
    return any(e.get("split") == "train" and "reward" in (e.get("values") or {}) for e in events)


def rl_panels(events: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """``{panel: {series: [(step, value), ...]}}`` of an RL run's train events (:func:`rl_panel`), in this order:
    the total reward, each reward part (its measures after it), KL, clip fraction, ratio range, advantage spread,
    then every monitor series; a panel nothing was logged for is absent."""
    panels: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for event in events:
        step = event.get("step")
        if event.get("split") != "train" or step is None:
            continue
        for key, value in (event.get("values") or {}).items():
            if not isinstance(value, int | float) or isinstance(value, bool):
                continue
            panel = rl_panel(key)
            if panel is not None:
                panels.setdefault(panel, {}).setdefault(key, []).append((int(step), float(value)))
    order = ["reward", *sorted(k for k in panels if k.startswith("reward/")), *RL_GROUPS,
             *(k for k in panels if k.startswith("monitor/"))]  # fmt: skip
    return {k: panels[k] for k in order if k in panels}


def rl_title(panel: str) -> str:
    """The caption of an RL panel (:func:`rl_panels`); ``reward/failed`` is the share of captions no reward scored,
    not a reward part.

    >>> rl_title("reward"), rl_title("reward/cider"), rl_title("reward/failed")
    ('reward (total)', 'reward part: cider', 'share of captions unscored (reward/failed)')
    >>> rl_title("reward/qa_utility/judge")
    'judge of reward part qa_utility: per step'
    """
    if panel == "reward":
        return "reward (total)"
    if panel == "reward/failed":
        return "share of captions unscored (reward/failed)"
    if panel in RL_GROUPS:
        return RL_GROUPS[panel][0]
    head, _, rest = panel.partition("/")
    if head == "reward" and rest.endswith("/judge"):  # judge_panel's: its tallies, counts per step
        return f"judge of reward part {rest.removesuffix('/judge')}: per step"
    return f"reward part: {rest}" if head == "reward" and "/" not in rest else f"{head}: {rest}"


@_plain_text
def rl_curves(events: Sequence[Mapping[str, Any]], folder: str | Path, stage: str) -> list[tuple[str, Path]]:
    """Each of :func:`rl_panels` of the run ``stage`` drawn on its own axes, into ``folder`` as
    :func:`plot_file_name` ``("rl", stage, panel)`` (``rl_grpo__reward.cider.png``): ``[(panel, path)]``, empty when
    the run is not an RL run (:func:`is_rl`)."""
    if not is_rl(events):
        return []
    plt = _pyplot()
    out = []
    for panel, series in rl_panels(events).items():
        fig, ax = plt.subplots(figsize=(3.2, 2.4))
        for key, points in series.items():
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 30 else None,
                    label=legend_label(key))  # fmt: skip
        ax.set_title(rl_title(panel), fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        if len(series) > 1:
            ax.legend(fontsize=6)
        out.append((panel, _save(fig, Path(folder) / plot_file_name("rl", stage, panel))))
    return out


@_plain_text
def length_histograms(captions: Mapping[str, Mapping[Any, str]], out: str | Path) -> Path | None:
    """Histogram of caption length (words, :func:`~finecap.metrics.diversity.caption_length`) per stage, on shared
    bins of one word: the number of captions of each length."""
    lengths = {stage: [caption_length(c) for c in caps.values()] for stage, caps in captions.items() if caps}
    if not lengths:
        return None
    plt = _pyplot()
    top = max(max(v) for v in lengths.values())
    bins = [b - 0.5 for b in range(0, top + 2)]
    rows, cols = _grid(len(lengths))
    fig, axes = plt.subplots(rows, cols, figsize=(2.8 * cols, 2.0 * rows), squeeze=False, sharex=True)
    for ax, (stage, values) in zip(axes.flat, lengths.items()):
        ax.hist(values, bins=bins, color="#4477aa")
        ax.set_title(f"{stage} (mean {sum(values) / len(values):.2f})", fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(lengths) :]:
        ax.set_visible(False)
    fig.supxlabel("caption length (words)", fontsize=9)
    fig.supylabel("captions", fontsize=9)
    return _save(fig, out)


@_plain_text
def bag_recall_curves(rows: Mapping[str, Mapping[str, Any]], out: str | Path) -> Path | None:
    """TrueMatch R@1 against bag size (keys matching :data:`BAG_RECALL`), one line per stage that has them; a value
    that is no finite number (``null``: how a results file holds a NaN) is no point."""
    series = {}
    for stage, values in rows.items():
        points = sorted((int(m.group(1)), float(v)) for k, v in values.items()
                        if (m := BAG_RECALL.match(k)) and finite_number(v))  # fmt: skip
        if points:
            series[stage] = points
    if not series:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for stage, points in series.items():
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=legend_label(stage))
    ax.set_xticks(sorted({p[0] for points in series.values() for p in points}))
    ax.set_xlabel("bag size")
    ax.set_ylabel("R@1 within the bag")
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, out)


@_plain_text
def precision_recall(rows: Mapping[str, Mapping[str, Any]], out: str | Path, *, x: str = "faith/recall",
                     y: str = "faith/precision") -> Path | None:  # fmt: skip
    """Faithfulness precision against recall of true facts, one labelled point per stage that has both as finite
    numbers; :func:`precision_recall_note` names the stages left off."""
    points = {s: (float(v[x]), float(v[y])) for s, v in rows.items() if _has_point(v, x, y)}
    if not points:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for stage, (px, py) in points.items():
        ax.scatter([px], [py])
        ax.annotate(stage, (px, py), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("recall of true facts")
    ax.set_ylabel("precision of stated facts")
    return _save(fig, out)


def _has_point(values: Mapping[str, Any], x: str, y: str) -> bool:
    """Whether a stage's ``values`` give a point of :func:`precision_recall`: both ``x`` and ``y`` finite numbers."""
    return finite_number(values.get(x)) and finite_number(values.get(y))


def precision_recall_note(rows: Mapping[str, Mapping[str, Any]], *, x: str = "faith/recall",
                          y: str = "faith/precision") -> str | None:  # fmt: skip
    """The note naming each stage that has faithfulness values (``x`` or ``y``) but no point in
    :func:`precision_recall`, and why: a value that is NaN (``null`` in a results file: a precision of captions
    stating no fact is 0/0) or missing; None when every such stage is drawn. A stage with neither key was not scored
    for faithfulness: nothing is missing.

    Example::

        >>> precision_recall_note({"mle": {"faith/recall": 0.4, "faith/precision": 0.9},
        ...                        "rl": {"faith/recall": 0.1, "faith/precision": None}, "coco": {"BLEU-4": 0.3}})
        'No faithfulness point for rl (faith/precision is NaN).'
    """
    missing = []
    for stage, values in rows.items():
        if (x not in values and y not in values) or _has_point(values, x, y):
            continue
        why = [f"{k} is NaN" if k in values else f"no {k}" for k in (y, x) if not finite_number(values.get(k))]
        missing.append(f"{bidi_isolated(stage)} ({', '.join(why)})")
    return f"No faithfulness point for {', '.join(missing)}." if missing else None
