"""The memory numbers docs/memory.md, docs/scaling.md and README.md quote, against what backs them: the forecast
tables are ``benchmarks/memory_forecast.py``'s output (from shapes alone, seconds), and the H200 rows are the
committed ``benchmarks/results/gpu_check_h200_<date>*.json`` records of each run (2026-11-26, 2026-11-28), so no page
can keep a number its source no longer gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.markdown_tables import table_lines
from helpers.scripts import benchmark

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def table_after(page: str, heading: str) -> list[str]:
    """The data rows of the first Markdown table after ``heading`` on ``page`` (docs/<page>), header left out."""
    return table_lines((ROOT / "docs" / page).read_text(), heading)


@pytest.fixture(scope="module")
def forecast():
    return benchmark("memory_forecast", neighbours=True)


def test_the_forecast_per_recipe_table_is_the_scripts(forecast):
    assert table_after("memory.md", "### Forecast per recipe") == forecast.table()[2:]


def test_the_h200_forecast_table_is_the_scripts_from_the_committed_records(forecast):
    assert table_after("memory.md", "**Against the first H200 run**") == forecast.h200()[2:]


def test_the_trained_tower_table_is_the_scripts_from_the_committed_records(forecast):
    assert table_after("memory.md", "### A trained vision tower") == forecast.h200_nov28()[2:]


def test_the_second_h200_runs_steps_are_rebuilt_exactly_and_forecast_within_a_quarter(forecast):
    """Each 2026-11-28 memory line's step as the script rebuilds it gives, with the vision tower counted frozen as it
    was that day, exactly the forecast parts the record holds (so "forecast now" is of the step the H200 measured):
    every part but the frozen tower's, and the frozen tower's as that day's count made it of the same patches
    (``(5h + 2i) w`` a patch, before ``frozen_tower_bytes``; without the pixels' copies, the prompt's embeddings and
    Idefics's int64 pixel mask, counted since), and the peak of those parts (the increment per image, a difference
    of two such peaks, is not rebuilt); the forecast now comes within a quarter of the measured peak on every
    line."""
    from dataclasses import replace

    from finecap.config import load
    from finecap.models.forecast import activation_forecast, frozen_tower_bytes, training_of

    vision = replace(forecast.SIGLIP_512, pixel_copy="none")  # the pixel values only, as that day's count
    for name, file, step in forecast.H200_NOV28:
        record = forecast.nov28_record(name, file)
        then = replace(training_of(load(f"coco/{name.split(':')[1]}")), tower="frozen", tower_targets=())
        parts = activation_forecast(forecast.SMOLVLM_NOV28, then, step, vision)
        rows = step.images if step.shared else step.images * step.captions  # the pass that runs the tower
        positions = step.prompt if step.shared else step.prompt + step.tokens - 1
        embedded = rows * positions * forecast.SMOLVLM_NOV28.hidden * then.weights_bytes  # its ids': counted since
        tower_then = parts["tower"] - embedded
        patches, rest = divmod(tower_then, frozen_tower_bytes(vision, then.weights_bytes, 1))  # no block mask
        assert rest == 0, name
        held = record["activation_forecast_bytes"]
        tower = patches * (5 * vision.hidden + 2 * vision.intermediate) * then.weights_bytes  # that day's count
        derived = ("tower", "peak", "per_image")
        assert {k: parts[k] for k in held if k not in derived} == {k: v for k, v in held.items() if k not in derived}
        assert held["tower"] == tower, name
        total = parts["lm"] + parts["mask"] + parts["vocab"] + parts["images"] + parts["tower_saved"]
        peak = max(total, tower + parts["images"] + parts["tower_saved"],
                   parts["tower_saved"] + parts["tower_backward"] + parts["images"], parts["reference"])  # fmt: skip
        assert held["peak"] == peak, name
        now = record["forecast_bytes"]["total"] + forecast.nov28_forecast(name, step)["peak"]
        assert 0.75 <= now / record["measured_peak_bytes"] <= 1.25, (name, now / record["measured_peak_bytes"])


FIRST, SECOND = "2026-11-26", "2026-11-28"
"""The H200 runs scaling.md reports, each under "### Measured: one H200, <date>"."""


def h200_record(name: str, date: str = FIRST) -> dict:
    for file in sorted(RESULTS.glob(f"gpu_check_h200_{date}*.json")):
        for check in json.loads(file.read_text())["checks"]:
            if check["name"] == name and check["status"] == "pass":
                return check
    raise AssertionError(f"no passing {name} in the committed H200 records of {date}")


def h200_rows(date: str) -> list[str]:
    return table_after("scaling.md", f"### Measured: one H200, {date}")


def h200_row(date: str, start: str) -> str:
    """The row of the run of ``date`` whose first cell starts with ``start``, bold marks removed."""
    return next(r for r in h200_rows(date) if r.startswith(f"| {start}")).replace("**", "")


def gib(value: float) -> str:
    """A peak as the page writes it: to 0.1 GiB, or 0.01 under 10 GiB."""
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


@pytest.mark.parametrize("name", ["memory:mle_vlm", "memory:smile_vlm", "memory:sr_l_vlm", "memory:grpo_cider_vlm"])
def test_scalings_h200_memory_rows_are_the_committed_records(name):
    """docs/scaling.md's "Measured: one H200" rows: batch, forecast, measured peak and step seconds as each record
    has them (the peak to 0.1 GiB, or 0.01 under 10 GiB as the page writes it)."""
    row = next(r for r in h200_rows(FIRST) if f"`{name}`" in r).replace("**", "")
    r = h200_record(name)
    peak = gib(r["measured_peak_gib"])
    for part in (f"batch {r['batch']}:", f"forecast {r['forecast_gib']:.2f} GiB", f" {peak} GiB",
                 f"{r['step_seconds']:.1f} s a step"):  # fmt: skip
        assert part in row, (name, part, row)


@pytest.mark.parametrize("date", [FIRST, SECOND])
def test_scalings_h200_grpo_row_is_the_committed_record(date):
    row = h200_row(date, "`grpo` |")
    r = h200_record("grpo", date)
    for part in (f"{r['seconds_per_step']:.2f} s a step", f"{r['captions_per_second']:.0f} sampled captions/s",
                 f"peak {r['peak_cuda_gib_steps_2_on']:.1f} GiB"):  # fmt: skip
        assert part in row, (part, row)


MEMORY_LINES = ("mle_vlm", "smile_vlm", "discritune_vlm", "sr_l_vlm", "sr_lv_bagcurri_vlm", "grpo_cider_vlm")


@pytest.mark.parametrize("recipe", MEMORY_LINES)
def test_scalings_second_h200_memory_rows_are_the_committed_records(recipe):
    """The 2026-11-28 rows: batch, the forecast with activations, the measured peak, their ratio and the step's seconds
    as each record has them; the one row under 0.75 is the one the page says fails by the rule."""
    row = h200_row(SECOND, f"`memory:{recipe}` |")
    r = h200_record(f"memory:{recipe}", SECOND)
    ratio = r["forecast_with_activations_gib"] / r["measured_peak_gib"]
    peak = gib(r["measured_peak_gib"])
    for part in (f"batch {r['batch']}:", f"forecast {r['forecast_with_activations_gib']:.2f} GiB",
                 f" {peak} GiB ({ratio:.2f})", f"{r['step_seconds']:.1f} s a step"):  # fmt: skip
        assert part in row, (recipe, part, row)
    assert ("`fail` by the rule" in row) == (ratio < 0.75), row


def test_scalings_second_h200_rows_name_every_check_of_the_run():
    """Every check of the 2026-11-28 run has its row (the families grouped), with the status its records give (a line
    measured in a rerun: the rerun's), and the families' numbers are theirs: the range of the float32 first-token
    difference, 4 of 4 greedy rows, 12 of 13 passed."""
    checks: dict[str, dict] = {}
    for file in sorted(RESULTS.glob(f"gpu_check_h200_{SECOND}*.json")):
        for check in json.loads(file.read_text())["checks"]:
            if check["status"] != "skipped" or check["name"] not in checks:
                checks[check["name"]] = check
    rows = h200_rows(SECOND)
    families = [c for n, c in checks.items() if n.startswith("family:") and c["status"] == "pass"]
    (group,) = [r for r in rows if r.startswith("| `family:*`")]
    assert f"{len(families)} of {len([n for n in checks if n.startswith('family:')])}" in group
    assert all(f"`{c['name'].split(':')[1]}`" in group for c in families)
    diffs = [c["parts"]["float32/sdpa"]["first_token_max_rel_diff"] for c in families]
    low, high = (f"{x:.1e}".replace("e-0", "e-") for x in (min(diffs), max(diffs)))
    assert f"{low} to {high} (float32" in group, group
    assert {c["parts"][p]["greedy_rows_equal"] for c in families for p in ("float32/sdpa", "bfloat16/sdpa")} == {"4/4"}
    for name, check in checks.items():
        if name.startswith("family:") and check["status"] == "pass" or name in ("env", "setup"):
            continue
        row = next((r for r in rows if f"`{name}`" in r.split(" | ")[0]), None)
        assert row is not None, name
        status, measured = row.split(" | ")[1], check["status"] == "pass"
        assert status.startswith("pass") if measured else status in ("skipped", "not run"), (name, row)
    qlora, fsdp2 = checks["qlora"], checks["fsdp2"]
    assert f"loss {qlora['loss']:.3f}, gradient norm {qlora['grad_norm']:.2f}" in h200_row(SECOND, "`qlora` |")
    losses = " -> ".join(f"{x:.3f}" for x in fsdp2["losses"])
    assert f"losses {losses} over two steps" in h200_row(SECOND, "`fsdp2` |")


def test_scalings_first_h200_prose_gives_the_forecast_as_it_stands(forecast):
    """The prose under the 2026-11-26 table restates, beside the numbers of when it was first compared, the forecast
    of the three measured steps as ``memory_forecast.py --h200`` gives it now: its total (GiB) and its ratio."""
    rows = [r.split(" | ") for r in forecast.h200()[2:]]
    now = [(r[0].strip("| `"), float(r[4]), float(r[6].strip(" |"))) for r in rows]
    [(_, mle, mle_ratio)], [(_, sr_l, sr_l_ratio)] = (
        [r for r in now if r[0] == f"memory:{n}"] for n in ("mle_vlm", "sr_l_vlm")
    )
    (_, grpo, grpo_ratio), (_, then, then_ratio) = [r for r in now if r[0] == "memory:grpo_cider_vlm"]
    stated = (f"{mle:.1f} GiB ({mle_ratio:.2f}), {sr_l:.1f} GiB ({sr_l_ratio:.2f}) and {grpo:.1f} GiB "
              f"({grpo_ratio:.1f}x)")  # fmt: skip
    text = " ".join((ROOT / "docs" / "scaling.md").read_text().split())
    assert f"as it stands now (`python benchmarks/memory_forecast.py --h200`), {stated}." in text, stated
    assert f"so forecast, the step comes to {then:.1f} GiB ({then_ratio:.1f}x;" in text, (then, then_ratio)


def test_the_forecast_per_recipe_prose_is_the_forecasts():
    """What docs/memory.md says under "Forecast per recipe": the 2B model's largest step and what the margin a claim
    to fit states makes of it, and full fine-tuning's range over the recipes at Qwen2-VL-2B's shapes with
    checkpointing on and off (``lora.lm=false``), the recipes that name the ends, and which fit 80 GB (74.5 GiB) with
    the margin (:func:`finecap.models.forecast.fits`): every recipe with checkpointing, none without, though MLE's and
    SMILE's forecasts alone are under the card's bytes."""
    from finecap.config import load
    from finecap.models.forecast import BACKBONES, GIB, OUTSIDE_ALLOCATOR, UNDER_FORECAST, fits, recipe_forecast

    def margin(total: float) -> float:  # GiB, what fits() holds to the card
        return total / UNDER_FORECAST + OUTSIDE_ALLOCATOR / GIB

    qwen = BACKBONES["Qwen2-VL-2B"]
    recipes = ("mle_vlm", "smile_vlm", "discritune_vlm", "sr_l_vlm", "sr_lv_bagcurri_vlm", "grpo_cider_vlm",
               "grpo_sr_cider_vlm")  # fmt: skip
    lora = {r: recipe_forecast(load(f"coco/{r}"), qwen)["total"] / GIB for r in recipes}
    on = {r: recipe_forecast(load(f"coco/{r}", ["lora.lm=false"]), qwen)["total"] / GIB for r in recipes}
    off = {r: recipe_forecast(load(f"coco/{r}", ["lora.lm=false", "train.gradient_checkpointing=false"]), qwen)
           for r in recipes}  # fmt: skip
    text = " ".join((ROOT / "docs" / "memory.md").read_text().split())
    largest = max(lora, key=lora.get)
    assert largest == "sr_lv_bagcurri_vlm"
    step = "largest step (`coco/sr_lv_bagcurri_vlm`, 100 images x 1 sample, its tower's adapters trained)"
    assert f"{step} is forecast at {lora[largest]:.1f} GiB" in text
    assert all(fits(total * GIB) for total in lora.values())
    assert (f"With that margin the largest, `coco/sr_lv_bagcurri_vlm` at Qwen2-VL-2B's shapes, comes to "
            f"{margin(lora[largest]):.1f} GiB.") in text  # fmt: skip
    assert f"`coco/grpo_sr_cider_vlm`'s 32 images x 8 samples at {lora['grpo_sr_cider_vlm']:.1f} GiB" in text
    totals_off = {r: f["total"] / GIB for r, f in off.items()}
    assert max(on, key=on.get) == max(totals_off, key=totals_off.get) == "sr_lv_bagcurri_vlm"
    assert (f"{min(on.values()):.0f}-{max(on.values()):.0f} GiB a recipe with checkpointing on "
            f"(`coco/grpo_sr_cider_vlm`'s {on['grpo_sr_cider_vlm']:.1f}") in text  # fmt: skip
    assert f"`coco/sr_lv_bagcurri_vlm`'s {on['sr_lv_bagcurri_vlm']:.1f} with its tower's adapters" in text
    tower = off["sr_lv_bagcurri_vlm"]["activations"]["tower_saved"] / GIB
    assert (f"{min(totals_off.values()):.0f}-{max(totals_off.values()):.0f} GiB with it off "
            f"(`coco/sr_lv_bagcurri_vlm`'s {totals_off['sr_lv_bagcurri_vlm']:.0f}: its tower's saved tensors for "
            f"100 images are {tower:.0f} GiB of it)") in text  # fmt: skip
    under = sorted((r for r, t in totals_off.items() if t * GIB < 80e9), key=totals_off.get)
    assert under == ["mle_vlm", "smile_vlm"]
    assert all(fits(t * GIB) for t in on.values()) and not any(fits(t * GIB) for t in totals_off.values())
    mle, smile = totals_off["mle_vlm"], totals_off["smile_vlm"]
    assert (f"every recipe fits 80 GB with checkpointing on (the largest, `coco/sr_lv_bagcurri_vlm`, comes to "
            f"{margin(on['sr_lv_bagcurri_vlm']):.1f} GiB) and none with it off: MLE's and SMILE's forecasts "
            f"({mle:.1f} and {smile:.1f} GiB) are under the card's 74.5 GiB but not with the margin "
            f"({margin(mle):.1f} and {margin(smile):.1f} GiB), and `coco/grpo_cider_vlm`'s "
            f"{totals_off['grpo_cider_vlm']:.1f} GiB is under 80 GiB but over 80 GB.") in text  # fmt: skip
    assert 80 * 1e9 / GIB < totals_off["grpo_cider_vlm"] < 80


def test_the_pixel_copies_against_the_frozen_towers_peak_at_smolvlms_crop(forecast):
    """docs/memory.md's SmolVLM example: one 512 px crop in bf16, what the model makes of its pixels (Idefics's
    selected bf16 images and the int64 pixel mask's copy, ``8p / 3``) against the frozen tower's own peak at its
    1,024 patches (``frozen_tower_bytes``, the kept embeddings included)."""
    from finecap.models.forecast import frozen_tower_bytes

    mib = 2**20
    pixels = 3 * 512 * 512
    tower = frozen_tower_bytes(forecast.SIGLIP_512, 2, 1024) / mib
    images, mask = 2 * pixels / mib, 8 * pixels // 3 / mib  # bf16 pixels; the int64 mask, one value a position
    stated = (f"that is {images + mask:.1f} MiB an image held through the tower ({images:.1f} MiB of bf16 pixels, "
              f"{mask:.0f} MiB of the mask's copy) and {mask:.0f} MiB more of input, against {tower:.1f} MiB of the "
              "tower's own peak")  # fmt: skip
    assert stated in " ".join((ROOT / "docs" / "memory.md").read_text().split()), stated


def test_the_readmes_gpu_check_sentence_is_the_second_h200_run(forecast):
    """README.md's Reliability paragraph on the 2026-11-28 run: the families whose prompt pass passed of those in its
    records, and the dry run's forecast against each memory line's measured peak as a range, now (the trained-tower
    table's last column: the script's rebuild of each record's step) and when it ran (each record's forecast with
    activations over its peak)."""
    checks: dict[str, dict] = {}
    for file in sorted(RESULTS.glob(f"gpu_check_h200_{SECOND}*.json")):
        for check in json.loads(file.read_text())["checks"]:
            if check["status"] != "skipped" or check["name"] not in checks:
                checks[check["name"]] = check
    families = [c for n, c in checks.items() if n.startswith("family:")]
    passed = sum(c["status"] == "pass" for c in families)
    now = [float(row.strip(" |").rsplit(" | ", 1)[1]) for row in forecast.h200_nov28()[2:]]
    then = [(r := h200_record(f"memory:{n}", SECOND))["forecast_with_activations_gib"] / r["measured_peak_gib"]
            for n in MEMORY_LINES]  # fmt: skip
    assert len(now) == len(MEMORY_LINES) == 6
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"on an H200 on {SECOND}, {passed} of {len(families)} families' prompt pass equalled their own" in readme
    assert (f"rebuilt for each of six recipes' measured steps, is {min(now):.2f} to {max(now):.2f} of its peak "
            f"({min(then):.2f} to {max(then):.2f} when it ran") in readme  # fmt: skip


def test_the_forecast_per_recipe_says_which_claims_a_gpu_measured(forecast):
    """docs/memory.md's "What is measured" under "Forecast per recipe", against the committed H200 records and the
    GPU check: the recipes whose step a run measured (at SmolVLM-256M's shapes: the only model the check builds), the
    one no run measured, the forecast now over the measured peak of the 2026-11-28 lines as ``--h200`` gives it, and
    the check's lines covering all seven recipes."""
    lines = [c for f in RESULTS.glob("gpu_check_h200_*.json") for c in json.loads(f.read_text())["checks"]
             if c["name"].startswith("memory:") and "measured_peak_bytes" in c]  # fmt: skip
    measured = {c["name"].split(":")[1] for c in lines}
    models = {c["model"] for c in lines}
    assert all("SmolVLM-256M" in m for m in models), models
    recipes = benchmark("gpu_check").VLM_RECIPES
    assert set(forecast.RECIPES) == set(recipes) and len(recipes) == 7
    assert set(recipes) - measured == {"grpo_sr_cider_vlm"}
    second = {name.split(":")[1] for name, _, _ in forecast.H200_NOV28}
    assert second == measured - {"grpo_sr_cider_vlm"} and len(second) == 6
    ratios = [float(r.split(" | ")[-1].strip(" |")) for r in forecast.h200_nov28()[2:]]
    text = " ".join((ROOT / "docs" / "memory.md").read_text().split())
    assert (
        f"the 2026-11-28 run measured six of the seven recipes' steps, which the forecast now puts at "
        f"{min(ratios):.2f} to {max(ratios):.2f} of the measured peak"
    ) in text
    assert (
        "`coco/grpo_sr_cider_vlm` was measured in neither H200 run (the device time ran out both times), and no "
        "recipe at Qwen2-VL-2B's shapes"
    ) in text
    assert "`make gpu-check` measures all seven recipes at SmolVLM-256M's shapes and none at Qwen2-VL-2B's." in text
