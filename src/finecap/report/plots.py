"""Plots of training runs, written as PNG files next to the results."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path


def validation_series(run_dir: str | Path, key: str) -> list[tuple[int, float]]:
    """``(step, value)`` of ``key`` at every validation event of ``<run_dir>/metrics.jsonl``."""
    points = []
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event.get("split") == "val" and key in event.get("values", {}):
            points.append((int(event["step"]), float(event["values"][key])))
    return points


def length_curves(runs: Mapping[str, str | Path], out: str | Path, *, start: str | Path | None = None,
                  key: str = "length") -> Path:  # fmt: skip
    """Mean validation caption length over training steps, one line per run (SMILE Fig. 4a).

    ``start``: the run the others continue from; its last validation value (if it logged ``key``) is drawn at step 0.
    """
    # Deferred: pyplot takes seconds to import (measured 3 s here), and choosing the file-only Agg backend is a
    # process-wide setting that must precede it; both happen only when a plot is drawn.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    origin = validation_series(start, key)[-1:] if start is not None else []
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for label, run_dir in runs.items():
        points = validation_series(run_dir, key)
        if origin:
            points = [(0, origin[0][1]), *points]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    ax.set_xlabel("training step")
    ax.set_ylabel("mean caption length (words, validation)")
    ax.legend()
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
