"""``finecap report RUN_DIR``: one self-contained ``report.html`` of a run directory: the demo's folder of stages
(its ``report`` stage writes ``runs/demo/report.html`` with it) or a single ``finecap train`` run (one stage named
after its folder; its results row is its last evaluation unless it holds a ``results.json``:
:mod:`finecap.report.run`).

It reads whatever the run holds (:mod:`finecap.report.run`), draws the plots (inlined in the page; also written as
reusable PNG files into ``<run_dir>/plots/`` when the page is the default ``<run_dir>/report.html``, into ``--plots
DIR`` when given, and nowhere with ``--out`` alone: :func:`plots_folder`; the plot files an earlier report wrote
there and this one does not draw are removed, :mod:`finecap.report.plot_files`), and renders
(:mod:`finecap.report.html`):

- the results tables, sortable, with each paper's headline comparison highlighted; then, when the run holds them,
  the ``vcb`` group's tables (``vcb_results.json``, NDLB Tables 2-3) and the ``transfer`` stage's
  (``transfer/results.json``, the shifted domain);
- for each RL stage (its log has the total ``reward``: SCST, GRPO, self-retrieval, exploration), an RL section
  (:func:`finecap.report.plots.rl_panels`), one plot per panel, each on its own scale: the total reward, each reward
  part (``reward/<part>``) and each of a part's own measures (``reward/<part>/<measure>``: the retriever's accuracy,
  its candidate count, ...), KL to the reference, clip fraction, the importance ratio's range, the advantages'
  spread and every reward-hacking monitor series (``monitor/*``); and a table of the captions each evaluation
  logged (``train.log_captions`` validation images), one column per evaluation;
- training curves per stage (loss, total reward, validation metrics of ``<stage>/metrics.jsonl``), caption-length
  histograms per stage, mean validation length over SMILE training (SMILE Fig. 4a; when ``smile`` and at least one
  of its subsetting ablations ran), TrueMatch R@1 against bag size, faithfulness precision against recall (a note
  names the stages without training curves, and those left off the faithfulness plot: a NaN or missing value);
- a caption gallery: a random sample of images and those where the stages disagree most
  (:mod:`finecap.report.gallery`), with the image, its human captions and every stage's caption, each stated fact
  coloured true / false on the world;
- a bag gallery: the most similar TrueMatch bags of each size (the first of each curated list), with each stage's
  captions and whether the retriever finds each caption's own image in the bag. The bags are the ones the results
  table's ``bag{s}/R@1`` columns score: the scene-family test world's when the run holds them (the demo's
  ``families10/bags_test.json``, with each stage's ``<stage>/captions_families10_test.json`` and the family world's
  images; the human row is each image's first reference, as in the table), else the run's own ``bags_test.json`` on
  its test split. The outcomes are computed here from the saved captions with the run's retriever (``retriever.*``
  of its ``config.yaml``), on the bag images only, and also saved as ``<run_dir>/bag_outcomes.json`` (``{"bags":
  <bags file>, "outcomes": {"<size>/<index>": {stage: [{"image", "caption", "retrieved", "rank"}, ...]}}}``).

Numbers and colours follow :mod:`finecap.report.columns` (counts as integers; green / red = better / worse by each
metric's direction). A run of ``finecap demo --quick`` (``demo.quick: true`` in its ``config.yaml``) is labelled a
quick run in the title and a banner above every number.

The data set, scene graphs and retriever come from the run's ``config.yaml`` (overrides as ``key=value`` after the
run directory, e.g. ``world.out=data/world``); a part whose inputs are missing is left out with a message.
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from finecap.config import Config, load, load_stored
from finecap.data.bags_file import read_bags
from finecap.data.images import ImageLimits
from finecap.data.records import Record
from finecap.data.references import data_file, load_references
from finecap.data.results import read_results
from finecap.metrics.faithfulness import SILENT_NOTE, mostly_silent
from finecap.metrics.families import family_tag
from finecap.outputs import (
    OutputRefused,
    check_not_input,
    check_output_file,
    check_writable,
    made_by_finecap,
    refuse_link,
    write_output_json,
)
from finecap.report.columns import ColumnRules, rules_for
from finecap.report.gallery import bag_outcomes, check_facts, select_images
from finecap.report.html import (
    REFERENCE_ROWS,
    headline_comparisons,
    image_uri,
    png_uri,
    render_report,
    results_tables,
    single_table,
    unedited_report,
)
from finecap.report.plot_files import PLOT_LIST, is_plot_list, write_plots
from finecap.report.plots import (
    bag_recall_curves,
    drafts,
    length_curves,
    length_histograms,
    plot_file_name,
    plot_replaceable,
    precision_recall,
    precision_recall_note,
    rl_curves,
    rl_panels,
    rl_title,
    training_curves,
)
from finecap.report.run import RunData, read_run
from finecap.runs import METRICS_FILE
from finecap.train.fingerprint import check_run_dir
from finecap.utils.reading import DATA_FILE, read_json
from finecap.utils.system import progress_enabled
from finecap.utils.text import bidi_isolated, short_repr

log = logging.getLogger(__name__)

SMILE_RUNS = (("sequence (SMILE)", "smile"), ("random", "smile_random"), ("reverse", "smile_reverse"))

PLOTS_DIR = "plots"
"""The run folder's folder of the default page's plot files (``<run_dir>/plots/``)."""
BAG_OUTCOMES = "bag_outcomes.json"
"""The bag gallery's outcomes, saved in the run folder (unless ``--no-bag-outcomes``)."""


def plots_folder(run_dir: Path, out: str | Path | None, plots: str | Path | None) -> Path | None:
    """Where the report writes its plots as PNG files: ``plots`` (``--plots DIR``) when given; else, for the default
    page (no ``out``), the run folder's ``plots/``; else (``--out`` alone: one HTML file, the plots inlined) nowhere.

    Example::

        >>> plots_folder(Path("runs/a"), None, None), plots_folder(Path("runs/a"), "a.html", None)
        (PosixPath('runs/a/plots'), None)
        >>> plots_folder(Path("runs/a"), "a.html", "figs")
        PosixPath('figs')
    """
    if plots is not None:
        return Path(plots)
    return run_dir / PLOTS_DIR if out is None else None


def check_plot_files(
    folder: Path, names: Sequence[str], *, given: bool, force: bool, advice: str | None = None
) -> None:
    """Refuse, before any plot is written, a plot file ``folder/<name>`` that may not be replaced: a symbolic link
    (always), anything but a regular file, or a file finecap did not draw (:func:`finecap.report.plots.
    plot_replaceable`) unless ``force``; and the same of the folder's list of its plots
    (:data:`finecap.report.plot_files.PLOT_LIST`, replaced when it reads as one:
    :func:`~finecap.report.plot_files.is_plot_list`). ``given``: the folder is ``--plots DIR`` (it may itself be a
    link the user made), else the run folder's ``plots/`` (a link there was planted: refused). ``advice``: what a
    refusal of a file finecap did not write says to do, in place of ``--force`` and the report's options
    (:func:`main`)."""
    if not given:
        refuse_link(folder)
    option = "--plots: " if given else ""
    ways_out = ("choose another --plots" if given else "give --out (one HTML file, no plot files) or --plots DIR (the "
                "plot files elsewhere)")  # fmt: skip
    replace = advice or f"move it away, pass --force to replace it, or {ways_out}"
    if folder.exists() and not folder.is_dir():
        raise OutputRefused(f"{option}{folder}: not a folder, but the report writes its plots there; {ways_out}")
    for name in names:
        target = folder / name
        refuse_link(target)
        if not target.exists():
            continue
        if not target.is_file():
            raise OutputRefused(f"{option}{target}: not a regular file, where the report writes a plot; move it away, "
                                f"or {ways_out}")  # fmt: skip
        if force or plot_replaceable(target):
            continue
        where = "in --plots" if given else f"in the run folder's {PLOTS_DIR}/, where the report writes its plots,"
        raise OutputRefused(f"{option}{target}: a file {where} that finecap did not draw (or that changed since); "
                            f"{replace}")  # fmt: skip
    listing = folder / PLOT_LIST
    refuse_link(listing)
    if listing.exists() and not listing.is_file():
        raise OutputRefused(f"{option}{listing}: not a regular file, where the report lists the plots it writes; "
                            f"move it away, or {ways_out}")  # fmt: skip
    if listing.exists() and not (force or is_plot_list(listing)):
        raise OutputRefused(f"{option}{listing}: a file finecap did not write, where the report lists the plots it "
                            f"writes; {replace}")  # fmt: skip


def check_bag_outcomes_file(run_dir: Path, *, force: bool, advice: str | None = None) -> Path:
    """``<run_dir>/bag_outcomes.json``, refused before any work when it may not be replaced: a link (always),
    anything but a regular file, or a file finecap did not write there (or changed since) unless ``force`` (the
    refusal says ``advice`` when given, as :func:`main`)."""
    target = run_dir / BAG_OUTCOMES
    refuse_link(target)
    where = "where the report saves its bag gallery's outcomes"
    replace = advice or "move it away, pass --force to replace it, or --no-bag-outcomes"
    if target.exists() and not target.is_file():
        raise OutputRefused(f"{target}: not a regular file, {where}; move it away, or pass --no-bag-outcomes")
    if target.exists() and not force and not made_by_finecap(target, ("bag-outcomes",)):
        raise OutputRefused(f"{target}: a file finecap did not write (or that changed since), {where}; "
                            f"{replace}")  # fmt: skip
    return target


def _plots(run: RunData, folder: Path) -> tuple[list[dict[str, str]], str | None]:
    """The plots drawn into ``folder`` (``{"title", "note", "uri"}`` each), and the note naming the stages without
    training curves (:func:`no_curves_note`) and those left off the faithfulness plot
    (:func:`~finecap.report.plots.precision_recall_note`)."""
    plots: list[dict[str, str]] = []

    def add(path: Path | None, title: str, note: str = "") -> None:
        if path is not None:
            plots.append({"title": title, "note": note, "uri": png_uri(path)})

    curves = []
    for stage, events in tqdm(
        run.events.items(), desc="report: training curves", unit="stage", disable=not progress_enabled()
    ):
        path = training_curves(events, folder / plot_file_name("curves", stage), title=stage)
        add(path, f"training curves: {stage}")
        curves += [stage] if path is not None else []
    add(length_histograms(run.captions, folder / "length_hist.png"), "caption length per stage")
    smile = {label: run.run_dir / s for label, s in SMILE_RUNS if s in run.events}
    if "sequence (SMILE)" in smile and len(smile) >= 2:
        start = run.run_dir / "mle" if "mle" in run.events else None
        add(length_curves(smile, folder / "smile_length.png", start=start),
            "mean validation caption length over SMILE training (SMILE Fig. 4a)",
            "step 0 is the MLE checkpoint the runs start from")  # fmt: skip
    add(bag_recall_curves(run.results, folder / "bag_recall.png"), "TrueMatch R@1 against bag size")
    add(precision_recall(run.results, folder / "faithfulness.png"), "faithfulness: precision against recall")
    notes = [no_curves_note(run, curves), precision_recall_note(run.results)]
    return plots, " ".join(n for n in notes if n) or None


def no_curves_note(run: RunData, drawn: Sequence[str]) -> str | None:
    """The note under the plots naming each stage of the results or captions (not a reference row) that has no
    training curves (``drawn``: the stages that have them), and why: no ``<stage>/metrics.jsonl`` (a stage that did not
    run, or whose folder was not copied), or one holding nothing to plot (killed before its first log); None when
    every stage has its curves. A single run's one stage is its folder's log.

    Example::

        >>> run = RunData(Path("runs/demo"), results={"human": {}, "mle": {}, "smile": {}})
        >>> run.events = {"mle": [], "smile": []}
        >>> no_curves_note(run, ["mle"])
        'No training curves for smile (nothing to plot in smile/metrics.jsonl).'
        >>> run.events = {"mle": []}; no_curves_note(run, ["mle"])
        'No training curves for smile (no smile/metrics.jsonl).'
    """
    missing = []
    for stage in run.stages:
        if stage in drawn or stage in REFERENCE_ROWS:
            continue
        name = bidi_isolated(stage)
        log_file = METRICS_FILE if run.single else f"{name}/{METRICS_FILE}"
        why = "nothing to plot in" if stage in run.events else "no"
        missing.append(f"{name} ({why} {log_file})")
    return f"No training curves for {', '.join(missing)}." if missing else None


MAX_CAPTION_STEPS = 6
"""Evaluations shown in an RL section's captions table: the first, the last and those evenly between."""


def _spaced(steps: list[int], n: int) -> list[int]:
    if len(steps) <= n:
        return steps
    return sorted({steps[round(k * (len(steps) - 1) / (n - 1))] for k in range(n)})


def _rl_sections(run: RunData, folder: Path) -> list[dict[str, Any]]:
    """Each RL stage's panels (one PNG each: :func:`~finecap.report.plots.rl_curves`) with their first and last
    values, and the captions its evaluations logged."""
    sections = []
    for stage, events in run.events.items():
        drawn = rl_curves(events, folder, stage)
        if not drawn:
            continue
        series = rl_panels(events)
        panels = []
        for panel, path in drawn:
            ends = "; ".join(
                f"{bidi_isolated(key)} {points[0][1]:.4g} → {points[-1][1]:.4g}"
                for key, points in series[panel].items()
            )
            panels.append({"panel": panel, "uri": png_uri(path), "note": ends, "title": rl_title(panel)})
        logged = run.logged_captions.get(stage, {})
        steps = _spaced(sorted(logged), MAX_CAPTION_STEPS)
        ids = list(dict.fromkeys(i for step in steps for i in logged[step]))
        rows = [{"id": i, "captions": [logged[step].get(i, "") for step in steps]} for i in ids]
        sections.append({"stage": stage, "panels": panels, "caption_steps": steps, "caption_rows": rows})
    return sections


def _match_ids(captions: dict[str, dict[Hashable, str]], records: dict[Hashable, Record]) -> dict:
    """``captions`` with each image id that is not a record's but spells one (an id logged as text: ``"24"`` for
    the record ``24``) replaced by the record's."""
    by_text = {str(i): i for i in records}
    return {stage: {(i if i in records else by_text.get(str(i), i)): c for i, c in caps.items()}
            for stage, caps in captions.items()}  # fmt: skip


def _uri(records: dict[Hashable, Record], image_id: Hashable, limits: ImageLimits) -> str | None:
    """The gallery's ``data:`` URI of the image of ``image_id``, read within the run's image budget ``limits``."""
    record = records.get(image_id)
    if record is None or not record.path.is_file():
        return None
    return image_uri(record.path, limits=limits)


def _gallery(run: RunData, records: dict[Hashable, Record], scenes: dict | None, n_sample: int, n_disagree: int,
             seed: int, limits: ImageLimits) -> list[dict[str, Any]]:  # fmt: skip
    sample, top = select_images(run.captions, n_sample, n_disagree, seed)

    def item(image_id: Hashable, score: float | None) -> dict[str, Any]:
        scene = scenes.get(image_id) if scenes else None
        rows = [{"stage": stage, "caption": caps[image_id],
                 "facts": check_facts(caps[image_id], scene) if scene is not None else []}
                for stage, caps in run.captions.items() if image_id in caps]  # fmt: skip
        record = records.get(image_id)
        humans = list(record.captions) if record is not None else []
        return {"id": image_id, "uri": _uri(records, image_id, limits), "humans": humans, "disagreement": score,
                "rows": rows}  # fmt: skip

    sections = []
    if top:
        sections.append({"title": "Where the stages disagree most", "items": [item(i, s) for i, s in top]})
    if sample:
        sections.append({"title": f"A random sample of {len(sample)} images (seed {seed})",
                         "items": [item(i, None) for i in sample]})  # fmt: skip
    return sections


@dataclass
class BagSource:
    """The bags a bag gallery shows, with the captions and images they are read with, and where they come from."""

    path: Path
    bags: dict[int, list[list[Hashable]]]
    captions: dict[str, dict[Hashable, str]]
    records: dict[Hashable, Record]
    where: str


def family_bag_source(run: RunData, cfg: Config) -> BagSource | None:
    """The scene-family test world's bags (the ones the demo's ``bag{s}/R@1`` columns score), its images and each
    stage's captions of it, or None when the run holds no family bags or the family world is not found (it is never
    made here)."""
    path = run.run_dir / family_tag() / "bags_test.json"
    if not path.is_file():
        return None
    # deferred: the demo's stage modules (torch, the retriever), read only for a run that holds family bags
    from finecap.app.demo_families import make_family_world
    from finecap.stages.outputs import world_captions_file

    try:
        refs = load_references(cfg, make_family_world(cfg, make=False)[1], split="test", check_images=True)
    except (FileNotFoundError, ValueError) as e:
        log.warning("report: the bag gallery shows the test split's bags, not the scene-family world's (%s)", e)
        return None
    captions = {stage: {i: caps[0] for i, caps in read_results(file).items()} for stage in run.captions
                if (file := world_captions_file(run.run_dir / stage, family_tag())).is_file()}  # fmt: skip
    if "human" in run.captions:
        captions["human"] = {r.image_id: r.captions[0] for r in refs.records}
    records = {r.image_id: r for r in refs.records}
    return BagSource(path, read_bags(path), captions, records, "the scene-family test world")


def _bag_source(run: RunData, cfg: Config, records: dict[Hashable, Record]) -> BagSource | None:
    """The family world's bags when the run holds them, else the run's own bags file on its test split."""
    family = family_bag_source(run, cfg)
    if family is not None:
        return family
    if not run.bags or run.bags_path is None:
        return None
    return BagSource(run.bags_path, run.bags, run.captions, records, "the test split")


def _bag_gallery(run: RunData, cfg: Config, records: dict[Hashable, Record], n_bags: int) -> tuple[list, str]:
    source = _bag_source(run, cfg, records)
    if source is None:
        return [], "No bags file in this run directory."
    captions, records = source.captions, source.records
    stages = [s for s in captions if s != "human"] + (["human"] if "human" in captions else [])
    chosen = [(size, i, bag) for size in sorted(source.bags) for i, bag in enumerate(source.bags[size][:n_bags])]
    chosen = [(size, i, bag) for size, i, bag in chosen if all(b in records for b in bag)]
    if not chosen or not stages:
        return [], "No bag whose images and captions are all available."
    # Deferred: the retriever needs torch and transformers; the rest of the report does not.
    from finecap.models.retriever import load_retriever

    try:
        retriever = load_retriever(cfg)
    except (FileNotFoundError, OSError, ValueError) as e:
        return [], f"Bag outcomes need the run's retriever, which could not be loaded: {e}"
    ids = list(dict.fromkeys(b for _, _, bag in chosen for b in bag))
    image_emb = retriever.image_embeddings([records[i] for i in ids])  # (N, D), bag images only: no cache entry
    columns = {i: c for c, i in enumerate(ids)}
    raw = read_json(source.path, DATA_FILE)["bags"]
    limits = ImageLimits.of(cfg.data)  # the images as the run read them
    out = []
    for size, index, bag in tqdm(chosen, desc="report: bag outcomes", unit="bag", disable=not progress_enabled()):
        rows = []
        for stage in stages:
            caps = captions[stage]
            if not all(b in caps for b in bag):
                continue
            texts = [caps[b] for b in bag]
            scores = (retriever.embed_texts(texts) @ image_emb.T).numpy()  # (S, N) cosine similarities
            outcomes = bag_outcomes(scores, bag, columns)
            rows.append({"stage": stage, "hits": sum(o.correct for o in outcomes),
                         "outcomes": [{"caption": t, "correct": o.correct, "retrieved": o.retrieved, "rank": o.rank}
                                      for t, o in zip(texts, outcomes)]})  # fmt: skip
        entry = raw[str(size)][index]
        similarity = entry.get("similarity") if isinstance(entry, dict) else None
        out.append({"key": f"{size}/{index}", "similarity": similarity,
                    "images": [{"id": b, "uri": _uri(records, b, limits)} for b in bag], "rows": rows})  # fmt: skip
    saved = {bag["key"]: {row["stage"]: [{k: o[k] for k in ("caption", "retrieved", "rank")} | {"image": im["id"]}
                                         for o, im in zip(row["outcomes"], bag["images"])] for row in bag["rows"]}
             for bag in out}  # fmt: skip
    write_output_json(run.run_dir / BAG_OUTCOMES, {"bags": os.path.abspath(source.path), "retriever": retriever.name,
                                                   "outcomes": saved}, "bag-outcomes")  # fmt: skip
    note = (
        f"The {n_bags} most similar bags of each size on {source.where} "
        f"({source.path.relative_to(run.run_dir)}); "
        f"green: the retriever ({retriever.name}) ranks the caption's own image first in the bag (as the bagN/R@1 "
        "metric counts)."
    )
    return out, note


def _rows(value: Any, where: str) -> dict[str, dict[str, Any]]:
    """``value`` when it is a table's rows, ``{row: {column: value}}``; else a ``ValueError`` naming ``where``."""
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ValueError(f"{where}: expected {{row: {{column: value}}}}, got {short_repr(value)}")
    return value


def _mapping(value: Any, where: str) -> dict[str, Any]:
    """``value`` when it is a JSON object; else a ``ValueError`` naming ``where``."""
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected an object, got {short_repr(value)}")
    return value


def _extra_sections(run_dir: Path, rules: ColumnRules) -> list[dict[str, Any]]:
    """Sections for the demo's other result files, when present: the ``vcb`` group's ``vcb_results.json`` (NDLB
    Tables 2-3) and the ``transfer`` stage's ``transfer/results.json`` (the shifted domain). A file of another
    layout is a ``ValueError`` naming it and the part that is wrong."""
    sections = []
    vcb = run_dir / "vcb_results.json"
    if vcb.is_file():
        from finecap.app.demo_vcb import FIELD_ROWS  # deferred: the demo imports the retriever (torch, CLIP)

        data = _mapping(read_json(vcb, DATA_FILE), str(vcb))
        settings = _mapping(data.get("settings", {}), f"{vcb}: 'settings'")
        trained_on = _mapping(settings.get("trained on", {}), f"{vcb}: 'settings': 'trained on'")
        captions = _rows(data.get("captions", {}), f"{vcb}: 'captions'")
        models = {stage: {"trained on": trained_on.get(stage, "?"), **values}
                  for stage, values in _rows(data.get("models", {}), f"{vcb}: 'models'").items()}  # fmt: skip
        note = "; ".join(f"{k}: {v}" for k, v in settings.items() if isinstance(v, str))
        sections.append({
            "id": "vcb", "short": "Visual Caption Boosting", "title": "Visual Caption Boosting (NDLB Tables 2-3)",
            "note": f"From {vcb.name}. {note}.",
            "tables": [single_table("caption fields of the test split (Table 2)", captions,
                                    reference_rows=[row for row, field in FIELD_ROWS.items() if field == "original"],
                                    rules=rules),
                       single_table("captioners trained on them (Table 3)", models, rules=rules)],
        })  # fmt: skip
    transfer = run_dir / "transfer" / "results.json"
    if transfer.is_file():
        sections.append({
            "id": "transfer", "short": "Shifted domain", "title": "Shifted domain (the transfer stage)",
            "note": "From transfer/results.json: every trained stage captions the shifted domain's test split "
                    "(world.shift=domain), scored against its references.",
            "tables": [single_table("shifted domain", _rows(read_json(transfer, DATA_FILE), str(transfer)),
                                    reference_rows=REFERENCE_ROWS, rules=rules)],
        })  # fmt: skip
    return sections


def results_note(run_dir: Path, step: int, cfg: Config) -> str:
    """The note under the results table of a run without ``results.json`` (its row is the last evaluation), with the
    two commands that score its best checkpoint on the test split: ``finecap caption`` (into the run's ``captions/``,
    which the report's gallery then shows), then ``finecap eval`` against the run's data set."""
    try:
        references = str(data_file(cfg))
    except ValueError:  # no data set file to name (a format without a default path)
        references = "DATA"
    captions = run_dir / "captions" / "test.json"
    return (
        f"No results.json in this run: the row is its last evaluation (validation split, step {step}). To score its "
        f"best checkpoint on the test split: `finecap caption --checkpoint {run_dir} --split test --out {captions}`, "
        f"then `finecap eval --predictions {captions} --references {references}`."
    )


def silent_note(results: dict[str, dict[str, Any]]) -> str | None:
    """The note under the results tables when most captions of some stage state no fact
    (:func:`finecap.metrics.faithfulness.mostly_silent`): their precision 1 and no hallucination are by definition.

    Example::

        >>> silent_note({"mle": {"faith/no_facts": 0.8}, "smile": {"faith/no_facts": 0.1}})[:50]
        'Most captions of mle (80%) state no fact the world'
        >>> silent_note({"smile": {"faith/no_facts": 0.1}}) is None
        True
    """
    silent = {stage: share for stage, row in results.items() if (share := mostly_silent(row)) is not None}
    if not silent:
        return None
    stages = ", ".join(f"{bidi_isolated(stage)} ({share:.0%})" for stage, share in silent.items())
    return f"Most captions of {stages} {SILENT_NOTE}."


def _records(cfg: Config) -> tuple[dict[Hashable, Record], dict | None]:
    try:
        refs = load_references(cfg)
    except (FileNotFoundError, ValueError) as e:
        log.warning("report: no images or human captions in the gallery (%s)", e)
        return {}, None
    return {r.image_id: r for r in refs.records}, refs.scenes


def main(
    run_dir: str | Path, out: str | Path | None = None, *, items: Sequence[str] = (), n_sample: int = 8,
    n_disagree: int = 8, n_bags: int = 3, retrieval: bool = True, seed: int = 0, force: bool = False,
    plots: str | Path | None = None, advice: str | None = None,
) -> Path:  # fmt: skip
    """Write the report of ``run_dir`` to ``out`` (default ``<run_dir>/report.html``) and return its path. ``out`` may
    not be a file the report reads (refused even with ``force``), nor, unless ``force``, an existing file other than a
    page finecap wrote as a report and nobody changed since (:func:`finecap.outputs.made_by_finecap`: a page edited
    by hand is the user's). Every file it writes is checked writable before any work
    (:func:`finecap.outputs.check_writable`: an ``out`` through a file, a read-only run folder), so a failure leaves
    no plot file nor bag outcomes behind.

    The plots are inlined in the page, and written as PNG files into :func:`plots_folder` (``<run_dir>/plots/`` for
    the default page, ``plots`` when given, none for an ``out`` alone). Every plot file is checked before any is
    written (:func:`check_plot_files`): one finecap did not draw is replaced only with ``force``. The plot files an
    earlier report wrote into that folder and this one does not draw are removed, and nothing else there
    (:func:`finecap.report.plot_files.write_plots`).

    ``advice``: what a refusal of a file finecap did not write (or that changed since: the page, a plot file, the bag
    outcomes) says to do, for a caller whose options are not the report's: the demo's report stage
    (:func:`finecap.app.demo.write_demo_report`), whose ``--force`` trains every stage again. Without it, the refusal
    names ``--force`` and the report's ``--out`` / ``--plots`` / ``--no-bag-outcomes``."""
    run = read_run(run_dir)
    folder = plots_folder(run.run_dir, out, plots)
    out = Path(out) if out is not None else run.run_dir / "report.html"
    cfg = load_stored(run.config_path, list(items)) if run.config_path else load(None, list(items))
    inputs = {**{str(p): p for p in run.inputs()}, "data set": data_file(cfg), "images": cfg.data.images or None}
    # a page finecap wrote and nobody edited (its stamp), or finecap's record; advice: the demo's words
    check_output_file(out, inputs, force=force, kind="report", ours=unedited_report, advice=advice)
    check_writable(out)  # the page is written last: a typo through a file is said now, before any plot file is
    if retrieval:
        check_writable(check_bag_outcomes_file(run.run_dir, force=force, advice=advice), option="the run folder")
    if plots is not None:
        check_not_input(folder, inputs, option="--plots")
    if folder is not None:
        check_writable(folder / "plot.png", option="--plots" if plots is not None else "the run folder")
    check_run_dir(run.run_dir, cfg)  # the data and retriever read now must be the run's (exit 2 naming both)
    records, scenes = _records(cfg)
    run.captions = _match_ids(run.captions, records)
    rules = rules_for(cfg.eval.metrics)  # the directions of the run's own metric groups' columns too
    extra = _extra_sections(run.run_dir, rules)  # read before anything is written: a malformed file stops here
    with drafts() as drawn:  # drawn here first: every target is checked before any plot file is written
        figures, plots_note = _plots(run, drawn)
        rl = _rl_sections(run, drawn)
        if folder is not None:
            names = sorted(p.name for p in drawn.iterdir())
            check_plot_files(folder, names, given=plots is not None, force=force, advice=advice)
            for name in write_plots(drawn, folder):
                log.info("report: removed %s, a plot of an earlier report this one does not draw", folder / name)
    gallery = _gallery(run, records, scenes, n_sample, n_disagree, seed, ImageLimits.of(cfg.data))
    bags, bag_note = _bag_gallery(run, cfg, records, n_bags) if retrieval else ([], "Bag outcomes not computed.")
    context = {
        "title": run.run_dir.resolve().name,
        "run_dir": str(run.run_dir),
        "generated": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "stages": run.stages,
        "quick": cfg.demo.quick,
        "reference_rows": [r for r in REFERENCE_ROWS if r in run.results],
        "headlines": headline_comparisons(run.results, rules),
        "tables": results_tables(run.results, rules=rules),
        "results_note": None if run.results_from is None else results_note(run.run_dir, run.results_from, cfg),
        "silent_note": silent_note(run.results),
        "rl": rl,
        "extra": extra,
        "plots": figures,
        "plots_note": plots_note,
        "gallery": gallery,
        "facts_checked": bool(scenes),
        "bag_gallery": bags,
        "bag_note": bag_note,
    }
    render_report(context, out)
    log.info("wrote %s", out)
    return out
