"""``finecap boost --out DIR [RECIPE] [key=value ...]``: Visual Caption Boosting of a data set (NDLB Sec. 2).

Reads every split of the data set of ``data.*`` (the world by default), runs the steps of ``boost.mode`` through
the configured backends (:mod:`finecap.boost`) and writes the same format into ``DIR``
(:mod:`finecap.boost.output`), with:

- ``DIR/cache.jsonl``: every accepted answer, keyed by request hash; a killed run re-run with the same ``--out``
  continues where it stopped (:mod:`finecap.boost.engine`);
- ``DIR/failures.jsonl``: one line per image and step that failed (those images keep their human captions);
- ``DIR/boost.json``: the configuration, counts of images, requests and failures per step, and the wall time.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from finecap.boost.backends import make_backend
from finecap.boost.engine import MODE_STEPS, AnswerCache, boost_records
from finecap.boost.output import check_writable, write_boosted
from finecap.boost.prompts import Prompts
from finecap.config import Config
from finecap.data.formats import read_dataset
from finecap.data.references import data_file
from finecap.utils import atomic_write_text, write_json


def main(cfg: Config, out: str | Path, progress: bool = True) -> dict[str, Any]:
    """Boost the configured data set into ``out``; returns the summary written to ``out/boost.json``."""
    start = time.perf_counter()
    out = Path(out)
    check_writable(cfg.data.format)  # before any request
    source = data_file(cfg)
    if not source.exists():
        raise FileNotFoundError(
            f"{source}: data set not found (data.path / world.out; `finecap world make` for the world)"
        )
    records = read_dataset(cfg.data.format, source, images=cfg.data.images or None, check_images=False)
    # Boosting a boosted data set starts again from its human captions.
    for r in records:
        if "original" in r.boosted:
            r.captions = list(r.boosted["original"])
    steps = MODE_STEPS[cfg.boost.mode]
    prompts = Prompts.load(cfg.boost.prompts or None)
    llm = make_backend(cfg, "llm") if set(steps) & {"blend", "holistic"} else None
    vlm = make_backend(cfg, "vlm") if "visual" in steps else None
    out.mkdir(parents=True, exist_ok=True)
    cache = AnswerCache(out / "cache.jsonl")
    try:
        result = boost_records(records, cfg.boost.mode, llm, vlm, cache, prompts, few_shot=cfg.boost.few_shot,
                               retries=cfg.boost.retries, limit=cfg.boost.limit, progress=progress)  # fmt: skip
    finally:
        cache.close()
        for backend in (llm, vlm):
            close = getattr(backend, "close", None)
            if close is not None:
                close()
    path = write_boosted(cfg.data.format, source, out, records, result.fields, cfg.boost.mode)
    atomic_write_text(out / "failures.jsonl", "".join(json.dumps(f.to_dict()) + "\n" for f in result.failures))
    failed: dict[str, int] = {}
    for f in result.failures:
        failed[f.step] = failed.get(f.step, 0) + 1
    summary = {
        "source": str(source),
        "output": str(path),
        "mode": cfg.boost.mode,
        "images": len(records),
        "boosted": len(records[: cfg.boost.limit or None]),
        "requested": result.requested,
        "failed": failed,
        "seconds": round(time.perf_counter() - start, 1),
        "prompts": prompts.source,
        "config": cfg.to_dict()["boost"] | {"llm_api_key": "***", "vlm_api_key": "***"},
    }
    write_json(out / "boost.json", summary)
    print(f"boost: {summary['boosted']} of {len(records)} images ({cfg.boost.mode}); requests {result.requested}; "
          f"failed {failed or 'none'}; wrote {path}")  # fmt: skip
    if result.failures:
        print(f"boost: {len(result.failures)} failures logged in {out / 'failures.jsonl'} (human captions kept)")
    return summary
