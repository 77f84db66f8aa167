"""The world VLM's demo stages (``vlm_mle`` and ``vlm_smile`` in the default list, ``vlm_discritune`` optional): how
they are configured, and the quick demo's rows of the two default ones in its table (results.json / results.md)."""

import json

import pytest

from finecap.app.cli import main
from finecap.app.demo import QUICK, TRAIN_STAGES, VLM_STAGES, demo_runner, load_demo_config
from finecap.config import DemoConfig
from finecap.report.table import QUICK_TITLE
from finecap.stages import StageRunner

OBJECTIVES = {"vlm_mle": "mle", "vlm_smile": "smile", "vlm_discritune": "reinforce"}


def _demo(tmp_path, quick: bool) -> StageRunner:
    return demo_runner(load_demo_config(None, [], quick), [], quick, tmp_path / "run")


def test_vlm_stages_are_training_stages_starting_from_vlm_mle():
    assert VLM_STAGES == {"vlm_mle": None, "vlm_smile": "vlm_mle", "vlm_discritune": "vlm_mle"}
    assert all(TRAIN_STAGES[stage] == init for stage, init in VLM_STAGES.items())
    default = DemoConfig().stages  # the VLM row of the default demo (issue 26); vlm_discritune is optional
    assert {"vlm_mle", "vlm_smile"} <= set(default) and "vlm_discritune" not in default
    assert default.index("vlm_mle") < default.index("vlm_smile")


@pytest.mark.parametrize("quick", [False, True])
def test_vlm_stage_configs_train_the_world_vlm(tmp_path, quick):
    demo = _demo(tmp_path, quick)
    for stage, objective in OBJECTIVES.items():
        cfg = demo.stage_config(stage)
        m = cfg.model
        got = (m.kind, cfg.vlm.name, m.encoder, cfg.train.objective)
        assert got == ("vlm", "world-tiny", "world", objective), stage
        assert cfg.run.dir == str(demo.stage_dir(stage))
        init = VLM_STAGES[stage]
        expected = "" if init is None else str(demo.stage_dir(init) / "checkpoints" / "best")
        assert (cfg.train.init_from or "") == expected, stage
        # --quick applies on top, as for every stage; the full stages have the world BLIP stages' budgets
        blip = demo.stage_config(stage.replace("vlm_", "blip_")).train
        budget = (cfg.train.max_steps, cfg.train.batch_size, cfg.train.lr, cfg.train.schedule)
        assert budget == (blip.max_steps, blip.batch_size, blip.lr, blip.schedule), stage
        if quick:
            assert (cfg.train.max_steps, cfg.train.batch_size) == (QUICK["train"]["max_steps"], 32)
    discritune = demo.stage_config("vlm_discritune")
    assert discritune.model.train_lm and not discritune.model.train_encoder and discritune.vlm.train_projector
    assert (discritune.rl.rewards, discritune.sr.distractors, discritune.rl.logprob) == ({"retrieval": 1.0}, "batch",
                                                                                          "mean")  # fmt: skip


def test_vlm_smile_before_vlm_mle_is_an_error_naming_it(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(["demo", "--quick", "--run-dir", str(run_dir), "--stages", "vlm_smile"]) == 2
    assert "demo stage 'vlm_smile' starts from stage 'vlm_mle', which has not run yet" in capsys.readouterr().err
    assert not (run_dir / "vlm_smile").exists()


@pytest.mark.slow
def test_quick_demo_adds_world_vlm_rows_to_the_table(quick_demo_run):
    """The session's `finecap demo --quick` (default stages, tests/conftest.py) trains the two VLM stages of the
    default list, and the report scores them like every stage."""
    run_dir = quick_demo_run.run_dir
    results = json.loads((run_dir / "results.json").read_text())
    assert {"human", "vlm_mle", "vlm_smile"} <= set(results) and "vlm_discritune" not in results  # stages that ran
    for stage in ("vlm_mle", "vlm_smile"):
        row = results[stage]
        for key in ("Length", "RD19/R@1", "faith/precision", "faith/recall", "faith/halluc_rate", "CIDEr-D",
                    "listener/RD19/R@1", "bag3/R@1"):  # fmt: skip
            assert key in row, (stage, key)
        assert 0.0 <= row["RD19/R@1"] <= 1.0 and 0.0 <= row["faith/precision"] <= 1.0
        captions = json.loads((run_dir / "captions" / f"{stage}.json").read_text())
        assert len(captions) == 100 and all(c["caption"] for c in captions)
        # world captions are lower-case words without punctuation: their length is the number of words
        assert row["Length"] == pytest.approx(sum(len(c["caption"].split()) for c in captions) / len(captions))
        meta = json.loads((run_dir / stage / "checkpoints" / "best" / "model" / "captioner.json").read_text())
        assert (meta["kind"], meta["family"], meta["source"]) == ("vlm", "llava", "world-tiny")
        assert meta["world_source"] and not meta["world_saved"]  # reads the frozen world encoder
    table = (run_dir / "results.md").read_text()
    assert table.startswith(QUICK_TITLE) and "| vlm_mle |" in table and "| vlm_smile |" in table

    # vlm_smile trained SMILE from vlm_mle's best checkpoint, for the quick number of steps
    saved = (run_dir / "vlm_smile" / "config.yaml").read_text()
    assert f"init_from: {run_dir / 'vlm_mle' / 'checkpoints' / 'best'}" in saved
    events = [json.loads(line) for line in (run_dir / "vlm_smile" / "metrics.jsonl").read_text().splitlines()]
    train_steps = [e["step"] for e in events if e["split"] == "train" and "loss/smile" in e["values"]]
    assert train_steps and max(train_steps) == QUICK["train"]["max_steps"]
    timings = json.loads((run_dir / "timings.json").read_text())
    assert set(DemoConfig().stages) <= set(timings)  # other tests add stages (vcb, transfer) to the shared run
