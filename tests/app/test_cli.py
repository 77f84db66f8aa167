"""The CLI parses, builds the configuration and reports errors without a traceback; text-only commands start
without torch."""

import json
import os
import select
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from finecap.app.cli import build_parser, main


def test_config_prints_resolved(capsys):
    assert main(["config", "world.n_train=42"]) == 0
    assert "n_train: 42" in capsys.readouterr().out


def test_config_describe(capsys):
    assert main(["config", "--describe"]) == 0
    out = capsys.readouterr().out
    from finecap.config import TrainConfig, WorldConfig

    # each key's type and the dataclass's own default, its text and its bounds
    assert "  world.image_size (int, default 64): Rendered image side in pixels. Must be in [16, 1024].\n" in out
    assert WorldConfig().image_size == 64
    assert f"  train.lr (float, default {TrainConfig().lr!r}): Peak learning rate" in out
    assert "data.hf.image_column (str, default 'image'): " in out  # a nested section's keys, by their whole name


def test_bad_override_is_a_clean_error(capsys):
    assert main(["config", "train.schedule=exponential"]) == 2
    err = capsys.readouterr().err
    assert "train.schedule" in err and "linear, cosine, constant" in err


def test_missing_recipe_is_a_clean_error(tmp_path, capsys):
    assert main(["config", str(tmp_path / "nope.yaml")]) == 2
    assert "recipe file not found" in capsys.readouterr().err


EVAL_SCRIPT = """
import json, sys
import yaml

from finecap.app.cli import build_parser, main
code = main(sys.argv[1:])
heavy = {m: m in sys.modules for m in ("torch", "transformers", "datasets", "pyarrow")}
print(json.dumps({"code": code, **heavy}))
"""


def _run_eval(tmp_path: Path, metrics: str, *overrides: str) -> dict:
    """Run `finecap eval --metrics METRICS [OVERRIDES]` on two hand-made images in a fresh interpreter; return its exit
    code and whether torch / transformers were imported by the end."""
    refs = tmp_path / "refs.jsonl"
    refs.write_text(
        json.dumps({"id": 1, "image": "1.png", "captions": ["a red circle", "a big red circle"]}) + "\n"
        + json.dumps({"id": 2, "image": "2.png", "captions": ["a blue square", "a small blue square"]}) + "\n"
    )  # fmt: skip
    for name in ("1.png", "2.png"):
        (tmp_path / name).write_bytes(b"")  # image metrics check that the files exist
    (tmp_path / "results.json").write_text(json.dumps([{"image_id": 1, "caption": "A red circle."},
                                                       {"image_id": 2, "caption": "a blue square"}]))  # fmt: skip
    argv = ["eval", "--predictions", str(tmp_path / "results.json"), "--references", str(refs), "--metrics", metrics,
            "--out", str(tmp_path / "eval.json"), f"run.cache_dir={tmp_path / 'cache'}", *overrides]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    proc = subprocess.run([sys.executable, "-c", EVAL_SCRIPT, *argv], capture_output=True, text=True, env=env,
                          timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_text_only_eval_imports_no_torch(tmp_path):
    # `finecap eval` on n-gram metrics is a text job: it must start without torch or transformers (seconds each).
    state = _run_eval(tmp_path, "bleu,rouge,cider,length,vocab")
    assert state == {"code": 0, "torch": False, "transformers": False, "datasets": False, "pyarrow": False}
    scores = json.loads((tmp_path / "eval.json").read_text())
    assert scores["BLEU-1"] == pytest.approx(1.0) and scores["Length"] == 3.0


@pytest.mark.slow
def test_image_metric_eval_does_import_torch(tmp_path):
    # The same harness sees torch when a group needs it: CLIPScore loads the retriever (torch, transformers), which
    # then stops the command (exit 2) because the folder retriever.checkpoint names holds no CLIP.
    (tmp_path / "not-a-clip").mkdir()
    state = _run_eval(tmp_path, "clipscore", f"retriever.checkpoint={tmp_path / 'not-a-clip'}")
    assert {k: state[k] for k in ("code", "torch", "transformers")} == {"code": 2, "torch": True, "transformers": True}


@pytest.mark.slow
def test_an_image_metric_without_a_retriever_is_refused_before_torch(tmp_path):
    # No retriever.checkpoint and no world encoder trained for this configuration: the command says so (exit 2)
    # from the encoder's cache folder alone; finding that folder imported the world encoder's module (torch).
    state = _run_eval(tmp_path, "clipscore")
    assert (state["code"], state["torch"], state["transformers"]) == (2, False, False)


def test_eval_prints_json_to_stdout_without_out_on_id_only_coco_references(tmp_path, capsys):
    # A COCO reference file whose images carry only `id` (pycocotools reads it; many scripts write it), results with
    # extra fields (`score`, `id`), no --out: `--format json` prints exactly the JSON scores on stdout.
    refs = {
        "images": [{"id": 1}, {"id": 2}],
        "annotations": [{"image_id": 1, "id": 10, "caption": "A red circle."},
                        {"image_id": 2, "id": 11, "caption": "A blue square."}],
    }  # fmt: skip
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    (tmp_path / "res.json").write_text(json.dumps([{"image_id": 1, "caption": "a red circle", "score": -1.5},
                                                   {"image_id": 2, "caption": "a blue square", "id": 3}]))  # fmt: skip
    argv = ["eval", "--predictions", str(tmp_path / "res.json"), "--references", str(tmp_path / "refs.json"),
            "--metrics", "bleu,rouge", "--format", "json"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr()
    scores = json.loads(out.out)  # nothing but the JSON on stdout
    assert scores["BLEU-1"] == pytest.approx(1.0) and scores["ROUGE-L"] == pytest.approx(1.0)
    assert "2 images of" in out.err
    assert main(argv[:-2]) == 0  # default: the table, still without --out
    assert "| BLEU-1 " in capsys.readouterr().out and not list(tmp_path.glob("*eval*"))


def test_eval_refuses_a_launch_of_several_processes(tmp_path, capsys, monkeypatch):
    # `accelerate launch -m finecap.app.cli eval ...` made every process score it all: the table printed (and any LLM
    # judge paid) once per process, the --out file written by each; now one line, said by the main process
    refs = {"images": [{"id": 1}], "annotations": [{"image_id": 1, "id": 10, "caption": "A red circle."}]}
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    (tmp_path / "res.json").write_text(json.dumps([{"image_id": 1, "caption": "a red circle"}]))
    argv = ["eval", "--predictions", str(tmp_path / "res.json"), "--references", str(tmp_path / "refs.json"),
            "--metrics", "bleu", "--out", str(tmp_path / "scores.json")]  # fmt: skip
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(argv) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == (
        "finecap: error: finecap eval runs in one process; it was launched as 2 (accelerate launch): run it "
        "without the launcher (train and caption share their work among launched processes)\n"
    )
    assert not (tmp_path / "scores.json").exists()
    # every command but train and caption (world make, report, export, boost, ...: each would do all of it N times)
    assert main(["world", "make", "--out", str(tmp_path / "world")]) == 2
    assert "finecap world runs in one process; it was launched as 2" in capsys.readouterr().err
    assert not (tmp_path / "world").exists()
    from finecap.app.cli import check_one_process

    check_one_process("train")  # they share the work: never refused
    check_one_process("caption")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert main(argv) == 0 and (tmp_path / "scores.json").is_file()


# --- conventions (issue 23) ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["trian"], "invalid choice: 'trian' (did you mean 'train'?)"),
        (["bags", "buidl"], "invalid choice: 'buidl' (did you mean 'build'?)"),
        (["recipes", "cpy", "demo/mle", "x.yaml"], "invalid choice: 'cpy' (did you mean 'cp'?)"),
        (["eval", "--predictions", "p", "--references", "r", "--format", "jsn"], "(did you mean 'json'?)"),
    ],
)
def test_mistyped_commands_and_choices_get_a_suggestion(argv, expected, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and expected in capsys.readouterr().err


def test_mistyped_recipe_key_and_override_get_a_suggestion(tmp_path, capsys):
    assert main(["config", "demo/smiel"]) == 2
    assert "(did you mean 'demo/smile'?)" in capsys.readouterr().err
    recipe = tmp_path / "r.yaml"
    recipe.write_text("train:\n  lr: 0.5\n")
    assert main(["config", str(recipe), "train.eopchs=3"]) == 2
    err = capsys.readouterr().err
    # the override is at fault, not the recipe file
    assert err.startswith("finecap: error: override 'train.eopchs=3': unknown key 'train.eopchs' (did you mean "
                          "'train.epochs'?)")  # fmt: skip
    assert str(recipe) not in err


def test_a_single_value_or_commas_where_a_list_is_expected(capsys):
    assert main(["config", "train.log_with=tensorboard", "eval.metrics=bleu,cider"]) == 0
    data = yaml.safe_load(capsys.readouterr().out)
    assert data["train"]["log_with"] == ["tensorboard"] and data["eval"]["metrics"] == ["bleu", "cider"]


def test_config_masks_secrets(capsys):
    assert main(["config", "boost.llm_api_key=sk-shown-nowhere", "boost.vlm_api_key=sk-nor-this"]) == 0
    out = capsys.readouterr().out
    assert "sk-" not in out and yaml.safe_load(out)["boost"]["llm_api_key"] == "***"


def test_one_option_names_the_output_location():
    # --out is the run directory of train and demo (as it is the output of every other command); --run-dir, the
    # demo's older spelling, is the same option
    parser = build_parser()
    for command in ("train", "demo"):
        assert parser.parse_args([command, "--out", "runs/x"]).out == "runs/x"
        assert parser.parse_args([command, "--run-dir", "runs/x"]).out == "runs/x"


def test_options_may_come_between_and_after_overrides():
    args = build_parser().parse_args(["train", "demo/mle", "--resume", "train.lr=1e-4", "--out", "runs/x", "-q"])
    assert (args.items, args.resume, args.out, args.quiet) == (["demo/mle", "train.lr=1e-4"], True, "runs/x", 1)
    args = build_parser().parse_args(["-v", "--debug", "config", "world.seed=1"])
    assert (args.verbose, args.debug, args.items) == (1, True, ["world.seed=1"])


def test_debug_shows_the_traceback(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "a_folder"
    folder.mkdir()
    argv = ["eval", "--predictions", str(folder), "--references", str(folder), "--metrics", "bleu"]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"finecap: error: {folder}: is a directory, but a file is expected here\n"
    with pytest.raises(IsADirectoryError):
        main([*argv, "--debug"])
    with pytest.raises(IsADirectoryError):
        main(["--debug", *argv])
    monkeypatch.setenv("FINECAP_DEBUG", "1")  # the older spelling
    with pytest.raises(IsADirectoryError):
        main(argv)
    for off in ("0", "false", "No", "off", ""):  # "false" turned it on
        monkeypatch.setenv("FINECAP_DEBUG", off)
        assert main(argv) == 2


def test_verbosity_flags_set_finecap_and_library_loggers(capsys):
    import logging

    from finecap.app.cli import configured_logging

    names = ("finecap", "transformers", "accelerate")
    before = [logging.getLogger(n).level for n in names]
    expected = {(0, 1): (logging.WARNING, logging.ERROR), (0, 0): (logging.INFO, logging.WARNING),
                (1, 0): (logging.DEBUG, logging.INFO)}  # fmt: skip
    for (verbose, quiet), (own, lib) in expected.items():
        with configured_logging(verbose, quiet):
            levels = [logging.getLogger(n).getEffectiveLevel() for n in names]
            assert levels == [own, lib, lib]
            logging.getLogger("finecap.some.module").info("an info message")
            logging.getLogger("finecap.some.module").debug("a debug message")
        err = capsys.readouterr().err
        assert ("an info message" in err) == (own <= logging.INFO)
        assert ("a debug message" in err) == (own <= logging.DEBUG)
    assert [logging.getLogger(n).level for n in names] == before  # put back


def test_recipes_cp_starts_a_config(tmp_path, capsys):
    from finecap.recipes import resolve_recipe

    out = tmp_path / "my_smile.yaml"
    assert main(["recipes", "cp", "demo/smile", str(out)]) == 0
    assert out.read_text() == resolve_recipe("demo/smile").read_text()
    assert f"finecap train {out}" in capsys.readouterr().out
    out.write_text("train:\n  lr: 0.5\n")  # the user's edits are never overwritten...
    assert main(["recipes", "cp", "demo/mle", str(out)]) == 2
    assert capsys.readouterr().err == f"finecap: error: {out}: already exists; choose another file, or pass --force " \
                                      "to overwrite it\n"  # fmt: skip
    assert out.read_text() == "train:\n  lr: 0.5\n"
    assert main(["recipes", "cp", "demo/mle", str(out), "--force"]) == 0  # ...unless asked
    assert out.read_text() == resolve_recipe("demo/mle").read_text()
    assert main(["recipes", "cp", "smile", str(tmp_path)]) == 0  # into a folder, under the recipe's name
    assert (tmp_path / "smile.yaml").read_text() == resolve_recipe("demo/smile").read_text()
    assert main(["recipes", "cp", "demo/smiel", str(tmp_path / "x.yaml")]) == 2
    assert "(did you mean 'demo/smile'?)" in capsys.readouterr().err and not (tmp_path / "x.yaml").exists()


def test_recipes_cp_into_a_new_folder_named_with_a_slash(tmp_path, capsys):
    # `recipes cp demo/smile mine/` wrote the recipe to a file named `mine` and said "run it with: finecap train mine"
    from finecap.recipes import resolve_recipe

    assert main(["recipes", "cp", "demo/smile", f"{tmp_path / 'mine'}/"]) == 0
    assert (tmp_path / "mine" / "smile.yaml").read_text() == resolve_recipe("demo/smile").read_text()
    assert f"finecap train {tmp_path / 'mine' / 'smile.yaml'}" in capsys.readouterr().out


def test_mistyped_metric_and_stage_get_a_suggestion(tmp_path, capsys):
    (tmp_path / "res.json").write_text(json.dumps([{"image_id": 1, "caption": "a red circle"}]))
    (tmp_path / "refs.jsonl").write_text(json.dumps({"id": 1, "image": "1.png", "captions": ["a red circle"]}) + "\n")
    argv = ["eval", "--predictions", str(tmp_path / "res.json"), "--references", str(tmp_path / "refs.jsonl")]
    assert main([*argv, "--metrics", "blue,rouge"]) == 2
    assert "unknown metric(s) 'blue' (did you mean 'bleu'?)" in capsys.readouterr().err
    assert main(["demo", "--stages", "world,smiel", "--out", str(tmp_path / "demo")]) == 2
    assert "unknown stage(s) ['smiel'] (did you mean 'smile'?)" in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()


def test_a_packaged_recipe_name_is_never_shadowed_by_a_folder(tmp_path, monkeypatch):
    """`finecap demo --out demo` makes `demo/mle/` in the working directory; `demo/mle` still names the packaged
    recipe there (issue 34), while a YAML file of the user's keeps its precedence."""
    from finecap.recipes import _root, resolve_recipe

    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo" / "mle").mkdir(parents=True)
    assert resolve_recipe("demo/mle") == _root() / "demo" / "mle.yaml"
    (tmp_path / "demo" / "smile.yaml").write_text("train:\n  lr: 0.001\n")
    assert resolve_recipe("demo/smile.yaml") == Path("demo/smile.yaml")  # the user's YAML file
    with pytest.raises(ValueError, match="is a directory"):
        resolve_recipe("demo")  # a folder that names no packaged recipe


@pytest.mark.parametrize("argv, code", [(["config", "world.n_train=42"], 0), (["config", "train.schedule=nope"], 2)])
def test_a_command_leaves_its_process_group(group, argv, code, capsys):
    # a launched process that exits with its gloo group alive aborts now and then in the C++ teardown, after its work
    # (SIGABRT, a failed run to the launcher): every command, done or refused, destroys the group before it returns
    import torch.distributed as dist

    assert dist.is_initialized()
    assert main(argv) == code
    assert not dist.is_initialized()


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["bags", "review", "b.json", "--images", "x", "--port", "99999"], "argument --port: must be from 0 to 65535"),
        (["bags", "review", "b.json", "--images", "x", "--port", "-1"], "argument --port: must be from 0 to 65535"),
        (["report", "runs/x", "--sample", "-3"], "argument --sample: must be from 0 to 10000, got -3"),
        (["report", "runs/x", "--bags", "-1"], "argument --bags: must be from 0 to 10000"),
        (["report", "runs/x", "--disagree", "-1"], "argument --disagree: must be from 0 to 10000"),
        (
            ["models", "tiny", "clip", "--out", "m", "--seed", "9" * 25],
            "argument --seed: must be from 0 to 9223372036854775807, got 9999999999999999999999999",
        ),
        (
            ["models", "tiny", "clip", "--out", "m", "--seed", "9" * 400],
            "got 9999999999999999999999999999999999999999...",
        ),
    ],
)
def test_numeric_options_of_the_other_commands_are_checked_at_the_command_line(argv, words, capsys, tmp_path,
                                                                               monkeypatch):  # fmt: skip
    """A port beyond 65535 served on another port, -1 was a traceback; a negative gallery count a Python slice or a
    sampling error naming no option; a seed beyond 64 bits an overflow naming none."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and words in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code", "line"), [("SIGTERM", 143, "finecap: terminated"),
                                                   ("SIGINT", 130, "finecap: interrupted")])  # fmt: skip
def test_a_signal_ends_a_training_run_with_one_line_and_its_lock_removed(tiny, tmp_path, sig, code, line):
    # `kill PID`, a scheduler's stop or `timeout` (SIGTERM) end a command as Ctrl-C (SIGINT) does: one line, exit
    # code 128 + the signal, and the clean-up done (SIGTERM used to kill the process at once: nothing said, the
    # progress bar's half line last, the run's .train.lock left behind)
    import signal

    from finecap.locks import TRAIN_LOCK
    from helpers.waiting import until

    run = tmp_path / "run"
    argv = [*tiny["base"], "train.max_steps=100000", "train.save_every=2", "train.eval_every=1000000"]
    process = subprocess.Popen([sys.executable, "-m", "finecap", "train", *argv, "--out", str(run)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "TQDM_DISABLE": "1"},
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    try:
        metrics = run / "metrics.jsonl"
        until(lambda: metrics.is_file() and metrics.read_text().count("\n") >= 4, "training did not start",
              timeout=240, every=0.2)  # fmt: skip
        assert (run / TRAIN_LOCK).is_file()  # training, holding its run folder
        process.send_signal(getattr(signal, sig))
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == code, err
    assert err.strip().splitlines()[-1] == line and "Traceback" not in err, err
    assert out == ""
    assert not (run / TRAIN_LOCK).exists()  # a killed run's lock is taken over with a warning; an ended one's is gone


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "openpty"), reason="no pseudo-terminals on this platform")
@pytest.mark.usefixtures("hangup_default")  # a suite run under nohup ignores SIGHUP
def test_a_hang_up_ends_a_training_run_as_sigterm_does(tiny, tmp_path):
    # `finecap train` started in an SSH session without nohup or tmux: the session dropped hangs up its terminal,
    # and the kernel sends SIGHUP to the session's leader; the run died by it at once, its .train.lock left behind.
    # Now the hang-up is SIGTERM's stop (exit code 143, the clean-up done), said to a terminal that is gone (its
    # writes fail: the line is lost, not a second error). The run is the leader of a session whose controlling
    # terminal is a pseudo-terminal, which closing its master end hangs up, as sshd does.
    import fcntl
    import termios

    from finecap.locks import TRAIN_LOCK
    from helpers.waiting import until

    run = tmp_path / "run"
    argv = [*tiny["base"], "train.max_steps=100000", "train.save_every=2", "train.eval_every=1000000"]
    master, terminal = os.openpty()
    said = bytearray()

    def drained() -> None:  # what the run writes to its terminal, read so that it never waits on a full terminal
        while select.select([master], [], [], 0)[0]:
            said.extend(os.read(master, 65536))

    process = subprocess.Popen([sys.executable, "-m", "finecap", "train", *argv, "--out", str(run)],
                               stdin=terminal, stdout=terminal, stderr=terminal, start_new_session=True,
                               env={**os.environ, "TQDM_DISABLE": "1"},
                               preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))  # fmt: skip
    os.close(terminal)
    try:
        metrics = run / "metrics.jsonl"

        def started() -> bool:
            drained()
            return metrics.is_file() and metrics.read_text().count("\n") >= 4

        until(started, "training did not start", timeout=240, every=0.2)
        assert (run / TRAIN_LOCK).is_file()  # training, holding its run folder
        os.close(master)  # the hang-up
        master = None
        process.wait(timeout=120)
    finally:
        if master is not None:
            os.close(master)
        process.kill()
        process.wait()
    assert process.returncode == 143, (process.returncode, said.decode(errors="replace"))
    assert not (run / TRAIN_LOCK).exists()  # a killed run's lock is taken over with a warning; an ended one's is gone


@pytest.mark.parametrize("stages", [[], ["--stages", ""], ["demo.stages=[]"]])
def test_a_demo_given_no_stage_is_refused_not_run_whole(stages, tmp_path, monkeypatch, capsys):
    # `--stages "$STAGES"` with the variable empty started the whole default demo (hours) instead of saying so
    import finecap.app.demo

    def ran(demo):  # noqa: ANN001, ANN202
        raise AssertionError(f"the demo ran stages {demo.cfg.demo.stages}")

    monkeypatch.setattr(finecap.app.demo, "run_stages", ran)
    argv = ["demo", "--quick", *stages, "--out", str(tmp_path / "demo")]
    if not stages:  # no --stages: the default list, which runs
        with pytest.raises(AssertionError, match="the demo ran stages"):
            main(argv)
        return
    assert main(argv) == 2
    assert "finecap: error: demo.stages (--stages): no stage given, nothing to run; valid stages: world," in (
        capsys.readouterr().err
    )


@pytest.mark.slow
def test_a_reader_that_stops_reading_stdout_is_no_error(tmp_path):
    # `finecap recipes | head -1`: the pipe's reader is gone before finecap writes (its end closed before the
    # start, so no race); finecap stops quietly with the code of a writer stopped by SIGPIPE (128 + 13), as
    # `yes | head` does, not `finecap: error: Broken pipe` and code 2
    read, write = os.pipe()
    os.close(read)
    env = {**os.environ, "FINECAP_HOME": str(tmp_path / "home")}
    try:
        proc = subprocess.run([sys.executable, "-m", "finecap", "recipes"], stdout=write, stderr=subprocess.PIPE,
                              text=True, env=env, timeout=120)  # fmt: skip
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (141, "")
