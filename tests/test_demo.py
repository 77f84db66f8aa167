"""`finecap demo --quick` end to end: every stage runs, writes its outputs, and a re-run skips finished work."""

import json

import pytest

from finecap.app.cli import main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def quick_demo(quick_demo_run):
    return quick_demo_run  # session-wide (tests/conftest.py): the browser tests open its report.html


def test_quick_demo_writes_table_captions_and_checkpoints(quick_demo):
    run_dir, _ = quick_demo
    results = json.loads((run_dir / "results.json").read_text())
    expected = {"human", "mle", "mle_continued", "smile", "scst", "sle", "discritune", "sr_bagcurri", "blip_mle",
                "blip_smile"}  # fmt: skip
    assert expected <= set(results)
    for stage, row in results.items():
        for key in ("Length", "faith/precision", "faith/recall", "RD19/R@1", "bag3/R@1", "CIDEr-D"):
            assert key in row, (stage, key)
        assert 0.0 <= row["RD19/R@1"] <= 1.0 and 0.0 <= row["faith/precision"] <= 1.0
    assert results["human"]["faith/precision"] == 1.0  # reference captions state only true facts
    for stage in ("mle", "smile", "scst", "blip_smile"):
        assert (run_dir / stage / "checkpoints" / "best" / "model").is_dir()
        captions = json.loads((run_dir / "captions" / f"{stage}.json").read_text())
        assert len(captions) == 100 and all(c["caption"] for c in captions)
    assert "sample/Div-2" in results["scst"] and "beam/mBLEU-4" in results["mle"]
    table = (run_dir / "results.md").read_text()
    assert table.startswith("| stage |") and "| smile |" in table
    assert (run_dir / "report.html").stat().st_size > 0  # the HTML report (tests/report/test_browser.py opens it)


def test_rerun_skips_finished_stages(quick_demo, capsys):
    run_dir, argv = quick_demo
    before = (run_dir / "mle" / "checkpoints" / "best" / "trainer_state.json").stat().st_mtime_ns
    assert main([*argv, "--stages", "world,mle"]) == 0
    assert "mle: already trained" in capsys.readouterr().out
    assert (run_dir / "mle" / "checkpoints" / "best" / "trainer_state.json").stat().st_mtime_ns == before
