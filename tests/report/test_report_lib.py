"""Report library: generic tables, headline comparisons, plot data, gallery choices, reading a run directory."""

import base64
import io
import json
import re
import shutil

import pytest
import yaml

from finecap.app.report import main as write_report
from finecap.report.columns import better, column_info, direction, format_difference, format_value
from finecap.report.gallery import select_images
from finecap.report.html import HEADLINES, headline_comparisons, results_tables
from finecap.report.plots import (
    bag_recall_curves,
    curve_panels,
    drafts,
    length_histograms,
    plot_file_name,
    precision_recall,
    rl_curves,
    training_curves,
)
from finecap.report.run import read_run
from finecap.report.table import markdown_table

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
    assert [c.text for c in dict(tables["bag3"].rows)["mle"]] == ["0.777", "99"]  # a count: no decimals
    # SMILE vs MLE highlighted on Length; human has no role.
    assert cells["smile"][0].role == "headline" and cells["mle"][0].role == "baseline" and cells["human"][0].role == ""


def test_headlines_compute_differences_and_skip_absent_stages():
    heads = {h["paper"]: h for h in headline_comparisons(ROWS)}
    # DiscriTune and NDLB name stages that are absent: skipped without error.
    assert set(heads) == {"SMILE", "Sequence-level exploration"}
    smile = {i["column"]: i for i in heads["SMILE"]["items"]}
    assert smile["Length"]["diff"] == "+4.500" and smile["Length"]["better"] is None  # 12.0 - 7.5; no direction
    assert smile["faith/precision"]["diff"] == "-0.158" and not smile["faith/precision"]["better"]  # 0.827 - 0.985
    assert smile["RD99/R@1"]["diff"] == "+0.120"  # 0.95 - 0.83
    sle = {i["column"]: i for i in heads["Sequence-level exploration"]["items"]}
    assert sle["sample/mBLEU-4"]["diff"] == "-0.102" and sle["sample/mBLEU-4"]["better"]  # lower mBLEU-4 = diverse
    assert sle["CIDEr-D"]["diff"] == "-0.024" and not sle["CIDEr-D"]["better"]  # 1.749 - 1.773
    assert sle["sample/Div-1"]["diff"] == "±0.000" and sle["sample/Div-1"]["better"] is None  # -0.0001: a tie


def test_curve_panels_split_losses_rewards_and_validation():
    """The total reward has a panel; its parts and anything else naming a reward (``time/reward``) are not drawn on
    it (each part has its own panel among the RL panels: tests/report/test_rl_report.py)."""
    events = [
        {"step": 4, "split": "train", "values": {"loss": 3.0, "loss/mle": 2.0, "reward": 0.5, "reward/cider": 0.5,
                                                 "time/reward": 9.0, "lr": 1e-3}},
        {"step": 8, "split": "train", "values": {"loss": 2.0, "loss/mle": 1.5, "reward": 0.7, "reward/cider": 0.7,
                                                 "time/reward": 0.0, "lr": 1e-3}},
        {"step": 8, "split": "val", "values": {"length": 7.0, "R@1": 0.4}, "text": {"captions": "..."}},
    ]  # fmt: skip
    panels = curve_panels(events)
    assert panels["train loss"] == {"loss": [(4, 3.0), (8, 2.0)], "loss/mle": [(4, 2.0), (8, 1.5)]}
    assert panels["train reward"] == {"reward": [(4, 0.5), (8, 0.7)]}
    assert panels["val length"] == {"length": [(8, 7.0)]} and panels["val R@1"] == {"R@1": [(8, 0.4)]}
    assert set(panels) == {"train loss", "train reward", "val length", "val R@1"}  # lr is not plotted
    assert set(curve_panels(events, max_val=1)) == {"train loss", "train reward", "val length"}


def test_plots_draw_only_what_is_there(tmp_path):
    assert bag_recall_curves({"mle": {"Length": 3.0}}, tmp_path / "a.png") is None
    assert precision_recall({"mle": {"faith/recall": 0.3}}, tmp_path / "b.png") is None
    assert length_histograms({}, tmp_path / "c.png") is None
    out = bag_recall_curves(ROWS, tmp_path / "bags.png")
    assert out.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("name", [r"$x^$", r"$\nosuchcommand$"])
def test_plots_draw_stage_and_metric_names_as_text(tmp_path, name):
    # A stage or metric name is the user's text: matplotlib parsed it as TeX between two $, and `$x^$` or an unknown
    # command was a ValueError that stopped the whole report (`finecap report`) at its first plot.
    import matplotlib

    rows = {name: {"bag3/R@1": 0.5, "bag5/R@1": 0.4, "faith/recall": 0.3, "faith/precision": 0.6}, "mle": ROWS["mle"]}
    events = [{"step": k, "split": "train", "values": {name: 1.0 / k, "reward": 0.1 * k, f"reward/{name}": 0.1 * k}}
              for k in (1, 2)]  # fmt: skip
    drawn = [bag_recall_curves(rows, tmp_path / "bags.png"), precision_recall(rows, tmp_path / "faith.png"),
             length_histograms({name: {1: "a red circle"}, "mle": {1: "a"}}, tmp_path / "hist.png"),
             training_curves(events, tmp_path / "curves.png", title=name),
             *(path for _, path in rl_curves(events, tmp_path, "rl"))]  # fmt: skip
    assert len(drawn) == 6 and all(p.read_bytes()[:4] == b"\x89PNG" for p in drawn)
    assert matplotlib.rcParams["text.parse_math"]  # off only while finecap draws: the caller's setting is kept


def test_a_name_beginning_with_an_underscore_stays_in_the_legend(tmp_path, monkeypatch):
    """matplotlib leaves every label that begins with ``_`` out of a legend: a stage ``_ablation`` was drawn but
    missing from the legend, its line unnamed."""
    import finecap.report.plots as plots

    legends = []
    save = plots._save

    def saving(fig, out):
        legends.append([t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()])
        return save(fig, out)

    monkeypatch.setattr(plots, "_save", saving)
    rows = {"_ablation": {"bag3/R@1": 0.5, "bag5/R@1": 0.4}, "mle": {"bag3/R@1": 0.6, "bag5/R@1": 0.5}}
    bag_recall_curves(rows, tmp_path / "bags.png")
    assert legends == [["\u200b_ablation", "mle"]]  # a zero-width space in front: shown as typed


def test_each_plot_is_drawn_once(tmp_path, monkeypatch):
    """``tight_layout`` leaves a placeholder layout engine on the figure, for which ``savefig`` drew the whole figure
    once more (ticks, labels, text layout) and threw that draw away before the one it saved: a third of a report's
    plotting time. One draw per plot written, and the plot is the figure ``tight_layout`` laid out."""
    import matplotlib
    from matplotlib.figure import Figure

    draws = []
    draw = Figure.draw

    def counted(fig, renderer):
        draws.append((fig, fig.subplotpars.left, fig.subplotpars.bottom))
        return draw(fig, renderer)

    monkeypatch.setattr(Figure, "draw", counted)
    events = [{"step": k, "split": split, "values": {"loss": 1.0 / k, "reward": 0.1 * k, "kl": 0.01 * k, "R@1": 0.2}}
              for k in (1, 2, 3) for split in ("train", "val")]  # fmt: skip
    drawn = [training_curves(events, tmp_path / "curves.png", title="grpo"),
             *(path for _, path in rl_curves(events, tmp_path, "rl")),
             length_histograms({"mle": {1: "a red circle", 2: "a shape"}}, tmp_path / "hist.png"),
             bag_recall_curves(ROWS, tmp_path / "bags.png")]  # fmt: skip
    assert len(drawn) == 5 and all(p.read_bytes()[:4] == b"\x89PNG" for p in drawn)  # RL: reward and kl
    assert len(draws) == len(drawn) and len({id(fig) for fig, _, _ in draws}) == len(drawn)
    default = (matplotlib.rcParams["figure.subplot.left"], matplotlib.rcParams["figure.subplot.bottom"])
    assert all((left, bottom) != default for _, left, bottom in draws)  # drawn as tight_layout placed the axes


NAMED = [
    ("curves", "mle"), ("curves", "MLE"), ("curves", "Mle"), ("curves", "smile_random"), ("curves", "smile-random"),
    ("curves", "smile.random"), ("curves", "smile/random"), ("curves", "smile__random"), ("curves", "smile--random"),
    ("curves", "café"), ("curves", "cafe\u0301"), ("curves", "caf-"), ("curves", "x" * 250), ("curves", "x" * 251),
    ("curves", "\udcff"), ("curves", "\ufffd"), ("rl", "mle"), ("rl", "grpo", "reward"), ("rl", "grpo_reward", "kl"),
    ("rl", "grpo", "reward_kl"), ("rl", "a_reward-x", "kl"), ("rl", "a", "reward/x_kl"), ("rl", "a", "reward/a-b"),
    ("rl", "a", "reward/a/b"), ("rl", "a", "reward/a.b"), ("rl", "a", "reward/pkg.mod:Reward"),
    ("rl", "a", "reward/pkg.mod-reward"), ("rl", "a", "reward/Cider"), ("rl", "a", "reward/cider"),
    ("rl", "a", "reward/cider--a56a5ffca32c"), ("rl", "a__b", "kl"), ("rl", "a", "b__kl"), ("rl", "a", "b", "kl"),
]  # fmt: skip
"""Plots whose file names were one (``rl_a_reward-x_kl.png`` for two stages' panels; ``curves_smile-random.png``
for any character a file name avoids), differ only in case, or would hold over the 255 bytes a file name holds."""


def test_no_two_plots_get_one_file_name_nor_two_that_differ_only_in_case():
    names = [plot_file_name(*named) for named in NAMED]
    assert len({name.lower() for name in names}) == len(NAMED), sorted(names)
    for name in names:  # an ASCII file name of any file system, never hidden
        assert name.isascii() and name.endswith(".png") and len(name) <= 100 and name[0].isalpha(), name
        assert re.fullmatch(r"[a-z0-9._-]+", name), name
    # a name of plain words and single separators is written as it is, each / as .
    assert names[:1] + names[3:4] + names[17:19] == [
        "curves_mle.png", "curves_smile_random.png", "rl_grpo__reward.png", "rl_grpo_reward__kl.png"]  # fmt: skip
    assert (
        plot_file_name("rl", "grpo_sr_cider", "monitor/length_drift") == "rl_grpo_sr_cider__monitor.length_drift.png"
    )
    with pytest.raises(ValueError, match="kind"):
        plot_file_name("rl_", "a")


def test_a_second_plot_drawn_at_a_drafts_name_is_an_error_never_one_plot_over_another():
    # one plot drawn over another left the page showing the second twice (an RL section inlines its panels after
    # drawing them all)
    events = [{"step": k, "split": "train", "values": {"loss": 1.0 / k}} for k in (1, 2)]
    with drafts() as folder:
        first = training_curves(events, folder / "curves_a.png").read_bytes()
        with pytest.raises(FileExistsError):
            training_curves(events[:1], folder / "curves_a.png")
        assert (folder / "curves_a.png").read_bytes() == first


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


@pytest.mark.slow
def test_report_of_fabricated_run_is_self_contained(fabricated_run, tmp_path):
    run = read_run(fabricated_run)
    assert run.stages == ["human", "mle", "smile", "blip_x", "smile_random"]
    assert sorted(run.bags) == [3, 5]
    out = write_report(fabricated_run, tmp_path / "r.html", retrieval=False, plots=tmp_path / "plots")
    html = out.read_text()
    assert "http://" not in html and "https://" not in html and "<script src" not in html  # nothing fetched
    assert html.count('src="data:image/png;base64,') >= 7 + 12  # 7 plots, gallery images
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [  # the plots, and the list of them
        ".finecap-plots.json", "bag_recall.png", "curves_mle.png", "curves_smile.png", "curves_smile_random.png",
        "faithfulness.png", "length_hist.png", "smile_length.png"]  # fmt: skip


def test_report_gallery_reads_images_within_the_runs_budget(tmp_path):
    """The gallery reads a run's images within its data.max_image_pixels / data.max_aspect_ratio: a 60 x 2 strip
    (30:1) that a run with data.max_aspect_ratio=40 trained on is drawn (the default budget, 20:1, stopped the report
    with 'raise data.max_aspect_ratio'), and the other image too."""
    from PIL import Image

    from finecap.config import load
    from finecap.data.results import write_results
    from helpers.image_files import GREEN, RED, png

    folder = tmp_path / "data"
    png(folder / "a.png", RED)
    png(folder / "wide.png", GREEN, size=(60, 2))
    rows = [{"id": k, "image": name, "captions": [f"a shape {k}"], "split": "test"}
            for k, name in enumerate(["a.png", "wide.png"], 1)]  # fmt: skip
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    write_results(run / "captions" / "mle.json", {1: "a red square", 2: "a green strip"})
    cfg = load(None, ["data.format=jsonl", f"data.path={folder / 'data.jsonl'}", "data.max_aspect_ratio=40"])
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    html = write_report(run, tmp_path / "r.html", retrieval=False).read_text()
    shown = [Image.open(io.BytesIO(base64.b64decode(uri))).size
             for uri in re.findall(r'<img[^>]* src="data:image/png;base64,([^"]+)"', html)]  # fmt: skip
    assert (8, 8) in shown and (60, 2) in shown


@pytest.mark.slow
def test_cli_report_and_review_errors(fabricated_run, tmp_path, capsys):
    from finecap.app.cli import main

    out = tmp_path / "cli.html"
    assert main(["report", str(fabricated_run), "--out", str(out), "--no-bag-outcomes", "--sample", "2"]) == 0
    assert out.exists() and f"wrote {out}" in capsys.readouterr().err  # a status line: the finecap logger
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "run directory not found" in capsys.readouterr().err
    bags = fabricated_run / "bags_test.json"
    assert main(["bags", "review", str(bags), "--images", str(tmp_path / "nowhere")]) == 2
    assert "--images" in capsys.readouterr().err


def test_every_column_the_toolkit_writes_has_a_declared_meaning():
    """The column rules cover the demo's columns and the suite's metric names (a new metric group's record declares
    its columns' directions, or the report cannot colour them)."""
    from finecap.app import demo

    columns = [c.replace("RD/", "RD19/") for c in [*demo.COLUMNS, *demo.LISTENER_COLUMNS, *demo.DIVERSITY_COLUMNS]]
    columns += ["BLEU-1", "ROUGE-L", "METEOR", "SPICE", "RefCLIPScore", "ClipSc", "Div-1", "faith/precision_micro",
                "faith/hallucinated", "faith/halluc/color", "faith/facts", "faith/no_facts", "RD19/mean_rank",
                "pool/median_rank", "bag5/n", "listener/RD19/R@1_expected", "perplexity", "perplexity/nll",
                "perplexity/tokens", "Bleu_4", "CIDEr", "ROUGE_L", "true facts", "false facts",
                "transfer/acc"]  # fmt: skip
    assert [c for c in columns if column_info(c) is None] == []
    lower = ["faith/halluc_rate", "faith/hallucinated", "faith/halluc/color", "false facts", "sample/mBLEU-4",
             "beam/mBLEU-4", "RD19/mean_rank", "pool/median_rank", "listener/RD19/tie_rate", "listener/RD19/exploit",
             "listener/bag3/tie_rate", "listener/bag3/exploit", "perplexity", "perplexity/nll"]  # fmt: skip
    assert [c for c in lower if direction(c) != "lower"] == []
    neutral = ["Length", "faith/facts", "faith/no_facts", "bag5/n", "perplexity/tokens"]
    assert [c for c in neutral if direction(c) is not None] == []
    higher = [c for c in columns if c not in lower and c not in neutral]
    assert [c for c in higher if direction(c) != "higher"] == []
    for h in HEADLINES:  # every headline metric pattern names columns with a declared meaning
        assert all(column_info(p.replace("*", "3")) is not None for p in h.metrics), h.paper


def test_numbers_print_as_integers_where_they_count():
    assert format_value(54.0, "Vocab usage") == "54" and format_value(54, "Length") == "54"
    assert format_value(54.5, "Vocab usage") == "54.500"  # not a whole number: shown as it is
    assert format_value(13.0, "Length") == "13.000"  # a mean that happens to be whole keeps its decimals
    assert format_value(True, "x") == "True" and format_value(None, "x") == "-"
    assert format_difference(60.0, 54.0, "Vocab usage") == "+6" and format_difference(5.0, 5.0, "bag3/n") == "±0"
    assert format_difference(0.2999, 0.3, "CIDEr-D") == "±0.000" and format_difference(0.2, 0.5, "CIDEr-D") == "-0.300"
    rows = {"mle": {"Vocab usage": 54.0, "faith/hallucinated": 12.0, "bag3/n": 99.0, "CIDEr-D": 1.0}}
    assert markdown_table(rows).splitlines()[-1] == "| mle | 54 | 12 | 99 | 1.000 |"
    # Rows that are metrics (finecap eval's table): each row formatted as its metric.
    table = markdown_table({"Vocab usage": {"value": 54.0}, "CIDEr-D": {"value": 1.0}}, row_header="metric")
    assert table.splitlines()[2:] == ["| Vocab usage | 54 |", "| CIDEr-D | 1.000 |"]


def test_colours_follow_each_metrics_direction():
    # Lower hallucination is better: a fall is green, a rise red; a higher recall is better.
    assert better(0.2, 0.5, "faith/halluc_rate") is True and better(0.5, 0.2, "faith/halluc_rate") is False
    assert better(0.6, 0.4, "faith/recall") is True and better(30.0, 20.0, "perplexity") is False
    assert better(9.0, 3.0, "Length") is None and better(0.5, 0.5, "CIDEr-D") is None
    rows = {"human": {"faith/halluc_rate": 0.0, "faith/recall": 0.9, "Length": 9.0},
            "mle": {"faith/halluc_rate": 0.5, "faith/recall": 0.2, "Length": 3.0},
            "smile": {"faith/halluc_rate": 0.2, "faith/recall": 0.6, "Length": 12.0},
            "sle": {"faith/halluc_rate": 0.3, "faith/recall": 0.6, "Length": 7.0}}  # fmt: skip
    tables = {t.name: t for t in results_tables(rows)}
    assert tables["faith"].directions == ["lower", "higher"] and tables["caption"].directions == [None]
    marks = {stage: [c.rank for c in cells] for stage, cells in tables["faith"].rows}
    # halluc_rate: smile (0.2) best, mle (0.5) worst; recall: smile and sle tie for best; human is not ranked
    assert marks == {"human": ["", ""], "mle": ["worst", "worst"], "smile": ["best", "best"], "sle": ["", "best"]}
    assert all(c.rank == "" for _, cells in tables["caption"].rows for c in cells)  # Length: no direction
    heads = {h["paper"]: h for h in headline_comparisons(ROWS)}
    sle = {i["column"]: i for i in heads["Sequence-level exploration"]["items"]}
    assert sle["sample/mBLEU-4"]["direction"] == "lower" and sle["sample/mBLEU-4"]["better"]


def test_counts_of_captions_longer_than_the_text_window_sit_beside_their_metrics():
    # as evaluate() writes them: each group's keys, then its count of captions past the retriever's window
    rows = {"vlm": {"RD99/R@1": 0.9, "pool/R@1": 0.5, "retrieval/truncated": 12.0, "CLIPScore": 0.8,
                    "clipscore/truncated": 14.0, "reward/retrieval/truncated": 0.25},
            "mle": {"RD99/R@1": 0.7, "pool/R@1": 0.4, "CLIPScore": 0.7}}  # fmt: skip
    tables = {t.name: t for t in results_tables(rows)}
    assert list(tables) == ["caption", "RD99", "pool", "retrieval", "clipscore", "reward"]
    cells = {name: [c.text for _, cells in t.rows for c in cells] for name, t in tables.items()}
    assert cells["retrieval"] == ["12"] and cells["clipscore"] == ["14"]  # counts, only the run that has them
    assert cells["reward"] == ["0.250"]  # the share of a training batch
    assert tables["retrieval"].directions == tables["reward"].directions == [None]  # never coloured


@pytest.mark.slow
def test_a_quick_run_is_labelled_in_the_report(fabricated_run, tmp_path):
    plain = write_report(fabricated_run, tmp_path / "plain.html", retrieval=False).read_text()
    assert 'id="quick"' not in plain and "(quick run)" not in plain
    quick = write_report(fabricated_run, tmp_path / "quick.html", items=["demo.quick=true"], retrieval=False)
    html = quick.read_text()
    assert "<title>finecap report: run0 (quick run)</title>".replace("run0", fabricated_run.name) in html
    assert 'id="quick"' in html and "these are not results" in html
    assert html.index('id="quick"') < html.index('id="results"')  # above every number


def test_a_run_stored_before_the_backbone_sections_is_reported(fabricated_run, tmp_path):
    # config.yaml as finecap wrote it before the per-backbone sections: ClipCap's options in a flat model section
    old = tmp_path / fabricated_run.name
    shutil.copytree(fabricated_run, old)
    data = yaml.safe_load((old / "config.yaml").read_text())
    clipcap = data.pop("clipcap")
    data["model"].update(lm=clipcap["lm"], prefix_length=7, tiny_hidden=64, blip=data.pop("blip")["name"])
    del data["vlm"]
    (old / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    html = write_report(old, tmp_path / "old.html", retrieval=False).read_text()
    assert f"<title>finecap report: {old.name}</title>" in html and 'id="results"' in html


@pytest.mark.slow
def test_the_vcb_and_transfer_tables_are_in_the_report_when_the_run_has_them(fabricated_run, tmp_path):
    run = tmp_path / fabricated_run.name
    shutil.copytree(fabricated_run, run)
    without = write_report(run, tmp_path / "without.html", retrieval=False).read_text()
    assert 'id="vcb"' not in without and 'id="transfer"' not in without
    vcb = {
        "captions": {"human (1st caption)": {"Length": 8.8, "ClipSc": 6.81},
                     "HolisticCap": {"Length": 37.5, "ClipSc": 6.65}},
        "models": {"mle_holistic": {"Length": 30.25, "CIDEr-D": 0.5},
                   "sr_l_holistic": {"Length": 29.0, "CIDEr-D": 0.75}},
        "timings": {"mle_holistic": 1.0},
        "settings": {"bags": "built from HolisticCap", "references": "the trained field's",
                     "trained on": {"mle_holistic": "MLE on HolisticCap", "sr_l_holistic": "SR-L from mle_holistic"}},
    }  # fmt: skip
    (run / "vcb_results.json").write_text(json.dumps(vcb))
    (run / "transfer").mkdir()
    (run / "transfer" / "results.json").write_text(json.dumps({"human": {"CIDEr-D": 2.0}, "mle": {"CIDEr-D": 0.25},
                                                               "smile": {"CIDEr-D": 0.125}}))  # fmt: skip
    html = write_report(run, tmp_path / "with.html", retrieval=False).read_text()
    vcb_part = html[html.index('<h2 id="vcb">') : html.index('<h2 id="transfer">')]
    assert "Visual Caption Boosting (NDLB Tables 2-3)" in vcb_part and "bags: built from HolisticCap" in vcb_part
    assert '<tr><td>HolisticCap</td><td class="" data-value="37.5">37.500</td>' in vcb_part
    assert '<tr><td>sr_l_holistic</td><td class="">SR-L from mle_holistic</td>' in vcb_part  # its "trained on"
    assert '<td class="best" data-value="0.75">0.750</td>' in vcb_part  # CIDEr-D ranked: sr_l_holistic best
    transfer_part = html[html.index('<h2 id="transfer">') : html.index('<h2 id="plots">')]
    assert '<td class="best" data-value="0.25">0.250</td>' in transfer_part  # mle beats smile; human not ranked
    assert (
        '<td class="worst" data-value="0.125">0.125</td>' in transfer_part
        and '<td class="" data-value="2.0">2.000</td>' in transfer_part  # the human row: not ranked
    )
    assert '<a href="#vcb">Visual Caption Boosting</a>' in html and '<a href="#transfer">Shifted domain</a>' in html


@pytest.mark.slow
def test_the_report_says_when_most_of_a_stages_captions_state_no_fact(fabricated_run, tmp_path):
    # a stage whose captions state nothing showed faith/precision 1.000 and no hallucination, without a word
    run = tmp_path / fabricated_run.name
    shutil.copytree(fabricated_run, run)
    results = json.loads((run / "results.json").read_text())
    results["mle"] |= {"faith/no_facts": 0.9}
    results["smile"] |= {"faith/no_facts": 0.5}  # half: not most
    (run / "results.json").write_text(json.dumps(results))
    html = write_report(run, tmp_path / "silent.html", retrieval=False).read_text()
    note = re.search(r'<p class="note" id="silent-note">(.*?)</p>', html, re.S).group(1)
    assert note.startswith("Most captions of mle (90%) state no fact the world&#39;s parser reads; each such caption "
                           "counts as faith/precision 1 and no hallucination")  # fmt: skip
    assert "smile" not in note and "#faithfulness-on-the-world" in note
    assert 'id="silent-note"' not in write_report(fabricated_run, tmp_path / "plain.html", retrieval=False).read_text()


@pytest.mark.slow
def test_a_run_still_writing_its_log_is_reported(fabricated_run, tmp_path):
    # A run still training (or killed mid-line) leaves its last metrics.jsonl line cut short, without its newline:
    # the report reads the events before it. Another line that is not JSON stays an error naming it.
    run = tmp_path / fabricated_run.name
    shutil.copytree(fabricated_run, run)
    log = run / "mle" / "metrics.jsonl"
    complete = log.read_text()
    log.write_text(complete + '{"step": 12, "split": "tr')
    assert read_run(run).events["mle"] == read_run(fabricated_run).events["mle"]
    html = write_report(run, tmp_path / "r.html", retrieval=False).read_text()
    assert "training curves: mle" in html
    log.write_text('{"step": 12, "split": "tr\n' + complete)
    with pytest.raises(ValueError, match=r"mle/metrics.jsonl, line 1: invalid JSON"):
        read_run(run)


def test_a_nan_or_infinite_metric_is_never_coloured():
    # A diverged stage's NaN (or inf) CIDEr-D was marked the column's best, wherever its row came first, and the
    # real best left unmarked; a NaN headline difference was coloured worse.
    nan, inf = float("nan"), float("inf")
    for rows in [{"a": {"CIDEr-D": nan}, "b": {"CIDEr-D": 0.5}, "c": {"CIDEr-D": 0.3}},
                 {"b": {"CIDEr-D": 0.5}, "a": {"CIDEr-D": inf}, "c": {"CIDEr-D": 0.3}}]:  # fmt: skip
        marks = {
            stage: (cells[0].text, cells[0].rank, cells[0].value) for stage, cells in results_tables(rows)[0].rows
        }
        assert marks["b"][:2] == ("0.500", "best") and marks["c"][:2] == ("0.300", "worst"), marks
        assert marks["a"][0] in ("nan", "inf") and marks["a"][1:] == ("", None), marks  # shown, not ranked
    assert better(nan, 0.5, "CIDEr-D") is None and better(0.5, -inf, "CIDEr-D") is None
    item = headline_comparisons({"mle": {"CIDEr-D": 0.5}, "smile": {"CIDEr-D": nan}})[0]["items"][0]
    assert item["value"] == "nan" and item["better"] is None


@pytest.mark.slow
def test_hostile_captions_stage_names_and_columns_are_escaped(fabricated_run, tmp_path):
    # Captions a model wrote, a stage (file) name and a results column are text, printed escaped: no markup of theirs.
    hostile = '<script>alert(1)</script>"><img src=x onerror=alert(2)></textarea>{{7*7}}'
    stage = '"><img src=x onerror=alert(3)>'
    run = tmp_path / 'run "q" & <é>'
    shutil.copytree(fabricated_run, run)
    captions = [{"image_id": row["image_id"], "caption": hostile}
                for row in json.loads((run / "captions" / "mle.json").read_text())]  # fmt: skip
    (run / "captions" / f"{stage}.json").write_text(json.dumps(captions))
    results = json.loads((run / "results.json").read_text())
    results[stage] = {"Length": 1.0, hostile: 0.5}
    (run / "results.json").write_text(json.dumps(results))
    html = write_report(run, tmp_path / "r.html", retrieval=False, n_sample=2, n_disagree=2).read_text()
    assert "<script>alert" not in html and "<img src=x" not in html and "</textarea>" not in html
    assert html.count("<script>") == 1  # the page's own table sorting
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "&#34;&gt;&lt;img src=x onerror=alert(3)&gt;" in html


@pytest.mark.slow
def test_a_right_to_left_override_in_a_name_reverses_none_of_the_pages_text(fabricated_run, tmp_path):
    # A stage name (or caption, id) holding U+202E printed bare reversed the page's own text after it up to the end of
    # its block: "Stages: mle\u202e, smile" showed "elims ,", a "(80%)" after it "(%08)" (seen in Chromium). Every
    # user string is printed as an isolate (FSI ... PDI) with its override closed.
    rlo, stage = "\u202e", "mle\u202e"
    run = tmp_path / "run"
    shutil.copytree(fabricated_run, run)
    shutil.copy(run / "captions" / "mle.json", run / "captions" / f"{stage}.json")
    results = json.loads((run / "results.json").read_text())
    results[stage] = {"Length": 3.0, "faith/no_facts": 0.8, f"bag3/R@1{rlo}": 0.5}
    (run / "results.json").write_text(json.dumps(results))
    page = write_report(run, tmp_path / "r.html", retrieval=False, n_sample=2, n_disagree=2).read_text()
    isolated = [f"\u2068{stage}\u202c\u2069", f"\u2068bag3/R@1{rlo}\u202c\u2069"]
    assert page.count(isolated[0]) >= 4 and page.count(isolated[1]) >= 1  # stages, table, silent note, gallery
    assert page.count(rlo) == sum(page.count(text) for text in isolated)  # no override left open


@pytest.mark.slow
def test_a_malformed_vcb_or_transfer_results_file_is_a_named_error_before_any_write(fabricated_run, tmp_path):
    # vcb_results.json or transfer/results.json of another layout stopped the report with an AttributeError traceback
    # ('list' object has no attribute 'get'), after the plot files were written into the run folder
    run = tmp_path / fabricated_run.name
    shutil.copytree(fabricated_run, run)
    (run / "transfer").mkdir()
    for file, text, where in [("vcb_results.json", "[1, 2]", "vcb_results.json"),
                              ("vcb_results.json", '{"models": [1]}', "vcb_results.json: 'models'"),
                              ("vcb_results.json", '{"settings": {"trained on": 3}}', "'settings': 'trained on'"),
                              ("transfer/results.json", '{"mle": 0.5}', "transfer/results.json")]:  # fmt: skip
        (run / "vcb_results.json").unlink(missing_ok=True)
        (run / file).write_text(text)
        with pytest.raises(ValueError, match=re.escape(where) + ": expected"):
            write_report(run, retrieval=False)
        assert not (run / "plots").exists() and not (run / "report.html").exists()


def test_a_bag_outcome_lost_on_a_tie_shows_the_other_image_as_retrieved():
    # a tie counts against the caption (rank 2, a miss), but the gallery showed its own image as the one retrieved
    from finecap.report.gallery import bag_outcomes

    tied, *_ = bag_outcomes([[0.4, 0.0, 0.4], [0.0, 0.5, 0.0], [0.0, 0.0, 0.5]], [7, 8, 9], {7: 0, 8: 1, 9: 2})
    assert (tied.rank, tied.correct, tied.retrieved) == (2, False, 9)


def test_the_report_reads_a_log_of_either_form_alike(tmp_path):
    # metrics.jsonl is strict JSON now (a value that is no finite number null, its kind named in "nonfinite"); a run
    # logged before holds bare NaN / Infinity tokens. The report reads both as the same values: the strict form's
    # nulls were left out of the curves and of the results taken from the last validation.
    from helpers.metrics_log import NEW_FORM, OLD_FORM, same

    runs = {}
    for form, text in (("new", NEW_FORM), ("old", OLD_FORM)):
        (tmp_path / form).mkdir()
        (tmp_path / form / "metrics.jsonl").write_text(text)
        runs[form] = read_run(tmp_path / form)
    new, old = runs["new"], runs["old"]
    assert same(new.events["new"], old.events["old"]) and "nonfinite" not in new.events["new"][0]
    assert same(new.results["new"], {"cider_d": float("nan"), "loss": float("-inf")}), new.results
    assert same(curve_panels(new.events["new"]), curve_panels(old.events["old"]))
    assert same(curve_panels(new.events["new"])["train loss"]["loss"], [[1, float("inf")], [3, 2.5]])


@pytest.mark.slow
def test_a_metric_a_results_file_holds_as_null_is_no_point_of_a_plot(fabricated_run, tmp_path):
    # finecap writes a NaN metric into results.json as null (strict JSON); a stage whose bag3/R@1 was NaN stopped the
    # whole report with a TypeError traceback (float(None)) in the TrueMatch plot. The cell prints "-", the plot draws
    # the stage's other bag sizes, and no other plot is lost.
    from finecap.utils.files import write_json

    run = tmp_path / fabricated_run.name
    shutil.copytree(fabricated_run, run)
    results = json.loads((run / "results.json").read_text())
    results["smile"]["bag3/R@1"] = results["mle"]["faith/recall"] = float("nan")
    write_json(run / "results.json", results)
    assert json.loads((run / "results.json").read_text())["smile"]["bag3/R@1"] is None
    page = write_report(run, tmp_path / "r.html", retrieval=False, n_sample=2, n_disagree=2).read_text()
    for title in ("TrueMatch R@1 against bag size", "faithfulness: precision against recall", "training curves: mle"):
        assert f'alt="{title}"' in page, title
    table = results_tables(read_run(run).results)
    bag3 = next(t for t in table if t.name == "bag3")
    assert dict((stage, cells[0].text) for stage, cells in bag3.rows)["smile"] == "-"


def test_a_validation_length_logged_as_null_is_no_point(tmp_path):
    # SMILE Fig. 4a reads each run's validation lengths; a null one (a log another tool wrote strict, without naming
    # its kind) or an event without values was a TypeError that stopped the report.
    from finecap.report.plots import validation_series

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [
        {"step": 2, "split": "val", "values": {"length": None}}, {"step": 3, "split": "val", "values": None},
        {"step": 4, "split": "val", "values": {"length": 7.5}}]))  # fmt: skip
    assert validation_series(tmp_path, "length") == [(4, 7.5)]


def test_a_headline_difference_is_that_of_the_values_printed_beside_it():
    # The quick demo's report printed "CIDEr-D 0.190 → 0.361: +0.170" (the raw values' difference rounded), and for
    # sample/Div-2 "0.879 → 0.880: ±0.000" coloured better: a reader subtracting the printed numbers got another
    # difference, and "no difference" was called better. The difference is now of the printed values.
    items = headline_comparisons(
        {"mle": {"CIDEr-D": 0.1904, "Length": 3.0}, "smile": {"CIDEr-D": 0.3606, "Length": 3.0}}
    )
    item = next(i for i in items[0]["items"] if i["column"] == "CIDEr-D")
    assert (item["baseline"], item["value"], item["diff"], item["better"]) == ("0.190", "0.361", "+0.171", True)
    assert format_difference(0.8804, 0.8795, "sample/Div-2") == "+0.001"  # printed 0.880 and 0.879
    for new, old in [(0.1234, 0.9876), (0.5555, 0.4444), (1.0005, 0.0004), (0.3004, 0.2996)]:
        shown = float(format_value(new, "CIDEr-D")) - float(format_value(old, "CIDEr-D"))
        assert float(format_difference(new, old, "CIDEr-D").replace("±", "")) == pytest.approx(shown, abs=1e-9)
        assert (format_difference(new, old, "CIDEr-D").startswith("±")) == (better(new, old, "CIDEr-D") is None)


@pytest.mark.slow
def test_a_stage_without_training_curves_is_named_under_the_plots(fabricated_run, tmp_path):
    # A stage of the results whose log is missing (not run, not copied) or holds nothing to plot (killed before its
    # first log) had no training curves and nothing said so: the plots looked complete.
    run = tmp_path / fabricated_run.name
    shutil.copytree(fabricated_run, run)
    (run / "mle" / "metrics.jsonl").write_text("")
    page = write_report(run, tmp_path / "r.html", retrieval=False, n_sample=2, n_disagree=2).read_text()
    note = re.search(r'<p class="note" id="plots-note">(.*?)</p>', page).group(1)
    expected = "No training curves for mle (nothing to plot in mle/metrics.jsonl), blip_x (no blip_x/metrics.jsonl)."
    assert note == expected
    assert 'alt="training curves: smile"' in page and "smile (" not in note and "human" not in note
    whole = write_report(fabricated_run, tmp_path / "whole.html", retrieval=False, n_sample=2, n_disagree=2)
    assert "(no blip_x/metrics.jsonl)." in whole.read_text() and "mle (" not in whole.read_text()


def test_a_stage_left_off_the_faithfulness_plot_is_named_under_the_plots(tmp_path):
    # A stage whose precision is NaN (its captions state no fact: 0/0; null in results.json) or whose recall is was
    # left off the precision-recall plot, and nothing said so, while missing training curves are named.
    from finecap.app.report import _plots
    from finecap.report.plots import precision_recall_note
    from finecap.report.run import RunData

    rows = {"human": {"Length": 9.0}, "mle": {"faith/recall": 0.4, "faith/precision": 0.9},
            "rl": {"faith/recall": 0.1, "faith/precision": None}, "odd": {"faith/recall": float("nan")}}  # fmt: skip
    expected = "No faithfulness point for rl (faith/precision is NaN), odd (no faith/precision, faith/recall is NaN)."
    assert precision_recall_note(rows) == expected
    assert precision_recall_note({"mle": rows["mle"], "human": rows["human"]}) is None  # all drawn, or not scored
    run = RunData(tmp_path, results=rows)
    run.events = {"mle": [{"step": 1, "split": "train", "values": {"loss": 1.0}}]}
    plots, note = _plots(run, tmp_path / "plots")
    assert "faithfulness: precision against recall" in [p["title"] for p in plots]  # mle's point is drawn
    assert note == f"No training curves for rl (no rl/metrics.jsonl), odd (no odd/metrics.jsonl). {expected}"
    # nothing to draw: the plot is left out, the note still says why
    run.results = {"rl": rows["rl"]}
    plots, note = _plots(run, tmp_path / "plots2")
    assert "faithfulness: precision against recall" not in [p["title"] for p in plots]
    assert note.endswith("No faithfulness point for rl (faith/precision is NaN).")


def test_every_plot_says_what_its_axes_are(tmp_path, monkeypatch):
    # The caption-length histograms had no y label (what was counted: captions? images? a share?). Every axis of
    # every plot is named: by a label of its own or the figure's, or (a panel of curves) by the panel's title.
    import finecap.report.plots as plots

    unnamed = []
    save = plots._save

    def saving(fig, out):
        sup = [getattr(fig, f"_sup{axis}label", None) for axis in "xy"]
        for ax in (ax for ax in fig.axes if ax.get_visible()):
            x = ax.get_xlabel() or (sup[0] and sup[0].get_text())
            y = ax.get_ylabel() or (sup[1] and sup[1].get_text()) or (ax.get_title() if "curves" in out.name else "")
            if not (x and y):
                unnamed.append((out.name, x, y))
        return save(fig, out)

    monkeypatch.setattr(plots, "_save", saving)
    events = [{"step": k, "split": split, "values": {"loss": 1.0 / k, "reward": 0.1 * k, "length": 3.0}}
              for k in (1, 2) for split in ("train", "val")]  # fmt: skip
    length_histograms({"mle": {1: "a red circle", 2: "a"}, "smile": {1: "a big red circle"}}, tmp_path / "hist.png")
    bag_recall_curves(ROWS, tmp_path / "bags.png")
    precision_recall({"mle": {"faith/recall": 0.3, "faith/precision": 0.6}}, tmp_path / "faith.png")
    training_curves(events, tmp_path / "curves_mle.png")
    assert unnamed == []


@pytest.mark.parametrize("line", ["[1, 2]", "null", '"loss"', '{"step": 1, "split": "train", "values": [1.5]}'])
def test_a_log_line_that_is_json_but_no_event_is_an_error_naming_it(tmp_path, line):
    # A metrics.jsonl line of valid JSON that is no event (another tool's log, a corrupted copy) stopped the report
    # with an AttributeError traceback ('list' object has no attribute 'get'), exit 1, naming neither file nor line.
    (tmp_path / "mle").mkdir()
    first = '{"step": 1, "split": "train", "values": {"loss": 1.0}}'
    (tmp_path / "mle" / "metrics.jsonl").write_text(f"{first}\n{line}\n")
    with pytest.raises(ValueError, match=r"mle/metrics.jsonl, line 2: expected an event .*, got "):
        read_run(tmp_path)
