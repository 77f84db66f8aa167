"""``finecap boost --out DIR [RECIPE] [key=value ...]``: Visual Caption Boosting of a data set (NDLB Sec. 2).

Reads every split of the data set of ``data.*`` (the world by default), runs the steps of ``boost.mode`` through
the configured backends (:mod:`finecap.boost`) and writes the same format into ``DIR``
(:mod:`finecap.boost.output`), with:

- ``DIR/cache.jsonl``: every accepted answer, keyed by request hash; a killed or stopped run re-run with the same
  ``--out`` continues where it stopped (:mod:`finecap.boost.engine`);
- ``DIR/failures.jsonl``: one line per image and step that failed (those images keep their human captions);
- ``DIR/boost.json``: ``status`` (``ok``, ``failed`` with the ``error``, or ``interrupted`` by Ctrl-C), the counts
  of images ``boosted``, ``failed`` and ``not_done``, the requests and cached answers per step, the model a server's
  replies named per role (``served_model``), the wall time and the configuration (secrets masked:
  :mod:`finecap.config.secrets`);
- ``DIR/.boost.lock`` while it runs (:mod:`finecap.locks`): one writer per folder.

Before the first request: the output paths are checked (:func:`~finecap.boost.output.check_outputs`; never inside
the source data), the prompts and backends are built (URLs and API-key variables checked), the lock is taken. A run
that stops (failure budget, consecutive connection failures, a refused key), ends over budget or finds its source
changed when writing (:func:`~finecap.boost.output.write_boosted`) writes ``boost.json``
with ``status: failed`` but no data set, keeps every cached answer, and raises
:class:`~finecap.boost.engine.BoostFailed` (exit code 2).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from finecap.boost import training
from finecap.boost.backends import make_backend
from finecap.boost.engine import MODE_STEPS, AnswerCache, BoostFailed, boost_records, served_models
from finecap.boost.output import check_outputs, dataset_file, write_boosted
from finecap.boost.prompts import Prompts
from finecap.config import Config
from finecap.data.formats import read_dataset
from finecap.data.images import ImageLimits
from finecap.data.references import data_file
from finecap.locks import LOCK_NAME, output_lock
from finecap.train.prepare import prepare
from finecap.utils.closing import close_all
from finecap.utils.files import atomic_write_text, write_json
from finecap.utils.folders import made_folder
from finecap.utils.reading import read_json

log = logging.getLogger(__name__)


def main(cfg: Config, out: str | Path, progress: bool = True) -> dict[str, Any]:
    """Boost the configured data set into ``out``; returns the summary written to ``out/boost.json``."""
    start = time.perf_counter()
    out = Path(out)
    source = data_file(cfg)
    check_outputs(cfg.data.format, source, out, cfg.data.images or None)  # before any request or file
    prepare(cfg, {"data"}, make=False)  # the world checked (never made here) when it is the data
    if not source.exists():
        raise FileNotFoundError(
            f"{source}: data set not found (data.path / world.out; `finecap world make` for the world)"
        )
    records = read_dataset(cfg.data.format, source, images=cfg.data.images or None, check_images=False,
                           allow_outside=cfg.data.allow_outside_paths)  # fmt: skip
    # Boosting a boosted data set starts again from its human captions.
    for r in records:
        if "original" in r.boosted:
            r.captions = list(r.boosted["original"])
    steps = MODE_STEPS[cfg.boost.mode]
    prompts = Prompts.load(cfg.boost.prompts or None)
    # removed again if boost fails before writing anything (a backend that cannot start)
    with made_folder(out), output_lock(out, name=LOCK_NAME, holder="finecap boost", log=log.warning):
        llm = vlm = cache = None
        try:  # whatever was built is closed, also when a later backend fails to start (an engine's memory freed)
            llm = make_backend(cfg, "llm") if set(steps) & {"blend", "holistic"} else None
            vlm = make_backend(cfg, "vlm") if "visual" in steps else None
            cache = AnswerCache(out / "cache.jsonl")
            # until this run ends: a crash leaves "running" here, never an earlier run's "ok"
            write_json(out / "boost.json",
                       {"status": "running", "source": str(source.resolve()), "mode": cfg.boost.mode})  # fmt: skip
            try:
                b = cfg.boost
                result = boost_records(
                    records, b.mode, llm, vlm, cache, prompts, few_shot=b.few_shot, retries=b.retries, limit=b.limit,
                    progress=progress, max_failure_rate=b.max_failure_rate,
                    max_consecutive_failures=b.max_consecutive_failures, image_limits=ImageLimits.of(cfg.data),
                )  # fmt: skip
            except KeyboardInterrupt:
                served = served_models({"llm": llm, "vlm": vlm})  # what the replies named by the Ctrl-C
                interrupted(out, source, cfg.boost.mode, len(cache.answers), served, time.perf_counter() - start)
                raise
        finally:  # each closed even when another's close fails (a world backend has nothing to close)
            close_all([cache, *(backend for backend in (llm, vlm) if hasattr(backend, "close"))])
        path = None
        if not result.stopped:
            try:
                path = write_boosted(cfg.data.format, source, out, records, result.fields, cfg.boost.mode)
            except ValueError as e:  # the source changed during the run (checked entry by entry): a failed run
                result.stopped = str(e)
        atomic_write_text(out / "failures.jsonl", "".join(json.dumps(f.to_dict()) + "\n" for f in result.failures))
        failed_steps: dict[str, int] = {}
        for f in result.failures:
            failed_steps[f.step] = failed_steps.get(f.step, 0) + 1
        summary = {
            "status": "failed" if result.stopped else "ok",
            "error": result.stopped,
            "source": str(source.resolve()),
            "output": str(path.resolve()) if path else None,
            "mode": cfg.boost.mode,
            "images": len(records),
            "to_boost": len(result.chosen),
            "boosted": len(result.boosted),
            "failed": len(result.failed),
            "not_done": len(result.chosen) - len(result.boosted) - len(result.failed),
            "failed_steps": failed_steps,
            "cut_off": result.cut_off,
            "requested": result.requested,
            "cached": result.cached,
            "served_model": result.served_model,  # what a server's replies named, per role (engine.BoostResult)
            "seconds": round(time.perf_counter() - start, 1),
            "prompts": prompts.source,
            "config": boost_settings(cfg),  # secrets masked (finecap.config.secrets)
        }
        write_json(out / "boost.json", summary)
    counts = f"{summary['boosted']} of {summary['to_boost']} images boosted ({b.mode}), {summary['failed']} failed"
    if result.stopped:
        earlier = dataset_file(cfg.data.format, source).name
        left = f" (the {earlier} there is an earlier run's)" if (out / earlier).exists() else ""
        reason = result.stopped if result.stopped.endswith((".", "!", "?")) else f"{result.stopped}."  # one period
        raise BoostFailed(
            f"boost stopped: {reason} {counts}, {summary['not_done']} not done; no data set written{left}. "
            f"{len(cache.answers)} answers are kept in {out / 'cache.jsonl'}: re-run with the same --out to continue "
            f"(details: {out / 'boost.json'}, {out / 'failures.jsonl'})"
        )
    log.info("boost: %s; requests %s; wrote %s", counts, result.requested, path)
    if result.failures:
        log.warning("boost: %d failures logged in %s (human captions kept; within boost.max_failure_rate=%g)",
                    len(result.failures), out / "failures.jsonl", b.max_failure_rate)  # fmt: skip
    return summary


def boost_settings(cfg: Config) -> dict[str, Any]:
    """The ``boost.*`` settings of ``cfg`` as ``boost.json`` records them (``"config"``): secrets masked
    (:mod:`finecap.config.secrets`), as JSON reads them back."""
    return json.loads(json.dumps(cfg.to_dict(redact=True)["boost"]))


def settings_changes(out: str | Path, cfg: Config, ignore: tuple[str, ...] = ()) -> list[str]:
    """How the boosted data set in ``out`` was made otherwise than ``cfg`` makes it now, read from its ``boost.json``:
    ``boost.key: recorded -> now`` for each setting that differs (:func:`boost_settings`; but those named in
    ``ignore``), or why the record cannot say (none, not readable, a run that did not end ``ok``, no settings
    recorded). Empty: made with these settings. For a pipeline that boosts once and reads the data set back (the
    demo's ``boost_holistic``)."""
    path = Path(out) / "boost.json"
    try:
        record = read_json(path)
    except FileNotFoundError:
        return [f"{path}: no record of the run that made it"]
    except (ValueError, OSError, RecursionError) as e:
        return [f"{path}: not readable ({e})"]
    if not isinstance(record, dict) or record.get("status") != "ok" or not isinstance(record.get("config"), dict):
        status = record.get("status") if isinstance(record, dict) else None
        return [f"{path}: not the record of a finished run with its settings (status {status!r})"]
    recorded, now = record["config"], boost_settings(cfg)
    keys = [k for k in dict.fromkeys([*recorded, *now]) if k not in ignore]
    return [f"boost.{k}: {recorded.get(k)!r} -> {now.get(k)!r}" for k in keys if recorded.get(k) != now.get(k)]


def boost_unless_current(runner: Any, out: Path, *, force: bool = False, what: str = "boost_holistic") -> None:
    """``finecap boost`` of the world into ``out`` with the best checkpoint of ``runner``'s visual expert (a
    :class:`~finecap.stages.StageRunner`: the demo's ``boost_holistic`` stage, or a paper grid), unless ``force`` is
    off and the data set there was made since the expert last trained
    (:meth:`~finecap.stages.StageRunner.made_since_training`) with the ``boost.*`` settings of now (its
    ``boost.json``: :func:`settings_changes`; the expert's path ``boost.vlm_model`` aside, a run directory moved
    elsewhere holds the same expert). ``what`` names it in the log."""
    cfg = training.world_boost_config(runner.cfg, runner.items, runner.best_checkpoint("visual_expert"))
    if not force and runner.made_since_training("visual_expert", out / "dataset.json"):  # its expert
        changes = settings_changes(out, cfg, ignore=("vlm_model",))
        if not changes:
            log.info("%s: %s exists; skipping", what, out)
            return
        log.info("%s: %s was boosted otherwise (%s); boosting again", what, out, "; ".join(changes))
    main(cfg, out)


def interrupted(out: Path, source: Path, mode: str, kept: int, served_model: dict[str, str | None],
                seconds: float) -> None:  # fmt: skip
    """``out/boost.json`` of a run stopped by Ctrl-C (``status: interrupted``; no data set written), with the model a
    server's replies named per role (``served_model``: :func:`~finecap.boost.engine.served_models`) as a finished
    run's, and a log line saying how to go on."""
    write_json(out / "boost.json", {"status": "interrupted", "error": "interrupted (Ctrl-C)",
                                    "source": str(source.resolve()), "output": None, "mode": mode,
                                    "answers_kept": kept, "served_model": served_model,
                                    "seconds": round(seconds, 1)})  # fmt: skip
    log.warning("boost interrupted: no data set written; %d answers are kept in %s: re-run with the same --out to "
                "continue", kept, out / "cache.jsonl")  # fmt: skip
