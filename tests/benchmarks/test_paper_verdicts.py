"""The paper-tables verdict rule with its noise floor (benchmarks/paper_tables/verdicts.py) on constructed data: the
world difference of a row against another, per seed, against the 95% paired-bootstrap interval over the test images
(per-image values) and the seeds' t-interval."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # as `python benchmarks/paper_tables.py` has it
import paper_tables as pt  # noqa: E402  (the package benchmarks/paper_tables/)
from paper_tables import verdicts  # noqa: E402

# A two-row table: "b" judged against "a" on one column (CIDEr-D x 100). The paper's effect is set by its numbers:
# 100 -> 110 (a rise), 100 -> 100.2 (comparable: under the column's 0.5 points, judged as no change).
CIDER = pt.Column("CIDEr", "CIDEr-D", 100.0)
RISE = pt.Table("t", "constructed", (CIDER,), (pt.Row("a", "A", "scst", (100.0,)),
                                               pt.Row("b", "B", "sle", (110.0,), vs=("a",))))  # fmt: skip
SAME = pt.Table("t", "constructed", (CIDER,), (pt.Row("a", "A", "scst", (100.0,)),
                                               pt.Row("b", "B", "sle", (100.2,), vs=("a",))))  # fmt: skip
N = 200  # test images


def world(shifts: dict[int, float], noise: float = 0.5, with_items: bool = True) -> tuple[dict, dict]:
    """Results and per-image values of runs ``scst`` and ``sle`` on each seed: scst's per-image CIDEr-D is noise
    around 1.0, sle's is scst's plus ``shifts[seed]`` plus independent noise (sd ``noise``)."""
    results, items = {}, {}
    for seed, shift in shifts.items():
        rng = np.random.default_rng(seed)
        a = 1.0 + noise * rng.standard_normal(N)
        b = a + shift + noise * rng.standard_normal(N)
        ids = [str(i) for i in range(N)]
        results[seed] = {"scst": {"CIDEr-D": float(a.mean())}, "sle": {"CIDEr-D": float(b.mean())}}
        items[seed] = {
            "scst": {"CIDEr-D": dict(zip(ids, a.tolist(), strict=True))},
            "sle": {"CIDEr-D": dict(zip(ids, b.tolist(), strict=True))},
        }
    return results, items if with_items else {}


def verdict(table, shifts, **kwargs) -> str:
    results, items = world(shifts, **kwargs)
    return pt.row_verdict(table, table.rows[1], results, items)


def check(table, shifts, **kwargs) -> verdicts.Check:
    results, items = world(shifts, **kwargs)
    (only,) = verdicts.row_checks(table, table.rows[1], results, items)
    return only


def test_a_tiny_difference_is_within_noise():
    # +0.002 per image against per-image noise 0.5 on 200 images (standard error about 0.05): the interval covers 0
    assert check(RISE, {0: 0.002}).verdict == "within noise"
    assert verdict(RISE, {0: 0.002}).startswith("within noise: CIDEr ↑ within noise (per seed: within noise 1; Δ ")


def test_a_large_difference_holds_or_reverses():
    assert verdict(RISE, {0: 0.5}).startswith("holds: CIDEr ↑ holds (per seed: holds 1; Δ +")
    assert verdict(RISE, {0: -0.5}).startswith("reversed: CIDEr ↑ reversed (per seed: reversed 1; Δ -")
    # two seeds, both large and alike: every seed's interval and the seeds' t-interval exclude 0
    assert check(RISE, {0: 0.5, 1: 0.52}).verdict == "holds"


def test_a_comparable_paper_difference_is_judged_as_no_change():
    assert check(SAME, {0: 0.002}).paper_sign == 0
    # a row of no-change cells alone never "holds" (issue 54: row words come from directional cells)
    assert verdict(SAME, {0: 0.002}).startswith("unchanged within noise: CIDEr = holds (per seed: holds 1;")
    assert verdict(SAME, {0: 0.5}).startswith("changed: CIDEr = changed (per seed: changed 1;")
    # a row the paper's text calls unchanged (expect 0) is judged the same way
    stated = pt.Table("t", "constructed", (CIDER,), (pt.Row("a", "A", "scst"),
                                                     pt.Row("b", "B", "sle", vs=("a",), expect=(0,))))  # fmt: skip
    assert verdict(stated, {0: 0.5}).startswith("changed: CIDEr = changed")
    assert verdict(stated, {0: 0.0}).startswith("unchanged within noise: CIDEr = holds")


def test_without_per_image_values_one_seed_has_no_noise_estimate():
    assert verdict(RISE, {0: 0.5}, with_items=False).startswith("no noise estimate: CIDEr ↑ no noise estimate (Δ +")
    assert verdict(SAME, {0: 0.002}, with_items=False).startswith("no noise estimate: CIDEr = no noise estimate")


def test_two_seeds_with_opposite_significant_differences_do_not_hold():
    c = check(RISE, {0: 0.5, 1: -0.5})
    assert c.per_seed == ["holds", "reversed"] and c.verdict == "mixed"
    assert not verdict(RISE, {0: 0.5, 1: -0.5}).startswith(("holds", "partly holds"))


def test_the_seeds_spread_judges_alone_without_per_image_values_and_the_seeds_judge_with_them():
    # seeds only: differences of about 50 and 52 (x 100): mean about 51, sd about 1.4, t-interval with 1 degree of
    # freedom about 51 -/+ 12.706 * 1.4 / sqrt(2) = [38, 64]: excludes 0
    c = check(RISE, {0: 0.5, 1: 0.52}, with_items=False)
    assert c.intervals == {} and c.verdict == "holds"
    c = check(RISE, {0: 0.2, 1: 0.9}, with_items=False)  # a spread as large as the mean: within the seeds' spread
    assert c.verdict == "within the seeds' spread"
    # with per-image values both seeds hold on their own test splits: a replicated effect, whatever the seeds'
    # interval (one degree of freedom) says of its size, which the cell prints
    c = check(RISE, {0: 0.2, 1: 0.9})
    assert c.per_seed == ["holds", "holds"] and c.verdict == "holds"
    assert "per seed: holds 2; Δ +" in c.text() and ", 2 seeds)" in c.text()


def test_the_bootstrap_interval_is_the_paired_bootstrap_of_the_per_image_differences():
    """Hand check: the cell's interval is the 2.5% and 97.5% quantiles of the means of 2,000 resamples of the
    per-image differences (numpy generator seeded 0), computed here directly."""
    results, items = world({0: 0.1})
    (c,) = verdicts.row_checks(RISE, RISE.rows[1], results, items)
    a, b = items[0]["scst"]["CIDEr-D"], items[0]["sle"]["CIDEr-D"]
    d = np.array([100.0 * (b[i] - a[i]) for i in sorted(a)])  # (N,) in the paper's unit
    rng = np.random.default_rng(0)
    means = d[rng.integers(0, N, size=(verdicts.DRAWS, N))].mean(axis=1)  # (draws,)
    low, high = np.quantile(means, [0.025, 0.975])
    assert c.intervals[0] == pytest.approx((low, high), rel=1e-12)
    # the percentile interval is close to the normal one: mean -/+ 1.96 standard errors
    se = d.std(ddof=1) / np.sqrt(N)
    assert low == pytest.approx(d.mean() - 1.96 * se, abs=0.15 * se)
    assert c.differences[0] == pytest.approx(d.mean())  # the corpus difference is the mean per-image difference


def test_per_image_values_on_other_images_give_no_interval():
    results, items = world({0: 0.5})
    items[0]["sle"]["CIDEr-D"].pop("0")  # not the same test images: no paired interval
    (c,) = verdicts.row_checks(RISE, RISE.rows[1], results, items)
    assert c.intervals == {} and c.verdict == "no noise estimate"


def test_items_files_load_beside_the_result_files(tmp_path):
    """A run's ``<run>.items.json`` is read into the per-image values; old result files without one still load."""
    import json

    folder = tmp_path / "sle" / "seed0"
    folder.mkdir(parents=True)
    for run, value in (("scst", 1.0), ("sle", 1.5)):
        (folder / f"{run}.json").write_text(json.dumps({"metrics": {"CIDEr-D": value, "METEOR": 0.3}}))
    groups = [{"ids": [1, 2, 3], "values": {"CIDEr-D": [0.5, 1.5, None]}}]
    (folder / "sle.items.json").write_text(json.dumps({"groups": groups}))
    results, meta = pt.page.load_results(tmp_path, pt.SLE)
    assert set(results[0]) == {"scst", "sle"}  # the items file is not a run
    assert meta["items"] == {0: {"sle": {"CIDEr-D": {"1": 0.5, "2": 1.5}}}}


def test_item_groups_are_compact_and_deterministic():
    from paper_tables.evaluation import item_group

    per_image = {10: {"CIDEr-D": 1.234567, "BLEU-4": 0.5, "RD99/R@1": 1.0}, 2: {"CIDEr-D": 0.1, "Length": 9.0}}
    assert item_group(per_image, "shifted/") == {
        "ids": [10, 2],  # sorted as text
        "values": {"shifted/CIDEr-D": [1.235, 0.1], "shifted/Length": [None, 9], "shifted/RD99/R@1": [1, None]},
    }  # BLEU-4 left out: its corpus value is not the mean of the per-image values


def test_the_papers_choice_in_a_grid_is_judged_against_the_noise():
    # "sle" is the paper's choice among two rows; it beats "scst" by 0.5 per image (far beyond the noise), or by
    # nothing: best beyond noise, then within noise; "scst" chosen against a better "sle": another row is better
    grid = pt.Table("g", "constructed", (CIDER,), (pt.Row("a", "A", "scst"), pt.Row("b", "B (chosen)", "sle")),
                    best=pt.Best("CIDEr", "b"))  # fmt: skip
    results, items = world({0: 0.5, 1: 0.5})
    assert pt.page.best_verdict(grid, results, items).endswith(
        "holds by the mean; against the noise: best beyond noise."
    )
    results, items = world({0: 0.0, 1: 0.0}, noise=0.5)
    assert "against the noise: not shown better than A (within noise on 2 seeds)." in pt.page.best_verdict(
        grid, results, items
    )
    flipped = pt.Table("g", "constructed", (CIDER,), (pt.Row("a", "A (chosen)", "scst"), pt.Row("b", "B", "sle")),
                       best=pt.Best("CIDEr", "a"))  # fmt: skip
    results, items = world({0: 0.5, 1: 0.5})
    text = pt.page.best_verdict(flipped, results, items)
    assert "does not hold by the mean" in text and text.endswith("another row is better beyond noise: B.")
