"""``FINECAP_OVERRIDES`` (docs/configuration.md, "Overrides from the environment"): its ``section.key=value`` words are
appended after a command's own overrides, said on stderr with secrets masked, and a word that is no override is an
error naming the variable. tests/repo/test_docs_execute.py runs the documented commands at a tiny size through it."""

from __future__ import annotations

import pytest
import yaml

from finecap.app.cli import OVERRIDES_ENV
from helpers.cli import run_cli


def test_unset_adds_nothing_and_says_nothing(monkeypatch):
    monkeypatch.delenv(OVERRIDES_ENV, raising=False)
    code, out, err = run_cli(["config", "demo/mle"])
    assert code == 0 and OVERRIDES_ENV not in err
    assert yaml.safe_load(out)["train"]["max_steps"] != 3


def test_appended_after_the_command_line_and_said(monkeypatch):
    monkeypatch.setenv(OVERRIDES_ENV, "train.max_steps=3  'train.validators=[cider]'")
    code, out, err = run_cli(["config", "demo/mle", "train.max_steps=5", "train.lr=0.25"])
    assert code == 0, err
    train = yaml.safe_load(out)["train"]
    # the environment's value wins over the command line's (appended after it); the others are kept
    assert (train["max_steps"], train["lr"], train["validators"]) == (3, 0.25, ["cider"])
    assert f"finecap: {OVERRIDES_ENV} appends train.max_steps=3 train.validators=[cider]" in err


def test_a_secret_is_masked_in_the_notice(monkeypatch):
    monkeypatch.setenv(OVERRIDES_ENV, "boost.llm_api_key=sk-env-0123456789")
    code, out, err = run_cli(["config", "demo/mle"])
    assert code == 0, err
    assert "sk-env-0123456789" not in out + err
    assert "boost.llm_api_key=***" in err


def test_a_word_that_is_no_override_names_the_variable(monkeypatch):
    monkeypatch.setenv(OVERRIDES_ENV, "train.max_steps=3 --resume")
    code, _, err = run_cli(["config", "demo/mle"])
    assert code == 2
    assert f"finecap: error: {OVERRIDES_ENV}: word 2, '--resume', is not section.key=value" in err


def test_no_error_repeats_a_secret(monkeypatch, capsys):
    # the error paths repeated what they could not read, secrets with it: the variable's whole value when its quotes
    # did not close, a value split off its key by a space, a key written with ':' instead of '='
    for value in ("boost.llm_api_key=sk-SECRET-1 run.name='oops", "boost.llm_api_key= sk-SECRET-1"):
        monkeypatch.setenv(OVERRIDES_ENV, value)
        code, out, err = run_cli(["config", "demo/mle"])
        assert code == 2 and "sk-SECRET-1" not in out + err and OVERRIDES_ENV in err, err
    monkeypatch.delenv(OVERRIDES_ENV)
    code, out, err = run_cli(["config", "demo/mle", "boost.llm_api_key: sk-SECRET-2"])
    assert code == 2 and "sk-SECRET-2" not in out + err and "'boost.llm_api_key ***'" in err, err
    # an option never abbreviated: serve-reward --token SECRET was read as --token-file SECRET, then printed
    from finecap.app.cli import main

    with pytest.raises(SystemExit) as usage:  # argparse's usage error
        main(["serve-reward", "demo/sr_bagcurri", "--token", "sk-SECRET-3", "--port", "0"])
    out, err = capsys.readouterr()
    assert usage.value.code == 2 and "sk-SECRET-3" not in out + err and "did you mean '--token-file'" in err, err


def test_an_unknown_key_is_the_usual_error(monkeypatch):
    monkeypatch.setenv(OVERRIDES_ENV, "train.max_stepz=3")
    code, _, err = run_cli(["config", "demo/mle"])
    assert code == 2 and "did you mean 'train.max_steps'" in err, err


def test_a_bare_train_still_prints_its_usage(monkeypatch):
    # the variable gives a command no work to do: `finecap train` alone prints its usage, trains nothing
    monkeypatch.setenv(OVERRIDES_ENV, "train.max_steps=3")
    code, _, err = run_cli(["train"])
    assert code == 2 and err.startswith("usage: finecap train"), err
