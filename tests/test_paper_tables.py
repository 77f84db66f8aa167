"""benchmarks/paper_tables.py: the verdict rules on hand-made numbers, and the runner itself on a tiny world (two
training steps per run): one shared MLE start per seed, one result file per run, resume by skipping existing result
files, and the page regenerated from the files."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def load_module():
    spec = importlib.util.spec_from_file_location("paper_tables_under_test", ROOT / "benchmarks" / "paper_tables.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


pt = load_module()


# --------------------------------------------------------------------------------------------------------------------
# Verdicts and the page, from hand-made numbers
# --------------------------------------------------------------------------------------------------------------------


def test_row_verdicts_follow_the_papers_signs():
    # Meteor / CIDEr / Spice: SLL 26.8 115.0 20.0, SLL-ME 26.8 115.6 20.1, SLL-SLE 27.0 117.2 20.3
    table = pt.SLE.table("2")
    results = {
        0: {"scst": {"METEOR": 0.20, "CIDEr-D": 1.00}, "scst_me": {"METEOR": 0.21, "CIDEr-D": 1.10},
            "sle": {"METEOR": 0.22, "CIDEr-D": 1.20}},
        1: {"scst": {"METEOR": 0.20, "CIDEr-D": 1.00}, "scst_me": {"METEOR": 0.19, "CIDEr-D": 0.90},
            "sle": {"METEOR": 0.22, "CIDEr-D": 1.20}},
    }  # fmt: skip
    rows = {r.id: r for r in table.rows}
    assert pt.row_verdict(table, rows["sll"], results) == "reference"
    # SLL-ME vs SLL: the paper's Meteor is unchanged (26.8 = 26.8): reported, not judged; CIDEr rises (115.0 ->
    # 115.6): the world's rises on seed 0 (1.10 > 1.00), falls on seed 1 (0.90); no world SPICE: not judged
    assert pt.row_verdict(table, rows["me"], results) == (
        "partly holds: Meteor = (paper: no change; not judged), CIDEr ↑ 1/2"
    )
    # SLL-SLE vs SLL and vs SLL-ME: every paper difference is a rise; the world's Meteor vs SLL-ME rises on both
    # seeds (0.22 > 0.21, 0.22 > 0.19), and so does everything else
    assert pt.row_verdict(table, rows["sle"], results) == (
        "holds: Meteor vs SLL ↑ 2/2, CIDEr vs SLL ↑ 2/2, Meteor vs SLL-ME ↑ 2/2, CIDEr vs SLL-ME ↑ 2/2"
    )
    flipped = {s: {**runs, "sle": {"METEOR": 0.1, "CIDEr-D": 0.5}} for s, runs in results.items()}
    assert pt.row_verdict(table, rows["sle"], flipped).startswith("does not hold: Meteor vs SLL ↑ 0/2")
    assert pt.row_verdict(table, rows["sle"], {0: {"scst": {"CIDEr-D": 1.0}}}) == "not run yet"
    same = {0: {key: {"METEOR": 0.2, "CIDEr-D": 1.0} for key in ("scst", "scst_me", "sle")}}  # equal world rows
    assert pt.row_verdict(table, rows["me"], same) == (
        "no world difference: Meteor = (paper: no change; not judged), CIDEr ↑ 0/1 (1 tied)"
    )


def test_cells_best_choice_and_rows_the_world_cannot_make():
    table = pt.SLE.table("alpha")  # the paper chose α = 0.75 on CIDEr
    results = {0: {"sle_a025": {"CIDEr-D": 1.2}, "sle_a050": {"CIDEr-D": 1.5}, "sle": {"CIDEr-D": 1.4}},
               1: {"sle_a025": {"CIDEr-D": 1.0}, "sle_a050": {"CIDEr-D": 1.3}, "sle": {"CIDEr-D": 1.4}}}  # fmt: skip
    text = pt.render_table(table, results)
    # CIDEr x 100, mean ± std over the seeds: α = 0.5 -> 150, 130: mean 140, std 14.1
    assert "| α = 0.5 | — / 140.0 ± 14.1 |" in text
    assert "the best CIDEr (mean over 2 seed(s)) is α = 0.5 (140.00): does not hold." in text
    results[1]["sle_a050"]["CIDEr-D"] = 1.1  # α = 0.5 now 130 on average, α = 0.75 140
    assert "is α = 0.75 (chosen) (140.00): holds." in pt.render_table(table, results)
    smile3 = pt.SMILE.table("3")
    pt_row = next(r for r in smile3.rows if r.id == "pt")
    assert pt.row_verdict(smile3, pt_row, results).startswith("not comparable: the world has no pre-trained")
    assert all(pt.row_verdict(t, r, {}) == "not run yet" for t in pt.NDLB.tables if not t.runnable for r in t.rows)


def test_metric_keys_prefixes_and_expected_signs():
    assert pt.metric_value({"RD19/R@1": 0.5, "pool/R@1": 0.2}, "RD/R@1") == 0.5  # RD-N of the run, any N
    assert pt.metric_value({"listener/RD99/R@1": 0.25}, "listener/RD/R@1") == 0.25
    assert pt.metric_value({"CIDEr-D": float("nan")}, "CIDEr-D") is None
    table4 = pt.SLE.table("4")  # (rs) rows read sample/..., (bs) rows beam/...
    sle_rs = next(r for r in table4.rows if r.id == "sle_rs")
    assert pt.world_values({0: {"sle": {"sample/Div-2": 0.4, "Div-2": 0.9}}}, sle_rs, table4.columns[2]) == {0: 0.4}
    fig = pt.SMILE.table("fig4a")  # no numbers in a figure: the signs the text states (reverse subsetting shortens)
    results = {0: {"mle": {"Length": 8.0}, "smile_reverse": {"Length": 6.0}, "smile_random": {"Length": 8.5}}}
    rows = {r.id: r for r in fig.rows}
    assert pt.row_verdict(fig, rows["reverse"], results) == "holds: Length ↓ 1/1"
    assert pt.row_verdict(fig, rows["random"], results) == (
        "no paper effect to judge: Length = (paper: no change; not judged)"
    )


def test_every_table_is_well_formed():
    for paper in pt.PAPERS.values():
        for table in paper.tables:
            ids = [r.id for r in table.rows]
            assert len(ids) == len(set(ids)), (paper.key, table.id)
            for row in table.rows:
                assert not row.paper or len(row.paper) == len(table.columns), (paper.key, table.id, row.id)
                assert set(row.vs) <= set(ids), (paper.key, table.id, row.id)
                assert row.run is None or row.run in pt.RUNS, (paper.key, table.id, row.id)
                assert table.runnable or row.run is None
                assert row.run is not None or row.why or not table.runnable, (paper.key, table.id, row.id)
    for key, run in pt.RUNS.items():  # every run starts from a run that exists, and no run from itself
        assert run.init is None or (run.init in pt.RUNS and run.init != key), key
    # each run once, in order of first use (the MLE start appears in two SLE tables)
    sle_runs = pt.runs_of(pt.SLE, [t for t in pt.SLE.tables if t.runnable])
    assert sle_runs == ["scst", "scst_me", "sle", "mle", "sle_a025", "sle_a050", "scst_me_1e1", "scst_me_1e3"]
    # the tables the issue names for SLE and SMILE are defined with world runs
    assert {"2", "4", "alpha", "me_coef"} <= {t.id for t in pt.SLE.tables if t.runnable}
    assert {"1", "3", "4", "5"} <= {t.id for t in pt.SMILE.tables if t.runnable}


# --------------------------------------------------------------------------------------------------------------------
# The runner on a tiny world
# --------------------------------------------------------------------------------------------------------------------

N_TRAIN, N_VAL, N_TEST = 24, 6, 8


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny world, a tiny random CLIP (captioner encoder and retriever) and the overrides that make every run two
    steps of a one-layer ClipCap."""
    from finecap.config import WorldConfig
    from finecap.models.presets import save_tiny_clip
    from finecap.world.make import make_world

    root = tmp_path_factory.mktemp("paper-tables")
    world = root / "world"
    make_world(WorldConfig(n_train=N_TRAIN, n_val=N_VAL, n_test=N_TEST, image_size=32, seed=0), out=world,
               progress=False)  # fmt: skip
    clip = save_tiny_clip(root / "clip", image_size=32, patch_size=16)
    overrides = [
        f"world.out={world}", f"world.n_train={N_TRAIN}", f"world.n_val={N_VAL}", f"world.n_test={N_TEST}",
        "world.image_size=32", f"model.encoder={clip}", f"retriever.checkpoint={clip}", f"run.cache_dir={root / 'c'}",
        "clipcap.tiny_layers=1", "clipcap.tiny_hidden=32", "clipcap.tiny_heads=2", "clipcap.prefix_length=2",
        "train.max_steps=2", "train.batch_size=8", "train.eval_every=2", "train.eval_samples=4",
        "train.warmup_steps=0", "decode.max_length=6", "eval.n_distractors=3", "eval.draws=1",
    ]  # fmt: skip
    return root, overrides


def run_main(root: Path, overrides: list[str], *args: str) -> int:
    return pt.main([*args, "--quick", "--seeds", "0", "--runs-dir", str(root / "runs"), "--data-dir",
                    str(root / "data"), "--page-dir", str(root / "pages"), *overrides])  # fmt: skip


@pytest.fixture(scope="module")
def sle_run(tiny):
    root, overrides = tiny
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FINECAP_METEOR_JAR", str(root / "no-meteor.jar"))  # METEOR unavailable: said, not computed
        assert run_main(root, overrides, "--paper", "sle", "--tables", "2") == 0
    return root, overrides


def test_the_runner_writes_one_result_per_run_and_the_page(sle_run):
    root, _ = sle_run
    results = root / "data" / "sle" / "seed0"
    assert sorted(p.stem for p in results.glob("*.json")) == ["scst", "scst_me", "sle"]
    record = json.loads((results / "sle.json").read_text())
    assert record["quick"] and record["recipe"] == "sle" and record["init"] == "mle"
    assert {"CIDEr-D", "BLEU-4", "sample/Div-2", "beam/mBLEU-4"} <= set(record["metrics"])
    assert "METEOR" in record["unavailable"] and "METEOR" not in record["metrics"]
    # one MLE start, trained once, shared by the three runs (each starts from its best checkpoint)
    runs = root / "runs" / "seed0"
    assert sorted(p.name for p in runs.iterdir() if (p / "DONE").exists()) == ["mle", "scst", "scst_me", "sle"]
    for key in ("scst", "scst_me", "sle"):
        cfg = yaml.safe_load((runs / key / "config.yaml").read_text())
        assert Path(cfg["train"]["init_from"]) == runs / "mle" / "checkpoints" / "best"
    page = (root / "pages" / "sle.md").read_text()
    assert page.startswith("> QUICK RUN") and "World seeds with results: 0." in page
    table2 = page.split("## Table 2")[1].split("## ")[0]
    assert "not run yet" not in table2
    assert any(word in table2 for word in ("holds:", "does not hold:", "partly holds:", "no world difference:"))
    assert "not run yet" in page.split("## Table 4")[1]  # rows of runs not asked for (XE) wait for their run
    assert "Metrics not computed: METEOR" in page


def test_a_second_run_skips_existing_result_files_and_resumes(sle_run, monkeypatch):
    from finecap.app.train import train as real_train

    root, overrides = sle_run
    results = root / "data" / "sle" / "seed0"
    # a result file stands for its run: a hand-edited number must come back on the page untouched
    scst = json.loads((results / "scst.json").read_text())
    scst["metrics"]["CIDEr-D"] = 12.345
    (results / "scst.json").write_text(json.dumps(scst))
    before = (results / "scst_me.json").stat().st_mtime_ns
    (results / "sle.json").unlink()  # as if killed after training sle, before its evaluation

    def no_training(*args, **kwargs):
        raise AssertionError("a run with a DONE marker was trained again")

    monkeypatch.setattr("finecap.app.train.train", no_training)
    monkeypatch.setenv("FINECAP_METEOR_JAR", str(root / "no-meteor.jar"))
    assert run_main(root, overrides, "--paper", "sle", "--tables", "2") == 0
    assert (results / "sle.json").exists()  # evaluated again
    assert (results / "scst_me.json").stat().st_mtime_ns == before  # skipped
    assert json.loads((results / "scst.json").read_text())["metrics"]["CIDEr-D"] == 12.345
    page = (root / "pages" / "sle.md").read_text()
    assert "| SLL | — / 1234.5 | 115.0 / " not in page  # columns: Meteor first
    assert "| SLL | 26.8 / — | 115.0 / 1234.5 | 20.0 / — |" in page
    # a run killed during training (no DONE marker, a checkpoint) resumes from its last checkpoint
    (root / "runs" / "seed0" / "sle" / "DONE").unlink()
    (results / "sle.json").unlink()
    calls = []
    monkeypatch.setattr("finecap.app.train.train", lambda cfg, **kw: calls.append(kw) or real_train(cfg, **kw))
    assert run_main(root, overrides, "--paper", "sle", "--tables", "2") == 0
    assert calls == [{"resume": True, "overwrite": False}] and (root / "runs" / "seed0" / "sle" / "DONE").exists()
    # the page alone, from the files (nothing to run)
    (root / "pages" / "sle.md").unlink()
    assert pt.main(["--paper", "sle", "--page-only", "--data-dir", str(root / "data"), "--page-dir",
                    str(root / "pages")]) == 0  # fmt: skip
    assert "115.0 / 1234.5" in (root / "pages" / "sle.md").read_text()


def test_another_paper_reuses_the_mle_start(sle_run, monkeypatch):
    root, overrides = sle_run
    from finecap.app import train as train_module

    trained = []
    real = train_module.train

    def record(cfg, **kwargs):
        trained.append(Path(cfg.run.dir).name)
        return real(cfg, **kwargs)

    monkeypatch.setattr("finecap.app.train.train", record)
    assert run_main(root, overrides, "--paper", "smile", "--tables", "4") == 0
    assert sorted(trained) == ["smile", "smile_nofirst", "smile_shift"]  # the MLE start of the SLE run is reused
    record_ = json.loads((root / "data" / "smile" / "seed0" / "smile_shift.json").read_text())
    assert record_["overrides"] == ["smile.first_token=shift", "smile.shift_token_id=2"]
    assert {"Length", "pool/R@1", "CLIPScore", "perplexity"} <= set(record_["metrics"])  # the fluency LM's PPL
    assert (root / "runs" / "seed0" / "fluency_lm" / "DONE").exists()
    page = (root / "pages" / "smile.md").read_text()
    assert "| default (first-token MLE) | 22.3 / " in page and "## Table 3" in page
