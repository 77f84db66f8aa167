"""The side-stage pool: worker processes that run stages side by side for :class:`finecap.stages.StageRunner`.

Each worker sends finecap's log records to the parent, which hands them to its own loggers, and ends when the parent
does, however the parent ends (:func:`exit_with_parent`): no orphaned stage goes on training into a run directory.
"""

from __future__ import annotations

import logging
import logging.handlers
import multiprocessing
import multiprocessing.connection
import os
import sys
import threading
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from finecap.library_warnings import silence_process
from finecap.utils.system import PROGRESS_ENV, set_defaults


def exit_with_parent() -> None:
    """Block until this worker's parent process ends, then end this process at once, so that no orphaned stage goes
    on training into the run directory, competing for the cores and colliding with the next run. It waits on the
    parent's sentinel (:func:`multiprocessing.parent_process`), which the operating system signals however the parent
    ends (a ``kill``, a scheduler's time limit, a crash), on every platform and also when the parent ended before this
    thread started. A stage stopped this way resumes on the next run, like any killed stage."""
    parent = multiprocessing.parent_process()
    if parent is None:  # not a multiprocessing child: nothing to watch
        return
    multiprocessing.connection.wait([parent.sentinel])
    sys.stderr.write(f"finecap: stage worker {os.getpid()} stops: its parent process {parent.pid} ended\n")
    os._exit(1)


def worker_setup(queue: Any, level: int) -> None:
    """A worker process sends finecap's log records to the parent (``queue``), which hands them to its own loggers
    (:class:`Redispatch`), shows no progress bars (several stages share the terminal) nor the library warnings the
    command leaves out (:func:`finecap.library_warnings.silence_process`), and ends when the parent does
    (:func:`exit_with_parent`)."""
    threading.Thread(target=exit_with_parent, name="finecap-parent-watch", daemon=True).start()
    set_defaults({PROGRESS_ENV: "1"}, empty_is_unset=True)  # an inherited empty value reads as bars on
    silence_process()
    logger = logging.getLogger("finecap")
    logger.handlers[:] = [logging.handlers.QueueHandler(queue)]
    logger.setLevel(level)
    logger.propagate = False


class Redispatch(logging.Handler):
    """In the parent: a worker's log record goes through the parent's logger of the same name (its handlers, its
    level), as if the parent had logged it."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger(record.name).handle(record)


class SidePool:
    """``jobs`` spawned worker processes (:func:`worker_setup`) and the listener that relays their log records; a
    context manager that shuts both down (cancelling stages not started) however the block ends; ended by an
    interrupt (Ctrl-C, SIGTERM), it stops the stages still running too."""

    def __init__(self, jobs: int) -> None:
        context = multiprocessing.get_context("spawn")  # no fork of a parent holding torch threads and open files
        queue = context.Queue()
        self.listener = logging.handlers.QueueListener(queue, Redispatch())
        self.listener.start()
        level = logging.getLogger("finecap").getEffectiveLevel()
        self.executor = ProcessPoolExecutor(jobs, mp_context=context, initializer=worker_setup,
                                            initargs=(queue, level))  # fmt: skip

    def __enter__(self) -> ProcessPoolExecutor:
        return self.executor

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        try:
            if kind is not None and issubclass(kind, KeyboardInterrupt):
                # Ctrl-C, or SIGTERM (finecap.app.cli.Terminated), told this process alone (`kill -INT PID`, a
                # scheduler's stop): the stages still training stop with it, as a terminal's Ctrl-C, sent to the
                # whole process group, stops them; the shutdown below would otherwise wait for them to finish
                for process in list(self.executor._processes.values()):
                    process.terminate()
            self.executor.shutdown(wait=True, cancel_futures=True)
        finally:
            self.listener.stop()
