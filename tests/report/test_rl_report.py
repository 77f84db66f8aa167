"""The report of an RL run: which train keys get which panel (each reward part and each of its measures on its own
axis; ``time/reward``, a ``candidates`` count and the learning rate never beside a part), a ``finecap train`` run
directory read as one stage (its last evaluation as its results row, the captions it logged), and ``finecap report``
of a real tiny GRPO run and of a folder of stages holding an RL stage."""

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from finecap.app.cli import build_parser, main
from finecap.app.report import main as write_report
from finecap.report.plots import curve_panels, is_rl, plot_file_name, rl_curves, rl_panel, rl_panels, rl_title
from finecap.report.run import read_run

RL_VALUES = {
    "loss": -0.02, "loss/policy": -0.02, "time/generate": 0.2, "time/reward": 0.02, "kl": 0.01, "clip_fraction": 0.1,
    "ratio/mean": 1.0, "ratio/min": 0.9, "ratio/max": 1.1, "reward": -3.0, "reward/retrieval": -3.2,
    "reward/retrieval/accuracy": 0.04, "reward/retrieval/candidates": 32.0, "reward/retrieval/truncated": 0.0,
    "reward/cider": 0.13, "reward_greedy": 0.1, "baseline": 0.0, "advantage_std": 1.0, "advantage/min": -1.4,
    "advantage/max": 1.7, "zero_std_groups": 0.0, "sample_words": 7.0, "monitor/length_drift": 0.0,
    "monitor/repetition": 0.0, "monitor/fact_precision": 0.26, "monitor/fact_recall": 0.06, "lr": 1e-4,
    "grad_norm": 0.6,
}  # fmt: skip
"""What a GRPO step logs (the keys of a real run of demo/grpo_sr_cider; the retriever's ``candidates`` as a batch
of 33 gives)."""
PARTS = ("reward/cider", "reward/retrieval")


def rl_events(steps: int = 3, captions: bool = True) -> list[dict]:
    """``steps`` train events of :data:`RL_VALUES` (each value + 0.01 per step) and a validation event after each,
    logging two captions."""
    events = []
    for step in range(1, steps + 1):
        events.append({"step": step, "split": "train",
                       "values": {k: v + 0.01 * (step - 1) for k, v in RL_VALUES.items()}})  # fmt: skip
        val = {"step": step, "split": "val", "values": {"loss": 4.0 - step, "r@1": 0.1 * step, "length": 8.0}}
        if captions:
            val["text"] = {"captions": f"3: a shape at step {step}\n5: a red circle: large"}
        events.append(val)
    return events


def test_each_reward_part_has_an_axis_of_its_own_and_nothing_else_shares_it():
    panels = rl_panels(rl_events())
    axis_of = {key: panel for panel, series in panels.items() for key in series}
    for part in PARTS:
        assert list(panels[part]) == [part], panels[part]
        assert panels[part][part] == [(1, RL_VALUES[part]), (2, RL_VALUES[part] + 0.01), (3, RL_VALUES[part] + 0.02)]
    for key in ("time/reward", "time/generate", "lr", "grad_norm", "loss", "baseline"):
        assert key not in axis_of, key
    candidates = axis_of["reward/retrieval/candidates"]
    assert candidates not in PARTS and list(panels[candidates]) == ["reward/retrieval/candidates"]
    assert list(panels["reward"]) == ["reward", "reward_greedy"]
    assert set(panels["ratio"]) == {"ratio/min", "ratio/mean", "ratio/max"}
    assert set(panels["advantage"]) == {"advantage_std", "advantage/min", "advantage/max"}
    assert list(panels) == [
        "reward", "reward/cider", "reward/retrieval", "reward/retrieval/accuracy", "reward/retrieval/candidates",
        "reward/retrieval/truncated", "kl", "clip_fraction", "ratio", "advantage", "monitor/length_drift",
        "monitor/repetition", "monitor/fact_precision", "monitor/fact_recall"]  # fmt: skip
    # The training curves' reward panel holds the total only: no part, no timing.
    assert set(curve_panels(rl_events())["train reward"]) == {"reward", "reward_greedy"}


@pytest.mark.parametrize(("key", "panel"), [
    ("reward", "reward"), ("reward_greedy", "reward"), ("reward/cider", "reward/cider"),
    ("reward/retrieval/candidates", "reward/retrieval/candidates"), ("monitor/repetition", "monitor/repetition"),
    ("reward/qa_utility/judge/calls", "reward/qa_utility/judge"),
    ("reward/qa_utility/judge/rate_limited", "reward/qa_utility/judge"), ("reward/judge/failed", "reward/judge"),
    ("reward/qa_utility/judge_failed", "reward/qa_utility/judge_failed"),
    ("reward/qa_utility/judge/seconds", "reward/qa_utility/judge/seconds"),
    ("kl", "kl"), ("ratio/max", "ratio"), ("advantage/min", "advantage"), ("clip_fraction", "clip_fraction"),
    ("clip_ratio/low_mean", "clip_fraction"), ("clip_ratio/high_mean", "clip_fraction"),
    ("clip_ratio/region_mean", None), ("clip_ratio/low_min", None),  # clip_fraction's other name; an extreme
    ("time/reward", None), ("rewards", None), ("reward/", None), ("my_reward", None), ("baseline", None),
    ("loss/policy", None), ("lr", None), ("monitor", None),
])  # fmt: skip
def test_a_key_is_placed_by_what_it_means(key, panel):
    assert rl_panel(key) == panel


JUDGE_TALLIES = {
    "reward/qa_utility/judge/" + tally: float(n)
    for n, tally in enumerate(("cache_hits", "calls", "failed", "rate_limited", "unparsable"))
}
"""A judge-backed reward's tallies as a training step logs them (Reinforce.step_values, in sorted order)."""


def test_a_judges_tallies_are_one_panel_with_a_line_each(tmp_path, monkeypatch):
    # each reward/<part>/judge/<tally> was a panel of its own: 5 plots a judge-backed reward, each one line of counts
    from finecap.report import plots

    events = [{"step": k, "split": "train",
               "values": {"reward": 0.1 * k, "reward/qa_utility": 0.5, "reward/qa_utility/judge_failed": 0.0,
                          **{key: v * k for key, v in JUDGE_TALLIES.items()}}}
              for k in (1, 2)]  # fmt: skip
    panels = rl_panels(events)
    assert list(panels) == ["reward", "reward/qa_utility", "reward/qa_utility/judge", "reward/qa_utility/judge_failed"]
    assert panels["reward/qa_utility/judge"] == {key: [(1, v), (2, 2 * v)] for key, v in JUDGE_TALLIES.items()}
    drawn_figures = {}
    save = plots._save

    def keep(fig, out):
        drawn_figures[Path(out).name] = fig
        return save(fig, out)

    monkeypatch.setattr(plots, "_save", keep)
    drawn = dict(rl_curves(events, tmp_path, "grpo"))
    assert list(drawn) == list(panels)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(plot_file_name("rl", "grpo", p) for p in panels)
    (ax,) = drawn_figures[drawn["reward/qa_utility/judge"].name].axes
    assert [line.get_label() for line in ax.get_lines()] == list(JUDGE_TALLIES)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(JUDGE_TALLIES)
    assert ax.get_title() == rl_title("reward/qa_utility/judge") == "judge of reward part qa_utility: per step"
    assert rl_title("reward/qa_utility") == "reward part: qa_utility"


CLIP_SIDES = {"clip_ratio/low_mean": 0.02, "clip_ratio/high_mean": 0.08, "clip_ratio/region_mean": 0.1}
"""TRL's clip_ratio/*_mean as a GRPO step logs them from 2026-11-29 (region_mean is clip_fraction's other name)."""


def test_the_clip_panel_draws_both_sides_of_the_clip_beside_clip_fraction_and_an_older_runs_alone(
    tmp_path, monkeypatch
):
    # the clip panel drew clip_fraction only, not which side of the clip bound (the ratio below 1 - clip_low with a
    # negative advantage, or above 1 + clip_high with a positive one); a run before 2026-11-29 logged neither side
    from finecap.report import plots

    new = [{**e, "values": {**e["values"], **CLIP_SIDES}} if e["split"] == "train" else e for e in rl_events(2)]
    panel = rl_panels(new)["clip_fraction"]
    assert panel == {"clip_fraction": [(1, 0.1), (2, 0.11)], "clip_ratio/low_mean": [(1, 0.02), (2, 0.02)],
                     "clip_ratio/high_mean": [(1, 0.08), (2, 0.08)]}  # fmt: skip
    assert list(rl_panels(rl_events(2))["clip_fraction"]) == ["clip_fraction"]
    titles = {}
    save = plots._save

    def keep(fig, out):
        (ax,) = fig.axes
        titles[Path(out).name] = (ax.get_title(), [line.get_label() for line in ax.get_lines()])
        return save(fig, out)

    monkeypatch.setattr(plots, "_save", keep)
    for stage, events in (("new", new), ("old", rl_events(2))):
        drawn = dict(rl_curves(events, tmp_path, stage))
        title, lines = titles[drawn["clip_fraction"].name]
        assert title == "clip fraction (either side, low, high)"
        assert lines == (["clip_fraction", "clip_ratio/low_mean", "clip_ratio/high_mean"] if stage == "new"
                         else ["clip_fraction"])  # fmt: skip


def test_a_run_without_a_reward_gets_no_rl_panels(tmp_path):
    mle = [{"step": 1, "split": "train", "values": {"loss": 3.0, "time/reward": 0.1, "reward/cider": 0.2}}]
    assert not is_rl(mle) and is_rl(rl_events(1))
    assert rl_curves(mle, tmp_path, "mle") == [] and list(tmp_path.iterdir()) == []


def write_train_run(folder, events) -> None:
    """A run directory as ``finecap train`` leaves one (config.yaml, metrics.jsonl, checkpoints/)."""
    (folder / "checkpoints" / "last").mkdir(parents=True)
    (folder / "config.yaml").write_text("run:\n  name: x\n")
    (folder / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


CLASHING = ("reward/a-b", "reward/a/b", "reward/cider-", "reward/cidér", "reward/Cider", "reward/cider")
"""Reward parts whose panels had one file name (``/`` and any other character a file name avoids were ``-``:
``rl_grpo_reward-a-b.png`` twice, ``rl_grpo_reward-cider-.png`` twice) or two that differ only in case (one file on a
case-insensitive file system: macOS, Windows)."""


def test_two_panels_never_share_a_plot_file(tmp_path):
    events = [{"step": k, "split": "train", "values": {"reward": 0.1 * k, **{key: float(n * k) for n, key in
                                                                            enumerate(CLASHING)}}}
              for k in (1, 2)]  # fmt: skip
    drawn = rl_curves(events, tmp_path, "grpo")
    assert [panel for panel, _ in drawn] == ["reward", *sorted(CLASHING)]
    paths = [path for _, path in drawn]
    # one file a panel, each holding its own plot (every series is another line: no two files alike), names that
    # differ in more than case
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths)
    assert len({p.name.lower() for p in paths}) == len(drawn) == 7
    assert len({p.read_bytes() for p in paths}) == 7


def test_a_reports_rl_panels_show_each_its_own_plot(fabricated_run, tmp_path):
    # two panels of one file name: the second plot was drawn over the first before the page inlined either, so the
    # page showed the second twice and plots/ held one file for both
    run_dir = shutil.copytree(fabricated_run, tmp_path / "demo")
    (run_dir / "grpo").mkdir()
    events = [{"step": k, "split": "train", "values": {"reward": 0.1 * k, "reward/a-b": 1.0 * k, "reward/a/b": -k}}
              for k in (1, 2)]  # fmt: skip
    (run_dir / "grpo" / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    html = write_report(run_dir, tmp_path / "r.html", retrieval=False, plots=tmp_path / "plots").read_text()
    section = re.search(r'<section class="rl" id="rl-grpo".*?</section>', html, re.S).group(0)
    images = re.findall(r'class="rl-panel" data-panel="([^"]+)"><img src="([^"]+)"', section)
    assert [panel for panel, _ in images] == ["reward", "reward/a-b", "reward/a/b"]
    assert len({uri for _, uri in images}) == 3
    assert sorted(p.name for p in (tmp_path / "plots").glob("rl_*")) == sorted(
        plot_file_name("rl", "grpo", panel) for panel, _ in images
    )


def test_a_train_run_directory_is_read_as_one_stage(tmp_path):
    run_dir = tmp_path / "my_grpo"
    write_train_run(run_dir, rl_events())
    run = read_run(run_dir)
    assert run.single and run.stages == ["my_grpo"] and len(run.events["my_grpo"]) == 6
    assert run.results == {"my_grpo": {"loss": 1.0, "r@1": pytest.approx(0.3), "length": 8.0}}
    assert run.results_from == 3
    assert run.captions == {"my_grpo": {"3": "a shape at step 3", "5": "a red circle: large"}}  # the last evaluation
    assert sorted(run.logged_captions["my_grpo"]) == [1, 2, 3]
    assert run_dir / "metrics.jsonl" in run.inputs() and run_dir / "config.yaml" in run.inputs()
    # Saved captions win over logged ones; a results.json over the last evaluation.
    (run_dir / "captions").mkdir()
    (run_dir / "captions" / "test.json").write_text(json.dumps([{"image_id": 7, "caption": "a blue star"}]))
    (run_dir / "results.json").write_text(json.dumps({"my_grpo": {"CIDEr-D": 0.5}}))
    run = read_run(run_dir)
    assert run.captions == {"my_grpo": {7: "a blue star"}}
    assert run.results == {"my_grpo": {"CIDEr-D": 0.5}} and run.results_from is None


def test_an_empty_folder_is_refused_naming_both_kinds_of_run(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"metrics\.jsonl.*finecap train"):
        read_run(tmp_path)


def panels_of(html: str, stage: str) -> list[str]:
    """The ``data-panel`` of every RL panel of ``stage``'s section of a report."""
    section = re.search(rf'<section class="rl" id="rl-{re.escape(stage)}".*?</section>', html, re.S)
    return re.findall(r'class="rl-panel" data-panel="([^"]+)"', section.group(0)) if section else []


def logged_keys(run_dir) -> set[str]:
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {k for e in events if e["split"] == "train" for k in e["values"]}


@pytest.mark.slow
def test_finecap_report_takes_a_grpo_run_directory(grpo_run, tmp_path):
    out = tmp_path / "grpo.html"
    assert main(["report", str(grpo_run), "--out", str(out), "--sample", "4", "--plots", str(tmp_path / "plots")]) == 0
    html = out.read_text()
    keys = logged_keys(grpo_run)
    parts = {k for k in keys if k.count("/") == 1 and k.startswith("reward/")}
    monitors = {k for k in keys if k.startswith("monitor/")}
    assert parts == set(PARTS) and len(monitors) == 4  # what demo/grpo_sr_cider logs: else this test checks less
    panels = panels_of(html, grpo_run.name)
    assert {"reward", *parts, "kl", "clip_fraction", "ratio", "advantage", *monitors} <= set(panels)
    assert len(panels) == len(set(panels))
    assert all((tmp_path / "plots" / plot_file_name("rl", grpo_run.name, p)).is_file() for p in panels)
    # The results row is the last evaluation; the captions table and the gallery show its logged captions, with
    # their images (the ids logged as text matched to the data set's).
    assert 'id="results-note"' in html and "<td>grpo_sr_cider</td>" in html
    # the note's way to the test split is two commands that run (`finecap eval` has no --checkpoint)
    note = re.search(r'<p class="note" id="results-note">(.*?)</p>', html, re.S).group(1)
    commands = [shlex.split(c) for c in re.findall(r"`(finecap [^`]+)`", note)]
    assert len(commands) == 2 and "`finecap eval` scores a checkpoint" not in note, note
    test_json = str(grpo_run / "captions" / "test.json")
    assert commands == [["finecap", "caption", "--checkpoint", str(grpo_run), "--split", "test", "--out", test_json],
                        ["finecap", "eval", "--predictions", test_json, "--references", commands[1][-1]]]  # fmt: skip
    assert Path(commands[1][-1]).is_file()  # the run's data set
    for command in commands:
        build_parser().parse_args(command[1:])  # every option exists
    table = re.search(r'<table class="captions".*?</table>', html, re.S).group(0)
    assert len(re.findall(r"<tr>", table)) == 1 + 4  # header + train.log_captions images
    assert re.search(r'<div class="card" id="image-\d+">\s*<img src="data:image/', html)


@pytest.mark.slow
def test_a_folder_of_stages_shows_the_rl_section_of_its_rl_stage_only(fabricated_run, tmp_path):
    run_dir = tmp_path / "demo"
    shutil.copytree(fabricated_run, run_dir)
    (run_dir / "grpo").mkdir()
    (run_dir / "grpo" / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in rl_events(3, False)))
    html = write_report(run_dir, tmp_path / "r.html", retrieval=False).read_text()
    assert set(PARTS) <= set(panels_of(html, "grpo")) and panels_of(html, "mle") == []
    assert 'id="results-note"' not in html  # the demo's results.json is the table
