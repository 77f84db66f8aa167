"""Issue 54's run seeds on the paper-tables runner (benchmarks/paper_tables/, ``--run-seeds``) on a tiny world: the
runs of a table's primary cells trained again under other run seeds in ``<runs>/seed<N>/run<M>/`` (the whole chain
of the comparison, MLE start included), one result file each in ``<data>/<paper>/seed<N>/run<M>/``, resumed by
skipping existing result files, and the page's primary cell judged over run seeds and test images."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # as `python benchmarks/paper_tables.py` has it
import paper_tables as pt  # noqa: E402  (the package benchmarks/paper_tables/)
from helpers.paper_tables_world import tiny_world  # noqa: E402

pytestmark = pytest.mark.slow  # trains 9 two-step runs on a tiny world


def run_main(root: Path, overrides: list[str], *args: str) -> int:
    return pt.main([*args, "--quick", "--seeds", "0", "--runs-dir", str(root / "runs"), "--data-dir",
                    str(root / "data"), "--page-dir", str(root / "pages"), "--paper", "sle", "--tables", "2",
                    *overrides])  # fmt: skip


@pytest.fixture(scope="module")
def replicated(tmp_path_factory):
    root = tmp_path_factory.mktemp("replicates")
    overrides = tiny_world(root)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FINECAP_METEOR_JAR", str(root / "no-meteor.jar"))  # METEOR unavailable: said, not computed
        assert run_main(root, overrides) == 0  # the grid's own runs (run seed = world seed 0)
        assert run_main(root, overrides, "--run-seeds", "5,6") == 0
    return root, overrides


def test_the_primary_cells_runs_are_trained_again_under_each_run_seed(replicated):
    root, _ = replicated
    assert pt.primary_runs([pt.SLE.table("2")]) == ["sle", "scst"]  # SLL-SLE against SLL on CIDEr
    runs, data = root / "runs" / "seed0", root / "data" / "sle" / "seed0"
    for run_seed in (5, 6):
        folder = runs / f"run{run_seed}"
        # the comparison's chain again: its MLE start too, not the runs of secondary cells (scst_me)
        assert sorted(p.name for p in folder.iterdir() if (p / "DONE").exists()) == ["mle", "scst", "sle"]
        for key in ("scst", "sle"):
            cfg = yaml.safe_load((folder / key / "config.yaml").read_text())
            assert cfg["run"]["seed"] == run_seed and cfg["world"]["seed"] == 0
            assert Path(cfg["train"]["init_from"]) == folder / "mle" / "checkpoints" / "best"
            record = json.loads((data / f"run{run_seed}" / f"{key}.json").read_text())
            assert record["run_seed"] == run_seed and record["seed"] == 0 and "CIDEr-D" in record["metrics"]
            assert (data / f"run{run_seed}" / f"{key}.items.json").exists()
        assert yaml.safe_load((folder / "mle" / "config.yaml").read_text())["run"]["seed"] == run_seed
    # the grid's own runs are untouched, and remain the run seed 0 ones
    assert yaml.safe_load((runs / "sle" / "config.yaml").read_text())["run"]["seed"] == 0


def test_the_page_judges_the_primary_cell_over_run_seeds(replicated, tmp_path):
    root, _ = replicated
    page = (root / "pages" / "sle.md").read_text()
    table2 = page.split("## Table 2")[1].split("## ")[0]
    sle_row = next(line for line in table2.splitlines() if line.startswith("| SLL-SLE (ours) |"))
    # two training steps leave SCST's and SLE's captions alike: no noise measured, over the three run seeds
    assert (
        "★ CIDEr vs SLL ↑ no noise estimate (3 run seeds per world seed: retraining and test-split noise; " in sle_row
    )
    assert "CIDEr vs SLL-ME ↑ " in sle_row and "Cells without ★ (secondary): one run: test-split noise only" in table2
    primary = page.split("## Primary cells")[1].split("## ")[0]
    assert "| Table 2 | SLL-SLE (ours) | SLL | CIDEr | no noise estimate | 3 run seeds per world seed" in primary
    # the same files with SLE's CIDEr-D raised by 0.5, 0.6, 0.4 on every image under run seeds 0, 5 and 6: per run
    # seed +50, +60, +40 (x 100), 50 ± 4.303 * 10 / sqrt(3) = [25.2, 74.8] over run seeds: holds
    data = tmp_path / "data"
    shutil.copytree(root / "data", data)
    for folder, shift in ((data / "sle" / "seed0", 0.5), (data / "sle" / "seed0" / "run5", 0.6),
                          (data / "sle" / "seed0" / "run6", 0.4)):  # fmt: skip
        record = json.loads((folder / "sle.json").read_text())
        record["metrics"]["CIDEr-D"] += shift
        (folder / "sle.json").write_text(json.dumps(record))
        items = json.loads((folder / "sle.items.json").read_text())
        items["groups"][0]["values"]["CIDEr-D"] = [v + shift for v in items["groups"][0]["values"]["CIDEr-D"]]
        (folder / "sle.items.json").write_text(json.dumps(items))
    assert pt.main(["--paper", "sle", "--page-only", "--data-dir", str(data), "--page-dir", str(tmp_path)]) == 0
    sle_row = next(line for line in (tmp_path / "sle.md").read_text().split("## Table 2")[1].splitlines()
                   if line.startswith("| SLL-SLE (ours) |"))  # fmt: skip
    assert (
        "★ CIDEr vs SLL ↑ holds (3 run seeds per world seed: retraining and test-split noise; per seed: holds 1; "
        "Δ +50.0 [+25.2, +74.8])" in sle_row
    ), sle_row


def test_a_second_call_skips_the_runs_with_results(replicated, monkeypatch):
    root, overrides = replicated

    def no_training(*args, **kwargs):
        raise AssertionError("a run with a result file was trained again")

    monkeypatch.setattr("finecap.train.run.train", no_training)
    monkeypatch.setenv("FINECAP_METEOR_JAR", str(root / "no-meteor.jar"))
    before = (root / "data" / "sle" / "seed0" / "run5" / "sle.json").stat().st_mtime_ns
    assert run_main(root, overrides, "--run-seeds", "5,6") == 0
    assert (root / "data" / "sle" / "seed0" / "run5" / "sle.json").stat().st_mtime_ns == before


@pytest.mark.parametrize("run_seeds", ["0", "5,0"])
def test_a_run_seed_that_is_a_world_seeds_own_is_refused(replicated, run_seeds):
    root, overrides = replicated
    with pytest.raises(SystemExit, match="--run-seeds: 0 is also a world seed"):
        run_main(root, overrides, "--run-seeds", run_seeds)


def test_each_replicate_has_its_world_encoder_before_its_first_run(replicated, monkeypatch):
    # a replicate trains under run.seed=M, which keys its world encoder; a replicate whose first run trains on boosted
    # captions (NDLB's) builds none, so the runner prepares the replicate's world and encoder before any run of it
    root, overrides = replicated
    events: list[tuple[str, int]] = []
    import finecap.train.prepare

    monkeypatch.setattr(finecap.train.prepare, "prepare",
                        lambda cfg, needs, **kw: events.append(("prepare", cfg.run.seed)))  # fmt: skip
    monkeypatch.setattr(pt.cli, "ensure_shared", lambda *a, **kw: None)
    monkeypatch.setattr(pt.cli, "record_run",
                        lambda rep, paper, key, result, **kw: events.append(("run", kw["run_seed"])))  # fmt: skip
    monkeypatch.setattr(pt.cli, "write_page", lambda *a, **kw: root / "page.md")
    fresh = root / "fresh-data"  # no result files: every primary run is to do
    assert pt.main(["--quick", "--seeds", "0", "--runs-dir", str(root / "runs"), "--data-dir", str(fresh),
                    "--page-dir", str(root / "pages"), "--paper", "sle", "--tables", "2", "--run-seeds", "7",
                    *overrides]) == 0  # fmt: skip
    assert events[: events.index(("run", 7))] == [("prepare", 0), ("prepare", 7)]
