"""Demo stages at unit level (no training): a finished stage is reused only on the inputs it recorded, and the VCB
and transfer tables of a quick demo are titled as quick."""

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from finecap.app import demo as demo_mod
from finecap.app import demo_transfer, demo_vcb
from finecap.app.demo import Demo, load_demo_config
from finecap.config import WorldConfig
from finecap.data.fingerprint import FINGERPRINTS_FILE, FingerprintMismatch, data_fingerprint, write_fingerprints
from finecap.report.table import QUICK_TITLE
from finecap.world.make import make_world

SIZES = {"n_train": 4, "n_val": 2, "n_test": 3, "image_size": 32}


def _world(folder: Path, seed: int) -> list[str]:
    make_world(WorldConfig(**SIZES, seed=seed), folder, progress=False)
    return [f"world.out={folder}", f"world.seed={seed}", *(f"world.{k}={v}" for k, v in SIZES.items())]


def _demo(tmp_path: Path, items: list[str], quick: bool = True) -> Demo:
    items = [*items, f"run.cache_dir={tmp_path / 'cache'}"]
    return Demo(cfg=load_demo_config(None, items, quick), items=items, quick=quick, run_dir=tmp_path / "run")


# --------------------------------------------------------------------------------------------------------------------
# A finished stage is reused only when its run recorded the same inputs
# --------------------------------------------------------------------------------------------------------------------


def test_a_finished_stage_on_other_inputs_is_refused_not_reused(tmp_path, monkeypatch, caplog):
    trained: list[tuple[str, bool]] = []
    monkeypatch.setattr(demo_mod, "train", lambda cfg, resume, overwrite: trained.append((cfg.run.dir, overwrite)))
    monkeypatch.setattr(demo_mod, "caption_stage", lambda demo, stage: None)  # decoding needs a checkpoint
    first = _demo(tmp_path, _world(tmp_path / "world_a", seed=0))
    out = first.stage_dir("mle")
    out.mkdir(parents=True)
    write_fingerprints(out, first.stage_config("mle"))  # what training records
    (out / "DONE").write_text("ok\n")
    recorded = json.loads((out / FINGERPRINTS_FILE).read_text())["data"]

    caplog.set_level(logging.INFO, logger="finecap")
    demo_mod.STAGES["mle"](first)  # the same inputs: reused
    assert trained == [] and f"mle: already trained ({out}); skipping" in caplog.messages

    # The demo re-run on another world (world.seed changed): the stage's run is not silently reused.
    other = _demo(tmp_path, _world(tmp_path / "world_b", seed=1))
    now = data_fingerprint(other.stage_config("mle"))
    assert now["id"] != recorded["id"]
    with pytest.raises(FingerprintMismatch) as e:
        demo_mod.STAGES["mle"](other)
    message = str(e.value)
    assert message.startswith("demo stage 'mle' was trained on other inputs than this demo's")
    assert f"data fingerprint {recorded['id']} at {recorded['path']} (recorded) differs from {now['id']}" in message
    assert f"world_key: '{recorded['world_key']}' -> '{now['world_key']}'" in message and "--force" in message
    assert trained == []
    # --force (demo.force): the stage trains again, over its old run.
    forced = _demo(tmp_path, [*other.items, "demo.force=true"])
    demo_mod.STAGES["mle"](forced)
    assert trained == [(str(out), True)]


# --------------------------------------------------------------------------------------------------------------------
# Quick runs are labelled quick in the VCB and transfer tables
# --------------------------------------------------------------------------------------------------------------------

ROW = {"Length": 3.0, "CIDEr-D": 0.5}


def _fake_demo(tmp_path: Path, quick: bool) -> SimpleNamespace:
    run_dir = tmp_path / ("quick" if quick else "full")
    return SimpleNamespace(cfg=load_demo_config(None, [], quick), quick=quick, run_dir=run_dir,
                           stage_dir=lambda stage: run_dir / stage)  # fmt: skip


@pytest.mark.parametrize("quick", [True, False])
def test_vcb_results_md_is_titled_quick_for_a_quick_demo(tmp_path, monkeypatch, quick, capsys):
    demo = _fake_demo(tmp_path, quick)
    records = [SimpleNamespace(image_id=1, captions=["a", "b"])]
    monkeypatch.setattr(demo_vcb, "_context", lambda demo: (records, {}, None, {}))
    monkeypatch.setattr(demo_vcb, "evaluate", lambda *a, **k: dict(ROW))
    (demo.run_dir / "mle").mkdir(parents=True)
    (demo.run_dir / "mle" / "captions_test.json").write_text(json.dumps([{"image_id": 1, "caption": "a b"}]))
    (demo.run_dir / "vcb_captions.json").write_text(json.dumps({"BlendCap": ROW}))
    rows = demo_vcb.stage_report(demo)
    assert set(rows) == {"mle"}
    table = (demo.run_dir / "vcb_results.md").read_text()
    assert table.startswith(QUICK_TITLE + "\n\nCaption fields of the test split") == quick
    assert (QUICK_TITLE in table) == quick and (QUICK_TITLE in capsys.readouterr().out) == quick


@pytest.mark.parametrize("quick", [True, False])
def test_transfer_results_md_is_titled_quick_for_a_quick_demo(tmp_path, monkeypatch, quick, capsys):
    demo = _fake_demo(tmp_path, quick)
    records = [SimpleNamespace(image_id=1)]
    refs = SimpleNamespace(records=records, captions=lambda: {1: ["a", "b"]}, scenes={})
    monkeypatch.setattr(demo_transfer, "prepare", lambda cfg, needs, make: SimpleNamespace(world=tmp_path / "w"))
    monkeypatch.setattr(demo_transfer, "load_references", lambda *a, **k: refs)
    monkeypatch.setattr(demo_transfer, "build_bags", lambda *a, **k: None)
    monkeypatch.setattr(demo_transfer, "read_bags", lambda path: {})
    monkeypatch.setattr(demo_transfer, "load_retriever", lambda cfg: None)
    monkeypatch.setattr(demo_transfer, "evaluate", lambda *a, **k: dict(ROW))
    rows = demo_transfer.stage_transfer(demo, [], lambda demo, stage: None)
    assert set(rows) == {"human"}
    table = (demo.run_dir / "transfer" / "results.md").read_text()
    assert table.startswith(QUICK_TITLE + "\n\n| stage | Length | CIDEr-D |") == quick
    assert table.startswith("| stage | Length | CIDEr-D |") != quick
    assert (QUICK_TITLE in capsys.readouterr().out) == quick


@pytest.mark.slow
def test_side_stages_give_the_same_results_whatever_the_job_count(tmp_path, capsys):
    """Stages that start from MLE run side by side (demo.jobs) with demo.stage_threads threads each; the captions and
    the results table do not depend on how many run at once."""
    from finecap.app.cli import main

    stages = "world,retriever,mle,smile,mle_continued,report"  # report: sampled diversity of mle, mle_continued
    results = {}
    for jobs in (1, 2):
        out = tmp_path / f"jobs{jobs}"
        assert main(["demo", "--quick", "--out", str(out), "--stages", stages, f"demo.jobs={jobs}"]) == 0
        results[jobs] = out
        err = capsys.readouterr().err  # the side stages' own lines, from worker processes with demo.jobs=2
        assert err.count("train: 12 steps") == 3 and "beside 1 others" in err or jobs == 1
    for stage in ("mle", "smile", "mle_continued"):
        a, b = (json.loads((results[j] / stage / "captions_test.json").read_text()) for j in (1, 2))
        assert a == b, stage
    a, b = (json.loads((results[j] / "results.json").read_text()) for j in (1, 2))
    assert a == b
    timings = json.loads((results[2] / "timings.json").read_text())
    assert set(timings) == set(stages.split(","))


def test_side_stages_are_those_nothing_starts_from():
    from finecap.app.demo import side_stages

    assert side_stages(["world", "retriever", "mle", "smile", "scst", "blip_mle", "blip_smile", "report"]) == {
        "smile", "scst", "blip_smile"}  # fmt: skip
    assert side_stages(["mle", "report"]) == {"mle"}  # nothing starts from it: it may run beside others
