"""The stage runner (finecap.stages) on tiny fake stages that do not train: the stage table is passed in, the
configuration layers, DONE markers and resume, the input check naming what is missing, and side stages run in
worker processes with their own thread count."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import yaml

from finecap.config import Config, ConfigError, load
from finecap.stages import DONE, TASK, TRAIN, MissingInput, Stage, StageRunner, stage_table
from finecap.stages.runner import START_FILE
from finecap.train.fingerprint import FingerprintMismatch


def fake_train(cfg: Config, *, resume: bool, overwrite: bool) -> None:
    """Stands in for the training recipe: records how it was called, in which process, with how many threads."""
    import torch

    out = Path(cfg.run.dir)
    out.mkdir(parents=True, exist_ok=True)
    record = {"resume": resume, "overwrite": overwrite, "pid": os.getpid(), "threads": torch.get_num_threads(),
              "lr": cfg.train.lr, "init_from": cfg.train.init_from, "max_steps": cfg.train.max_steps}  # fmt: skip
    (out / "trained.json").write_text(json.dumps(record))


def saving_train(cfg: Config, *, resume: bool, overwrite: bool) -> None:
    """:func:`fake_train` that also saves what training saves and a finished stage is compared with: its
    configuration (``config.yaml``, remembered as finecap's as training writes it) and, in its best checkpoint,
    "weights" made from its learning rate."""
    from finecap.outputs import write_output

    fake_train(cfg, resume=resume, overwrite=overwrite)
    best = Path(cfg.run.dir) / "checkpoints" / "best" / "model"
    best.mkdir(parents=True, exist_ok=True)
    (best / "model.safetensors").write_text(f"weights of lr {cfg.train.lr}")
    (best.parent / "config.yaml").write_text(cfg.to_yaml())  # a checkpoint folder, which a later stage starts from
    write_output(Path(cfg.run.dir) / "config.yaml", cfg.to_yaml(), "config")


def note_then(runner: StageRunner, stage: str) -> str:
    """A training stage's ``then``: what the demo's test-split captions stand for."""
    (runner.stage_dir(stage) / "then.txt").write_text("after\n")
    return stage


def make_world(runner: StageRunner) -> str:
    runner.run_dir.mkdir(parents=True, exist_ok=True)
    (runner.run_dir / "world.txt").write_text("made\n")
    return "world made"


def _recipe(tmp_path: Path) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({"train": {"lr": 0.01, "max_steps": 7}}))
    return str(path)


def _runner(tmp_path: Path, train=fake_train, **kwargs) -> StageRunner:
    recipe = _recipe(tmp_path)
    table = stage_table([
        Stage("world", run=make_world),
        Stage("start", TRAIN, recipe=recipe, then=note_then),
        Stage("a", TRAIN, recipe=recipe, overrides=("train.lr=0.02",), init="start", then=note_then),
        Stage("b", TRAIN, recipe=recipe, init="start", then=note_then),
    ])  # fmt: skip
    return StageRunner(table, load(None, []), tmp_path / "run", train=train, **kwargs)


def _trained(runner: StageRunner, stage: str) -> dict:
    return json.loads((runner.stage_dir(stage) / "trained.json").read_text())


def test_a_finished_stage_is_not_trained_again_and_its_then_still_runs(tmp_path):
    runner = _runner(tmp_path)
    assert runner.run(["world", "start"]) == {"world": "world made"}  # a side stage's result is not returned
    first = _trained(runner, "start")
    assert (first["resume"], first["overwrite"]) == (False, False)  # a fresh folder: trained from the start
    assert (runner.stage_dir("start") / DONE).read_text() == "ok\n"
    (runner.stage_dir("start") / "trained.json").unlink()
    (runner.stage_dir("start") / "then.txt").unlink()
    assert runner.train_stage("start") is False  # DONE: reused
    assert not (runner.stage_dir("start") / "trained.json").exists()
    assert runner.run_stage("start") == "start" and (runner.stage_dir("start") / "then.txt").exists()
    forced = _runner(tmp_path, force=True)
    assert forced.train_stage("start") is True
    assert (_trained(forced, "start")["resume"], _trained(forced, "start")["overwrite"]) == (False, True)


def test_an_unfinished_stage_resumes_from_its_last_checkpoint(tmp_path):
    """A killed stage (no DONE, a complete ``last`` checkpoint: its trainer state and state folder) resumes."""
    from finecap.train.state import STATE_DIR

    runner = _runner(tmp_path)
    last = runner.stage_dir("start") / "checkpoints" / "last"
    (last / STATE_DIR).mkdir(parents=True)
    (last / "trainer_state.json").write_text(json.dumps({"step": 3}))
    assert runner.train_stage("start") is True
    assert (_trained(runner, "start")["resume"], _trained(runner, "start")["overwrite"]) == (True, False)


def test_a_stage_whose_input_has_not_run_is_refused_naming_it(tmp_path):
    runner = _runner(tmp_path, what="grid run")
    with pytest.raises(MissingInput, match="grid run 'a' starts from stage 'start', which has not run yet"):
        runner.run_stage("a")
    assert not runner.stage_dir("a").exists()  # nothing trained, nothing written
    table = stage_table([Stage("t", TRAIN, recipe=_recipe(tmp_path)), Stage("report", run=make_world, inputs=("t",))])
    needs = StageRunner(table, load(None, []), tmp_path / "run2", train=fake_train)
    with pytest.raises(MissingInput, match="'report' needs stage 't', which has not run yet"):
        needs.run(["report"])


def test_the_stage_table_is_the_runners_own(tmp_path):
    """Two runners, two tables: a stage one of them lacks is unknown to it, whatever the other holds."""
    mine = _runner(tmp_path)
    other = StageRunner(stage_table([Stage("only", run=make_world)]), load(None, []), tmp_path / "o", fake_train)
    assert other.run(["only"]) == {"only": "world made"}
    with pytest.raises(ValueError, match=r"unknown stage\(s\) \['only'\]; valid stages: world, start, a, b"):
        mine.run(["only"])
    with pytest.raises(ValueError, match="'a' needs 'missing', not in the stage table"):
        stage_table([Stage("a", TRAIN, recipe="demo/mle", init="missing")])
    with pytest.raises(ValueError, match="given twice"):
        stage_table([Stage("a", run=make_world), Stage("a", run=make_world)])
    with pytest.raises(ValueError, match="a task is its run function alone"):
        Stage("t", TASK, run=make_world, recipe="demo/mle")


def test_a_stages_configuration_layers_base_recipe_over_overrides_computed_items(tmp_path):
    def computed(runner: StageRunner, stage: str) -> list[str]:
        return ["train.max_steps=9"] if stage == "a" else []

    runner = _runner(tmp_path, base={"train": {"lr": 0.5, "warmup_steps": 3}}, over={"train": {"lr": 0.03}},
                     computed=computed, items=["train.max_steps=11"])  # fmt: skip
    start, a = runner.stage_config("start"), runner.stage_config("a")
    assert start.train.warmup_steps == 3  # base: beneath the recipe, fills in what it leaves open
    assert start.train.lr == 0.03  # over: above the recipe's 0.01
    assert a.train.lr == 0.02  # the stage's own override: above over
    assert a.train.max_steps == 11 and start.train.max_steps == 11  # items above computed and the recipe
    assert _runner(tmp_path, computed=computed).stage_config("a").train.max_steps == 9  # computed above the recipe
    assert a.run.dir == str(runner.stage_dir("a"))
    assert a.train.init_from == str(runner.stage_dir("start") / "checkpoints" / "best") and not start.train.init_from


@pytest.mark.slow  # spawned workers import torch: about 20 s on the 2-core machine
def test_side_stages_run_in_worker_processes_with_their_thread_count(tmp_path):
    """``a`` and ``b`` start from ``start`` and nothing starts from them: they run side by side, each in a worker
    process with one torch thread; ``start`` (an input of both) and the task run here."""
    runner = _runner(tmp_path, saving_train)  # a best checkpoint of `start`, which `a` and `b` start from
    stages = ["world", "start", "a", "b"]
    assert runner.side_stages(stages) == {"a", "b"}
    timings = tmp_path / "timings.json"
    results = runner.run(stages, jobs=2, threads=1, timings_file=timings)
    assert results == {"world": "world made", "start": "start"}
    assert _trained(runner, "start")["pid"] == os.getpid()
    workers = {_trained(runner, s)["pid"] for s in ("a", "b")}
    assert os.getpid() not in workers
    assert all(_trained(runner, s)["threads"] == 1 for s in ("a", "b"))
    assert all((runner.stage_dir(s) / DONE).exists() and (runner.stage_dir(s) / "then.txt").exists() for s in "ab")
    assert set(json.loads(timings.read_text())) == set(stages)


def test_finished_stages_are_read_with_the_configuration_they_saved(tmp_path):
    """A runner over finished stages configures each from its own config.yaml (what it trained with) and trains
    nothing; a stage without its DONE marker is named."""
    from finecap.stages import finished_stages

    run_dir = tmp_path / "run"
    (run_dir / "mle").mkdir(parents=True)
    load(None, ["train.lr=0.07"]).save(run_dir / "config.yaml")
    load(None, ["train.lr=0.003", "decode.beam_size=4", f"run.dir={run_dir / 'mle'}"]).save(
        run_dir / "mle" / "config.yaml"
    )
    with pytest.raises(MissingInput, match="stage\\(s\\) mle have not finished"):
        finished_stages(run_dir, ["mle"])
    (run_dir / "mle" / DONE).write_text("ok\n")
    runner = finished_stages(run_dir, ["mle"])
    cfg = runner.stage_config("mle")
    assert (cfg.train.lr, cfg.decode.beam_size, cfg.run.dir) == (0.003, 4, str(run_dir / "mle"))
    assert runner.cfg.train.lr == 0.07  # the run directory's own configuration
    with pytest.raises(RuntimeError, match="trains nothing"):
        runner.train(cfg, resume=False, overwrite=True)
    # a stage folder is data: its config naming code of one's own is refused, not used to decode
    load(None, ["decode.engine=planted_engine:E", f"run.dir={run_dir / 'mle'}"]).save(run_dir / "mle" / "config.yaml")
    with pytest.raises(ConfigError, match=r"mle/config.yaml: decode.engine names 'planted_engine:E'"):
        finished_stages(run_dir, ["mle"])


def test_a_finished_stage_stored_by_an_older_finecap_is_read_as_a_stored_configuration(tmp_path, caplog):
    """A stage's config.yaml written before the backbone sections and the rl split (model.prefix_length, rl.alpha),
    with an option its run set but never read (rl.baseline beside group advantages), configures the stage as
    load_stored reads it: it was read as a recipe, which refuses the former model keys and the unread option, and
    took every stored option for one the recipe set (a warning for each the run does not read)."""
    from finecap.config import load_stored
    from finecap.stages import finished_stages

    run_dir = tmp_path / "run"
    (run_dir / "sle").mkdir(parents=True)
    load(None).save(run_dir / "config.yaml")
    cfg = load(None, ["train.objective=sle", "sle.alpha=0.5", "clipcap.prefix_length=7", f"run.dir={run_dir / 'sle'}"])
    old = cfg.saved_dict()
    old["model"]["prefix_length"] = old.pop("clipcap")["prefix_length"]  # the flat model section, before the move
    old["rl"] = {**old["rl"], **old.pop("grpo"), **old.pop("sle"), "advantage": "group", "baseline": "mean"}
    stored = run_dir / "sle" / "config.yaml"
    stored.write_text(yaml.safe_dump(old, sort_keys=False))
    (run_dir / "sle" / DONE).write_text("ok\n")
    caplog.set_level(logging.WARNING, logger="finecap")
    got = finished_stages(run_dir, ["sle"]).stage_config("sle")
    assert got == load_stored(stored)
    assert (got.clipcap.prefix_length, got.sle.alpha, got.grpo.advantage) == (7, 0.5, "group")
    assert "changes nothing" not in caplog.text, caplog.text


def test_a_forced_retrain_that_is_killed_is_no_finished_stage(tmp_path):
    # its DONE marker stayed through the retrain: killed, the next run skipped the stage as finished and reported the
    # old model's files as the new one's
    runner = _runner(tmp_path)
    runner.run(["world", "start"])

    def killed(cfg, *, resume, overwrite):
        raise KeyboardInterrupt

    forced = _runner(tmp_path, force=True)
    forced.train = killed
    with pytest.raises(KeyboardInterrupt):
        forced.train_stage("start")
    assert not forced.is_done("start")
    again = _runner(tmp_path)
    assert again.train_stage("start") is True and again.is_done("start")


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_forced_retrain_refuses_a_done_that_is_not_the_stages_marker_and_keeps_it(tmp_path, kind):
    # a forced retrain unlinked whatever regular file was named DONE in the stage folder, a user's too, then wrote
    # its marker there (a folder named DONE failed the stage after its training)
    runner = _runner(tmp_path)
    runner.run(["world", "start"])
    marker = runner.stage_dir("start") / DONE
    marker.unlink()
    if kind == "file":
        marker.write_text("my checklist: done reading the logs\n")
    else:
        marker.mkdir()
        (marker / "notes.txt").write_text("mine")
    (runner.stage_dir("start") / "trained.json").unlink()
    forced = _runner(tmp_path, force=True)
    with pytest.raises(ValueError, match=rf"{marker}: not the stage's {DONE} marker .*nothing was deleted"):
        forced.train_stage("start")
    assert not (runner.stage_dir("start") / "trained.json").exists()  # refused before training
    if kind == "file":
        assert marker.read_text() == "my checklist: done reading the logs\n"
    else:
        assert (marker / "notes.txt").read_text() == "mine"
    # the stage's own marker is still replaced on a forced retrain
    if kind == "folder":
        (marker / "notes.txt").unlink()
        marker.rmdir()
    marker.write_text("ok\n")  # (a file: written over)
    assert forced.train_stage("start") is True and marker.read_text() == "ok\n"


def preparing_train(cfg: Config, *, resume: bool, overwrite: bool) -> None:
    """:func:`saving_train` that prepares its run folder as training does (:func:`finecap.train.state.prepare_run_dir`:
    an overwrite refuses a file finecap did not make where the run's files go) and finishes with a resumable ``last``
    checkpoint (trainer state, state folder, the configuration it was saved with)."""
    from finecap.train.state import STATE_DIR, prepare_run_dir

    out = Path(cfg.run.dir)
    prepare_run_dir(out, resume=resume, overwrite=overwrite)
    saving_train(cfg, resume=resume, overwrite=overwrite)
    last = out / "checkpoints" / "last"
    (last / STATE_DIR).mkdir(parents=True, exist_ok=True)
    (last / "trainer_state.json").write_text(json.dumps({"step": 7}))
    (last / "config.yaml").write_text(cfg.to_yaml())


def _start_trained_again(tmp_path: Path) -> tuple[StageRunner, Path, dict]:
    """Stages ``start`` and ``a`` (from ``start``) trained, then ``start`` alone trained again (another lr): the
    runner, ``a``'s start record (its file) and what it holds, the start ``a`` was trained from."""
    runner = _runner(tmp_path, preparing_train)
    runner.run(["world", "start", "a"])
    record = runner.stage_dir("a") / START_FILE
    started = json.loads(record.read_text())
    _runner(tmp_path, preparing_train, force=True, items=["train.lr=0.3"]).train_stage("start")
    assert runner.start_record("a") != started  # `a`'s start trained again since
    return runner, record, started


def test_a_forced_retrain_that_is_refused_changes_nothing_of_the_finished_stage(tmp_path):
    # a forced retrain of `a` refused by training (a file of the user's in its checkpoints/) had already removed its
    # DONE marker and written its start's new digest into start.json; with the file moved away, a run without force
    # resumed the old finished run and marked it done: reused as if trained from the new start
    runner, record, started = _start_trained_again(tmp_path)
    mine = runner.stage_dir("a") / "checkpoints" / "my-weights.safetensors"
    mine.write_text("mine")
    with pytest.raises(ValueError, match=rf"holds files finecap did not make .*\({mine}\).*nothing was deleted"):
        _runner(tmp_path, preparing_train, force=True).train_stage("a")
    assert runner.is_done("a") and json.loads(record.read_text()) == started  # the old run as it was
    assert mine.read_text() == "mine"
    mine.unlink()  # the user moves it away
    with pytest.raises(FingerprintMismatch, match=r"'a' started from another checkpoint than stage 'start''s best"):
        runner.train_stage("a")  # without force: neither reused nor continued, since its start changed
    assert runner.is_done("a") and json.loads(record.read_text()) == started
    assert _runner(tmp_path, preparing_train, force=True).train_stage("a") is True
    assert json.loads(record.read_text()) == runner.start_record("a") and runner.train_stage("a") is False


@pytest.mark.parametrize(
    ("name", "refusal"),
    [
        (START_FILE, "{mine}: not the stage's start.json.*nothing was deleted"),
        ("config.yaml", "{mine} exists and finecap did not make it"),
        ("fingerprints.json", "{mine} exists and finecap did not make it"),
    ],
)
def test_a_forced_retrain_refused_for_a_users_file_in_the_stage_leaves_the_stage_done(tmp_path, name, refusal):
    # the check of start.json came after the DONE marker was removed; training refuses to replace a config.yaml or
    # fingerprints.json that is not finecap's, overwrite or not (finecap.train.state.check_run_folder): refused after
    # the DONE marker went, the stage was unfinished
    runner = _runner(tmp_path, preparing_train)
    runner.run(["world", "start"])
    mine = runner.stage_dir("start") / name
    mine.write_text("my notes\n")
    with pytest.raises(ValueError, match=refusal.format(mine=mine)):
        _runner(tmp_path, preparing_train, force=True).train_stage("start")
    assert runner.is_done("start") and mine.read_text() == "my notes\n"


def test_a_file_made_from_a_stages_model_is_made_again_once_the_stage_is_trained_again(tmp_path):
    # a stage trained again alone (--force) left its samples and shifted captions, which later runs read as the new
    # model's
    runner = _runner(tmp_path)
    runner.run(["world", "start"])
    made = runner.stage_dir("start") / "samples_test_sample.json"
    made.write_text("{}")
    assert runner.made_since_training("start", made)
    os.utime(made, ns=(1, 1))  # older than the stage's last training (its DONE marker), as after a retrain
    assert not runner.made_since_training("start", made)
    _runner(tmp_path, force=True).train_stage("start")
    made.write_text("{}")  # made again after it
    assert runner.made_since_training("start", made)
    assert not runner.made_since_training("start", runner.stage_dir("start") / "missing.json")


def test_a_finished_stage_whose_configuration_changed_is_refused_not_reused(tmp_path):
    # a finished stage was reused whatever its configuration now (an override, an edited recipe): only its data and
    # encoders were compared, so a stage trained with lr 0.01 was reported as the lr 0.5 one
    runner = _runner(tmp_path, saving_train)
    runner.run(["world", "start", "a"])
    with pytest.raises(FingerprintMismatch, match=r"'start' was trained with another configuration than it has now "
                       r".*train\.lr: 0\.01 -> 0\.5 \| re-run it with force"):  # fmt: skip
        _runner(tmp_path, saving_train, items=["train.lr=0.5"]).train_stage("start")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"train": {"lr": 0.01, "max_steps": 8}}))  # the recipe edited
    table = dict(runner.stages)
    with pytest.raises(FingerprintMismatch, match=r"'a' was trained with another configuration .*max_steps: 7 -> 8"):
        StageRunner(table, load(None, []), tmp_path / "run", train=saving_train).train_stage("a")
    recipe.write_text(yaml.safe_dump({"train": {"lr": 0.01, "max_steps": 7}}))
    # what changes no stage's result: the demo's own settings, what a run logs, the run folder moved (its start's
    # path with it)
    (tmp_path / "run").rename(tmp_path / "moved")
    quiet = ["demo.jobs=3", "train.log_every=7", "train.log_captions=0", "train.save_every=3"]
    moved = StageRunner(table, load(None, []), tmp_path / "moved", train=saving_train, items=quiet)
    assert moved.train_stage("start") is False and moved.train_stage("a") is False
    assert _trained(moved, "a")["init_from"] == str(tmp_path / "run" / "start" / "checkpoints" / "best")


def test_a_stage_whose_start_was_trained_again_is_refused_not_reused(tmp_path):
    # `a` starts from `start`'s best checkpoint: `start` trained again (alone, --force) on other settings left `a`
    # finished, and it was reused though trained from the old checkpoint
    runner = _runner(tmp_path, saving_train)
    runner.run(["world", "start", "a"])
    started = json.loads((runner.stage_dir("a") / START_FILE).read_text())
    assert started["stage"] == "start" and not (runner.stage_dir("start") / START_FILE).exists()
    _runner(tmp_path, saving_train, force=True).train_stage("start")  # the same weights again: still `a`'s start
    assert runner.train_stage("a") is False
    _runner(tmp_path, saving_train, force=True, items=["train.lr=0.3"]).train_stage("start")
    with pytest.raises(FingerprintMismatch, match=rf"'a' started from another checkpoint than stage 'start''s best "
                       rf"now .*{started['sha256']} recorded"):  # fmt: skip
        runner.train_stage("a")
    assert _trained(runner, "a")["lr"] == 0.02  # not trained again
    assert _runner(tmp_path, saving_train, force=True).train_stage("a") is True and runner.train_stage("a") is False


def killed_after_a_checkpoint(cfg: Config, *, resume: bool, overwrite: bool) -> None:
    """:func:`saving_train` killed after its first resumable checkpoint: ``last`` (trainer state, state folder and the
    configuration it was saved with), no ``DONE``."""
    from finecap.train.state import STATE_DIR

    saving_train(cfg, resume=resume, overwrite=overwrite)
    last = Path(cfg.run.dir) / "checkpoints" / "last"
    (last / STATE_DIR).mkdir(parents=True)
    (last / "trainer_state.json").write_text(json.dumps({"step": 3}))
    (last / "config.yaml").write_text(cfg.to_yaml())
    raise KeyboardInterrupt


def test_a_killed_stage_whose_start_was_trained_again_is_refused_not_continued(tmp_path):
    # the start was recorded when the stage finished: a stage killed, its start trained again (alone, --force), then
    # resumed finished with the new start's digest in start.json, and was reused though its checkpoint's steps were
    # taken from the old start
    runner = _runner(tmp_path, saving_train)
    runner.run(["world", "start"])
    with pytest.raises(KeyboardInterrupt):
        _runner(tmp_path, killed_after_a_checkpoint).train_stage("a")
    started = json.loads((runner.stage_dir("a") / START_FILE).read_text())
    assert started == runner.start_record("a")  # recorded as it started, before training
    _runner(tmp_path, saving_train, force=True, items=["train.lr=0.3"]).train_stage("start")
    assert runner.start_record("a") != started
    with pytest.raises(FingerprintMismatch, match=rf"'a': the unfinished run in {runner.stage_dir('a')} started from "
                       rf"another checkpoint than stage 'start''s best now .*{started['sha256']} recorded.*so it is "
                       r"not continued \| re-run it with force"):  # fmt: skip
        runner.train_stage("a")
    assert not runner.is_done("a") and _trained(runner, "a")["resume"] is False  # not trained again
    assert json.loads((runner.stage_dir("a") / START_FILE).read_text()) == started  # kept as it started
    # the start as it was when the stage started: continued
    _runner(tmp_path, saving_train, force=True).train_stage("start")
    assert runner.train_stage("a") is True and _trained(runner, "a")["resume"] is True
    assert runner.train_stage("a") is False  # finished: reused


def test_a_killed_stage_whose_configuration_changed_is_refused_not_continued(tmp_path):
    # a killed stage resumed with another configuration (an override dropped, an edited recipe) trained on with it,
    # then finished with the new config.yaml: reused as the new configuration's though its first steps were the old's
    runner = _runner(tmp_path, saving_train)
    with pytest.raises(KeyboardInterrupt):
        _runner(tmp_path, killed_after_a_checkpoint, items=["train.grad_clip=0.5"]).train_stage("start")
    saved = runner.stage_dir("start") / "checkpoints" / "last" / "config.yaml"
    with pytest.raises(FingerprintMismatch, match=rf"'start': the unfinished run in .* was trained with another "
                       rf"configuration than it has now \({saved}\), so it is not continued: train\.grad_clip: "
                       r"0\.5 -> 1\.0"):  # fmt: skip
        runner.train_stage("start")
    assert not runner.is_done("start") and _trained(runner, "start")["resume"] is False  # not trained again
    # what changes no stage's result (NOT_RESULT): continued
    quiet = ["train.grad_clip=0.5", "demo.jobs=3", "train.log_every=7", "train.save_every=3"]
    again = _runner(tmp_path, saving_train, items=quiet)
    assert again.train_stage("start") is True and _trained(again, "start")["resume"] is True


def test_a_stage_keeps_a_users_file_where_its_start_record_goes(tmp_path):
    runner = _runner(tmp_path, saving_train)
    runner.run(["world", "start"])
    mine = runner.stage_dir("a") / START_FILE
    mine.parent.mkdir(parents=True)
    mine.write_text("my start notes\n")
    with pytest.raises(ValueError, match=f"{mine}: not the stage's {START_FILE}.*nothing was deleted"):
        runner.train_stage("a")
    assert mine.read_text() == "my start notes\n" and not (runner.stage_dir("a") / "trained.json").exists()


def killed_as_training_starts(cfg: Config, *, resume: bool, overwrite: bool) -> None:
    """A training killed (Ctrl-C) in its start-up, before it touches the run folder."""
    raise KeyboardInterrupt


def test_a_forced_retrain_killed_as_training_starts_is_not_continued_as_the_old_run(tmp_path):
    # --force removed `a`'s DONE and wrote its new start into start.json, then trained: killed before training
    # removed the old run's checkpoints, a run without force resumed the old finished run (trained from the old
    # start), found start.json equal to the start now, and marked it done as if trained from the new start
    runner, record, _ = _start_trained_again(tmp_path)
    now = runner.start_record("a")
    with pytest.raises(KeyboardInterrupt):
        _runner(tmp_path, killed_as_training_starts, force=True).train_stage("a")
    assert not runner.is_done("a") and json.loads(record.read_text()) == now
    assert not (runner.stage_dir("a") / "checkpoints").exists()  # start.json names the start of no old run's steps
    assert runner.train_stage("a") is True  # without force
    assert _trained(runner, "a")["resume"] is False  # trained from its new start, not the old run continued
    assert json.loads(record.read_text()) == now and runner.train_stage("a") is False


def test_a_forced_retrain_killed_while_removing_the_old_run_keeps_the_old_start_record(tmp_path, monkeypatch):
    # killed as the old run's checkpoints were being removed (before any was touched), with start.json already
    # rewritten: a run without force continued the old finished run as if trained from the new start
    import finecap.train.state

    runner, record, old = _start_trained_again(tmp_path)

    def killed(folders, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(finecap.train.state, "remove_checkpoints", killed)
        with pytest.raises(KeyboardInterrupt):
            _runner(tmp_path, preparing_train, force=True).train_stage("a")
    assert not runner.is_done("a") and (runner.stage_dir("a") / "checkpoints" / "last").is_dir()
    assert json.loads(record.read_text()) == old  # still the start of the checkpoints there
    with pytest.raises(FingerprintMismatch, match=r"'a': the unfinished run in .* started from another checkpoint"):
        runner.train_stage("a")  # without force: the old run, from the old start, is not continued
    assert not runner.is_done("a") and _trained(runner, "a")["resume"] is False  # not trained since
    assert _runner(tmp_path, preparing_train, force=True).train_stage("a") is True
    assert json.loads(record.read_text()) == runner.start_record("a") and runner.train_stage("a") is False


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path: content)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    ("stage", "items", "fsync", "refusal"),
    [
        (
            "a",
            ["model.attn_implementation=flash_attention_2"],
            None,
            "model.attn_implementation=flash_attention_2 needs the flash-attn package",
        ),
        ("a", [], "maybe", r"\$FINECAP_FSYNC must be 0 \(no fsync\) or 1"),
        ("a", ["data.path={tmp_path}"], None, r"run.dir: .* lies inside the command's data set"),
        ("start", ["train.init_from={tmp_path}/nowhere"], None, r"train.init_from=.*/nowhere: checkpoint not found"),
    ],
    ids=["attention", "fsync", "run-inside-its-data", "start-not-found"],
)
def test_a_forced_retrain_that_training_refuses_by_its_settings_leaves_the_finished_stage(
    tmp_path, monkeypatch, stage, items, fsync, refusal
):
    # training's refusals of its settings (finecap.train.preflight: a kernel this machine lacks, a mistyped
    # $FINECAP_FSYNC, a run folder inside the data it reads, a start found nowhere) came inside train(), after the
    # runner had removed the stage's DONE marker and its old run (checkpoints/, metrics): a finished stage lost,
    # for a setting to correct; the real training function refuses here, as the demo and the grids train
    from finecap.train.run import train
    from finecap.utils.files import FSYNC_ENV

    runner = _runner(tmp_path, preparing_train)
    runner.run(["world", "start", "a"])
    out = runner.stage_dir(stage)
    before = _files(out)
    assert (out / DONE).is_file() and (out / "checkpoints" / "last").is_dir()
    assert (stage != "a") or (out / START_FILE).is_file()
    if fsync is not None:
        monkeypatch.setenv(FSYNC_ENV, fsync)
    forced = _runner(tmp_path, train, force=True, items=[item.format(tmp_path=tmp_path) for item in items])
    with pytest.raises((ValueError, FileNotFoundError), match=refusal):
        forced.train_stage(stage)
    assert _files(out) == before and runner.is_done(stage)  # DONE, start.json and the old run as they were
