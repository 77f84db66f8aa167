"""A new user's smaller stumbles on the command line (issue 49, item 7; item 5's bare ``finecap train``): a mistyped
option gets a did-you-mean, ``finecap --help`` opens with what finecap is, a bare ``finecap train`` prints its usage
and the recipes instead of starting the default pipeline, ``caption --checkpoint`` on a demo's folder names the runs
inside, ``finecap eval`` says when the predictions cover only some reference images, and ``-v`` keeps a library's
many-line message to its first line."""

from __future__ import annotations

import json
import logging
import re
import sys

import pytest

from finecap.app.cli import _shortened_records
from finecap.recipes import list_recipes
from helpers.cli import run_cli


@pytest.mark.parametrize(
    ("argv", "meant"),
    [
        (["train", "demo/mle", "--reusme"], "--resume"),
        (["train", "--otu", "x"], "--out"),
        (["caption", "--checkpoint", "x", "--out", "y.json", "--imagse", "a.png"], "--images"),
        (["eval", "--predictions", "p.json", "--references", "r.json", "--per_image", "s.json"], "--per-image"),
        (["bags", "build", "--out", "b.json", "--szes", "3"], "--sizes"),
        (["demo", "--qiuck"], "--quick"),
    ],
)
def test_a_mistyped_option_gets_a_did_you_mean_from_its_own_command(argv, meant):
    code, _, err = run_cli(argv)
    assert code == 2
    assert f"(did you mean {meant!r}?)" in err, err
    assert f"finecap {' '.join(argv[:2]) if argv[0] == 'bags' else argv[0]}: error: unrecognized arguments" in err


def test_a_mistyped_required_option_gets_a_did_you_mean_and_optional_positionals_are_not_required():
    # argparse stopped at the missing --checkpoint before the unrecognised --checkpiont was looked at
    code, _, err = run_cli(["caption", "--checkpiont", "runs/a", "--out", "x.json"])
    assert code == 2 and err.strip().endswith("the following arguments are required: --checkpoint; unrecognized "
                                              "argument '--checkpiont' (did you mean '--checkpoint'?)")  # fmt: skip
    code, _, err = run_cli(["report"])  # its key=value overrides are optional
    assert code == 2 and err.strip().endswith("error: the following arguments are required: RUN_DIR")


def test_a_file_whose_name_begins_with_a_dash_is_named_in_the_error(tmp_path, monkeypatch):
    # argparse reads --images -1.jpg as an option: "expected at least one argument" said nothing of the file
    monkeypatch.chdir(tmp_path)
    (tmp_path / "-1.jpg").write_bytes(b"")
    (tmp_path / "--2.jpg").write_bytes(b"")
    code, _, err = run_cli(["caption", "--checkpoint", "runs/a", "--out", "x.json", "--images", "-1.jpg"])
    assert code == 2 and err.strip().endswith("error: argument --images: expected at least one argument; '-1.jpg' is "
                                              "read as an option, though a file of that name is here: name it "
                                              "./-1.jpg")  # fmt: skip
    code, _, err = run_cli(["caption", "--checkpoint", "runs/a", "--out", "x.json", "--images", "a.jpg", "--2.jpg"])
    assert code == 2 and "unrecognized arguments: --2.jpg" in err and err.strip().endswith("name it ./--2.jpg")
    (tmp_path / "-1.jpg").unlink()  # no such file: argparse's message alone
    code, _, err = run_cli(["caption", "--checkpoint", "runs/a", "--out", "x.json", "--images", "-1.jpg"])
    assert code == 2 and err.strip().endswith("error: argument --images: expected at least one argument")


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["world", "make", "--n-train", "-3"], "--n-train -3: world.n_train: must be >= 0, got -3"),
        (["world", "make", "--image-size", "8"], "--image-size 8: world.image_size: must be in [16, 1024], got 8"),
        (["world", "make", "--families", "1"], "--families 1: world.families: must be 0 (off) or >= 2"),
        (
            ["world", "make", "--n-val", "2", "world.n_val=-1"],
            "override 'world.n_val=-1': world.n_val: must be >= 0, got -1",
        ),
    ],
)
def test_a_bad_option_value_is_named_as_the_option_typed(argv, named, tmp_path, monkeypatch):
    # `world make --n-train -3` said "override 'world.n_train=-3': ...", an override nobody typed; an override typed
    # after the option still names the override, which wins
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli([*argv, "--out", "w"])
    assert code == 2 and err.strip() == f"finecap: error: {named}", err
    assert list(tmp_path.iterdir()) == []


def test_an_unrelated_option_gets_no_guess():
    code, _, err = run_cli(["train", "demo/mle", "--zzzzzz"])
    assert code == 2 and "unrecognized arguments: --zzzzzz" in err and "did you mean" not in err


def test_an_option_close_to_another_by_its_dashes_alone_gets_no_guess():
    # `export RUN --out X` was told "did you mean '--quiet'?": the "--" every option begins with made them close
    code, _, err = run_cli(["export", "RUN", "--out", "X"])
    assert code == 2 and "finecap export: error: unrecognized arguments: --out" in err and "did you mean" not in err
    code, _, err = run_cli(["export", "RUN", "--merge", "X"])  # a name close to an option's still gets it
    assert code == 2 and "(did you mean '--merged'?)" in err, err


def test_finecap_alone_prints_the_help_on_stderr_and_exits_2():
    # argparse said only "the following arguments are required: command"; git alone prints its help
    code, out, err = run_cli([])
    _, help_text, _ = run_cli(["--help"])
    assert code == 2 and out == "" and err == help_text
    assert "finecap trains and evaluates image captioners" in err and "required" not in err


@pytest.mark.parametrize("options", [["-v"], ["--debug"], ["-vv", "-q"]])
def test_only_the_options_before_a_command_print_the_help_as_finecap_alone(options):
    # `finecap -v` and `finecap --debug` said "the following arguments are required: command", where `finecap`
    # alone prints the help
    code, out, err = run_cli(options)
    _, help_text, _ = run_cli(["--help"])
    assert code == 2 and out == "" and err == help_text
    assert "required" not in err
    # ... and a word that is no option is still an error
    code, _, err = run_cli([*options, "--zzzzzz"])
    assert code == 2 and "unrecognized arguments: --zzzzzz" in err and err != help_text


def test_caption_engine_names_the_option_typed(tmp_path):
    # `caption --engine nosuch` said "override 'decode.engine=nosuch'", an override nobody typed
    run = tmp_path / "run"
    _fake_run(run)
    bare = tmp_path / "bare"
    (bare / "model").mkdir(parents=True)  # a model folder without a run's configuration (an export)
    (bare / "model" / "captioner.json").write_text("{}")
    for checkpoint in (run, bare / "model"):
        code, _, err = run_cli(["caption", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "c.json"),
                                "--engine", "nosuch"])  # fmt: skip
        assert code == 2 and err.startswith("finecap: error: --engine nosuch: decode.engine: unknown generation "
                                            "engine 'nosuch'"), err  # fmt: skip
    code, _, err = run_cli(["caption", "--checkpoint", str(run), "--out", str(tmp_path / "c.json"),
                            "--engine", "vllm", "decode.engine=typo"])  # fmt: skip
    assert code == 2 and "finecap: error: override 'decode.engine=typo': decode.engine" in err, err  # it wins
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bare", "run"]


def test_world_make_refuses_a_world_of_no_scenes(tmp_path, monkeypatch):
    # `world make --n-train 0 --n-val 0 --n-test 0` wrote a world with no scenes and exited 0
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["world", "make", "--n-train", "0", "--n-val", "0", "--n-test", "0", "--out", "w"])
    assert code == 2 and err.startswith("finecap: error: --n-train, --n-val and --n-test (world.n_train, world.n_val, "
                                        "world.n_test) are all 0: a world of no scenes"), err  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_report_on_a_file_says_it_is_a_file(tmp_path):
    # a file given as RUN_DIR was "run directory not found", though it is there
    notes = tmp_path / "notes.txt"
    notes.write_text("keep")
    code, _, err = run_cli(["report", str(notes)])
    assert code == 2 and err.strip() == f"finecap: error: {notes}: a file, not a run directory (give the folder " \
        "`finecap train` or `finecap demo` wrote)", err  # fmt: skip
    code, _, err = run_cli(["report", str(tmp_path / "none")])
    assert code == 2 and err.strip() == f"finecap: error: {tmp_path / 'none'}: run directory not found", err
    assert notes.read_text() == "keep"


@pytest.mark.parametrize("metrics", ["bleu", None])
def test_eval_refuses_an_images_folder_that_is_not_there_whatever_the_metrics(metrics, tmp_path):
    # `eval --images nodir` was passed over unsaid when no metric read the images (--metrics bleu), and named only
    # in a note that skipped the image metrics otherwise: a typo hid
    refs = tmp_path / "refs.jsonl"
    refs.write_text(json.dumps({"image": "0.jpg", "id": 0, "captions": ["a red circle"], "split": "test"}) + "\n")
    preds = tmp_path / "p.json"
    preds.write_text(json.dumps([{"image_id": 0, "caption": "a red circle"}]))
    (tmp_path / "afile").write_text("x")
    chosen = ["--metrics", metrics] if metrics else []
    for images, what in (("nodir", "no such folder"), ("afile", "not a folder")):
        code, out, err = run_cli(["eval", "--predictions", str(preds), "--references", str(refs), *chosen,
                                  "--images", str(tmp_path / images)])  # fmt: skip
        assert code == 2 and out == "", err
        assert err.strip() == f"finecap: error: --images {tmp_path / images}: {what} (the image folder of the " \
            "references' relative paths)", err  # fmt: skip
    code, _, err = run_cli(["eval", "--predictions", str(preds), "--references", str(refs), "--metrics", "bleu",
                            "--images", str(tmp_path)])  # fmt: skip
    assert code == 0, err


def test_help_opens_with_what_finecap_is():
    code, out, _ = run_cli(["--help"])
    assert code == 0
    first = [line for line in out.splitlines() if line and not line.startswith((" ", "usage"))][0]
    assert first.startswith("finecap trains and evaluates image captioners"), first
    assert "parse arguments" not in out  # the module's developer docstring
    assert "finecap demo --quick" in out and "finecap recipes" in out


def test_bare_train_prints_usage_and_the_recipes_and_builds_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("FINECAP_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    for argv in (["train"], ["train", "--resume"]):  # --resume alone trained the defaults into <home>/runs/run
        code, out, err = run_cli(argv)
        assert code == 2 and out == ""
        assert err.startswith("usage: finecap train RECIPE")
        assert all(name in err for name in list_recipes())
        assert sorted(p.name for p in tmp_path.iterdir()) == []  # no world, no encoder, no run folder, no home


def test_resume_without_a_recipe_takes_the_runs_own_settings(tiny, tmp_path):
    """``finecap train --resume --out RUN [key=value ...]``: the settings the run was trained with (its config.yaml;
    the error of a resume with other settings sends the user there), the overrides on top. A dotted path of code of
    one's own in that file is imported only when named again (a run folder is data)."""
    run = tmp_path / "run"
    assert run_cli(["train", *tiny["base"], "--out", str(run)])[0] == 0
    code, out, err = run_cli(["train", "--resume", "--out", str(run), "train.max_steps=3"])
    assert code == 0, err
    assert json.loads((run / "checkpoints" / "last" / "trainer_state.json").read_text())["step"] == 3
    code, _, err = run_cli(["train", "--resume", "--out", str(tmp_path / "none")])
    assert code == 2 and "no config.yaml of a run there" in err
    stored = run / "config.yaml"
    stored.write_text(stored.read_text().replace("objective: mle", "objective: not_a_module_anywhere:objective"))
    code, _, err = run_cli(["train", "--resume", "--out", str(run), "train.max_steps=4"])
    assert code == 2 and "train.objective names 'not_a_module_anywhere:objective', code of one's own" in err


def _fake_run(folder):
    """A run folder as find_checkpoint recognises one: checkpoints/best/model/captioner.json (contents unread)."""
    model = folder / "checkpoints" / "best" / "model"
    model.mkdir(parents=True)
    (model / "captioner.json").write_text("{}")
    (folder / "config.yaml").write_text("run: {}\n")


def test_caption_on_a_demo_folder_names_the_stage_runs_inside(tmp_path):
    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / "config.yaml").write_text("demo: {}\n")  # a demo's own configuration beside its stages
    for stage in ("mle", "smile", "scst"):
        _fake_run(demo / stage)
    code, _, err = run_cli(["caption", "--checkpoint", str(demo), "--out", str(tmp_path / "c.json")])
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "not a checkpoint folder, but it holds 3" in err
    assert all(str(demo / stage) in err for stage in ("mle", "smile", "scst"))


def test_a_damaged_checkpoint_with_nothing_below_is_still_read_as_a_checkpoint(tmp_path):
    from finecap.runs import find_checkpoint

    (tmp_path / "config.yaml").write_text("run: {}\n")  # its model/ lost: loading names what is missing
    assert find_checkpoint(tmp_path) == tmp_path


def test_eval_says_which_reference_images_the_predictions_leave_out(tmp_path):
    refs = tmp_path / "refs.jsonl"
    lines = [
        {"image": f"{i}.jpg", "id": i, "captions": ["a red circle", "a red ring"], "split": "test"} for i in range(4)
    ]
    refs.write_text("".join(json.dumps(line) + "\n" for line in lines))
    preds = tmp_path / "p.json"
    preds.write_text(json.dumps([{"image_id": i, "caption": "a red circle"} for i in range(3)]))
    code, out, err = run_cli(["eval", "--predictions", str(preds), "--references", str(refs), "--metrics", "bleu",
                              "--format", "json"])  # fmt: skip
    assert code == 0, err
    scores = json.loads(out)  # stdout stays JSON: the scores of the 3 predicted images alone
    assert set(scores) == {"BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4"}
    assert scores["BLEU-1"] == pytest.approx(1.0, abs=1e-6)  # every word of "a red circle" is in a reference
    # no 4-gram in 3 words: pycocoevalcap's smoothing makes the 4-gram precision 1e-15 / 1e-9, BLEU-4 its 4th root
    assert scores["BLEU-4"] == pytest.approx(10**-1.5, rel=1e-6)
    assert "note: the predictions cover 3 of the 4 reference images; 1 are not scored, e.g. [3]" in err
    preds.write_text(json.dumps([{"image_id": i, "caption": "a red circle"} for i in range(4)]))
    code, _, err = run_cli(["eval", "--predictions", str(preds), "--references", str(refs), "--metrics", "bleu"])
    assert code == 0 and "not scored" not in err


def test_v_keeps_a_long_library_message_to_its_first_line(caplog):
    logger = logging.getLogger("transformers.configuration_utils")
    config = "Model config GPT2Config {\n" + "".join(f'  "key{i}": {i},\n' for i in range(30)) + "}"
    with caplog.at_level(logging.INFO, logger="transformers"), _shortened_records():
        logger.info("%s", config)
        logger.info("one line\ntwo lines")  # short messages stay whole
        logger.warning("%s", config)  # a warning is never cut
    shown = [r.getMessage() for r in caplog.records]
    assert shown[0] == "Model config GPT2Config { [... 31 more lines; -vv shows them]"
    assert shown[1] == "one line\ntwo lines" and shown[2] == config
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="transformers"):
        logger.info("%s", config)  # outside -v's context: whole
    assert caplog.records[0].getMessage() == config


@pytest.mark.parametrize(
    ("recipe", "built"),
    [
        ("demo/vlm_mle", "vlm.name=world-tiny"),
        ("demo/blip_mle", "blip.name=world-tiny"),
        ("demo/mle", "clipcap.lm=world-tiny"),
    ],
)
def test_a_config_that_can_never_run_is_refused_before_the_world_is_made(recipe, built, tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("FINECAP_HOME", str(home))
    code, _, err = run_cli(["train", recipe, "model.quantization=4bit", "--out", str(tmp_path / "run")])
    assert code == 2, err
    assert f"model.quantization=4bit quantizes a pretrained checkpoint as it loads, but {built} is built here" in err
    made = sorted(str(p.relative_to(home)) for p in home.rglob("*")) if home.exists() else []
    assert not [p for p in made if "world" in p], made  # neither the world nor its encoder was made


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        ("bitsandbytes", "model.quantization=4bit needs bitsandbytes: pip install 'finecap[quant]'"),
        ("datasets", "data.format=hf needs the Hugging Face `datasets` package: pip install 'finecap[hf]'"),
    ],
)
def test_a_missing_extra_is_one_line_naming_the_install(module, expected, monkeypatch):
    """An option whose package (an extra of finecap's) is not installed: one line, exit 2, never an ImportError
    traceback (issue 48): ``explain`` shows a MissingExtra as its message alone, and each option's import guard
    (bitsandbytes for ``model.quantization``, ``datasets`` for ``data.format=hf``) raises one naming the install."""
    from finecap.errors import explain
    from finecap.utils.system import MissingExtra

    assert explain(MissingExtra(expected)) == expected  # a known error, whatever raises it
    monkeypatch.setitem(sys.modules, module, None)  # `import MODULE` -> ImportError
    if module == "datasets":
        from finecap.data.formats.hf import _import_datasets

        with pytest.raises(MissingExtra, match=re.escape(expected)):
            _import_datasets()
        return
    from finecap.models.memory import require_bitsandbytes

    with pytest.raises(MissingExtra, match=re.escape(expected)):
        require_bitsandbytes("4bit")


def test_bags_review_without_flask_names_the_extra(tmp_path, monkeypatch):
    """Flask is the ``review`` extra (issue 63: a core dependency for one command): without it ``finecap bags
    review`` is one line naming the install, exit 2, and nothing is written."""
    from finecap.app.review import REVIEW_EXTRA
    from helpers.cli import refused

    monkeypatch.setitem(sys.modules, "flask", None)  # `import flask` -> ImportError
    monkeypatch.delitem(sys.modules, "finecap.app.review")  # imported afresh by the command
    bags = tmp_path / "bags.json"
    bags.write_text("{}")
    refused(["bags", "review", str(bags), "--images", str(tmp_path), "--port", "0"], REVIEW_EXTRA)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bags.json"]


def test_a_best_checkpoint_being_swapped_into_place_is_waited_for_not_taken_for_last(tmp_path):
    """Between the two renames of a checkpoint swap only best.old stands: a reader took the run's last checkpoint
    for its checkpoint, without a word (21 of 457,000 lookups during a training that saved best at every step)."""
    import threading
    import time

    from finecap.runs import find_checkpoint

    run = tmp_path / "run"
    for which in ("best.old", "last"):
        (run / "checkpoints" / which / "model").mkdir(parents=True)
    new = tmp_path / "new-best"
    (new / "model").mkdir(parents=True)

    def second_rename():  # the training run's os.replace(tmp, best), a moment later
        time.sleep(0.3)
        new.rename(run / "checkpoints" / "best")

    swap = threading.Thread(target=second_rename)
    swap.start()
    try:
        assert find_checkpoint(run) == run / "checkpoints" / "best"
    finally:
        swap.join()
    (run / "checkpoints" / "best.old").rename(tmp_path / "gone")  # a run whose best was never saved: its last
    (run / "checkpoints" / "best").rename(tmp_path / "gone2")
    assert find_checkpoint(run) == run / "checkpoints" / "last"


def test_a_swap_a_killed_run_left_is_read_as_it_stands_without_waiting(tmp_path, monkeypatch, caplog):
    """A run killed between the two renames leaves best.old and no best: each lookup waited its 5 s and then took
    last without a word. A best.old renamed longer ago than the wait is read at once, said in a warning; a last being
    swapped (last.old alone) is found the same way."""
    import logging
    import time

    from finecap import runs
    from finecap.runs import find_checkpoint

    monkeypatch.setattr(runs, "SWAP_WAIT", 0.2)
    run = tmp_path / "run"
    for which in ("best.old", "last"):
        (run / "checkpoints" / which / "model").mkdir(parents=True)
    time.sleep(0.3)  # renamed longer ago than the wait: a leftover
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="finecap"):
        assert find_checkpoint(run) == run / "checkpoints" / "best.old"
    assert time.monotonic() - start < 0.1
    assert "best is missing and best.old stands in its place" in caplog.text
    (run / "checkpoints" / "best.old").rename(tmp_path / "gone")
    (run / "checkpoints" / "last").rename(run / "checkpoints" / "last.old")  # no best; last mid-swap
    assert find_checkpoint(run) == run / "checkpoints" / "last.old"
