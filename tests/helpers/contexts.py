"""A training context for the objective tests that set an objective up without a run: a real
:class:`finecap.contract.TrainContext` over given records, on data that is not the world (no scene graphs to read),
without an accelerator."""

from __future__ import annotations

from pathlib import Path


def training_context(records: list, run_dir: Path | None = None):
    """The context of a one-process run over ``records`` (``image_id``, ``captions``)."""
    from finecap.config import load
    from finecap.contract import TrainContext

    cfg = load(None, ["data.format=jsonl", "data.path=captions.jsonl"])
    return TrainContext(cfg, None, records, tokenizer=None, run_dir=run_dir or Path("run"))
