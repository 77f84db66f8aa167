"""``finecap.train(RUN, resume=True, **keywords)``: the Python API's ``finecap train --resume --out RUN [key=value
...]`` (it was refused: "is a directory, but a recipe ... is expected"). The run's own settings with the keywords on
top, the command's refusals with its messages, and the same run: a 2-step run of the tiny world resumed to 4 steps
from Python and by the command logs the same values and saves the same weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import finecap
from finecap.config import ConfigError
from finecap.locks import TRAIN_LOCK, OutputLocked, output_lock
from finecap.train.state import CheckpointError
from helpers.cli import run_cli
from helpers.resume import weights


def events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def cli_error(argv: list[str]) -> str:
    """The one-line error of a failing ``finecap`` command, without its ``finecap: error: ``."""
    code, _, err = run_cli(argv)
    assert code == 2, err
    return err.strip().splitlines()[-1].removeprefix("finecap: error: ")


@pytest.fixture(scope="module")
def two_steps(tiny, tmp_path_factory) -> Path:
    """A finished 2-step run of the tiny world (``finecap train``), which the tests copy before resuming."""
    run = tmp_path_factory.mktemp("two") / "run"
    code, _, err = run_cli(["train", *tiny["base"], "--out", str(run)])
    assert code == 0, err
    return run


def copied(run: Path, to: Path) -> Path:
    shutil.copytree(run, to)
    return to


@pytest.mark.slow
def test_a_run_resumed_from_python_is_the_run_the_command_resumes(two_steps, tmp_path):
    ours, theirs = copied(two_steps, tmp_path / "api"), copied(two_steps, tmp_path / "cli")
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    assert finecap.train(ours, resume=True, train__max_steps=4) == ours
    assert torch.equal(torch.rand(3), expected)  # the caller's generator as it left it
    code, _, err = run_cli(["train", "--resume", "--out", str(theirs), "train.max_steps=4"])
    assert code == 0, err
    assert [e["step"] for e in events(ours) if e["split"] == "train"] == [1, 2, 3, 4]
    assert events(ours) == events(theirs)  # the values of every step and evaluation, the resumed ones too
    mine, other = weights(ours), weights(theirs)
    assert mine.keys() == other.keys() and all(torch.equal(mine[k], other[k]) for k in mine)
    saved = (ours / "config.yaml").read_text()  # the stored settings (the tiny world's) with the keyword on top
    assert "max_steps: 4" in saved and "n_train: 40" in saved
    assert saved.replace(str(ours), "RUN") == (theirs / "config.yaml").read_text().replace(str(theirs), "RUN")
    # a finished run resumed again trains nothing, as the command's
    before = (ours / "metrics.jsonl").read_text()
    assert finecap.train(ours, resume=True) == ours
    assert (ours / "metrics.jsonl").read_text() == before


@pytest.mark.slow
def test_resuming_from_python_refuses_what_the_command_refuses(two_steps, tmp_path):
    run = copied(two_steps, tmp_path / "run")
    # a setting that cannot change on resume: the command's error, word for word
    with pytest.raises(CheckpointError) as caught:
        finecap.train(run, resume=True, model__dtype="bfloat16")
    assert str(caught.value) == cli_error(["train", "--resume", "--out", str(run), "model.dtype=bfloat16"])
    assert "resuming with model.dtype: 'float32' -> 'bfloat16'" in str(caught.value)
    # a run another process trains: the folder's lock
    with output_lock(run, name=TRAIN_LOCK, holder="finecap train", log=lambda _: None):
        with pytest.raises(OutputLocked) as caught:
            finecap.train(run, resume=True)
        assert str(caught.value) == cli_error(["train", "--resume", "--out", str(run)])
    # a folder that holds no run
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError) as caught:
        finecap.train(empty, resume=True)
    theirs = cli_error(["train", "--resume", "--out", str(empty)])
    assert str(caught.value) == (f"finecap.train({str(empty)!r}, resume=True): no config.yaml of a run there to take "
                                 "the settings from; give the run's recipe (finecap.train(RECIPE, resume=True, "
                                 "run__dir=RUN))")  # fmt: skip
    assert theirs.startswith(f"--resume --out {empty}: no config.yaml of a run there to take the settings from")
    # a config.yaml finecap did not write: refused before anything is read or written, naming the option
    (empty / "config.yaml").write_text("train: {max_steps: 3}\n")
    with pytest.raises(ValueError) as caught:
        finecap.train(empty, resume=True)
    assert str(caught.value) == cli_error(["train", "--resume", "--out", str(empty)]).replace("--out", "run.dir")
    assert "finecap did not make it" in str(caught.value)
    assert sorted(p.name for p in empty.iterdir()) == ["config.yaml"]
    # nothing was trained by the refusals
    assert events(run) == events(two_steps)


def test_a_run_folder_without_resume_is_no_recipe_and_says_how_to_resume_it(two_steps, tmp_path):
    with pytest.raises(ConfigError, match=r"is a directory, but a recipe .* is expected; finecap.train\(.*, "
                       r"resume=True\) continues the run there with its own settings"):  # fmt: skip
        finecap.train(two_steps)
    with pytest.raises(ConfigError, match=r"is a directory, but a recipe .* is expected$"):  # no run: no hint
        finecap.train(tmp_path)
    with pytest.raises(TypeError, match="run__dir is not taken: the run resumes in its own folder"):
        finecap.train(two_steps, resume=True, run__dir=tmp_path / "elsewhere")
    assert not (tmp_path / "elsewhere").exists()


def test_a_packaged_recipes_name_stays_the_recipe_beside_a_folder_of_that_name(tmp_path, monkeypatch):
    """``finecap.train("demo/mle", resume=True)`` resumes the recipe's run (under the runs root) even where the
    working directory holds ``demo/mle/`` (``finecap demo --out demo``'s); ``"./demo/mle"`` is the folder."""
    seen = []
    monkeypatch.setattr("finecap.train.run.train", lambda cfg, **kwargs: seen.append((cfg, kwargs)))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo" / "mle").mkdir(parents=True)
    (tmp_path / "demo" / "mle" / "config.yaml").write_text("train: {max_steps: 3}\n")
    finecap.train("demo/mle", resume=True)
    assert seen[0][1]["recipe"].name == "mle.yaml" and seen[0][0].run.dir == ""
    finecap.train("./demo/mle", resume=True, train__lr=0.5)
    cfg, kwargs = seen[1]
    assert (cfg.run.dir, cfg.train.max_steps, cfg.train.lr, kwargs["recipe"]) == ("./demo/mle", 3, 0.5, None)


def test_code_named_in_a_stored_run_is_imported_only_when_a_keyword_names_it_again(two_steps, tmp_path):
    """A run folder is data: a dotted path in its config.yaml is refused, as the command refuses it, unless the
    caller names it again (here by a keyword, which the command's ``key=value`` is)."""
    run = copied(two_steps, tmp_path / "run")
    stored = run / "config.yaml"
    stored.write_text(stored.read_text().replace("objective: mle", "objective: not_a_module_anywhere:objective"))
    with pytest.raises(ConfigError) as caught:
        finecap.train(run, resume=True)
    assert str(caught.value) == cli_error(["train", "--resume", "--out", str(run)])
    assert "train.objective names 'not_a_module_anywhere:objective', code of one's own" in str(caught.value)
    with pytest.raises(Exception) as caught:  # named: let through, and then not found
        finecap.train(run, resume=True, train__objective="not_a_module_anywhere:objective")
    assert "code of one's own" not in str(caught.value) and "not_a_module_anywhere" in str(caught.value)
    assert events(run) == events(two_steps)
