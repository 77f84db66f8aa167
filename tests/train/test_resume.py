"""A run killed mid-way and resumed ends with exactly the weights of an uninterrupted run (CPU)."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from finecap.home import run_path
from finecap.models.clipcap import ClipCap
from finecap.runs import checkpoint_dir, model_dir
from finecap.train.run import train
from helpers.resume import Killed, kill_at, killed_at, train_events, weights


def test_killed_and_resumed_run_matches_uninterrupted(make_cfg):
    # 200 examples / 32 per step = 7 steps per epoch (the last one has 8 examples); 10 steps cross an epoch boundary.
    # Checkpoints every 3 steps; the run is killed at step 5, after the step-3 checkpoint, so steps 4-5 are redone
    # (mid-epoch: the sampler must resume at position 3 of epoch 0), and the GPT-2 dropout makes the RNG state matter.
    common = ["train.max_steps=10", "train.batch_size=32", "train.save_every=3", "train.eval_every=4",
              "train.log_every=2"]  # fmt: skip
    full = train(make_cfg(*common, run="full"))

    cfg = make_cfg(*common, run="killed")
    saved = json.loads(killed_at(cfg, 5).read_text())
    assert (saved["step"], saved["epoch"], saved["position"]) == (3, 0, 3)
    resumed = train(cfg, resume=True)

    a, b = weights(full), weights(resumed)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # The metrics of the killed steps 4-5 were dropped and rewritten: the logs agree too, step for step.
    assert train_events(resumed) == train_events(full)
    assert [s for s, _ in train_events(full)] == [2, 4, 6, 8, 10]


def test_resume_without_checkpoint_starts_fresh(make_cfg):
    cfg = make_cfg("train.max_steps=2")
    run_dir = train(cfg, resume=True)
    assert json.loads((checkpoint_dir(run_dir, "last") / "trainer_state.json").read_text())["step"] == 2


def test_a_resume_selecting_by_another_metric_or_mode_starts_the_best_anew(make_cfg, caplog):
    # the restored best value was compared with the new metric's values: a loss of 2.4 stood as the best CIDEr-D,
    # and `best` was never replaced; here the mode flips on the same metric
    common = ["train.max_steps=6", "train.eval_every=2", "train.save_every=2"]
    cfg = make_cfg(*common, run="reselect")
    with pytest.raises(Killed):
        train(cfg, callbacks=[kill_at(5)])
    run_dir = run_path(cfg.run)
    saved = json.loads((checkpoint_dir(run_dir, "last") / "trainer_state.json").read_text())
    assert (saved["step"], saved["best_metric"], saved["best_mode"]) == (4, "loss", "min")
    assert saved["best_step"] in (2, 4)
    with caplog.at_level("WARNING", logger="finecap"):
        train(make_cfg(*common, "train.best_mode=max", run="reselect"), resume=True)
    assert "was chosen by loss (min); this run selects by loss (max)" in caplog.text
    best = json.loads((checkpoint_dir(run_dir, "best") / "trainer_state.json").read_text())
    assert (best["step"], best["best_step"], best["best_mode"]) == (6, 6, "max")  # the first validation after


def killed_after_best_before_last(cfg, monkeypatch) -> Path:
    """Train ``cfg`` (validating and saving every 2 steps) until it is killed at step 4 after ``best`` was saved and
    before ``last`` was (best is saved first): ``best`` of step 4, ``last`` of step 2. The run's folder."""
    from finecap.train.engine import Engine

    run_dir = run_path(cfg.run)
    save_last = Engine.save_last

    def killed_before_last_at_4(engine):
        if engine.state.step == 4:
            raise Killed
        save_last(engine)

    with monkeypatch.context() as m:
        m.setattr(Engine, "save_last", killed_before_last_at_4)
        with pytest.raises(Killed):
            train(cfg)
    best = json.loads((checkpoint_dir(run_dir, "best") / "trainer_state.json").read_text())
    assert best["step"] == 4 and json.loads((checkpoint_dir(run_dir, "last") / "trainer_state.json").read_text())[
        "step"] == 2  # fmt: skip
    return run_dir


def best_checkpoint(run_dir: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """The ``trainer_state.json`` of the run's ``best`` checkpoint and its ClipCap's state dict."""
    best = checkpoint_dir(run_dir, "best")
    state = json.loads((best / "trainer_state.json").read_text())
    return state, ClipCap.from_checkpoint(model_dir(best)).state_dict()


def test_a_best_saved_at_a_step_the_resumed_run_redoes_is_saved_anew_so_best_agrees_with_the_run(
    make_cfg, caplog, monkeypatch
):
    # killed after best was saved at step 4 and before last was: the resume redoes steps 3-4 from last at step 2. A
    # redo that is not bit-exact (here: its validation reads worse) left the killed run's best of step 4 in place, its
    # values not in metrics.jsonl, while the run said its best was step 2's
    from finecap.train.engine import Engine

    common = ["train.max_steps=6", "train.eval_every=2"]  # last saved at each validation, after best
    run_dir = killed_after_best_before_last(make_cfg(*common, run="redo"), monkeypatch)

    evaluate = Engine.evaluate

    def worse(engine):  # the redo validates otherwise than the killed run did
        return {k: v + 10.0 if k == "loss" else v for k, v in evaluate(engine).items()}

    monkeypatch.setattr(Engine, "evaluate", worse)
    with caplog.at_level("WARNING", logger="finecap"):
        train(make_cfg(*common, run="redo"), resume=True)
    assert "was saved at step 4, after this checkpoint's step 2" in caplog.text
    best = json.loads((checkpoint_dir(run_dir, "best") / "trainer_state.json").read_text())
    last = json.loads((checkpoint_dir(run_dir, "last") / "trainer_state.json").read_text())
    assert (best["best_step"], best["best_value"]) == (last["best_step"], last["best_value"])  # the run's best
    logged = {e["step"]: e["values"] for e in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
              if e["split"] == "val"}  # fmt: skip
    assert best["values"]["loss"] == pytest.approx(logged[best["step"]]["loss"])  # a validation the log holds


def test_a_bit_exact_redo_saves_the_same_best_again(make_cfg, monkeypatch):
    # docs/reliability.md: the resume redoes steps 3-4 from last at step 2, bit for bit (the CPU run is deterministic:
    # test_killed_and_resumed_run_matches_uninterrupted), so its validation at step 4 saves best anew with the killed
    # run's step, values and weights
    common = ["train.max_steps=6", "train.eval_every=2"]
    run_dir = killed_after_best_before_last(make_cfg(*common, run="exact"), monkeypatch)
    killed_state, killed_weights = best_checkpoint(run_dir)
    assert killed_state["best_step"] == 4  # step 4's validation was the best when the run was killed
    killed_folder = (checkpoint_dir(run_dir, "best") / "trainer_state.json").stat().st_ino

    with pytest.raises(Killed):  # stopped before step 6's validation, which may find a better best of its own
        train(make_cfg(*common, run="exact"), resume=True, callbacks=[kill_at(5)])
    state, weights_again = best_checkpoint(run_dir)
    # saved again, not left in place: a swapped-in folder's files are new (the killed one's still existed meanwhile)
    assert (checkpoint_dir(run_dir, "best") / "trainer_state.json").stat().st_ino != killed_folder
    assert (state["step"], state["best_step"], state["values"]) == (4, 4, killed_state["values"])
    assert weights_again.keys() == killed_weights.keys()
    assert all(torch.equal(weights_again[k], killed_weights[k]) for k in killed_weights)


def test_a_resume_inside_an_epoch_with_another_global_batch_is_refused(make_cfg):
    # the position counts global batches of the checkpoint's size: resumed with 8 examples a step after 2 steps of
    # 16, the run went on at example 16 of the epoch, training 16 of them again
    from finecap.train.state import CheckpointError

    common = ["train.max_steps=4", "train.save_every=2", "train.eval_every=100"]
    cfg = make_cfg(*common, run="rebatch")
    with pytest.raises(Killed):
        train(cfg, callbacks=[kill_at(3)])
    saved = json.loads((checkpoint_dir(run_path(cfg.run), "last") / "trainer_state.json").read_text())
    assert (saved["position"], saved["global_batch"]) == (2, 16)
    with pytest.raises(CheckpointError, match=r"2 global batches of 16 examples into epoch 0; this run takes 8 "):
        train(make_cfg(*common, "train.batch_size=8", run="rebatch"), resume=True)
    assert (train(make_cfg(*common, "train.batch_size=8", "train.grad_accum_steps=2", run="rebatch"),
                  resume=True) / "checkpoints" / "last").is_dir()  # fmt: skip  # 8 x 2 = 16: resumed


def test_a_run_of_epochs_resumed_at_an_epochs_end_with_another_global_batch_trains_its_epochs(make_cfg, tmp_path):
    # The global batch is train.batch_size x processes x train.grad_accum_steps, so a checkpoint of 2 processes
    # resumed in one (or of one resumed on 2) is this case. 200 examples: 7 batches of 32 an epoch, 4 of 64, 13 of
    # 16. Killed after epoch 0 (7 steps of 32), train.epochs=2 is one more epoch: 4 steps of 64 or 13 of 16. The
    # total was counted as if every epoch had the new batches: 2 x 4 = 8 steps (one of epoch 1 trained, stopping
    # at 1.25 epochs) or 2 x 13 = 26 (19 steps: 2.46 epochs).
    import shutil

    common = ["train.epochs=2", "train.batch_size=32", "train.save_every=7", "train.eval_every=100"]
    cfg = make_cfg(*common, run="epochs64")
    with pytest.raises(Killed):
        train(cfg, callbacks=[kill_at(8)])
    saved = json.loads((checkpoint_dir(run_path(cfg.run), "last") / "trainer_state.json").read_text())
    assert (saved["step"], saved["epoch"], saved["position"], saved["global_batch"]) == (7, 1, 0, 32)
    shutil.copytree(run_path(cfg.run), tmp_path / "epochs16")
    for batch, run, steps in ((64, "epochs64", 7 + 4), (16, "epochs16", 7 + 13)):
        run_dir = train(make_cfg(*common, f"train.batch_size={batch}", run=run), resume=True)
        last = json.loads((checkpoint_dir(run_dir, "last") / "trainer_state.json").read_text())
        assert (last["step"], last["epoch"], last["position"], last["total_steps"]) == (steps, 2, 0, steps), batch


def test_a_resume_on_another_process_count_reseeds_by_the_runs_seed(make_cfg, monkeypatch):
    # A checkpoint of another process count has no random state for this process, so the run is re-seeded; the seed
    # was the step's alone (step x 1000 + process), so runs of run.seed 0 and 1 resumed so went on with the same
    # dropout and unseeded draws. The checkpoint says 2 processes (x 8 = its global batch of 16): how one written
    # by a 2-process launch is resumed in one.
    from finecap.train.engine import Engine

    cfgs = [make_cfg("train.max_steps=4", "train.save_every=2", "train.eval_every=100", f"run.seed={seed}",
                     run=f"seed{seed}") for seed in (0, 1)]  # fmt: skip
    for cfg in cfgs:
        with pytest.raises(Killed):
            train(cfg, callbacks=[kill_at(3)])
        info_file = checkpoint_dir(run_path(cfg.run), "last") / "trainer_state.json"
        info = json.loads(info_file.read_text())
        assert (info["step"], info["num_processes"], info["global_batch"]) == (2, 1, 16)
        info_file.write_text(json.dumps({**info, "num_processes": 2}))
    original, states = Engine.fit, []

    def fit(engine, *args, **kwargs):  # the random state the restored run starts its steps with
        states.append(torch.random.get_rng_state())
        return original(engine, *args, **kwargs)

    monkeypatch.setattr(Engine, "fit", fit)
    for cfg in cfgs:
        train(cfg, resume=True)
    assert len(states) == 2 and not torch.equal(states[0], states[1])


def test_a_resume_on_another_process_count_logs_the_steps_before_it_too(make_cfg):
    # Killed at step 3 after the step-2 checkpoint, logging every 4 steps: the step-4 event averages steps 1-4, two
    # of them taken before the checkpoint (their values are in its logger state). On another process count that
    # state was dropped and step 4 logged the mean of steps 3-4 alone. Without dropout the resumed steps are the
    # uninterrupted run's, so the logged events are too; the checkpoint says 2 processes (x 8 = its global batch).
    common = ["train.max_steps=4", "train.save_every=2", "train.eval_every=100", "train.log_every=4",
              "clipcap.tiny_dropout=0"]  # fmt: skip
    full = train(make_cfg(*common, run="full"))
    cfg = make_cfg(*common, run="killed")
    info_file = killed_at(cfg, 3)
    info_file.write_text(json.dumps({**json.loads(info_file.read_text()), "num_processes": 2}))
    resumed = train(cfg, resume=True)
    (step, loss), (step_full, loss_full) = train_events(resumed)[0], train_events(full)[0]
    assert step == step_full == 4 and loss == pytest.approx(loss_full, rel=1e-6)


def test_a_run_resumes_after_its_start_checkpoint_moved(make_cfg, tmp_path):
    # train.init_from was looked up (and fingerprinted) again on --resume, though a resumed run reads its own
    # checkpoint: a moved or deleted start stopped it with "checkpoint not found"
    import shutil

    start = train(make_cfg("train.max_steps=1", run="start"))
    common = ["train.max_steps=4", "train.save_every=2", "train.eval_every=100",
              f"train.init_from={start / 'checkpoints' / 'best'}"]  # fmt: skip
    cfg = make_cfg(*common, run="next")
    with pytest.raises(Killed):
        train(cfg, callbacks=[kill_at(3)])
    shutil.move(start, tmp_path / "moved")
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        train(make_cfg(*common, run="fresh"))  # a fresh run still needs its start
    run_dir = train(cfg, resume=True)
    assert json.loads((checkpoint_dir(run_dir, "last") / "trainer_state.json").read_text())["step"] == 4


def test_a_resume_in_other_dtypes_is_refused_naming_the_change(make_cfg):
    # model.dtype / trainable_dtype changed at a resume were only logged as "configuration changed": torch cast the
    # saved optimizer moments to the new dtypes silently
    from finecap.runs import CheckpointError
    from finecap.train.run import train
    from helpers.resume import Killed, kill_at

    cfg = make_cfg("train.max_steps=4", "train.save_every=2")
    with pytest.raises(Killed):
        train(cfg, callbacks=[kill_at(3)])
    changed = make_cfg("train.max_steps=4", "train.save_every=2", "model.trainable_dtype=bfloat16")
    refusal = r"resuming with model.trainable_dtype: 'float32' -> 'bfloat16': the checkpoint's weights and optimizer"
    with pytest.raises(CheckpointError, match=refusal):
        train(changed, resume=True)
    assert train(cfg, resume=True).is_dir()  # the run's own settings resume


def test_a_resume_from_an_edited_run_config_in_other_dtypes_is_refused_and_changes_nothing(make_cfg):
    # `finecap train --resume --out RUN` reads RUN/config.yaml; the dtype check compared the resuming configuration
    # with that same file, so after `model.trainable_dtype: bfloat16` was written into it the float32 run resumed
    # unrefused, its weights and optimizer moments rounded to bfloat16. It is compared with the checkpoint's own.
    from finecap.runs import CONFIG_FILE, CheckpointError

    cfg = make_cfg("train.max_steps=2", "train.save_every=2")
    run = train(cfg)
    last = checkpoint_dir(run, "last")
    before = {p: p.read_bytes() for p in sorted(last.rglob("*")) if p.is_file()}
    config = run / CONFIG_FILE
    text = config.read_text()
    assert text.count("trainable_dtype: float32") == 1
    config.write_text(text.replace("trainable_dtype: float32", "trainable_dtype: bfloat16"))
    refusal = r"resuming with model.trainable_dtype: 'float32' -> 'bfloat16': the checkpoint's weights and optimizer"
    with pytest.raises(CheckpointError, match=refusal) as e:
        train(make_cfg("train.max_steps=4", "train.save_every=2", "model.trainable_dtype=bfloat16"), resume=True)
    assert str(last / CONFIG_FILE) in str(e.value)  # the file the checkpoint was saved with is named
    assert {p: p.read_bytes() for p in sorted(last.rglob("*")) if p.is_file()} == before


def test_a_resume_naming_another_frozen_encoder_is_refused_and_changes_nothing(make_cfg, tiny_encoder, tmp_path):
    # the resumed ClipCap keeps the encoder its captioner.json records (and encodes the features with it), while the
    # changed model.encoder was only logged as "configuration changed" and written into config.yaml: the run's
    # configuration named an encoder it never used (and `finecap caption` reads that one once the recorded one moves)
    from finecap.runs import CONFIG_FILE, CheckpointError

    cfg = make_cfg("train.max_steps=2", "train.save_every=2")
    run = train(cfg)
    other = shutil.copytree(tiny_encoder, tmp_path / "another-encoder")
    before = {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file() and ".train.lock" not in p.name}
    refusal = rf"resuming with model\.encoder: '{tiny_encoder}' -> '{other}': the checkpoint's captioner keeps"
    with pytest.raises(CheckpointError, match=refusal) as e:
        train(make_cfg("train.max_steps=4", "train.save_every=2", f"model.encoder={other}"), resume=True)
    assert str(checkpoint_dir(run, "last") / CONFIG_FILE) in str(e.value)
    after = {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file() and ".train.lock" not in p.name}
    assert after == before  # config.yaml still names the run's encoder
    assert train(make_cfg("train.max_steps=4", "train.save_every=2"), resume=True) == run  # its own one resumes


@pytest.mark.parametrize("form", ["new", "old"])
def test_resume_truncates_a_log_of_either_form_alike_and_keeps_it_strict(tmp_path, form):
    # A run logged before metrics.jsonl was strict JSON (bare NaN / Infinity tokens) is resumed as one logged after:
    # the same events kept, written as strict JSON with their values.
    from finecap.report.plots import read_events
    from finecap.train.state import is_metrics_log, truncate_metrics
    from helpers.metrics_log import NEW_FORM, OLD_FORM, same, strict_rows

    log = tmp_path / "metrics.jsonl"
    log.write_text((NEW_FORM if form == "new" else OLD_FORM) + '{"step": 4, "epoch": 0.4, "spl')  # a kill mid-line
    assert is_metrics_log(log)
    truncate_metrics(log, 2)
    assert log.read_text() == "".join(NEW_FORM.splitlines(keepends=True)[:2])
    assert [row["step"] for row in strict_rows(log.read_text())] == [1, 2]
    (tmp_path / "old.jsonl").write_text(OLD_FORM)
    assert same(read_events(log), read_events(tmp_path / "old.jsonl")[:2])
