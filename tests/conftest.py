"""Fixtures of the tests under ``tests/``; the session-wide settings (one torch thread, the temporary finecap home
``finecap_home``) and the docstring examples' names are in the repository root's ``conftest.py``."""

import pytest


@pytest.fixture(scope="session")
def quick_demo_run(tmp_path_factory, finecap_home):
    """One `finecap demo --quick` run shared by the tests that need it (tests/test_demo.py, the browser tests):
    ``(run_dir, argv)``. It runs as a user would, from an empty working directory (``run_dir.parent``) with only
    ``--run-dir`` given: its world and world encoder go to the finecap home (tests/test_user_data.py checks that
    nothing else lands in the working directory)."""
    from finecap.app.cli import main

    cwd = tmp_path_factory.mktemp("demo-cwd")
    run_dir = cwd / "run"
    argv = ["demo", "--quick", "--run-dir", str(run_dir)]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        assert main(argv) == 0
    return run_dir, argv
