"""How much of a difference between two stages the test split alone can make: the per-image difference of a caption
metric between stage A and stage B of the same run (a demo run directory, or a seed folder of the paper-tables
runner), its mean (= the corpus difference for metrics that average per image, CIDEr-D among them), and a 95%
paired-bootstrap interval over the test images, references and CIDEr-D's document frequencies held fixed.

    python benchmarks/paired_difference.py runs/effects/seed0 runs/effects/seed1 --a sle --b scst
    python benchmarks/paired_difference.py runs/paper_tables/seed0 --a sle --b scst --metric bleu --key BLEU-4

An interval that covers 0 says the test split cannot tell the two stages' captions apart on that metric; it says
nothing of training noise (another seed retrains both stages), which the seeds of ``benchmarks/effects.py`` measure.
Captions: ``<run>/<stage>/captions_test.json`` (the top beam of each test image, as the results tables); references:
the other four human captions of each test image, as the demo's rows (``finecap.app.demo.stage_report``), read with
stage A's configuration; a stage trained on a boosted caption field (NDLB's BlendCap / HolisticCap rows, scored
against their own field by the paper-tables runner) is refused.

The bootstrap is the percentile bootstrap of a mean, a few lines of numpy (scipy, whose ``stats.bootstrap`` does it,
is not a dependency of finecap).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def paired_bootstrap(differences: Sequence[float], draws: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of the per-item ``differences`` and its 95% percentile-bootstrap interval (items resampled with
    replacement ``draws`` times, numpy generator seeded with ``seed``).

    >>> paired_bootstrap([0.25, 0.25, 0.25])
    (0.25, 0.25, 0.25)
    """
    d = np.asarray(differences, dtype=float)  # (N,)
    rng = np.random.default_rng(seed)
    chunk = max(1, 2_000_000 // len(d))  # resamples per chunk: a few MB of indices at a time, whatever N
    means = np.concatenate([d[rng.integers(0, len(d), size=(min(chunk, draws - start), len(d)))].mean(axis=1)
                            for start in range(0, draws, chunk)])  # fmt: skip  # (draws,)
    low, high = np.quantile(means, [0.025, 0.975])
    return float(d.mean()), float(low), float(high)


T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045,
         2.042)  # fmt: skip
"""Student's t 97.5% quantiles for 1..30 degrees of freedom (printed tables; scipy is not a dependency of finecap);
:func:`t_975` beyond."""

Z_975 = 1.959963984540054
"""The standard normal's 97.5% quantile."""


def t_975(df: int) -> float:
    """Student's t 97.5% quantile for ``df`` degrees of freedom: :data:`T_975` up to 30, beyond it the
    Cornish-Fisher expansion in ``1/df`` (Abramowitz & Stegun 26.7.5, four terms; within 1e-5 of the exact
    quantile from 10 degrees of freedom on), never the normal's 1.96, which makes a "95%" interval too narrow
    (t(0.975, 31) = 2.0395: 4% wider).

    >>> t_975(2), t_975(31), t_975(60), t_975(120)  # scipy.stats.t.ppf(0.975, df): 2.0395, 2.0003, 1.9799
    (4.303, 2.0395..., 2.0002..., 1.9799...)
    """
    if df < 1:
        raise ValueError(f"t_975: {df} degrees of freedom; at least 1")
    if df <= len(T_975):
        return T_975[df - 1]
    z = Z_975
    terms = ((z**3 + z) / 4, (5 * z**5 + 16 * z**3 + 3 * z) / 96,
             (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
             (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160)  # fmt: skip
    return z + sum(g / df ** (k + 1) for k, g in enumerate(terms))


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation of ``values`` (0 for one value).

    >>> mean_std([1.0, 2.0, 3.0])
    (2.0, 1.0)
    """
    m = sum(values) / len(values)
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return m, s


def t_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean of ``values`` and its 95% Student-t interval, ``mean ± t(0.975, n - 1)·sd/√n`` (sample sd,
    :func:`t_975`); one value gives no interval (``nan`` bounds). The seed-to-seed spread of an effect, whose draws
    (worlds, initialisations) are too few for a bootstrap.

    >>> [round(v, 4) for v in t_interval([0.1, -0.1, 0.2, 0.0])]  # sd 0.1291, 3.182 * 0.1291 / 2 = 0.2054
    [0.05, -0.1554, 0.2554]
    """
    n = len(values)
    mean = float(np.mean(values))
    if n < 2:
        return mean, float("nan"), float("nan")
    sd = float(np.std(values, ddof=1))
    half = t_975(n - 1) * sd / float(np.sqrt(n))
    return mean, mean - half, mean + half


def stage_items(run: Path, stages: Sequence[str], metric: str, key: str) -> list[dict[object, float]]:
    """Per-image ``key`` scores of each stage's test captions against the other four references of each image."""
    from finecap.config import load
    from finecap.data.datasets import load_records
    from finecap.data.results import read_results
    from finecap.metrics.suite import evaluate_items

    configs = [load(str(run / stage / "config.yaml"), []) for stage in stages]
    for stage, cfg in zip(stages, configs, strict=True):
        if cfg.data.captions != "original":
            raise SystemExit(f"{run / stage}: trained on the {cfg.data.captions!r} caption field; this script scores "
                             "against the human references, as the demo's rows: compare stages trained on the "
                             "human captions")  # fmt: skip
    references = {r.image_id: r.captions[1:] for r in load_records(configs[0], "test")}
    out = []
    for stage in stages:
        predictions = {i: c[0] for i, c in read_results(run / stage / "captions_test.json").items()}
        _, items = evaluate_items(predictions, references, metrics=metric)
        out.append({i: scores[key] for i, scores in items.items()})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="run directories holding <stage>/captions_test.json")
    p.add_argument("--a", required=True, help="stage A")
    p.add_argument("--b", required=True, help="stage B")
    p.add_argument("--metric", default="cider", help="finecap eval metric group (default cider)")
    p.add_argument("--key", default="CIDEr-D", help="the score of the group to compare (default CIDEr-D)")
    p.add_argument("--draws", type=int, default=10_000)
    args = p.parse_args(argv)
    print(f"| run | {args.key} {args.a} | {args.key} {args.b} | {args.a} − {args.b} | 95% interval over test images |")
    print("| --- | --- | --- | --- | --- |")
    for run in map(Path, args.runs):
        a, b = stage_items(run, [args.a, args.b], args.metric, args.key)
        ids = list(a)
        mean, low, high = paired_bootstrap([a[i] - b[i] for i in ids], draws=args.draws)
        print(f"| {run} | {np.mean([a[i] for i in ids]):.3f} | {np.mean([b[i] for i in ids]):.3f} | {mean:+.3f} | "
              f"[{low:+.3f}, {high:+.3f}] |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
