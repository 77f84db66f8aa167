"""The side-stage pool (finecap.stages.pool): what its workers do when the demo that runs them is stopped."""

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
