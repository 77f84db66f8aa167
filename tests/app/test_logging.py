"""finecap's own messages go through `logging` and its progress bars follow one switch: `finecap train` on a tiny
world says what it did by default, says nothing with -q (no status line, no progress bar), and more with -v."""

import json
import logging
import os
import re
from collections import Counter

import pytest
import torch

from finecap.app.cli import configured_logging, main
from finecap.config import WorldConfig
from finecap.models.presets import save_tiny_clip
from finecap.utils.system import PROGRESS_ENV, progress_enabled
from finecap.world.make import make_world, world_key
from helpers.launch import launch_bounded, two_processes

SIZES = {"n_train": 24, "n_val": 4, "n_test": 4, "image_size": 32}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """A tiny world, a tiny random CLIP as the captioner's encoder and the overrides of a 2-step tiny ClipCap."""
    root = tmp_path_factory.mktemp("logging")
    world = make_world(WorldConfig(**SIZES, seed=0), root / "world", progress=False)
    clip = save_tiny_clip(root / "clip", image_size=32, patch_size=16)
    base = [f"world.out={world}", *(f"world.{k}={v}" for k, v in SIZES.items()), f"model.encoder={clip}",
            "clipcap.tiny_layers=1", "clipcap.tiny_hidden=32", "clipcap.tiny_heads=2", "clipcap.prefix_length=2",
            "train.batch_size=8", "train.max_steps=2", "train.eval_every=2", "train.eval_samples=4",
            "train.warmup_steps=1", "decode.max_length=8"]  # fmt: skip
    return {"root": root, "world": world, "key": world_key(WorldConfig(**SIZES, seed=0)), "base": base}


def train(capsys, tiny: dict, name: str, *flags: str) -> tuple[str, str, str]:
    """``finecap FLAGS train`` into its own run directory and feature cache (so that every run computes features
    and shows their bar unless told not to): (run directory, stdout, stderr)."""
    run = tiny["root"] / name
    argv = [*flags, "train", *tiny["base"], f"run.cache_dir={tiny['root'] / f'cache-{name}'}", "--out", str(run)]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    assert (run / "checkpoints" / "best").is_dir()  # the run did its work whatever it said
    return str(run), out, err


def summary_line(run: str) -> re.Pattern:
    return re.compile(rf"^train: 2 steps; best loss [0-9.e+-]+ at step 2: {re.escape(run)}/checkpoints/best "
                      rf"\(run directory {re.escape(run)}\)$", re.M)  # fmt: skip


def bars(err: str) -> set[str]:
    """The labels of the tqdm progress bars drawn in ``err`` (``label:  50%|...``)."""
    return set(re.findall(r"(?:^|\r)([^\r\n]+?): +\d+%\|", err, re.M))


def test_default_shows_status_lines_and_progress_bars_on_stderr(tiny, capsys):
    run, out, err = train(capsys, tiny, "default")
    assert out == ""  # status is not output: nothing on stdout
    assert summary_line(run).search(err)  # the one summary line, plain (no level name, no logger name)
    assert {"train", "features [train]", "features [val]"} <= bars(err)  # the engine's and the feature cache's
    assert "2/2 [" in err  # the training bar reached its end
    assert "world: the world" not in err  # debug details only with -v


def test_quiet_prints_no_status_line_and_no_progress_bar(tiny, capsys, monkeypatch):
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    run, out, err = train(capsys, tiny, "quiet", "-q")
    assert out == "" and err == ""
    assert PROGRESS_ENV not in os.environ  # -q's switch is put back after the command
    # The same switch set by the user (the documented way for library callers) turns finecap's bars off too.
    monkeypatch.setenv(PROGRESS_ENV, "1")
    run, out, err = train(capsys, tiny, "user-env")
    # (transformers' own "Loading weights" bar read the variable when transformers was imported, before it was set)
    assert summary_line(run).search(err) and bars(err) <= {"Loading weights"}


def test_verbose_adds_debug_details(tiny, capsys):
    run, out, err = train(capsys, tiny, "verbose", "-v")
    assert f"world: the world {tiny['key']} is complete: {tiny['world']}" in err.splitlines()  # a DEBUG line
    assert summary_line(run).search(err) and "train" in bars(err)


def test_warnings_are_labelled_and_kept_with_quiet(capsys):
    log = logging.getLogger("finecap.app.example")
    for verbose, quiet in ((0, 0), (0, 1)):
        with configured_logging(verbose, quiet):
            log.info("an info line")
            log.warning("%d bag images are missing", 3)
        err = capsys.readouterr().err
        assert "warning: 3 bag images are missing\n" in err
        assert ("an info line\n" in err) == (quiet == 0)


@pytest.mark.parametrize("flags", [(0, 0), (2, 0)])
def test_a_launched_process_other_than_rank_0_says_errors_alone(capsys, monkeypatch, flags):
    # under accelerate launch rank 1 meets the notes rank 0 says: it says its errors only, whatever -v and the user's
    # TQDM_DISABLE=0 ask, and Python warnings and progress bars not at all (docs/cli.md#verbosity-v-and-q)
    import warnings

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv(PROGRESS_ENV, "0")
    log = logging.getLogger("finecap.app.example")
    with configured_logging(*flags):
        log.info("an info line")
        log.warning("a warning")
        log.error("an error")
        warnings.warn("a Python warning", UserWarning, stacklevel=1)
        bars, library = progress_enabled(), logging.getLogger("transformers").level
    assert capsys.readouterr().err == "error: an error\n"
    assert not bars and library == logging.ERROR
    assert os.environ[PROGRESS_ENV] == "0"  # put back afterwards
    monkeypatch.setenv("RANK", "0")
    with configured_logging(*flags):  # the main process says them
        log.info("an info line")
        bars, library = progress_enabled(), logging.getLogger("transformers").level
    assert capsys.readouterr().err == "an info line\n" and bars and library < logging.ERROR


def test_quiet_turns_bars_off_over_an_empty_switch_and_gives_the_environment_back(monkeypatch):
    # an empty TQDM_DISABLE reads as unset (progress_enabled shows bars), so it is no user's setting that wins over
    # -q: with it, -q left every finecap bar on. Set for the command, empty again after; a value the user set wins.
    monkeypatch.setenv(PROGRESS_ENV, "")
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "")
    with configured_logging(0, 1):
        assert not progress_enabled() and os.environ["TRANSFORMERS_VERBOSITY"] == "error"
    assert os.environ[PROGRESS_ENV] == "" and os.environ["TRANSFORMERS_VERBOSITY"] == ""
    monkeypatch.setenv(PROGRESS_ENV, "0")
    with configured_logging(0, 1):
        assert progress_enabled()
    assert os.environ[PROGRESS_ENV] == "0"


@pytest.mark.parametrize(
    ("value", "shown"), [(None, True), ("", True), ("0", True), ("false", True), ("1", False), ("True", False)]
)
def test_progress_enabled_follows_the_switch(monkeypatch, value, shown):
    if value is None:
        monkeypatch.delenv(PROGRESS_ENV, raising=False)
    else:
        monkeypatch.setenv(PROGRESS_ENV, value)
    assert progress_enabled() is shown and progress_enabled(True) is shown
    assert progress_enabled(False) is False  # a bar the caller does not want is never shown


def test_eval_table_alone_on_stdout_and_quiet_keeps_its_warnings(tmp_path, capsys):
    # `finecap eval --format table` printed its notes ("skipping ...", "N images of ...", "wrote ...") on stdout,
    # inside `> scores.md`, and -q did not drop them; its warnings were bare prints, not log records
    lines = []
    for name, image_id in (("0.jpg", 1), ("1.jpg", 0), ("2.jpg", 2)):  # ids 0 and 1 crosswise to the file numbers
        (tmp_path / name).write_bytes(b"")
        lines.append(json.dumps({"image": name, "captions": [f"image {name}"], "id": image_id, "split": "test"}))
    (tmp_path / "data.jsonl").write_text("\n".join(lines) + "\n")
    preds = tmp_path / "p.json"  # 2 of the 3 images, 6 words against references of 2: three notes and a warning
    preds.write_text(json.dumps([{"image_id": i, "caption": "a long caption of six words"} for i in (0, 1)]))
    argv = ["eval", "--predictions", str(preds), "--references", str(tmp_path / "data.jsonl"), "--metrics",
            "bleu,length", "--format", "table", "--out", str(tmp_path / "scores.json")]  # fmt: skip
    notes = ["note: the predictions cover 2 of the 3 reference images; 1 are not scored, e.g. [2]",
             f"2 images of {tmp_path / 'data.jsonl'}", "note: the captions average 6.0 words, over twice their "
             "references' 2.0", f"wrote {tmp_path / 'scores.json'}"]  # fmt: skip
    warning = "warning: 2 predicted id(s) are ids of the references and numbers of other images' file names, e.g. 0:"
    assert main(argv) == 0
    out, err = capsys.readouterr()
    table = out.splitlines()
    assert table[:2] == ["| metric | p.json |", "| --- | --- |"] and len(table) == 2 + 5  # BLEU-1..4, Length
    assert all(line.startswith("| ") and line.endswith(" |") for line in table)  # the table, nothing else
    said = err.splitlines()
    assert all(any(line.startswith(note) for line in said) for note in notes), err
    assert sum(line.startswith(warning) for line in said) == 1, err
    assert main(["-q", *argv]) == 0
    quiet_out, quiet_err = capsys.readouterr()
    assert quiet_out == out  # the product is the same
    assert [line for line in quiet_err.splitlines() if line] == [next(x for x in said if x.startswith(warning))]


@pytest.mark.slow
@pytest.mark.skipif(torch.accelerator.is_available(), reason="the test launches CPU processes on a CPU-only machine")
def test_a_two_process_launch_says_each_line_once(tiny, tmp_path):
    """``finecap train`` under ``accelerate launch`` of 2 processes: every status line, note and progress bar on
    stderr once, as docs/cli.md says (the processes other than rank 0 used to repeat the data's split note, the model
    dtypes and transformers' "Loading weights" bar). The data: the world's first images as one's own JSONL data set
    naming no split (finecap's data note), the captioner's encoder a tiny CLIP read from its folder (a library bar)."""
    images = sorted((tiny["world"] / "images").rglob("*.png"))[:12]
    lines = [{"image": str(image.relative_to(tiny["world"])), "captions": ["a shape"]} for image in images]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    run = tmp_path / "run"
    cmd = [*two_processes(), "-m", "finecap.app.cli", "train", *tiny["base"], "data.format=jsonl",
           f"data.path={tmp_path / 'd.jsonl'}", f"data.images={tiny['world']}", "data.val_fraction=0.25",
           "train.validators=[]", "train.batch_size=2", f"run.cache_dir={tmp_path / 'cache'}",
           "--out", str(run)]  # fmt: skip
    err = launch_bounded(cmd, tmp_path / "launch.log", timeout=240)
    # a bar's frames as lines; its timings (in brackets) differ from process to process, its label and counts do not.
    # A bar's finished frame is left out of the count: tqdm itself draws it twice when its last update comes over
    # mininterval after the frame before (on a loaded machine), then again as it closes. A second process's bar is
    # still seen, by its 0% frame, which tqdm draws once as a bar opens.
    said = Counter(
        re.sub(r"\[[\d:]+<[^\]]*\]", "[]", line).strip() for line in re.split(r"[\r\n]", err) if line.strip()
    )
    assert not {line: n for line, n in said.items() if n > 1 and "100%|" not in line}, err[-3000:]
    assert summary_line(str(run)).search(err) and "model dtypes: " in err, err[-3000:]
    assert re.search(r"^data: all 12 images of .* name no split", err, re.M), err[-3000:]
    assert {"train", "Loading weights"} <= bars(err), err[-3000:]  # shown, by the main process
