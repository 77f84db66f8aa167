"""Shared test settings: one torch thread per test process (the machine has 2 cores and tests are tiny)."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def quick_demo_run(tmp_path_factory):
    """One `finecap demo --quick` run shared by the tests that need it (tests/test_demo.py, the browser tests):
    ``(run_dir, argv)``."""
    from finecap.app.cli import main

    root = tmp_path_factory.mktemp("demo")
    run_dir = root / "run"
    argv = ["demo", "--quick", "--run-dir", str(run_dir), f"world.out={root / 'world'}",
            f"run.cache_dir={root / 'cache'}"]  # fmt: skip
    assert main(argv) == 0
    return run_dir, argv
