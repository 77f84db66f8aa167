"""Report library: generic tables, headline comparisons, plot data, gallery choices, reading a run directory."""

import json

import pytest

from finecap.app.report import main as write_report
from finecap.report.gallery import select_images
from finecap.report.html import headline_comparisons, results_tables
from finecap.report.plots import bag_recall_curves, curve_panels, length_histograms, precision_recall
from finecap.report.run import read_run

ROWS = {
    "human": {"Length": 9.0, "bag3/R@1": 0.7},
    "mle": {"Length": 7.5, "RD99/R@1": 0.83, "faith/precision": 0.985, "bag3/R@1": 0.777, "bag3/n": 99.0},
    "smile": {"Length": 12.0, "RD99/R@1": 0.95, "faith/precision": 0.827, "bag3/R@1": 0.866},
    "scst": {"sample/mBLEU-4": 0.844, "CIDEr-D": 1.773, "sample/Div-1": 0.3001},
    "sle": {"sample/mBLEU-4": 0.742, "CIDEr-D": 1.749, "sample/Div-1": 0.3},
    "new_thing": {"transfer/acc": 0.5},
}


def test_tables_group_columns_by_prefix_and_keep_every_stage():
    tables = {t.name: t for t in results_tables(ROWS)}
    assert list(tables) == ["caption", "bag3", "RD99", "faith", "sample", "transfer"]  # first-seen order
    assert tables["caption"].columns == ["Length", "CIDEr-D"]
    assert [stage for stage, _ in tables["caption"].rows] == ["human", "mle", "smile", "scst", "sle"]
    assert tables["bag3"].columns == ["bag3/R@1", "bag3/n"]
    assert [s for s, _ in tables["transfer"].rows] == ["new_thing"]  # a column group no code names
    cells = dict(tables["caption"].rows)
    assert [c.text for c in cells["smile"]] == ["12.000", "-"] and cells["smile"][0].value == 12.0
    # SMILE vs MLE highlighted on Length; human has no role.
    assert cells["smile"][0].role == "headline" and cells["mle"][0].role == "baseline" and cells["human"][0].role == ""


def test_headlines_compute_differences_and_skip_absent_stages():
    heads = {h["paper"]: h for h in headline_comparisons(ROWS)}
    # DiscriTune and NDLB name stages that are absent: skipped without error.
    assert set(heads) == {"SMILE", "Sequence-level exploration"}
    smile = {i["column"]: i for i in heads["SMILE"]["items"]}
    assert smile["Length"]["diff"] == "+4.500" and smile["Length"]["better"]  # 12.0 - 7.5
    assert smile["faith/precision"]["diff"] == "-0.158" and not smile["faith/precision"]["better"]  # 0.827 - 0.985
    assert smile["RD99/R@1"]["diff"] == "+0.120"  # 0.95 - 0.83
    sle = {i["column"]: i for i in heads["Sequence-level exploration"]["items"]}
    assert sle["sample/mBLEU-4"]["diff"] == "-0.102" and sle["sample/mBLEU-4"]["better"]  # lower mBLEU-4 = diverse
    assert sle["CIDEr-D"]["diff"] == "-0.024" and not sle["CIDEr-D"]["better"]  # 1.749 - 1.773
    assert sle["sample/Div-1"]["diff"] == "±0.000" and sle["sample/Div-1"]["better"] is None  # -0.0001: a tie


def test_curve_panels_split_losses_rewards_and_validation():
    events = [
        {"step": 4, "split": "train", "values": {"loss": 3.0, "loss/mle": 2.0, "reward/cider": 0.5, "lr": 1e-3}},
        {"step": 8, "split": "train", "values": {"loss": 2.0, "loss/mle": 1.5, "reward/cider": 0.7, "lr": 1e-3}},
        {"step": 8, "split": "val", "values": {"length": 7.0, "R@1": 0.4}, "text": {"captions": "..."}},
    ]
    panels = curve_panels(events)
    assert panels["train loss"] == {"loss": [(4, 3.0), (8, 2.0)], "loss/mle": [(4, 2.0), (8, 1.5)]}
    assert panels["train reward"] == {"reward/cider": [(4, 0.5), (8, 0.7)]}
    assert panels["val length"] == {"length": [(8, 7.0)]} and panels["val R@1"] == {"R@1": [(8, 0.4)]}
    assert set(panels) == {"train loss", "train reward", "val length", "val R@1"}  # lr is not plotted
    assert set(curve_panels(events, max_val=1)) == {"train loss", "train reward", "val length"}


def test_plots_draw_only_what_is_there(tmp_path):
    assert bag_recall_curves({"mle": {"Length": 3.0}}, tmp_path / "a.png") is None
    assert precision_recall({"mle": {"faith/recall": 0.3}}, tmp_path / "b.png") is None
    assert length_histograms({}, tmp_path / "c.png") is None
    out = bag_recall_curves(ROWS, tmp_path / "bags.png")
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_gallery_picks_disagreement_and_a_disjoint_sample():
    captions = {"a": {1: "a red circle", 2: "a red circle", 3: "a blue star", 4: "x"},
                "b": {1: "a red circle", 2: "a green square", 3: "a blue star", 4: "x"}}  # fmt: skip
    sample, top = select_images(captions, n_sample=5, n_disagree=1)
    assert top == [(2, 0.8)]  # {a, red, circle} vs {a, green, square}: 1 - 1/5
    assert sorted(sample) == [1, 3, 4]


def test_read_run_errors_name_the_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="run directory not found"):
        read_run(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no results.json"):
        read_run(tmp_path)
    (tmp_path / "results.json").write_text(json.dumps({"mle": 3}))
    with pytest.raises(ValueError, match="results.json"):
        read_run(tmp_path)


def test_report_of_fabricated_run_is_self_contained(fabricated_run, tmp_path):
    run = read_run(fabricated_run)
    assert run.stages == ["human", "mle", "smile", "blip_x", "smile_random"]
    assert sorted(run.bags) == [3, 5]
    out = write_report(fabricated_run, tmp_path / "r.html", retrieval=False)
    html = out.read_text()
    assert "http://" not in html and "https://" not in html and "<script src" not in html  # nothing fetched
    assert html.count('src="data:image/png;base64,') >= 7 + 12  # 7 plots, gallery images
    assert sorted(p.name for p in (fabricated_run / "plots").iterdir()) == [
        "bag_recall.png", "curves_mle.png", "curves_smile.png", "curves_smile_random.png", "faithfulness.png",
        "length_hist.png", "smile_length.png"]  # fmt: skip


def test_cli_report_and_review_errors(fabricated_run, tmp_path, capsys):
    from finecap.app.cli import main

    out = tmp_path / "cli.html"
    assert main(["report", str(fabricated_run), "--out", str(out), "--no-bag-outcomes", "--sample", "2"]) == 0
    assert out.exists() and f"wrote {out}" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "run directory not found" in capsys.readouterr().err
    bags = fabricated_run / "bags_test.json"
    assert main(["bags", "review", str(bags), "--images", str(tmp_path / "nowhere")]) == 2
    assert "--images" in capsys.readouterr().err
