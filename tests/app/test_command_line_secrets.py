"""A secret given on the command line (``finecap bags review --token``, an override of ``boost.llm_api_key``) is
readable by every user of the machine in ``ps`` and ``/proc/<pid>/cmdline`` while the command runs, and finecap
cannot reliably hide it afterwards: the command warns at start, one line naming the option and the safer route (a
token file, the environment), never the secret. The environment (``FINECAP_REVIEW_TOKEN``, ``FINECAP_OVERRIDES``) is
not warned about: a process's environment is its user's alone."""

from __future__ import annotations

from finecap.app.cli import OVERRIDES_ENV
from helpers.cli import run_cli

SECRET = "s3cret-on-the-command-line-42"
SAID = "a secret on the command line is visible to every user of this machine (ps, /proc/<pid>/cmdline)"


def warnings_of(err: str) -> list[str]:
    return [line for line in err.splitlines() if SAID in line]


def test_an_api_key_override_on_the_command_line_is_warned_about_naming_the_environment_route():
    code, out, err = run_cli(["config", f"boost.llm_api_key={SECRET}", "boost.vlm_api_key_env=VLM_KEY"])
    assert code == 0, err
    said = warnings_of(err)
    assert len(said) == 1 and said[0].startswith("warning: boost.llm_api_key=: "), err
    assert "boost.llm_api_key_env" in said[0] and "environment variable" in said[0]
    assert SECRET not in out + err


def test_the_same_key_from_the_environment_is_not_warned_about_as_on_the_command_line(monkeypatch):
    monkeypatch.setenv(OVERRIDES_ENV, f"boost.vlm_api_key={SECRET}")
    code, out, err = run_cli(["config"])
    assert code == 0, err
    assert warnings_of(err) == [] and SECRET not in out + err


def test_review_token_on_the_command_line_is_warned_about_naming_the_token_file_and_the_environment(tmp_path):
    code, out, err = run_cli(["bags", "review", str(tmp_path / "missing.json"), "--images", str(tmp_path),
                              "--token", SECRET])  # fmt: skip
    said = warnings_of(err)
    assert len(said) == 1 and said[0].startswith("warning: --token: ") and "$FINECAP_REVIEW_TOKEN" in said[0], err
    assert "give --token-file" in said[0]  # the command's own safer option, as serve-reward's
    assert SECRET not in out + err
    assert code == 2  # the missing bags file: the warning came first, at start


def test_review_token_from_the_environment_is_not_warned_about(tmp_path, monkeypatch):
    monkeypatch.setenv("FINECAP_REVIEW_TOKEN", SECRET)
    code, out, err = run_cli(["bags", "review", str(tmp_path / "missing.json"), "--images", str(tmp_path)])
    assert code == 2 and warnings_of(err) == [] and SECRET not in out + err, err
