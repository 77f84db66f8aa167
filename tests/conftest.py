"""Shared test settings: one torch thread per test process (the machine has 2 cores and tests are tiny), and one
temporary finecap home for the whole session, so the suite never writes to ``~/.cache``."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def finecap_home(tmp_path_factory):
    """``FINECAP_HOME`` for every test of the session (and the processes they start): a temporary folder holding
    the worlds, world encoders and caches of commands run with the defaults (``world.out``, ``run.cache_dir``
    empty)."""
    home = tmp_path_factory.mktemp("finecap-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FINECAP_HOME", str(home))
        yield home


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
