"""The command-line options the metric benchmarks share (benchmarks/ngram_metrics.py, benchmarks/meteor.py)."""

from __future__ import annotations

import argparse


def corpus_parser(description: str) -> argparse.ArgumentParser:
    """A parser with the synthetic corpus's size and seed and the timings' repeats: ``--images`` (5000), ``--refs``
    (references per image, 5), ``--repeat`` (each timing is the best of this many runs, 3) and ``--seed`` (0)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--images", type=int, default=5000)
    ap.add_argument("--refs", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    return ap
