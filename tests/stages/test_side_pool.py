"""The side-stage pool (finecap.stages.pool): what its workers do when the demo that runs them is stopped, and their
progress bars."""

from __future__ import annotations

import os
import time

import pytest

from finecap.stages.pool import SidePool
from helpers.waiting import until


@pytest.mark.slow
def test_an_interrupt_told_the_parent_alone_stops_the_stages_still_running():
    # `kill -INT PID` or SIGTERM (finecap.app.cli.Terminated, a KeyboardInterrupt) reach the demo's process alone, not
    # its workers as a terminal's Ctrl-C does: the pool's shutdown waited for every running stage to finish (hours of
    # training on after the demo was told to stop), and the stage's work ended as if nothing had happened
    import psutil  # a dependency of accelerate, so always installed with finecap

    with pytest.raises(KeyboardInterrupt), SidePool(1) as pool:
        worker = psutil.Process(pool.submit(os.getpid).result())
        stage = pool.submit(time.sleep, 60)  # a stage still training
        until(stage.running, "the worker took no stage")  # handed to the worker: no shutdown can cancel it now
        raise KeyboardInterrupt
    assert stage.done() and stage.exception() is not None  # stopped, not finished
    assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE


@pytest.mark.slow
@pytest.mark.parametrize("inherited, shown", [("", False), ("0", True)])
def test_workers_show_no_progress_bars_unless_the_user_turned_them_on(monkeypatch, inherited, shown):
    # several stages share the terminal: a worker turns the bars off (TQDM_DISABLE=1). It did so with setdefault,
    # which left an inherited empty TQDM_DISABLE, read by progress_enabled as "bars on", so their bars stayed on;
    # empty counts as unset now, as environment_defaults(empty_is_unset=True) reads it. A user's explicit 0 is kept.
    from finecap.utils.system import PROGRESS_ENV, progress_enabled

    monkeypatch.setenv(PROGRESS_ENV, inherited)
    with SidePool(1) as pool:
        assert pool.submit(progress_enabled).result(timeout=120) is shown
    assert os.environ.get(PROGRESS_ENV) == inherited  # the parent's own is left as it was
