"""``finecap eval``: score a COCO results file against a reference data set, print a table, write JSON.

``finecap eval --predictions results.json --references DATA [--images DIR] [--bags bags.json] [--metrics ...]
[--out eval.json] [--format table|json]`` calls :func:`main`, which reads the files and calls
:func:`finecap.metrics.suite.evaluate` (the metric groups and their keys are listed there).

- Output: a Markdown table on stdout (``--format table``, default), or only the JSON ``{metric: value}`` on stdout
  (``--format json``, for scripts: notes then go to stderr); ``--out`` also writes that JSON to a file.

- References: the format is detected from the file (:func:`finecap.data.references.detect_format`; a world also
  brings its scene graphs for ``faithfulness``).
- Predictions (:func:`finecap.data.formats.read_results`): an image listed several times has several samples; its
  first caption is its prediction for every metric, and all of them form its ``samples`` for the ``diversity``
  group. pycocoevalcap would reject such a file (its scorers assert one caption per image); the command says how
  many images it found with several captions, so an accidental duplicate does not go unnoticed.
- Start-up: with text-only metrics (n-gram, length, vocabulary, diversity, faithfulness) nothing imports torch or
  transformers; image metrics load the retriever when they run.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from finecap.config import Config
from finecap.data.formats import DataError, read_bags, read_results
from finecap.data.references import load_references
from finecap.metrics.suite import IMAGE_METRICS, evaluate, parse_metrics
from finecap.report.table import markdown_table
from finecap.utils import write_json


def main(
    cfg: Config,
    *,
    predictions: str | Path,
    references: str | Path | None,
    images: str | Path | None = None,
    bags: str | Path | None = None,
    metrics: str | Sequence[str] | None = None,
    out: str | Path | None = None,
    split: str | None = None,
    fmt: Literal["table", "json"] = "table",
) -> dict[str, float]:
    """Score ``predictions`` (COCO results) against ``references``; print a table (``fmt="table"``) or the JSON
    ``{metric: value}`` (``fmt="json"``, notes to stderr) and write that JSON to ``out`` when given.

    ``metrics`` default to ``eval.metrics``; then groups whose inputs are absent (faithfulness without scene graphs,
    bags without ``--bags``, diversity without several captions per image, perplexity without ``eval.lm``) are
    skipped with a note, whereas explicitly asked-for groups raise an error naming what is missing. Without
    ``split``, the retrieval pool is the split of the predicted images (or every referenced image when they span
    several splits).
    """
    if fmt not in ("table", "json"):
        raise ValueError(f"--format: expected 'table' or 'json', got {fmt!r}")
    note = print if fmt == "table" else lambda *a: print(*a, file=sys.stderr)
    explicit = metrics is not None
    names = parse_metrics(metrics, cfg.eval.metrics)
    results = read_results(predictions)
    preds = {i: caps[0] for i, caps in results.items()}
    repeated = sum(len(caps) > 1 for caps in results.values())
    samples = results if repeated else None
    if repeated:
        note(f"{repeated} image(s) have several captions: the first is scored, all of them are diversity samples")
    bag_data = read_bags(bags) if bags is not None else None
    needs_images = any(n in IMAGE_METRICS for n in names)
    refs = load_references(cfg, references, split=split, images=images, check_images=needs_images)
    by_id = {r.image_id: r for r in refs.records}
    missing = [i for i in preds if i not in by_id]
    if missing:
        where = f" (split {split!r})" if split else ""
        raise DataError(
            f"{predictions}: {len(missing)} predicted image id(s) are not in the references {refs.path}{where}, "
            f"e.g. {missing[:5]}"
        )
    # pycocoevalcap's order (loadRes keeps the reference file's image order): its tokenizer reads captions as
    # consecutive lines, and a caption's last token can depend on the next line (finecap.metrics.ptb_tokenize)
    preds = {r.image_id: preds[r.image_id] for r in refs.records if r.image_id in preds}
    pool = refs.records
    if split is None:
        splits = {by_id[i].split for i in preds}
        if len(splits) == 1:
            pool = [r for r in refs.records if r.split in splits]
    if not explicit:
        reasons = {
            "faithfulness": None if refs.scenes else "no scene graphs (not a world data set)",
            "listener": None if refs.scenes else "no scene graphs (not a world data set)",
            "bags": None if bag_data else "no --bags file",
            "diversity": None if samples else "one caption per image (diversity needs several)",
            "perplexity": None if cfg.eval.lm else "eval.lm is not set",
        }
        for name in [n for n in names if reasons.get(n)]:
            note(f"skipping {name}: {reasons[name]}")
            names.remove(name)
        if not names:
            raise ValueError("none of the metrics of eval.metrics can be computed here; pass --metrics")
    result = evaluate(
        preds,
        refs.captions(),
        metrics=names,
        images=pool if needs_images or "listener" in names else None,  # the listener's pool: the retriever's
        scenes=refs.scenes,
        bags=bag_data,
        samples=samples,
        cfg=cfg,
    )
    title = Path(predictions).name
    note(f"{len(preds)} images of {refs.path}" + (f" (split {split})" if split else ""))
    if fmt == "json":
        print(json.dumps(result, indent=1))
    else:
        print(markdown_table({k: {title: v} for k, v in result.items()}, columns=[title], row_header="metric"))
    if out is not None:
        write_json(out, result)
        note(f"wrote {out}")
    return result
