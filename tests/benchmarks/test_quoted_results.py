"""The numbers README.md, docs/results.md, docs/methods/*.md and the benchmarks' docstrings quote from the committed
results, recomputed from those files with the benchmarks' own summarising code and compared at the printed precision:
the demo's results of world seed 0 (``benchmarks/results/effects/seed0.json``), the headline effects over world and
run seeds (``effects.py``; the methods pages' quotes of them too), DiscriTune's listener gains per world seed, the
paired-bootstrap table of SLE − SCST (``paired_difference.py`` over the seed files and the exploration grid's
per-image values), the 12 SLE/SCST pairs (``training_noise.py``'s table over the seed files and ``run_seeds/``), SLE
against SCST to the validation peak (``sle_vs_scst.py`` over ``benchmarks/results/sle_vs_scst/``) and the ratio of
retraining to test-split noise (``paper_tables/verdicts.py``). A re-run that changes the files, or an edit of a
quoted number, fails here, naming the page and the cell."""

from __future__ import annotations

import ast
import json
import math
import re
import sys
from pathlib import Path

import pytest

from finecap.report.columns import format_value
from finecap.report.table import markdown_table as results_table
from helpers.markdown_tables import ascii_minus, markdown_rows, markdown_table
from helpers.scripts import benchmark

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
RESULTS_PAGE = ROOT / "docs" / "results.md"
WORLDS = (0, 1, 2)
WORDS = {0: "none", 1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}


def prose(path: Path) -> str:
    """A page's text with its line breaks and runs of spaces as one space and its minus signs as ``-``: a quoted
    sentence found whatever its wrapping."""
    return ascii_minus(re.sub(r"\s+", " ", path.read_text()))


@pytest.fixture(scope="module")
def effects():
    return benchmark("effects", neighbours=True)


@pytest.fixture(scope="module")
def committed(effects, tmp_path_factory):
    """The committed demo results of the three world seeds and their run-seed files, as ``effects.py
    --summarise-only`` reads them on a fresh clone, with its summary numbers."""
    results = effects.load_results(WORLDS, tmp_path_factory.mktemp("no-runs"), effects.STORE)
    replicates = effects.load_replicates(sorted(results), effects.STORE)
    table, numbers = effects.summarise(results, replicates)
    return results, replicates, table, numbers


# --- the demo's results of world seed 0: README's table and docs/results.md's -------------------------------------

README_COLUMNS = {
    "length": "Length", "distinct words": "Lexical diversity", "faith. precision": "faith/precision",
    "faith. recall": "faith/recall", "captions with a hallucination": "faith/halluc_rate",
    "**hardRD99 R@1**": "hardRD99/R@1", "family R@1": "family/R@1", "RD99 R@1": "RD99/R@1", "bag3 R@1": "bag3/R@1",
    "bag5 R@1": "bag5/R@1", "bag7 R@1": "bag7/R@1", "CLIPScore": "CLIPScore", "BLEU-4": "BLEU-4", "CIDEr-D": "CIDEr-D",
}  # fmt: skip
"""README's results columns: the demo's metric of each (its ``results.json`` keys)."""


def test_the_readmes_results_table_is_world_seed_0s_committed_results(committed):
    """README's headline table is the demo of world seed 0 (``seed0.json``): each cell as the demo's ``results.md``
    prints it (:func:`finecap.report.columns.format_value`), but the length with two decimals."""
    seed0 = committed[0][0]
    rows = markdown_rows(README.read_text(), "## Results")
    assert len(rows) >= 11 and set(rows[0]) == {"stage", *README_COLUMNS}
    for row in rows:
        stage = row["stage"]
        assert stage in seed0, f"README.md, results: no stage {stage!r} in seed0.json"
        for column, key in README_COLUMNS.items():
            value = seed0[stage][key]
            expected = f"{value:.2f}" if key == "Length" else format_value(value, key)
            assert row[column] == expected, (
                f"README.md, results, {stage}, {column}: {row[column]!r}, seed0.json {value}"
            )


def test_the_results_pages_hard_rd_table_is_world_seed_0s_committed_results(committed):
    """docs/results.md's table of the default demo with the hard RD is ``seed0.json`` as the demo's ``results.md``
    prints it (:func:`finecap.report.table.markdown_table`), row by row, and the sentence under it quotes its
    extremes."""
    seed0 = committed[0][0]
    text = RESULTS_PAGE.read_text()
    header, *rows = markdown_table(text, "## The default demo with the hard RD (issue 35)")
    printed = results_table({row[0]: seed0[row[0]] for row in rows}, columns=header[1:]).splitlines()
    page = [line for line in text.splitlines() if line.startswith("| ")]
    start = page.index(printed[0])
    assert len(rows) >= 12
    for ours, theirs in zip(printed, page[start : start + len(printed)], strict=True):
        assert ours == theirs, f"docs/results.md, the hard RD table: {theirs!r}, seed0.json gives {ours!r}"
    self_retrieval = ("discritune", "sr_bagcurri")
    hard = max(seed0[s]["hardRD99/R@1"] for s in self_retrieval)
    rd = max(seed0[s]["RD99/R@1"] for s in self_retrieval)
    assert f"below 0.90 on hardRD99 (at most {hard:.3f}) where RD99 reaches {rd:.3f}" in prose(RESULTS_PAGE)


README_EFFECTS = {
    "SMILE length, smile / mle (> 1)": "SMILE length ratio (smile / mle)",
    "SMILE RD99 R@1, smile - mle (> 0)": "SMILE RD99 R@1 gain (smile - mle)",
    "SMILE hardRD99 R@1, smile - mle (> 0)": "SMILE hardRD99 R@1 gain (smile - mle)",
    "SCST sampled Div-2, scst - mle (< 0)": "SCST sample Div-2 change (collapse)",
    "SLE sampled Div-2, sle - scst (> 0)": "SLE sample Div-2 recovery (sle - scst)",
    "SLE CIDEr-D, sle - scst (paper: {paper} here)": "SLE CIDEr-D change (sle - scst)",
    "DiscriTune RD99 R@1, - mle (> 0)": "DiscriTune RD99 R@1 gain (discritune - mle)",
    "DiscriTune hardRD99 R@1, - mle (> 0)": "DiscriTune hardRD99 R@1 gain (discritune - mle)",
    "SR-LV + BagCurri bag R@1 (3/5/7), - mle (> 0)": "SR-LV+BagCurri bag R@1 gain (mean of 3/5/7)",
    "SR-LV + BagCurri hardRD99 R@1, - mle (> 0)": "SR-LV+BagCurri hardRD99 R@1 gain (sr_bagcurri - mle)",
    "BLIP SMILE length, blip_smile / blip_mle (> 1)": "BLIP SMILE length ratio (blip_smile / blip_mle)",
}
"""README's names of the headline effects: the name ``effects.py`` prints for each."""


def test_the_version_3_sections_sle_minus_scst_is_world_seed_0s(committed):
    """docs/results.md's issue-26 paragraph quotes SLE − SCST beam CIDEr-D of world seed 0, whose CIDEr-D columns
    ``seed0.json`` keeps (the hard-RD section says they equal the 2026-11-23 run's): the difference of the unrounded
    scores, not of the printed 1.740 and 1.707."""
    sle, scst = (committed[0][0][stage]["CIDEr-D"] for stage in ("sle", "scst"))
    assert f"the paper's sign, {sle - scst:+.3f} ({sle:.4f} - {scst:.4f})" in prose(RESULTS_PAGE)


def test_the_readmes_headline_effects_are_what_effects_py_prints(effects, committed):
    """README's effects table: seed 0's value, the mean ± sd over the world seeds and the interval over world and run
    seeds as ``effects.py --summarise-only`` prints them (its ``(runs)`` written ``, 12 runs`` where the run seeds add
    runs), the verdict its word (the SLE non-reproduction's: ``no gain, not excluded`` while ``--check`` says its
    interval does not exclude the paper's gain, which the name quotes on the world's scale)."""
    results, _, table, numbers = committed
    printed = {row["effect"]: row for row in markdown_rows(table, "| effect |")}
    failed = effects.headline_failures(numbers, effects.distractor_count(results), results)
    paper = f"{effects.sle_paper_gain(results):+.3f}"
    rows = markdown_rows(ascii_minus(README.read_text()), "**The headline effects**")
    assert [row["effect (the paper's direction)"] for row in rows] == [n.format(paper=paper) for n in README_EFFECTS]
    for row, name in zip(rows, README_EFFECTS.values(), strict=True):
        ours = printed[name]
        interval, runs = re.fullmatch(
            r"(\[.*\]) \((\d+)\)", ours["95% interval over world and run seeds (runs)"]
        ).groups()
        if int(runs) > len(WORLDS):
            interval += f", {runs} runs"
        verdict = ours["verdict"]
        if name in effects.NON_REPRODUCTIONS:
            excluded = not any(f.startswith(name) and "does not exclude" in f for f in failed)
            verdict = "no gain, " + ("excluded" if excluded else "not excluded") if verdict != "holds" else verdict
        expected = {"seed 0": ours["seed 0"], "3 world seeds": ours["mean ± std"],
                    "95% interval, world and run seeds": interval, "verdict": verdict}  # fmt: skip
        for column, cell in expected.items():
            assert row[column] == cell, f"README.md, headline effects, {name}, {column}: {row[column]!r}, not {cell!r}"


# --- SLE against SCST in 12 runs (docs/results.md, "Training noise") --------------------------------------------

TRAINING_NOISE = "### Training noise: SLE against SCST in 12 runs"


@pytest.fixture(scope="module")
def twelve_runs(committed):
    """``training_noise.py``'s table of the 12 committed pairs (world seed N's run seed 0 from ``seed<N>.json``, run
    seeds 1-3 from ``run_seeds/``): ``{(world, run): cells}`` and ``{world or "all": summary cells}``."""
    tn = benchmark("training_noise")
    results, replicates, _, _ = committed
    rows = []
    for world in WORLDS:
        runs = {0: results[world], **replicates[world]}
        rows += [(str(world), str(run), {s: {m: runs[run][s][m] for m in tn.METRICS} for s in ("sle", "scst")})
                 for run in sorted(runs)]  # fmt: skip
    text = tn.summarise(rows, "sle", "scst")
    (header, *pairs), (_, *groups) = markdown_table(text, "| source |"), markdown_table(text, "| runs |")
    assert len(header) == 8 and len(pairs) == 12
    return {(int(r[0]), int(r[1])): r[2:] for r in pairs}, {r[0]: r[2:] for r in groups}


def within_a_unit(page: str, ours: str) -> bool:
    """Whether a difference the page computed from the unrounded scores is one the committed scores, transcribed to
    three decimals, allow: at most 0.001 from their difference."""
    return abs(float(page) - float(ours)) <= 0.001 + 1e-9


def test_the_12_run_table_is_what_the_committed_pairs_give(twelve_runs):
    """Each pair's CIDEr-D of SLE and SCST, and the sampled Div-2 of run seeds 1-3, equal the committed files'; run
    seed 0's differences too. The differences of run seeds 1-3 were computed from the unrounded scores, whose run
    folders were not kept (``run_seeds/README.md``): each is within 0.001 of the files' difference, the most their
    three decimals allow. Run seed 0's sampled Div-2 is the 2026-11-23 run's, before the issue-35 re-run that the
    committed files hold (the page says so, quoting the files' values: the next test)."""
    pairs, _ = twelve_runs
    rows = markdown_table(ascii_minus(RESULTS_PAGE.read_text()), TRAINING_NOISE)[1:]
    assert len(rows) == 12
    for row in rows:
        world, run = int(row[0]), int(row[1].split()[0])
        ours, page = pairs[world, run], row[2:]
        where = f"docs/results.md, 12 runs, world {world} run seed {run}"
        assert page[:2] == ours[:2], (where, "CIDEr-D", page[:2], ours[:2])
        if run == 0:
            assert page[2] == ours[2], (where, "CIDEr-D difference", page[2], ours[2])
        else:
            assert page[3:5] == ours[3:5], (where, "sampled Div-2", page[3:5], ours[3:5])
            for i in (2, 5):
                assert within_a_unit(page[i], ours[i]), (where, "difference", page[i], ours[i])


def test_the_12_run_summary_and_what_the_page_says_of_it(twelve_runs, committed, effects):
    """The summary rows: the counts of runs at or above 0 as the files give them, CIDEr-D's mean and sd within 0.001
    (the page's are of the unrounded differences); the numbers quoted from the files (the run-seed-0 Div-2 of the
    committed effects files, the 12 runs' Div-2 and CIDEr-D summaries, the SCST spread on world 0, how many pairs
    fall below) exactly, on docs/results.md, methods/sle.md and in ``effects.py``'s non-reproduction."""
    pairs, groups = twelve_runs
    summary = markdown_table(ascii_minus(RESULTS_PAGE.read_text()), "| runs | n |")[1:]
    assert [r[0] for r in summary] == ["world seed 0", "world seed 1", "world seed 2", "all"]
    for row in summary:
        ours = groups[row[0].removeprefix("world seed ")]
        assert row[1] == str(12 if row[0] == "all" else 4)
        page_cider, ours_cider = (re.fullmatch(r"(\S+) ± (\S+), (\d+/\d+)", c).groups() for c in (row[2], ours[0]))
        assert page_cider[2] == ours_cider[2], (row[0], "CIDEr-D runs >= 0", page_cider, ours_cider)
        assert all(within_a_unit(p, o) for p, o in zip(page_cider[:2], ours_cider[:2], strict=True)), (
            row[0],
            page_cider,
        )
        assert row[3].rsplit(", ", 1)[1] == ours[1].rsplit(", ", 1)[1], (row[0], "Div-2 runs >= 0", row[3], ours[1])
    text = prose(RESULTS_PAGE)
    div2 = [pairs[w, 0][3:6] for w in WORLDS]
    assert (f"give their sampled Div-2 as {div2[0][0]} / {div2[0][1]} ({div2[0][2]}), {div2[1][2]} and {div2[2][2]}, "
            f"and the 12-run Div-2 row {groups['all'][1].split(',')[0]}, whose mean") in text  # fmt: skip
    cider, count = groups["all"][0].split(", ")
    above, n = map(int, count.split("/"))
    all_div2 = groups["all"][1].split(", ")[1]
    assert f"sampled Div-2 above SCST's in {all_div2.replace('/', ' runs of ')}." in text
    table = {(int(r[0]), int(r[1].split()[0])): r[2:] for r in markdown_table(ascii_minus(RESULTS_PAGE.read_text()),
                                                                               TRAINING_NOISE)[1:]}  # fmt: skip
    assert f"twice on world 2 far below ({table[2, 1][2]}, {table[2, 2][2]})." in text  # the table's, checked above
    assert f"run seed 1 loses {table[2, 1][2][1:]} at" in text and f"run seed 3 gains {table[1, 3][2][1:]} at" in text
    mle = committed[0][2]["mle"]["CIDEr-D"]
    assert f"below their MLE start ({pairs[2, 1][0]} and {pairs[2, 2][0]}; the MLE start scores {mle:.3f})" in text
    discritune = committed[3]["DiscriTune hardRD99 R@1 gain (discritune - mle)"]["values"][1]
    assert f"DiscriTune's hard RD99 gain ({discritune:+.3f} on seed 1)" in text
    scst0 = [pairs[0, r][1] for r in range(4)]
    assert f"(SCST on world 0: {min(scst0)} to {max(scst0)})" in text
    assert f"over {n} pairs SLE's CIDEr-D is below SCST's in {n - above}," in text
    assert f"the demo's own run ({pairs[0, 0][2]}) is one of the {WORDS[above]} runs of twelve" in text
    interval = committed[3]["SLE CIDEr-D change (sle - scst)"]["interval"]
    assert f"shows no gain over {n} pairs ({interval[0]:+.3f} on the mean of the worlds)" in text
    why = effects.NON_REPRODUCTIONS["SLE CIDEr-D change (sle - scst)"].why
    assert f"{n} retrained SLE/SCST pairs" in why and f"mean difference of {cider} CIDEr-D" in why
    sle_page = prose(ROOT / "docs" / "methods" / "sle.md")
    div2_interval = committed[3]["SLE sample Div-2 recovery (sle - scst)"]["interval"]
    assert (f"SLE's Div-2 recovery over SCST holds over {n} runs ({div2_interval[0]:+.3f}, [{div2_interval[1]:+.3f}, "
            f"{div2_interval[2]:+.3f}])") in sle_page  # fmt: skip
    assert f"its CIDEr-D over SCST ({interval[0]:+.3f}, [{interval[1]:+.3f}, {interval[2]:+.3f}] over {n} runs)" in (
        sle_page
    )
    for name, quote in (("SCST CIDEr-D gain (scst - mle)", "SCST CIDEr-D {} and sampled Div-2"),
                        ("SCST sample Div-2 change (collapse)", "and sampled Div-2 {} over MLE hold"),
                        ("SLE sample mBLEU-4 change (sle - scst)", "its sampled mBLEU-4 fall ({})")):  # fmt: skip
        mean, low, high = committed[3][name]["interval"]
        spread = (
            f"{mean:+.3f}, [{low:+.3f}, {high:+.3f}]" if "(" in quote else f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]"
        )
        assert quote.format(spread) in sle_page, ("docs/methods/sle.md", name, spread)


# --- SLE against SCST to the validation peak (docs/results.md, benchmarks/results/sle_vs_scst/) ------------------

PEAK = "### SLE against SCST to the validation peak (issue 35)"


@pytest.fixture(scope="module")
def peak():
    """``sle_vs_scst.py`` and its committed pairs (``{seed2-r<M>: result}``), with the tables it prints of them."""
    bench = benchmark("sle_vs_scst", neighbours=True)
    results = {p.stem: json.loads(p.read_text()) for p in sorted(bench.RESULTS.glob("seed2-r*.json"))}
    assert list(results) == [f"seed2-r{r}" for r in range(4)]
    return bench, results, bench.summarise(results)


def test_the_committed_summary_is_what_the_pairs_give(peak):
    bench, _, text = peak
    assert (bench.RESULTS / "summary.md").read_text() == text + "\n"


def test_the_results_pages_validation_peak_tables_are_the_pairs(peak):
    """docs/results.md's two tables of the validation-selected pairs are ``sle_vs_scst.py``'s: test CIDEr-D, SLE −
    SCST with its bootstrap interval over the test images, the Div-2 difference, the best steps, the mean over the run
    seeds with its t-interval and count; then each stage's best, last and evaluations below the MLE start (``6 of 16
    (from step 125)`` on the page for the script's ``6/16 (from 125)``), and that start."""
    _, results, text = peak
    page = ascii_minus(RESULTS_PAGE.read_text())
    printed = {row[0]: row[1:] for row in markdown_table(text, "| run | CIDEr-D SLE |")[1:]}
    over = {row[0]: row[2:] for row in markdown_table(text, "| over run seeds |")[1:]}
    rows = markdown_table(page, PEAK)[1:]
    assert len(rows) == 5
    for row in rows[:4]:
        assert row[1:6] == printed[f"seed2-r{row[0]}"][:5], ("docs/results.md, validation peak, run seed", row[0])
    mean = rows[4][3:5]
    for cell, label in zip(mean, ("CIDEr-D SLE − SCST", "Div-2 (rs) SLE − SCST"), strict=True):
        spread, interval, count = over[label]
        assert cell == f"{spread} ({interval}), {count} ≥ 0", ("docs/results.md, validation peak, mean", label)
    curves = {row[0]: row[1:] for row in markdown_table(text, "| run | MLE start |")[1:]}
    rows = markdown_table(page, "Validation CIDEr-D of the same runs")[1:]
    assert len(rows) == 4
    for row in rows:
        cells = [re.sub(r"(\d+) of (\d+)", r"\1/\2", c).replace("from step ", "from ").replace("(at ", "(from ")
                 for c in row[1:]]  # fmt: skip
        assert cells == curves[f"seed2-r{row[0]}"][1:], ("docs/results.md, validation curves, run seed", row[0])
    (start,) = {c[0] for c in curves.values()}
    assert f"Validation CIDEr-D of the same runs (the MLE start both train from: {start}):" in page


def test_what_the_results_page_says_of_the_validation_peak(peak, effects):
    """The bullets under those tables and the 12-run section's account of world 2's dips: best steps, plateau flags,
    runs below 1.50 and the lowest value, the runs below SCST beyond the test split's noise, the paper's gain at this
    level (``effects.sle_paper_gain``), Div-2's count, the curves of run seeds 1 and 2 and the evaluations below the
    start; and ``effects.py``'s and methods/sle.md's quotes of the mean."""
    _, results, text = peak
    page = prose(RESULTS_PAGE)
    validation = [r["validation"][s] for r in results.values() for s in ("sle", "scst")]
    steps = sorted(v["best_step"] for v in validation)
    runs = WORDS[len(validation)]
    assert f"reaches its best validation CIDEr-D at step {steps[0]}-{steps[-1]}" in page
    assert all(v["plateau"] for v in validation) and f"is yes for all {runs}," in page
    lows = [min(v for _, v in r["curves"][s]) for r in results.values() for s in ("sle", "scst")]
    below = sum(low < 1.50 for low in lows)
    assert f"below 1.50 at some evaluation in {WORDS[below]} of the {runs} runs, lowest {min(lows):.3f})" in page
    over = {row[0]: row[2:] for row in markdown_table(text, "| over run seeds |")[1:]}
    spread, interval, count = over["CIDEr-D SLE − SCST"]
    differences = [r["cider_difference"] for r in results.values()]
    beyond = [sum(d["high"] < 0 for d in differences), sum(d["low"] > 0 for d in differences)]  # below, above
    assert (f"{spread} over the four run seeds, 95% interval {interval}; {WORDS[beyond[0]]} run is below SCST beyond "
            f"its test split's noise, {WORDS[beyond[1]]} above") in page  # fmt: skip
    gain = effects.sle_paper_gain({i: r["stages"] for i, r in enumerate(results.values())})
    high = float(re.findall(r"[-+]\d\.\d+", interval)[-1])
    assert f"would be about {gain:+.3f} at this level, outside the interval" in page and high < gain
    div2_spread, _, div2_count = over["Div-2 (rs) SLE − SCST"]
    assert f"above SCST's in {div2_count.replace('/', ' of ')} runs, {div2_spread}," in page
    why = effects.NON_REPRODUCTIONS["SLE CIDEr-D change (sle - scst)"].why
    assert f"gave {spread}, 95% interval over run seeds {interval}" in why
    sle_page = prose(ROOT / "docs" / "methods" / "sle.md")
    assert (f"SLE - SCST CIDEr-D is {spread} (95% interval {interval}, {WORDS[beyond[0]]} run below beyond its "
            f"test split's noise, {WORDS[beyond[1]]} above; the interval excludes the paper's {gain:+.3f} at this "
            "level) and "
            f"sampled Div-2 {div2_spread} ({div2_count.replace('/', ' of ')} runs above; the interval, "
            f"{over['Div-2 (rs) SLE − SCST'][1]}, includes zero") in sle_page  # fmt: skip
    grid = ROOT / "docs" / "reproductions" / "data" / "sle"
    metrics = {(s, run): json.loads((grid / f"seed{s}" / f"{run}.json").read_text())["metrics"]["sample/Div-2"]
               for s in (0, 1) for run in ("sle_val", "scst_val")}  # fmt: skip
    selected = {f"{metrics[s, 'sle_val'] - metrics[s, 'scst_val']:+.3f}" for s in (0, 1)}
    (selected,) = selected  # both world seeds' run-seed-0 pair give it
    assert f"validation-selected pair (two worlds, one run seed each) found {selected}, beyond" in page
    start = f"{next(iter(results.values()))['validation_start']:.3f}"
    a, b = (dict(results[f"seed2-r{r}"]["curves"]["sle"]) for r in (1, 2))
    assert (f"peaks at step 50 ({a[50]:.3f} and {b[50]:.3f}, against the MLE start's {start} on the same 500 "
            f"images), falls below the start by step 100 ({a[100]:.3f} and {b[100]:.3f}) and is back above it by "
            f"step 125-150 ({a[125]:.3f}, then {a[150]:.3f}; {b[125]:.3f}, then {b[150]:.3f})") in page  # fmt: skip
    dips = {s: sum(v < r["validation_start"] for r in results.values() for _, v in r["curves"][s]) for s in
            ("sle", "scst")}  # fmt: skip
    total = sum(len(r["curves"]["sle"]) for r in results.values())
    assert (
        f"SLE more often: {dips['sle']} of its {total} evaluations below the start against SCST's {dips['scst']})"
        in page
    )


# --- the ratio of retraining noise to test-split noise (paper_tables/verdicts.py) --------------------------------


def constant_docstring(path: Path, name: str) -> str:
    """The docstring under a module-level constant ``name`` of ``path`` (the string right after its assignment)."""
    body = ast.parse(path.read_text()).body
    i = next(i for i, n in enumerate(body) if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == name)
    return re.sub(r"\s+", " ", body[i + 1].value.value)


def test_run_to_test_noise_is_what_the_committed_runs_give(twelve_runs, committed):
    """``verdicts.RUN_TO_TEST_NOISE`` and its docstring: the run-to-run sd of SLE − SCST within each world seed (the
    12 committed pairs, ``paired_difference.mean_std``) over the standard error of the same difference over the
    test images of one run (sd/√n of the per-image differences of the exploration grid's ``sle`` and ``scst`` runs,
    ``docs/reproductions/data/sle/seed<N>/``): the smallest spread over the largest error to the largest over the
    smallest, for beam CIDEr-D (the constant) and sampled Div-2."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from paired_difference import mean_std
    from paper_tables import verdicts

    results, replicates, _, _ = committed
    grid = ROOT / "docs" / "reproductions" / "data" / "sle"
    doc = constant_docstring(ROOT / "benchmarks" / "paper_tables" / "verdicts.py", "RUN_TO_TEST_NOISE")
    quoted = {}
    for metric in ("CIDEr-D", "sample/Div-2"):
        spreads = []
        for world in WORLDS:
            runs = [results[world], *replicates[world].values()]
            spreads.append(mean_std([r["sle"][metric] - r["scst"][metric] for r in runs])[1])
        errors = []
        for seed in (0, 1):
            sle, scst = (json.loads((grid / f"seed{seed}" / f"{run}.items.json").read_text())["groups"][0]
                         for run in ("sle", "scst"))  # fmt: skip
            assert sle["ids"] == scst["ids"]
            d = [a - b for a, b in zip(sle["values"][metric], scst["values"][metric], strict=True)]
            errors.append(mean_std(d)[1] / math.sqrt(len(d)))
        low, high = min(spreads) / max(errors), max(spreads) / min(errors)
        quoted[metric] = (f"{min(spreads):.3f}-{max(spreads):.3f}", f"{errors[0]:.4f} and {errors[1]:.4f}",
                          f"{low:.1f}-{high:.1f}", (round(low, 1), round(high, 1)))  # fmt: skip
    cider, div2 = quoted["CIDEr-D"], quoted["sample/Div-2"]
    assert cider[3] == verdicts.RUN_TO_TEST_NOISE
    assert f"beam CIDEr-D {cider[0]} over four run seeds on each of three worlds, sampled Div-2 {div2[0]}," in doc
    assert f"CIDEr-D {cider[1]}, Div-2 {div2[1]})" in doc
    assert f"to the largest over the smallest: {cider[2]} times for CIDEr-D, {div2[2]} for Div-2" in doc


# --- what docs/results.md quotes per world seed: DiscriTune's listener, the paired-bootstrap table ---------------


def signed(values) -> list[str]:
    """An effect's per-world-seed values as the pages print them: three decimals with their sign."""
    return [f"{values[w]:+.3f}" for w in WORLDS]


def test_the_results_pages_discritune_listener_quotes_are_the_committed_seeds(committed):
    """The 2026-11-24 numbers of DiscriTune's exploitation the page gives in two places (what the default demo shows,
    and the per-stage paragraph of the listener section): the listener's and the retriever's RD99 gains and the change
    of ``exploit`` on each world seed, and the mean bag gains over bags of 3/5/7, as ``effects.py`` computes them from
    ``seed<N>.json``; the two sentences' "more than the retriever in bags on every seed" is checked on them."""
    numbers = committed[3]
    listener, retriever, exploit = (signed(numbers[name]["values"]) for name in (
        "discritune listener RD99 R@1 gain", "DiscriTune RD99 R@1 gain (discritune - mle)",
        "discritune RD99 exploit change (retriever-only firsts)"))  # fmt: skip
    page = prose(RESULTS_PAGE)
    assert (f"seed 0 listener {listener[0]}, retriever {retriever[0]}, exploit {exploit[0]}; seed 1 {listener[1]}, "
            f"{retriever[1]}, {exploit[1]} (the exploiting one); seed 2 {listener[2]}, {retriever[2]}, "
            f"{exploit[2]}.") in page  # fmt: skip
    assert f"retriever {' / '.join(retriever)}, listener {' / '.join(listener)} on seeds 0 / 1 / 2" in page
    bags = {name: numbers[name]["values"] for name in ("discritune listener bag R@1 gain (mean of 3/5/7)",
                                                       "DiscriTune bag R@1 gain (mean of 3/5/7)")}  # fmt: skip
    (listener_bags, retriever_bags) = bags.values()
    assert all(listener_bags[w] > retriever_bags[w] for w in WORLDS)
    assert (f"mean over bags of 3/5/7 {' / '.join(signed(listener_bags))} against "
            f"{' / '.join(signed(retriever_bags))}") in page  # fmt: skip
    assert exploit[1].startswith("+") and exploit[0].startswith("-") and exploit[2].startswith("-")


def test_the_paired_bootstrap_table_and_the_seed_interval_are_the_committed_runs(committed):
    """docs/results.md's "Test split or training?": the effects seeds' SLE and SCST beam CIDEr-D and their difference
    (``seed<N>.json``), the exploration grid's rows with their 95% paired-bootstrap interval over the test images
    (``paired_difference.paired_bootstrap`` of the per-image differences in ``docs/reproductions/data/sle/seed<N>/``),
    the grid's sampled Div-2 differences the paragraph above quotes, the t-interval over the three world seeds and
    SCST − MLE on each. The effects rows' intervals need per-image values the committed files lack: unchecked."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from paired_difference import paired_bootstrap, t_interval

    results = committed[0]
    text = ascii_minus(RESULTS_PAGE.read_text())
    rows = {row[0]: row[1:] for row in markdown_table(text, "**Test split or training?**")[1:]}
    differences = []
    for world in WORLDS:
        sle, scst = (results[world][s]["CIDEr-D"] for s in ("sle", "scst"))
        differences.append(sle - scst)
        label = "effects seed 0 (the demo)" if world == 0 else f"effects seed {world}"
        assert rows[label][:3] == [f"{sle:.3f}", f"{scst:.3f}", f"{sle - scst:+.3f}"], (label, rows[label])
    grid = ROOT / "docs" / "reproductions" / "data" / "sle"
    div2 = []
    for seed in (0, 1):
        metrics = {s: json.loads((grid / f"seed{seed}" / f"{s}.json").read_text())["metrics"] for s in ("sle", "scst")}
        items = [json.loads((grid / f"seed{seed}" / f"{s}.items.json").read_text())["groups"][0]
                 for s in ("sle", "scst")]  # fmt: skip
        assert items[0]["ids"] == items[1]["ids"]
        per_image = [a - b for a, b in zip(*(i["values"]["CIDEr-D"] for i in items), strict=True)]
        _, low, high = paired_bootstrap(per_image)
        sle, scst = (metrics[s]["CIDEr-D"] for s in ("sle", "scst"))
        expected = [f"{sle:.3f}", f"{scst:.3f}", f"{sle - scst:+.3f}", f"[{low:+.3f}, {high:+.3f}]"]
        assert rows[f"exploration grid, world {seed}"] == expected, (seed, rows[f"exploration grid, world {seed}"])
        div2.append(f"{metrics['sle']['sample/Div-2'] - metrics['scst']['sample/Div-2']:+.3f}")
    page = prose(RESULTS_PAGE)
    cider = [rows[f"exploration grid, world {s}"][2] for s in (0, 1)]
    assert f"beam CIDEr-D {cider[0]} and {cider[1]}, sampled Div-2 {div2[0]} and **{div2[1]}**" in page
    mean, low, high = t_interval(differences)
    assert f"(+0.002 ± 0.033; 95% interval over the seeds [{low:+.3f}, {high:+.3f}])" in page
    scst_gain = ", ".join(f"{results[w]['scst']['CIDEr-D'] - results[w]['mle']['CIDEr-D']:+.3f}" for w in WORLDS)
    assert f"is {scst_gain} on the three effects seeds" in page


# --- the methods pages' effects over world seeds ------------------------------------------------------------------

METHODS_EFFECTS = {
    "smile": {
        "SMILE length ratio (smile / mle)": ("length ×{} [{}, {}]", "holds"),
        "SMILE hardRD99 R@1 gain (smile - mle)": ("hard RD99 {} [{}, {}] and RD99", "holds"),
        "SMILE RD99 R@1 gain (smile - mle)": ("and RD99 {} [{}, {}] over MLE", "holds"),
        "SMILE hardRD99 R@1 gain over mle_continued": ("hard RD99 {} [{}, {}] over as many further MLE", "holds"),
        "SMILE faith. precision change": ("precision {} [{}, {}] hold;", "holds"),
        "SMILE RD99 R@1 gain over mle_continued": ("RD99 over further MLE, {} [{}, {}], is within noise", "noise"),
        "BLIP SMILE hardRD99 R@1 gain (blip_smile - blip_mle)": ("On BLIP hard RD99 {} [{}, {}]", None),
        "VLM SMILE hardRD99 R@1 gain (vlm_smile - vlm_mle)": ("on the world VLM {} [{}, {}]", None),
    },
    "discritune": {
        "DiscriTune RD99 R@1 gain (discritune - mle)": ("RD99 {} [{}, {}] holds", "holds"),
        "DiscriTune hardRD99 R@1 gain (discritune - mle)": ("hard RD99 {} [{}, {}] (", "noise"),
        "DiscriTune family R@1 gain (discritune - mle)": ("family R@1 {} [{}, {}] (", "noise"),
        "DiscriTune CIDEr-D change": ("CIDEr-D {} [{}, {}] and precision", "noise"),
        "DiscriTune faith. precision change": ("precision {} [{}, {}] have the paper's sign", "noise"),
    },
    "ndlb": {
        "SR-LV+BagCurri hardRD99 R@1 gain (sr_bagcurri - mle)": ("hard RD99 {} [{}, {}], family", "holds"),
        "SR-LV+BagCurri family R@1 gain (sr_bagcurri - mle)": ("family R@1 {} [{}, {}] and recall", "holds"),
        "SR-LV+BagCurri faith. recall change": ("recall {} [{}, {}] hold;", "holds"),
        "SR-LV+BagCurri bag R@1 gain (mean of 3/5/7)": ("the bag R@1 gain {} [{}, {}] and the", "noise"),
        "SR-LV+BagCurri faith. precision change": ("precision cost {} [{}, {}] are within noise", "noise"),
    },
}
"""Each methods page's quote of an effect over world seeds 0-2 (``effects.py``'s name: the words around the mean and
its 95% interval, and the verdict the page's sentence gives it: ``holds``, ``noise`` for "within noise", ``None``
where it gives none)."""


@pytest.mark.parametrize("paper", sorted(METHODS_EFFECTS))
def test_the_methods_pages_effects_over_world_seeds_are_what_effects_py_gives(committed, paper):
    """docs/methods/<paper>.md's "Effects on world seeds 0-2": each effect's mean and 95% interval as ``effects.py``
    computes them from the committed files (a ratio to two decimals, a difference to three with its sign), and the
    verdict the sentence gives it: "hold(s)" where the interval is past 0 (1 for a ratio), "within noise" where not;
    DiscriTune's page also its per-seed range of the hard RD99 gain and its smallest family R@1 gain."""
    numbers = committed[3]
    page = prose(ROOT / "docs" / "methods" / f"{paper}.md")
    for name, (quote, said) in METHODS_EFFECTS[paper].items():
        mean, low, high = numbers[name]["interval"]
        ratio = "ratio" in name
        cells = [f"{x:.2f}" if ratio else f"{x:+.3f}" for x in (mean, low, high)]
        assert quote.format(*cells) in page, (f"docs/methods/{paper}.md", name, quote.format(*cells))
        base = 1.0 if ratio else 0.0
        verdict = "holds" if low > base or high < base else "noise"
        assert said in (None, verdict), (f"docs/methods/{paper}.md", name, f"page: {said}, interval: {verdict}")
    if paper == "discritune":
        hard = numbers["DiscriTune hardRD99 R@1 gain (discritune - mle)"]["values"]
        family = numbers["DiscriTune family R@1 gain (discritune - mle)"]["values"]
        assert f"({min(hard.values()):+.3f} to {max(hard.values()):+.3f})" in page
        assert f"({family[1]:+.3f} on seed 1)" in page and family[1] == min(family.values())


# --- HolisticCap's conflict rule, before and after 2026-11-29 ------------------------------------------------------


def test_vcb_results_quotes_the_holistic_conflict_rule_record():
    """docs/vcb-results.md's note on the merge's conflict rule (and methods/ndlb.md's) against the record of
    benchmarks/holistic_conflict_rule.sh: captions changed, and HolisticCap's true and false facts per test caption
    under the old rule and the new."""
    record = json.loads((ROOT / "benchmarks/results/holistic_conflict_rule/2026-11-29.json").read_text())
    old, new = record["old"]["HolisticCap"], record["new"]["HolisticCap"]
    assert old["true facts"] == new["true facts"] and new["false facts"] < old["false facts"]
    changed, images = record["holistic_changed"], record["images"]
    test_changed, test_images = record["test_holistic_changed"], record["test_images"]
    was, now, true = old["false facts"], new["false facts"], new["true facts"]
    vcb = " ".join((ROOT / "docs" / "vcb-results.md").read_text().split())
    assert (
        f"{changed} of the {images:,} HolisticCaps change ({test_changed} of the {test_images:,} test images'); on "
        f"the test split HolisticCap's false facts per caption go from {was:.3f} to {now:.3f} and its true ones stay "
        f"{true:.3f} (the old rule's numbers are Table 2's {true:.2f} and {was:.2f} below)"
    ) in vcb
    ndlb = " ".join((ROOT / "docs" / "methods" / "ndlb.md").read_text().split())
    assert (
        f"{changed} of {images:,} captions change, the false facts per test caption go from {was:.2f} to {now:.2f} "
        f"and the true ones stay {true:.2f}"
    ) in ndlb
