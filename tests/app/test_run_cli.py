"""The tests' in-process command line (tests/helpers/cli.py ``run_cli``): a usage error, which argparse raises as
``SystemExit``, is returned as the process would end, (2, stdout, stderr), rather than ending the calling test
abruptly; ``--help`` is (0, the usage, "")."""

from __future__ import annotations

import pytest

import helpers.cli
from helpers.cli import refused, run_cli


def test_a_usage_error_is_its_exit_code_and_message():
    code, out, err = run_cli(["trian"])
    assert (code, out) == (2, "") and "finecap: error: argument command: invalid choice: 'trian'" in err, err
    assert "(did you mean 'train'?)" in err
    code, out, err = run_cli(["train", "demo/mle", "--reusme"])  # a subcommand's own parser
    assert code == 2 and "unrecognized arguments: --reusme (did you mean '--resume'?)" in err, err
    assert refused(["trian"], "invalid choice: 'trian'").startswith("finecap: error: ")


def test_help_is_exit_code_0_and_the_usage_on_stdout():
    code, out, err = run_cli(["--help"])
    assert (code, err) == (0, "") and out.startswith("usage: finecap ")


@pytest.mark.parametrize(
    ("raised", "expected"), [(None, (0, "")), (3, (3, "")), ("stopped: why", (1, "stopped: why\n"))]
)
def test_any_system_exit_is_the_code_and_message_python_would_give(raised, expected, monkeypatch):
    """``SystemExit(None)`` exits 0, an integer is the code, a message is written to stderr with exit code 1."""

    def main(argv):
        raise SystemExit(raised)

    monkeypatch.setattr(helpers.cli, "main", main)
    code, out, err = run_cli(["anything"])
    assert (code, err) == expected and out == ""
